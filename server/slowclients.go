package server

import (
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Slow clients. net/http bounds how long a request's header may take
// (ReadHeaderTimeout) and how long a connection may idle between requests
// (IdleTimeout), and nothing else: a client that sent its body a byte at a
// time, or stopped reading the answer, held its connection and a handler's
// goroutine for as long as it liked, without a token too (net/http reads an
// unread body after the handler, before it answers, to reuse the
// connection). Its whole-request timeouts (ReadTimeout, WriteTimeout) would
// cut every long answer: commands, streams, downloads, WebSockets.
const (
	// bodyTimeout: a request's body must arrive within it. Handlers that
	// take longer bodies set their own deadline (uploads: fileIO) or none
	// (the portal, once the request is authorized: the sandbox's own
	// server reads it).
	bodyTimeout = 30 * time.Second
	// writeStall: one write to a client may block this long (a full TCP
	// window) before the connection is cut. A deadline the server sets
	// itself (file transfers, WebSocket writes) is kept when earlier.
	writeStall = 60 * time.Second
)

// limitBody sets the body deadline (s.bodyIO) on r's connection if r has a
// body, and clears it once the body has been read to its end (net/http
// then reads the connection in the background for the rest of the
// handler, and a deadline would cancel its context). Call the returned
// function when the handler returns: a body it left unread is drained by
// net/http within the timeout too.
func (s *Server) limitBody(w http.ResponseWriter, r *http.Request) (done func()) {
	if r.Body == nil || r.Body == http.NoBody {
		return func() {}
	}
	d := time.Duration(s.bodyIO.Load())
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(d)) != nil {
		return func() {} // not a network connection (tests' recorders)
	}
	b := &deadlineBody{ReadCloser: r.Body, rc: rc}
	r.Body = b
	return func() {
		if !b.eof.Load() {
			rc.SetReadDeadline(time.Now().Add(d))
		}
	}
}

type deadlineBody struct {
	io.ReadCloser
	rc  *http.ResponseController
	eof atomic.Bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && b.eof.CompareAndSwap(false, true) {
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// noBodyDeadline lifts the body deadline for a request that may stream its
// body for long (an authorized request into the portal).
func noBodyDeadline(w http.ResponseWriter) {
	http.NewResponseController(w).SetReadDeadline(time.Time{})
}

// stallListener gives each accepted connection the write-stall bound.
type stallListener struct {
	net.Listener
	stall *atomic.Int64 // ns
}

func (l stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, stall: l.stall}, nil
}

// stallConn bounds each Write by the write-stall timeout, or by the write
// deadline the server set (SetDeadline, SetWriteDeadline) when that is
// earlier. Every write to the client passes here: net/http's, and a
// hijacked WebSocket's.
type stallConn struct {
	net.Conn
	stall *atomic.Int64
	mu    sync.Mutex
	set   time.Time // the write deadline the server set; zero: none
}

func (c *stallConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.set = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *stallConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.set = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *stallConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	d := time.Now().Add(time.Duration(c.stall.Load()))
	if !c.set.IsZero() && c.set.Before(d) {
		d = c.set
	}
	c.mu.Unlock()
	c.Conn.SetWriteDeadline(d)
	return c.Conn.Write(b)
}

// CloseWrite keeps net/http's graceful close working through the wrapper.
func (c *stallConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
