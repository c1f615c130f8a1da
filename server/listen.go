package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"sandboxd/egress"
	"sandboxd/server/fair"
)

// maxHeaderBytes bounds a request's header block (431 beyond): net/http's
// default, 1 MiB, let each of limits.maxAPIConns connections hold a
// megabyte of headers. Browsers send a few KiB (cookies are 4 KiB each).
const maxHeaderBytes = 64 << 10

// apiServer is the API's HTTP server and ln wrapped to cap its open
// connections (limits.maxAPIConns, limits.maxConnsPerClient). Idle
// keep-alive connections close after limits.apiIdleSeconds; headers must
// arrive within 10 s and fit in maxHeaderBytes.
func (s *Server) apiServer(ln net.Listener) (*http.Server, *capListener) {
	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Duration(s.cfg.Limits.APIIdleSeconds) * time.Second,
		MaxHeaderBytes:    maxHeaderBytes,
		// Which connections may be closed to make room (fair.Conns).
		ConnState: func(c net.Conn, st http.ConnState) {
			if cc, ok := c.(*capConn); ok {
				switch st {
				case http.StateNew, http.StateIdle:
					cc.h.SetIdle(true)
				case http.StateActive, http.StateHijacked:
					cc.h.SetIdle(false)
				}
			}
		},
	}
	// MCP sessions' GET streams never end by themselves.
	hs.RegisterOnShutdown(func() { s.mcp.closeAll(10 * time.Second) })
	max := int64(s.cfg.Limits.MaxAPIConns)
	if max <= 0 {
		max = egress.FDShare()
	}
	return hs, s.capConns(stallListener{ln, &s.writeIdle}, max, connsPerClient(s.cfg.Limits.MaxConnsPerClient, max))
}

// connsPerClient is limits.maxConnsPerClient, or for 0 an eighth of the
// total max, at least 32 (fair.NewConns takes max or more as no cap).
func connsPerClient(configured int, total int64) int {
	if configured > 0 {
		return configured
	}
	return int(min(total, max(total/8, 32)))
}

// capListener holds at most max accepted connections open at once, and
// at most perClient of one client address (fair.Conns; a trustedProxies
// peer has no per-client cap). At the total cap a new connection takes the
// place of an idle one of the heaviest client (closed here), or is closed
// as soon as it is accepted; over its client's cap it is answered 429
// rate_limited with Retry-After, then closed.
//
// Closing rather than blocking (golang.org/x/net/netutil.LimitListener
// stops calling Accept at the cap): a blocked listener leaves new clients
// hanging in the kernel's accept queue until their own timeout, with no
// sign of why, and /healthz probes hang the same way; closing gives them an
// immediate EOF, keeps the queue drained and matches the egress proxy's
// too_many_connections. Either way the descriptors stay bounded, which is
// the point: accept never fails with EMFILE for the rest of the server.
// The 429 answers are written by at most maxRefusers goroutines at a
// time, each for at most refuseTimeout; past that, closed at once too.
//
// A connection counts until it is closed, whoever closes it: net/http for
// requests and idle keep-alives, the WebSocket code for a hijacked one
// (Hijack hands out this same net.Conn).
type capListener struct {
	net.Listener
	max       int64
	conns     *fair.Conns
	trusted   []netip.Prefix
	onOpen    func(delta int)
	refused   func()           // over the total
	overOwn   func(key string) // over the client's own cap
	evicted   func()
	refusers  chan struct{}
	mu        sync.Mutex
	answering map[net.Conn]struct{} // refusals being answered
	wg        sync.WaitGroup
	closed    bool
}

const (
	maxRefusers   = 32
	refuseTimeout = 2 * time.Second
)

