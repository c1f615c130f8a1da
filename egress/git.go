package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// GitPairing is a session's paired repository. The proxy terminates TLS to
// Host:Port for that session (with the CA's certificate) and adds the
// credential to the repository's smart-HTTP requests only: any other
// path, host or session gets no credential, and a push may update
// refs/heads/Branch of that repository and nothing else.
type GitPairing struct {
	Host   string // normalized name of the Git host
	Port   int
	Prefix string // the host's base path, "" or "/path" (no trailing slash)
	Repo   string // "owner/name"
	Branch string // the one branch a push may update
	// User and Token are sent as HTTP Basic credentials. The sandbox never
	// sees them.
	User, Token string
}

// SessionOptions are a session's settings for Serve.
type SessionOptions struct {
	Policy      *Policy // nil: the proxy's
	Used, Limit int64   // bytes used so far (after a restart) and the quota
	Git         *GitPairing
}

// ReasonGitPush: a push through a paired session's credential to other
// than its branch (or a deletion of it).
const ReasonGitPush = "git_push_refused"

// maxPushCommands bounds the ref-update commands of one push read before
// its pack (a push of thousands of refs is not a paired branch's push).
const maxPushCommands = 1 << 20

// Serve serves one session on l until it is closed; see ServeWithPolicy.
func (p *Proxy) Serve(l net.Listener, key string, o SessionOptions) error {
	return p.serve(l, key, o)
}

// UpdateGit replaces a live session's pairing (nil: no longer paired):
// a credential connected, replaced or removed, or the branch learned after
// the clone. Requests already in a terminated tunnel use it from their next
// request on. Unknown keys are ignored.
func (p *Proxy) UpdateGit(key string, g *GitPairing) {
	p.mu.Lock()
	s := p.sessions[key]
	p.mu.Unlock()
	if s != nil {
		s.git.Store(g)
	}
}

// gitTarget returns the session's pairing when a CONNECT to host:port is
// its paired Git host, whose TLS the proxy terminates; nil otherwise.
func (p *Proxy) gitTarget(s *session, rawHost string, port int) *GitPairing {
	g := s.git.Load()
	if g == nil || p.ca == nil || port != g.Port {
		return nil
	}
	if host, ip, err := normalizeHost(rawHost); err != nil || ip.IsValid() || host != g.Host {
		return nil
	}
	return g
}

// authority is the Host header and URL authority of the Git host.
func (g *GitPairing) authority() string {
	if g.Port == 443 {
		return g.Host
	}
	return net.JoinHostPort(g.Host, strconv.Itoa(g.Port))
}

// hostMatches: a request's Host names the Git host (the default port may
// be spelled out).
func (g *GitPairing) hostMatches(h string) bool {
	return strings.EqualFold(h, g.authority()) || g.Port == 443 && strings.EqualFold(h, g.Host+":443")
}

// Git smart-HTTP endpoints of the paired repository.
type gitEndpoint int

const (
	notPaired   gitEndpoint = iota
	infoRefs                // GET/HEAD .../info/refs
	uploadPack              // POST .../git-upload-pack
	receivePack             // POST .../git-receive-pack
)

// endpoint classifies an escaped request path: the repository's
// smart-HTTP endpoints get the credential; everything else passes without.
func (g *GitPairing) endpoint(path string) gitEndpoint {
	rest, ok := cutPrefixFold(path, g.Prefix+"/"+g.Repo)
	if !ok {
		return notPaired
	}
	rest, _ = cutPrefixFold(rest, ".git")
	switch rest {
	case "/info/refs":
		return infoRefs
	case "/git-upload-pack":
		return uploadPack
	case "/git-receive-pack":
		return receivePack
	}
	return notPaired
}

// cutPrefixFold is strings.CutPrefix ignoring ASCII case (Git hosts treat
// owner and repository names so).
func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}

