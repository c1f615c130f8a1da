package egress

// Attacks on git pairing from inside a sandbox (arbitrary bytes to the
// proxy) and from a hostile Git host. Tests named TestGitAttack* that fail
// demonstrate a problem (see the review notes in each); the others are
// regression tests of defenses that held.

import (
	"bufio"
	"bytes"
	crand "crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const atkToken = "ghp_attackTOKEN0123456789abcdef"

var atkBasic = "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+atkToken))

// atkReq is a request the fake Git host saw.
type atkReq struct {
	Method, URI, Auth string
	Header            http.Header
	Body              []byte
}

// atkHost is a fake Git host (HTTPS for git.test, trusted by the proxy
// through GitRoots) whose handler the test chooses; it records requests.
type atkHost struct {
	srv  *httptest.Server
	port int
	mu   sync.Mutex
	reqs []atkReq
}

func (h *atkHost) requests() []atkReq {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]atkReq(nil), h.reqs...)
}

// atkEnv is a proxy with the installation CA for git.test, a fake Git host
// and one paired session (alice/app, branch main).
type atkEnv struct {
	*env
	host   *atkHost
	proxy  string
	caPool *x509.CertPool
	pair   *GitPairing
}

// newAtkEnv: handler nil answers 200 "ok" (after reading the body).
// tweak may change the policy's config.
func newAtkEnv(t *testing.T, handler http.HandlerFunc, tweak func(*Config)) *atkEnv {
	t.Helper()
	h := &atkHost{}
	if handler == nil {
		handler = func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }
	}
	h.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		if r.Method != "TRACE" {
			body, _ = io.ReadAll(io.LimitReader(r.Body, 1<<20))
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		h.mu.Lock()
		h.reqs = append(h.reqs, atkReq{Method: r.Method, URI: r.RequestURI, Auth: r.Header.Get("Authorization"), Header: r.Header.Clone(), Body: body})
		h.mu.Unlock()
		handler(w, r)
	}))
	h.srv.Config.ErrorLog = nil
	h.srv.TLS = &tls.Config{Certificates: []tls.Certificate{getCA(t).leaf("git.test")}}
	h.srv.StartTLS()
	t.Cleanup(h.srv.Close)
	h.port = h.srv.Listener.Addr().(*net.TCPAddr).Port

	dir := t.TempDir()
	ca, err := LoadCA(dir, "git.test")
	if err != nil {
		t.Fatal(err)
	}
	roots, err := GitRoots(getCA(t).pem)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	if tweak != nil {
		tweak(cfg)
	}
	pol, err := NewPolicy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, res: newResolver(), events: &recEvents{}}
	e.res.set("git.test", "127.0.0.1")
	e.p = New(pol, Options{Events: e.events, Resolver: e.res, CA: ca, GitRoots: roots})
	t.Cleanup(e.p.Shutdown)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM())
	ge := &gitEnv{env: e}
	pair := &GitPairing{Host: "git.test", Port: h.port, Repo: "alice/app", Branch: "main", User: "x-access-token", Token: atkToken}
	proxy := ge.servePaired("atk", pair)
	return &atkEnv{env: e, host: h, proxy: proxy, caPool: pool, pair: pair}
}

