package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"sandboxd/server/config"
	"sandboxd/store"
)

// Fairness between clients (fair.go, listen.go, server/fair) on the real
// listener and http.Server of Run (serveAPI) over a fake runtime. Clients
// are told apart by their loopback source address (127.0.0.1, 127.0.0.2,
// ...: all loopback on Linux).

// dialerFrom dials from the loopback address local.
func dialerFrom(local string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 3 * time.Second}
}

// clientFrom is an HTTP client whose connections come from local.
func clientFrom(t *testing.T, local string) *http.Client {
	tr := &http.Transport{DialContext: dialerFrom(local).DialContext, MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}
}

// keepAliveFrom is keepAlive from the loopback address local.
func keepAliveFrom(t *testing.T, addr, local string) net.Conn {
	t.Helper()
	c, err := dialerFrom(local).Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: sandboxd\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("keep-alive /healthz from %s: %v", local, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("keep-alive /healthz from %s: %d, close %v", local, resp.StatusCode, resp.Close)
	}
	c.SetDeadline(time.Time{})
	return c
}

// fairAnswer is one answer, read to the end.
type fairAnswer struct {
	status     int
	retryAfter string
	requestID  string
	body       errorBody
	raw        string
	took       time.Duration
}

func fairDo(t *testing.T, cl *http.Client, method, url, token string, body io.Reader) fairAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	t0 := time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := fairAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"),
		requestID: resp.Header.Get("X-Request-Id"), raw: string(b), took: time.Since(t0)}
	json.Unmarshal(b, &a.body)
	return a
}

// check429 checks a refusal: 429 rate_limited in the contract's shape,
// with Retry-After in whole seconds and the scope in details.
func check429(t *testing.T, a fairAnswer, scope string) {
	t.Helper()
	if a.status != http.StatusTooManyRequests || a.body.Error.Code != "rate_limited" || a.body.Error.Message == "" ||
		a.body.Error.RequestID == "" || a.body.Error.RequestID != a.requestID {
		t.Fatalf("want 429 rate_limited in the error shape with the request id; got %d %s (X-Request-Id %q)", a.status, a.raw, a.requestID)
	}
	if n, err := strconv.Atoi(a.retryAfter); err != nil || n < 1 {
		t.Fatalf("Retry-After = %q, want whole seconds >= 1", a.retryAfter)
	}
	if got := a.body.Error.Details["scope"]; got != scope {
		t.Fatalf("scope = %v, want %s: %s", got, scope, a.raw)
	}
}

// One client holding its maxConnsPerClient keep-alives gets 429 with
// Retry-After on every new connection; another client is served at once.
func TestFairConnsPerClient(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.MaxAPIConns = 40
		c.Limits.MaxConnsPerClient = 4
	})
	addr, l := serveAPI(t, e)
	var held []net.Conn
	for range 4 {
		held = append(held, keepAliveFrom(t, addr, "127.0.0.1"))
	}
	waitOpen(t, l, 4)

	// A's new connections: answered 429, then closed; its four stay.
	a := clientFrom(t, "127.0.0.1")
	for range 3 {
		ans := fairDo(t, a, "GET", "http://"+addr+"/v1/me", e.token, nil)
		check429(t, ans, "address")
		if got := ans.body.Error.Details["limit"]; got != "maxConnsPerClient" {
			t.Fatalf("limit = %v", got)
		}
	}
	// Also with a request body it does not read: the answer arrives (no
	// reset before it).
	ans := fairDo(t, a, "POST", "http://"+addr+"/v1/sandbox", e.token, bytes.NewReader(make([]byte, 200<<10)))
	check429(t, ans, "address")
	// On the wire: the answer, then the server's close.
	c, err := dialerFrom("127.0.0.1").Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: sandboxd\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests || !resp.Close {
		t.Fatalf("raw over the client cap: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if n, err := br.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the 429: read %d, %v; want the server's close", n, err)
	}
	c.Close()
	waitOpen(t, l, 4)

	// B, another address, is served promptly while A holds its four.
	b := clientFrom(t, "127.0.0.2")
	for range 3 {
		if ans := fairDo(t, b, "GET", "http://"+addr+"/v1/me", e.token, nil); ans.status != http.StatusOK || ans.took > 2*time.Second {
			t.Fatalf("B: %d after %v: %s", ans.status, ans.took, ans.raw)
		}
	}
	if n := metricValue(t, e, "sandboxd_api_client_connections_refused_total"); n != 5 {
		t.Errorf("sandboxd_api_client_connections_refused_total = %v, want 5", n)
	}
	// A closes one of its own: its next connection is served.
	held[0].Close()
	waitOpen(t, l, 4) // A's three, B's keep-alive
	a.Transport.(*http.Transport).CloseIdleConnections()
	if ans := fairDo(t, a, "GET", "http://"+addr+"/healthz", "", nil); ans.status != http.StatusOK {
		t.Fatalf("A after closing one: %d %s", ans.status, ans.raw)
	}
}