// gitTransport reaches the Git host for one session: through the session's
// guarded dialer (tracked, so Close and the quota cut reach it; reads and
// writes that stall past the idle timeout fail), TLS verified against the
// configured roots, HTTP/1.1.
func (p *Proxy) gitTransport(s *session, g *GitPairing) *http.Transport {
	idle := s.pol.idleTimeout()
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := s.dial.dial(ctx, g.Host, netip.Addr{}, g.Port)
			if err != nil {
				return nil, err
			}
			tc := &trackedConn{Conn: &idleConn{Conn: c, idle: idle}, s: s}
			if !s.track(tc) {
				return nil, net.ErrClosed
			}
			return tc, nil
		},
		TLSClientConfig:        &tls.Config{ServerName: g.Host, RootCAs: p.gitRoots, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
		TLSNextProto:           map[string]func(string, *tls.Conn) http.RoundTripper{},
		DisableCompression:     true,
		MaxIdleConns:           4,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        idle,
		TLSHandshakeTimeout:    s.pol.headerTimeout(),
		ResponseHeaderTimeout:  5 * time.Minute, // a big repository's pack takes a while to start
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
	}
}

// idleConn fails a read or write that makes no progress for idle.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(b []byte) (int, error) {
	_ = c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	return c.Conn.Write(b)
}

// gitConn is the sandbox's side of a terminated tunnel: the bytes that
// came behind the CONNECT head first; reads and writes that stall past
// the idle timeout fail; while a request head is read, at most
// maxGitHead bytes are taken.
type gitConn struct {
	*sessConn
	r    io.Reader
	idle time.Duration
	head atomic.Int64 // bytes left for the current head; < 0: not reading one
	// by is the deadline of the handshake or head being read (unix ns; 0:
	// none, each read gets the idle timeout).
	by atomic.Int64
}

// within bounds reads until d is over (a handshake, a request head); the
// zero time goes back to the idle timeout.
func (c *gitConn) within(d time.Time) {
	if d.IsZero() {
		c.by.Store(0)
		return
	}
	c.by.Store(d.UnixNano())
}

const maxGitHead = 64 << 10

var errHeadTooLarge = errors.New("egress: request head too large")

func (c *gitConn) Read(b []byte) (int, error) {
	if by := c.by.Load(); by != 0 {
		_ = c.sessConn.SetReadDeadline(time.Unix(0, by))
	} else {
		_ = c.sessConn.SetReadDeadline(time.Now().Add(c.idle))
	}
	left := c.head.Load()
	if left == 0 {
		return 0, errHeadTooLarge
	}
	if left > 0 && int64(len(b)) > left {
		b = b[:left]
	}
	n, err := c.r.Read(b)
	if left > 0 {
		c.head.Add(-int64(n))
	}
	return n, err
}

func (c *gitConn) Write(b []byte) (int, error) {
	_ = c.sessConn.SetWriteDeadline(time.Now().Add(c.idle))
	return c.sessConn.Write(b)
}

// gitTunnel serves a CONNECT to the paired Git host: it answers the
// CONNECT, terminates the sandbox's TLS with a certificate of the CA, and
// relays each HTTP/1.1 request to the host on its own TLS connection,
// adding the credential to the repository's endpoints. It runs on the
// connection's goroutine and returns when the client is done.
func (p *Proxy) gitTunnel(c *sessConn, src io.Reader, s *session, g *GitPairing) {
	host, port := g.Host, g.Port
	leaf, err := p.ca.leaf(host)
	if err != nil {
		p.log.Error("egress git certificate", "err", err)
		p.refuseRaw(c, http.StatusBadGateway, "Bad Gateway", "", "egress: no certificate for the Git host\n")
		return
	}
	d := s.dest(host)
	c.attach(d)
	if _, err := c.Write(connectOK); err != nil {
		return
	}
	d.conns.Add(1)
	p.met.allowed.Inc()
	gc := &gitConn{sessConn: c, r: src, idle: s.pol.idleTimeout()}
	gc.head.Store(-1)
	conn := tls.Server(gc, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if !strings.EqualFold(strings.TrimSuffix(hi.ServerName, "."), host) {
				return nil, errors.New("SNI is not the Git host")
			}
			return leaf, nil
		},
	})
	defer conn.Close()
	gc.within(time.Now().Add(s.pol.headerTimeout()))
	if err := conn.Handshake(); err != nil {
		s.deny(host, port, ReasonBadHello)
		return
	}
	gc.within(time.Time{})
	tr := p.gitTransport(s, g)
	defer tr.CloseIdleConnections()
	br := bufio.NewReader(conn)
	for {
		// Waiting for a request may take the idle timeout; once it has
		// begun, its head must arrive whole within the header timeout.
		if _, err := br.Peek(1); err != nil {
			return
		}
		gc.head.Store(maxGitHead)
		gc.within(time.Now().Add(s.pol.headerTimeout()))
		req, err := http.ReadRequest(br)
		gc.head.Store(-1)
		gc.within(time.Time{})
		if err != nil {
			if errors.Is(err, errHeadTooLarge) {
				s.deny(host, port, ReasonHTTPFraming)
				writeText(conn, http.StatusRequestHeaderFieldsTooLarge, "egress: request head too large\n")
			}
			return
		}
		keep := p.gitRequest(conn, req, s, tr)
		if !keep || req.Close {
			return // a refused or broken request's body is not read
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, 64<<10))
		req.Body.Close()
	}
}