// dialGit opens a terminated tunnel to the paired host as a sandbox would.
func (a *atkEnv) dialGit(t *testing.T) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	c, br, resp := rawConnect(t, a.proxy, "git.test:"+strconv.Itoa(a.host.port), true)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	tc := tls.Client(&bufConn{Conn: c, br: br}, &tls.Config{ServerName: "git.test", RootCAs: a.caPool})
	_ = tc.SetDeadline(time.Now().Add(20 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	t.Cleanup(func() { tc.Close() })
	return tc, bufio.NewReader(tc)
}

func (a *atkEnv) hostport() string { return "git.test:" + strconv.Itoa(a.host.port) }

// roundTrip writes raw and reads one response (body read whole).
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, raw string) (*http.Response, string) {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode == http.StatusContinue {
		resp, err = http.ReadResponse(br, nil) // the proxy answers Expect itself
	}
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func pktLine(s string) string { return fmt.Sprintf("%04x", len(s)+4) + s }

// emptyPack is a valid pack with no objects.
func emptyPack() string {
	h := "PACK\x00\x00\x00\x02\x00\x00\x00\x00"
	sum := sha1.Sum([]byte(h))
	return h + string(sum[:])
}

var (
	idZ = strings.Repeat("0", 40)
	idA = strings.Repeat("a", 40)
	idB = strings.Repeat("b", 40)
)

// ---------------------------------------------------------------------
// Finding: ref names with trailing Unicode whitespace pass checkPush.

// checkPush splits a command with strings.Fields, which also splits on
// Unicode white space (U+00A0, U+0085, U+2000..., U+3000); git's
// receive-pack takes everything after the second space as the ref name,
// and bytes >= 0x80 are legal in ref names. So "refs/heads/main\u00a0"
// passes as "refs/heads/main" but creates another branch on the host.
func TestGitAttackCheckPushUnicodeSpaceRef(t *testing.T) {
	for _, suffix := range []string{"\u00a0", "\u0085", "\u2003", "\u3000", "\u00a0\u2028"} {
		body := pktLine(idZ+" "+idB+" refs/heads/main"+suffix+"\x00report-status\n") + "0000"
		if _, err := checkPush(strings.NewReader(body), "refs/heads/main"); err == nil {
			t.Errorf("a push to %q (not the paired branch) passed checkPush", "refs/heads/main"+suffix)
		}
	}
}

// The same with real git through the proxy against git http-backend: the
// sandbox creates branch "main\u00a0" on the host with the credential.
func TestGitAttackPushUnicodeSpaceBranchRealGit(t *testing.T) {
	g := newGitEnv(t)
	g.gs.AddRepo(t, "alice/private", "main")
	g.gs.Grant(atkToken, "alice/private")
	proxy := g.servePaired("s1", &GitPairing{Host: "git.test", Port: g.gs.Port, Repo: "alice/private", Branch: "main", User: "x-access-token", Token: atkToken})
	work := t.TempDir()
	if out, err := g.git(proxy, work, "clone", "-q", g.gs.URL()+"/alice/private.git", "repo"); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	repo := filepath.Join(work, "repo")
	out, err := g.git(proxy, repo, "push", "origin", "main:refs/heads/main\u00a0")
	refs := g.gitRefs(t, "alice/private")
	if strings.Contains(refs, "refs/heads/main\u00a0") {
		t.Fatalf("the sandbox created branch %q on the host through the pairing (push err=%v):\n%s\nhost refs:\n%s", "main\u00a0", err, out, refs)
	}
}

func (g *gitEnv) gitRefs(t *testing.T, repo string) string {
	t.Helper()
	b, _ := execGit(filepath.Join(g.gs.Root, repo+".git"), "for-each-ref", "--format=%(refname)")
	return b
}

// ---------------------------------------------------------------------
// Finding: push options pass (GitLab: merge_request.create,
// merge_when_pipeline_succeeds, ci.variable; Gitea: repo.private=false).

func TestGitAttackPushOptionsReachHost(t *testing.T) {
	g := newGitEnv(t)
	bare := g.gs.AddRepo(t, "alice/private", "main")
	execGit(bare, "config", "receive.advertisePushOptions", "true")
	marker := filepath.Join(t.TempDir(), "push-options")
	hook := "#!/bin/sh\ni=0\nwhile [ $i -lt ${GIT_PUSH_OPTION_COUNT:-0} ]; do eval echo \\$GIT_PUSH_OPTION_$i >> " + marker + "; i=$((i+1)); done\n"
	os.WriteFile(filepath.Join(bare, "hooks", "post-receive"), []byte(hook), 0o755)
	g.gs.Grant(atkToken, "alice/private")
	proxy := g.servePaired("s1", &GitPairing{Host: "git.test", Port: g.gs.Port, Repo: "alice/private", Branch: "main", User: "x-access-token", Token: atkToken})
	work := t.TempDir()
	if out, err := g.git(proxy, work, "clone", "-q", g.gs.URL()+"/alice/private.git", "repo"); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	repo := filepath.Join(work, "repo")
	os.WriteFile(filepath.Join(repo, "x"), []byte("x\n"), 0o644)
	g.git(proxy, repo, "add", "x")
	g.git(proxy, repo, "commit", "-q", "-m", "x")
	out, err := g.git(proxy, repo, "push", "-o", "merge_request.create", "-o", "merge_request.merge_when_pipeline_succeeds",
		"-o", "repo.private=false", "origin", "main")
	if b, _ := os.ReadFile(marker); len(b) > 0 {
		t.Fatalf("push options reached the Git host with the credential (push err=%v, %s); the host's hooks saw:\n%s", err, out, b)
	}
}

// ---------------------------------------------------------------------
// Finding: the credential goes with any method on a paired path; the push
// check runs only for the exact method "POST".

func TestGitAttackMethodsOnPairedPaths(t *testing.T) {
	a := newAtkEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "TRACE" { // as Apache's default TraceEnable on does
			w.Header().Set("Content-Type", "message/http")
			fmt.Fprintf(w, "TRACE %s HTTP/1.1\r\n", r.RequestURI)
			r.Header.Write(w)
			return
		}
		io.WriteString(w, "ok\n")
	}, nil)
	tagPush := pktLine(idZ+" "+idB+" refs/tags/v1\x00report-status\n") + "0000" + emptyPack()

	t.Run("TRACE reflects the credential", func(t *testing.T) {
		c, br := a.dialGit(t)
		_, body := roundTrip(t, c, br, "TRACE /alice/app/info/refs HTTP/1.1\r\nHost: "+a.hostport()+"\r\n\r\n")
		if strings.Contains(body, base64.StdEncoding.EncodeToString([]byte("x-access-token:"+atkToken))) {
			t.Errorf("the sandbox read the credential back from a TRACE to a paired path:\n%s", body)
		}
	})
	for _, m := range []string{"post", "Post", "PUT", "PATCH"} {
		t.Run(m+" receive-pack skips checkPush", func(t *testing.T) {
			c, br := a.dialGit(t)
			resp, _ := roundTrip(t, c, br, m+" /alice/app/git-receive-pack HTTP/1.1\r\nHost: "+a.hostport()+
				"\r\nContent-Type: application/x-git-receive-pack-request\r\nContent-Length: "+strconv.Itoa(len(tagPush))+"\r\n\r\n"+tagPush)
			for _, r := range a.host.requests() {
				if r.Method == m && bytes.Contains(r.Body, []byte("refs/tags/v1")) && r.Auth == atkBasic {
					t.Errorf("%s with a tag push reached the host with the credential, unchecked (proxy answered %s)", m, resp.Status)
				}
			}
		})
	}
}

