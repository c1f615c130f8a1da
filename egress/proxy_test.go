package egress

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// blob is a deterministic body of n bytes (same seed, same bytes).
func blob(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1, 2, 3})
	_, _ = r.Read(b)
	return b
}

func blobHandler(body []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})
}

var helloHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "hello host=%s path=%s", r.Host, r.URL.Path)
})

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s body: %v", u, err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func TestAllowedPlainAndTLS(t *testing.T) {
	// The proxy must never follow the host's proxy settings.
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"} {
		t.Setenv(k, "http://127.0.0.1:9")
	}
	plain := newHTTPUpstream(t, nil, helloHandler)
	secure := newTLSUpstream(t, nil, helloHandler)
	pp, tp := portOf(t, plain.URL), portOf(t, secure.URL)
	e := newEnv(t, testConfig(pp, tp))
	c := client(e.serve("s1", 0, 1<<30))

	for _, tc := range []struct{ url, want string }{
		{fmt.Sprintf("http://allowed.test:%d/a", pp), fmt.Sprintf("hello host=allowed.test:%d path=/a", pp)},
		{fmt.Sprintf("http://ALLOWED.test.:%d/b", pp), fmt.Sprintf("hello host=allowed.test:%d path=/b", pp)},
		{fmt.Sprintf("https://allowed.test:%d/c", tp), fmt.Sprintf("hello host=allowed.test:%d path=/c", tp)},
		{fmt.Sprintf("https://a.wild.test:%d/d", tp), fmt.Sprintf("hello host=a.wild.test:%d path=/d", tp)},
		{fmt.Sprintf("https://xn--bcher-kva.test:%d/e", tp), fmt.Sprintf("hello host=xn--bcher-kva.test:%d path=/e", tp)},
	} {
		code, body, _ := get(t, c, tc.url)
		if code != 200 || body != tc.want {
			t.Errorf("GET %s = %d %q, want %q", tc.url, code, body, tc.want)
		}
	}
	if d := e.events.denials(); len(d) != 0 {
		t.Errorf("unexpected denials %+v", d)
	}
	dests := e.p.Destinations("s1")
	if d := dests["allowed.test"]; d.Connections != 3 || d.BytesIn < 100 || d.BytesOut < 100 {
		t.Errorf("allowed.test dest = %+v", d)
	}
	if d := dests["a.wild.test"]; d.Connections != 1 {
		t.Errorf("a.wild.test dest = %+v", d)
	}
	used, limit, ok := e.p.Usage("s1")
	var sum int64
	for _, d := range dests {
		sum += d.BytesIn + d.BytesOut
	}
	if !ok || limit != 1<<30 || used < sum || sum == 0 {
		t.Errorf("Usage = %d %d %v, destinations sum %d", used, limit, ok, sum)
	}
}

// A pip-like client: one large HTTPS download, verified end to end.
func TestLargeHTTPSDownload(t *testing.T) {
	body := blob(24 << 20)
	secure := newTLSUpstream(t, nil, blobHandler(body))
	e := newEnv(t, testConfig(portOf(t, secure.URL)))
	c := client(e.serve("s1", 0, 1<<30))
	resp, err := c.Get(fmt.Sprintf("https://allowed.test:%d/pkg.whl", portOf(t, secure.URL)))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	if err != nil || n != int64(len(body)) || [32]byte(h.Sum(nil)) != sha256.Sum256(body) {
		t.Fatalf("download: %d bytes, %v, hash match %v", n, err, [32]byte(h.Sum(nil)) == sha256.Sum256(body))
	}
	if used, _, _ := e.p.Usage("s1"); used < int64(len(body)) {
		t.Errorf("used %d < body %d", used, len(body))
	}
}

