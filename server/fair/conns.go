package fair

import (
	"container/heap"
	"io"
	"sync"
)

// Verdict is what Conns.Admit decided for a new connection.
type Verdict int

const (
	// Admitted: the connection counts until it is released.
	Admitted Verdict = iota
	// OverClient: its client holds PerClient connections already.
	OverClient
	// OverTotal: Max connections are open and none could be made room
	// for.
	OverTotal
)

// Conns counts open connections, in total and per client key.
//
// A new connection is refused when its client holds PerClient already
// (exempt clients, such as a trusted proxy carrying many people's
// requests, have no per-client cap). When Max are open, the new one gets
// the place of an idle connection of the client holding the most, if that
// client would still hold more than the newcomer's client afterwards;
// otherwise it is refused. Only idle connections are closed so (new ones
// without a request yet, and keep-alives between requests): closing one
// is what the idle timeout does anyway, and a client reopens it when it
// needs it. Active requests and WebSockets are never closed.
type Conns struct {
	max, perClient int

	mu      sync.Mutex
	open    int
	clients map[string]*connClient
	idle    idleHeap // clients with an idle connection, the heaviest first
}

type connClient struct {
	key   string
	open  int
	idle  []*Conn
	index int // in the idle heap; -1: not in it
}

// Conn is one admitted connection.
type Conn struct {
	cs     *Conns
	c      *connClient // nil once released
	closer io.Closer
	idle   bool
	index  int // in c.idle while idle
}

// NewConns makes a Conns for at most max connections, perClient per
// client (0, or max or more: no per-client cap).
func NewConns(max, perClient int) *Conns {
	if perClient >= max {
		perClient = 0
	}
	return &Conns{max: max, perClient: perClient, clients: map[string]*connClient{}}
}

// Max is the cap on all connections; PerClient the cap per client (0:
// none).
func (cs *Conns) Max() int       { return cs.max }
func (cs *Conns) PerClient() int { return cs.perClient }

// Admit counts a new connection of client key, closed with closer when it
// is evicted. The connection starts idle (it has no request yet). When the
// verdict is Admitted and evicted is not nil, the caller closes evicted
// (an idle connection of a heavier client, already uncounted).
func (cs *Conns) Admit(key string, exempt bool, closer io.Closer) (h *Conn, evicted io.Closer, v Verdict) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cl := cs.clients[key]
	n := 0
	if cl != nil {
		n = cl.open
	}
	if !exempt && cs.perClient > 0 && n >= cs.perClient {
		return nil, nil, OverClient
	}
	if cs.open >= cs.max {
		if len(cs.idle) == 0 || cs.idle[0].open <= n+1 {
			return nil, nil, OverTotal
		}
		victim := cs.idle[0].idle[0]
		evicted = victim.closer
		cs.release(victim)
	}
	if cl == nil {
		cl = &connClient{key: key, index: -1}
		cs.clients[key] = cl
	}
	h = &Conn{cs: cs, c: cl, closer: closer}
	cs.open++
	cl.open++
	cs.setIdle(h, true)
	cs.fix(cl)
	return h, evicted, Admitted
}

// SetIdle marks h idle (may be closed to make room) or busy.
func (h *Conn) SetIdle(idle bool) {
	h.cs.mu.Lock()
	defer h.cs.mu.Unlock()
	if h.c != nil {
		h.cs.setIdle(h, idle)
	}
}

// Release uncounts h (it was closed). It reports whether h was still
// counted: false after an eviction or an earlier Release.
func (h *Conn) Release() bool {
	h.cs.mu.Lock()
	defer h.cs.mu.Unlock()
	if h.c == nil {
		return false
	}
	h.cs.release(h)
	return true
}

// Count is the number of connections counted.
func (cs *Conns) Count() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.open
}

// CountBy is the number of connections client key holds.
func (cs *Conns) CountBy(key string) int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cl := cs.clients[key]; cl != nil {
		return cl.open
	}
	return 0
}

// release uncounts h. cs.mu is held.
func (cs *Conns) release(h *Conn) {
	cl := h.c
	cs.setIdle(h, false)
	h.c = nil
	cs.open--
	cl.open--
	if cl.open == 0 {
		delete(cs.clients, cl.key)
	}
	cs.fix(cl)
}

// setIdle moves h in or out of its client's idle list, and the client in
// or out of the heap. cs.mu is held.
func (cs *Conns) setIdle(h *Conn, idle bool) {
	if h.idle == idle {
		return
	}
	cl := h.c
	h.idle = idle
	if idle {
		h.index = len(cl.idle)
		cl.idle = append(cl.idle, h)
		if len(cl.idle) == 1 {
			heap.Push(&cs.idle, cl)
		}
		return
	}
	last := cl.idle[len(cl.idle)-1]
	cl.idle[h.index], last.index = last, h.index
	cl.idle[len(cl.idle)-1] = nil
	cl.idle = cl.idle[:len(cl.idle)-1]
	if len(cl.idle) == 0 {
		heap.Remove(&cs.idle, cl.index)
	}
}

// fix restores the heap after cl's count changed. cs.mu is held.
func (cs *Conns) fix(cl *connClient) {
	if cl.index >= 0 {
		heap.Fix(&cs.idle, cl.index)
	}
}

// idleHeap orders clients by open connections, the most first.
type idleHeap []*connClient

func (h idleHeap) Len() int           { return len(h) }
func (h idleHeap) Less(i, j int) bool { return h[i].open > h[j].open }
func (h idleHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *idleHeap) Push(x any) {
	cl := x.(*connClient)
	cl.index = len(*h)
	*h = append(*h, cl)
}
func (h *idleHeap) Pop() any {
	old := *h
	cl := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	cl.index = -1
	return cl
}