// ---------------------------------------------------------------------
// Finding: no limit on the size of a request head in the terminated
// tunnel (http.ReadRequest on an unbounded bufio.Reader). Other tunnels
// cap heads (inspectBufSize, maxRequestLine); the server's MaxHeaderBytes
// is 64 KiB.

func TestGitAttackHugeRequestHead(t *testing.T) {
	a := newAtkEnv(t, nil, nil)
	c, _ := a.dialGit(t)
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.WriteString(c, "GET /alice/app/info/refs HTTP/1.1\r\nHost: "+a.hostport()+"\r\nX-Big: "); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	chunk := bytes.Repeat([]byte("a"), 1<<20)
	const total = 32
	sent := 0
	for ; sent < total; sent++ {
		if _, err := c.Write(chunk); err != nil {
			break
		}
	}
	if sent == total {
		// Give the proxy a moment to consume what is in flight.
		time.Sleep(300 * time.Millisecond)
		runtime.GC()
		runtime.ReadMemStats(&after)
		t.Fatalf("the proxy accepted a %d MiB request head line without cutting the connection; live heap grew by %d MiB "+
			"(a session may repeat this on up to 256 connections, bounded only by its byte quota)",
			total, (int64(after.HeapAlloc)-int64(before.HeapAlloc))>>20)
	}
}

// ---------------------------------------------------------------------
// Finding: after a request head arrives the connection's deadline is
// cleared; a client that stops sending its body (or never reads the
// answer) keeps the connection, its goroutine and the upstream connection
// forever, past the policy's idle timeout.

func TestGitAttackStalledBodyOutlivesIdleTimeout(t *testing.T) {
	a := newAtkEnv(t, nil, func(c *Config) { c.IdleTimeout = time.Second; c.HeaderTimeout = time.Second })
	for _, tc := range []struct{ name, head string }{
		{"push commands (checkPush)", "POST /alice/app/git-receive-pack HTTP/1.1\r\nContent-Length: 1000\r\n"},
		{"upload-pack body (upstream)", "POST /alice/app/git-upload-pack HTTP/1.1\r\nContent-Length: 1000\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := a.dialGit(t)
			if _, err := io.WriteString(c, tc.head+"Host: "+a.hostport()+"\r\n\r\n0032"); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err := br.ReadByte()
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the connection was still open 5 s into a stalled body (idle timeout 1 s)")
			}
		})
	}
}

