package egress

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var connectOK = []byte("HTTP/1.1 200 Connection established\r\n\r\n")

// connect decides a CONNECT, dials the destination through the guard,
// checks the client's first message, then relays bytes both ways. It runs
// on the connection's server goroutine and returns when the tunnel ends;
// the one goroutine it starts (upstream->client) is waited for.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request, c *sessConn) {
	s := c.s
	_, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Time{})
	// Bytes the client sent right behind the CONNECT head (a ClientHello,
	// often) sit in the server's reader; they come first.
	var src io.Reader = c
	if n := brw.Reader.Buffered(); n > 0 {
		early, _ := brw.Reader.Peek(n)
		src = io.MultiReader(bytes.NewReader(bytes.Clone(early)), c)
	}

	rawHost, port, err := splitHostPort(r.RequestURI, 443)
	if err != nil {
		reason := ReasonInvalidHost
		if errors.Is(err, errInvalidPort) {
			reason = ReasonInvalidPort
		}
		h := cleanHost(r.RequestURI)
		s.deny(h, 0, reason)
		p.refuseRaw(c, http.StatusForbidden, "Egress denied ("+reason+")", reason, denyText(reason, h, 0))
		return
	}
	if g := p.gitTarget(s, rawHost, port); g != nil {
		// The paired Git host is allowed by the pairing itself.
		p.gitTunnel(c, src, s, g)
		return
	}
	host, ip, reason := s.pol.decide(rawHost, port)
	if reason != "" {
		if host == "" {
			host = shownHost(rawHost)
		}
		s.deny(host, port, reason)
		p.refuseRaw(c, http.StatusForbidden, "Egress denied ("+reason+")", reason, denyText(reason, host, port))
		return
	}
	up, err := s.dial.dial(r.Context(), host, ip, port)
	if err != nil {
		var de *denyError
		if errors.As(err, &de) {
			s.deny(host, port, de.reason)
			p.refuseRaw(c, http.StatusForbidden, "Egress denied ("+de.reason+")", de.reason, denyText(de.reason, host, port))
			return
		}
		p.log.Debug("egress upstream unreachable", "session", s.id, "host", host, "port", port, "err", upstreamError(err))
		msg := "egress: upstream " + hostPort(host, port) + ": " + upstreamError(err) + "\n"
		p.refuseRaw(c, http.StatusBadGateway, "Bad Gateway", "", msg)
		return
	}
	tc := &trackedConn{Conn: up, s: s}
	if !s.track(tc) {
		return
	}
	defer tc.Close()
	d := s.dest(host)
	c.attach(d)
	if _, err := c.Write(connectOK); err != nil {
		return
	}
	d.conns.Add(1)
	p.met.allowed.Inc()

	t := newTunnel(c, tc, s.pol.idleTimeout())
	t.host, t.port = host, port
	defer t.stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	started := false
	startDown := func() {
		started = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := t.pipeDown(c, tc); err != nil {
				t.closeBoth()
			} else {
				closeWrite(c.Conn)
			}
		}()
	}

	// Ports 443 and 80 carry client-first protocols: nothing flows until
	// the first message passed. Other ports may be server-first (SSH,
	// SMTP), so the server's bytes flow while the client's are checked.
	mode := sniffMode
	switch port {
	case 443:
		mode = tlsMode
	case 80:
		mode = httpMode
	}
	deadline := func() { _ = c.SetReadDeadline(time.Now().Add(s.pol.headerTimeout())) }
	arm := func() {}
	if mode == sniffMode {
		startDown()
		arm = deadline // a server-first protocol may wait long for the client's first byte
	} else {
		deadline()
	}
	br := bufio.NewReaderSize(src, inspectBufSize)
	reason, next, eof := inspect(br, arm, mode, s.pol, host, ip, port)
	_ = c.SetReadDeadline(time.Time{})
	if reason != "" || eof {
		if !eof {
			s.deny(host, port, reason)
		}
		t.closeBoth()
		return
	}
	if !started {
		startDown()
	}
	switch next {
	case relayRequests: // every request on the tunnel is checked, not just the first
		reason, err = t.relayHTTP(tc, br, 0)
	case relaySniffed:
		reason, err = t.relaySniffed(tc, br)
	default: // a checked TLS handshake: the rest is opaque
		err = t.pipe(tc, br)
	}
	if reason != "" {
		s.deny(host, port, reason)
	}
	if reason != "" || err != nil {
		t.closeBoth()
	} else {
		closeWrite(tc.Conn)
	}
}

// What follows a tunnel's first message.
type relayKind int

const (
	relayOpaque   relayKind = iota // TLS after a checked ClientHello
	relayRequests                  // HTTP/1 requests, each checked (relayHTTP)
	relaySniffed                   // not TLS on another port: decided by its first line (relaySniffed)
)

type inspectMode int

const (
	sniffMode inspectMode = iota // other ports: TLS -> SNI rule, HTTP -> Host rule (relaySniffed), else opaque
	tlsMode                      // 443: must be a TLS ClientHello with the right SNI
	httpMode                     // 80: must be an HTTP request with the right Host
)

