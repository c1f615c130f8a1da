package main

// End-to-end tests: the real server binary ($SANDBOXD_BIN/sandboxd, real
// gVisor sandboxes) as a child process, and the sbx binary built from this
// package, run as a user would. They need root and `make build` (plus the
// default image); they skip in -short mode.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandboxd/server/client"
	"sandboxd/server/config"
)

// buildSbx builds sbx from this package (static, as make build does).
func buildSbx(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "sbx")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// realServer is a sandboxd serve child process on a fresh data dir.
type realServer struct {
	t       *testing.T
	url     string
	addr    string
	dataDir string
	token   string
	tokFile string
	cfgDir  string // XDG_CONFIG_HOME of the sbx runs
	sbx     string
	cmd     *exec.Cmd
	log     *os.File
	done    chan error
}

func startRealServer(t *testing.T) *realServer {
	t.Helper()
	if testing.Short() {
		t.Skip("real gVisor test (not in -short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("real gVisor tests need root")
	}
	bin := os.Getenv("SANDBOXD_BIN")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin")
	}
	for _, f := range []string{"sandboxd", "runsc", "sandboxd-agent"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			t.Fatalf("%s missing in %s: run `make build`", f, bin)
		}
	}
	sbx := buildSbx(t)
	// Short: agent sockets live under it (a unix socket path has 107 bytes).
	dir, err := os.MkdirTemp("", "sbxc")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.CreateTemp("", "sbxc-log-")
	if err != nil {
		t.Fatal(err)
	}
	s := &realServer{t: t, url: "http://" + addr, addr: addr, dataDir: dir, sbx: sbx, log: logf,
		cfgDir: t.TempDir(), done: make(chan error, 1)}
	s.cmd = exec.Command(filepath.Join(bin, "sandboxd"), "serve", "--data-dir", dir, "--listen", addr, "--no-image-build")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(s.stop)
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(s.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("server exited: %v\n%s", err, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not healthy after 90 s\n%s", s.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.tokFile = filepath.Join(dir, "owner.token")
	b, err := os.ReadFile(s.tokFile)
	if err != nil {
		t.Fatal(err)
	}
	s.token = strings.TrimSpace(string(b))
	return s
}

func (s *realServer) logTail() string {
	b, _ := os.ReadFile(s.log.Name())
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// stop deletes every session through the API (sandboxes outlive the
// server by design), stops the server with SIGTERM and checks that it left
// no mounts under its data dir and no network namespaces of its own.
func (s *realServer) stop() {
	t := s.t
	c, err := client.New(s.url, s.token)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		if l, err := c.List(ctx, ""); err == nil {
			for _, sb := range l.Sandboxes {
				if err := c.Delete(ctx, sb.SessionID); err != nil {
					t.Errorf("delete %s: %v", sb.SessionID, err)
				}
			}
		} else {
			t.Errorf("list sessions: %v", err)
		}
		cancel()
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("SIGTERM: %v", err)
	}
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("server exit: %v\n%s", err, s.logTail())
		}
	case <-time.After(90 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
		t.Errorf("server did not stop within 90 s of SIGTERM\n%s", s.logTail())
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, s.dataDir+"/") {
			t.Errorf("mount left under the data dir: %s", line)
		}
	}
	prefix := config.ResourcePrefix(s.dataDir)
	if ns, _ := filepath.Glob("/var/run/netns/" + prefix + "*"); len(ns) > 0 {
		t.Errorf("netns left: %v", ns)
	}
	if t.Failed() {
		t.Logf("server log:\n%s", s.logTail())
	}
	s.log.Close()
	os.Remove(s.log.Name())
	os.RemoveAll(s.dataDir)
}

// result is one sbx run.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout: %q\nstderr: %q", r.code, r.stdout, r.stderr)
}

// run runs sbx with stdin (nil: /dev/null), the test's config dir and no
// SBX_* variables from the environment.
func (s *realServer) run(stdin io.Reader, args ...string) result {
	s.t.Helper()
	return s.runEnv(nil, stdin, args...)
}