func (s *Server) capConns(ln net.Listener, max int64, perClient int) *capListener {
	l := &capListener{Listener: ln, max: max, conns: fair.NewConns(int(max), perClient), trusted: s.fair.trusted,
		refusers: make(chan struct{}, maxRefusers), answering: map[net.Conn]struct{}{}}
	warn := rate.Sometimes{Interval: time.Minute}
	warnClient := rate.Sometimes{Interval: time.Minute}
	l.onOpen = func(delta int) { s.met.apiConns.Add(float64(delta)) }
	l.refused = func() {
		s.met.apiRefused.Inc()
		warn.Do(func() {
			s.log.Warn("API connection limit reached; closing new connections", "maxAPIConns", max)
		})
	}
	l.overOwn = func(key string) {
		s.met.apiClientRefused.Inc()
		warnClient.Do(func() {
			s.log.Warn("API client at its connection limit; answering 429 to its new connections", "client", key,
				"maxConnsPerClient", l.conns.PerClient())
		})
	}
	l.evicted = func() { s.met.apiEvicted.Inc() }
	return l
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, exempt := "", false
		if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
			key, exempt = fair.AddrKey(ap.Addr()), trustedAddr(l.trusted, ap.Addr())
		}
		cc := &capConn{Conn: c, l: l}
		h, evicted, v := l.conns.Admit(key, exempt, cc)
		switch v {
		case fair.OverTotal:
			c.Close()
			l.refused()
			continue
		case fair.OverClient:
			l.overOwn(key)
			l.answerOverClient(c)
			continue
		}
		if evicted != nil {
			// Already uncounted: its own Close gives nothing back.
			evicted.Close()
			l.onOpen(-1)
			l.evicted()
		}
		cc.h = h
		l.onOpen(1)
		return cc, nil
	}
}

// answerOverClient answers c's first request 429 and closes it, in a
// goroutine of its own while fewer than maxRefusers are; otherwise it
// closes c at once.
func (l *capListener) answerOverClient(c net.Conn) {
	l.mu.Lock()
	busy := l.closed
	if !busy {
		select {
		case l.refusers <- struct{}{}:
			l.answering[c] = struct{}{}
			l.wg.Add(1)
		default:
			busy = true
		}
	}
	l.mu.Unlock()
	if busy {
		c.Close()
		return
	}
	go func() {
		defer l.wg.Done()
		defer func() { <-l.refusers }()
		writeOverClient(c, l.conns.PerClient())
		l.mu.Lock()
		delete(l.answering, c)
		l.mu.Unlock()
	}()
}

// Close stops accepting and ends the refusals being answered.
func (l *capListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	for c := range l.answering {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

// writeOverClient reads one request from c (headers only), answers it 429
// in the contract's error shape and closes c, all within refuseTimeout.
// Reading first: an answer before the request confuses clients (Go's
// transport drops an "unsolicited response" and retries).
func writeOverClient(c net.Conn, perClient int) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(refuseTimeout))
	req, err := http.ReadRequest(bufio.NewReader(io.LimitReader(c, 16<<10)))
	if err != nil {
		return
	}
	req.Body.Close()
	rid := newRequestID()
	var body errorBody
	body.Error.Code = "rate_limited"
	body.Error.Message = fmt.Sprintf("too many connections from your address: at most %d may be open at once; close idle ones or retry later", perClient)
	body.Error.RequestID = rid
	body.Error.Details = map[string]any{"scope": "address", "limit": "maxConnsPerClient", "retryAfterSeconds": connRetryAfter}
	b, _ := json.Marshal(body)
	fmt.Fprintf(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json; charset=utf-8\r\n"+
		"Retry-After: %d\r\nX-Request-Id: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		connRetryAfter, rid, len(b), b)
	// Half-close, then drain what the client still sends (a body): closing
	// with unread bytes resets the connection, which can lose the answer.
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		io.Copy(io.Discard, io.LimitReader(c, 256<<10))
	}
}

// connRetryAfter is the Retry-After of a connection over its client's cap:
// a place frees when one of the client's own connections closes.
const connRetryAfter = 1

// Open is the number of connections counted against the cap.
func (l *capListener) Open() int64 { return int64(l.conns.Count()) }

// capConn gives its place back on its first Close.
type capConn struct {
	net.Conn
	l *capListener
	h *fair.Conn
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	if c.h.Release() {
		c.l.onOpen(-1)
	}
	return err
}

// CloseWrite keeps net/http's graceful close (half-close, then drain)
// working through the wrapper.
func (c *capConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// trustedAddr reports whether a is a trustedProxies peer.
func trustedAddr(trusted []netip.Prefix, a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
