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

// Serve serves one session on l; see ServeWithPolicy.
func (p *Proxy) Serve(l net.Listener, key string, o SessionOptions) error {
	return p.serve(l, key, o)
}

// gitTarget says whether a CONNECT to host:port is the session's paired
// Git host, whose TLS the proxy terminates.
func (p *Proxy) gitTarget(s *session, rawHost string, port int) bool {
	g := s.git
	if g == nil || p.ca == nil || port != g.Port {
		return false
	}
	host, ip, err := normalizeHost(rawHost)
	return err == nil && !ip.IsValid() && host == g.Host
}

// authority is the Host header and URL authority of the Git host.
func (g *GitPairing) authority() string {
	if g.Port == 443 {
		return g.Host
	}
	return net.JoinHostPort(g.Host, strconv.Itoa(g.Port))
}

// endpoint classifies an escaped request path: the repository's
// smart-HTTP endpoints get the credential; everything else passes without.
func (g *GitPairing) endpoint(path string) (paired, receivePack bool) {
	rest, ok := cutPrefixFold(path, g.Prefix+"/"+g.Repo)
	if !ok {
		return false, false
	}
	rest, _ = cutPrefixFold(rest, ".git")
	switch rest {
	case "/info/refs", "/git-upload-pack":
		return true, false
	case "/git-receive-pack":
		return true, true
	}
	return false, false
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
// guarded dialer (tracked, so Close and the quota cut reach it), TLS
// verified against the configured roots, HTTP/1.1.
func (p *Proxy) gitTransport(s *session) *http.Transport {
	g := s.git
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := s.dial.dial(ctx, g.Host, netip.Addr{}, g.Port)
			if err != nil {
				return nil, err
			}
			tc := &trackedConn{Conn: c, s: s}
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
		IdleConnTimeout:        s.pol.idleTimeout(),
		TLSHandshakeTimeout:    s.pol.headerTimeout(),
		ResponseHeaderTimeout:  5 * time.Minute, // a big repository's pack takes a while to start
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
	}
}

// prefixConn reads the bytes that came behind the CONNECT head first.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// gitTunnel serves a CONNECT to the paired Git host: it answers the
// CONNECT, terminates the sandbox's TLS with a certificate of the CA, and
// relays each HTTP/1.1 request to the host on its own TLS connection,
// adding the credential to the repository's endpoints. It runs on the
// connection's goroutine and returns when the client is done.
func (p *Proxy) gitTunnel(c *sessConn, src io.Reader, s *session) {
	g := s.git
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
	conn := tls.Server(&prefixConn{Conn: c, r: src}, &tls.Config{
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
	_ = c.SetDeadline(time.Now().Add(s.pol.headerTimeout()))
	if err := conn.Handshake(); err != nil {
		s.deny(host, port, ReasonBadHello)
		return
	}
	tr := p.gitTransport(s)
	defer tr.CloseIdleConnections()
	br := bufio.NewReader(conn)
	for {
		_ = c.SetDeadline(time.Now().Add(s.pol.idleTimeout()))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_ = c.SetDeadline(time.Time{})
		keep := p.gitRequest(conn, req, s, tr)
		_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, 64<<10))
		req.Body.Close()
		if !keep || req.Close {
			return
		}
	}
}

// hopHeaders are connection-level and never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// gitRequest relays one request from the sandbox to the Git host and its
// answer back; false when the connection must end.
func (p *Proxy) gitRequest(w io.Writer, req *http.Request, s *session, tr *http.Transport) bool {
	g := s.git
	refuse := func(status int, reason, msg string) bool {
		if reason != "" {
			s.deny(g.Host, g.Port, reason)
		}
		writeText(w, status, msg)
		return false
	}
	if !strings.EqualFold(req.Host, g.authority()) {
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
	paired, push := g.endpoint(out.URL.EscapedPath())
	if paired {
		out.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(g.User+":"+g.Token)))
		if push && req.Method == http.MethodPost {
			if ce := req.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
				return refuse(http.StatusUnsupportedMediaType, ReasonGitPush, "sandboxd: a push to the paired repository must not be compressed\n")
			}
			body, err := checkPush(req.Body, "refs/heads/"+g.Branch)
			if err != nil {
				return refuse(http.StatusForbidden, ReasonGitPush, fmt.Sprintf("sandboxd: %v; a push here may only update refs/heads/%s of %s\n", err, g.Branch, g.Repo))
			}
			out.Body = io.NopCloser(body)
		}
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

// checkPush reads a receive-pack request's ref-update commands (pkt-lines
// up to the first flush) and refuses any that is not an update or creation
// of ref. It returns a reader of the whole body (what it read, then the
// rest).
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
		if err != nil {
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
		cmd, _, _ := bytes.Cut(bytes.TrimSuffix(line, []byte("\n")), []byte{0})
		if bytes.HasPrefix(cmd, []byte("shallow ")) {
			continue
		}
		f := strings.Fields(string(cmd))
		if len(f) != 3 || !isHexID(f[0]) || !isHexID(f[1]) {
			return nil, errors.New("a push with an unexpected command")
		}
		if f[2] != ref {
			return nil, fmt.Errorf("refused to update %q", f[2])
		}
		if strings.Trim(f[1], "0") == "" {
			return nil, fmt.Errorf("refused to delete %q", f[2])
		}
		commands++
	}
	if commands == 0 {
		return nil, errors.New("a push without commands")
	}
	return io.MultiReader(&buf, body), nil
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