// ---------------------------------------------------------------------
// Was a finding (defence in depth), fixed: the CA's name constraint covers DNS names
// only. A certificate its key signs for an IP address (or any subdomain of
// the Git host) verifies; clients check IP SANs for https://<ip>/.

func TestGitAttackCAConstraintIPAndSubdomains(t *testing.T) {
	ca, err := LoadCA(t.TempDir(), "git.test")
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(ca.PEM())
	root, _ := x509.ParseCertificate(blk.Bytes)
	pool := x509.NewCertPool()
	pool.AddCert(root)
	// The key never leaves the server; this is what it could sign if it did.
	c, err := ca.leaf("git.test")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := *c.Leaf
	tmpl.DNSNames = nil
	tmpl.IPAddresses = []net.IP{net.ParseIP("140.82.112.3"), net.ParseIP("169.254.169.254")}
	der, err := x509.CreateCertificate(randReader{}, &tmpl, ca.cert, c.Leaf.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	ipLeaf, _ := x509.ParseCertificate(der)
	if _, err := ipLeaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "169.254.169.254"}); err == nil {
		t.Errorf("a certificate the CA's key signed for an IP address verifies: the name constraint does not exclude IP ranges")
	}
	sub, err := ca.leaf("gist.git.test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "gist.git.test"}); err == nil {
		t.Logf("note: subdomains of the Git host (gist.git.test) are within the constraint (ExcludedDNSDomains %q would exclude them)", ".git.test")
	}
}

// ---------------------------------------------------------------------
// Defences that held (regression tests).

// Only the paired repository's exact smart-HTTP endpoints get the
// credential, whatever the spelling of the path.
func TestGitAttackPathTricks(t *testing.T) {
	a := newAtkEnv(t, nil, nil)
	paired := map[string]bool{
		"/alice/app/info/refs?service=git-upload-pack": true,
		"/ALICE/App.GIT/info/refs":                     true,
		"/alice/app.git/git-upload-pack":               false, // GET: the credential goes with POST only
		"/alice/app/info/refs#frag":                    true,  // the fragment is not sent
	}
	unpaired := []string{
		"/alice/app-private/info/refs",
		"/alice/apppp/info/refs",
		"/alice/app/../app-private/info/refs",
		"/alice/app/info/refs/../../../app-private/info/refs",
		"/alice/app%2f..%2fapp-private/info/refs",
		"/alice/app%2Finfo%2Frefs",
		"/alice/%61pp/info/refs",
		"/alice/app%2egit/info/refs",
		"//alice/app/info/refs",
		"/alice//app/info/refs",
		"/alice/app;x/info/refs",
		"/alice/app/info/refs/",
		"/alice/app/info/refs%00",
		"/alice/app/info/refs%20",
		"/alice/app.git.git/info/refs",
		"/alice/app.wiki.git/info/refs",
		"/alice/app/HEAD",
		"/alice/app/objects/info/packs",
		"/alice/app/info/lfs/objects/batch",
		"/alice/app/git-upload-archive",
		"/alice/app/INFO/REFS",
		"/alice/app.git/../../bob/secret/info/refs",
		"/alice/ap%C4%B1/info/refs", // dotless i
		"/alice/app\u212a/info/refs",
		"/bob/secret/info/refs",
	}
	check := func(uri string, want bool) {
		t.Helper()
		c, br := a.dialGit(t)
		n := len(a.host.requests())
		resp, _ := roundTrip(t, c, br, "GET "+uri+" HTTP/1.1\r\nHost: "+a.hostport()+"\r\n\r\n")
		reqs := a.host.requests()
		if len(reqs) == n {
			if want {
				t.Errorf("%s: not forwarded (%s)", uri, resp.Status)
			}
			return
		}
		got := reqs[len(reqs)-1]
		if (got.Auth == atkBasic) != want {
			t.Errorf("GET %q went out as %q with Authorization %q, want credential=%v", uri, got.URI, got.Auth, want)
		}
	}
	for uri, want := range paired {
		check(uri, want)
	}
	for _, uri := range unpaired {
		check(uri, false)
	}
}

