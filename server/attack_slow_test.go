package server

// Slow and many clients from outside (see attack_outside_test.go): headers
// or bodies sent a byte a second, answers never read, many idle
// connections; each is cut off in bounded time and nobody else waits.

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/runsc"
)

// bystander is an ordinary client on another loopback address
// (127.0.0.2), so limits per client address never count it with the
// attacker's connections on 127.0.0.1.
func (a *atkEnv) bystander(t *testing.T) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// served checks the bystander is answered promptly, with and without a
// token, while attacks run; it returns the slowest answer.
func (a *atkEnv) served(t *testing.T, cl *http.Client) time.Duration {
	t.Helper()
	var slowest time.Duration
	for _, c := range []struct{ path, token string }{{"/healthz", ""}, {"/v1/sandbox/" + a.mine, a.token}} {
		start := time.Now()
		req, _ := http.NewRequest("GET", "http://"+a.addr+c.path, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Errorf("bystander %s: %v", c.path, err)
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("bystander %s: %d", c.path, resp.StatusCode)
		}
		slowest = max(slowest, time.Since(start))
	}
	return slowest
}

// closeIdle closes the env's client's idle keep-alive connections.
func (a *atkEnv) closeIdle() { a.cl.CloseIdleConnections() }

// whileAttacked runs the bystander every 200 ms until stop is closed and
// fails if any answer took longer than 2 s.
func (a *atkEnv) whileAttacked(t *testing.T, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	cl := a.bystander(t)
	wg.Add(1)
	go func() {
		defer wg.Done()
		n := 0
		for {
			select {
			case <-stop:
				if n == 0 {
					t.Error("the bystander never ran")
				}
				cl.CloseIdleConnections()
				return
			case <-time.After(200 * time.Millisecond):
			}
			if d := a.served(t, cl); d > 2*time.Second {
				t.Errorf("the bystander waited %v", d)
			}
			n++
		}
	}()
	return &wg
}

// trickle dials the server, sends head at once, then one byte of drip a
// second (cycling) until the server closes the connection or limit
// passes; it returns how long the server took to close it (or limit) and
// what it answered.
func trickle(addr, head, drip string, limit time.Duration) (time.Duration, string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err.Error()
	}
	defer c.Close()
	start := time.Now()
	io.WriteString(c, head)
	closed := make(chan string, 1)
	go func() {
		c.SetReadDeadline(start.Add(limit))
		b, _ := io.ReadAll(c)
		closed <- string(b)
	}()
	for i := 0; ; i++ {
		select {
		case got := <-closed:
			return time.Since(start), got
		case <-time.After(time.Second):
		}
		if _, err := io.WriteString(c, string(drip[i%len(drip)])); err != nil {
			return time.Since(start), <-closed
		}
	}
}

// TestAttackSlowClients runs the slow attacks side by side, each on its
// own server (the slowest waits for net/http's read-header timeout).
func TestAttackSlowClients(t *testing.T) {
	envs := map[string]*atkEnv{}
	for _, name := range []string{"headers", "bodies", "readers"} {
		envs[name] = newAtkEnv(t)
	}
	t.Run("headers", func(t *testing.T) { t.Parallel(); slowHeaders(t, envs["headers"]) })
	t.Run("bodies", func(t *testing.T) { t.Parallel(); slowBodies(t, envs["bodies"]) })
	t.Run("readers", func(t *testing.T) { t.Parallel(); slowReaders(t, envs["readers"]) })
}

// slowHeaders: clients that send their headers a byte a second, to the
// API and to a portal origin, are cut off at the read-header timeout, and
// an ordinary client is answered meanwhile.
func slowHeaders(t *testing.T, a *atkEnv) {
	timeout := a.hs.ReadHeaderTimeout
	if timeout <= 0 || timeout > 30*time.Second {
		t.Fatalf("ReadHeaderTimeout = %v", timeout)
	}
	stop := make(chan struct{})
	wg := a.whileAttacked(t, stop)
	var mu sync.Mutex
	var attackers sync.WaitGroup
	for i := range 40 {
		host := a.addr
		if i%2 == 1 {
			host = a.portalHost(a.orgA.Org.ID, a.mine)
		}
		attackers.Add(1)
		go func() {
			defer attackers.Done()
			d, got := trickle(a.addr, "GET /healthz HTTP/1.1\r\nHost: "+host+"\r\nX-Slow: ", "abcdefgh", timeout+10*time.Second)
			mu.Lock()
			defer mu.Unlock()
			if d < timeout-time.Second || d > timeout+5*time.Second {
				t.Errorf("slow headers to %s: cut after %v (read-header timeout %v)", host, d, timeout)
			}
			if strings.HasPrefix(got, "HTTP/1.1 200") {
				t.Errorf("slow headers to %s answered: %q", host, got)
			}
		}()
	}
	attackers.Wait()
	close(stop)
	wg.Wait()
	a.closeIdle()
	waitOpen(t, a.l, 0)
}