func TestDenied(t *testing.T) {
	plain := newHTTPUpstream(t, nil, helloHandler)
	pp := portOf(t, plain.URL)
	reg := prometheus.NewRegistry()
	pol, _ := NewPolicy(testConfig(pp))
	events := &recEvents{}
	res := newResolver()
	res.set("allowed.test", "127.0.0.1")
	p := New(pol, Options{Events: events, Resolver: res, Registerer: reg})
	t.Cleanup(p.Shutdown)
	e := &env{t: t, p: p, res: res, events: events}
	addr := e.serve("s1", 0, 1<<30)
	c := client(addr)

	code, body, hdr := get(t, c, "http://evil.test/x")
	if code != 403 || !strings.Contains(body, "not in this sandbox's egress allowlist") || hdr.Get("X-Egress-Denied") != ReasonNotAllowlisted {
		t.Errorf("plain denied: %d %q %v", code, body, hdr)
	}
	if d := events.waitDenied(t, ReasonNotAllowlisted); d != (denial{"s1", "evil.test", 80, ReasonNotAllowlisted}) {
		t.Errorf("event %+v", d)
	}
	_, err := c.Get("https://EVIL.test./")
	if err == nil || !strings.Contains(err.Error(), "Egress denied (not_allowlisted)") {
		t.Errorf("CONNECT denied: %v", err)
	}
	found := false
	for _, d := range events.denials() {
		found = found || d == (denial{"s1", "evil.test", 443, ReasonNotAllowlisted})
	}
	if !found {
		t.Errorf("no CONNECT denial event: %+v", events.denials())
	}
	if code, _, _ := get(t, c, "http://allowed.test:1/"); code != 403 {
		t.Errorf("port 1: %d", code)
	}
	events.waitDenied(t, ReasonPortNotAllowed)
	if code, _, _ := get(t, c, fmt.Sprintf("http://127.0.0.1:%d/", pp)); code != 403 {
		t.Errorf("IP literal: %d", code)
	}
	events.waitDenied(t, ReasonIPLiteral)

	// Raw requests: origin-form (not a proxy request) and https:// as a
	// plain request (the proxy never terminates TLS).
	for _, tc := range []struct {
		req    string
		status int
		reason string
	}{
		{"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, ReasonNotProxyRequest},
		{"GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 403, ReasonScheme},
		{"GET ftp://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 403, ReasonScheme},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(conn, tc.req)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != tc.status {
			t.Errorf("%q: %v %v", tc.req, resp, err)
		}
		conn.Close()
		events.waitDenied(t, tc.reason)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sandboxd_egress_denied_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if got[ReasonNotAllowlisted] != 2 || got[ReasonIPLiteral] != 1 || got[ReasonScheme] != 2 {
		t.Errorf("denied counter = %v", got)
	}
}

// TestConnectHostForms: every spelling of a host is decided on its
// normalized form; numeric IPv4 forms are IPs.
func TestConnectHostForms(t *testing.T) {
	echo := echoServer(t)
	ep := portOf(t, echo.Addr().String())
	l2, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skip("no 127.0.0.2:", err)
	}
	l2.Close()
	echo2 := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
			}
		}()
		t.Cleanup(func() { l.Close() })
		return l
	}()
	ep2 := portOf(t, echo2.Addr().String())
	e := newEnv(t, testConfig(ep, ep2))
	addr := e.serve("s1", 0, 1<<30)

	cases := []struct {
		target   string
		withHost bool
		status   int
		reason   string
		host     string
	}{
		{"127.1:443", true, 403, ReasonIPLiteral, "127.0.0.1"},
		{"0x7f000001:443", true, 403, ReasonIPLiteral, "127.0.0.1"},
		{"2130706433:443", true, 403, ReasonIPLiteral, "127.0.0.1"},
		{"0177.0.0.1:443", true, 403, ReasonIPLiteral, "127.0.0.1"},
		{"[::ffff:127.0.0.1]:443", true, 403, ReasonIPLiteral, "127.0.0.1"},
		{"[::1]:443", true, 403, ReasonIPLiteral, "::1"},
		{"169.254.169.254:80", true, 403, ReasonIPLiteral, "169.254.169.254"},
		{"allowed.test:0", true, 403, ReasonInvalidPort, ""},
		{"allowed.test:65536", true, 403, ReasonInvalidPort, ""},
		{"allowed..test:443", true, 403, ReasonInvalidHost, ""},
		{"evil.test:443", true, 403, ReasonNotAllowlisted, "evil.test"},
		// net/http itself rejects these request targets (400) before any decision.
		{"[allowed.test]:443", true, 400, "", ""},
		{"allowed.test:https", true, 400, "", ""},
		// Allowed spellings.
		{fmt.Sprintf("ALLOWED.TEST:%d", ep), true, 200, "", ""},
		{fmt.Sprintf("allowed.test.:%d", ep), true, 200, "", ""},
		{fmt.Sprintf("bücher.test:%d", ep), false, 200, "", ""},
		{fmt.Sprintf("BÜCHER.test.:%d", ep), false, 200, "", ""},
		{fmt.Sprintf("a.WILD.test:%d", ep), true, 200, "", ""},
		// 127.0.0.2 is allowlisted as an IP; its numeric forms are the same IP.
		{fmt.Sprintf("2130706434:%d", ep2), true, 200, "", ""},
		{fmt.Sprintf("0x7f.2:%d", ep2), true, 200, "", ""},
		{fmt.Sprintf("[::ffff:127.0.0.2]:%d", ep2), true, 200, "", ""},
	}
	for _, tc := range cases {
		before := len(e.events.denials())
		conn, br, resp := rawConnect(t, addr, tc.target, tc.withHost)
		if resp.StatusCode != tc.status {
			b, _ := io.ReadAll(resp.Body)
			t.Errorf("CONNECT %s: %d %q, want %d", tc.target, resp.StatusCode, b, tc.status)
			continue
		}
		if tc.status == 200 {
			_, _ = io.WriteString(conn, "ping\n")
			line, err := br.ReadString('\n')
			if err != nil || line != "ping\n" {
				t.Errorf("CONNECT %s: echo %q %v", tc.target, line, err)
			}
			conn.Close()
			continue
		}
		conn.Close()
		if tc.reason == "" {
			continue
		}
		d := e.events.waitDenied(t, tc.reason)
		if len(e.events.denials()) != before+1 || (tc.host != "" && d.host != tc.host) {
			t.Errorf("CONNECT %s: denials %+v", tc.target, e.events.denials()[before:])
		}
		e.events.mu.Lock()
		e.events.denied = nil
		e.events.mu.Unlock()
	}
}

