package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/elazarl/goproxy"
	"github.com/prometheus/client_golang/prometheus"
)

// Events receives what the proxy refuses. Methods are called synchronously
// from connection goroutines (the quota cut has already happened when
// QuotaExceeded is called); they may block briefly but must not call
// Shutdown.
type Events interface {
	// Denied: a request or tunnel to host:port was refused. host is the
	// normalized host, or the cleaned raw one when it did not normalize;
	// port is 0 when unknown. reason is one of the Reason constants.
	Denied(key, host string, port int, reason string)
	// QuotaExceeded: the session's byte count reached limit (once per
	// Serve call). used is the count at that moment, in bytes.
	QuotaExceeded(key string, used, limit int64)
}

// Options configure a Proxy. Every field may be zero.
type Options struct {
	Events     Events                // nil: none
	Registerer prometheus.Registerer // nil: metrics are kept but not registered
	Logger     *slog.Logger          // nil: discard
	Resolver   Resolver              // nil: net.DefaultResolver (tests inject names -> loopback)
	// DialTimeout overrides the policy's DialTimeout when > 0.
	DialTimeout time.Duration
	// MaxConnsPerSession bounds a session's open client connections
	// (default 256); MaxConns bounds them over all sessions (default:
	// FDShare, each proxied connection holding two descriptors, so a
	// sandbox opening connections in a loop cannot starve the server of
	// file descriptors). Connections past a
	// limit are closed at once and reported as denied (too_many_connections).
	MaxConnsPerSession int
	MaxConns           int
	// OnUsage, if set, is called each time a session's count passes another
	// usageStep (a 64th of its limit, 1 to 64 MiB), so the caller can save
	// it between periodic saves: a crash then forgets at most about one
	// step. It is called from the data path and must not block.
	OnUsage func(key string, used int64)
	// CA signs the certificates of the Git host whose TLS the proxy
	// terminates for paired sessions (SessionOptions.Git); nil: sessions
	// are never paired. GitRoots verify that host (nil: system roots).
	CA       *CA
	GitRoots *x509.CertPool
}

const defaultMaxConnsPerSession = 256

// FDShare is a quarter of RLIMIT_NOFILE's soft limit (64 if unknown or
// tiny): the proxy's default budget for all sessions' connections (each
// holds two descriptors: half the limit), and the server's for its API
// connections (a quarter), leaving a quarter for SQLite and sandboxes.
func FDShare() int64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur < 192 {
		return 64
	}
	return int64(rl.Cur / 4)
}

// ConnLimits splits the proxy's connection budget (FDShare) among up to sessions sessions, so that every session at its own
// cap still fits: no session, nor any group of them, can use up the
// connections another session is due. perSession is at most 256; it is
// never set under 16, and fits is false when the budget is too small for
// that (raise the open-file limit, or lower the number of sandboxes).
func ConnLimits(sessions int) (perSession, total int, fits bool) {
	total = int(FDShare())
	perSession = min(defaultMaxConnsPerSession, total/max(sessions, 1))
	if perSession < 16 {
		return 16, total, false
	}
	return perSession, total, true
}

// ErrClosed is returned by Serve after Shutdown.
var ErrClosed = errors.New("egress: proxy shut down")

// maxDone bounds how many ended sessions keep answering Usage and
// Destinations.
const maxDone = 256

// Proxy is the forward proxy of every session. See the package doc for
// what it decides and its concurrency contract.
type Proxy struct {
	pol         *Policy
	events      Events
	log         *slog.Logger
	met         *metrics
	resolver    Resolver
	dialTimeout time.Duration
	gp          *goproxy.ProxyHttpServer
	maxPerSess  int
	maxConns    int64
	onUsage     func(string, int64)
	ca          *CA
	gitRoots    *x509.CertPool
	clients     atomic.Int64 // open client connections, all sessions

	mu        sync.Mutex
	shut      bool
	sessions  map[string]*session
	done      map[string]*session // ended sessions, newest maxDone
	doneOrder []string
	track     tracker
}

type noEvents struct{}

func (noEvents) Denied(string, string, int, string) {}
func (noEvents) QuotaExceeded(string, int64, int64) {}

type connKey struct{}