// slowBodies: a body sent a byte a second is cut off after the
// body timeout on any route, with or without a token, on the API and a
// portal origin (net/http bounds only the header); a slow but steady
// upload within it passes, and neither a handler that runs longer than it
// after reading its body nor an authorized upload into the portal is cut.
func slowBodies(t *testing.T, a *atkEnv) {
	const limit = 2 * time.Second
	a.s.bodyIO.Store(int64(limit))
	a.s.fileIO.Store(int64(limit))
	up := a.upstream(t)
	auth := "Authorization: Bearer " + a.token + "\r\n"
	portalHost := a.portalHost(a.orgA.Org.ID, a.mine)
	stop := make(chan struct{})
	wg := a.whileAttacked(t, stop)
	cases := []struct{ what, head string }{
		{"chunked GET /healthz", "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"a console asset with a body", "GET /assets/app.js HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"},
		{"provision without a token", "POST /v1/sandbox HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"},
		{"provision", "POST /v1/sandbox HTTP/1.1\r\nHost: x\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\n"},
		{"exec", "POST /v1/sandbox/terminal/" + a.mine + " HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 5000\r\n\r\n"},
		{"an upload", "PUT /v1/sandbox/" + a.mine + "/files?path=/workspace/slow.txt HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 5000\r\n\r\n"},
		{"an upload to a session that does not exist", "PUT /v1/sandbox/nosuch/files?path=/workspace/slow.txt HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 5000\r\n\r\n"},
		{"MCP", "POST /mcp HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 5000\r\n\r\n"},
		{"a portal origin without its cookie", "POST /port/8000/ HTTP/1.1\r\nHost: " + portalHost + "\r\nContent-Length: 5000\r\n\r\n"},
		{"the proxy route without a token", "POST /v1/sandbox/proxy/" + a.mine + "/port/8000/ HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"},
	}
	var attackers sync.WaitGroup
	for _, c := range cases {
		attackers.Add(1)
		go func() {
			defer attackers.Done()
			d, got := trickle(a.addr, c.head, "{", limit+10*time.Second)
			if d > limit+4*time.Second {
				t.Errorf("%s: a body a byte a second held the connection for %v (body timeout %v); answer %.100q", c.what, d, limit, got)
			}
		}()
	}
	attackers.Wait()
	close(stop)
	wg.Wait()

	// A slow but steady upload that ends within the timeout passes.
	pr, pw := io.Pipe()
	go func() {
		for range 4 {
			pw.Write([]byte("0123456789"))
			time.Sleep(limit / 8)
		}
		pw.Close()
	}()
	r := a.do(t, "PUT", "/v1/sandbox/"+a.mine+"/files?path=/workspace/steady.txt", a.token, pr)
	if r.status != http.StatusCreated {
		t.Errorf("a steady upload: %d %s", r.status, r.body)
	}
	// A handler that runs past the timeout once its body is in is not cut
	// (net/http reads the connection in the background meanwhile).
	a.rt.Mu.Lock()
	a.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		time.Sleep(limit + time.Second)
		io.WriteString(req.Stdout, "slow\n")
		return runsc.ExecResult{}, nil
	}
	a.rt.Mu.Unlock()
	r = a.do(t, "POST", "/v1/sandbox/terminal/"+a.mine, a.token, strings.NewReader(`{"action":"exec","command":"sleep 3"}`))
	if r.status != http.StatusOK || !strings.Contains(string(r.body), "slow") {
		t.Errorf("a command longer than the body timeout: %d %s", r.status, r.body)
	}
	// An authorized upload into the portal may take longer (it is the
	// sandbox's own server that reads it).
	pr, pw = io.Pipe()
	go func() {
		for range 6 {
			pw.Write([]byte("0123456789"))
			time.Sleep(limit / 3)
		}
		pw.Close()
	}()
	r = a.do(t, "POST", "/v1/sandbox/proxy/"+a.mine+"/port/8000/upload", a.token, pr)
	if r.status != http.StatusOK || !strings.HasSuffix(string(r.body), "body 60") {
		t.Errorf("a slow authorized upload into the portal: %d %s", r.status, r.body)
	}
	if paths, _ := up.seen(); len(paths) == 0 {
		t.Error("the upload did not reach the sandbox's server")
	}
	a.closeIdle()
	waitOpen(t, a.l, 0)
}