// At maxAPIConns a new client takes the place of an idle keep-alive of
// the client holding the most, until the two hold as many; busy
// connections (WebSockets) are never closed for it.
func TestFairEvictsIdleOfHeaviest(t *testing.T) {
	const max = 6
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.MaxAPIConns = max
		c.Limits.APIIdleSeconds = 60
	})
	addr, l := serveAPI(t, e)
	var a []net.Conn
	for range max {
		a = append(a, keepAliveFrom(t, addr, "127.0.0.1"))
	}
	waitOpen(t, l, max)

	// closedOf counts A's connections the server has closed.
	closedOf := func() int {
		n := 0
		for _, c := range a {
			c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
				n++
			}
		}
		return n
	}
	// B's keep-alives: each closes one of A's idle ones, until A has no
	// more than B would.
	for i := range 3 {
		t0 := time.Now()
		keepAliveFrom(t, addr, "127.0.0.2")
		if d := time.Since(t0); d > 2*time.Second {
			t.Fatalf("B's connection %d took %v", i, d)
		}
		if n := closedOf(); n != i+1 {
			t.Fatalf("after B's connection %d: %d of A's closed, want %d", i+1, n, i+1)
		}
	}
	waitOpen(t, l, max)
	if n := metricValue(t, e, "sandboxd_api_connections_evicted_total"); n != 3 {
		t.Errorf("sandboxd_api_connections_evicted_total = %v, want 3", n)
	}
	// 3 and 3: neither makes room for the other.
	assertRefusedFrom(t, addr, "127.0.0.2")
	assertRefusedFrom(t, addr, "127.0.0.1")
	if n := closedOf(); n != 3 {
		t.Fatalf("%d of A's closed, want 3", n)
	}
}

// WebSockets are busy: a server full of one client's WebSockets closes
// none of them for another client.
func TestFairKeepsBusyConns(t *testing.T) {
	const max = 4
	e := newAPIEnv(t, func(c *config.Config) { c.Limits.MaxAPIConns = max })
	addr, l := serveAPI(t, e)
	e.provision(e.token, map[string]any{"sessionId": "ws-fair"})
	d := websocket.Dialer{NetDialContext: dialerFrom("127.0.0.1").DialContext}
	var wss []*websocket.Conn
	for range max {
		ws, _, err := d.Dial("ws://"+addr+"/v1/sandbox/ws-fair/logs/ws", http.Header{"Authorization": {"Bearer " + e.token}})
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		wss = append(wss, ws)
	}
	waitOpen(t, l, max)
	assertRefusedFrom(t, addr, "127.0.0.2")
	for _, ws := range wss {
		ws.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Fatalf("a WebSocket was closed for another client: %v", err)
				}
				break
			}
		}
	}
	wss[0].Close()
	waitOpen(t, l, max-1)
	keepAliveFrom(t, addr, "127.0.0.2")
}