// TestForbiddenAddresses: allowlisted names that resolve into forbidden
// space are refused at dial time, on every connection (DNS rebinding).
func TestForbiddenAddresses(t *testing.T) {
	// Upstream closes after each response, so every request dials anew.
	plain := newHTTPUpstream(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		helloHandler(w, r)
	}))
	pp := portOf(t, plain.URL)
	cfg := testConfig(pp)
	cfg.AllowNetworks = []string{"127.0.0.1/32"}
	e := newEnv(t, cfg)
	c := client(e.serve("s1", 0, 1<<30))

	e.res.set("rebind.test", "127.0.0.1")
	if code, body, _ := get(t, c, fmt.Sprintf("http://rebind.test:%d/", pp)); code != 200 {
		t.Fatalf("first resolution: %d %q", code, body)
	}
	// The name now points somewhere the guard refuses (and nothing
	// listens there): the next connection is refused, not dialed.
	e.res.set("rebind.test", "127.0.0.2")
	code, body, _ := get(t, c, fmt.Sprintf("http://rebind.test:%d/", pp))
	if code != 403 || !strings.Contains(body, ReasonForbiddenAddress) {
		t.Errorf("rebound plain: %d %q", code, body)
	}
	e.events.waitDenied(t, ReasonForbiddenAddress)
	_, err := c.Get(fmt.Sprintf("https://rebind.test:%d/", pp))
	if err == nil || !strings.Contains(err.Error(), ReasonForbiddenAddress) {
		t.Errorf("rebound CONNECT: %v", err)
	}
	for _, name := range []string{"meta.test", "mixed.test"} {
		_, err := c.Get(fmt.Sprintf("https://%s:%d/", name, pp))
		if err == nil || !strings.Contains(err.Error(), ReasonForbiddenAddress) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := c.Get(fmt.Sprintf("https://nx.wild.test:%d/", pp)); err == nil || !strings.Contains(err.Error(), "Bad Gateway") {
		t.Errorf("unresolvable name: %v", err)
	}
}

