package streams

import (
	"errors"
	"io"
	"sync"
	"time"
)

// Hub fans one output stream (a terminal's, already scrubbed) out to any
// number of viewers and keeps the most recent bytes for replay. It never
// blocks its writer on a viewer: each viewer has a bounded queue, and a
// viewer whose queue is full is dropped (its Done channel closes with
// ErrSlowViewer) while the others go on.
//
// Concurrency: Write and Close come from one producer goroutine; Attach,
// Detach and Viewers from any.
type Hub struct {
	mu      sync.Mutex
	ring    ring
	viewers map[*Viewer]struct{}
	closed  bool
	// lastViewer is when the last viewer left (zero while any is attached).
	lastViewer time.Time
	queueLen   int
	now        func() time.Time
}

// ErrSlowViewer ends a viewer that fell too far behind.
var ErrSlowViewer = errors.New("viewer too slow: output queue full")

// ErrClosed ends viewers when the stream ends.
var ErrClosed = errors.New("stream ended")

// NewHub keeps replay bytes of output and queues up to queueLen chunks per viewer.
func NewHub(replay, queueLen int) *Hub {
	return &Hub{ring: ring{buf: make([]byte, replay)}, viewers: map[*Viewer]struct{}{}, queueLen: queueLen,
		now: time.Now, lastViewer: time.Now()}
}

// Viewer is one attached consumer.
type Viewer struct {
	C    chan []byte // output chunks, in order; closed when the viewer ends
	done chan struct{}
	err  error
	once sync.Once
}

// Done is closed when the viewer ended (Err tells why).
func (v *Viewer) Done() <-chan struct{} { return v.done }

// Err is why the viewer ended: ErrSlowViewer, ErrClosed or nil (detached).
func (v *Viewer) Err() error {
	select {
	case <-v.done:
		return v.err
	default:
		return nil
	}
}

func (v *Viewer) end(err error) {
	v.once.Do(func() {
		v.err = err
		close(v.done)
		close(v.C)
	})
}

// Attach adds a viewer; its first chunk is the replay of recent output.
func (h *Hub) Attach() (*Viewer, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := &Viewer{C: make(chan []byte, h.queueLen+1), done: make(chan struct{})}
	if replay := h.ring.bytes(); len(replay) > 0 {
		v.C <- replay
	}
	if h.closed {
		v.end(ErrClosed)
		return v, nil
	}
	h.viewers[v] = struct{}{}
	h.lastViewer = time.Time{}
	return v, nil
}

// Detach removes a viewer (idempotent).
func (h *Hub) Detach(v *Viewer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.remove(v, nil)
}

func (h *Hub) remove(v *Viewer, err error) {
	if _, ok := h.viewers[v]; !ok {
		return
	}
	delete(h.viewers, v)
	v.end(err)
	if len(h.viewers) == 0 {
		h.lastViewer = h.now()
	}
}

// Write appends to the replay buffer and queues a copy for every viewer.
func (h *Hub) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0, io.ErrClosedPipe
	}
	h.ring.write(p)
	chunk := append([]byte(nil), p...)
	for v := range h.viewers {
		select {
		case v.C <- chunk:
		default:
			h.remove(v, ErrSlowViewer)
		}
	}
	return len(p), nil
}

// Close ends the stream: every viewer drains what it has queued, then ends.
func (h *Hub) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	for v := range h.viewers {
		h.remove(v, ErrClosed)
	}
	return nil
}

// DropViewers ends every viewer with err (their sockets close) and keeps
// the stream open for later viewers.
func (h *Hub) DropViewers(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for v := range h.viewers {
		h.remove(v, err)
	}
}

// Viewers counts attached viewers; idleSince is when the last one left
// (zero while any is attached).
func (h *Hub) Viewers() (n int, idleSince time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.viewers), h.lastViewer
}

// ring keeps the last len(buf) bytes written.
type ring struct {
	buf  []byte
	next int
	full bool
}

func (r *ring) write(p []byte) {
	n := len(r.buf)
	if n == 0 {
		return
	}
	if len(p) >= n {
		copy(r.buf, p[len(p)-n:])
		r.next, r.full = 0, true
		return
	}
	k := copy(r.buf[r.next:], p)
	if k < len(p) {
		copy(r.buf, p[k:])
		r.full = true
	}
	r.next = (r.next + len(p)) % n
	if r.next == 0 && len(p) > 0 {
		r.full = true
	}
}

func (r *ring) bytes() []byte {
	if !r.full {
		return append([]byte(nil), r.buf[:r.next]...)
	}
	out := make([]byte, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}
