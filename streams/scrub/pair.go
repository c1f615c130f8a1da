package scrub

import (
	"io"
	"sync"
)

// Pair scrubs the stdout and stderr of one process. Each stream passes its
// own Writer, as a lone stream would, and before that (with known values
// registered) a known-values-only Writer over both streams merged in
// arrival order, so a value split between them (its first half on stdout,
// the rest on stderr, or alternating pieces) is redacted too. Only a
// merged-view match that spans a switch between the streams is applied
// (the rest is each stream's own, found again by its Writer); it shows in
// the stream of its first byte and the other stream's bytes in it are
// dropped. Two views, not one, because output on the other stream between
// the pieces of a value (racy or on purpose) would hide it from the merged
// view alone; rules stay out of the merged view so that a keyword on one
// stream cannot swallow the other stream's text and break a token shape.
//
// A Pair's writers are safe for concurrent use: one goroutine per stream,
// serialised by the Pair. Its hold-back is at most twice a Writer's.
type Pair struct {
	mu     sync.Mutex
	merged *Writer
	each   [2]*Writer
	segs   []pairSeg // merged-stream offsets where a write of a stream began
	n      int64     // merged bytes written
	closed bool
	budget *Budget // the Set's: waited for before a write, charged inside
}

type pairSeg struct {
	at  int64
	tag int
}

// NewPair returns a Pair writing the scrubbed stdout to stdout and the
// scrubbed stderr to stderr.
func (s *Set) NewPair(stdout, stderr io.Writer) *Pair {
	p := &Pair{each: [2]*Writer{s.NewWriter(stdout), s.NewWriter(stderr)}, budget: s.budget}
	p.each[0].inner, p.each[1].inner = true, true
	if s.kv != nil {
		vs := &Set{values: s.values, kv: s.kv, reg: s.reg}
		p.merged = vs.NewWriter(nil)
		p.merged.sink = p.route
	}
	return p
}

// Stdout is the writer for the process's stdout.
func (p *Pair) Stdout() io.Writer { return pairStream{p, 0} }

// Stderr is the writer for the process's stderr.
func (p *Pair) Stderr() io.Writer { return pairStream{p, 1} }

type pairStream struct {
	p   *Pair
	tag int
}

func (s pairStream) Write(b []byte) (int, error) { return s.p.write(s.tag, b) }

func (p *Pair) write(tag int, b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Waited for under the lock: a write of the other stream that comes
	// meanwhile must not be scrubbed first (the merged view needs the
	// order the writes came in).
	p.budget.Wait()
	defer p.budget.end(p.budget.begin(true))
	if p.closed {
		return 0, ErrClosed
	}
	if len(b) == 0 {
		return 0, p.err(tag)
	}
	if p.merged == nil {
		p.each[tag].Write(b)
		return len(b), p.err(tag)
	}
	if len(p.segs) == 0 || p.segs[len(p.segs)-1].tag != tag {
		p.segs = append(p.segs, pairSeg{p.n, tag})
	}
	p.n += int64(len(b))
	p.merged.Write(b)
	return len(b), p.err(tag)
}

// err is the stream's destination error (the merged writer has none: its
// sink cannot fail).
func (p *Pair) err(tag int) error { return p.each[tag].err }

// route sends merged output raw at stream offset at to the writer of the
// stream each byte came from, split where the streams alternate. A
// redaction (repl) whose match spans a switch (from mstart, which is
// before at if Flush released the match's head) goes whole to the stream
// of at; one within a stream is left to that stream's Writer.
func (p *Pair) route(at int64, raw, repl []byte, mstart int64) bool {
	i := 0 // drop segments wholly before at
	for i+1 < len(p.segs) && p.segs[i+1].at <= at {
		i++
	}
	p.segs = p.segs[i:]
	if repl != nil && mstart >= p.segs[0].at && (len(p.segs) < 2 || p.segs[1].at >= at+int64(len(raw))) {
		repl = nil
	}
	if repl != nil {
		p.each[p.segs[0].tag].Write(repl)
		return true
	}
	for j := 0; len(raw) > 0; j++ {
		n := len(raw)
		if j+1 < len(p.segs) {
			n = int(min(int64(n), p.segs[j+1].at-at))
		}
		p.each[p.segs[j].tag].Write(raw[:n])
		at += int64(n)
		raw = raw[n:]
	}
	return false
}

// Flush is Writer.Flush for both streams (terminal-like idle release).
func (p *Pair) Flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.budget.end(p.budget.begin(true))
	if p.closed {
		return ErrClosed
	}
	if p.merged != nil {
		p.merged.Flush()
	}
	e0, e1 := p.each[0].Flush(), p.each[1].Flush()
	if e0 != nil {
		return e0
	}
	return e1
}

// Close decides and writes out everything held, in both streams. It does
// not close the destinations.
func (p *Pair) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.budget.end(p.budget.begin(true))
	if p.closed {
		return nil
	}
	p.closed = true
	if p.merged != nil {
		p.merged.Close()
	}
	e0, e1 := p.each[0].Close(), p.each[1].Close()
	if e0 != nil {
		return e0
	}
	return e1
}

// Counts returns the redaction counts of both streams and the merged view
// (a value caught in the merged view is not caught again per stream: its
// bytes were replaced before).
func (p *Pair) Counts() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]int64{}
	for _, w := range []*Writer{p.merged, p.each[0], p.each[1]} {
		if w == nil {
			continue
		}
		for k, v := range w.counts {
			m[k] += v
		}
	}
	return m
}