// ok runs sbx and fails the test unless it exits 0.
func (s *realServer) ok(stdin io.Reader, args ...string) result {
	s.t.Helper()
	r := s.run(stdin, args...)
	if r.code != 0 {
		s.t.Fatalf("sbx %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// jsonOf decodes a --json answer.
func jsonOf(t *testing.T, r result) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatalf("--json output is not a JSON object: %v\n%s", err, r.stdout)
	}
	return m
}

var apiErrorLine = regexp.MustCompile(`^sbx: .+ \([a-z_0-9]+, request [A-Za-z0-9_-]+\)\n$`)

// TestE2E drives one session through the whole command line.
func TestE2E(t *testing.T) {
	s := startRealServer(t)
	id := fmt.Sprintf("sbxe2e-%d", os.Getpid())
	work := t.TempDir()

	// login: checks the token, saves server and token (0600).
	r := s.ok(nil, "login", "--server", s.url, "--token-file", s.tokFile)
	if !strings.Contains(r.stdout, "Logged in to "+s.url) {
		t.Errorf("login: %s", r)
	}
	cfgPath := filepath.Join(s.cfgDir, "sbx", "config.json")
	st, err := os.Stat(cfgPath)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config file: %v %v", st, err)
	}
	if b, _ := os.ReadFile(cfgPath); !strings.Contains(string(b), s.token) || !strings.Contains(string(b), s.url) {
		t.Errorf("config file lacks the server or token")
	}
	if r := s.run(nil, "login", "--server", s.url, "--token", "sbx_wrong"); r.code != 1 || !apiErrorLine.MatchString(r.stderr) || !strings.Contains(r.stderr, "(unauthenticated, request ") {
		t.Errorf("login with a bad token: %s", r)
	}

	// provision, with a secret from the environment and a file, env and idle settings.
	secretFile := filepath.Join(work, "secret")
	os.WriteFile(secretFile, []byte("file-secret-value-42\n"), 0o600)
	r = s.runEnv([]string{"SBXE2E_SECRET=env-secret-value-17"}, nil, "provision", id, "--json", "--size", "standard-1",
		"--secret", "SBXE2E_SECRET", "--secret", "FILESECRET=@"+secretFile, "--env", "GREETING=hello world",
		"--idle-timeout", "10m", "--idle-action", "pause")
	if r.code != 0 {
		t.Fatalf("provision: %s", r)
	}
	sb := jsonOf(t, r)
	if sb["status"] != "running" || sb["sessionId"] != id || sb["idleTimeoutSeconds"] != float64(600) || sb["idleAction"] != "pause" {
		t.Errorf("provision answer: %v", sb)
	}
	if r := s.run(nil, "provision", id); r.code != 1 || !strings.Contains(r.stderr, "(conflict, request ") {
		t.Errorf("provision of a used id: %s", r)
	}

	t.Run("exec", func(t *testing.T) {
		r := s.run(nil, "exec", id, "--", "echo out; echo err >&2; exit 3")
		if r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
			t.Errorf("exit 3: %s", r)
		}
		r = s.ok(nil, "exec", id, "--", "echo", "$GREETING", "$SBXE2E_SECRET", "$FILESECRET")
		if r.stdout != "hello world [REDACTED:SBXE2E_SECRET] [REDACTED:FILESECRET]\n" {
			t.Errorf("env and secrets: %s", r)
		}
		r = s.ok(strings.NewReader("line one\nline two\n"), "exec", id, "--cwd", "/tmp", "--env", "A=1", "--", "pwd; echo A=$A; wc -l")
		if r.stdout != "/tmp\nA=1\n2\n" {
			t.Errorf("cwd, env, stdin: %s", r)
		}
		r = s.run(nil, "exec", id, "--timeout", "1s", "--", "sleep 10")
		if r.code != 124 || !strings.Contains(r.stderr, "timed out") {
			t.Errorf("timeout: %s", r)
		}
		r = s.run(nil, "--json", "exec", id, "--", "echo hi; exit 5")
		if m := jsonOf(t, r); r.code != 5 || m["exitCode"] != float64(5) || m["stdout"] != "hi\n" {
			t.Errorf("--json exec: %s", r)
		}
		if r := s.run(nil, "exec", id); r.code != 2 {
			t.Errorf("exec without a command: %s", r)
		}
	})

	t.Run("cp", func(t *testing.T) {
		small := filepath.Join(work, "small.txt")
		os.WriteFile(small, []byte("small file\n"), 0o644)
		big := make([]byte, 20<<20)
		rand.Read(big)
		bigPath := filepath.Join(work, "big.bin")
		os.WriteFile(bigPath, big, 0o644)

		r := s.ok(nil, "cp", small, id+":/workspace/in/")
		if !strings.Contains(r.stderr, "/workspace/in/small.txt created") {
			t.Errorf("upload into a directory: %s", r)
		}
		s.ok(nil, "cp", bigPath, id+":in/big.bin")
		// Into an existing directory named without a slash.
		s.ok(nil, "cp", small, id+":/workspace/in")
		r = s.ok(nil, "exec", id, "--", "ls /workspace/in; sha256sum /workspace/in/big.bin")
		sum := sha256.Sum256(big)
		if r.stdout != "big.bin\nsmall.txt\n"+hex.EncodeToString(sum[:])+"  /workspace/in/big.bin\n" {
			t.Errorf("after uploads: %s", r)
		}
		// Down again, with the progress bar forced (stderr is no terminal).
		down := filepath.Join(work, "down.bin")
		r = s.ok(nil, "cp", "--progress", id+":/workspace/in/big.bin", down)
		if got, _ := os.ReadFile(down); !bytes.Equal(got, big) {
			t.Errorf("20 MB round trip: the bytes differ (%d of %d)", len(got), len(big))
		}
		downDir := t.TempDir()
		s.ok(nil, "cp", id+":in/small.txt", downDir)
		if got, _ := os.ReadFile(filepath.Join(downDir, "small.txt")); string(got) != "small file\n" {
			t.Errorf("download into a directory: %q", got)
		}
		r = s.ok(strings.NewReader("from stdin"), "cp", "-", id+":in/stdin.txt")
		r = s.ok(nil, "cp", id+":in/stdin.txt", "-")
		if r.stdout != "from stdin" {
			t.Errorf("stdin up, stdout down: %s", r)
		}
		if r := s.run(nil, "cp", id+":/workspace/nope.txt", filepath.Join(work, "nope")); r.code != 1 || !strings.Contains(r.stderr, "(not_found, request ") {
			t.Errorf("missing file: %s", r)
		}
		if _, err := os.Stat(filepath.Join(work, "nope")); err == nil {
			t.Error("a failed download left a file")
		}
		if r := s.run(nil, "cp", id+":/workspace/in", filepath.Join(work, "x")); r.code != 2 {
			t.Errorf("download of a directory: %s", r)
		}
	})

	t.Run("run", func(t *testing.T) {
		py := filepath.Join(work, "hello.py")
		os.WriteFile(py, []byte("import sys\nprint('hello from', 'python')\nprint('warn', file=sys.stderr)\nx = 6 * 7\nx\n"), 0o644)
		r := s.ok(nil, "run", "python", id, py)
		if r.stdout != "hello from python\n42\n" || r.stderr != "warn\n" {
			t.Errorf("python file: %s", r)
		}
		// The default context keeps x; stdin as the source.
		r = s.ok(strings.NewReader("x + 1\n"), "run", "python", id)
		if r.stdout != "43\n" {
			t.Errorf("python stdin: %s", r)
		}
		s.ok(strings.NewReader("y = 10"), "run", "python", id, "-", "--context", "c2")
		r = s.ok(strings.NewReader("y * 2"), "run", "python", id, "--context", "c2")
		if r.stdout != "20\n" {
			t.Errorf("python context c2: %s", r)
		}
		r = s.run(strings.NewReader("1/0"), "run", "python", id)
		if r.code != 1 || !strings.Contains(r.stderr, "ZeroDivisionError") {
			t.Errorf("python error: %s", r)
		}
		img := t.TempDir()
		r = s.ok(strings.NewReader("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n"),
			"run", "python", id, "--out-dir", img)
		m := regexp.MustCompile(`\[image/png saved to (\S+)\]`).FindStringSubmatch(r.stdout)
		if m == nil {
			t.Errorf("python image: %s", r)
		} else if b, err := os.ReadFile(m[1]); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Errorf("image file %s: %v", m[1], err)
		}
		r = s.run(strings.NewReader("1 + 2"), "--json", "run", "node", id)
		if m := jsonOf(t, r); r.code != 0 || m["result"] != "3" {
			t.Errorf("node --json: %s", r)
		}
	})

	t.Run("artifacts", func(t *testing.T) {
		r := s.ok(nil, "--json", "artifacts", id)
		var list []map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
			t.Fatalf("artifacts --json: %v\n%s", err, r.stdout)
		}
		sum := sha256.Sum256([]byte("small file\n"))
		found := false
		for _, a := range list {
			if a["path"] == "in/small.txt" && a["sha256"] == hex.EncodeToString(sum[:]) && a["size"] == float64(11) {
				found = true
			}
		}
		if !found {
			t.Errorf("in/small.txt not listed right: %s", r.stdout)
		}
		r = s.ok(nil, "artifacts", id)
		if !strings.Contains(r.stdout, "in/big.bin") || !strings.HasPrefix(r.stdout, "PATH") {
			t.Errorf("artifacts table: %s", r)
		}
		out := filepath.Join(work, "artifact.txt")
		s.ok(nil, "artifacts", "get", id, "in/small.txt", "-o", out)
		if b, _ := os.ReadFile(out); string(b) != "small file\n" {
			t.Errorf("artifact get: %q", b)
		}
	})

	t.Run("logs", func(t *testing.T) {
		r := s.ok(nil, "logs", id)
		if !strings.Contains(r.stdout, "event process_start") {
			t.Errorf("logs: %s", r)
		}
		r = s.ok(nil, "--json", "logs", id)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		for _, l := range lines {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil || m["type"] == nil {
				t.Errorf("logs --json line %q: %v", l, err)
			}
		}
		// -f: history, then live entries; ended by SIGINT.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, s.sbx, "logs", "-f", "--json", id)
		cmd.Env = []string{"XDG_CONFIG_HOME=" + s.cfgDir, "HOME=" + s.cfgDir}
		pipe, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		s.ok(nil, "exec", id, "--", "echo follow-marker-1")
		sc := bufio.NewScanner(pipe)
		sc.Buffer(nil, 1<<20)
		seen := false
		for sc.Scan() {
			if strings.Contains(sc.Text(), "follow-marker-1") {
				seen = true
				break
			}
		}
		cmd.Process.Signal(os.Interrupt)
		go io.Copy(io.Discard, pipe)
		err := cmd.Wait()
		if !seen {
			t.Error("logs -f did not show a new entry")
		}
		if err != nil {
			t.Errorf("logs -f after SIGINT: %v", err)
		}
	})

	t.Run("lifecycle", func(t *testing.T) {
		s.ok(nil, "exec", id, "--", "echo kept > /workspace/kept.txt")
		r := s.ok(nil, "pause", id)
		if r.stdout != id+" paused\n" {
			t.Errorf("pause: %s", r)
		}
		r = s.ok(nil, "--json", "ls", "--status", "paused")
		if !strings.Contains(r.stdout, `"sessionId": "`+id+`"`) {
			t.Errorf("ls --status paused: %s", r)
		}
		jsonOf(t, r)
		if m := jsonOf(t, s.ok(nil, "--json", "resume", id)); m["status"] != "running" {
			t.Errorf("resume after pause: %v", m)
		}
		r = s.ok(nil, "--json", "teardown", id)
		m := jsonOf(t, r)
		td, _ := m["teardown"].(map[string]any)
		if m["status"] != "stopped" || td == nil || td["workspaceBytes"].(float64) < 20<<20 {
			t.Errorf("teardown: %v", m)
		}
		// Artifacts and files after teardown.
		r = s.ok(nil, "cp", id+":kept.txt", "-")
		if r.stdout != "kept\n" {
			t.Errorf("download after teardown: %s", r)
		}
		if r := s.run(nil, "exec", id, "--", "true"); r.code != 255 || !strings.Contains(r.stderr, "(conflict, request ") {
			t.Errorf("exec in a stopped session: %s", r)
		}
		r = s.ok(nil, "resume", id)
		if r.stdout != id+" running\n" {
			t.Errorf("resume: %s", r)
		}
		r = s.ok(nil, "exec", id, "--", "cat /workspace/kept.txt; sha256sum < /workspace/in/big.bin | cut -c1-8")
		if !strings.HasPrefix(r.stdout, "kept\n") {
			t.Errorf("after resume: %s", r)
		}
		r = s.ok(nil, "ls")
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + `\s+running\s+standard-1`).MatchString(r.stdout) {
			t.Errorf("ls: %s", r)
		}
		if m := jsonOf(t, s.ok(nil, "--json", "ls")); m["sandboxes"] == nil {
			t.Errorf("ls --json: %v", m)
		}
	})

	t.Run("usage", func(t *testing.T) {
		// The session has run (above): the first organization is on the
		// team plan by default, and the session is in the period's table.
		r := s.ok(nil, "usage")
		for _, re := range []string{
			`(?m)^plan:\s+team \(3000 credits a month`,
			`(?m)^period:\s+\d{4}-\d\d-\d\d to \d{4}-\d\d-\d\d UTC \(current, `,
			`(?m)^allowance:\s+3000\.000 credits$`,
			`(?m)^used:\s+\d+\.\d{3}$`,
			`(?m)^remaining:\s+\d+\.\d{3}$`,
			`(?m)^SESSION\s+SIZE\s+STATUS\s+RUNNING\s+CREDITS\s+EGRESS\s+SAVED$`,
			`(?m)^` + regexp.QuoteMeta(id) + `\s+standard-1\s+running\s+\S+\s+\d+\.\d{3}\s`,
			`(?m)^DAY \(UTC\)\s+RUNNING\s+CREDITS$`,
		} {
			if !regexp.MustCompile(re).MatchString(r.stdout) {
				t.Errorf("usage lacks %s:\n%s", re, r.stdout)
			}
		}
		m := jsonOf(t, s.ok(nil, "--json", "usage"))
		var u client.Usage
		if err := json.Unmarshal([]byte(s.ok(nil, "--json", "usage").stdout), &u); err != nil {
			t.Fatalf("usage --json: %v", err)
		}
		used, _ := m["used"].(map[string]any)
		if _, ok := used["milli"].(float64); !ok || u.Plan.Name != "team" || u.Allowance.Milli != 3_000_000 || u.Used.Milli < 0 ||
			u.Remaining.Milli != u.Allowance.Milli+u.Granted.Milli-u.Used.Milli || len(u.Sessions) == 0 || len(u.Days) == 0 {
			t.Errorf("usage --json: %v", m)
		}
		found := false
		for _, su := range u.Sessions {
			// Credits are whole thousandths: a few seconds at 1 credit an hour may still be 0.
			found = found || (su.SessionID == id && su.RunningSeconds > 0 && su.Credits.Milli >= 0 && su.Credits.Milli <= u.Used.Milli)
		}
		if !found {
			t.Errorf("usage --json: no %s that ran: %+v", id, u.Sessions)
		}
		// The previous period: nothing ran in it.
		var prev client.Usage
		if err := json.Unmarshal([]byte(s.ok(nil, "--json", "usage", "--period", "previous").stdout), &prev); err != nil {
			t.Fatal(err)
		}
		if !prev.Period.End.Equal(u.Period.Start) || prev.Used.Milli != 0 || len(prev.Sessions) != 0 {
			t.Errorf("previous period: %+v (current %+v)", prev, u.Period)
		}
		if r := s.ok(nil, "usage", "--period", "previous"); !strings.Contains(r.stdout, "(ended)") || !strings.Contains(r.stdout, "No session ran in this period.") {
			t.Errorf("usage --period previous: %s", r)
		}
		if r := s.ok(nil, "usage", "--period", u.Period.Start.Format("2006-01-02")); !strings.Contains(r.stdout, id) {
			t.Errorf("usage --period <start date>: %s", r)
		}
		r = s.run(nil, "usage", "--period", "last-year")
		if r.code != 1 || !apiErrorLine.MatchString(r.stderr) || !strings.Contains(r.stderr, "period: current, previous or a date") ||
			!strings.Contains(r.stderr, "(invalid_request, request ") {
			t.Errorf("usage with a bad period: %s", r)
		}
		if r := s.run(nil, "usage", "--org", "org_nope"); r.code != 1 || !strings.Contains(r.stderr, "(not_found, request ") {
			t.Errorf("usage of an unknown organization: %s", r)
		}
	})

	t.Run("errors", func(t *testing.T) {
		r := s.run(nil, "get", "no-such-session")
		if r.code != 1 || !apiErrorLine.MatchString(r.stderr) || !strings.Contains(r.stderr, "(not_found, request ") {
			t.Errorf("unknown session: %s", r)
		}
		if r := s.run(nil, "get", "-bad-id-"); r.code != 2 {
			t.Errorf("bad session id: %s", r)
		}
		if r := s.run(nil, "nonsense"); r.code != 2 {
			t.Errorf("unknown command: %s", r)
		}
		if r := s.run(nil, "ls", "--server", "http://127.0.0.1:1", "--token", "sbx_x"); r.code != 1 || !strings.Contains(r.stderr, "cannot reach the server") {
			t.Errorf("server down: %s", r)
		}
		// The saved token is for the saved server only.
		if r := s.run(nil, "ls", "--server", "http://127.0.0.1:1"); r.code != 1 || !strings.Contains(r.stderr, "no API token") {
			t.Errorf("another server without a token: %s", r)
		}
	})

	t.Run("shell", func(t *testing.T) { testShell(t, s, id) })
	t.Run("shell-reconnect", func(t *testing.T) { testShellReconnect(t, s, id) })

	r = s.ok(nil, "delete", id)
	if r.stdout != id+" deleted\n" {
		t.Errorf("delete: %s", r)
	}
	if r := s.run(nil, "get", id); r.code != 1 {
		t.Errorf("get after delete: %s", r)
	}
}

