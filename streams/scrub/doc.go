// Package scrub is the streaming secret scrubber every output path passes
// through (REST exec, terminals, kernel and log streams, runtime results,
// error messages, our own logs). It owns the matching engine only: rules
// come from configs/scrubber.yaml (LoadRules), known values from the
// caller (Set.WithValues); it imports no other project package. It also
// owns what scrubbing may cost a session (Budget).
//
// # Concurrency
//
// A Set is immutable and safe for concurrent use (Redact, NewWriter,
// NewPair, WithValues, Counts). A Writer belongs to one stream and one
// goroutine; a Pair's two writers may be used from two goroutines (it
// serialises them).
// Counters are atomic and shared by a Set family (see Set.Counts);
// Writer.Counts has one stream's counts. Values are never logged or
// counted by value: counter keys are rule ids and "value:<name>".
// Budgets and Budget are safe for concurrent use: a Budget's mutex guards
// its bucket and is never held while waiting or reporting. A Writer or
// Pair with a budget blocks in Write (the goroutine that feeds it, which
// is the one reading the session's output, stops reading); Flush, Close
// and Redact never wait. Budget.Close ends every wait at once.
//
// # Budget: what scrubbing may cost a session
//
// Scrubbing is the server's CPU, not the sandbox's: output the scrubber
// finds costly (a flood of rule keywords: 5-40 MB per CPU-second against
// 150-700 for clean text) would let one sandbox take server cores from
// every other session. Set.WithBudget charges everything a session's Set
// scrubs to its Budget, a token bucket of CPU time (BudgetConfig: Cores
// sustained, Burst at once). Writes of Writers and Pairs, and Flush and
// Close, are measured by the thread's CPU clock (the goroutine is locked
// to its thread for the call; time blocked in the destination does not
// count, CPU spent there does); Redact of less than 4 KiB by the wall
// clock (the CPU clock costs a system call). Before each write a Writer or
// Pair waits while the bucket is below zero, for the debt divided by Cores;
// so nothing is dropped: the session's output waits in its pipe, the
// sandbox's writer blocks, and its scrubbing averages Cores at most. A
// caller that scrubs a session's output with Redact, one line at a time,
// calls Set.WaitBudget before it reads more. Clean output is not slowed:
// at 150+ MB per CPU-second, a quarter of a core takes 40+ MB/s, more than
// a terminal carries, and Burst covers what an exec stream moves faster.
// The Budgets of a server keep totals (Stats) and report a throttled
// session at most every ReportEvery (Throttle).
//
// # What is redacted
//
// Pattern rules: the rule's SecretGroup becomes "[REDACTED:<rule id>]"
// (for password=x only x; for a database URL only the password). A rule
// lists the token families it covers (configs/scrubber.yaml; the tests
// require more than 110 outside the context-* rules).
//
// Known values (>= MinValueLen bytes) become "[REDACTED:<name>]" wherever
// k = KnownRun(len) or more consecutive bytes of them would show (12 for
// values of 24 bytes or more, half the value for 16..23, 8 for 8..15, the
// whole value below 8; values shorter than MinValueLen are refused), in
// any of their forms: the value in any ASCII case,
// reversed (by character), hex (any case, also with ':', '-' or '.'
// between bytes, as %XX, \xNN, \u00NN, 0xNN, lists), decimal byte lists
// with commas or joined by dots (Perl's %vd), URL query and path escaping
// (also encodeURIComponent and Python's quote, '/' kept), JSON (also with
// '/' as \/, as PHP writes it), Go, Python and JavaScript string escapes (also \u{NN}, Rust's escape_unicode), bash's
// printf %q and single-quote style, UTF-16 (also shown as text:
// Python's bytes repr, od -c, cat -v), Python's list(k), and base64 (std
// and URL alphabets, every alignment: the characters whose bits all come
// from the value). Matching is on the normalised stream: bytes below 0x21
// (space, tab, NUL, CR, LF, backspace, other controls), terminal escape
// sequences (CSI, ESC and one byte) and invisible characters (no-break and
// zero-width spaces and joiners, direction marks, soft hyphens, combining
// marks, variation selectors, BOM: units.go) are left out, fullwidth ASCII
// reads as ASCII, so single separators, invisible characters or colour
// codes between characters, a value split over lines or by \r, base64 at
// any wrap width, `od -An -tx1` and UTF-16's NULs all read as the form
// itself. A run of more than 32 separator bytes breaks a match. The bytes
// an escape sequence hides (a CSI's parameters and final byte, the byte
// after ESC) and a character directly followed by a backspace (erased on
// a terminal: "X\b" before each character, nroff's overstrike "s\bs" and
// underline "_\bs") are optional characters: a
// match may take them (as a raw reader sees them) or skip them (as a
// terminal shows the output), skipping at most 32 final bytes or 8 erased
// characters in a row, and like other characters they end a separator
// run. The redaction covers the first to the last byte matched.
// Overlapping matches merge into one redaction labelled by the earliest
// (on a tie: known value, then rules in file order), counted once.
//
// Out of reach on purpose: a value spread over separate writes with other
// text between (a value typed a character a minute across commands);
// pieces written to stdout and stderr in turn faster than they are read
// (see Pair); encodings not listed (a cipher, gzip, rot13, a custom
// interleaving of escape sequences whose final bytes carry the value); and
// runs shorter than k.
//
// Pair scrubs a process's stdout and stderr: each stream alone, and before
// that both merged in arrival order for known values, so a value split
// between the streams (halves, or alternating pieces written at a normal
// pace) is redacted where it begins.
//
// Also out of reach (docs/SECURITY.md): base32 and base64 of UTF-16LE
// (their grams cost 5-10% of the scrubber's speed), compositions of forms
// (hex or base64 of the reversed value), binary digits, Ascii85, Base85
// and uuencode, homoglyphs, cursor movement other than a backspace, and
// more than one character erased by one backspace run ("XY\b\b", a
// terminal's erase echo "\b \b" after several).
//
// Rules read the stream as a terminal shows it: an escape sequence right
// before a keyword is a boundary for \b, and a rule's window that holds
// one is matched with its sequences left out (a colour code inside a
// match, as grep --color prints the part searched for); the redaction
// covers the sequences inside the match.
//
// # How
//
// Rules: anchors are the rule keywords (ASCII case-insensitive). A
// prefilter (prefilter.go) samples every third position, hashes the folded
// 4-byte window into a 2^21-bit bitmap (each anchor's windows at three
// consecutive offsets are entered; short keywords' windows also with the
// bytes before or after them), checks hits against a second small bitmap
// and a table of the entered windows, and verifies only the candidate
// starts these give through a hash table; this is the whole cost on clean
// text. A verified keyword runs its rule anchored at the keyword on a
// bounded window (MaxLen+1 bytes, cut after the first byte no match can
// contain). Rules of a simple shape run on a small backtracking matcher
// with regexp's priorities (fast.go, checked against regexp in tests);
// others run the live program (live.go) first and Go's regexp only if a
// match is possible. A keyword whose next byte cannot continue any
// match (e.g. "tokenizer") is dropped early; one preceded by a rule's
// not_after word ("jsonweb" of jsonwebtoken) is skipped.
//
// Keyword floods (a sandbox printing `yes 'token: '` on purpose to burn
// the server's CPU) stay linear, with the output of evaluating every
// keyword: each byte class's run is measured once per scan, not per
// keyword and rule; per rule the last few window prefixes its program
// died on are kept, so a repeated keyword that fails costs a compare; the
// live program resumes where the last scan's run on the same open window
// stopped, or after the keyword if the last run began with the same bytes;
// a window with escape sequences is built in doubling steps, one build per
// byte class serving the keywords that follow; a Writer's rescan of the
// bytes it holds reuses the prefilter's candidates for them. When a failed evaluation
// read past 8 more keywords of its rule (a value class that runs long
// before the rule fails: "token>" or "eyJ" repeated up to a newline),
// one pass of the rule's program started at each of them, threads merged
// (flood.go), proves that they fail too, up to the first that might match
// or outlive its window; that one and the rest are evaluated as usual.
// So every byte is read by a bounded number of evaluations of each rule
// (TestKeywordFloodsLinear, TestFloodsAgainstReference, BenchmarkScrubKeywordFlood).
//
// Known values (kv.go): every 4-character substring (gram) of every form
// is in a hash table and a 2^22-bit bitmap. The raw data is sampled every
// stride bytes (at most 8, and at most the shortest match less 3, so every
// match holds a sample); at a sample the next four characters of the
// normalised stream are gathered, straight from the 8 bytes there when
// none is a separator, a backspace or part of a special character (all
// ASCII output but for backspaces takes this path), and looked up; near a
// backspace also the four a terminal shows. A hit whose raw neighbours already
// differ from the form on both sides is dropped; the rest are extended
// both ways on a locally normalised window.
//
// # Streaming
//
// Writer keeps a pending tail and releases everything before the earliest
// point where a secret could still be in progress: a proper prefix of an
// anchor reaching the end of the data, a keyword whose rule could still
// match or extend with more input (decided by simulating the rule's
// program, live.go, since regexp has no partial-match API), a base64 match
// whose trailing character or padding has not arrived, a known-value
// candidate followed only by a character a backspace could still erase, the first bytes of an invisible or fullwidth character, or
// the start of any match reaching past one of these. The hold-back is bounded by the
// longest rule window or anchor: a candidate that outgrows its MaxLen while
// it could still match fails closed (the window is redacted), and so does
// one whose window of escape sequences and characters reaches 2*MaxLen+128
// bytes first. Released
// bytes are final, so without Flush a Writer's output is exactly Redact of
// the whole stream, for any split into writes (the fuzz test checks this).
// Arbitrary bytes pass: invalid UTF-8, escape sequences and \r are data
// like any other; nothing is normalised.
//
// Flush is for idle interactive streams: it releases what can no longer
// begin a secret, and also bytes held only because they are a prefix of
// (or equal to) a rule keyword ("s", "AKI", "sk-", "passw"): a keyword is
// harmless. The Writer keeps such released bytes (and the byte before
// them, for \b) as context, so the rule still matches when the keyword
// completes later; the redaction then starts at the first byte not yet
// written ("AK" flushed, then "IA" and 16 more characters:
// "AK[REDACTED:aws-access-key-id]"). Flush likewise releases a known-value
// candidate shorter than its form's shortest match (it shows fewer than k
// bytes of the value) and keeps it as context. So a typed character always
// shows at the next Flush. Flush never releases a byte past a complete
// keyword that a rule could still take as its secret (the "abc" of
// "sk-abc", the "=hunter" of "password=hunter"), a known-value match, or
// a pending match. A flushed stream's output differs from Redact of the
// whole only by such prefixes in front of a redaction (the fuzz test
// checks this too). Close releases everything.
//
// A Writer holds at most the longest rule window (max_len + 1, 64 KiB at
// most; twice that plus 128 bytes when the window holds escape sequences;
// during a keyword flood the window plus that, until the pass over the
// flood's keywords is decided) or, for known values, the longest form times 33 bytes (a match may have
// up to 32 separator bytes between characters) plus 32 bytes of an
// undecided escape sequence; peak memory per stream is that plus one
// write. A Pair holds at most twice a Writer's. A scan restarts at its
// hold, never inside an escape sequence.
//
// Known limits: (?i) literals in the fast matcher fold ASCII only; a
// colour code inside a rule's keyword (grep --color highlighting "glpa" of
// "glpat-") hides the keyword.
package scrub