// Host headers, request targets, SNI and protocol tricks inside the
// terminated tunnel.
func TestGitAttackTunnelFraming(t *testing.T) {
	a := newAtkEnv(t, nil, nil)
	hp := a.hostport()
	for name, raw := range map[string]string{
		"other Host":         "GET /alice/app/info/refs HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"Host without port":  "GET /alice/app/info/refs HTTP/1.1\r\nHost: git.test\r\n\r\n",
		"absolute form":      "GET https://evil.test/alice/app/info/refs HTTP/1.1\r\nHost: " + hp + "\r\n\r\n",
		"absolute same host": "GET https://" + hp + "/alice/app/info/refs HTTP/1.1\r\nHost: " + hp + "\r\n\r\n",
		"HTTP/1.0 no Host":   "GET /alice/app/info/refs HTTP/1.0\r\n\r\n",
		"two Hosts":          "GET /alice/app/info/refs HTTP/1.1\r\nHost: " + hp + "\r\nHost: evil.test\r\n\r\n",
		"authority form":     "CONNECT evil.test:443 HTTP/1.1\r\nHost: " + hp + "\r\n\r\n",
		"asterisk":           "OPTIONS * HTTP/1.1\r\nHost: " + hp + "\r\n\r\n",
		"h2 preface":         "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"upgrade":            "GET /alice/app/info/refs HTTP/1.1\r\nHost: " + hp + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"bad TE":             "POST /alice/app/git-upload-pack HTTP/1.1\r\nHost: " + hp + "\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"CL and CL":          "POST /alice/app/git-upload-pack HTTP/1.1\r\nHost: " + hp + "\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"obs-fold Host":      "GET /alice/app/info/refs HTTP/1.1\r\nHost: " + hp + "\r\n evil.test\r\n\r\n",
		"bare LF":            "GET /alice/app/info/refs HTTP/1.1\nHost: evil.test\n\n",
	} {
		c, br := a.dialGit(t)
		n := len(a.host.requests())
		io.WriteString(c, raw)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		status := "closed"
		if err == nil {
			status = resp.Status
		}
		for _, r := range a.host.requests()[n:] {
			if r.Auth != "" {
				t.Errorf("%s: reached the host with Authorization (%s %s), proxy said %s", name, r.Method, r.URI, status)
			}
			if name != "bare LF" && name != "HTTP/1.0 no Host" {
				t.Logf("%s: forwarded as %s %s without credential (%s)", name, r.Method, r.URI, status)
			}
		}
	}
	// SNI of another host, and none.
	for _, sni := range []string{"evil.test", ""} {
		c, br, resp := rawConnect(t, a.proxy, hp, true)
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		tc := tls.Client(&bufConn{Conn: c, br: br}, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err == nil {
			t.Errorf("handshake with SNI %q succeeded", sni)
		}
	}
	// A ClientHello that is garbage.
	c, _, _ := rawConnect(t, a.proxy, hp, true)
	c.Write(bytes.Repeat([]byte{0x16, 0x03, 0x01, 0xff, 0xff}, 1000))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, c)
}

// Pipelined requests: the second one, for another repository, goes
// without the credential; the sandbox's own Authorization on a paired
// path is replaced, on others passed as sent.
func TestGitAttackPipelining(t *testing.T) {
	a := newAtkEnv(t, nil, nil)
	c, br := a.dialGit(t)
	hp := a.hostport()
	io.WriteString(c, "GET /alice/app/info/refs HTTP/1.1\r\nHost: "+hp+"\r\nAuthorization: Basic c2FuZGJveDpvd24=\r\n\r\n"+
		"GET /bob/secret/info/refs HTTP/1.1\r\nHost: "+hp+"\r\nAuthorization: Basic c2FuZGJveDpvd24=\r\n\r\n"+
		"POST /alice/app-private/git-receive-pack HTTP/1.1\r\nHost: "+hp+"\r\nContent-Length: 4\r\n\r\n0000"+
		"GET /alice/app/info/refs HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	for i := 0; i < 4; i++ {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		io.Copy(io.Discard, resp.Body)
	}
	reqs := a.host.requests()
	if len(reqs) != 3 {
		t.Fatalf("host saw %d requests, want 3: %+v", len(reqs), reqs)
	}
	if reqs[0].Auth != atkBasic {
		t.Errorf("paired request carried %q, want the credential", reqs[0].Auth)
	}
	for _, r := range reqs[1:] {
		if r.Auth == atkBasic {
			t.Errorf("%s %s carried the credential", r.Method, r.URI)
		}
	}
}

