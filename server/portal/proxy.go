package portal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Dialer connects to a port on a sandbox's loopback (through its agent).
type Dialer interface {
	DialPort(ctx context.Context, containerID string, port int) (net.Conn, error)
}

// Options configure a Portal.
type Options struct {
	Dialer  Dialer
	Starter Starter
	Log     Log
	// FrameAncestors may embed portal pages besides the portal itself
	// (the API's origin, a product's).
	FrameAncestors []string
	// ServiceIdle stops a service nobody used for this long (0: never).
	ServiceIdle time.Duration
	// MaxConnsPerSession bounds the requests proxied into one session at
	// once (default DefaultMaxConnsPerSession).
	MaxConnsPerSession int
	Now                func() time.Time
}

// DefaultMaxConnsPerSession is the default bound of requests proxied into
// one session at once.
const DefaultMaxConnsPerSession = 256

// Portal proxies requests into sandboxes and runs their services.
type Portal struct {
	dialer    Dialer
	starter   Starter
	log       Log
	ancestors string
	idle      time.Duration
	now       func() time.Time
	maxConns  int
	transport *http.Transport
	proxy     *httputil.ReverseProxy

	ctx    context.Context // ends every supervisor
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	// running: session pk -> service name -> its supervisor.
	running map[string]map[string]*running
	// inFlight: session pk -> requests being proxied.
	inFlight map[string]int
}

// Errors of Serve (the caller's WriteError maps them).
var (
	// ErrStarting: the service is starting and did not answer in time.
	ErrStarting = errors.New("is starting")
	// ErrTooSmall: the sandbox has too little memory for the service.
	ErrTooSmall = errors.New("needs a larger sandbox")
	// ErrTooMany: the session (or the service) has as many requests in
	// flight as it may.
	ErrTooMany = errors.New("too many connections at once")
	// ErrUnreachable: nothing listens on the port inside the sandbox, or
	// what answered was not HTTP.
	ErrUnreachable = errors.New("no HTTP answer from that port in the sandbox")
)

// New returns a portal; Close stops it.
func New(o Options) *Portal {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxConnsPerSession <= 0 {
		o.MaxConnsPerSession = DefaultMaxConnsPerSession
	}
	p := &Portal{dialer: o.Dialer, starter: o.Starter, log: o.Log, idle: o.ServiceIdle, maxConns: o.MaxConnsPerSession,
		now: o.Now, running: map[string]map[string]*running{}, inFlight: map[string]int{}}
	p.ancestors = strings.Join(append([]string{"'self'"}, o.FrameAncestors...), " ")
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.transport = &http.Transport{
		DialContext:           p.dial,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       30 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Bodies pass as they are: no gzip added, none taken off.
		DisableCompression: true,
		// Fewer, larger reads and writes: each one into the sandbox is a
		// syscall that gVisor's sentry serves.
		ReadBufferSize:  256 << 10,
		WriteBufferSize: 256 << 10,
		// An upstream that never answers does not hold a request forever
		// (long polls answer well within this).
		ResponseHeaderTimeout:  5 * time.Minute,
		MaxResponseHeaderBytes: 1 << 20,
	}
	p.proxy = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.transport,
		FlushInterval:  -1, // streams (SSE, downloads) flow as they come
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.proxyError,
		BufferPool:     bufferPool{},
	}
	if p.idle > 0 {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.sweep()
		}()
	}
	return p
}

// Close stops every service and waits for the supervisors.
func (p *Portal) Close() {
	p.cancel()
	p.wg.Wait()
	p.transport.CloseIdleConnections()
}

// Call is one request to proxy, as the caller authorized it.
type Call struct {
	Sandbox Sandbox
	Target  Target
	// Base is the escaped external prefix of the session's routes: "" on
	// its portal origin, "/v1/sandbox/proxy/<id>" on the API's.
	Base string
	// Origin is the origin the client addressed ("http://host:port").
	Origin string
	// APIOrigin: served on the API's origin (to API clients), so the
	// response must not run there as a page.
	APIOrigin bool
	// Wait is how long to wait for a starting service before answering
	// ErrStarting (a browser gets a page that reloads itself instead).
	Wait time.Duration
	// Fail answers a request that cannot be proxied (ErrStarting,
	// ErrUnreachable) in the caller's error shape.
	Fail func(error)
}

type callKey struct{}

