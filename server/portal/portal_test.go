package portal

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
)

// fakeSandbox maps ports to real loopback listeners; services are real
// HTTP servers that a fake process starts and stops.
type fakeSandbox struct {
	mu      sync.Mutex
	ports   map[int]string // port -> host:port
	starts  map[string]int // launcher -> times started
	handler http.Handler
	delay   time.Duration // before a started service listens
	crash   bool          // started services exit at once
	procs   []*fakeProc
	envs    [][]string // the env of each start
}

func (f *fakeSandbox) DialPort(ctx context.Context, _ string, port int) (net.Conn, error) {
	f.mu.Lock()
	addr := f.ports[port]
	f.mu.Unlock()
	if addr == "" {
		return nil, errors.New("agent: connection refused")
	}
	return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
}

func (f *fakeSandbox) Start(_ context.Context, _ string, s agent.Spec) (runsc.Process, error) {
	f.mu.Lock()
	f.starts[s.Args[0]]++
	f.envs = append(f.envs, s.Env)
	crash, delay := f.crash, f.delay
	f.mu.Unlock()
	var svc *Service
	for _, v := range Services {
		if v.Command == s.Args[0] {
			svc = v
		}
	}
	p := &fakeProc{done: make(chan struct{})}
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	if crash {
		p.Close()
		return p, nil
	}
	go func() {
		select {
		case <-time.After(delay):
		case <-p.done:
			return
		}
		srv := httptest.NewServer(f.handler)
		f.mu.Lock()
		f.ports[svc.Port] = srv.Listener.Addr().String()
		f.mu.Unlock()
		<-p.done
		f.mu.Lock()
		delete(f.ports, svc.Port)
		f.mu.Unlock()
		srv.CloseClientConnections()
		srv.Close()
	}()
	return p, nil
}

type fakeProc struct {
	once sync.Once
	done chan struct{}
}

func (p *fakeProc) Stdin() io.WriteCloser       { return nil }
func (p *fakeProc) Stdout() io.Reader           { return strings.NewReader("listening\n") }
func (p *fakeProc) Stderr() io.Reader           { return strings.NewReader("") }
func (p *fakeProc) Resize(uint16, uint16) error { return nil }
func (p *fakeProc) Signal(string, bool) error   { return nil }
func (p *fakeProc) Wait() (agent.Exit, error)   { <-p.done; return agent.Exit{Code: 1}, nil }
func (p *fakeProc) Close() error                { p.once.Do(func() { close(p.done) }); return nil }

type logRec struct {
	mu    sync.Mutex
	kinds []string
	lines []string
}

func (l *logRec) Event(_, kind string, _ map[string]any) {
	l.mu.Lock()
	l.kinds = append(l.kinds, kind)
	l.mu.Unlock()
}

func (l *logRec) Service(_, name, line string) {
	l.mu.Lock()
	l.lines = append(l.lines, name+": "+line)
	l.mu.Unlock()
}

func newTestPortal(t *testing.T, f *fakeSandbox, idle time.Duration) (*Portal, *logRec) {
	lg := &logRec{}
	p := New(Options{Dialer: f, Starter: f, Log: lg, ServiceIdle: idle, FrameAncestors: []string{"https://app.example"}})
	t.Cleanup(p.Close)
	return p, lg
}