// New makes a proxy deciding with pol (nil: nothing is allowed).
func New(pol *Policy, opts Options) *Proxy {
	if pol == nil {
		pol, _ = NewPolicy(&Config{})
	}
	p := &Proxy{
		pol:         pol,
		events:      opts.Events,
		log:         opts.Logger,
		met:         newMetrics(opts.Registerer),
		resolver:    opts.Resolver,
		dialTimeout: opts.DialTimeout,
		sessions:    map[string]*session{},
		done:        map[string]*session{},
		maxPerSess:  opts.MaxConnsPerSession,
		maxConns:    int64(opts.MaxConns),
		onUsage:     opts.OnUsage,
		ca:          opts.CA,
		gitRoots:    opts.GitRoots,
	}
	if p.maxPerSess <= 0 {
		p.maxPerSess = defaultMaxConnsPerSession
	}
	if p.maxConns <= 0 {
		p.maxConns = FDShare()
	}
	if p.events == nil {
		p.events = noEvents{}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	p.gp = p.newGoproxy()
	return p
}

// newGoproxy sets goproxy up for plain HTTP only. CONNECT never reaches it
// (serveHTTP handles tunnels: goproxy's hijack action drops bytes the
// client sent right after the CONNECT head, and its accept action cannot
// inspect the ClientHello). Its defaults are replaced: the transport that
// skips TLS verification and follows HTTP(S)_PROXY is swapped for one
// that refuses to dial, the env-derived CONNECT dialer is removed, and
// every request gets the session's guarded transport in onRequest.
func (p *Proxy) newGoproxy() *goproxy.ProxyHttpServer {
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = discardLogger{} // goproxy logs URLs, which may carry tokens
	gp.Verbose = false
	refuse := func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("egress: no session transport")
	}
	gp.Tr = &http.Transport{Proxy: nil, DialContext: refuse, DialTLSContext: refuse}
	gp.ConnectDial = nil
	gp.ConnectDialWithReq = func(*http.Request, string, string) (net.Conn, error) {
		return nil, errors.New("egress: CONNECT is not handled by goproxy")
	}
	gp.OnRequest().HandleConnect(goproxy.AlwaysReject)
	gp.KeepAcceptEncoding = true // pass the client's encoding through untouched
	gp.AllowHTTP2 = false
	gp.NonproxyHandler = http.HandlerFunc(p.nonProxy)
	gp.OnRequest().DoFunc(p.onRequest)
	return gp
}

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}

// ServeWithPolicy serves one session on l (which may live in another
// network namespace) until Close(key), Shutdown or l fails, and
// closes l. used is the session's byte count so far (after a restart),
// limit its quota in bytes; used >= limit (so any limit <= 0) allows no
// traffic. pol (nil: the proxy's) is the session's policy, e.g. from
// Policy.Narrow. It returns nil when closed, ErrClosed after Shutdown, an
// error for a session id already being served, or the listener's error.
func (p *Proxy) ServeWithPolicy(l net.Listener, key string, pol *Policy, used, limit int64) error {
	return p.serve(l, key, SessionOptions{Policy: pol, Used: used, Limit: limit})
}

func (p *Proxy) serve(l net.Listener, key string, o SessionOptions) error {
	s, err := p.register(l, key, o)
	if err != nil {
		return err
	}
	return p.run(s, l)
}

// Start registers the session at once (Close, Usage and UpdateGit know it
// when Start returns) and serves l on a goroutine the proxy owns, which
// ends with Close(key), Shutdown or a listener failure (logged).
func (p *Proxy) Start(l net.Listener, key string, o SessionOptions) error {
	s, err := p.register(l, key, o)
	if err != nil {
		return err
	}
	go func() {
		if err := p.run(s, l); err != nil {
			p.log.Warn("egress session ended", "session", key, "err", err)
		}
	}()
	return nil
}

