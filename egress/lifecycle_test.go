package egress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// resetHandler sends part of a response, then resets the connection.
var resetHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
	_, _ = conn.Write(make([]byte, 50000))
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // RST, not FIN
	}
	conn.Close()
})

func TestUpstreamReset(t *testing.T) {
	plain := newHTTPUpstream(t, nil, resetHandler)
	secure := newTLSUpstream(t, nil, resetHandler)
	good := newHTTPUpstream(t, nil, helloHandler)
	pp, tp, gp := portOf(t, plain.URL), portOf(t, secure.URL), portOf(t, good.URL)
	e := newEnv(t, testConfig(pp, tp, gp))
	c := client(e.serve("s1", 0, 1<<30))
	for _, u := range []string{fmt.Sprintf("http://allowed.test:%d/", pp), fmt.Sprintf("https://allowed.test:%d/", tp)} {
		for i := 0; i < 3; i++ {
			resp, err := c.Get(u)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err == nil {
				t.Errorf("%s: reset response read without error", u)
			}
		}
	}
	if code, body, _ := get(t, c, fmt.Sprintf("http://allowed.test:%d/ok", gp)); code != 200 || !strings.Contains(body, "path=/ok") {
		t.Errorf("after resets: %d %q", code, body)
	}
}

// stable waits for f to fall to at most want.
func stable(f func() int, want int) int {
	deadline := time.Now().Add(10 * time.Second)
	n := f()
	for n > want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		runtime.GC()
		n = f()
	}
	return n
}

// TestManyTunnelsNoLeak: goroutines and file descriptors return to their
// baseline after thousands of tunnels.
func TestManyTunnelsNoLeak(t *testing.T) {
	echo := echoServer(t)
	ep := portOf(t, echo.Addr().String())
	e := newEnv(t, testConfig(ep))
	addr := e.serve("s1", 0, 1<<40)
	target := fmt.Sprintf("allowed.test:%d", ep)
	tunnel := func() error {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"); err != nil {
			return err
		}
		reply := make([]byte, len(connectOK))
		if _, err := io.ReadFull(conn, reply); err != nil || !bytes.Equal(reply, connectOK) {
			return fmt.Errorf("reply %q %v", reply, err)
		}
		if _, err := io.WriteString(conn, "ping\n"); err != nil {
			return err
		}
		b := make([]byte, 5)
		if _, err := io.ReadFull(conn, b); err != nil || string(b) != "ping\n" {
			return fmt.Errorf("echo %q %v", b, err)
		}
		return nil
	}
	if err := tunnel(); err != nil { // warm up pools and timers
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	runtime.GC()
	baseG, baseFD := runtime.NumGoroutine(), countFDs()

	const total, workers = 2000, 8
	var wg sync.WaitGroup
	errs := make(chan error, total)
	jobs := make(chan struct{})
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				if err := tunnel(); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := 0; i < total; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if d := e.p.Destinations("s1")[("allowed.test")]; d.Connections != total+1 {
		t.Errorf("connections %d, want %d", d.Connections, total+1)
	}
	if g := stable(runtime.NumGoroutine, baseG+2); g > baseG+2 {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines %d, baseline %d\n%s", g, baseG, buf[:runtime.Stack(buf, true)])
	}
	if fd := stable(countFDs, baseFD+2); fd > baseFD+2 {
		t.Errorf("fds %d, baseline %d", fd, baseFD)
	}
}

// TestCloseSession: Close cuts one session's tunnels and listener; other
// sessions keep working.
func TestCloseSession(t *testing.T) {
	echo := echoServer(t)
	ep := portOf(t, echo.Addr().String())
	e := newEnv(t, testConfig(ep))
	target := fmt.Sprintf("allowed.test:%d", ep)
	addr1 := e.serve("s1", 0, 1<<30)
	addr2 := e.serve("s2", 0, 1<<30)
	c1, br1, r1 := rawConnect(t, addr1, target, true)
	c2, br2, r2 := rawConnect(t, addr2, target, true)
	if r1.StatusCode != 200 || r2.StatusCode != 200 {
		t.Fatal(r1.Status, r2.Status)
	}
	echoOnce := func(c net.Conn, br io.Reader) error {
		if _, err := io.WriteString(c, "ping\n"); err != nil {
			return err
		}
		b := make([]byte, 5)
		_, err := io.ReadFull(br, b)
		return err
	}
	if echoOnce(c1, br1) != nil || echoOnce(c2, br2) != nil {
		t.Fatal("tunnels not working")
	}
	e.p.Close("s1")
	_ = c1.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := br1.ReadByte(); err == nil || isTimeout(err) {
		t.Errorf("s1 tunnel still open after Close: %v", err)
	}
	if err := echoOnce(c2, br2); err != nil {
		t.Errorf("s2 tunnel broken by closing s1: %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		c, err := net.Dial("tcp", addr1)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("s1 listener still accepting after Close")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if used, _, ok := e.p.Usage("s1"); !ok || used == 0 {
		t.Errorf("closed session's usage: %d %v", used, ok)
	}
	if _, _, ok := e.p.Usage("nope"); ok {
		t.Error("unknown session has usage")
	}
}

func TestServeErrorsAndShutdown(t *testing.T) {
	e := newEnv(t, testConfig())
	e.serve("s1", 0, 100)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	if err := e.p.ServeWithPolicy(l, "s1", nil, 0, 100); err == nil || !strings.Contains(err.Error(), "already being served") {
		t.Errorf("duplicate session: %v", err)
	}
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	done := make(chan error, 1)
	go func() { done <- e.p.ServeWithPolicy(l2, "s2", nil, 0, 100) }()
	// The caller closing the listener ends Serve too.
	time.Sleep(20 * time.Millisecond)
	l2.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve after listener close: %v", err)
	}
	e.p.Shutdown()
	e.p.Shutdown() // idempotent
	l3, _ := net.Listen("tcp", "127.0.0.1:0")
	if err := e.p.ServeWithPolicy(l3, "s3", nil, 0, 100); !errors.Is(err, ErrClosed) {
		t.Errorf("Serve after Shutdown: %v", err)
	}
}