// hopHeaders are connection-level and never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// gitRequest relays one request from the sandbox to the Git host and its
// answer back; false when the connection must end.
func (p *Proxy) gitRequest(w io.Writer, req *http.Request, s *session, tr *http.Transport) bool {
	g := s.git.Load()
	if g == nil {
		writeText(w, http.StatusServiceUnavailable, "egress: this session is no longer paired with a Git repository\n")
		return false
	}
	refuse := func(status int, reason, msg string) bool {
		if reason != "" {
			s.deny(g.Host, g.Port, reason)
		}
		writeText(w, status, msg)
		return false
	}
	if !g.hostMatches(req.Host) {
		return refuse(http.StatusForbidden, ReasonHostMismatch, "egress: Host is not "+g.authority()+"\n")
	}
	if !strings.HasPrefix(req.RequestURI, "/") {
		return refuse(http.StatusForbidden, ReasonAbsoluteForm, "egress: a request in a tunnel names a path, not a URL\n")
	}
	if req.Header.Get("Upgrade") != "" {
		return refuse(http.StatusForbidden, ReasonHTTPFraming, "egress: no protocol upgrades to the Git host\n")
	}
	out, err := http.NewRequestWithContext(req.Context(), req.Method, "https://"+g.authority()+req.RequestURI, req.Body)
	if err != nil {
		return refuse(http.StatusBadRequest, ReasonHTTPFraming, "egress: bad request target\n")
	}
	out.Header = req.Header.Clone()
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	out.ContentLength, out.TransferEncoding = req.ContentLength, req.TransferEncoding
	if req.ContentLength == 0 && len(req.TransferEncoding) == 0 {
		out.Body = http.NoBody
	}
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		// Answered here: the body is checked before anything goes upstream.
		out.Header.Del("Expect")
		if _, err := io.WriteString(w, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return false
		}
	}
	ep := g.endpoint(out.URL.EscapedPath())
	credentialed := false
	switch {
	case ep == notPaired:
	case ep == infoRefs && (req.Method == http.MethodGet || req.Method == http.MethodHead),
		ep == uploadPack && req.Method == http.MethodPost:
		credentialed = true
	case ep == receivePack && req.Method == http.MethodPost:
		if ce := req.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
			return refuse(http.StatusUnsupportedMediaType, ReasonGitPush, "sandboxd: a push to the paired repository must not be compressed\n")
		}
		body, err := checkPush(req.Body, "refs/heads/"+g.Branch)
		if err != nil {
			return refuse(http.StatusForbidden, ReasonGitPush, fmt.Sprintf("sandboxd: %v; a push here may only update refs/heads/%s of %s\n", err, g.Branch, g.Repo))
		}
		out.Body = io.NopCloser(body)
		credentialed = true
	case ep == receivePack:
		return refuse(http.StatusMethodNotAllowed, ReasonGitPush, "sandboxd: "+req.Method+" is not a push\n")
	default: // another method on a fetch endpoint: it goes as sent, without the credential
	}
	if credentialed && g.Token != "" {
		out.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(g.User+":"+g.Token)))
		out.Header.Del("Cookie") // the credential's requests carry nothing of the sandbox's
	}
	resp, err := tr.RoundTrip(out)
	if err != nil {
		var de *denyError
		if errors.As(err, &de) {
			return refuse(http.StatusForbidden, de.reason, denyText(de.reason, g.Host, g.Port))
		}
		p.log.Debug("egress git upstream", "session", s.id, "err", upstreamError(err))
		return refuse(http.StatusBadGateway, "", "egress: Git host "+g.authority()+": "+upstreamError(err)+"\n")
	}
	defer resp.Body.Close()
	for _, h := range hopHeaders {
		if h != "Transfer-Encoding" {
			resp.Header.Del(h)
		}
	}
	if credentialed {
		// A session the host opens for the credential is not the sandbox's.
		resp.Header.Del("Set-Cookie")
	}
	resp.Close = resp.Close || req.Close
	if err := resp.Write(w); err != nil {
		return false
	}
	return !resp.Close
}