// runEnv is run with extra environment variables.
func (s *realServer) runEnv(env []string, stdin io.Reader, args ...string) result {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.sbx, args...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.cfgDir, "XDG_CONFIG_HOME=" + s.cfgDir}, env...)
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatalf("sbx %v: %v", args, err)
	}
	return r
}

// tmux is a private tmux server (its own socket) for driving sbx shell
// through a real pseudo-terminal.
type tmux struct {
	t      *testing.T
	socket string
}

func newTmux(t *testing.T) *tmux {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux not installed")
	}
	tm := &tmux{t: t, socket: fmt.Sprintf("sbxtest-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))}
	t.Cleanup(func() {
		exec.Command("tmux", "-L", tm.socket, "kill-server").Run()
		// The server leaves its socket file behind.
		dir := os.Getenv("TMUX_TMPDIR")
		if dir == "" {
			dir = "/tmp"
		}
		os.Remove(filepath.Join(dir, fmt.Sprintf("tmux-%d", os.Getuid()), tm.socket))
	})
	return tm
}

func (tm *tmux) cmd(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", tm.socket}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// screen is the pane's visible text.
func (tm *tmux) screen(name string) string { return tm.cmd("capture-pane", "-p", "-t", name) }

// waitFor waits until the screen matches re and returns the screen.
func (tm *tmux) waitFor(name string, re *regexp.Regexp) string {
	tm.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sc := tm.screen(name)
		if re.MatchString(sc) {
			return sc
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("screen never matched %s:\n%s", re, sc)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

// waitFile waits for a file (the exit status the pane's wrapper writes).
func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(b), "\n") {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never written", path)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shellCommand is the pane's command: sbx shell, then its exit status
// written to statusFile; the pane stays for capture.
func (s *realServer) shellCommand(statusFile string, extra ...string) string {
	args := append([]string{s.sbx, "shell"}, extra...)
	return fmt.Sprintf("env XDG_CONFIG_HOME=%s HOME=%s %s; echo $? > %s; sleep 600",
		s.cfgDir, s.cfgDir, strings.Join(args, " "), statusFile)
}

func testShell(t *testing.T, s *realServer, id string) {
	tm := newTmux(t)
	status := filepath.Join(t.TempDir(), "status")
	tm.cmd("new-session", "-d", "-s", "sh1", "-x", "120", "-y", "40", s.shellCommand(status, id))
	tm.waitFor("sh1", regexp.MustCompile(`\$ $|\$\s*\n`))
	tm.cmd("send-keys", "-t", "sh1", "echo $((6*7))", "Enter")
	tm.waitFor("sh1", regexp.MustCompile(`(?m)^42$`))
	tm.cmd("send-keys", "-t", "sh1", "tput cols", "Enter")
	tm.waitFor("sh1", regexp.MustCompile(`(?m)^120$`))
	// The window shrinks: sbx gets SIGWINCH and resizes the remote PTY.
	tm.cmd("resize-window", "-t", "sh1", "-x", "100", "-y", "40")
	time.Sleep(500 * time.Millisecond)
	tm.cmd("send-keys", "-t", "sh1", "clear; tput cols", "Enter")
	tm.waitFor("sh1", regexp.MustCompile(`(?m)^100$`))
	tm.cmd("send-keys", "-t", "sh1", "exit 7", "Enter")
	if got := waitFile(t, status); got != "7" {
		t.Errorf("sbx shell exit status %s, want 7\n%s", got, tm.screen("sh1"))
	}
}

// cutProxy forwards TCP connections to a server and can cut them all, as
// a network failure would.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { ln.Close(); p.cut(); p.wg.Wait() })
	return p
}

func (p *cutProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(u, c); u.Close() }()
		go func() { defer p.wg.Done(); io.Copy(c, u); c.Close() }()
	}
}

// cut closes every connection made so far.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// The connection drops under a running shell: sbx reconnects to the same
// shell (its state is there) and shows only what it had not shown.
func testShellReconnect(t *testing.T, s *realServer, id string) {
	tm := newTmux(t)
	p := newCutProxy(t, s.addr)
	status := filepath.Join(t.TempDir(), "status")
	tm.cmd("new-session", "-d", "-s", "rc", "-x", "120", "-y", "40",
		s.shellCommand(status, "--server", "http://"+p.ln.Addr().String(), "--token-file", s.tokFile, id))
	tm.waitFor("rc", regexp.MustCompile(`\$ $|\$\s*\n`))
	tm.cmd("send-keys", "-t", "rc", "KEEP=kept-$((40+2)); echo before-$((40+2))", "Enter")
	tm.waitFor("rc", regexp.MustCompile(`(?m)^before-42$`))
	p.cut()
	tm.waitFor("rc", regexp.MustCompile(`sbx: reconnected`))
	tm.cmd("send-keys", "-t", "rc", "echo after-$KEEP", "Enter")
	sc := tm.waitFor("rc", regexp.MustCompile(`(?m)^after-kept-42$`))
	if n := len(regexp.MustCompile(`(?m)^before-42$`).FindAllString(sc, -1)); n != 1 {
		t.Errorf("output before the drop shown %d times (the replay was not skipped):\n%s", n, sc)
	}
	tm.cmd("send-keys", "-t", "rc", "exit", "Enter")
	if got := waitFile(t, status); got != "0" {
		t.Errorf("exit status %s, want 0\n%s", got, tm.screen("rc"))
	}
}