// assertRefusedFrom is assertRefused from the loopback address local.
func assertRefusedFrom(t *testing.T, addr, local string) {
	t.Helper()
	c, err := dialerFrom(local).Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: sandboxd\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a connection from %s over the cap was answered: %d", local, resp.StatusCode)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a connection from %s over the cap hung: %v", local, err)
	}
}

// A client hammering the API is answered 429 with Retry-After once past
// its rate, by its address and by its token; another client (its own
// address and token) is served promptly all along.
func TestFairRequestRate(t *testing.T) {
	const perSecond, burst = 2, 5
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.RequestsPerSecond = perSecond
		c.Limits.RequestBurst = burst
	})
	addr, _ := serveAPI(t, e)
	url := "http://" + addr + "/v1/me"
	_, tokB := e.addMember("developer")
	a, b := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.0.2")

	// A, sequentially: the burst, then 429.
	t0 := time.Now()
	ok := 0
	var refused fairAnswer
	for range 50 {
		ans := fairDo(t, a, "GET", url, e.token, nil)
		if ans.status == http.StatusTooManyRequests {
			refused = ans
			break
		}
		if ans.status != http.StatusOK {
			t.Fatalf("A: %d %s", ans.status, ans.raw)
		}
		ok++
	}
	if most := burst + int(perSecond*time.Since(t0).Seconds()) + 1; ok < burst || ok > most {
		t.Fatalf("A was served %d times before a 429, want %d to %d", ok, burst, most)
	}
	check429(t, refused, "address")
	if refused.body.Error.Details["limit"] != "requestsPerSecond" || refused.retryAfter != "1" {
		t.Fatalf("refusal: Retry-After %q, %s", refused.retryAfter, refused.raw)
	}

	// A hammers from 8 goroutines for a second; B is served promptly
	// all the while.
	var hammered, limited atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("Authorization", "Bearer "+e.token)
				resp, err := a.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				hammered.Add(1)
				if resp.StatusCode == http.StatusTooManyRequests {
					limited.Add(1)
				}
			}
		}()
	}
	var slowest time.Duration
	for range 8 { // within B's own rate: 5 at once, 2 a second
		ans := fairDo(t, b, "GET", url, tokB, nil)
		if ans.status != http.StatusOK {
			close(stop)
			wg.Wait()
			t.Fatalf("B while A hammers: %d %s", ans.status, ans.raw)
		}
		slowest = max(slowest, ans.took)
		time.Sleep(250 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if slowest > 2*time.Second {
		t.Errorf("B's slowest answer while A hammered took %v", slowest)
	}
	if h, l := hammered.Load(), limited.Load(); h < 20 || l < h-10 {
		t.Errorf("A's hammering: %d requests, %d refused", h, l)
	}

	// B's token from A's address: refused by the address.
	check429(t, fairDo(t, a, "GET", url, tokB, nil), "address")
	// The token's own bucket: A's token from fresh addresses, two requests
	// from each (under an address's burst), is refused by the token.
	// (Requests an address refuses never reach the token's bucket: it
	// refilled while A hammered from one address.)
	var byToken *fairAnswer
	for _, from := range []string{"127.0.0.3", "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"} {
		cl := clientFrom(t, from)
		for range 2 {
			if ans := fairDo(t, cl, "GET", url, e.token, nil); ans.status != http.StatusOK {
				byToken = &ans
				break
			}
		}
		if byToken != nil {
			break
		}
	}
	if byToken == nil {
		t.Fatal("A's token from five addresses: never refused")
	}
	check429(t, *byToken, "token")

	// An unauthenticated flood is limited before authentication: past the
	// burst no more 401s, nor their audit records.
	c := clientFrom(t, "127.0.0.4")
	codes := map[int]int{}
	for range 30 {
		codes[fairDo(t, c, "GET", url, "nope", nil).status]++
	}
	if codes[http.StatusUnauthorized] < burst || codes[http.StatusUnauthorized] > burst+3 || codes[http.StatusTooManyRequests] < 20 {
		t.Fatalf("unauthenticated flood: %v", codes)
	}
	if err := e.db.FlushAudit(context.Background()); err != nil {
		t.Fatal(err)
	}
	recs, err := e.db.ListAudit(context.Background(), store.AuditFilter{Action: "auth"})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != codes[http.StatusUnauthorized] {
		t.Fatalf("%d auth records for %d 401s", len(recs), codes[http.StatusUnauthorized])
	}
	if n := metricValue(t, e, `sandboxd_api_requests_limited_total{reason="rate",scope="address"}`); n < 20 {
		t.Errorf("sandboxd_api_requests_limited_total{address,rate} = %v", n)
	}

	// Retry-After is honest: after it, A is served again.
	time.Sleep(time.Second)
	if ans := fairDo(t, clientFrom(t, "127.0.0.5"), "GET", url, e.token, nil); ans.status != http.StatusOK {
		t.Fatalf("A's token after Retry-After: %d %s", ans.status, ans.raw)
	}
	// /healthz is never limited.
	for range 20 {
		if ans := fairDo(t, a, "GET", "http://"+addr+"/healthz", "", nil); ans.status != http.StatusOK {
			t.Fatalf("/healthz: %d", ans.status)
		}
	}
}

// maxRequestsInFlight: requests being answered count, per address and per
// token; a WebSocket or a streaming answer stops counting once open.
func TestFairRequestsInFlight(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) { c.Limits.MaxRequestsInFlight = 2 })
	// A route that streams: flushes its headers, then waits; and one that
	// sets a write deadline as file transfers do.
	release := make(chan struct{})
	g := e.s.engine.Group("/v1", e.s.bodyLimit, e.s.authenticate, e.s.limitToken)
	g.GET("/test-deadline", func(c *gin.Context) {
		if err := http.NewResponseController(c.Writer).SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			c.String(http.StatusInternalServerError, "SetWriteDeadline: %v", err)
			return
		}
		c.Status(http.StatusNoContent)
	})
	g.GET("/test-stream", func(c *gin.Context) {
		c.Status(http.StatusOK)
		c.Writer.Flush()
		select {
		case <-release:
		case <-c.Request.Context().Done():
		}
	})
	addr, _ := serveAPI(t, e)
	base := "http://" + addr
	_, tokB := e.addMember("developer")
	a := clientFrom(t, "127.0.0.1")

	// The limiters' writers keep the connection's deadlines reachable.
	if ans := fairDo(t, clientFrom(t, "127.0.0.1"), "GET", base+"/v1/test-deadline", e.token, nil); ans.status != http.StatusNoContent {
		t.Fatalf("deadline through the limiters' writers: %d %s", ans.status, ans.raw)
	}

	// Two of A's requests in flight: provisions whose bodies do not come.
	var pws []*io.PipeWriter
	var wg sync.WaitGroup
	for i := range 2 {
		pr, pw := io.Pipe()
		pws = append(pws, pw)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", base+"/v1/sandbox", pr)
			req.Header.Set("Authorization", "Bearer "+e.token)
			resp, err := a.Do(req)
			if err != nil {
				t.Errorf("slow provision %d: %v", i, err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Errorf("slow provision %d: %d", i, resp.StatusCode)
			}
		}()
	}
	t.Cleanup(func() {
		for _, pw := range pws {
			pw.CloseWithError(errors.New("test over"))
		}
		wg.Wait()
	})
	// Once both are in, A's token from elsewhere is refused.
	deadline := time.Now().Add(5 * time.Second)
	for e.s.fair.byToken.InFlight(e.owner.TokenID) != 2 || e.s.fair.byAddr.InFlight("127.0.0.1") != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("in flight: token %d, address %d; want 2 each", e.s.fair.byToken.InFlight(e.owner.TokenID), e.s.fair.byAddr.InFlight("127.0.0.1"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	ans := fairDo(t, clientFrom(t, "127.0.0.3"), "GET", base+"/v1/me", e.token, nil)
	check429(t, ans, "token")
	if ans.body.Error.Details["limit"] != "maxRequestsInFlight" || ans.retryAfter != "1" {
		t.Fatalf("in-flight refusal: Retry-After %q %s", ans.retryAfter, ans.raw)
	}
	// A's address, another token: 429 too.
	check429(t, fairDo(t, a, "GET", base+"/v1/me", tokB, nil), "address")
	// B (its own address and token) is served at once.
	if ans := fairDo(t, clientFrom(t, "127.0.0.2"), "GET", base+"/v1/me", tokB, nil); ans.status != http.StatusOK || ans.took > 2*time.Second {
		t.Fatalf("B: %d after %v %s", ans.status, ans.took, ans.raw)
	}
	if n := metricValue(t, e, `sandboxd_api_requests_limited_total{reason="in_flight",scope="token"}`); n < 1 {
		t.Errorf("sandboxd_api_requests_limited_total{token,in_flight} = %v", n)
	}
	// The two end: A is served again.
	for i, pw := range pws {
		fmt.Fprintf(pw, `{"sessionId":"slow-%d"}`, i)
		pw.Close()
	}
	wg.Wait()
	if ans := fairDo(t, a, "GET", base+"/v1/me", e.token, nil); ans.status != http.StatusOK {
		t.Fatalf("A after its requests ended: %d %s", ans.status, ans.raw)
	}

	// Three WebSockets and two streaming answers of A's, all open: none
	// counts, so A's requests still pass.
	d := websocket.Dialer{NetDialContext: dialerFrom("127.0.0.1").DialContext}
	for range 3 {
		ws, resp, err := d.Dial("ws://"+addr+"/v1/sandbox/slow-0/logs/ws", http.Header{"Authorization": {"Bearer " + e.token}})
		if err != nil {
			t.Fatalf("WebSocket: %v %v", err, resp)
		}
		defer ws.Close()
	}
	defer close(release)
	for range 2 {
		sreq, _ := http.NewRequest("GET", base+"/v1/test-stream", nil)
		sreq.Header.Set("Authorization", "Bearer "+e.token)
		sresp, err := a.Do(sreq)
		if err != nil || sresp.StatusCode != http.StatusOK {
			t.Fatalf("stream: %v %v", sresp, err)
		}
		defer sresp.Body.Close()
	}
	for range 2 {
		if ans := fairDo(t, a, "GET", base+"/v1/me", e.token, nil); ans.status != http.StatusOK {
			t.Fatalf("A with WebSockets and a stream open: %d %s", ans.status, ans.raw)
		}
	}
}

// The portal's origins share the address limits with the API.
func TestFairPortal(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.RequestsPerSecond = 1
		c.Limits.RequestBurst = 3
	})
	host := withHost("s0123456789abcdef0123.localhost:8080")
	from := withRemote("192.0.2.77:4000")
	for i := range 3 {
		if rec := e.do("GET", "/editor/", "", nil, host, from); rec.Code != http.StatusUnauthorized {
			t.Fatalf("portal request %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	rec := e.do("GET", "/editor/", "", nil, host, from)
	check429(t, recAnswer(rec), "address")
	if rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("portal over the rate: Retry-After %q", rec.Header().Get("Retry-After"))
	}
	// The same address on the API: the same bucket.
	check429(t, recAnswer(e.do("GET", "/v1/me", e.token, nil, from)), "address")
	// Another address is served.
	if rec := e.do("GET", "/editor/", "", nil, host, withRemote("192.0.2.78:4000")); rec.Code != http.StatusUnauthorized {
		t.Fatalf("another address: %d", rec.Code)
	}
}

func withHost(h string) reqOpt { return func(r *http.Request) { r.Host = h } }

// Behind a trusted proxy, the client is the X-Forwarded-For address (as
// the audit log's), and the proxy has no per-client connection cap.
func TestFairTrustedProxy(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) {
		c.TrustedProxies = []string{"203.0.113.7", "127.0.0.1/32"}
		c.Limits.RequestsPerSecond = 1
		c.Limits.RequestBurst = 2
		c.Limits.MaxConnsPerClient = 2
		c.Limits.MaxAPIConns = 20
	})
	proxy := withRemote("203.0.113.7:41000")
	via := func(xff string) int {
		return e.do("GET", "/v1/me", e.token, nil, proxy, withHeader("X-Forwarded-For", xff)).Code
	}
	for range 2 {
		if c := via("198.51.100.1"); c != http.StatusOK {
			t.Fatalf("via proxy: %d", c)
		}
	}
	check429(t, recAnswer(e.do("GET", "/v1/me", e.token, nil, proxy, withHeader("X-Forwarded-For", "198.51.100.1"))), "address")
	for _, tc := range []struct {
		remote, xff, key string
	}{
		{"203.0.113.7:1", "198.51.100.2", "198.51.100.2"},
		{"203.0.113.7:1", "10.0.0.9, 198.51.100.3, 203.0.113.7", "198.51.100.3"}, // a trusted hop, then the client
		{"203.0.113.8:1", "198.51.100.2", "203.0.113.8"},                         // an untrusted peer's header is ignored
		{"203.0.113.7:1", "garbage", "203.0.113.7"},
		{"[2001:db8::5]:1", "198.51.100.2", "2001:db8::/64"},
	} {
		r, _ := http.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.remote
		r.Header.Set("X-Forwarded-For", tc.xff)
		if got := e.s.clientKey(r); got != tc.key {
			t.Errorf("clientKey(%s, XFF %q) = %q, want %q", tc.remote, tc.xff, got, tc.key)
		}
	}
	// Connections: the trusted peer (127.0.0.1) has no per-client cap,
	// others do.
	addr, l := serveAPI(t, e)
	for range 5 {
		keepAliveFrom(t, addr, "127.0.0.1")
	}
	for range 2 {
		keepAliveFrom(t, addr, "127.0.0.2")
	}
	waitOpen(t, l, 7)
	check429(t, fairDo(t, clientFrom(t, "127.0.0.2"), "GET", "http://"+addr+"/healthz", "", nil), "address")
}

