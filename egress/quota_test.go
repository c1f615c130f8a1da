package egress

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// checkCut asserts the quota held: at most limit + slack bytes counted, at
// least the limit reached, and exactly one QuotaExceeded event.
func checkCut(t *testing.T, e *env, id string, limit, slack int64) {
	t.Helper()
	// The event follows the cut, which the client may see first.
	deadline := time.Now().Add(2 * time.Second)
	for e.events.quotaCount() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	used, l, ok := e.p.Usage(id)
	if !ok || l != limit || used > limit+slack || used < limit {
		t.Errorf("Usage(%s) = %d, %d, %v; limit %d (+%d)", id, used, l, ok, limit, slack)
	}
	if n := e.events.quotaCount(); n != 1 {
		t.Errorf("%d QuotaExceeded events, want 1", n)
	}
}

// checkRefused asserts new plain and CONNECT requests get the quota 403.
func checkRefused(t *testing.T, e *env, c *http.Client, plainURL, tlsURL string) {
	t.Helper()
	code, body, hdr := get(t, c, plainURL)
	if code != 403 || !strings.Contains(body, "egress quota exceeded") || hdr.Get("X-Egress-Denied") != ReasonQuota {
		t.Errorf("plain after quota: %d %q", code, body)
	}
	if _, err := c.Get(tlsURL); err == nil || !strings.Contains(err.Error(), "Egress quota exceeded") {
		t.Errorf("CONNECT after quota: %v", err)
	}
	e.events.waitDenied(t, ReasonQuota)
	if n := e.events.quotaCount(); n != 1 {
		t.Errorf("%d QuotaExceeded events after refusals, want 1", n)
	}
}

func TestQuotaCutsLargeDownload(t *testing.T) {
	body := blob(8 << 20)
	secure := newTLSUpstream(t, nil, blobHandler(body))
	plain := newHTTPUpstream(t, nil, blobHandler(body))
	tp, pp := portOf(t, secure.URL), portOf(t, plain.URL)
	e := newEnv(t, testConfig(tp, pp))
	const limit = 1 << 20
	c := client(e.serve("s1", 0, limit))
	tlsURL := fmt.Sprintf("https://allowed.test:%d/big", tp)
	resp, err := c.Get(tlsURL)
	if err == nil {
		n, rerr := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if rerr == nil {
			t.Fatalf("download of %d bytes completed under a %d byte quota", n, limit)
		}
	}
	checkCut(t, e, "s1", limit, 0)
	checkRefused(t, e, c, fmt.Sprintf("http://allowed.test:%d/", pp), tlsURL)
}

// Far from the quota, tunnel downloads are spliced in the kernel; the cut
// still lands exactly at the limit, and a download under it arrives whole.
func TestQuotaSplicedDownload(t *testing.T) {
	body := blob(24 << 20)
	secure := newTLSUpstream(t, nil, blobHandler(body))
	tp := portOf(t, secure.URL)
	e := newEnv(t, testConfig(tp))
	const limit = 40 << 20
	c := client(e.serve("s1", 0, limit))
	url := fmt.Sprintf("https://allowed.test:%d/big", tp)
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("first download: %d bytes, %v", len(got), err)
	}
	if used, _, _ := e.p.Usage("s1"); used < int64(len(body)) || used > int64(len(body))+64<<10 {
		t.Fatalf("usage %d after a %d byte download", used, len(body))
	}
	// The second one crosses the limit.
	if resp, err := c.Get(url); err == nil {
		n, rerr := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if rerr == nil {
			t.Fatalf("second download of %d bytes completed past the quota", n)
		}
	}
	checkCut(t, e, "s1", limit, 0)
}

// Keep-alive: the count spans requests on one connection.
func TestQuotaKeepAlive(t *testing.T) {
	body := blob(100 << 10)
	plain := newHTTPUpstream(t, nil, blobHandler(body))
	pp := portOf(t, plain.URL)
	e := newEnv(t, testConfig(pp))
	const limit = 350 << 10
	c := client(e.serve("s1", 0, limit))
	ok, reused := 0, 0
	for i := 0; i < 6; i++ {
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
			if info.Reused {
				reused++
			}
		}}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET",
			fmt.Sprintf("http://allowed.test:%d/%d", pp, i), nil)
		resp, err := c.Do(req)
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode == 200 && len(b) == len(body) {
			ok++
		}
	}
	if ok != 3 || reused < 2 {
		t.Errorf("%d full responses (want 3), %d on a reused connection", ok, reused)
	}
	checkCut(t, e, "s1", limit, 0)
}