func serve(p *Portal, path string, hdr http.Header, wait time.Duration) (*httptest.ResponseRecorder, error) {
	var failed error
	esc, _, _ := strings.Cut(path, "?")
	t, err := Parse(esc)
	if err != nil {
		return nil, err
	}
	r := httptest.NewRequest("GET", "http://s1.localhost:8080"+path, nil)
	for k, v := range hdr {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	p.Serve(w, r, Call{Sandbox: Sandbox{PK: "pk1", ContainerID: "c1", MemoryMiB: 4096,
		Env: func(context.Context) ([]string, error) { return []string{"SECRET=s"}, nil }},
		Target: t, Origin: "http://s1.localhost:8080",
		Wait: wait, Fail: func(err error) { failed = err; w.WriteHeader(599) }})
	return w, failed
}

func TestServiceStartsOnDemandAndRestarts(t *testing.T) {
	f := &fakeSandbox{ports: map[int]string{}, starts: map[string]int{}, delay: 300 * time.Millisecond,
		handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Set-Cookie", CookieName+"=forged")
			w.Header().Add("Set-Cookie", "app=1; Domain=localhost; Path=/; HttpOnly")
			if r.URL.Path == "/go" {
				http.Redirect(w, r, "/elsewhere", http.StatusFound)
				return
			}
			io.WriteString(w, "editor at "+r.URL.Path+" host "+r.Host+" cookie "+r.Header.Get("Cookie"))
		})}
	p, lg := newTestPortal(t, f, 0)
	if len(p.Running("pk1")) != 0 {
		t.Fatal("a service runs before anyone asked")
	}
	// A person sees a page that says it is starting, not a 502.
	w, _ := serve(p, "/editor/", http.Header{"Sec-Fetch-Mode": {"navigate"}}, 0)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "Starting VS Code") ||
		!strings.Contains(w.Body.String(), `http-equiv="refresh"`) {
		t.Fatalf("starting page: %d %s", w.Code, w.Body)
	}
	// A program gets ErrStarting, or the answer if it waits long enough.
	if _, err := serve(p, "/editor/", nil, 0); !errors.Is(err, ErrStarting) {
		t.Fatalf("err = %v", err)
	}
	w, err := serve(p, "/editor/a/b?x=1", http.Header{"Cookie": {"app=1; " + CookieName + "=secret"}}, 5*time.Second)
	if err != nil || w.Code != 200 || w.Body.String() != "editor at /a/b host s1.localhost:8080 cookie app=1" {
		t.Fatalf("proxied: %v %d %q", err, w.Code, w.Body)
	}
	if cs := w.Result().Header.Values("Set-Cookie"); len(cs) != 1 || cs[0] != "app=1; Path=/; HttpOnly" {
		t.Errorf("Set-Cookie = %q", cs)
	}
	if csp := w.Header().Get("Content-Security-Policy"); csp != "frame-ancestors 'self' https://app.example" {
		t.Errorf("CSP = %q", csp)
	}
	w, _ = serve(p, "/editor/go", nil, time.Second)
	if loc := w.Header().Get("Location"); loc != "/editor/elsewhere" {
		t.Errorf("Location = %q", loc)
	}
	if got := p.Running("pk1"); len(got) != 1 || got[0] != "editor" {
		t.Errorf("running = %v", got)
	}
	f.mu.Lock()
	if len(f.envs) != 1 || len(f.envs[0]) != 1 || f.envs[0][0] != "SECRET=s" {
		t.Errorf("env of the start: %v (read once, when the service starts)", f.envs)
	}
	f.mu.Unlock()
	// It crashes: the supervisor starts it again.
	f.mu.Lock()
	f.crash = false
	f.mu.Unlock()
	p.mu.Lock()
	run := p.running["pk1"]["editor"]
	p.mu.Unlock()
	killCurrent(t, f, run)
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		n := f.starts[Services["editor"].Command]
		f.mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not restarted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if w, err := serve(p, "/editor/", nil, 5*time.Second); err != nil || w.Code != 200 {
		t.Errorf("after restart: %v %d", err, w.Code)
	}
	p.StopSession("pk1")
	if len(p.Running("pk1")) != 0 {
		t.Error("still running after StopSession")
	}
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if !strings.Contains(strings.Join(lg.kinds, ","), "service_start,service_exit,service_start") ||
		!strings.Contains(strings.Join(lg.lines, "\n"), "editor: listening") {
		t.Errorf("log: %v %v", lg.kinds, lg.lines)
	}
}

// killCurrent ends the newest service process, as a crash would.
func killCurrent(t *testing.T, f *fakeSandbox, _ *running) {
	t.Helper()
	f.mu.Lock()
	p := f.procs[len(f.procs)-1]
	f.mu.Unlock()
	p.Close()
}

func TestServiceTooBigForTheSandbox(t *testing.T) {
	f := &fakeSandbox{ports: map[int]string{}, starts: map[string]int{}}
	p, _ := newTestPortal(t, f, 0)
	tg, _ := Parse("/editor/")
	var failed error
	p.Serve(httptest.NewRecorder(), httptest.NewRequest("GET", "/editor/", nil), Call{
		Sandbox: Sandbox{PK: "pk1", ContainerID: "c1", MemoryMiB: 1024}, Target: tg,
		Fail: func(err error) { failed = err }})
	if !errors.Is(failed, ErrTooSmall) || !strings.Contains(failed.Error(), "2048 MiB") || len(p.Running("pk1")) != 0 {
		t.Errorf("err = %v, running %v", failed, p.Running("pk1"))
	}
}