// TestGitClient clones and pushes with real git through the proxy, over
// HTTPS (CONNECT) and plain HTTP, against git http-backend on loopback.
// The push is larger than git's post buffer, so its POST is chunked.
func TestGitClient(t *testing.T) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git not installed")
	}
	out, err := exec.Command(gitBin, "--exec-path").Output()
	if err != nil {
		t.Skip("git --exec-path:", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	if _, err := os.Stat(backend); err != nil {
		t.Skip("no git-http-backend")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "srv")
	home := filepath.Join(dir, "home")
	_ = os.MkdirAll(home, 0o755)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, getCA(t).pem, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0"}
	git := func(wd string, args ...string) string {
		t.Helper()
		cmd := exec.Command(gitBin, args...)
		cmd.Dir, cmd.Env = wd, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	_ = os.MkdirAll(root, 0o755)
	git(root, "init", "-q", "--bare", "-b", "main", "repo.git")
	git(filepath.Join(root, "repo.git"), "config", "http.receivepack", "true")

	var mu sync.Mutex
	chunkedPosts := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && len(r.TransferEncoding) > 0 && r.TransferEncoding[0] == "chunked" {
			mu.Lock()
			chunkedPosts++
			mu.Unlock()
			// CGI needs a length: buffer the chunked body.
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
		}
		(&cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}).ServeHTTP(w, r)
	})
	secure := newTLSUpstream(t, nil, h)
	plain := newHTTPUpstream(t, nil, h)
	tp, pp := portOf(t, secure.URL), portOf(t, plain.URL)
	e := newEnv(t, testConfig(tp, pp))
	proxyURL := "http://" + e.serve("s1", 0, 1<<30)
	via := []string{"-c", "http.proxy=" + proxyURL, "-c", "http.sslCAInfo=" + caFile, "-c", "user.name=t", "-c", "user.email=t@t"}

	work := filepath.Join(dir, "work")
	git(dir, "init", "-q", "-b", "main", work)
	payload := blob(3 << 20)
	if err := os.WriteFile(filepath.Join(work, "data.bin"), payload, 0o644); err != nil {
		t.Fatal(err)
	}
	git(work, "add", "data.bin")
	git(work, append(via, "commit", "-q", "-m", "data")...)
	httpsURL := fmt.Sprintf("https://allowed.test:%d/repo.git", tp)
	git(work, append(via, "push", "-q", httpsURL, "main")...)

	for i, u := range []string{httpsURL, fmt.Sprintf("http://allowed.test:%d/repo.git", pp)} {
		clone := filepath.Join(dir, fmt.Sprintf("clone%d", i))
		git(dir, append(via, "clone", "-q", u, clone)...)
		got, err := os.ReadFile(filepath.Join(clone, "data.bin"))
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("clone over %s: content differs (%v)", u, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if chunkedPosts == 0 {
		t.Error("no chunked POST reached the server")
	}
	if d := e.events.denials(); len(d) != 0 {
		t.Errorf("denials: %+v", d)
	}
}

// A sandbox opening connections in a loop gets at most MaxConnsPerSession
// of them (the rest are closed at once); other sessions are unaffected, and
// closing them frees the slots.
func TestConnectionLimits(t *testing.T) {
	up := newHTTPUpstream(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	pp := portOf(t, up.URL)
	e := newEnv(t, testConfig(pp))
	e.p.maxPerSess = 20
	a := e.serve("a", 0, 1<<30)
	b := e.serve("b", 0, 1<<30)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < 40; i++ {
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// A connection over the limit is closed by the proxy at once: a read
	// sees EOF; the others wait for a request (well within HeaderTimeout).
	var open atomic.Int32
	var wg sync.WaitGroup
	for _, c := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
				open.Add(1)
			}
		}()
	}
	wg.Wait()
	if open.Load() != 20 {
		t.Fatalf("%d connections stayed open, want 20", open.Load())
	}
	e.events.waitDenied(t, ReasonTooManyConns)
	url := fmt.Sprintf("http://allowed.test:%d/", pp)
	if code, body, _ := get(t, client(b), url); code != 200 || body != "ok" {
		t.Fatalf("other session: %d %q", code, body)
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := client(a).Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("slots not freed after the connections closed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The proxy sees the closes asynchronously (EOF on each connection).
	for deadline := time.Now().Add(5 * time.Second); e.p.clients.Load() > 2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := e.p.clients.Load(); n > 2 {
		t.Errorf("%d client connections counted after closing", n)
	}
}