// Serve proxies r to the call's target.
func (p *Portal) Serve(w http.ResponseWriter, r *http.Request, c Call) {
	if c.Target.Redirect != "" {
		loc := c.Base + c.Target.Redirect
		if r.URL.RawQuery != "" && !strings.Contains(c.Target.Redirect, "?") {
			loc += "?" + r.URL.RawQuery
		}
		w.Header().Set("Location", loc)
		w.WriteHeader(http.StatusFound)
		return
	}
	if !p.admit(c.Sandbox.PK) {
		c.Fail(fmt.Errorf("%w: at most %d requests into one sandbox", ErrTooMany, p.maxConns))
		return
	}
	defer p.release(c.Sandbox.PK)
	if svc := c.Target.Service; svc != nil {
		if c.Sandbox.MemoryMiB < svc.MinMemoryMiB {
			c.Fail(fmt.Errorf("%s %w: it needs a size with at least %d MiB of memory, this sandbox has %d MiB",
				svc.Title, ErrTooSmall, svc.MinMemoryMiB, c.Sandbox.MemoryMiB))
			return
		}
		run := p.ensure(c.Sandbox, svc)
		run.mu.Lock()
		if svc.MaxConns > 0 && run.active >= svc.MaxConns {
			run.mu.Unlock()
			c.Fail(fmt.Errorf("%w: at most %d to %s", ErrTooMany, svc.MaxConns, svc.Title))
			return
		}
		run.lastUse = p.now()
		run.active++
		run.mu.Unlock()
		defer func() {
			run.mu.Lock()
			run.active--
			run.lastUse = p.now()
			run.mu.Unlock()
		}()
		if !p.waitReady(r.Context(), c.Sandbox, run, c.Wait) {
			if r.Context().Err() != nil {
				return
			}
			if Navigation(r) && !c.APIOrigin {
				p.startingPage(w, run)
				return
			}
			w.Header().Set("Retry-After", "1")
			c.Fail(fmt.Errorf("%s %w", svc.Title, ErrStarting))
			return
		}
	}
	p.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, &c)))
}

// admit counts a request into a session, if it has room.
func (p *Portal) admit(pk string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[pk] >= p.maxConns {
		return false
	}
	p.inFlight[pk]++
	return true
}

func (p *Portal) release(pk string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight[pk]--; p.inFlight[pk] <= 0 {
		delete(p.inFlight, pk)
	}
}

// waitReady reports whether the service accepts connections, probing
// until wait has passed.
func (p *Portal) waitReady(ctx context.Context, sb Sandbox, run *running, wait time.Duration) bool {
	run.mu.Lock()
	ready := run.ready
	run.mu.Unlock()
	if ready {
		return true
	}
	deadline := time.Now().Add(wait)
	for {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := p.dialer.DialPort(dctx, sb.ContainerID, run.svc.Port)
		cancel()
		if err == nil {
			conn.Close()
			run.mu.Lock()
			if run.up {
				run.ready = true
			}
			run.mu.Unlock()
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(150 * time.Millisecond):
		}
	}
}

// Navigation: a browser loading a page (rather than a script fetching).
func Navigation(r *http.Request) bool {
	if m := r.Header.Get("Sec-Fetch-Mode"); m != "" {
		return m == "navigate"
	}
	return r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html")
}

// dial reaches "containerID:port" (the outgoing URL's host) through the
// sandbox's agent.
func (p *Portal) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	cid, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return nil, err
	}
	return p.dialer.DialPort(ctx, cid, n)
}

func (p *Portal) rewrite(pr *httputil.ProxyRequest) {
	c := pr.In.Context().Value(callKey{}).(*Call)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = net.JoinHostPort(c.Sandbox.ContainerID, strconv.Itoa(c.Target.Port))
	out.URL.Path, _ = url.PathUnescape(c.Target.Path)
	out.URL.RawPath = c.Target.Path
	out.URL.RawQuery = pr.In.URL.RawQuery
	if c.APIOrigin && strings.Contains(out.URL.RawQuery, "ticket=") {
		// A browser's ticket is the portal's, never the sandbox's.
		q := out.URL.Query()
		for _, v := range q["ticket"] {
			if strings.HasPrefix(v, "tkt_") {
				q.Del("ticket")
				out.URL.RawQuery = q.Encode()
				break
			}
		}
	}
	// Keep the Host the client addressed: servers check WebSocket
	// Origins against it (code-server, Jupyter).
	out.Host = pr.In.Host
	pr.SetXForwarded()
	out.Header.Del("Authorization")
	StripCookie(out.Header)
	if svc := c.Target.Service; svc != nil {
		if svc.Host != "" {
			out.Host = svc.Host
		}
		if svc.NoOrigin {
			out.Header.Del("Origin")
		}
	}
}

