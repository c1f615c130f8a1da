package egress

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// ErrQuotaExceeded is returned by a session's connections once its byte
// quota is used up.
var ErrQuotaExceeded = errors.New("egress: session byte quota exceeded")

// Dest is what one session exchanged with one destination host.
// Connections counts tunnels opened and plain HTTP requests forwarded;
// BytesOut is sandbox->destination, BytesIn destination->sandbox, counted
// on the sandbox's side of the proxy (headers included).
type Dest struct {
	Connections int64
	BytesOut    int64
	BytesIn     int64
}

type destCounter struct{ conns, out, in atomic.Int64 }

// maxDests bounds a session's per-host map (wildcard rules admit unbounded
// names); further hosts are summed under otherDests.
const (
	maxDests   = 4096
	otherDests = "(other)"
)

// session is one Serve call: its quota, its connections and its counters.
type session struct {
	id       string
	p        *Proxy
	pol      *Policy
	limit    int64
	used     atomic.Int64 // moved plus reserved (inflight)
	inflight atomic.Int64
	// exceeded is set once when used reaches limit (or at start when
	// already there); it never clears.
	exceeded atomic.Bool
	// step is the usage step for Options.OnUsage; steps the last reported.
	step  int64
	steps atomic.Int64

	dial *dialer
	git  atomic.Pointer[GitPairing] // nil: not paired
	srv  *http.Server
	tr   *http.Transport

	mu       sync.Mutex
	closed   bool
	conns    map[io.Closer]struct{} // client conns and upstream conns
	nclients int                    // client conns in conns
	dests    map[string]*destCounter
}

func newSession(p *Proxy, id string, pol *Policy, used, limit int64) *session {
	s := &session{id: id, p: p, pol: pol, limit: limit, conns: map[io.Closer]struct{}{}, dests: map[string]*destCounter{}}
	s.used.Store(used)
	s.step = min(max(limit/64, 1<<20), 64<<20)
	s.steps.Store(used / s.step)
	if used >= limit {
		// Already used up (restart, or limit <= 0): refuse everything; the
		// event was the business of whoever used the bytes.
		s.exceeded.Store(true)
	}
	return s
}

// track registers a connection so Close and the quota cut reach it; false
// (and the conn closed) when the session is already closed.
func (s *session) track(c io.Closer) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = c.Close()
		return false
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	return true
}

func (s *session) untrack(c io.Closer) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// cut closes every open connection of the session; with final it also
// marks the session closed so no new one is tracked.
func (s *session) cut(final bool) {
	s.mu.Lock()
	if final {
		s.closed = true
	}
	conns := make([]io.Closer, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// budget caps b to the bytes the quota still allows; none left is
// ErrQuotaExceeded (and trips the cut).
func (s *session) budget(b []byte) ([]byte, error) {
	rem := s.limit - s.used.Load()
	if rem <= 0 {
		s.exceed()
		return nil, ErrQuotaExceeded
	}
	if int64(len(b)) > rem {
		b = b[:rem]
	}
	return b, nil
}

// usedBytes is what the session has moved: used minus what is reserved
// for splices in flight.
func (s *session) usedBytes() int64 { return s.used.Load() - s.inflight.Load() }

// reserve takes want bytes of the quota for a splice, but only while at
// least margin bytes would remain after it (0: not now). Reservations so
// never bring the remaining quota near zero: close to the limit every
// byte goes through the exact copying path, and no connection is refused
// for bytes another one only reserved. The caller settles with settle.
func (s *session) reserve(want, margin int64) int64 {
	for {
		used := s.used.Load()
		if s.limit-used-want < margin {
			return 0
		}
		if s.used.CompareAndSwap(used, used+want) {
			s.inflight.Add(want)
			return want
		}
	}
}

// settle ends a reservation of r bytes of which n were moved.
func (s *session) settle(r, n int64) {
	s.used.Add(n - r)
	s.inflight.Add(-r)
	s.p.met.bytes.Add(float64(n))
	s.notify()
}

// notify calls Options.OnUsage when the count has passed another step.
func (s *session) notify() {
	if s.p.onUsage == nil {
		return
	}
	used := s.usedBytes()
	last := s.steps.Load()
	if cur := used / s.step; cur > last && s.steps.CompareAndSwap(last, cur) {
		s.p.onUsage(s.id, used)
	}
}

// claim takes up to n bytes of the quota at once and returns how many it
// got (0 when none is left). Claiming before bytes are forwarded is what
// keeps parallel connections from passing the limit together.
func (s *session) claim(n int64) int64 {
	for {
		used := s.used.Load()
		g := min(n, s.limit-used)
		if g <= 0 {
			return 0
		}
		if s.used.CompareAndSwap(used, used+g) {
			return g
		}
	}
}

// moved ends a claim of g bytes of which n were moved, and cuts the session
// when its quota is reached.
func (s *session) moved(g, n int64) {
	if g > n {
		s.used.Add(n - g)
	}
	s.p.met.bytes.Add(float64(n))
	s.notify()
	if s.used.Load() >= s.limit {
		s.exceed()
	}
}

// exceed cuts the session's connections once the quota is reached, then
// reports it. New connections get a 403 from then on.
func (s *session) exceed() {
	if !s.exceeded.CompareAndSwap(false, true) {
		return
	}
	s.cut(false)
	p := s.p
	p.met.quota.Inc()
	p.log.Info("egress quota exceeded", "session", s.id, "used", s.usedBytes(), "limit", s.limit)
	p.events.QuotaExceeded(s.id, s.usedBytes(), s.limit)
}

func (s *session) dest(host string) *destCounter {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dests[host]
	if d == nil {
		if len(s.dests) >= maxDests {
			host = otherDests
			if d = s.dests[host]; d != nil {
				return d
			}
		}
		d = &destCounter{}
		s.dests[host] = d
	}
	return d
}

func (s *session) destinations() map[string]Dest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Dest, len(s.dests))
	for h, d := range s.dests {
		out[h] = Dest{Connections: d.conns.Load(), BytesOut: d.out.Load(), BytesIn: d.in.Load()}
	}
	return out
}