// Receive-pack bodies: what checkPush refuses, framed every way.
func TestGitAttackPushBodies(t *testing.T) {
	a := newAtkEnv(t, nil, nil)
	hp := a.hostport()
	head := "POST /alice/app/git-receive-pack HTTP/1.1\r\nHost: " + hp + "\r\nContent-Type: application/x-git-receive-pack-request\r\n"
	good := pktLine(idA+" "+idB+" refs/heads/main\x00report-status\n") + "0000" + emptyPack()
	chunk := func(parts ...string) string {
		var s string
		for _, p := range parts {
			s += fmt.Sprintf("%x\r\n%s\r\n", len(p), p)
		}
		return s + "0\r\n\r\n"
	}
	cl := func(body string) string { return "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body }
	refused := map[string]string{
		"tag":                   cl(pktLine(idZ+" "+idB+" refs/tags/v1\x00caps\n") + "0000"),
		"delete":                cl(pktLine(idA+" "+idZ+" refs/heads/main\x00caps\n") + "0000"),
		"delete sha256":         cl(pktLine(strings.Repeat("a", 64)+" "+strings.Repeat("0", 64)+" refs/heads/main\x00caps\n") + "0000"),
		"main then dev":         cl(pktLine(idA+" "+idB+" refs/heads/main\x00caps\n") + pktLine(idA+" "+idB+" refs/heads/dev\n") + "0000"),
		"upper-case ids":        cl(pktLine(strings.ToUpper(idA)+" "+idB+" refs/heads/dev\x00caps\n") + "0000"),
		"delim packet":          cl(pktLine(idA+" "+idB+" refs/heads/main\x00caps\n") + "0001" + pktLine(idA+" "+idB+" refs/tags/v\n") + "0000"),
		"empty packet":          cl(pktLine(idA+" "+idB+" refs/heads/main\x00caps\n") + "0004" + pktLine(idA+" "+idB+" refs/tags/v\n") + "0000"),
		"lf-only packet":        cl(pktLine(idA+" "+idB+" refs/heads/main\x00caps\n") + "0005\n" + pktLine(idA+" "+idB+" refs/tags/v\n") + "0000"),
		"caps only":             cl(pktLine("\x00report-status\n") + "0000"),
		"shallow only":          cl(pktLine("shallow "+idA+"\n") + "0000"),
		"push-cert":             cl(pktLine("push-cert\x00caps\n") + pktLine("certificate version 0.1\n") + "0000"),
		"truncated by CL":       "Content-Length: 30\r\n\r\n" + good[:30],
		"zero-length chunked":   "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"chunked tag":           "Transfer-Encoding: chunked\r\n\r\n" + chunk(pktLine(idZ + " " + idB + " refs/tags/v1\x00caps\n")[:7], pktLine(idZ + " " + idB + " refs/tags/v1\x00caps\n")[7:], "0000"),
		"gzip":                  "Content-Encoding: gzip\r\n" + cl(good),
		"gzip with space":       "Content-Encoding: gzip \r\n" + cl(good),
		"x-gzip":                "Content-Encoding: x-gzip\r\n" + cl(good),
		"GZIP":                  "Content-Encoding: GZIP\r\n" + cl(good),
		"identity, gzip":        "Content-Encoding: identity, gzip\r\n" + cl(good),
		"zero CL":               "Content-Length: 0\r\n\r\n",
		"no body at all":        "\r\n",
		"prefix-sensitive ref":  cl(pktLine(idA+" "+idB+" refs/heads/main/x\x00caps\n") + "0000"),
		"ref with NUL in name":  cl(pktLine(idA+" "+idB+" refs/heads/mainx\x00caps\n") + "0000"),
		"0x length":             cl("0x3f" + idA + " " + idB + " refs/heads/main\n0000"),
		"plus length":           cl("+03f" + idA + " " + idB + " refs/heads/main\n0000"),
		"huge command list":     cl(strings.Repeat(pktLine("shallow "+idA+"\n"), 30000) + "0000"),
		"ref main in other dir": cl(pktLine(idA+" "+idB+" refs/remotes/../heads/main\x00caps\n") + "0000"),
	}
	for name, rest := range refused {
		c, br := a.dialGit(t)
		n := len(a.host.requests())
		io.WriteString(c, head+rest)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err == nil && resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnsupportedMediaType {
			t.Errorf("%s: proxy answered %s", name, resp.Status)
		}
		if got := a.host.requests()[n:]; len(got) > 0 {
			t.Errorf("%s: reached the host: %q", name, got[0].Body)
		}
	}
	// The paired branch passes, identity or absent encoding, CL or chunked,
	// Expect: 100-continue, sha256 ids, shallow first.
	for name, rest := range map[string]string{
		"CL":        cl(good),
		"identity":  "Content-Encoding: identity\r\n" + cl(good),
		"chunked":   "Transfer-Encoding: chunked\r\n\r\n" + chunk(good[:3], good[3:60], good[60:]),
		"expect":    "Expect: 100-continue\r\n" + cl(good),
		"sha256":    cl(pktLine(strings.Repeat("a", 64)+" "+strings.Repeat("b", 64)+" refs/heads/main\x00report-status\n") + "0000"),
		"shallow":   cl(pktLine("shallow "+idA+"\n") + pktLine(idZ+" "+idB+" refs/heads/main\x00report-status\n") + "0000"),
		"upper len": cl(strings.ToUpper(pktLine(idA + " " + idB + " refs/heads/main\x00report-status\n")[:4]) + pktLine(idA + " " + idB + " refs/heads/main\x00report-status\n")[4:] + "0000"),
	} {
		c, br := a.dialGit(t)
		n := len(a.host.requests())
		resp, _ := roundTrip(t, c, br, head+rest)
		if resp.StatusCode != 200 || len(a.host.requests()) != n+1 {
			t.Errorf("%s: the paired branch's push was not forwarded: %s", name, resp.Status)
		}
	}
}

// A hostile or misconfigured host: redirects are handed to the sandbox,
// never followed with the credential; a 401's WWW-Authenticate passes.
func TestGitAttackHostRedirects(t *testing.T) {
	var evilHits int
	var mu sync.Mutex
	evil := newTLSUpstream(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		evilHits++
		mu.Unlock()
	}))
	a := newAtkEnv(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/alice/app/info"):
			http.Redirect(w, r, evil.URL+"/steal", http.StatusTemporaryRedirect)
		case strings.HasPrefix(r.URL.Path, "/alice/app/git-upload-pack"):
			http.Redirect(w, r, "/bob/secret/git-upload-pack", http.StatusPermanentRedirect)
		default:
			w.Header().Set("WWW-Authenticate", `Basic realm="x"`)
			w.WriteHeader(401)
		}
	}, nil)
	a.res.set("allowed.test", "127.0.0.1")
	c, br := a.dialGit(t)
	hp := a.hostport()
	resp, _ := roundTrip(t, c, br, "GET /alice/app/info/refs HTTP/1.1\r\nHost: "+hp+"\r\n\r\n")
	if resp.StatusCode != http.StatusTemporaryRedirect {
		t.Errorf("redirect: %s", resp.Status)
	}
	resp, _ = roundTrip(t, c, br, "POST /alice/app/git-upload-pack HTTP/1.1\r\nHost: "+hp+"\r\nContent-Length: 4\r\n\r\n0000")
	if resp.StatusCode != http.StatusPermanentRedirect {
		t.Errorf("redirect: %s", resp.Status)
	}
	resp, _ = roundTrip(t, c, br, "GET /x HTTP/1.1\r\nHost: "+hp+"\r\n\r\n")
	if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("401: %s %v", resp.Status, resp.Header)
	}
	mu.Lock()
	defer mu.Unlock()
	if evilHits != 0 {
		t.Errorf("the proxy followed a redirect to another host")
	}
	for _, r := range a.host.requests() {
		if strings.HasPrefix(r.URI, "/bob") {
			t.Errorf("the proxy followed a redirect to %s", r.URI)
		}
	}
}