func (p *Portal) modifyResponse(res *http.Response) error {
	c := res.Request.Context().Value(callKey{}).(*Call)
	h := res.Header
	// The sandbox may not replace or clear the portal's cookie, and its
	// cookies stay on its own origin: a Domain attribute would hand them to
	// every other session's portal under the same parent domain.
	if cs := h.Values("Set-Cookie"); len(cs) > 0 {
		h.Del("Set-Cookie")
		for _, v := range cs {
			ck, err := http.ParseSetCookie(v)
			if err != nil || ck.Name == CookieName {
				continue
			}
			ck.Domain = ""
			if line := ck.String(); line != "" {
				h.Add("Set-Cookie", line)
			}
		}
	}
	if loc := h.Get("Location"); strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//") {
		h.Set("Location", c.Base+c.Target.Mount+loc)
	}
	if c.APIOrigin {
		// Never a page on the API's origin.
		h.Set("Content-Security-Policy", "sandbox")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Del("Set-Cookie")
	} else {
		// No other origin (another session's portal included) may load
		// this as a resource or frame it, whatever the sandbox says.
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.Add("Content-Security-Policy", "frame-ancestors "+p.ancestors)
	}
	if c.Target.Service != nil && c.Target.Service.Host != "" && strings.HasPrefix(c.Target.Path, "/json") {
		return rewriteDevTools(res, c)
	}
	return nil
}

// DevTools answers the portal rewrites are small JSON lists of targets;
// anything larger is passed on as it is. The external prefix is bounded
// too (Host is at most maxHost bytes), so a sandbox cannot make the
// rewrite grow without bound.
const (
	maxDevToolsJSON = 1 << 20
	maxHost         = MaxHost
)

// MaxHost is the longest Host header the server accepts (a DNS name is at
// most 253 bytes, plus a port).
const MaxHost = 260

// rewriteDevTools points the WebSocket URLs of Chromium's /json answers at
// the portal instead of the sandbox's loopback.
func rewriteDevTools(res *http.Response, c *Call) error {
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Encoding") != "" || res.ContentLength > maxDevToolsJSON {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(res.Body, maxDevToolsJSON+1))
	res.Body.Close()
	if err != nil {
		return err
	}
	if len(b) > maxDevToolsJSON {
		return errors.New("devtools answer too large")
	}
	u, _ := url.Parse(c.Origin)
	ws := "ws://"
	if u != nil && u.Scheme == "https" {
		ws = "wss://"
	}
	host := strings.TrimPrefix(strings.TrimPrefix(c.Origin, "https://"), "http://")
	if len(host) > maxHost {
		return errors.New("host too long")
	}
	ext := host + c.Base + c.Target.Mount
	from := c.Target.Service.Host
	// Each replacement grows the body by at most len(ext); the count of
	// replacements is bounded by the (bounded) body.
	if n := bytes.Count(b, []byte(from)); len(b)+n*len(ext) > 4*maxDevToolsJSON {
		return errors.New("devtools answer would grow too large")
	}
	b = bytes.ReplaceAll(b, []byte("ws://"+from), []byte(ws+ext))
	b = bytes.ReplaceAll(b, []byte("ws="+from), []byte("ws="+ext))
	res.Body = io.NopCloser(bytes.NewReader(b))
	res.ContentLength = int64(len(b))
	res.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return nil
}

func (p *Portal) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away
	}
	c := r.Context().Value(callKey{}).(*Call)
	c.Fail(fmt.Errorf("%w: %v", ErrUnreachable, err))
}

// bufferPool lends the proxy 256 KiB copy buffers (its default is 32 KiB).
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

// sweep stops services nobody used for p.idle.
func (p *Portal) sweep() {
	t := time.NewTicker(min(p.idle/4, 30*time.Second))
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
		type victim struct{ pk, name string }
		var vs []victim
		now := p.now()
		p.mu.Lock()
		for pk, m := range p.running {
			for name, r := range m {
				r.mu.Lock()
				if r.active == 0 && now.Sub(r.lastUse) > p.idle {
					vs = append(vs, victim{pk, name})
				}
				r.mu.Unlock()
			}
		}
		p.mu.Unlock()
		for _, v := range vs {
			p.StopService(v.pk, v.name)
		}
	}
}
