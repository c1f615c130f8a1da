package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/gorilla/websocket"

	"sandboxd/server/portal"
	"sandboxd/store"
)

// startUpstream copies testdata/portal_upstream.py into a sandbox, makes a
// file of size bytes for downloads, starts the server on port and waits
// until it answers inside the sandbox. It returns the file's sha256.
func (h *harness) startUpstream(id string, port, size int) string {
	h.t.Helper()
	src, err := os.ReadFile("testdata/portal_upstream.py")
	if err != nil {
		h.t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString(src)
	r := h.sh(id, fmt.Sprintf(`echo %s | base64 -d > /workspace/up.py && head -c %d /dev/urandom > /workspace/big-%d.bin && sha256sum /workspace/big-%d.bin | cut -c1-64 &&
setsid python3 /workspace/up.py %d >/tmp/up-%d.log 2>&1 < /dev/null &
for i in $(seq 100); do curl -fs 127.0.0.1:%d/headers >/dev/null && exit 0; sleep 0.1; done; cat /tmp/up-%d.log; exit 1`, b64, size, port, port, port, port, port, port))
	if r.ExitCode != 0 {
		h.t.Fatalf("upstream did not start: %+v", r)
	}
	return strings.TrimSpace(r.Stdout)
}

// rawGet sends a GET of path exactly as written (no cleaning, no
// re-encoding) with the owner's token.
func (h *harness) rawGet(path string) (*http.Response, []byte) {
	h.t.Helper()
	req, _ := http.NewRequest("GET", h.ts.URL, nil)
	req.URL.Opaque = "//" + strings.TrimPrefix(h.ts.URL, "http://") + path
	req.Header.Set("Authorization", "Bearer "+h.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return res, readAll(h.t, res)
}

// newToken makes another token of the owner.
func (h *harness) newToken(name string) (tok struct{ ID, Token string }) {
	h.t.Helper()
	code, b := h.call(h.token, "POST", "/v1/tokens", map[string]any{"name": name})
	if json.Unmarshal(b, &tok); code != http.StatusCreated || tok.Token == "" {
		h.t.Fatalf("token: %d %s", code, b)
	}
	return tok
}

// portalClient reaches any host name (the portal's *.localhost) at the test
// server's address, keeping the Host header; it keeps cookies and does not
// follow redirects.
func (h *harness) portalClient() *http.Client {
	addr := strings.TrimPrefix(h.ts.URL, "http://")
	jar, _ := cookiejar.New(nil)
	return &http.Client{
		Jar: jar,
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       2 * time.Minute,
	}
}

func (h *harness) proxyReq(token, method, path string, body io.Reader, hdr http.Header) *http.Response {
	h.t.Helper()
	req, _ := http.NewRequest(method, h.ts.URL+path, body)
	for k, v := range hdr {
		req.Header[k] = v
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := h.portalClient().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return res
}

func readAll(t testing.TB, res *http.Response) []byte {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRealPortalPort(t *testing.T) {
	h := startServer(t, realConfig(t))
	const id = "portal-port"
	sb := h.provision(id, "standard-2")
	base := "/v1/sandbox/proxy/" + id
	if sb.URLs["editor"] != h.ts.URL+base+"/editor/" || !strings.HasPrefix(sb.URLs["terminal"], "ws://") ||
		!strings.HasSuffix(sb.URLs["portal"], ".localhost:"+strings.Split(h.ts.URL, ":")[2]+"/") {
		t.Errorf("urls = %v", sb.URLs)
	}
	const size = 64 << 20
	sum := h.startUpstream(id, 8000, size)

	t.Run("headers", func(t *testing.T) {
		res := h.proxyReq(h.token, "GET", base+"/port/8000/headers?q=1", nil,
			http.Header{"Cookie": {portal.CookieName + "=stolen; app=1"}, "X-Forwarded-For": {"6.6.6.6"}})
		b := readAll(t, res)
		var got struct {
			Path    string
			Headers map[string]string
		}
		json.Unmarshal(b, &got)
		if res.StatusCode != 200 || got.Path != "/headers?q=1" {
			t.Fatalf("%d %s", res.StatusCode, b)
		}
		if got.Headers["Authorization"] != "" || strings.Contains(got.Headers["Cookie"], portal.CookieName) || got.Headers["Cookie"] != "app=1" {
			t.Errorf("upstream saw credentials: %v", got.Headers)
		}
		if strings.Contains(got.Headers["X-Forwarded-For"], "6.6.6.6") {
			t.Errorf("client's X-Forwarded-For passed: %v", got.Headers)
		}
		if res.Header.Get("Content-Security-Policy") != "sandbox" {
			t.Errorf("API-origin answer without CSP sandbox: %v", res.Header)
		}
	})
	t.Run("download and range", func(t *testing.T) {
		res := h.proxyReq(h.token, "GET", base+"/port/8000/big", nil, nil)
		hs := sha256.New()
		n, err := io.Copy(hs, res.Body)
		res.Body.Close()
		if err != nil || n != size || hex.EncodeToString(hs.Sum(nil)) != sum {
			t.Fatalf("download: %d bytes, err %v", n, err)
		}
		res = h.proxyReq(h.token, "GET", base+"/port/8000/big", nil, http.Header{"Range": {"bytes=1000-1999"}})
		b := readAll(t, res)
		if res.StatusCode != http.StatusPartialContent || len(b) != 1000 || res.Header.Get("Content-Range") != fmt.Sprintf("bytes 1000-1999/%d", size) {
			t.Errorf("range: %d %d %v", res.StatusCode, len(b), res.Header)
		}
	})
	t.Run("upload", func(t *testing.T) {
		data := make([]byte, 48<<20)
		rand.Read(data)
		want := sha256.Sum256(data)
		for _, chunked := range []bool{false, true} {
			var body io.Reader = bytes.NewReader(data)
			if chunked {
				body = io.MultiReader(body) // unknown length: sent chunked
			}
			res := h.proxyReq(h.token, "POST", base+"/port/8000/upload", body, nil)
			b := readAll(t, res)
			var got struct {
				Bytes  int
				Sha256 string
			}
			json.Unmarshal(b, &got)
			if got.Bytes != len(data) || got.Sha256 != hex.EncodeToString(want[:]) {
				t.Errorf("upload (chunked %v): %d %s", chunked, res.StatusCode, b)
			}
		}
	})
	t.Run("chunked and SSE stream as they come", func(t *testing.T) {
		res := h.proxyReq(h.token, "GET", base+"/port/8000/chunked", nil, nil)
		if b := readAll(t, res); string(b) != "chunk-0\nchunk-1\nchunk-2\nchunk-3\nchunk-4\n" {
			t.Errorf("chunked: %q", b)
		}
		t0 := time.Now()
		res = h.proxyReq(h.token, "GET", base+"/port/8000/events", nil, nil)
		defer res.Body.Close()
		br := bufio.NewReader(res.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "data: tick 0\n" {
			t.Fatalf("first event: %q %v", line, err)
		}
		if d := time.Since(t0); d > 900*time.Millisecond {
			t.Errorf("first event after %v: buffered, not streamed", d)
		}
		rest, _ := io.ReadAll(br)
		if !strings.Contains(string(rest), "data: tick 2") {
			t.Errorf("rest: %q", rest)
		}
	})
	t.Run("websocket", func(t *testing.T) {
		u := "ws" + strings.TrimPrefix(h.ts.URL, "http") + base + "/port/8000/ws"
		c, _, err := websocket.DefaultDialer.Dial(u, http.Header{"Authorization": {"Bearer " + h.token}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := range 3 {
			c.WriteMessage(websocket.TextMessage, []byte(fmt.Sprint("hi ", i)))
			_, m, err := c.ReadMessage()
			if err != nil || string(m) != fmt.Sprint("echo: hi ", i) {
				t.Fatalf("echo: %q %v", m, err)
			}
		}
	})
	t.Run("websocket cut when its token is revoked", func(t *testing.T) {
		h.s.wsGuard.Store(int64(100 * time.Millisecond))
		tok := h.newToken("ws")
		u := "ws" + strings.TrimPrefix(h.ts.URL, "http") + base + "/port/8000/ws"
		c, _, err := websocket.DefaultDialer.Dial(u, http.Header{"Authorization": {"Bearer " + tok.Token}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if code, b := h.call(h.token, "DELETE", "/v1/tokens/"+tok.ID, nil); code >= 300 {
			t.Fatalf("revoke: %d %s", code, b)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := c.ReadMessage(); err == nil || strings.Contains(err.Error(), "timeout") {
			t.Errorf("socket still open after the revoke: %v", err)
		}
	})
	t.Run("a ticket is not passed on", func(t *testing.T) {
		res := h.proxyReq(h.token, "GET", base+"/port/8000/headers?ticket=tkt_abc&q=1", nil, nil)
		if b := readAll(t, res); !bytes.Contains(b, []byte(`"path": "/headers?q=1"`)) {
			t.Errorf("upstream saw: %s", b)
		}
	})
	t.Run("a broken-off answer stays broken", func(t *testing.T) {
		res := h.proxyReq(h.token, "GET", base+"/port/8000/cut", nil, nil)
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err == nil || bytes.Contains(b, []byte(`"error"`)) {
			t.Errorf("read %q, err %v: a truncated answer must not look complete", b, err)
		}
	})
	t.Run("a stream ends when its token is revoked", func(t *testing.T) {
		h.s.wsGuard.Store(int64(100 * time.Millisecond))
		tok := h.newToken("sse")
		res := h.proxyReq(tok.Token, "GET", base+"/port/8000/events?n=30", nil, nil)
		defer res.Body.Close()
		br := bufio.NewReader(res.Body)
		if line, err := br.ReadString('\n'); err != nil || line != "data: tick 0\n" {
			t.Fatalf("first event: %q %v", line, err)
		}
		h.call(h.token, "DELETE", "/v1/tokens/"+tok.ID, nil)
		t0 := time.Now()
		rest, _ := io.ReadAll(br)
		if d := time.Since(t0); d > 5*time.Second || bytes.Contains(rest, []byte("tick 29")) {
			t.Errorf("stream went on for %v after the revoke: %q", d, rest)
		}
	})
	t.Run("redirects stay under the prefix", func(t *testing.T) {
		res := h.proxyReq(h.token, "GET", base+"/port/8000/redirect", nil, nil)
		res.Body.Close()
		if loc := res.Header.Get("Location"); loc != base+"/port/8000/target?x=1" {
			t.Errorf("Location = %q", loc)
		}
		res = h.proxyReq(h.token, "GET", base+"/port/8000", nil, nil)
		res.Body.Close()
		if loc := res.Header.Get("Location"); res.StatusCode != http.StatusFound || loc != base+"/port/8000/" {
			t.Errorf("no slash: %d %q", res.StatusCode, loc)
		}
	})
	t.Run("path tricks stay on the port", func(t *testing.T) {
		h.startUpstream(id, 8001, 1)
		for _, p := range []string{
			"/port/8000/..%2f..%2fport%2f8001/echo/x", "/port/8000/%2e%2e/%2e%2e/port/8001/echo/x",
			"/port/8000/../../port/8001/echo/x", "/port/8000/%252e%252e/port/8001/echo/x",
		} {
			res, b := h.rawGet(base + p)
			var got struct{ Port int }
			json.Unmarshal(b, &got)
			// Port 8000's server answers (200 with its port, or its own 404
			// naming it); port 8001's never does.
			if got.Port != 8000 && !strings.Contains(string(b), "on port 8000") {
				t.Errorf("%s: %d %s: not port 8000's answer", p, res.StatusCode, b)
			}
		}
		for p, want := range map[string]int{
			"/port/8002/":           http.StatusBadGateway,
			"/port/99999/":          http.StatusNotFound,
			"/port/80%2f..%2f8001/": http.StatusNotFound,
			"/ports/8000/":          http.StatusNotFound,
			"/../../sandbox":        http.StatusNotFound,
		} {
			res, b := h.rawGet(base + p)
			if res.StatusCode != want {
				t.Errorf("%s: %d %s, want %d", p, res.StatusCode, b, want)
			}
		}
	})
	t.Run("access", func(t *testing.T) {
		_, other, err := h.s.db.CreateOrg(context.Background(), "portal-other", "owner-o")
		if err != nil {
			t.Fatal(err)
		}
		p, _ := h.s.db.Authenticate(context.Background(), h.token)
		_, _, viewer, err := h.s.db.AddMember(context.Background(), p.Org.ID, "viewer-p", store.RoleViewer)
		if err != nil {
			t.Fatal(err)
		}
		for tok, want := range map[string]int{"": 401, "nope": 401, other: 404, viewer: 403} {
			res := h.proxyReq(tok, "GET", base+"/port/8000/headers", nil, nil)
			b := readAll(t, res)
			if res.StatusCode != want || bytes.Contains(b, []byte(`"headers"`)) {
				t.Errorf("token %q: %d %s, want %d", tok, res.StatusCode, b, want)
			}
		}
	})
	t.Run("portal origin", func(t *testing.T) { portalOriginChecks(t, h, id) })
	t.Run("in a browser", func(t *testing.T) {
		page, err := os.ReadFile("testdata/portal_client.html")
		if err != nil {
			t.Fatal(err)
		}
		if r := h.sh(id, "mkdir -p /workspace/static && echo "+base64.StdEncoding.EncodeToString(page)+" | base64 -d > /workspace/static/client.html"); r.ExitCode != 0 {
			t.Fatal(r)
		}
		ctx := newBrowser(t)
		h.signIn(t, ctx, id, "/port/8000/static/client.html")
		waitFor(t, ctx, "streams", `document.body.dataset.done === "1"`, 2*time.Minute)
		out, err := get(ctx, 10*time.Second, chromedp.Text(chromedp.ID("out")))
		if err != nil {
			t.Fatal(err)
		}
		screenshot(t, ctx, "portal-port-streams")
		var r struct {
			Download struct {
				Bytes  int
				Sha256 string
				Ms     int
			}
			SSE []string
			WS  string
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if r.Download.Bytes != size || r.Download.Sha256 != sum || len(r.SSE) != 3 || r.SSE[2] != "tick 2" || r.WS != "echo: from the browser" {
			t.Errorf("in the browser: %s", out)
		}
		t.Logf("browser: %d MiB in %d ms through the portal origin", r.Download.Bytes>>20, r.Download.Ms)
	})

	// A stopped session answers at once with a clear error.
	if code, b := h.call(h.token, "POST", "/v1/sandbox/"+id+"/teardown", nil); code != 200 {
		t.Fatalf("teardown: %d %s", code, b)
	}
	res := h.proxyReq(h.token, "GET", base+"/port/8000/headers", nil, nil)
	if b := readAll(t, res); res.StatusCode != http.StatusConflict || !bytes.Contains(b, []byte("resume")) {
		t.Errorf("stopped: %d %s", res.StatusCode, b)
	}
	h.s.db.FlushAudit(context.Background())
	if code, b := h.call(h.token, "GET", "/v1/audit?action=portal.open", nil); code != 200 ||
		!bytes.Contains(b, []byte(`"via":"api"`)) {
		t.Errorf("portal.open audit records: %d %s", code, b)
	}
}

// portalOriginChecks: the ticket, the cookie and the origin rules.
func portalOriginChecks(t *testing.T, h *harness, id string) {
	ticket := func(session string) string {
		code, b := h.call(h.token, "POST", "/v1/sandbox/"+session+"/tickets", nil)
		if code != http.StatusCreated {
			t.Fatalf("ticket: %d %s", code, b)
		}
		var r struct{ Ticket string }
		json.Unmarshal(b, &r)
		return r.Ticket
	}
	cl := h.portalClient()
	get := func(u string, hdr http.Header) (*http.Response, []byte) {
		req, _ := http.NewRequest("GET", u, nil)
		for k, v := range hdr {
			req.Header[k] = v
		}
		res, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return res, readAll(t, res)
	}
	tk := ticket(id)
	// The API route sends a browser with a ticket to the portal origin.
	res, _ := get(h.ts.URL+"/v1/sandbox/proxy/"+id+"/port/8000/headers?ticket="+tk+"&a=b", nil)
	loc, _ := url.Parse(res.Header.Get("Location"))
	if res.StatusCode != http.StatusSeeOther || loc == nil || !strings.HasSuffix(loc.Hostname(), ".localhost") || loc.Path != loginPath {
		t.Fatalf("redirect: %d %v", res.StatusCode, res.Header)
	}
	origin := loc.Scheme + "://" + loc.Host
	// The login answers a page of the portal origin that goes on to next,
	// so the next request is the origin's own (same-origin).
	res, b := get(loc.String(), nil)
	sc := res.Header.Get("Set-Cookie")
	if res.StatusCode != http.StatusOK || !strings.Contains(html.UnescapeString(string(b)), `content="0;url=/port/8000/headers?a=b"`) ||
		!strings.Contains(sc, "HttpOnly") || !strings.Contains(sc, "SameSite=Lax") || strings.Contains(strings.ToLower(sc), "domain=") {
		t.Fatalf("login: %d %v %s", res.StatusCode, res.Header, b)
	}
	res, b = get(origin+"/port/8000/headers?a=b", nil)
	if res.StatusCode != 200 || bytes.Contains(b, []byte(portal.CookieName)) {
		t.Fatalf("with the cookie: %d %s", res.StatusCode, b)
	}
	if res.Header.Get("Cross-Origin-Resource-Policy") != "same-origin" || !strings.Contains(res.Header.Get("Content-Security-Policy"), "frame-ancestors") {
		t.Errorf("portal answer headers: %v", res.Header)
	}
	// The sandbox cannot replace the portal cookie.
	res, _ = get(origin+"/port/8000/setcookie", nil)
	if cs := res.Header.Values("Set-Cookie"); len(cs) != 1 || !strings.HasPrefix(cs[0], "app=1") {
		t.Errorf("Set-Cookie passed: %q", cs)
	}
	// A replayed ticket fails.
	if res, _ := get(loc.String(), nil); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("replayed ticket: %d", res.StatusCode)
	}
	// A page of another origin (another session's portal) is refused,
	// WebSockets included.
	for _, hdr := range []http.Header{
		{"Origin": {"http://s0000000000000000000a.localhost:1"}},
		{"Sec-Fetch-Site": {"same-site"}, "Sec-Fetch-Mode": {"cors"}},
		{"Sec-Fetch-Site": {"same-site"}, "Sec-Fetch-Mode": {"navigate"}, "Sec-Fetch-Dest": {"iframe"}},
		{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"navigate"}, "Sec-Fetch-Dest": {"document"}},
		{"Referer": {"http://s0000000000000000000a.localhost:1/evil"}},
		{"Origin": {"null"}},
	} {
		if res, b := get(origin+"/port/8000/headers", hdr); res.StatusCode != http.StatusForbidden {
			t.Errorf("cross-origin %v: %d %s", hdr, res.StatusCode, b)
		}
	}
	// The one-click page after a cross-site link goes on to this origin's
	// page, never to another site's (//evil.example/login).
	navigate := http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"navigate"}, "Sec-Fetch-Dest": {"document"}}
	if res, b := get(origin+"/port/8000/headers?x=1", navigate); res.StatusCode != http.StatusForbidden || !bytes.Contains(b, []byte(`href="/port/8000/headers?x=1"`)) {
		t.Errorf("cross-site navigation: %d %s", res.StatusCode, b)
	}
	if res, b := get(origin+"//evil.example/login", navigate); res.StatusCode != http.StatusForbidden || bytes.Contains(b, []byte(`href="//`)) || !bytes.Contains(b, []byte(`href="/"`)) {
		t.Errorf("cross-site navigation to //evil.example/login: %d %s", res.StatusCode, b)
	}
	// The API takes no cookie; the portal origin serves no API.
	u, _ := url.Parse(h.ts.URL)
	for _, c := range cl.Jar.Cookies(loc) {
		cl.Jar.SetCookies(u, []*http.Cookie{{Name: c.Name, Value: c.Value}})
	}
	if res, _ := get(h.ts.URL+"/v1/sandbox/"+id, nil); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("API with the portal cookie: %d", res.StatusCode)
	}
	if res, b := get(origin+"/v1/sandbox/"+id, nil); res.StatusCode != http.StatusNotFound || bytes.Contains(b, []byte(`"sessionId"`)) {
		t.Errorf("API on the portal origin: %d %s", res.StatusCode, b)
	}
	// The cookie is worth nothing on another session's portal origin, and a
	// ticket of this session cannot sign in there.
	other := strings.Replace(origin, loc.Hostname(), portal.SessionKey("x", "y")+".localhost", 1)
	req, _ := http.NewRequest("GET", other+"/port/8000/headers", nil)
	for _, c := range cl.Jar.Cookies(loc) {
		req.AddCookie(c)
	}
	if res, err := cl.Do(req); err != nil {
		t.Fatal(err)
	} else if readAll(t, res); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("cookie on another portal origin: %v", res.StatusCode)
	}
	if res, _ := get(other+loginPath+"?ticket="+ticket(id)+"&next=/", nil); res.StatusCode != http.StatusForbidden {
		t.Errorf("ticket on another portal origin: %d", res.StatusCode)
	}
	// Open redirects are not.
	res, b = get(origin+loginPath+"?ticket="+ticket(id)+"&next=//evil.example/", nil)
	if !strings.Contains(string(b), `content="0;url=/"`) {
		t.Errorf("next=//evil: %s", b)
	}
	h.s.db.FlushAudit(context.Background())
	if code, b := h.call(h.token, "GET", "/v1/audit?action=portal.open", nil); code != 200 ||
		!bytes.Contains(b, []byte(`"via":"browser"`)) || !bytes.Contains(b, []byte(`"outcome":"denied"`)) {
		t.Errorf("portal.open audit records: %d %s", code, b)
	}
}

// A page served by one sandbox attacks the user in a real browser that is
// signed in to the API (a console's token in the API origin's storage) and
// to another sandbox's portal. Nothing may work.
func TestRealPortalHostilePage(t *testing.T) {
	// On *.localhost Chromium treats every portal origin as a site of its
	// own. On a real wildcard domain they are one site: sbx.test, resolved
	// by the browser to loopback, and treated as secure (as https would
	// be) so that the browser sends Fetch Metadata.
	for _, domain := range []string{"localhost", "sbx.test"} {
		t.Run(domain, func(t *testing.T) { hostilePage(t, domain) })
	}
}

func hostilePage(t *testing.T, domain string) {
	cfg := realConfig(t)
	cfg.Portal.Domain = domain
	h := startServer(t, cfg)
	h.provision("hostile-a", "standard-1")
	h.provision("victim-b", "standard-1")
	h.startUpstream("hostile-a", 8000, 1)
	h.startUpstream("victim-b", 8000, 1)
	page, err := os.ReadFile("testdata/portal_hostile.html")
	if err != nil {
		t.Fatal(err)
	}
	if r := h.sh("hostile-a", "mkdir -p /workspace/static && echo "+base64.StdEncoding.EncodeToString(page)+" | base64 -d > /workspace/static/evil.html"); r.ExitCode != 0 {
		t.Fatal(r)
	}
	ticket := func(session string) string {
		code, b := h.call(h.token, "POST", "/v1/sandbox/"+session+"/tickets", nil)
		var r struct{ Ticket string }
		if json.Unmarshal(b, &r); code != http.StatusCreated {
			t.Fatalf("ticket: %d %s", code, b)
		}
		return r.Ticket
	}
	port := strings.Split(h.ts.URL, ":")[2]
	var flags []chromedp.ExecAllocatorOption
	if domain != "localhost" {
		org := h.get("hostile-a").OrgID
		var secure []string
		for _, id := range []string{"hostile-a", "victim-b"} {
			secure = append(secure, "http://"+portal.SessionKey(org, id)+"."+domain+":"+port)
		}
		flags = append(flags, chromedp.Flag("host-resolver-rules", "MAP *."+domain+" 127.0.0.1"),
			chromedp.Flag("unsafely-treat-insecure-origin-as-secure", strings.Join(secure, ",")))
	}
	ctx := newBrowser(t, flags...)
	// The console keeps its token in the API origin's storage.
	if err := do(ctx, 30*time.Second, chromedp.Navigate(h.ts.URL+"/healthz"),
		chromedp.Evaluate[chromedp.Void](`localStorage.setItem("sandboxd.token", `+strconv.Quote(h.token)+`)`)); err != nil {
		t.Fatal(err)
	}
	// Signed in to the victim's portal.
	if err := do(ctx, 60*time.Second,
		chromedp.Navigate(h.ts.URL+"/v1/sandbox/proxy/victim-b/port/8000/page?ticket="+ticket("victim-b")),
		chromedp.WaitVisible(chromedp.ID("h"))); err != nil {
		t.Fatal(err)
	}
	victim, err := get(ctx, 10*time.Second, chromedp.Evaluate[string](`location.origin`))
	if err != nil {
		t.Fatal(err)
	}
	// Then opens the hostile sandbox's page.
	evil := "/v1/sandbox/proxy/hostile-a/port/8000/static/evil.html?ticket=" + ticket("hostile-a") +
		"&api=" + url.QueryEscape(h.ts.URL) + "&victim=" + url.QueryEscape(victim)
	if err := do(ctx, 60*time.Second, chromedp.Navigate(h.ts.URL+evil),
		chromedp.WaitVisible(chromedp.CSS(`body[data-done="1"]`))); err != nil {
		t.Fatal(err)
	}
	out, err := get(ctx, 10*time.Second, chromedp.Text(chromedp.ID("out")))
	if err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "portal-hostile-page-"+domain)
	var r map[string]string
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("results: %v\n%s", err, out)
	}
	t.Logf("hostile page results: %s", out)
	for k, v := range r {
		if strings.Contains(v, "READ") || strings.Contains(v, "ECHO") || strings.Contains(v, h.token) {
			t.Errorf("%s worked: %s", k, v)
		}
	}
	if r["consoleToken"] != "none" {
		t.Errorf("console token: %q", r["consoleToken"])
	}
	if strings.Contains(r["portalCookieVisible"], "v1.") {
		t.Errorf("the portal cookie is readable by script: %q", r["portalCookieVisible"])
	}
	// Not even a request reached the victim's sandbox from the hostile page.
	// (One /headers is the start-up check, one /page the sign-in.)
	if log := h.sh("victim-b", "cat /tmp/access-8000.log").Stdout; strings.Contains(log, "/ws") ||
		strings.Contains(log, "site=same-site") || strings.Contains(log, "site=cross-site") ||
		strings.Count(log, "GET /headers") != 1 || strings.Contains(log, "via=") {
		t.Errorf("the victim's server was reached:\n%s", log)
	}
	if code, _ := h.call(h.token, "GET", "/v1/sandbox/created-by-hostile-page", nil); code != http.StatusNotFound {
		t.Errorf("the hostile page created a sandbox: %d", code)
	}
	// The victim's portal still works in this browser after the cookie toss.
	err = do(ctx, 30*time.Second, chromedp.Navigate(victim+"/port/8000/page"), chromedp.WaitVisible(chromedp.ID("h")))
	title, _ := get(ctx, 10*time.Second, chromedp.Title())
	if err != nil || title != "in the sandbox" {
		t.Errorf("victim portal after the attack: %q %v", title, err)
	}
}