// sessConn is a client connection accepted on a session's listener. Every
// byte read (sandbox->destination) or written (destination->sandbox) goes
// through it, so the quota holds whatever the client does with the
// connection: keep-alive, pipelining, tunnels, upgrades.
type sessConn struct {
	net.Conn
	s *session
	// refusing: accepted after the quota was used up. Such a connection is
	// only ever answered with a 403, so its bytes are neither counted nor
	// capped.
	refusing bool
	hijacked atomic.Bool
	// dest receives the byte counts while a request or tunnel is attached;
	// bytes in between (the next request's head) wait in pendOut/pendIn.
	dest            atomic.Pointer[destCounter]
	pendOut, pendIn atomic.Int64
	closeOnce       sync.Once
	closeErr        error
}

func (c *sessConn) Read(b []byte) (int, error) {
	if c.refusing || len(b) == 0 {
		return c.Conn.Read(b)
	}
	b, err := c.s.budget(b)
	if err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		// Bytes past the quota were read but are dropped, never forwarded.
		g := int(c.s.claim(int64(n)))
		if g < n {
			n, err = g, ErrQuotaExceeded
		}
		if d := c.dest.Load(); d != nil {
			d.out.Add(int64(n))
		} else {
			c.pendOut.Add(int64(n))
		}
		c.s.moved(int64(n), int64(n))
	}
	return n, err
}

func (c *sessConn) Write(b []byte) (int, error) {
	if c.refusing || len(b) == 0 {
		return c.Conn.Write(b)
	}
	g := c.s.claim(int64(len(b)))
	if g == 0 {
		c.s.exceed()
		return 0, ErrQuotaExceeded
	}
	n, err := c.Conn.Write(b[:g])
	if n > 0 {
		if d := c.dest.Load(); d != nil {
			d.in.Add(int64(n))
		} else {
			c.pendIn.Add(int64(n))
		}
	}
	c.s.moved(g, int64(n))
	if err == nil && g < int64(len(b)) {
		err = ErrQuotaExceeded
	}
	return n, err
}

// countIn records n bytes written to the client outside Write (spliced;
// the session's count is settled by the caller).
func (c *sessConn) countIn(n int64) {
	if d := c.dest.Load(); d != nil {
		d.in.Add(n)
	} else {
		c.pendIn.Add(n)
	}
}

// attach starts counting for d, giving it the bytes seen since the last
// request ended (its request head).
func (c *sessConn) attach(d *destCounter) {
	d.out.Add(c.pendOut.Swap(0))
	d.in.Add(c.pendIn.Swap(0))
	c.dest.Store(d)
}

func (c *sessConn) detach() {
	c.dest.Store(nil)
	c.pendOut.Store(0)
	c.pendIn.Store(0)
}

func (c *sessConn) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.Conn.Close()
		c.s.untrack(c)
		c.s.mu.Lock()
		c.s.nclients--
		c.s.mu.Unlock()
		c.s.p.clients.Add(-1)
	})
	return c.closeErr
}

// rawWrite writes the proxy's own refusal, outside quota and counting.
func (c *sessConn) rawWrite(b []byte) {
	_, _ = c.Conn.Write(b)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

func (c *sessConn) CloseWrite() error {
	closeWrite(c.Conn)
	return nil
}

// trackedConn is an upstream connection registered with its session.
type trackedConn struct {
	net.Conn
	s    *session
	once sync.Once
	err  error
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.err = c.Conn.Close()
		c.s.untrack(c)
	})
	return c.err
}

func (c *trackedConn) CloseWrite() error {
	closeWrite(c.Conn)
	return nil
}

// sessListener wraps accepted connections as sessConns.
type sessListener struct {
	net.Listener
	s *session
}

func (l *sessListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		sc := &sessConn{Conn: c, s: l.s}
		s := l.s
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			continue // the listener is being closed too
		}
		if s.nclients >= s.p.maxPerSess || s.p.clients.Load() >= s.p.maxConns {
			s.mu.Unlock()
			_ = c.Close()
			s.deny("", 0, ReasonTooManyConns)
			continue
		}
		// Decided under the lock that exceed's cut also takes: either this
		// conn refuses, or the cut sees it.
		sc.refusing = s.exceeded.Load()
		s.conns[sc] = struct{}{}
		s.nclients++
		s.p.clients.Add(1)
		s.mu.Unlock()
		return sc, nil
	}
}

// tracker counts running Serve calls and handlers so Shutdown can wait for
// them; after close, enter refuses.
type tracker struct {
	mu      sync.Mutex
	n       int
	closing bool
	zero    *sync.Cond
}

func (t *tracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing {
		return false
	}
	t.n++
	return true
}

func (t *tracker) exit() {
	t.mu.Lock()
	t.n--
	if t.n == 0 && t.zero != nil {
		t.zero.Broadcast()
	}
	t.mu.Unlock()
}

func (t *tracker) closeAndWait() {
	t.mu.Lock()
	t.closing = true
	if t.zero == nil {
		t.zero = sync.NewCond(&t.mu)
	}
	for t.n > 0 {
		t.zero.Wait()
	}
	t.mu.Unlock()
}