// recAnswer is a recorded answer as fairDo's.
func recAnswer(rec *httptest.ResponseRecorder) fairAnswer {
	a := fairAnswer{status: rec.Code, retryAfter: rec.Header().Get("Retry-After"),
		requestID: rec.Header().Get("X-Request-Id"), raw: rec.Body.String()}
	json.Unmarshal(rec.Body.Bytes(), &a.body)
	return a
}

// metricValue reads one sample from /metrics (asked from an address of
// its own, so as not to use up a tested client's requests).
func metricValue(t *testing.T, e *apiEnv, name string) float64 {
	t.Helper()
	rec := e.do("GET", "/metrics", "", nil, withRemote("192.0.2.200:1"))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// The portal's writer gives the in-flight slot back when its answer
// becomes a WebSocket or streams, reached through http.ResponseController
// as the portal's proxy reaches it.
func TestFairReleaserOnStream(t *testing.T) {
	for _, op := range []string{"flush", "hijack"} {
		released := 0
		w := &releaser{ResponseWriter: &hijackable{httptest.NewRecorder()}, release: func() { released++ }}
		var sw http.ResponseWriter = &statusWriter{ResponseWriter: w}
		rc := http.NewResponseController(sw)
		var err error
		if op == "flush" {
			err = rc.Flush()
		} else {
			_, _, err = rc.Hijack()
		}
		if err != nil || released != 1 {
			t.Errorf("%s: err %v, released %d times", op, err, released)
		}
	}
}

type hijackable struct{ *httptest.ResponseRecorder }

func (h *hijackable) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, nil }
