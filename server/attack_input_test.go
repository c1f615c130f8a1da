package server

// Attacks from outside with hostile input: oversized bodies and headers,
// path traversal on every route that takes a path, header injection (see
// attack_outside_test.go).

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/server/portal"
)

// rawHTTP sends req (a whole request, as bytes on the wire) on a new
// connection and reads the answer until the server closes: the status, the
// header block as sent, and the body. err is set when no answer came.
func rawHTTP(addr, req string) (status int, head string, body []byte, err error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, "", nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return 0, "", nil, err
	}
	all, err := io.ReadAll(c)
	h, b, ok := bytes.Cut(all, []byte("\r\n\r\n"))
	if !ok {
		if err == nil {
			err = fmt.Errorf("no answer (%d bytes)", len(all))
		}
		return 0, string(all), nil, err
	}
	if _, err := fmt.Sscanf(string(h), "HTTP/1.1 %d", &status); err != nil {
		return 0, string(h), nil, err
	}
	return status, string(h) + "\r\n", b, nil
}

// rawGET is a GET of target (sent exactly as given) with Connection: close.
func (a *atkEnv) rawGET(t testing.TB, host, target string, hdr ...string) (int, string, []byte) {
	t.Helper()
	if host == "" {
		host = a.addr
	}
	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", target, host)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	b.WriteString("\r\n")
	st, head, body, err := rawHTTP(a.addr, b.String())
	if err != nil {
		t.Fatalf("GET %q: %v", target, err)
	}
	return st, head, body
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestAttackBodies: a body over its route's limit is 413 too_large on
// every route that takes one, whether its length is declared or it is
// chunked; JSON nested past the decoder's depth is a 400; the server
// answers everyone afterwards.
func TestAttackBodies(t *testing.T) {
	a := newAtkEnv(t)
	limit := a.s.cfg.Limits.MaxBodyBytes
	tried := 0
	for _, r := range a.s.engine.Routes() {
		k := r.Method + " " + r.Path
		rc := routeCases[k]
		switch {
		case r.Method != "POST" && r.Method != "PUT" && r.Method != "PATCH" && r.Method != "DELETE":
			continue
		case r.Path == proxyRoute:
			continue // streamed to the sandbox's own server (not read by sandboxd)
		}
		target := a.fill(r.Path, "own") + rc.query
		lim := limit
		if k == "PUT "+filesRoute {
			lim = maxUploadBytes
		}
		for _, token := range []string{a.token, ""} {
			// Declared: refused before a byte is read.
			req, _ := http.NewRequest(r.Method, "http://"+a.addr+target, io.LimitReader(zeros{}, lim+1))
			req.ContentLength = lim + 1
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := a.cl.Do(req)
			if err != nil {
				t.Errorf("%s declared %d bytes: %v", k, lim+1, err)
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			contractErr(t, fmt.Sprintf("%s declared %d bytes", k, lim+1), atkResp{resp.StatusCode, resp.Header, b}, http.StatusRequestEntityTooLarge, "too_large")
			tried++
		}
		// Chunked: refused once the limit is read (routes that read a
		// JSON body; an upload's 256 MiB is TestUploadBodyLimit's).
		if rc.body == "" || rc.body == "bytes" {
			continue
		}
		big := rc.body[:len(rc.body)-1] + `,"pad":"` + strings.Repeat("x", int(limit)) + `"}`
		req, _ := http.NewRequest(r.Method, "http://"+a.addr+target, io.MultiReader(strings.NewReader(big)))
		req.Header.Set("Authorization", "Bearer "+a.token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if req.ContentLength != 0 {
			t.Fatalf("%s: the body would not be sent chunked", k)
		}
		resp, err := a.cl.Do(req)
		if err != nil {
			t.Errorf("%s chunked: %v", k, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		contractErr(t, k+" chunked past the limit", atkResp{resp.StatusCode, resp.Header, b}, http.StatusRequestEntityTooLarge, "too_large")
		tried++
	}
	if tried < 20 {
		t.Fatalf("only %d oversized bodies tried", tried)
	}
	// JSON nested deeper than any decoder goes.
	deep := `{"sessionId":"deep","env":` + strings.Repeat("[", int(limit)/2-40) + `}`
	r := a.do(t, "POST", "/v1/sandbox", a.token, strings.NewReader(deep), "Content-Type", "application/json")
	contractErr(t, "deeply nested JSON", r, http.StatusBadRequest, "invalid_request")
	// Everyone is still served.
	if err := healthz(a.addr); err != nil {
		t.Fatal(err)
	}
	r = a.do(t, "POST", "/v1/sandbox/terminal/"+a.mine, a.token, strings.NewReader(`{"action":"exec","command":"id"}`))
	if r.status != http.StatusOK {
		t.Fatalf("exec after the attacks: %d %s", r.status, r.body)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestAttackHeaders: a header block past maxHeaderBytes (one huge header,
// or very many) is 431 or a closed connection, on the API and a portal
// origin alike; under the limit, a huge token or cookie is just a 401. The
// server answers everyone afterwards.
func TestAttackHeaders(t *testing.T) {
	a := newAtkEnv(t)
	if a.hs.MaxHeaderBytes != maxHeaderBytes {
		t.Fatalf("MaxHeaderBytes = %d", a.hs.MaxHeaderBytes)
	}
	portalHost := a.portalHost(a.orgA.Org.ID, a.mine)
	many := strings.Repeat("X-A: 0123456789abcdef\r\n", 60000) // 1.4 MB
	for _, host := range []string{a.addr, portalHost} {
		for name, hdr := range map[string]string{
			"one header just past the limit": "X-Big: " + strings.Repeat("a", maxHeaderBytes+4<<10) + "\r\n",
			"one 1 MiB header":               "X-Big: " + strings.Repeat("a", 1<<20) + "\r\n",
			"one 4 MiB header":               "X-Big: " + strings.Repeat("a", 4<<20) + "\r\n",
			"60,000 headers":                 many,
		} {
			start := time.Now()
			st, head, _, err := rawHTTP(a.addr, "GET /healthz HTTP/1.1\r\nHost: "+host+"\r\n"+hdr+"Connection: close\r\n\r\n")
			if err == nil && st != http.StatusRequestHeaderFieldsTooLarge {
				t.Errorf("%s to %s: %d %q", name, host, st, head)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("%s to %s took %v", name, host, d)
			}
		}
	}
	// Just under the limit: the handlers see it and refuse it as usual.
	huge := strings.Repeat("a", maxHeaderBytes-8<<10)
	if r := a.do(t, "GET", "/v1/sandbox", huge, nil); r.status != http.StatusUnauthorized {
		t.Errorf("huge token: %d", r.status)
	}
	var jar strings.Builder
	for i := 0; jar.Len() < maxHeaderBytes-8<<10; i++ {
		fmt.Fprintf(&jar, "sandboxd_portal=v1.%d.x; ", i)
	}
	r := a.do(t, "GET", "/port/8000/", "", nil, "Host", portalHost, "Cookie", jar.String())
	contractErr(t, "portal with a header block of forged cookies", r, http.StatusUnauthorized, "unauthenticated")
	st, _, _ := a.rawGET(t, strings.Repeat("h", 300)+".localhost", "/healthz")
	if st != http.StatusBadRequest {
		t.Errorf("300-byte Host: %d", st)
	}
	if err := healthz(a.addr); err != nil {
		t.Fatal(err)
	}
	if r := a.do(t, "GET", "/v1/sandbox/"+a.mine, a.token, nil); r.status != http.StatusOK {
		t.Fatalf("after the attacks: %d", r.status)
	}
}

// atkHostDir makes a directory outside every workspace with a marker file,
// and links to it planted in org A's session's workspace (the fake
// runtime's workspace is a plain directory: these are real symlinks that
// the server's file code resolves for real).
func (a *atkEnv) atkHostDir(t *testing.T) (hostDir, marker string) {
	t.Helper()
	hostDir = t.TempDir()
	marker = "HOST-SECRET-" + randHex(8)
	if err := os.WriteFile(filepath.Join(hostDir, "secret.txt"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostDir, "host-only-"+marker+".txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ws := a.workspaceDir(t)
	for name, target := range map[string]string{
		"link-file":      filepath.Join(hostDir, "secret.txt"),
		"link-dir":       hostDir,
		"link-rel":       strings.Repeat("../", 20) + strings.TrimPrefix(hostDir, "/") + "/secret.txt",
		"link-proc":      "/proc/self/root" + hostDir + "/secret.txt",
		"link-proc-cwd":  "/proc/self/cwd",
		"sub/inner":      "../link-dir",
		"sub/inner-file": "../link-file",
	} {
		os.MkdirAll(filepath.Dir(filepath.Join(ws, name)), 0o755)
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(ws, "sub", "ok.txt"), []byte("inside"), 0o644)
	return hostDir, marker
}

func (a *atkEnv) workspaceDir(t testing.TB) string {
	t.Helper()
	ses, err := a.db.GetSession(t.Context(), a.orgA.Org.ID, a.mine)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(a.rt.WorkspaceRoot, ses.ContainerID)
}

// hostDirIntact checks nothing was written, replaced or removed there.
func hostDirIntact(t *testing.T, hostDir, marker string) {
	t.Helper()
	ents, _ := os.ReadDir(hostDir)
	if len(ents) != 2 {
		t.Errorf("the host directory changed: %v", ents)
	}
	if b, _ := os.ReadFile(filepath.Join(hostDir, "secret.txt")); string(b) != marker {
		t.Errorf("the host file changed: %q", b)
	}
}

// TestAttackPathTraversal: on every route that takes a path (files,
// artifacts, the portal on the API and on its own origin), dot segments
// plain and encoded (once and twice), absolute paths, NUL, backslashes and
// symlinks out of /workspace reach nothing outside the workspace or the
// target: no byte of a host file, no listing of a host directory, no
// write there, no other port or session.
func TestAttackPathTraversal(t *testing.T) {
	a := newAtkEnv(t)
	hostDir, marker := a.atkHostDir(t)
	leaked := func(b []byte) bool {
		return bytes.Contains(b, []byte(marker)) || bytes.Contains(b, []byte("root:x:0:0")) || bytes.Contains(b, []byte("host-only-"))
	}
	rel := strings.TrimPrefix(hostDir, "/")
	// Each must be refused (400 invalid_path, or 404 for a name that
	// resolves to nothing).
	paths := []string{
		"/workspace/../" + rel + "/secret.txt",
		"/workspace/./../" + rel + "/secret.txt",
		"/workspace/sub/../../" + rel + "/secret.txt",
		hostDir + "/secret.txt",
		hostDir,
		"/etc/passwd",
		"/proc/self/environ",
		"/workspace/../../proc/self/environ",
		"workspace/../" + rel,
		"/workspace/link-file",
		"/workspace/link-dir",
		"/workspace/link-dir/secret.txt",
		"/workspace/link-rel",
		"/workspace/link-proc",
		"/workspace/link-proc-cwd/etc/passwd",
		"/workspace/sub/inner",
		"/workspace/sub/inner/secret.txt",
		"/workspace/sub/inner/new.txt",
		"/workspace/sub/inner-file",
		"/workspace/%2e%2e/" + rel + "/secret.txt",
		"/workspace/%2E%2E/" + rel + "/secret.txt",
		"/workspace/..%2f" + rel + "/secret.txt",
		"/workspace/README\x00/../../etc/passwd",
		"/workspace/README\x00",
		"/workspace\x00/../etc/passwd",
		"/WORKSPACE/../etc/passwd",
		"//etc/passwd",
		"/workspace//" + rel,
	}
	// Names that only look like traversal: Linux takes them literally, so
	// a write makes a file of that name inside the workspace.
	literal := []string{
		"/workspace/%252e%252e/" + rel + "/secret.txt",
		"/workspace/..\\..\\" + strings.ReplaceAll(rel, "/", "\\") + "\\secret.txt",
		"/workspace/\u2025/etc/passwd",
		"/workspace/%c0%ae%c0%ae/etc/passwd",
	}
	// Query values: encoded once (the server decodes them once), and
	// with escapes left as they are (decoded to what they spell).
	encodings := func(p string) []string {
		return []string{url.QueryEscape(p), strings.NewReplacer(" ", "%20", "\x00", "%00", "\\", "%5C", "#", "%23", "&", "%26", "+", "%2B").Replace(p)}
	}
	// refused: what the server decoded leaves /workspace, or goes through
	// a link; anything else is a literal name inside the workspace.
	refused := func(decoded string) bool {
		if !strings.HasPrefix(decoded, "/workspace/") || strings.ContainsRune(decoded, 0) {
			return true
		}
		for _, seg := range strings.Split(decoded, "/")[2:] {
			if seg == ".." || seg == "." || seg == "" || strings.HasPrefix(seg, "link-") || strings.HasPrefix(seg, "inner") {
				return true
			}
		}
		return false
	}
	tried := 0
	for _, p := range append(paths, literal...) {
		for _, q := range encodings(p) {
			decoded, err := url.QueryUnescape(q)
			if err != nil {
				t.Fatal(err)
			}
			must := refused(decoded)
			target := "/v1/sandbox/" + a.mine + "/files?path=" + q
			st, _, body := a.rawGET(t, "", target, "Authorization", "Bearer "+a.token)
			if leaked(body) || must && st != http.StatusBadRequest && st != http.StatusNotFound {
				t.Errorf("GET files %q: %d %.200s", decoded, st, body)
			}
			r := a.do(t, "PUT", target, a.token, strings.NewReader("pwned"))
			if must && r.status != http.StatusBadRequest && r.status != http.StatusNotFound || leaked(r.body) {
				t.Errorf("PUT files %q: %d %s", decoded, r.status, r.body)
			}
			if must {
				tried++
			}
		}
	}
	if tried < 40 {
		t.Fatalf("only %d refusals tried", tried)
	}
	hostDirIntact(t, hostDir, marker)

	// Artifacts: the path is the URL's own, sent raw (no client cleans it).
	for _, p := range []string{
		"../../../../../../etc/passwd", "%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "..%2f..%2f..%2f..%2fetc%2fpasswd",
		"%252e%252e%252f%252e%252e%252fetc%252fpasswd", "..%5c..%5c..%5cetc%5cpasswd", "README%00", "README%00/../../etc/passwd",
		"link-file", "link-dir/secret.txt", "link-rel", "link-proc", "link-proc-cwd/etc/passwd", "sub/inner/secret.txt", "sub/inner-file",
		"/" + rel + "/secret.txt", "%2f" + url.PathEscape(rel) + "%2fsecret.txt", "sub/./../../etc/passwd", ".%2e/.%2e/etc/passwd",
		"%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd", "%e2%80%a5/etc/passwd",
	} {
		st, head, body := a.rawGET(t, "", "/v1/sandbox/"+a.mine+"/artifacts/"+p, "Authorization", "Bearer "+a.token)
		// The last two are literal names, which a PUT above made inside.
		if st == http.StatusOK && !strings.HasPrefix(p, "%c0") && !strings.HasPrefix(p, "%e2") || leaked(body) {
			t.Errorf("artifact %q: %d %.200s %.200s", p, st, head, body)
		}
	}
	// The real file beside them is served (the checks above can pass).
	if st, _, body := a.rawGET(t, "", "/v1/sandbox/"+a.mine+"/artifacts/sub/ok.txt", "Authorization", "Bearer "+a.token); st != 200 || string(body) != "inside" {
		t.Fatalf("a real artifact: %d %q", st, body)
	}
	if st, _, body := a.rawGET(t, "", "/v1/sandbox/"+a.mine+"/files?path=/workspace/sub/ok.txt", "Authorization", "Bearer "+a.token); st != 200 || string(body) != "inside" {
		t.Fatalf("a real file: %d %q", st, body)
	}
	// Deleting through a link or out of the workspace removes nothing
	// outside (deleting a link itself is allowed: it removes the link).
	for _, p := range []string{"/workspace/link-dir/secret.txt", "/workspace/sub/inner/secret.txt", "/workspace/../" + rel + "/secret.txt", hostDir + "/secret.txt"} {
		for _, extra := range []string{"", "&recursive=true"} {
			r := a.do(t, "DELETE", "/v1/sandbox/"+a.mine+"/files?path="+url.QueryEscape(p)+extra, a.token, nil)
			if r.status < 400 {
				t.Errorf("DELETE %q: %d", p, r.status)
			}
		}
	}
	for _, p := range []string{"/workspace/link-dir", "/workspace/sub"} {
		if r := a.do(t, "DELETE", "/v1/sandbox/"+a.mine+"/files?path="+url.QueryEscape(p)+"&recursive=true", a.token, nil); r.status != http.StatusNoContent {
			t.Errorf("DELETE the link %q: %d %s", p, r.status, r.body)
		}
	}
	hostDirIntact(t, hostDir, marker)

	// The portal: nothing leaves port 8000 of this session.
	up := a.upstream(t)
	two := a.provision(a.token, map[string]any{"sessionId": "a-two"}).SessionID
	cookie := a.portalLogin(t, a.orgA.Org.ID, a.mine, a.ticket(t, a.token, a.mine))
	tricks := []string{
		"/port/8000/../9000/x", "/port/8000/../../port/9000/x", "/port/8000/%2e%2e/9000/x", "/port/8000/%2e%2e/%2e%2e/port/9000/x",
		"/port/8000/..%2f9000%2fx", "/port/8000/..%2f..%2fport%2f9000%2fx", "/port/8000/%252e%252e/9000/x", "/port/8000/..%5c9000",
		"/port/8000%2f..%2f9000/x", "/port/9000%2f..%2f8000/x", "/port/08000/", "/port/+8000/", "/port/8000.0/", "/port/%38000/",
		"/port/8000/.%2e/.%2e/port/9000/", "/port/8000/%c0%ae%c0%ae/9000/", "/port/65536/", "/port/0/", "/../port/9000/", "/%2e%2e/port/9000/",
		"/port/8000/%00/../9000", "/port/8000/x%00",
	}
	for _, p := range tricks {
		a.rawGET(t, "", "/v1/sandbox/proxy/"+a.mine+p, "Authorization", "Bearer "+a.token)
		a.rawGET(t, a.portalHost(a.orgA.Org.ID, a.mine), p, "Cookie", cookie)
	}
	for _, p := range []string{
		"/v1/sandbox/proxy/" + a.mine + "/../" + two + "/port/8000/",
		"/v1/sandbox/proxy/" + a.mine + "/%2e%2e/" + two + "/port/8000/",
		"/v1/sandbox/proxy/" + a.mine + "%2f..%2f" + two + "/port/8000/",
		"/v1/sandbox/proxy/" + a.mine + "/../../" + a.theirs + "/port/8000/",
		"/v1/sandbox/proxy/%61-mine/port/8000/",
	} {
		st, _, body := a.rawGET(t, "", p, "Authorization", "Bearer "+a.token)
		if st == http.StatusOK || bytes.Contains(body, []byte("upstream 8000")) && !strings.HasPrefix(p, "/v1/sandbox/proxy/"+a.mine+"/") {
			t.Errorf("proxy %q: %d %.200s", p, st, body)
		}
	}
	// Only port 8000 of this session was ever dialed, and what reached it
	// has its dot segments resolved (an escaped "/" stays one segment:
	// the sandbox's server reads it as its own name).
	paths2, bad := up.seen()
	if len(bad) > 0 {
		t.Errorf("dials to other ports or sandboxes: %v", bad)
	}
	for _, p := range paths2 {
		for _, seg := range strings.Split(p, "/") {
			if d, _ := url.PathUnescape(seg); d == ".." || d == "." {
				t.Errorf("the upstream got a dot segment: %q", p)
			}
		}
	}
	t.Logf("%d requests reached port 8000; paths: %q", len(paths2), paths2)
}

// headerLines splits a raw header block into its lines.
func headerLines(head string) []string {
	return strings.Split(strings.TrimSuffix(head, "\r\n"), "\r\n")
}

// assertNoInjection checks a raw header block: no header an attacker's
// CR/LF could have started, and at most one of each of those given.
func assertNoInjection(t *testing.T, what, head string, once ...string) {
	t.Helper()
	counts := map[string]int{}
	for _, l := range headerLines(head)[1:] {
		name, _, ok := strings.Cut(l, ":")
		if !ok || strings.ContainsAny(l, "\r\n") {
			t.Errorf("%s: malformed header line %q", what, l)
			continue
		}
		counts[strings.ToLower(name)]++
		switch strings.ToLower(name) {
		case "set-cookie":
			if !strings.HasPrefix(l, "Set-Cookie: "+portal.CookieName+"=") {
				t.Errorf("%s: injected header %q", what, l)
			}
		case "x-injected", "pwned":
			t.Errorf("%s: injected header %q", what, l)
		}
	}
	for _, h := range once {
		if counts[strings.ToLower(h)] > 1 {
			t.Errorf("%s: %d %s headers", what, counts[strings.ToLower(h)], h)
		}
	}
}

// TestAttackHeaderInjection: nothing a client or a sandbox controls
// reaches a response header as a line of its own: a file named with CR,
// LF and quotes downloads with one safe Content-Disposition; redirects
// carry what they echo percent-encoded; the request id is always the
// server's own.
func TestAttackHeaderInjection(t *testing.T) {
	a := newAtkEnv(t)
	a.upstream(t)
	name := "evil\r\nSet-Cookie: pwned=1\r\nX-Injected: 1 \"q\";\\.txt"
	if err := os.WriteFile(filepath.Join(a.workspaceDir(t), name), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{
		"/v1/sandbox/" + a.mine + "/artifacts/" + url.PathEscape(name),
		"/v1/sandbox/" + a.mine + "/files?path=" + url.QueryEscape("/workspace/"+name),
	} {
		st, head, body := a.rawGET(t, "", target, "Authorization", "Bearer "+a.token)
		if st != http.StatusOK || string(body) != "x" {
			t.Fatalf("download %q: %d %q", target, st, body)
		}
		assertNoInjection(t, "download", head, "Content-Disposition", "Content-Type")
		var cd string
		for _, l := range headerLines(head) {
			if v, ok := strings.CutPrefix(l, "Content-Disposition: "); ok {
				cd = v
			}
		}
		if !strings.HasPrefix(cd, `attachment; filename="`) || strings.Count(cd, `"`) != 2 || !strings.Contains(cd, "filename*=UTF-8''evil%0D%0ASet-Cookie") {
			t.Errorf("Content-Disposition %q", cd)
		}
		for _, h := range []string{"Content-Type: application/octet-stream", "X-Content-Type-Options: nosniff", "Content-Security-Policy: sandbox"} {
			if !strings.Contains(head, "\r\n"+h+"\r\n") {
				t.Errorf("download lacks %q:\n%s", h, head)
			}
		}
	}

	// Redirects that echo the request's path and query.
	inj := "%0d%0aSet-Cookie:%20pwned=1%0d%0aX-Injected:%201"
	tk := a.ticket(t, a.token, a.mine)
	for _, c := range []struct{ what, host, target, auth string }{
		{"the portal's mount redirect", "", "/v1/sandbox/proxy/" + a.mine + "/port/8000?x=" + inj, "Bearer " + a.token},
		{"the ticket's redirect to the portal origin", "", "/v1/sandbox/proxy/" + a.mine + "/port/8000/" + inj + "/?ticket=" + tk + "&y=" + inj, ""},
		{"the portal origin's mount redirect", a.portalHost(a.orgA.Org.ID, a.mine), "/port/8000?x=" + inj, ""},
	} {
		hdr := []string{}
		if c.auth != "" {
			hdr = []string{"Authorization", c.auth}
		}
		if c.host != "" {
			hdr = []string{"Cookie", a.portalLogin(t, a.orgA.Org.ID, a.mine, a.ticket(t, a.token, a.mine))}
		}
		st, head, _ := a.rawGET(t, c.host, c.target, hdr...)
		if st/100 != 3 {
			t.Errorf("%s: %d %s", c.what, st, head)
		}
		assertNoInjection(t, c.what, head, "Location")
		if lh := strings.ToLower(head); !strings.Contains(lh, "%0d%0a") && !strings.Contains(lh, "%250d%250a") {
			t.Errorf("%s: the Location lost what it echoes: %s", c.what, head)
		}
	}
	// The login's next: a CR/LF or another host is not followed.
	st, head, body := a.rawGET(t, a.portalHost(a.orgA.Org.ID, a.mine), "/.sandboxd/login?ticket="+a.ticket(t, a.token, a.mine)+"&next=/"+inj)
	assertNoInjection(t, "login", head, "Set-Cookie")
	if st != http.StatusOK || !bytes.Contains(body, []byte(`url=/">`)) {
		t.Errorf("login with a CR/LF next: %d %s", st, body)
	}

	// The request id is the server's, whatever the client sends.
	for _, host := range []string{"", a.portalHost(a.orgA.Org.ID, a.mine)} {
		for _, target := range []string{"/healthz", "/v1/sandbox", "/nothing"} {
			_, head, _ := a.rawGET(t, host, target, "X-Request-Id", "attacker-chosen")
			ids := 0
			for _, l := range headerLines(head) {
				if v, ok := strings.CutPrefix(l, "X-Request-Id: "); ok {
					ids++
					if _, err := hex.DecodeString(v); err != nil || len(v) != 24 {
						t.Errorf("%s%s: X-Request-Id %q", host, target, v)
					}
				}
			}
			if ids != 1 {
				t.Errorf("%s%s: %d request ids:\n%s", host, target, ids, head)
			}
		}
	}
	// A raw CR or LF in the request line or a header is refused by
	// net/http; the server carries on.
	for _, req := range []string{
		"GET /healthz\rSet-Cookie: a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\rSet-Cookie: b\r\nConnection: close\r\n\r\n",
		"GET /healthz HTTP/1.1\r\nHost: x\nSet-Cookie: b\r\nConnection: close\r\n\r\n",
	} {
		st, head, _, _ := rawHTTP(a.addr, req)
		if st == http.StatusOK && strings.Contains(head, "Set-Cookie") {
			t.Errorf("%q: %s", req, head)
		}
	}
	if err := healthz(a.addr); err != nil {
		t.Fatal(err)
	}
}
