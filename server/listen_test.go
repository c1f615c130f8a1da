package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandboxd/server/config"

	"github.com/gorilla/websocket"
)

// API connection cap and idle timeout: the real listener and http.Server of
// Run (apiServer) over a fake runtime. No root, no gVisor.

// serveAPI serves e's API on a loopback port as Run does.
func serveAPI(t *testing.T, e *apiEnv) (string, *capListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs, capped := e.s.apiServer(ln)
	go hs.Serve(capped)
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String(), capped
}

// keepAlive opens a connection, gets /healthz on it and leaves it open
// (an idle keep-alive, as a client that never closes would).
func keepAlive(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: sandboxd\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("keep-alive /healthz: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("keep-alive /healthz: %d, close %v", resp.StatusCode, resp.Close)
	}
	c.SetDeadline(time.Time{})
	return c
}

// healthz asks /healthz on a fresh connection (closed after the answer).
func healthz(addr string) error {
	cl := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Get("http://" + addr + "/healthz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// assertRefused checks that a connection over the cap is closed at once:
// no answer, and no waiting for a timeout either.
func assertRefused(t *testing.T, addr string) {
	t.Helper()
	start := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v (the kernel accepts; the server should close)", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: sandboxd\r\n\r\n") // may fail: already closed
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a connection over the cap was answered: %d", resp.StatusCode)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a connection over the cap hung instead of being closed: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refusal took %v", d)
	}
}

func waitOpen(t *testing.T, l *capListener, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.Open() != want {
		if time.Now().After(deadline) {
			t.Fatalf("open API connections = %d, want %d", l.Open(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAPIConnCapAndIdleTimeout(t *testing.T) {
	const max, idle = 6, 2 * time.Second
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.MaxAPIConns = max
		c.Limits.APIIdleSeconds = int(idle / time.Second)
	})
	addr, l := serveAPI(t, e)

	var conns []net.Conn
	for range max {
		conns = append(conns, keepAlive(t, addr))
	}
	lastUse := time.Now()
	waitOpen(t, l, max)

	// (a) Over the cap: closed at once, however many; the server keeps
	// its slots for the idle connections.
	for range 3 * max {
		assertRefused(t, addr)
	}
	waitOpen(t, l, max)
	if err := healthz(addr); err == nil {
		t.Fatal("/healthz answered on a connection over the cap")
	}

	// Closing two idle connections frees two slots: a new connection is
	// answered, and another after it.
	conns[0].Close()
	conns[1].Close()
	waitOpen(t, l, max-2)
	for range 2 {
		if err := healthz(addr); err != nil {
			t.Fatalf("/healthz after closing idle connections: %v", err)
		}
	}

	// (b) The server closes the rest once idle for apiIdleSeconds, not
	// before.
	for _, c := range conns[2:] {
		c.SetReadDeadline(lastUse.Add(idle + 3*time.Second))
		n, err := c.Read(make([]byte, 1))
		if n != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("idle connection: read %d, %v; want EOF from the server's close", n, err)
		}
		if d := time.Since(lastUse); d < idle-100*time.Millisecond {
			t.Fatalf("idle connection closed after %v, before the idle timeout %v", d, idle)
		}
	}
	waitOpen(t, l, 0)
	// Every slot is free again.
	for range max {
		keepAlive(t, addr)
	}
	waitOpen(t, l, max)
	assertRefused(t, addr)
}

// A hijacked WebSocket holds its slot while open (the idle timeout does
// not apply to it) and gives it back when closed.
func TestAPIConnCapCountsWebSockets(t *testing.T) {
	const max, idle = 3, 1 * time.Second
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.MaxAPIConns = max
		c.Limits.APIIdleSeconds = int(idle / time.Second)
	})
	addr, l := serveAPI(t, e)
	e.provision(e.token, map[string]any{"sessionId": "ws-cap"})

	ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/v1/sandbox/ws-cap/logs/ws",
		http.Header{"Authorization": {"Bearer " + e.token}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	waitOpen(t, l, 1)

	// Past the idle timeout the WebSocket is still open and counted.
	time.Sleep(idle + 500*time.Millisecond)
	for {
		ws.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, _, err := ws.ReadMessage(); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("WebSocket ended past the idle timeout: %v", err)
			}
			break // no more history; still open
		}
	}
	if n := l.Open(); n != 1 {
		t.Fatalf("open = %d with one WebSocket, want 1", n)
	}
	keepAlive(t, addr)
	keepAlive(t, addr)
	waitOpen(t, l, max)
	assertRefused(t, addr)

	// Closing the WebSocket frees its slot.
	ws.Close()
	waitOpen(t, l, max-1)
	if err := healthz(addr); err != nil {
		t.Fatalf("/healthz after the WebSocket closed: %v", err)
	}
}