// Was a finding (functional), fixed: a real push of the paired branch over git's
// http.postBuffer (1 MiB) is refused: git first sends a probe POST whose
// body is just "0000", which checkPush refuses as "a push without
// commands", and git gives up.
func TestGitAttackLargePushProbeRefused(t *testing.T) {
	g := newGitEnv(t)
	g.gs.AddRepo(t, "alice/private", "main")
	g.gs.Grant(atkToken, "alice/private")
	proxy := g.servePaired("s1", &GitPairing{Host: "git.test", Port: g.gs.Port, Repo: "alice/private", Branch: "main", User: "x-access-token", Token: atkToken})
	work := t.TempDir()
	if out, err := g.git(proxy, work, "clone", "-q", g.gs.URL()+"/alice/private.git", "repo"); err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	repo := filepath.Join(work, "repo")
	big := make([]byte, 3<<20)
	randReader{}.Read(big)
	os.WriteFile(filepath.Join(repo, "big.bin"), big, 0o644)
	g.git(proxy, repo, "add", "big.bin")
	g.git(proxy, repo, "commit", "-q", "-m", "big")
	head, _ := execGit(repo, "rev-parse", "HEAD")
	// git's default http.postBuffer (1 MiB): a larger push first sends a
	// probe request whose body is a lone flush packet ("0000"), then the
	// pack in chunks.
	if out, err := g.git(proxy, repo, "push", "origin", "main"); err != nil {
		t.Fatalf("large push: %v\n%s\n%+v", err, out, g.events.denials())
	}
	if got := g.gs.Head(t, "alice/private", "main"); got != strings.TrimSpace(head) {
		t.Fatalf("host main = %s, want %s", got, head)
	}
}