// Parallel connections share one count.
func TestQuotaParallel(t *testing.T) {
	body := blob(2 << 20)
	secure := newTLSUpstream(t, nil, blobHandler(body))
	tp := portOf(t, secure.URL)
	e := newEnv(t, testConfig(tp))
	const limit, conns = 3 << 20, 8
	addr := e.serve("s1", 0, limit)
	var wg sync.WaitGroup
	var mu sync.Mutex
	complete := 0
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client(addr) // own transport: own connection
			resp, err := c.Get(fmt.Sprintf("https://allowed.test:%d/%d", tp, i))
			if err != nil {
				return
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && n == int64(len(body)) {
				mu.Lock()
				complete++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if complete > 1 {
		t.Errorf("%d of %d downloads of %d bytes completed under a %d byte quota", complete, conns, len(body), limit)
	}
	// Bytes are claimed from the quota before they are forwarded: exact.
	checkCut(t, e, "s1", limit, 0)
}

// Many tunnels uploading at once: what reaches the upstream, and what is
// counted, never passes the quota.
func TestQuotaParallelUploads(t *testing.T) {
	var sunk atomic.Int64
	sink := tcpServer(t, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		sunk.Add(n)
	})
	port := sink.Addr().(*net.TCPAddr).Port
	e := newEnv(t, testConfig(port))
	const limit, conns = 1 << 20, 100
	addr := e.serve("s1", 0, limit)
	target := fmt.Sprintf("allowed.test:%d", port)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"); err != nil {
				return
			}
			if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
				return
			}
			<-start
			chunk := make([]byte, 64<<10) // zeros: not HTTP, not TLS
			for j := 0; j < 32; j++ {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	close(start)
	wg.Wait()
	checkCut(t, e, "s1", limit, 0)
	time.Sleep(200 * time.Millisecond) // the sink drains what was forwarded
	if n := sunk.Load(); n > limit {
		t.Errorf("upstream received %d bytes under a %d byte quota", n, limit)
	}
}

// A long tunnel (as a WebSocket inside CONNECT would be) is counted and
// cut like anything else.
func TestQuotaLongTunnel(t *testing.T) {
	echo := echoServer(t)
	ep := portOf(t, echo.Addr().String())
	e := newEnv(t, testConfig(ep))
	const limit = 256 << 10
	addr := e.serve("s1", 0, limit)
	conn, br, resp := rawConnect(t, addr, fmt.Sprintf("allowed.test:%d", ep), true)
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	chunk := make([]byte, 4096)
	var echoed int64
	for i := 0; i < 1000; i++ {
		if _, err := conn.Write(chunk); err != nil {
			break
		}
		n, err := io.ReadFull(br, chunk)
		echoed += int64(n)
		if err != nil {
			break
		}
	}
	if echoed >= limit {
		t.Errorf("echoed %d bytes through a %d byte quota", echoed, limit)
	}
	checkCut(t, e, "s1", limit, 0)
}

// A session restarted with its bytes already used: it refuses at once,
// and one with a little left is cut when that is gone.
func TestQuotaRestart(t *testing.T) {
	body := blob(64 << 10)
	plain := newHTTPUpstream(t, nil, blobHandler(body))
	secure := newTLSUpstream(t, nil, blobHandler(body))
	pp, tp := portOf(t, plain.URL), portOf(t, secure.URL)
	e := newEnv(t, testConfig(pp, tp))
	c := client(e.serve("full", 5000, 5000))
	code, msg, _ := get(t, c, fmt.Sprintf("http://allowed.test:%d/", pp))
	if code != 403 || !strings.Contains(msg, "has used 5000 of its 5000 bytes") {
		t.Errorf("restarted full session: %d %q", code, msg)
	}
	if _, err := client(e.serve("zero", 0, 0)).Get(fmt.Sprintf("https://allowed.test:%d/", tp)); err == nil {
		t.Error("limit 0 allowed traffic")
	}
	if n := e.events.quotaCount(); n != 0 {
		t.Errorf("%d QuotaExceeded events for sessions that started used up", n)
	}
	if used, _, _ := e.p.Usage("full"); used != 5000 {
		t.Errorf("refusals were counted: used %d", used)
	}

	c = client(e.serve("some", 1<<20-10000, 1<<20))
	if resp, err := c.Get(fmt.Sprintf("http://allowed.test:%d/", pp)); err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Error("64 KiB went through with 10000 bytes left")
		}
	}
	checkCut(t, e, "some", 1<<20, 0)
}

// Pipelined requests in one write are counted like any others.
func TestQuotaPipelining(t *testing.T) {
	body := blob(40 << 10)
	plain := newHTTPUpstream(t, nil, blobHandler(body))
	pp := portOf(t, plain.URL)
	e := newEnv(t, testConfig(pp))
	const limit = 60 << 10
	addr := e.serve("s1", 0, limit)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := fmt.Sprintf("GET http://allowed.test:%d/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", pp)
	if _, err := io.WriteString(conn, req+req+req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	full := 0
	for i := 0; i < 3; i++ {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || n != int64(len(body)) {
			break
		}
		full++
	}
	if full != 1 {
		t.Errorf("%d full responses, want 1", full)
	}
	checkCut(t, e, "s1", limit, 0)
}

// OnUsage reports each step a session's count passes (a 64th of the
// limit, at least 1 MiB), so the caller can save counts between sweeps.
func TestQuotaOnUsage(t *testing.T) {
	body := blob(5 << 20)
	up := newHTTPUpstream(t, nil, blobHandler(body))
	port := portOf(t, up.URL)
	e := newEnv(t, testConfig(port))
	var mu sync.Mutex
	var seen []int64
	e.p.onUsage = func(id string, used int64) {
		mu.Lock()
		seen = append(seen, used)
		mu.Unlock()
	}
	addr := e.serve("s1", 0, 64<<20)
	code, got, _ := get(t, client(addr), fmt.Sprintf("http://allowed.test:%d/x", port))
	if code != 200 || len(got) != len(body) {
		t.Fatalf("download: %d, %d bytes", code, len(got))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 4 || len(seen) > 5 {
		t.Errorf("%d usage reports for 5 MiB in 1 MiB steps: %v", len(seen), seen)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i]>>20 <= seen[i-1]>>20 {
			t.Errorf("reports not one per step: %v", seen)
		}
	}
}