// slowReaders: a client that asks for answers and never reads
// them is cut off once a write has made no progress for the write-stall
// timeout, whoever it is; a client that reads slowly but steadily gets
// everything, and an answer written after a long pause goes out.
func slowReaders(t *testing.T, a *atkEnv) {
	const stall = 2 * time.Second
	a.s.writeIdle.Store(int64(stall))
	stop := make(chan struct{})
	wg := a.whileAttacked(t, stop)
	if err := writeBig(a.workspaceDir(t)+"/big.bin", 8<<20); err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for _, req := range []string{
		"GET /assets/app.js HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/sandbox/" + a.mine + "/artifacts/big.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + a.token + "\r\n\r\n",
	} {
		c, err := net.Dial("tcp", a.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.(*net.TCPConn).SetReadBuffer(4096)
		for range 40 {
			io.WriteString(c, req)
		}
		conns = append(conns, c)
	}
	time.Sleep(stall + time.Second)
	close(stop)
	wg.Wait()
	// The server closed each of them (they are open on this side): only
	// the server's count can tell, the client may not see a reset while
	// its window is shut.
	a.closeIdle()
	waitOpen(t, a.l, 0)
	for _, c := range conns {
		c.Close()
	}
	// Slow but steady: 8 MiB read 128 KiB every 50 ms (longer than the
	// stall timeout in all); the server's writes wait for room again and
	// again, never for the whole timeout.
	c, err := net.Dial("tcp", a.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /v1/sandbox/"+a.mine+"/artifacts/big.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+a.token+"\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	for {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := io.CopyN(io.Discard, resp.Body, 128<<10)
		got += n
		if err != nil {
			if err != io.EOF {
				t.Errorf("a steady reader: %v after %d bytes", err, got)
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got != 8<<20 {
		t.Errorf("a steady reader got %d of %d bytes", got, 8<<20)
	}
	// An answer after a pause longer than the stall timeout.
	a.rt.Mu.Lock()
	a.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		time.Sleep(stall + time.Second)
		io.WriteString(req.Stdout, "late\n")
		return runsc.ExecResult{}, nil
	}
	a.rt.Mu.Unlock()
	r := a.do(t, "POST", "/v1/sandbox/terminal/"+a.mine, a.token, strings.NewReader(`{"action":"exec","command":"x"}`))
	if r.status != http.StatusOK || !strings.Contains(string(r.body), "late") {
		t.Errorf("an answer after a pause: %d %s", r.status, r.body)
	}
	a.closeIdle()
	waitOpen(t, a.l, 0)
}

func writeBig(path string, n int) error {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return osWriteFile(path, b)
}

// TestAttackConnFlood: many idle and half-open connections from one
// address (fewer than limits.maxAPIConns; filling the cap is
// TestAPIConnCapAndIdleTimeout's) do not slow an ordinary client from
// another. Tolerant of per-client limits: the attacker's connections may
// be refused, the bystander must be served.
func TestAttackConnFlood(t *testing.T) {
	a := newAtkEnv(t)
	flood := int(min(300, a.l.max/2))
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range flood {
		c, err := net.Dial("tcp", a.addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
		switch i % 3 {
		case 1:
			io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
		case 2:
			io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: "+a.portalHost(a.orgA.Org.ID, a.mine)+"\r\n")
		}
	}
	cl := a.bystander(t)
	for range 10 {
		if d := a.served(t, cl); d > 2*time.Second {
			t.Errorf("with %d idle connections open, the bystander waited %v", flood, d)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	cl.CloseIdleConnections()
	a.closeIdle()
	waitOpen(t, a.l, 0)
	if n := runtime.NumGoroutine(); n > 2000 {
		t.Errorf("%d goroutines after the flood", n)
	}
}

func osWriteFile(path string, b []byte) error { return os.WriteFile(path, b, 0o644) }