// execGit runs the host's git in dir (test setup, not a sandbox's git).
func execGit(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t",
		"GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

type randReader struct{}

func (randReader) Read(b []byte) (int, error) { return crand.Read(b) }

// Finding (host-dependent hardening): responses to requests that carried
// the credential reach the sandbox whole, Set-Cookie included, and the
// sandbox's Cookie headers go out on every other path. A host that opens
// a web session for an HTTP Basic login hands the sandbox a cookie worth
// the user's whole account on that host.
func TestGitAttackSessionCookieFromCredentialedResponse(t *testing.T) {
	a := newAtkEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == atkBasic {
			http.SetCookie(w, &http.Cookie{Name: "host_session", Value: "session-of-the-token-owner", Path: "/"})
		}
		if ck, err := r.Cookie("host_session"); err == nil && ck.Value == "session-of-the-token-owner" {
			io.WriteString(w, "welcome, token owner\n")
			return
		}
		io.WriteString(w, "anonymous\n")
	}, nil)
	c, br := a.dialGit(t)
	hp := a.hostport()
	resp, _ := roundTrip(t, c, br, "GET /alice/app/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: "+hp+"\r\n\r\n")
	cookie := resp.Header.Get("Set-Cookie")
	if cookie == "" {
		return
	}
	_, body := roundTrip(t, c, br, "GET /settings/tokens HTTP/1.1\r\nHost: "+hp+"\r\nCookie: "+strings.Split(cookie, ";")[0]+"\r\n\r\n")
	t.Fatalf("the sandbox got the host's Set-Cookie from a credentialed response (%q) and used it on another path: %q", cookie, body)
}

// Held: the terminated tunnel's bytes count against the session quota.
func TestGitAttackQuotaCountsGitTunnel(t *testing.T) {
	a := newAtkEnv(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte("x"), 4<<20))
	}, nil)
	// A second session on the same proxy with a 256 KiB quota.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.p.Serve(l, "small", SessionOptions{Limit: 256 << 10, Git: a.pair}) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, _, ok := a.p.Usage("small"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not registered")
		}
	}
	t.Cleanup(func() { a.p.Close("small"); <-done })
	small := &atkEnv{env: a.env, host: a.host, proxy: l.Addr().String(), caPool: a.caPool, pair: a.pair}
	c, br := small.dialGit(t)
	io.WriteString(c, "GET /alice/app/info/refs HTTP/1.1\r\nHost: "+a.hostport()+"\r\n\r\n")
	n, _ := io.Copy(io.Discard, br)
	if n > 300<<10 {
		t.Errorf("read %d bytes through a session with a 256 KiB quota", n)
	}
	if used, _, _ := a.p.Usage("small"); used > 300<<10 {
		t.Errorf("used = %d", used)
	}
}

// Held: closing the session (teardown) ends a stalled git tunnel at once.
func TestGitAttackSessionCloseEndsStalledTunnel(t *testing.T) {
	a := newAtkEnv(t, nil, nil)
	c, br := a.dialGit(t)
	io.WriteString(c, "POST /alice/app/git-receive-pack HTTP/1.1\r\nHost: "+a.hostport()+"\r\nContent-Length: 1000\r\n\r\n0032")
	time.Sleep(200 * time.Millisecond)
	a.p.Close("atk")
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err := br.ReadByte()
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the stalled tunnel outlived the session's Close")
	}
}
