package server

// Real tests: real runsc sandboxes from the default image, a real SQLite
// file and a real HTTP server. They need root and `make build image`
// (make test does both); SANDBOXD_BIN points at bin/.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/runsc"
	"sandboxd/runsc/image"
	"sandboxd/server/config"
	"sandboxd/store"
)

func binDir(t testing.TB) string {
	d := os.Getenv("SANDBOXD_BIN")
	if d == "" {
		d, _ = filepath.Abs("../bin")
	}
	for _, f := range []string{"runsc", "sandboxd-agent"} {
		if _, err := os.Stat(filepath.Join(d, f)); err != nil {
			t.Fatalf("%s missing in %s: run `make build`", f, d)
		}
	}
	return d
}

// realConfig returns a config for a real server on a fresh data dir. It
// skips in -short mode and when not root.
func realConfig(t testing.TB) *config.Config {
	if testing.Short() {
		t.Skip("real gVisor test (not in -short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("real gVisor tests need root")
	}
	// Short, whatever the test's name: agent sockets live under it (107
	// bytes at most for a unix socket path).
	dir, err := os.MkdirTemp("", "sbxt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg, err := config.Load(config.Overrides{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	bin := binDir(t)
	cfg.Runsc.Binary = filepath.Join(bin, "runsc")
	cfg.Runsc.Agent = filepath.Join(bin, "sandboxd-agent")
	cfg.Image.AutoBuild = false
	// A small size for disk and memory tests. Its rate (100 credits an
	// hour, 28 milli-credits a second) makes a few seconds of running time
	// show in its credits, while the first organization's plan (team: 3,000
	// a month) still pays for 30 hours of it.
	cfg.Sizes.List = append(cfg.Sizes.List, config.Size{Name: "test-tiny", VCPUs: 1, MemoryMiB: 512, DiskMiB: 256, Pids: 512, CreditsPerHour: 100_000})
	r, err := cfg.ImageRecipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := image.Ensure(context.Background(), cfg.Image.CacheDir, r, false, nil); err != nil {
		t.Fatalf("default image missing: run `make image` (%v)", err)
	}
	t.Cleanup(func() { assertNoLeftovers(t, cfg) })
	return cfg
}

// assertNoLeftovers destroys whatever the test left with the server's
// prefix and fails if anything had to be collected that is not a sandbox
// dir: netns, mounts, cgroups and runsc containers must all be gone.
func assertNoLeftovers(t testing.TB, cfg *config.Config) {
	rt, err := runsc.New(runsc.Config{Binary: cfg.Runsc.Binary, Agent: cfg.Runsc.Agent, StateDir: cfg.DataDir, Prefix: config.ResourcePrefix(cfg.DataDir), TrustBundle: config.TrustBundlePath(cfg.DataDir)})
	if err != nil {
		t.Error(err)
		return
	}
	ctx := context.Background()
	if sts, _ := rt.List(ctx); len(sts) > 0 {
		for _, s := range sts {
			rt.Destroy(ctx, s.ID, runsc.DestroyOpts{})
		}
	}
	rt.Collect(ctx, nil)
	ents, _ := os.ReadDir(filepath.Join(cfg.DataDir, "sandboxes"))
	for _, e := range ents {
		if err := rt.Destroy(ctx, e.Name(), runsc.DestroyOpts{}); err != nil {
			t.Errorf("destroy %s: %v", e.Name(), err)
		}
	}
	// runsc keeps a "null-netns" mount in its state root.
	unix.Unmount(filepath.Join(cfg.DataDir, "runsc", "null-netns"), unix.MNT_DETACH)
	prefix := config.ResourcePrefix(cfg.DataDir)
	if ns, _ := filepath.Glob("/var/run/netns/" + prefix + "*"); len(ns) > 0 {
		t.Errorf("netns left: %v", ns)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), cfg.DataDir+"/") {
		t.Errorf("mounts left under %s", cfg.DataDir)
	}
	if cgs := prefixedCgroups(prefix); len(cgs) > 0 {
		t.Errorf("cgroups left: %v", cgs)
	}
}

type harness struct {
	t     testing.TB
	cfg   *config.Config
	s     *Server
	ts    *httptest.Server
	token string
}

func startServer(t testing.TB, cfg *config.Config) *harness {
	t.Helper()
	s, err := New(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, cfg: cfg, s: s, ts: httptest.NewServer(s.Handler())}
	tok, err := os.ReadFile(filepath.Join(cfg.DataDir, "owner.token"))
	if err != nil {
		t.Fatal(err)
	}
	h.token = strings.TrimSpace(string(tok))
	t.Cleanup(h.close)
	return h
}

func (h *harness) close() {
	if h.ts != nil {
		h.ts.Close()
		h.s.Close()
		h.ts = nil
	}
}

func (h *harness) call(token, method, path string, body any) (int, []byte) {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.ts.URL+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (h *harness) provision(id, size string) sandboxObject {
	h.t.Helper()
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": id, "size": size})
	if code != http.StatusCreated {
		h.t.Fatalf("provision %s: %d %s", id, code, b)
	}
	var o sandboxObject
	json.Unmarshal(b, &o)
	return o
}

func (h *harness) exec(id string, req map[string]any) execResponse {
	h.t.Helper()
	if req["action"] == nil {
		req["action"] = "exec"
	}
	code, b := h.call(h.token, "POST", "/v1/sandbox/terminal/"+id, req)
	if code != http.StatusOK {
		h.t.Fatalf("exec in %s: %d %s", id, code, b)
	}
	var r execResponse
	json.Unmarshal(b, &r)
	return r
}

func (h *harness) sh(id, cmd string) execResponse {
	h.t.Helper()
	return h.exec(id, map[string]any{"command": cmd})
}

func (h *harness) get(id string) sandboxObject {
	h.t.Helper()
	code, b := h.call(h.token, "GET", "/v1/sandbox/"+id, nil)
	if code != http.StatusOK {
		h.t.Fatalf("get %s: %d %s", id, code, b)
	}
	var o sandboxObject
	json.Unmarshal(b, &o)
	return o
}

func TestRealSandboxLifecycle(t *testing.T) {
	h := startServer(t, realConfig(t))

	o := h.provision("s1", "")
	if o.Status != "running" || o.Size != "standard-1" || o.Resources.MemoryMiB != 1024 {
		t.Fatalf("provisioned: %+v", o)
	}

	t.Run("python version", func(t *testing.T) {
		r := h.sh("s1", "python --version")
		if r.ExitCode != 0 || !strings.HasPrefix(r.Stdout+r.Stderr, "Python 3.11") {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("python program", func(t *testing.T) {
		r := h.sh("s1", "python3 -c 'import sys, json; print(json.dumps({\"sum\": sum(range(10))})); print(\"warn\", file=sys.stderr); sys.exit(3)'")
		if r.ExitCode != 3 || r.Stdout != "{\"sum\": 45}\n" || r.Stderr != "warn\n" {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("node program", func(t *testing.T) {
		r := h.sh("s1", `node -e 'console.log([1,2,3].map(x => x * 2).join(",")); console.error("e"); process.exit(7)'`)
		if r.ExitCode != 7 || r.Stdout != "2,4,6\n" || r.Stderr != "e\n" {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("heredoc quotes multiline", func(t *testing.T) {
		cmd := "cat > prog.py <<'EOF'\nname = \"it's\"\nprint(f'{name} \"quoted\" $HOME')\nEOF\npython prog.py\necho \"done in $(pwd)\""
		r := h.sh("s1", cmd)
		if r.ExitCode != 0 || r.Stdout != "it's \"quoted\" $HOME\ndone in /workspace\n" {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("user cwd env stdin", func(t *testing.T) {
		r := h.exec("s1", map[string]any{"command": "id -un; pwd; echo $FOO; cat", "cwd": "/tmp", "env": map[string]string{"FOO": "bar"}, "stdin": "from stdin"})
		if r.ExitCode != 0 || r.Stdout != "user\n/tmp\nbar\nfrom stdin" {
			t.Fatalf("%+v", r)
		}
		// stdin not given: a reader sees EOF instead of hanging.
		r = h.exec("s1", map[string]any{"command": "cat; echo eof", "timeoutMs": 10000})
		if r.TimedOut || r.Stdout != "eof\n" {
			t.Fatalf("%+v", r)
		}
		code, b := h.call(h.token, "POST", "/v1/sandbox/terminal/s1", map[string]any{"action": "exec", "command": "pwd", "cwd": "/nonexistent"})
		if code != 400 || !strings.Contains(string(b), "cwd") {
			t.Fatalf("bad cwd: %d %s", code, b)
		}
	})
	t.Run("timeout kills process group", func(t *testing.T) {
		start := time.Now()
		r := h.exec("s1", map[string]any{"command": "sleep 300 & sleep 301; echo not reached", "timeoutMs": 1000})
		if !r.TimedOut || r.ExitCode != 124 || strings.Contains(r.Stdout, "not reached") {
			t.Fatalf("%+v", r)
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("timeout took %v", time.Since(start))
		}
		r = h.sh("s1", "ps -eo comm= | grep -c '^sleep$' || true")
		if strings.TrimSpace(r.Stdout) != "0" {
			t.Fatalf("sleep processes survived the timeout: %q", r.Stdout)
		}
	})
	t.Run("output cap", func(t *testing.T) {
		r := h.sh("s1", "head -c 3000000 /dev/zero | tr '\\0' a")
		if !r.Truncated || len(r.Stdout) != h.cfg.Limits.ExecOutputBytes || r.ExitCode != 0 {
			t.Fatalf("truncated=%v len=%d exit=%d", r.Truncated, len(r.Stdout), r.ExitCode)
		}
		// The answer says what it left out (TestRealExecOutputLimit has more).
		if r.StdoutDropped != int64(3000000-h.cfg.Limits.ExecOutputBytes) || r.StderrDropped != 0 || r.StoppedForOutput {
			t.Fatalf("dropped %d, %d, stopped %v", r.StdoutDropped, r.StderrDropped, r.StoppedForOutput)
		}
	})
	t.Run("no host data, no network", func(t *testing.T) {
		r := h.sh("s1", "cat /proc/1/cmdline | tr '\\0' ' '; echo; ls /var/lib/sandboxd 2>&1; (exec 3<>/dev/tcp/127.0.0.1/22) 2>&1 | head -1; ip -o link 2>/dev/null | wc -l")
		if !strings.HasPrefix(r.Stdout, "/.sandboxd/agent init") {
			t.Fatalf("pid 1: %q", r.Stdout)
		}
		if strings.Contains(r.Stdout, h.cfg.DataDir) {
			t.Fatalf("host data dir visible: %q", r.Stdout)
		}
		// Only the egress proxy is reachable, and it refuses an IP literal
		// (egress_e2e_test.go covers the network in depth).
		r = h.sh("s1", "timeout 5 curl -sSf -m 3 http://1.1.1.1/ 2>&1; echo rc=$?; timeout 5 curl -sS --noproxy '*' -m 3 http://1.1.1.1/ 2>&1; echo rc=$?")
		if strings.Count(r.Stdout, "rc=") != 2 || strings.Contains(r.Stdout, "rc=0") {
			t.Fatalf("network reachable: %q", r.Stdout)
		}
	})
	t.Run("loopback works inside", func(t *testing.T) {
		r := h.sh("s1", "python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 & for i in $(seq 50); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/ && break; sleep 0.1; done; kill %1")
		if !strings.HasSuffix(r.Stdout, "200") {
			t.Fatalf("loopback server unreachable: %+v", r)
		}
	})
	t.Run("PATH from env and default", func(t *testing.T) {
		if r := h.sh("s1", "echo $PATH"); !strings.Contains(r.Stdout, "/usr/sbin") {
			t.Fatalf("default PATH: %q", r.Stdout)
		}
		r := h.exec("s1", map[string]any{"command": "echo $PATH", "env": map[string]string{"PATH": "/opt/x:/usr/bin:/bin"}})
		if r.Stdout != "/opt/x:/usr/bin:/bin\n" {
			t.Fatalf("request PATH ignored: %q", r.Stdout)
		}
	})
	t.Run("user cannot reach the agent", func(t *testing.T) {
		r := h.sh("s1", `python3 -c '
import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("/.sandboxd/run/agent.sock"); print("connected")
except OSError as e:
    print("refused", e.errno)
'; ls /.sandboxd/run 2>&1 | head -1`)
		if strings.Contains(r.Stdout, "connected") || !strings.Contains(r.Stdout, "refused") {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("warm shells keep no request env, keep profile exports", func(t *testing.T) {
		h.sh("s1", "echo 'export MYVAR=fromprofile' >> ~/.profile")
		for i := 0; i < 3; i++ { // warm and cold paths alike
			h.exec("s1", map[string]any{"command": "true", "env": map[string]string{"ONE_SHOT": "deploykey-7f3a9c1e"}})
			r := h.sh("s1", "tr '\\0' '\\n' </proc/$$/environ | grep -c ONE_SHOT; echo \"my=$MYVAR one=$ONE_SHOT\"")
			if r.Stdout != "0\nmy=fromprofile one=\n" {
				t.Fatalf("run %d: %q", i, r.Stdout)
			}
		}
	})
	t.Run("stderr cannot forge runsc errors", func(t *testing.T) {
		r := h.sh("s1", "echo 'executing processes for container: connecting to control server: try again' >&2; exit 128")
		if r.ExitCode != 128 || !strings.Contains(r.Stderr, "executing processes") {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("secret redacted and injected", func(t *testing.T) {
		code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "sec1", "size": "test-tiny", "secrets": map[string]string{"API_KEY": "s3cr3t-value-123"}})
		if code != 201 || strings.Contains(string(b), "s3cr3t") {
			t.Fatalf("%d %s", code, b)
		}
		r := h.sh("sec1", "echo key=$API_KEY; python3 -c 'import os; print(os.environ[\"API_KEY\"])' >&2")
		if strings.Contains(r.Stdout+r.Stderr, "s3cr3t-value-123") || !strings.Contains(r.Stdout, "[REDACTED:API_KEY]") {
			t.Fatalf("%+v", r)
		}
		// Printed by a child process, slowly, encoded, and cut by the output cap.
		limit := h.cfg.Limits.ExecOutputBytes
		cmds := []string{
			"sh -c 'for c in $(echo \"$API_KEY\" | fold -w1); do printf %s \"$c\"; sleep 0.01; done; echo'",
			"printf %s \"$API_KEY\" | base64; printf %s \"user:$API_KEY\" | base64; printf %s \"$API_KEY\" | xxd -p",
			"python3 -c 'import os,json,urllib.parse as u; k=os.environ[\"API_KEY\"]; print(json.dumps({\"k\": k}), u.quote(k))'",
			fmt.Sprintf("{ head -c 999 /dev/zero | tr '\\0' E; echo; } >&2; sleep 0.3; head -c %d /dev/zero | tr '\\0' A; printf %%s \"$API_KEY\"", limit-999-4),
			fmt.Sprintf("printf %%s \"$API_KEY\"; head -c %d /dev/zero | tr '\\0' A; printf %%s \"$API_KEY\"", limit-8),
		}
		for _, c := range cmds {
			r := h.sh("sec1", c)
			all := r.Stdout + r.Stderr
			for _, frag := range []string{"s3cr3t-value-123", "s3cr3t-val", "czNjcjN0LXZhbHVlLTEyMw", "73336372337", "s3cr3t%2Dvalue"} {
				if strings.Contains(all, frag) {
					t.Fatalf("%q leaked %q: ...%q", c, frag, all[max(0, len(all)-200):])
				}
			}
		}
	})
	t.Run("disk cap", func(t *testing.T) {
		h.provision("disk1", "test-tiny")
		r := h.sh("disk1", "dd if=/dev/zero of=/workspace/big bs=1M count=400 2>&1; echo ws=$?; rm -f /workspace/big; dd if=/dev/zero of=/home/user/big bs=1M count=400 2>&1; echo home=$?; rm -f /home/user/big; df -m /workspace | tail -1")
		if !strings.Contains(r.Stdout, "No space left on device") || strings.Contains(r.Stdout, "ws=0") || strings.Contains(r.Stdout, "home=0") {
			t.Fatalf("%+v", r)
		}
		if r := h.sh("disk1", "echo fine > /workspace/ok && cat /workspace/ok"); r.Stdout != "fine\n" {
			t.Fatalf("after ENOSPC: %+v", r)
		}
	})
	t.Run("sessions isolated", func(t *testing.T) {
		h.provision("iso-a", "test-tiny")
		h.provision("iso-b", "test-tiny")
		h.sh("iso-a", "echo private > /workspace/a.txt; echo x > /tmp/a-tmp; (sleep 1234 &) ")
		r := h.sh("iso-b", "ls /workspace /tmp; ps -eo args=")
		if strings.Contains(r.Stdout, "a.txt") || strings.Contains(r.Stdout, "a-tmp") || strings.Contains(r.Stdout, "sleep 1234") {
			t.Fatalf("b sees a: %q", r.Stdout)
		}
		if r := h.sh("iso-a", "cat /workspace/a.txt; ps -eo args= | grep -c '^sleep 1234'"); r.Stdout != "private\n1\n" {
			t.Fatalf("a: %q", r.Stdout)
		}
	})
	t.Run("fork bomb contained", func(t *testing.T) {
		h.provision("bomb", "test-tiny")
		h.provision("bystander", "test-tiny")
		done := make(chan execResponse, 1)
		go func() {
			done <- h.exec("bomb", map[string]any{"command": "f(){ f | f & }; f; sleep 20", "timeoutMs": 8000})
		}()
		time.Sleep(2 * time.Second)
		// Another session keeps working while the bomb runs.
		if r := h.sh("bystander", "echo alive"); r.Stdout != "alive\n" {
			t.Fatalf("bystander: %+v", r)
		}
		r := <-done
		if !r.TimedOut {
			t.Logf("bomb ended: %+v", r)
		}
		// The bomb's sandbox itself survives it.
		if r := h.sh("bomb", "echo survived"); r.Stdout != "survived\n" {
			t.Fatalf("after bomb: %+v", r)
		}
		// A bomb that returns leaves its processes; "kill" clears them.
		r = h.exec("bomb", map[string]any{"command": "f(){ f | f & }; f; sleep 3; echo returned", "timeoutMs": 30000})
		if !strings.Contains(r.Stdout, "returned") {
			t.Logf("bomb 2: %+v", r)
		}
		code, b := h.call(h.token, "POST", "/v1/sandbox/terminal/bomb", map[string]any{"action": "kill"})
		if code != 200 {
			t.Fatalf("kill: %d %s", code, b)
		}
		// Left: init, the agent's warm shells, and this command's processes
		// (the bomb had about a hundred and fifty).
		if r := h.sh("bomb", "ps -e --no-headers | wc -l"); r.ExitCode != 0 || len(strings.TrimSpace(r.Stdout)) != 1 {
			t.Fatalf("after kill: %+v", r)
		}
	})
	t.Run("oom reported", func(t *testing.T) {
		h.provision("oom1", "test-tiny")
		r := h.sh("oom1", "python3 -c 'x = bytearray(2000 * 1024 * 1024); print(\"allocated\")'")
		if r.ExitCode != 137 || !r.OOM || strings.Contains(r.Stdout, "allocated") {
			t.Fatalf("%+v", r)
		}
		o := h.get("oom1")
		if o.Status != "failed" || o.StatusReason == nil || *o.StatusReason != "oom" {
			t.Fatalf("status after oom: %+v", o)
		}
		code, _ := h.call(h.token, "POST", "/v1/sandbox/terminal/oom1", map[string]any{"action": "exec", "command": "true"})
		if code != 409 {
			t.Fatalf("exec after oom: %d", code)
		}
		// Teardown releases what is left; the other sessions are unaffected.
		if code, b := h.call(h.token, "POST", "/v1/sandbox/oom1/teardown", nil); code != 200 {
			t.Fatalf("teardown after oom: %d %s", code, b)
		}
		if r := h.sh("s1", "echo still"); r.Stdout != "still\n" {
			t.Fatalf("%+v", r)
		}
	})
	t.Run("teardown keeps workspace, delete removes", func(t *testing.T) {
		h.sh("s1", "echo keep > /workspace/kept.txt")
		code, b := h.call(h.token, "POST", "/v1/sandbox/s1/teardown", nil)
		if code != 200 {
			t.Fatalf("teardown: %d %s", code, b)
		}
		var o sandboxObject
		json.Unmarshal(b, &o)
		if o.Status != "stopped" || o.Teardown == nil || o.Teardown.WorkspaceBytes < 5 || o.StoppedAt == nil {
			t.Fatalf("%s", b)
		}
		cid := h.s.rt.ContainerID(o.OrgID, "s1")
		if !diskExists(h.cfg, cid) {
			t.Fatal("disk not kept")
		}
		if code, _ := h.call(h.token, "POST", "/v1/sandbox/s1/teardown", nil); code != 200 {
			t.Fatalf("second teardown: %d", code)
		}
		if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/s1", nil); code != 204 {
			t.Fatalf("delete: %d", code)
		}
		if diskExists(h.cfg, cid) {
			t.Fatal("disk kept after delete")
		}
		if code, _ := h.call(h.token, "GET", "/v1/sandbox/s1", nil); code != 404 {
			t.Fatalf("get after delete: %d", code)
		}
		if code, _ := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "s1"}); code != 409 {
			t.Fatalf("reuse after delete: %d", code)
		}
	})
	t.Run("legacy size", func(t *testing.T) {
		o := h.provision("legacy1", "small")
		if o.Size != "standard-2" || o.RequestedSize != "small" || o.Resources.VCPUs != 2 {
			t.Fatalf("%+v", o)
		}
		r := h.sh("legacy1", "nproc; free -m | awk '/Mem:/{print $2}'")
		lines := strings.Fields(r.Stdout)
		if len(lines) != 2 || lines[0] != "2" {
			t.Fatalf("inside standard-2: %q", r.Stdout)
		}
	})
	t.Run("viewer and cross-org", func(t *testing.T) {
		p, err := h.s.db.Authenticate(context.Background(), h.token)
		if err != nil {
			t.Fatal(err)
		}
		_, _, viewer, err := h.s.db.AddMember(context.Background(), p.Org.ID, "viewer1", store.RoleViewer)
		if err != nil {
			t.Fatal(err)
		}
		if code, _ := h.call(viewer, "POST", "/v1/sandbox/terminal/legacy1", map[string]any{"action": "exec", "command": "true"}); code != 403 {
			t.Fatalf("viewer exec: %d", code)
		}
		if code, _ := h.call(viewer, "GET", "/v1/sandbox/legacy1", nil); code != 200 {
			t.Fatalf("viewer get: %d", code)
		}
		_, other, err := h.s.db.CreateOrg(context.Background(), "other", "owner2")
		if err != nil {
			t.Fatal(err)
		}
		c1, b1 := h.call(other, "POST", "/v1/sandbox/terminal/legacy1", map[string]any{"action": "exec", "command": "true"})
		c2, b2 := h.call(other, "POST", "/v1/sandbox/terminal/nosuch", map[string]any{"action": "exec", "command": "true"})
		if c1 != 404 || c2 != 404 || stripRequestID(b1) != stripRequestID(b2) {
			t.Fatalf("cross-org: %d %s vs %d %s", c1, b1, c2, b2)
		}
	})
}

func runCmd(name string, args ...string) (string, error) {
	out, err := osexec.Command(name, args...).CombinedOutput()
	return string(out), err
}

func stripRequestID(b []byte) string {
	var e errorBody
	json.Unmarshal(b, &e)
	e.Error.RequestID = ""
	out, _ := json.Marshal(e)
	return string(out)
}

func TestRealRestartKeepsSandbox(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("r1", "test-tiny")
	h.sh("r1", "echo before > /workspace/f; (sleep 999 &)")
	h.close()

	h2 := startServer(t, cfg)
	if o := h2.get("r1"); o.Status != "running" {
		t.Fatalf("after restart: %+v", o)
	}
	r := h2.sh("r1", "cat /workspace/f; ps -eo args= | grep -c '^sleep 999'")
	if r.Stdout != "before\n1\n" {
		t.Fatalf("after restart: %+v", r)
	}
	// A sandbox that died while the server was down is marked failed.
	h2.provision("r2", "test-tiny")
	h2.close()
	rt := h2.s.rt.(*runsc.Runtime)
	st, err := rt.Inspect(context.Background(), rt.ContainerID(h2.get2("r2").OrgID, "r2"))
	t.Logf("r2 before kill: %+v %v", st, err)
	if st.Pid > 0 {
		unix.Kill(st.Pid, unix.SIGKILL)
	}
	time.Sleep(500 * time.Millisecond)
	h3 := startServer(t, cfg)
	if o := h3.get("r2"); o.Status != "failed" {
		t.Fatalf("dead sandbox after restart: %+v", o)
	}
	if o := h3.get("r1"); o.Status != "running" {
		t.Fatalf("r1 after second restart: %+v", o)
	}
}

// get2 reads a session straight from the store (the HTTP server is closed).
func (h *harness) get2(id string) store.Session {
	h.t.Helper()
	db, err := store.Open(config.DBPath(h.cfg.DataDir))
	if err != nil {
		h.t.Fatal(err)
	}
	defer db.Close()
	list, err := db.ListLiveSessions(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	for _, s := range list {
		if s.SessionID == id {
			return s
		}
	}
	h.t.Fatalf("session %s not found", id)
	return store.Session{}
}

// TestRealFailedProvisionLeavesNothing makes runsc fail at create and at
// start (a wrapper around the real binary) and checks that nothing is left:
// no netns, mount, cgroup, bundle, runsc container or session row.
func TestRealFailedProvisionLeavesNothing(t *testing.T) {
	for _, step := range []string{"create", "start"} {
		t.Run(step, func(t *testing.T) {
			cfg := realConfig(t)
			real := cfg.Runsc.Binary
			cfg.Runsc.Binary = failingRunsc(t, real, step)
			h := startServer(t, cfg)
			code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "fail1", "size": "test-tiny"})
			if code != 503 || strings.Contains(string(b), "runsc") || strings.Contains(string(b), cfg.DataDir) {
				t.Fatalf("%d %s", code, b)
			}
			if code, _ := h.call(h.token, "GET", "/v1/sandbox/fail1", nil); code != 404 {
				t.Fatalf("row left: %d", code)
			}
			prefix := config.ResourcePrefix(cfg.DataDir)
			if ns, _ := filepath.Glob("/var/run/netns/" + prefix + "*"); len(ns) > 0 {
				t.Fatalf("netns left: %v", ns)
			}
			mi, _ := os.ReadFile("/proc/self/mountinfo")
			if strings.Contains(string(mi), filepath.Join(cfg.DataDir, "sandboxes")+"/") {
				t.Fatal("mounts left")
			}
			if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/" + prefix + "*"); len(cgs) > 0 {
				t.Fatalf("cgroups left: %v", cgs)
			}
			if ents, _ := os.ReadDir(filepath.Join(cfg.DataDir, "sandboxes")); len(ents) > 0 {
				t.Fatalf("sandbox dirs left: %v", ents)
			}
			out, _ := runCmd(real, "--root", filepath.Join(cfg.DataDir, "runsc"), "list", "-quiet")
			if strings.TrimSpace(out) != "" {
				t.Fatalf("runsc containers left: %q", out)
			}
			cfg.Runsc.Binary = real
		})
	}
}

// failingRunsc writes a wrapper around the real runsc that runs the
// command step (create, start, ...) and then fails it.
func failingRunsc(t *testing.T, real, step string) string {
	wrapper := filepath.Join(t.TempDir(), "runsc-failing")
	script := fmt.Sprintf("#!/bin/sh\nfor a in \"$@\"; do if [ \"$a\" = %s ]; then \"%s\" \"$@\" >/dev/null 2>&1; echo injected failure >&2; exit 1; fi; done\nexec \"%s\" \"$@\"\n",
		step, real, real)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper
}

// TestRealTwoServersSideBySide runs two servers with different data dirs
// (and so different prefixes, runsc roots and resources): the same session
// id works in both, and removing one's sandboxes leaves the other's alone.
func TestRealTwoServersSideBySide(t *testing.T) {
	a := startServer(t, realConfig(t))
	b := startServer(t, realConfig(t))
	if config.ResourcePrefix(a.cfg.DataDir) == config.ResourcePrefix(b.cfg.DataDir) {
		t.Fatal("same resource prefix for different data dirs")
	}
	a.provision("same", "test-tiny")
	b.provision("same", "test-tiny")
	a.sh("same", "echo from-a > /workspace/who")
	b.sh("same", "echo from-b > /workspace/who")
	if code, _ := a.call(a.token, "DELETE", "/v1/sandbox/same", nil); code != 204 {
		t.Fatalf("delete in a: %d", code)
	}
	// Collecting a's leftovers must not touch b's sandbox.
	a.s.rt.Collect(context.Background(), nil)
	if r := b.sh("same", "cat /workspace/who"); r.Stdout != "from-b\n" {
		t.Fatalf("b after a's delete: %+v", r)
	}
}

// One server per data dir: a second one on the same dir refuses to start
// (it would reconcile the first one's sandboxes away), and stopping the
// first leaves no mount behind.
func TestRealDataDirLock(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("lock1", "test-tiny")
	if s2, err := New(context.Background(), cfg, io.Discard); err == nil || !strings.Contains(err.Error(), "in use") {
		if s2 != nil {
			s2.Close()
		}
		t.Fatalf("second server on the same data dir: %v", err)
	}
	if o := h.get("lock1"); o.Status != "running" {
		t.Fatalf("first server's session: %+v", o)
	}
	if code, b := h.call(h.token, "DELETE", "/v1/sandbox/lock1", nil); code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("delete: %d %s", code, b)
	}
	h.close()
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), cfg.DataDir+"/") {
		t.Fatalf("mounts left under %s after the server stopped", cfg.DataDir)
	}
	s2, err := New(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	s2.Close()
}

// diskExists reports whether a sandbox has a saved disk.img.
func diskExists(cfg *config.Config, id string) bool {
	_, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", id, "disk.img"))
	return err == nil
}

// prefixedCgroups finds cgroups named with prefix where sandboxes make
// theirs: under this process's own cgroup in every hierarchy (a relative
// cgroupsPath nests there, e.g. memory:/process_api/<id>), and at the roots.
func prefixedCgroups(prefix string) []string {
	dirs := map[string]bool{}
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		ctrls := strings.Split(f[1], ",")
		if f[1] == "" {
			ctrls = []string{"unified", ""} // v2: its own mount, or the root
		}
		for _, c := range ctrls {
			c = strings.TrimPrefix(c, "name=")
			dirs[filepath.Join("/sys/fs/cgroup", c, f[2])] = true
			dirs[filepath.Join("/sys/fs/cgroup", c)] = true
		}
	}
	var out []string
	for d := range dirs {
		m, _ := filepath.Glob(filepath.Join(d, prefix+"*"))
		out = append(out, m...)
	}
	return out
}