// writeText answers a request in a terminated tunnel and ends it.
func writeText(w io.Writer, status int, msg string) {
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(msg), msg)
}

// pushCaps are the receive-pack capabilities a push through the
// credential may ask for; anything else (push-options, push-cert, ...)
// is refused: push options can make a host open or merge requests or
// change settings.
var pushCaps = map[string]bool{
	"report-status": true, "report-status-v2": true, "side-band-64k": true, "side-band": true,
	"quiet": true, "atomic": true, "ofs-delta": true, "delete-refs": true,
}

// checkPush reads a receive-pack request's ref-update commands (pkt-lines
// up to the first flush), parsed as git does ("<old> SP <new> SP <ref>"
// up to NUL or LF), and refuses any that is not an update or creation of
// ref, and capabilities outside pushCaps. A body that is only a flush is
// git's probe before a large push and updates nothing. It returns a
// reader of the whole body (what it read, then the rest).
func checkPush(body io.Reader, ref string) (io.Reader, error) {
	var buf bytes.Buffer
	hdr := make([]byte, 4)
	commands := 0
	for {
		if _, err := io.ReadFull(body, hdr); err != nil {
			return nil, errors.New("a truncated push")
		}
		buf.Write(hdr)
		n, err := strconv.ParseUint(string(hdr), 16, 16)
		if err != nil || !isHex(hdr) {
			return nil, errors.New("a malformed push")
		}
		if n == 0 {
			break
		}
		if n < 5 || buf.Len()+int(n) > maxPushCommands {
			return nil, errors.New("a malformed push")
		}
		line := make([]byte, n-4)
		if _, err := io.ReadFull(body, line); err != nil {
			return nil, errors.New("a truncated push")
		}
		buf.Write(line)
		line = bytes.TrimSuffix(line, []byte("\n"))
		cmd, caps, hasCaps := bytes.Cut(line, []byte{0})
		if hasCaps && commands > 0 {
			return nil, errors.New("a push with capabilities after its first command")
		}
		if hasCaps {
			for _, c := range strings.Split(string(caps), " ") {
				name, _, _ := strings.Cut(c, "=")
				if c != "" && !pushCaps[name] && name != "agent" && name != "object-format" && name != "session-id" {
					return nil, fmt.Errorf("refused push capability %q", name)
				}
			}
		}
		if oid, ok := bytes.CutPrefix(cmd, []byte("shallow ")); ok && !hasCaps && commands == 0 && isHexID(string(oid)) {
			continue
		}
		old, rest, ok1 := bytes.Cut(cmd, []byte(" "))
		nw, r, ok2 := bytes.Cut(rest, []byte(" "))
		if !ok1 || !ok2 || !isHexID(string(old)) || !isHexID(string(nw)) {
			return nil, errors.New("a push with an unexpected command")
		}
		if string(r) != ref {
			return nil, fmt.Errorf("refused to update %q", r)
		}
		if strings.Trim(string(nw), "0") == "" {
			return nil, fmt.Errorf("refused to delete %q", r)
		}
		commands++
	}
	if commands == 0 {
		// git's probe ("0000" alone) before a large push updates nothing.
		var one [1]byte
		if n, _ := io.ReadFull(body, one[:]); n == 0 && buf.Len() == 4 {
			return &buf, nil
		}
		return nil, errors.New("a push without commands")
	}
	return io.MultiReader(&buf, body), nil
}

func isHex(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

func isHexID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// GitRoots returns the roots a Git host's certificate must chain to: the
// system's plus those in pemFile (none if empty).
func GitRoots(pemFile []byte) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if len(pemFile) > 0 && !pool.AppendCertsFromPEM(pemFile) {
		return nil, errors.New("no certificate in the Git CA file")
	}
	return pool, nil
}