// register makes the session and enters it in the proxy's table (and its
// tracker: run must follow, which exits it). On error l is closed.
func (p *Proxy) register(l net.Listener, key string, o SessionOptions) (*session, error) {
	pol, used, limit := o.Policy, o.Used, o.Limit
	if pol == nil {
		pol = p.pol
	}
	s := newSession(p, key, pol, used, limit)
	s.git.Store(o.Git)
	dt := pol.dialTimeout()
	if p.dialTimeout > 0 {
		dt = p.dialTimeout
	}
	s.dial = &dialer{resolver: p.resolver, guard: guard{allowNet: pol.allowNet}, timeout: dt}
	s.tr = newTransport(s)
	s.srv = &http.Server{
		Handler:                      http.HandlerFunc(p.serveHTTP),
		ReadHeaderTimeout:            pol.headerTimeout(),
		IdleTimeout:                  pol.idleTimeout(),
		MaxHeaderBytes:               64 << 10,
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if sc, ok := c.(*sessConn); ok && st == http.StateHijacked {
				sc.hijacked.Store(true)
			}
		},
	}

	p.mu.Lock()
	switch {
	case p.shut || !p.track.enter():
		p.mu.Unlock()
		_ = l.Close()
		return nil, ErrClosed
	case p.sessions[key] != nil:
		p.mu.Unlock()
		p.track.exit()
		_ = l.Close()
		return nil, fmt.Errorf("egress: session %s is already being served", key)
	}
	p.sessions[key] = s
	p.mu.Unlock()
	p.log.Debug("egress session serving", "session", key, "used", used, "limit", limit)
	return s, nil
}

// run serves a registered session until it is closed.
func (p *Proxy) run(s *session, l net.Listener) error {
	defer p.track.exit()
	key := s.id
	err := s.srv.Serve(&sessListener{Listener: l, s: s})
	_ = l.Close() // Close may have won before Serve tracked l
	p.closeSession(s)
	p.retire(s)
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("egress: serve session %s: %w", key, err)
}

// closeSession stops accepting and cuts every connection; idempotent.
func (p *Proxy) closeSession(s *session) {
	s.cut(true)
	_ = s.srv.Close() // listener and connections not hijacked
	s.tr.CloseIdleConnections()
}

func (p *Proxy) retire(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sessions[s.id] == s {
		delete(p.sessions, s.id)
	}
	if _, ok := p.done[s.id]; !ok {
		p.doneOrder = append(p.doneOrder, s.id)
	}
	p.done[s.id] = s
	for len(p.doneOrder) > maxDone {
		delete(p.done, p.doneOrder[0])
		p.doneOrder = p.doneOrder[1:]
	}
}

// Close closes the session's listener and cuts its open connections and
// tunnels; its Serve then returns (Close does not wait for that). The id
// may be served again at once. Unknown ids are ignored.
func (p *Proxy) Close(key string) {
	p.mu.Lock()
	s := p.sessions[key]
	p.mu.Unlock()
	if s != nil {
		p.closeSession(s)
		p.retire(s)
	}
}

// Shutdown closes every session and waits until every Serve call and
// connection handler has returned. Later Serve calls return ErrClosed.
func (p *Proxy) Shutdown() {
	p.mu.Lock()
	p.shut = true
	all := make([]*session, 0, len(p.sessions))
	for _, s := range p.sessions {
		all = append(all, s)
	}
	p.mu.Unlock()
	for _, s := range all {
		p.closeSession(s)
	}
	p.track.closeAndWait()
}

func (p *Proxy) lookup(key string) *session {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.sessions[key]; s != nil {
		return s
	}
	return p.done[key]
}

// Usage returns the session's bytes used (both directions, including the
// used it started with) and its limit. Ended sessions keep answering for
// a while (the last 256); ok is false for unknown ids.
func (p *Proxy) Usage(key string) (used, limit int64, ok bool) {
	s := p.lookup(key)
	if s == nil {
		return 0, 0, false
	}
	return s.usedBytes(), s.limit, true
}

// Destinations returns a copy of the session's per-host counters (keyed by
// normalized host; nil for unknown ids). Bytes here are attributed per
// request or tunnel; Usage is the authoritative total.
func (p *Proxy) Destinations(key string) map[string]Dest {
	s := p.lookup(key)
	if s == nil {
		return nil
	}
	return s.destinations()
}

func (s *session) deny(host string, port int, reason string) {
	p := s.p
	p.met.denied.WithLabelValues(reason).Inc()
	p.log.Debug("egress denied", "session", s.id, "host", host, "port", port, "reason", reason)
	p.events.Denied(s.id, host, port, reason)
}