// inspect checks the client's first message in a tunnel to host:port; arm
// is called when its first byte has arrived (to start the deadline on the
// rest of it). It returns a Reason when refused, how to relay what follows,
// or eof when the client closed before sending anything, which is not a
// denial (a client too slow to send is: ReasonBadHello).
func inspect(br *bufio.Reader, arm func(), mode inspectMode, pol *Policy, host string, ip netip.Addr, port int) (reason string, next relayKind, eof bool) {
	first, err := br.Peek(1)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			return "", 0, true
		}
		return ReasonBadHello, 0, false
	}
	arm() // the first byte is here: the rest of the first message has a deadline
	if first[0] == recordHandshake {
		if mode == httpMode {
			return ReasonNotHTTP, 0, false
		}
		return checkHello(br, pol, host, ip, port), relayOpaque, false
	}
	if mode == sniffMode {
		return "", relaySniffed, false
	}
	if mode == tlsMode {
		// Refused either way; the reason tells a plain request apart.
		b, _ := br.Peek(br.Buffered())
		if line, _, ok := bytes.Cut(b, []byte("\n")); ok && strictRequestLine(append(bytes.Clone(line), '\n')) {
			return ReasonHTTPInTunnel, 0, false
		}
		return ReasonNotTLS, 0, false
	}
	return checkHTTP(br, host, port), relayRequests, false
}

// isTokenChar: RFC 9110 tchar.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// checkHello applies the SNI rule: a named destination needs an SNI equal
// to it (no domain fronting, no missing SNI); an allowlisted IP literal
// takes no SNI or one the policy allows on that port.
func checkHello(br *bufio.Reader, pol *Policy, host string, ip netip.Addr, port int) string {
	sni, has, err := readClientHello(br)
	if err != nil {
		return ReasonBadHello
	}
	if !has {
		if ip.IsValid() {
			return ""
		}
		return ReasonSNIMissing
	}
	norm, sniIP, err := normalizeHost(sni)
	if err != nil || sniIP.IsValid() {
		return ReasonSNIMismatch
	}
	if ip.IsValid() {
		if _, _, reason := pol.decide(norm, port); reason != "" {
			return ReasonSNIMismatch
		}
		return ""
	}
	if norm != host {
		return ReasonSNIMismatch
	}
	return ""
}

// checkHTTP checks the first request's head in a tunnel to port 80 while
// the header deadline runs (a client that never completes it is cut);
// relayHTTP parses it again, once, as it forwards it and every later one.
func checkHTTP(br *bufio.Reader, host string, port int) string {
	_, _, _, reason, err := checkHead(br, host, port)
	if err != nil {
		return ReasonNotHTTP
	}
	return reason
}

// tunnel relays one CONNECT. An idle timer (no goroutine) closes both ends
// after idle with no bytes either way.
type tunnel struct {
	c    *sessConn
	up   net.Conn
	idle time.Duration
	host string // the CONNECT host (normalized) and port
	port int
	last atomic.Int64 // unix nanoseconds of the last byte either way

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

func newTunnel(c *sessConn, up net.Conn, idle time.Duration) *tunnel {
	t := &tunnel{c: c, up: up, idle: idle}
	t.touch()
	t.mu.Lock()
	t.timer = time.AfterFunc(idle, t.watch)
	t.mu.Unlock()
	return t
}

func (t *tunnel) touch() { t.last.Store(time.Now().UnixNano()) }

func (t *tunnel) watch() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	quiet := time.Duration(time.Now().UnixNano() - t.last.Load())
	if quiet >= t.idle {
		t.stopped = true
		t.closeBoth()
		return
	}
	t.timer.Reset(t.idle - quiet)
}

func (t *tunnel) stop() {
	t.mu.Lock()
	t.stopped = true
	t.timer.Stop()
	t.mu.Unlock()
}

func (t *tunnel) closeBoth() {
	_ = t.c.Close()
	_ = t.up.Close()
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// pipe copies src to dst until EOF (nil) or an error.
func (t *tunnel) pipe(dst io.Writer, src io.Reader) error {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		if done, err := t.copyStep(dst, src, buf); done {
			return err
		}
	}
}

// copyStep moves what one read of src gives to dst; done at EOF (nil) or
// on an error.
func (t *tunnel) copyStep(dst io.Writer, src io.Reader, buf []byte) (done bool, err error) {
	n, rerr := src.Read(buf)
	if n > 0 {
		t.touch()
		if _, werr := dst.Write(buf[:n]); werr != nil {
			return true, werr
		}
	}
	if rerr != nil {
		if errors.Is(rerr, io.EOF) {
			return true, nil
		}
		return true, rerr
	}
	return false, nil
}

// Splicing: spliceChunk is one kernel-to-kernel move of downstream bytes;
// spliceMargin is how much quota must remain after a move for it to be
// spliced rather than copied exactly (see session.reserve).
const (
	spliceChunk  = 256 << 10
	spliceMargin = 4 << 20
)

// pipeDown copies upstream bytes to the client. Between two TCP sockets,
// while the session is far from its quota, the kernel moves them (splice)
// with no copy through user space; near the quota, and for other conns,
// they take the exact copying path.
func (t *tunnel) pipeDown(c *sessConn, up *trackedConn) error {
	dst, ok1 := c.Conn.(*net.TCPConn)
	src, ok2 := up.Conn.(*net.TCPConn)
	if !ok1 || !ok2 || c.refusing {
		return t.pipe(c, up)
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	lr := &io.LimitedReader{R: src}
	for {
		if want := c.s.reserve(spliceChunk, spliceMargin); want > 0 {
			lr.N = want
			n, err := dst.ReadFrom(lr)
			c.s.settle(want, n)
			if n > 0 {
				t.touch()
				c.countIn(n)
			}
			if err != nil {
				return err
			}
			if n < want && lr.N > 0 { // src reached EOF
				return nil
			}
			continue
		}
		if done, err := t.copyStep(c, up, buf); done {
			return err
		}
	}
}
