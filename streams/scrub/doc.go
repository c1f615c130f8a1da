// Package scrub is the streaming secret scrubber every output path passes
// through (REST exec, terminals, kernel and log streams, runtime results,
// error messages, our own logs). It owns the matching engine only: rules
// come from configs/scrubber.yaml (LoadRules), known values from the
// caller (Set.WithValues); it imports no other project package.
//
// # Concurrency
//
// A Set is immutable and safe for concurrent use (Redact, NewWriter,
// WithValues, Counts). A Writer belongs to one stream and one goroutine.
// Counters are atomic and shared by a Set family (see Set.Counts);
// Writer.Counts has one stream's counts. Values are never logged or
// counted by value: counter keys are rule ids and "value:<name>".
//
// # What is redacted
//
// Pattern rules: the rule's SecretGroup becomes "[REDACTED:<rule id>]"
// (for password=x only x; for a database URL only the password). Known
// values (>= MinValueLen bytes) and their encodings become
// "[REDACTED:<name>]", the value itself and its hex in any ASCII case
// (lowered by a proxy, swapped, title case), URL query/path escaping, JSON
// and Go string escaping, shell escaping (backslash and single quotes),
// base64 std and URL alphabets at all three alignments with or without
// padding and inside longer base64 runs (the characters carrying bits of
// the value are redacted; characters encoding only neighbouring bytes, like
// "dXNlcjo" for "user:", stay), and for multi-line values (PEM keys) the
// whole value, its CRLF form and each line of at least MinValueLen bytes.
// Overlapping matches merge into one redaction labelled by the earliest
// (on a tie: known value, then rules in file order), counted once.
//
// # How
//
// Anchors are literals: rule keywords (ASCII case-insensitive) and every
// known value encoding. A prefilter (prefilter.go) samples every third
// position, hashes the folded 4-byte window into a 2^21-bit bitmap (each
// anchor's windows at three consecutive offsets are entered; short
// keywords' windows also with the bytes before or after them), checks hits
// against a second small bitmap and a table of the entered windows, and
// verifies only the candidate starts these give through a hash table; this
// is the whole cost on clean text. A verified keyword runs its rule
// anchored at the keyword on a bounded window (MaxLen+1 bytes, cut after
// the first byte no match can contain). Rules of a simple shape (literal
// sets, character classes with repeats, \b, groups; nearly all, listed by
// TestFastMatcherAgrees) run on a small backtracking matcher with
// regexp's priorities (fast.go, checked against regexp in tests); others
// use Go's regexp. A keyword whose next byte cannot continue any match
// (e.g. "tokenizer") is dropped early.
//
// # Streaming
//
// Writer keeps a pending tail and releases everything before the earliest
// point where a secret could still be in progress: a proper prefix of an
// anchor reaching the end of the data, a keyword whose rule could still
// match or extend with more input (decided by simulating the rule's
// program, live.go, since regexp has no partial-match API), a base64 match
// whose trailing character or padding has not arrived, or the start of any
// match reaching past one of these. The hold-back is bounded by the
// longest rule window or anchor: a candidate that outgrows its MaxLen while
// it could still match fails closed (the window is redacted). Released
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
// "AK[REDACTED:aws-access-key-id]"). So with only rules loaded a typed
// character always shows at the next Flush. Flush never releases a byte
// past a complete keyword that a rule could still take as its secret (the
// "abc" of "sk-abc", the "=hunter" of "password=hunter"), a pending match,
// or a prefix of a known value or of one of its encodings, however short:
// with known values registered, the last byte or two of a terminal echo
// are often such a prefix (most alphanumerics begin some base64 form) and
// then show only with the next output. A flushed stream's output differs
// from Redact of the whole only by such keyword prefixes in front of a
// redaction (the fuzz test checks this too). Close releases everything.
//
// Known limits: base64 wrapped across lines inside the value is found
// only line by line for multi-line values; (?i) literals in the fast
// matcher fold ASCII only; a leading \b in a rule is checked against the
// byte before the keyword, and colour codes (ESC[31m) put a word character
// there, so rules use it sparingly (only sk- keys).
package scrub
