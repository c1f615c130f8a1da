package scrub

import (
	"errors"
	"io"
)

// joinLen is how much of a large write is first scanned behind held bytes.
const joinLen = 1024

// ErrClosed is returned by Write and Flush after Close.
var ErrClosed = errors.New("scrub: writer closed")

// Writer redacts a stream on its way to dst. It is not safe for concurrent
// use (one stream, one writer goroutine).
type Writer struct {
	set     *Set
	dst     io.Writer
	sc      scratch
	buf     []byte // held bytes: could still be (part of) a secret
	emitted int    // buf[:emitted] was written out by Flush (a keyword prefix kept as context)
	scanned int    // len(buf) after the last scan
	prev    int    // the input byte before buf[0] (-1 at start)
	before  []byte // up to lookBehind input bytes before buf[0]
	out     []byte
	counts  map[string]int64
	err     error
	closed  bool
	// base is the stream offset of the first held byte (buf[0], or a
	// fresh write's p[0]); sink, if set, replaces dst with offsets (Pair).
	base int64
	sink func(at int64, raw, repl []byte, mstart int64) bool
	// inner: a Pair's writer (the Pair waits for the budget and measures).
	inner bool
}

// NewWriter returns a Writer that writes the redacted stream to dst.
func (s *Set) NewWriter(dst io.Writer) *Writer {
	return &Writer{set: s, dst: dst, prev: -1, counts: make(map[string]int64)}
}

// Write scrubs p. Everything that can no longer be part of a secret is
// written to dst before Write returns; the rest (bounded by the longest rule
// or value) is held for the next call. It always reports len(p); the error
// is dst's (sticky: after a dst error the writer drops its input). With a
// budget (Set.WithBudget) it first waits while the session owes CPU.
func (w *Writer) Write(p []byte) (int, error) {
	b := w.set.budget
	if w.inner || b == nil {
		return w.write(p)
	}
	b.Wait()
	defer b.end(b.begin(true))
	return w.write(p)
}

func (w *Writer) write(p []byte) (int, error) {
	if w.closed {
		return 0, ErrClosed
	}
	n := len(p) // p is resliced below; the whole of it is always consumed
	if w.err != nil {
		return n, w.err
	}
	if len(w.buf) == 0 {
		w.process(p, false, true, false)
		return len(p), w.err
	}
	if len(p) >= 2*joinLen && len(w.buf) < joinLen {
		// Join the held bytes with only a head of p. Once everything still
		// held lies in p, go on scanning p itself instead of copying all
		// of it behind the held bytes (like a Write of p[:joinLen] and one of
		// the rest, so the output is the same).
		w.buf = append(w.buf, p[:joinLen]...)
		w.process(w.buf, false, false, false)
		if w.err != nil {
			return len(p), w.err
		}
		if held := len(w.buf); held <= joinLen {
			w.buf = w.buf[:0]
			w.process(p[joinLen-held:], false, true, false)
			return len(p), w.err
		}
		p = p[joinLen:]
	}
	w.buf = append(w.buf, p...)
	// A long held candidate (say an open private key block) is rescanned
	// only after it grew by a quarter, so tiny writes cost O(1) per byte
	// amortized instead of O(held). Flush and Close always decide.
	if len(w.buf)-w.scanned >= w.scanned/4 {
		w.process(w.buf, false, false, false)
	}
	return n, w.err
}

// Flush writes out held bytes that can no longer begin a secret, for
// interactive streams gone idle. Write releases eagerly, except that it
// rescans a long held candidate only every quarter of growth, so Flush is
// what releases such a candidate promptly once it has died.
//
// Flush also writes out held bytes that are held only because they are a
// prefix of (or equal to) a rule keyword ("s", "AKI", "sk-", "passw"): a
// keyword is harmless. The Writer keeps them as context, so a rule still
// matches when later input completes the keyword; the redaction then starts
// at the first byte not yet written ("AK" flushed, then "IA" and 16 more
// characters: "AK[REDACTED:aws-access-key-id]"). Bytes past a complete
// keyword that a rule could still take as its secret (the "abc" of
// "sk-abc", the "=hunter" of "password=hunter") stay held, and so does a
// prefix of a known value or of one of its encodings, however short: with
// known values registered a terminal may still hold its last byte or two
// until more output or Close decides them.
func (w *Writer) Flush() error {
	if w.closed {
		return ErrClosed
	}
	if b := w.set.budget; b != nil && !w.inner {
		defer b.end(b.begin(true))
	}
	if w.err == nil && len(w.buf) > w.emitted {
		w.process(w.buf, false, false, true)
	}
	return w.err
}

// Close ends the stream: it decides and writes out every held byte
// (redacting what matches). It does not close dst.
func (w *Writer) Close() error {
	if w.closed {
		return w.err
	}
	if b := w.set.budget; b != nil && !w.inner {
		defer b.end(b.begin(true))
	}
	if w.err == nil {
		w.process(w.buf, true, false, false)
	}
	w.closed = true
	w.buf = nil
	return w.err
}

// Counts returns this stream's redaction counts (rule id or
// "value:<name>" -> count). Regions are counted when released.
func (w *Writer) Counts() map[string]int64 {
	m := make(map[string]int64, len(w.counts))
	for k, v := range w.counts {
		m[k] = v
	}
	return m
}

// process scans data and releases the decided prefix. fresh: data is the
// caller's p, not w.buf. flush: also write out a held keyword prefix (kept
// in buf as context). data[:w.emitted] has been written out already.
func (w *Writer) process(data []byte, final, fresh, flush bool) {
	w.sc.before = w.before
	w.sc.stream, w.sc.base = true, w.base
	hold, rel := w.set.scan(&w.sc, data, w.prev, final, flush)
	from := w.emitted
	to := max(hold, from, rel)
	if to > from && w.sink != nil {
		w.route(data, from, to)
	} else if to > from {
		var err error
		if len(w.sc.regs) == 0 {
			_, err = w.dst.Write(data[from:to])
		} else {
			w.out = appendRedacted(w.out[:0], data, from, to, w.sc.regs, w.counts)
			_, err = w.dst.Write(w.out)
		}
		if err != nil {
			w.err = err
		}
	}
	if hold > 0 {
		w.prev = int(data[hold-1])
		if hold >= lookBehind {
			w.before = append(w.before[:0], data[hold-lookBehind:hold]...)
		} else {
			w.before = append(w.before, data[:hold]...)
			w.before = w.before[max(0, len(w.before)-lookBehind):]
		}
	}
	w.emitted = to - hold
	w.base += int64(hold)
	if fresh {
		w.buf = append(w.buf[:0], data[hold:]...)
	} else {
		w.buf = w.buf[:copy(w.buf, data[hold:])]
	}
	w.scanned = len(w.buf)
}

// route is appendRedacted for a sink: each piece with the stream offset of
// its first byte; a redaction with its raw bytes and the offset where its
// match began (before at if Flush released its head), counted if the sink
// applied it.
func (w *Writer) route(data []byte, from, to int) {
	p := from
	for _, r := range w.sc.regs {
		if r.end <= from {
			continue
		}
		s := max(r.start, from)
		w.sink(w.base+int64(p), data[p:s], nil, 0)
		if w.sink(w.base+int64(s), data[s:r.end], r.lab.repl, w.base+int64(r.start)) {
			r.lab.ctr.Add(1)
			w.counts[r.lab.key]++
		}
		p = r.end
	}
	w.sink(w.base+int64(p), data[p:to], nil, 0)
}