// earlyConn sends the CONNECT head in the same write as the client's
// first bytes (as some clients do) and strips the proxy's reply.
type earlyConn struct {
	net.Conn
	head  string
	sent  bool
	br    *bufio.Reader
	reply error
	once  sync.Once
}

func (c *earlyConn) Write(b []byte) (int, error) {
	if !c.sent {
		c.sent = true
		if _, err := c.Conn.Write(append([]byte(c.head), b...)); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *earlyConn) Read(b []byte) (int, error) {
	c.once.Do(func() {
		c.br = bufio.NewReader(c.Conn)
		resp, err := http.ReadResponse(c.br, &http.Request{Method: http.MethodConnect})
		if err == nil && resp.StatusCode != 200 {
			err = errors.New(resp.Status)
		}
		c.reply = err
	})
	if c.reply != nil {
		return 0, c.reply
	}
	return c.br.Read(b)
}

// slowConn writes one byte at a time (a ClientHello split into many TCP
// segments).
type slowConn struct{ net.Conn }

func (c slowConn) Write(b []byte) (int, error) {
	for i := range b {
		if _, err := c.Conn.Write(b[i : i+1]); err != nil {
			return i, err
		}
		if i%64 == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	return len(b), nil
}

func tlsGet(t *testing.T, conn net.Conn, sni string) (string, error) {
	t.Helper()
	tc := tls.Client(conn, &tls.Config{ServerName: sni, RootCAs: getCA(t).pool, InsecureSkipVerify: sni == ""})
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	if _, err := io.WriteString(tc, "GET /t HTTP/1.1\r\nHost: "+sni+"\r\nConnection: close\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestTunnelSNI on a port other than 443 (TLS is sniffed) and the early
// data case; TestTunnelPort443 covers the port-443 rules.
func TestTunnelSNI(t *testing.T) {
	secure := newTLSUpstream(t, nil, helloHandler)
	tp := portOf(t, secure.URL)
	e := newEnv(t, testConfig(tp))
	addr := e.serve("s1", 0, 1<<30)
	target := fmt.Sprintf("allowed.test:%d", tp)

	conn, br, resp := rawConnect(t, addr, target, true)
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	if _, err := tlsGet(t, &bufConn{conn, br}, "evil.test"); err == nil {
		t.Error("SNI evil.test went through")
	}
	if d := e.events.waitDenied(t, ReasonSNIMismatch); d.host != "allowed.test" || d.port != tp {
		t.Errorf("event %+v", d)
	}

	// CONNECT head and ClientHello in one write: the bytes the HTTP
	// server buffered must still be inspected and forwarded.
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	body, err := tlsGet(t, &earlyConn{Conn: raw, head: "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n"}, "allowed.test")
	if err != nil || !strings.HasPrefix(body, "hello host=allowed.test") {
		t.Errorf("early ClientHello: %q %v", body, err)
	}
	raw2, _ := net.Dial("tcp", addr)
	defer raw2.Close()
	if _, err := tlsGet(t, &earlyConn{Conn: raw2, head: "CONNECT " + target + " HTTP/1.1\r\n\r\n"}, "evil.test"); err == nil {
		t.Error("early ClientHello with SNI evil.test went through")
	}
}

func TestTunnelPort443(t *testing.T) {
	l, ip := listenPrivileged(t, 443)
	newTLSUpstream(t, l, helloHandler)
	e := newEnv(t, testConfig())
	e.res.set("tls443.test", ip)
	addr := e.serve("s1", 0, 1<<30)
	c := client(addr)

	if code, body, _ := get(t, c, "https://tls443.test/x"); code != 200 || body != "hello host=tls443.test path=/x" {
		t.Errorf("good SNI: %d %q", code, body)
	}
	connect := func() net.Conn {
		conn, br, resp := rawConnect(t, addr, "tls443.test:443", true)
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		return &bufConn{conn, br}
	}
	// ClientHello dribbled one byte per segment: reassembled and allowed.
	if body, err := tlsGet(t, slowConn{connect()}, "tls443.test"); err != nil || body != "hello host=tls443.test path=/t" {
		t.Errorf("fragmented hello: %q %v", body, err)
	}
	if _, err := tlsGet(t, connect(), "evil.test"); err == nil {
		t.Error("SNI mismatch went through")
	}
	e.events.waitDenied(t, ReasonSNIMismatch)
	if _, err := tlsGet(t, connect(), ""); err == nil {
		t.Error("missing SNI went through")
	}
	e.events.waitDenied(t, ReasonSNIMissing)

	for _, tc := range []struct{ send, reason string }{
		{"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", ReasonHTTPInTunnel},
		{"GET / HTTP/1.1\r\nHost: tls443.test\r\n\r\n", ReasonHTTPInTunnel},
		{"\x00\x01garbage\r\n\r\n", ReasonNotTLS},
		{"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00", ReasonBadHello},
	} {
		conn := connect()
		_, _ = io.WriteString(conn, tc.send)
		if n, err := conn.Read(make([]byte, 1)); err == nil {
			t.Errorf("%q: tunnel answered %d bytes", tc.send, n)
		}
		e.events.waitDenied(t, tc.reason)
	}
}

func TestTunnelHostRule(t *testing.T) {
	// Sniffed port: an HTTP request inside a tunnel must name the CONNECT host.
	plain := newHTTPUpstream(t, nil, helloHandler)
	pp := portOf(t, plain.URL)
	e := newEnv(t, testConfig(pp))
	addr := e.serve("s1", 0, 1<<30)
	exchange := func(target, req string) (string, error) {
		conn, br, resp := rawConnect(t, addr, target, true)
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		_, _ = io.WriteString(conn, req)
		r, err := http.ReadResponse(br, nil)
		if err != nil {
			return "", err
		}
		b, err := io.ReadAll(r.Body)
		return string(b), err
	}
	target := fmt.Sprintf("allowed.test:%d", pp)
	if body, err := exchange(target, "GET /ok HTTP/1.1\r\nHost: "+target+"\r\nConnection: close\r\n\r\n"); err != nil || !strings.Contains(body, "path=/ok") {
		t.Errorf("right Host: %q %v", body, err)
	}
	if _, err := exchange(target, "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"); err == nil {
		t.Error("Host mismatch went through")
	}
	e.events.waitDenied(t, ReasonHostMismatch)
	if _, err := exchange(target, "GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"); err == nil {
		t.Error("absolute-form went through")
	}
	e.events.waitDenied(t, ReasonAbsoluteForm)

	// Port 80: HTTP is required.
	l, ip := listenPrivileged(t, 80)
	newHTTPUpstream(t, l, helloHandler)
	e.res.set("h80.test", ip)
	if body, err := exchange("h80.test:80", "GET /ok HTTP/1.1\r\nHost: h80.test\r\nConnection: close\r\n\r\n"); err != nil || body != "hello host=h80.test path=/ok" {
		t.Errorf("port 80 right Host: %q %v", body, err)
	}
	for _, tc := range []struct{ send, reason string }{
		{"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", ReasonHostMismatch},
		{"GET / HTTP/1.0\r\n\r\n", ReasonHostMismatch},
		{"GET http://h80.test/ HTTP/1.1\r\nHost: h80.test\r\n\r\n", ReasonAbsoluteForm},
		{string(clientHello(t, "h80.test")), ReasonNotHTTP},
		{"GARBAGE\x00\r\n\r\n", ReasonNotHTTP},
	} {
		e.events.mu.Lock()
		e.events.denied = nil
		e.events.mu.Unlock()
		if _, err := exchange("h80.test:80", tc.send); err == nil {
			t.Errorf("%q went through", tc.send)
		}
		e.events.waitDenied(t, tc.reason)
	}
}

// Idle upstream connections of plain HTTP are bounded per session: one
// client connection asking many wildcard hosts holds few of them.
func TestIdleUpstreamsBounded(t *testing.T) {
	var open atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	up.Config.ConnState = func(c net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	port := portOf(t, up.URL)
	e := newEnv(t, testConfig(port))
	addr := e.serve("s1", 0, 1<<30)
	c := client(addr)
	for i := 0; i < 60; i++ {
		name := fmt.Sprintf("h%d.wild.test", i)
		e.res.set(name, "127.0.0.1")
		if code, _, _ := get(t, c, fmt.Sprintf("http://%s:%d/", name, port)); code != 200 {
			t.Fatalf("%s: %d", name, code)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for open.Load() > 8 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := open.Load(); n > 8 {
		t.Errorf("%d upstream connections held open for one client", n)
	}
}

// A plain GET with a body is refused: an upstream that ignores GET bodies
// would read it as a second request, one the proxy never decided.
func TestPlainBodilessMethodWithBody(t *testing.T) {
	var paths []string
	var mu sync.Mutex
	up := newHTTPUpstream(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.Host+r.URL.Path)
		mu.Unlock()
	}))
	port := portOf(t, up.URL)
	e := newEnv(t, testConfig(port))
	addr := e.serve("s1", 0, 1<<30)
	hidden := "GET /smuggled HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET http://allowed.test:%d/a HTTP/1.1\r\nHost: allowed.test:%d\r\nContent-Length: %d\r\n\r\n%s", port, port, len(hidden), hidden)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 403 || resp.Header.Get("X-Egress-Denied") != ReasonHTTPFraming {
		t.Errorf("GET with a body: %s %v", resp.Status, resp.Header)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 0 {
		t.Errorf("upstream served %v", paths)
	}
}

// A plain request refused at dial time leaves no per-host record.
func TestDestinationsOnlyAfterAnswer(t *testing.T) {
	e := newEnv(t, testConfig())
	addr := e.serve("s1", 0, 1<<30)
	if code, _, _ := get(t, client(addr), "http://meta.test/latest/meta-data/"); code != 403 {
		t.Fatalf("metadata name: %d", code)
	}
	e.events.waitDenied(t, ReasonForbiddenAddress)
	if d, ok := e.p.Destinations("s1")["meta.test"]; ok {
		t.Errorf("refused destination recorded: %+v", d)
	}
	if used, _, _ := e.p.Usage("s1"); used == 0 {
		t.Error("the refused request's bytes were not counted")
	}
}

// TestZoneHostShown: an IPv6 literal with a zone id is invalid; the
// refusal and its event show it once bracketed (with the port) and the
// event's host unbracketed, like every other IPv6 host.
func TestZoneHostShown(t *testing.T) {
	e := newEnv(t, testConfig())
	addr := e.serve("s1", 0, 1<<30)
	for _, tc := range []struct{ method, line, body, host string }{
		{"GET", "GET http://[fe80::1%25eth0]:81/ HTTP/1.1\r\nHost: [fe80::1%25eth0]:81\r\n", `"[fe80::1%eth0]:81" is not a valid host name`, "fe80::1%eth0"},
		{"CONNECT", "CONNECT [fe80::1%25eth0]:443 HTTP/1.1\r\nHost: [fe80::1%25eth0]:443\r\n", `"[fe80::1%25eth0]:443" is not a valid host name`, "fe80::1%25eth0"},
	} {
		e.events.mu.Lock()
		e.events.denied = nil
		e.events.mu.Unlock()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, tc.line+"\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: tc.method})
		if err != nil {
			t.Fatalf("%s: %v", tc.method, err)
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), tc.body) || strings.Contains(string(b), "[[") {
			t.Errorf("%s: %d %q, want 403 with %q", tc.method, resp.StatusCode, b, tc.body)
		}
		if d := e.events.waitDenied(t, ReasonInvalidHost); d.host != tc.host {
			t.Errorf("%s: denial host %q, want %q", tc.method, d.host, tc.host)
		}
	}
}