func TestCrashingServiceIsRestarted(t *testing.T) {
	f := &fakeSandbox{ports: map[int]string{}, starts: map[string]int{}, crash: true}
	p, lg := newTestPortal(t, f, 0)
	w, _ := serve(p, "/notebook/", http.Header{"Accept": {"text/html"}}, 0)
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		n := f.starts[Services["notebook"].Command]
		f.mu.Unlock()
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("started %d times", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The page says so.
	w, _ = serve(p, "/notebook/", http.Header{"Accept": {"text/html"}}, 0)
	if !strings.Contains(w.Body.String(), "restarted") {
		t.Errorf("page: %s", w.Body)
	}
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if !strings.Contains(strings.Join(lg.kinds, ","), "service_exit") {
		t.Errorf("events: %v", lg.kinds)
	}
}

func TestIdleServiceStops(t *testing.T) {
	f := &fakeSandbox{ports: map[int]string{}, starts: map[string]int{},
		handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
	p, _ := newTestPortal(t, f, 200*time.Millisecond)
	if _, err := serve(p, "/display/websockify", nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(p.Running("pk1")) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("idle service not stopped")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestDevToolsURLsPointAtThePortal(t *testing.T) {
	f := &fakeSandbox{ports: map[int]string{}, starts: map[string]int{},
		handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Host != "127.0.0.1:13340" || r.Header.Get("Origin") != "" {
				http.Error(w, "Host header is specified and is not an IP address or localhost.", 500)
				return
			}
			io.WriteString(w, `{"webSocketDebuggerUrl": "ws://127.0.0.1:13340/devtools/browser/abc",
"devtoolsFrontendUrl": "/devtools/inspector.html?ws=127.0.0.1:13340/devtools/page/X"}`)
		})}
	p, _ := newTestPortal(t, f, 0)
	w, err := serve(p, "/browser/json/version", http.Header{"Origin": {"http://s1.localhost:8080"}}, 5*time.Second)
	if err != nil || w.Code != 200 {
		t.Fatalf("%v %d %s", err, w.Code, w.Body)
	}
	b := w.Body.String()
	if !strings.Contains(b, `"ws://s1.localhost:8080/browser/devtools/browser/abc"`) ||
		!strings.Contains(b, "ws=s1.localhost:8080/browser/devtools/page/X") || strings.Contains(b, "13340") {
		t.Errorf("body: %s", b)
	}
}

func TestDevToolsRewriteIsBounded(t *testing.T) {
	// A sandbox answering /json with the pattern over and over, and a
	// long Host: the answer is passed on or refused, never multiplied.
	body := strings.Repeat(`"ws://127.0.0.1:13340/x"`+"\n", (1<<20)/25)
	f := &fakeSandbox{ports: map[int]string{}, starts: map[string]int{},
		handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) })}
	p, _ := newTestPortal(t, f, 0)
	tg, _ := Parse("/browser/json/version")
	for _, host := range []string{strings.Repeat("a", 250), strings.Repeat("a", 5000)} {
		w := httptest.NewRecorder()
		var failed error
		p.Serve(w, httptest.NewRequest("GET", "/browser/json/version", nil), Call{
			Sandbox: Sandbox{PK: "pk1", ContainerID: "c1", MemoryMiB: 4096}, Target: tg, Origin: "http://" + host,
			Wait: 5 * time.Second, Fail: func(err error) { failed = err; w.WriteHeader(599) }})
		if w.Body.Len() > 4<<20 {
			t.Errorf("host of %d: answer of %d bytes", len(host), w.Body.Len())
		}
		t.Logf("host of %d: %d, %d bytes, %v", len(host), w.Code, w.Body.Len(), failed)
	}
}

func TestSessionConnectionCap(t *testing.T) {
	release := make(chan struct{})
	f := &fakeSandbox{ports: map[int]string{}, starts: map[string]int{},
		handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/notebook/x" {
				<-release
			}
		})}
	lg := &logRec{}
	p := New(Options{Dialer: f, Starter: f, Log: lg, MaxConnsPerSession: 2})
	defer p.Close()
	// Two slow requests hold the session's two places.
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(p, "/notebook/x", nil, 5*time.Second)
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := p.inFlight["pk1"]
		p.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("in flight: %d", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := serve(p, "/notebook/y", nil, time.Second); !errors.Is(err, ErrTooMany) {
		t.Errorf("third request: %v", err)
	}
	release <- struct{}{}
	release <- struct{}{}
	wg.Wait()
	if _, err := serve(p, "/notebook/z", nil, 0); errors.Is(err, ErrTooMany) {
		t.Error("places not given back")
	}
}