func TestDefaultMaxAPIConns(t *testing.T) {
	e := newAPIEnv(t)
	if e.s.cfg.Limits.MaxAPIConns != 0 || e.s.cfg.Limits.APIIdleSeconds != 120 {
		t.Fatalf("defaults: maxAPIConns %d, apiIdleSeconds %d", e.s.cfg.Limits.MaxAPIConns, e.s.cfg.Limits.APIIdleSeconds)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hs, l := e.s.apiServer(ln)
	if hs.IdleTimeout != 120*time.Second || hs.ReadHeaderTimeout != 10*time.Second {
		t.Errorf("timeouts: idle %v, read header %v", hs.IdleTimeout, hs.ReadHeaderTimeout)
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur >= 192 && l.max != int64(rl.Cur/4) {
		t.Errorf("default cap = %d, want a quarter of RLIMIT_NOFILE %d", l.max, rl.Cur)
	}
	// Per client: an eighth of the cap, at least 32 (none when that is
	// the cap itself).
	if want := int(max(l.max/8, 32)); want < int(l.max) && l.conns.PerClient() != want || want >= int(l.max) && l.conns.PerClient() != 0 {
		t.Errorf("default per-client cap = %d with a cap of %d", l.conns.PerClient(), l.max)
	}
	for _, c := range []struct {
		configured int
		total      int64
		want       int
	}{{0, 5000, 625}, {0, 256, 32}, {0, 100, 32}, {0, 20, 20}, {7, 5000, 7}} {
		if got := connsPerClient(c.configured, c.total); got != c.want {
			t.Errorf("connsPerClient(%d, %d) = %d, want %d", c.configured, c.total, got, c.want)
		}
	}
}

// The review's reproduction against the real binary: under `ulimit -n 1200`
// 1170 keep-alive connections exhausted the server's descriptors (accept
// failed with EMFILE, /healthz hung). Now one client gets its
// maxConnsPerClient (an eighth of the quarter of the limit) and a 429 for
// the rest; clients from ten addresses together get no more than the
// quarter, the idle connections of the heaviest closed to make room; a new
// client is still answered, and the server stays far from the limit.
func TestRealAPIConnFlood(t *testing.T) {
	cfg := realConfig(t)
	bin := filepath.Join(binDir(t), "sandboxd")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run `make build`", err)
	}
	const nofile, flood, idle = 1200, 1300, 3 * time.Second
	const total, perClient = nofile / 4, nofile / 4 / 8
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	conf := writeTempFile(t, "sandboxd.yaml", fmt.Sprintf(`listen: %s
dataDir: %s
runsc: {binary: %s, agent: %s}
image: {autoBuild: false, cacheDir: %s}
limits: {apiIdleSeconds: %d, maxAPIConns: %d}
`, addr, cfg.DataDir, cfg.Runsc.Binary, cfg.Runsc.Agent, cfg.Image.CacheDir, int(idle/time.Second), total))
	// maxAPIConns is the default under this ulimit, set because Run raises
	// the open-file limit where it may (root with CAP_SYS_RESOURCE).
	cmd := osexec.Command("/bin/sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" serve --config "$1"`, nofile), bin, conf)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SANDBOXD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Error("sandboxd did not stop on SIGINT")
		}
		if t.Failed() {
			t.Logf("sandboxd output:\n%s", out.String())
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for healthz(addr) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("sandboxd did not come up:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	fds := func() int {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
		return len(ents)
	}
	base := fds()

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// open opens a keep-alive from local: held (200), refused with a 429,
	// or closed at once; never left hanging.
	open := func(local string) (held, answered429 bool) {
		c, err := dialerFrom(local).Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", local, err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: sandboxd\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("a connection from %s hung: %v", local, err)
			}
			c.Close() // closed at once
			return false, false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			if resp.Header.Get("Retry-After") == "" || !resp.Close {
				t.Fatalf("429 without Retry-After or close: %v", resp.Header)
			}
			c.Close()
			return false, true
		}
		c.SetDeadline(time.Time{})
		conns = append(conns, c)
		return true, false
	}
	// One client floods.
	held, refused429 := 0, 0
	for range flood {
		h, r := open("127.0.0.1")
		if h {
			held++
		}
		if r {
			refused429++
		}
	}
	if held != perClient {
		t.Errorf("one client kept %d of %d connections, want maxConnsPerClient %d", held, flood, perClient)
	}
	if refused429 < (flood-perClient)/2 {
		t.Errorf("only %d of %d refusals answered 429", refused429, flood-perClient)
	}
	// Nine more clients take their share each; together they pass the
	// total, so idle connections of the heaviest make room.
	for i := 2; i <= 10; i++ {
		for range perClient + 5 {
			open(fmt.Sprintf("127.0.0.%d", i))
		}
	}
	if n := fds(); n > base+total+50 {
		t.Errorf("server has %d descriptors open (%d before the flood), limit %d", n, base, nofile)
	}
	// A new client is answered promptly.
	t0 := time.Now()
	if ans := fairDo(t, clientFrom(t, "127.0.0.11"), "GET", "http://"+addr+"/healthz", "", nil); ans.status != http.StatusOK || time.Since(t0) > 2*time.Second {
		t.Errorf("/healthz from a new client during the flood: %d after %v", ans.status, time.Since(t0))
	}
	// Once the idle ones time out, all of it is free again.
	deadline = time.Now().Add(idle + 5*time.Second)
	for fds() > base+5 {
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open %v after the flood (%d before)", fds(), idle+5*time.Second, base)
		}
		time.Sleep(100 * time.Millisecond)
	}
	o := out.String()
	if strings.Contains(o, "too many open files") || strings.Contains(o, "Accept error") {
		t.Errorf("server ran out of descriptors:\n%s", o)
	}
	if !strings.Contains(o, "API client at its connection limit") {
		t.Errorf("no warning about the per-client connection limit in the server's log:\n%s", o)
	}
}

// lockedBuffer is a bytes.Buffer for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