// serveHTTP is every request's entry: quota first, then CONNECT here and
// plain HTTP through goproxy.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	c, _ := r.Context().Value(connKey{}).(*sessConn)
	if c == nil || !p.track.enter() {
		http.Error(w, "egress: shutting down", http.StatusServiceUnavailable)
		return
	}
	defer p.track.exit()
	s := c.s
	if c.refusing || s.exceeded.Load() {
		p.refuseQuota(w, r, c)
		return
	}
	if r.Method == http.MethodConnect {
		p.connect(w, r, c)
		return
	}
	p.gp.ServeHTTP(w, r)
	if c.hijacked.Load() { // an upgrade (WebSocket) ended: the conn is ours to close
		_ = c.Close()
		return
	}
	_ = http.NewResponseController(w).Flush() // the response's last bytes still count for this host
	c.detach()
}

// refuseQuota answers 403 naming the quota, outside the quota, and closes.
func (p *Proxy) refuseQuota(w http.ResponseWriter, r *http.Request, c *sessConn) {
	s := c.s
	target, def := r.URL.Host, 80
	if r.Method == http.MethodConnect {
		target, def = r.RequestURI, 443
	}
	host, port, err := splitHostPort(target, def)
	if err != nil {
		host, port = target, 0
	}
	s.deny(shownHost(host), port, ReasonQuota)
	body := fmt.Sprintf("egress quota exceeded: this session has used %d of its %d bytes of network traffic; new connections are refused\n",
		s.usedBytes(), s.limit)
	if _, _, err := http.NewResponseController(w).Hijack(); err != nil {
		return
	}
	p.refuseRaw(c, http.StatusForbidden, "Egress quota exceeded", ReasonQuota, body)
}

// refuseRaw writes a complete response on a hijacked connection, outside
// quota and counting, and closes it gracefully (so the client reads the
// response rather than a reset). reason "" is not a denial.
func (p *Proxy) refuseRaw(c *sessConn, status int, statusText, reason, body string) {
	head := "HTTP/1.1 " + strconv.Itoa(status) + " " + statusText + "\r\n" +
		"Content-Type: text/plain; charset=utf-8\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n"
	if reason != "" {
		head += "X-Egress-Denied: " + reason + "\r\n"
	}
	head += "Connection: close\r\n\r\n"
	_ = c.Conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	c.rawWrite([]byte(head + body))
	closeWrite(c.Conn)
	_ = c.Conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, _ = io.CopyN(io.Discard, c.Conn, 64<<10)
	_ = c.Close()
}

// denyText is the human explanation of a refusal, for response bodies.
func denyText(reason, host string, port int) string {
	hp := strconv.Quote(host)
	if port > 0 {
		hp = strconv.Quote(net.JoinHostPort(host, strconv.Itoa(port)))
	}
	var why string
	switch reason {
	case ReasonInvalidHost:
		why = hp + " is not a valid host name or IP address"
	case ReasonInvalidPort:
		why = "the port is missing or invalid"
	case ReasonNotAllowlisted:
		why = hp + " is not in this sandbox's egress allowlist"
	case ReasonPortNotAllowed:
		why = "this port is not allowed for " + strconv.Quote(host)
	case ReasonIPLiteral:
		why = hp + " is an IP address; only allowlisted names may be reached"
	case ReasonForbiddenAddress:
		why = strconv.Quote(host) + " resolves to a private, loopback or otherwise reserved address"
	case ReasonScheme:
		why = "only http:// URLs are proxied as requests; use CONNECT for https"
	default:
		why = reason
	}
	return "egress denied (" + reason + "): " + why + "\n"
}

// ---- plain HTTP (goproxy) ----

