package server

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"sandboxd/egress"
)

// maxHeaderBytes bounds a request's header block (431 beyond): net/http's
// default, 1 MiB, let each of limits.maxAPIConns connections hold a
// megabyte of headers. Browsers send a few KiB (cookies are 4 KiB each).
const maxHeaderBytes = 64 << 10

// apiServer is the API's HTTP server and ln wrapped to cap its open
// connections (limits.maxAPIConns). Idle keep-alive connections close
// after limits.apiIdleSeconds; headers must arrive within 10 s and fit in
// maxHeaderBytes.
func (s *Server) apiServer(ln net.Listener) (*http.Server, *capListener) {
	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       time.Duration(s.cfg.Limits.APIIdleSeconds) * time.Second,
		MaxHeaderBytes:    maxHeaderBytes,
	}
	// MCP sessions' GET streams never end by themselves.
	hs.RegisterOnShutdown(func() { s.mcp.closeAll(10 * time.Second) })
	max := int64(s.cfg.Limits.MaxAPIConns)
	if max <= 0 {
		max = egress.FDShare()
	}
	return hs, s.capConns(stallListener{ln, &s.writeIdle}, max)
}

// capListener holds at most max accepted connections open at once. A
// connection over the cap is closed as soon as it is accepted.
//
// Closing rather than blocking (golang.org/x/net/netutil.LimitListener
// stops calling Accept at the cap): a blocked listener leaves new clients
// hanging in the kernel's accept queue until their own timeout, with no
// sign of why, and /healthz probes hang the same way; closing gives them an
// immediate EOF, keeps the queue drained and matches the egress proxy's
// too_many_connections. Either way the descriptors stay bounded, which is
// the point: accept never fails with EMFILE for the rest of the server.
//
// A connection counts until it is closed, whoever closes it: net/http for
// requests and idle keep-alives, the WebSocket code for a hijacked one
// (Hijack hands out this same net.Conn).
type capListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	onOpen  func(delta int)
	refused func()
}

func (s *Server) capConns(ln net.Listener, max int64) *capListener {
	l := &capListener{Listener: ln, max: max}
	warn := rate.Sometimes{Interval: time.Minute}
	l.onOpen = func(delta int) { s.met.apiConns.Add(float64(delta)) }
	l.refused = func() {
		s.met.apiRefused.Inc()
		warn.Do(func() {
			s.log.Warn("API connection limit reached; closing new connections", "maxAPIConns", max)
		})
	}
	return l
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			c.Close()
			l.refused()
			continue
		}
		l.onOpen(1)
		return &capConn{Conn: c, l: l}, nil
	}
}

// Open is the number of connections counted against the cap.
func (l *capListener) Open() int64 { return l.open.Load() }

// capConn gives its slot back on its first Close.
type capConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.onOpen(-1)
	})
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