// onRequest decides every plain request and gives the allowed ones the
// session's guarded transport.
func (p *Proxy) onRequest(r *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	c, _ := r.Context().Value(connKey{}).(*sessConn)
	if c == nil {
		return r, goproxy.NewResponse(r, "text/plain", http.StatusInternalServerError, "")
	}
	s := c.s
	if r.URL.Scheme != "http" {
		h := cleanHost(r.URL.Host)
		s.deny(h, 0, ReasonScheme)
		return r, denyResponse(r, ReasonScheme, denyText(ReasonScheme, h, 0))
	}
	if bodiless(r.Method) && (r.ContentLength != 0 || len(r.TransferEncoding) > 0) {
		// An upstream that never reads such a body would take it for the
		// next request: one the proxy never decided.
		h := cleanHost(r.URL.Host)
		s.deny(h, 0, ReasonHTTPFraming)
		return r, denyResponse(r, ReasonHTTPFraming, "egress denied (ambiguous_http_framing): a "+r.Method+" request may not carry a body\n")
	}
	rawHost, port, err := splitHostPort(r.URL.Host, 80)
	if err != nil {
		reason := ReasonInvalidHost
		if errors.Is(err, errInvalidPort) {
			reason = ReasonInvalidPort
		}
		h := cleanHost(r.URL.Host)
		s.deny(h, 0, reason)
		return r, denyResponse(r, reason, denyText(reason, h, 0))
	}
	host, _, reason := s.pol.decide(rawHost, port)
	if reason != "" {
		if host == "" {
			host = shownHost(rawHost)
		}
		s.deny(host, port, reason)
		return r, denyResponse(r, reason, denyText(reason, host, port))
	}
	// Forward exactly what was decided: the normalized authority.
	auth := authority(host, port, 80)
	r.URL.Host, r.Host = auth, auth
	ctx.RoundTripper = goproxy.RoundTripperFunc(func(req *http.Request, _ *goproxy.ProxyCtx) (*http.Response, error) {
		resp, err := s.tr.RoundTrip(req)
		if err == nil {
			// Recorded once the destination answered: a refused or failed
			// dial leaves no per-host entry (its bytes stay in Usage).
			d := s.dest(host)
			c.attach(d)
			d.conns.Add(1)
			p.met.allowed.Inc()
			return resp, nil
		}
		var de *denyError
		if errors.As(err, &de) {
			s.deny(host, port, de.reason)
			return denyResponse(req, de.reason, denyText(de.reason, host, port)), nil
		}
		msg := "egress: upstream " + strconv.Quote(hostPort(host, port)) + ": " + upstreamError(err) + "\n"
		return goproxy.NewResponse(req, "text/plain; charset=utf-8", http.StatusBadGateway, msg), nil
	})
	return r, nil
}

func denyResponse(r *http.Request, reason, body string) *http.Response {
	resp := goproxy.NewResponse(r, "text/plain; charset=utf-8", http.StatusForbidden, body)
	resp.Header.Set("X-Egress-Denied", reason)
	return resp
}

// nonProxy answers origin-form requests ("GET / HTTP/1.1" to the proxy
// itself): this is only a forward proxy.
func (p *Proxy) nonProxy(w http.ResponseWriter, r *http.Request) {
	if c, _ := r.Context().Value(connKey{}).(*sessConn); c != nil {
		c.s.deny(cleanHost(r.Host), 0, ReasonNotProxyRequest)
	}
	w.Header().Set("X-Egress-Denied", ReasonNotProxyRequest)
	http.Error(w, "egress: this is a forward proxy; send absolute-form requests (http://host/path) or CONNECT", http.StatusBadRequest)
}

// newTransport is the session's own upstream transport for plain HTTP:
// guarded dialing, no proxy from the environment, no HTTPS (clients use
// CONNECT; the proxy never terminates TLS), no transparent decompression,
// connections not shared with other sessions.
func newTransport(s *session) *http.Transport {
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			h, port, err := splitHostPort(addr, 80)
			if err != nil {
				return nil, err
			}
			host, ip, err := normalizeHost(h)
			if err != nil {
				return nil, err
			}
			c, err := s.dial.dial(ctx, host, ip, port)
			if err != nil {
				return nil, err
			}
			tc := &trackedConn{Conn: c, s: s}
			if !s.track(tc) {
				return nil, net.ErrClosed
			}
			return tc, nil
		},
		DialTLSContext: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("egress: https is tunneled with CONNECT, never terminated")
		},
		TLSClientConfig:    &tls.Config{MinVersion: tls.VersionTLS12}, // unused: no TLS dialing
		TLSNextProto:       map[string]func(string, *tls.Conn) http.RoundTripper{},
		DisableCompression: true,
		// Idle upstream connections are not client connections: bound them
		// per session, or wildcard hosts would let one sandbox hold many.
		MaxIdleConns:           8,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        s.pol.idleTimeout(),
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 1 << 20,
	}
}
