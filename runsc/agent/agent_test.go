package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The tests run one real agent (`sandboxd-agent serve`) as a child of the
// test binary and real processes as uid/gid 1000; they need root.

const testUID, testGID = 1000, 1000

var (
	agentCmd  *exec.Cmd
	cl        *Client
	workDir   string // owned by uid 1000
	baseEnv   []string
	skipWhy   string
	agentPath string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Getuid() != 0 {
		skipWhy = "needs root"
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "agenttest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	os.Chmod(tmp, 0o755)
	workDir = filepath.Join(tmp, "work")
	os.Mkdir(workDir, 0o755)
	os.Chown(workDir, testUID, testGID)

	root, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "go env GOMOD:", err)
		return 1
	}
	agentPath = filepath.Join(tmp, "sandboxd-agent")
	build := exec.Command("go", "build", "-o", agentPath, "./cmd/sandboxd-agent")
	build.Dir = filepath.Dir(strings.TrimSpace(string(root)))
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
		return 1
	}

	home := "/tmp"
	if u, err := user.LookupId(fmt.Sprint(testUID)); err == nil && u.HomeDir != "" {
		if _, err := os.Stat(u.HomeDir); err == nil {
			home = u.HomeDir
		}
	}
	// Debian's /etc/profile sets this PATH for non-root login shells, so a
	// cold `bash -lc` keeps it and the env test can compare exactly.
	baseEnv = []string{
		"PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games",
		"HOME=" + home, "LANG=C.UTF-8", "TERM=xterm", "USER=user",
	}

	sock := filepath.Join(tmp, "agent.sock")
	agentCmd = exec.Command(agentPath, "serve", "--socket", sock)
	agentCmd.Stderr = os.Stderr
	if err := agentCmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start agent:", err)
		return 1
	}
	defer func() {
		agentCmd.Process.Signal(syscall.SIGTERM)
		agentCmd.Wait()
	}()
	cl = &Client{Socket: sock, DialTimeout: time.Second}
	for i := 0; ; i++ {
		if _, err := cl.Ping(context.Background()); err == nil {
			break
		} else if i == 200 {
			fmt.Fprintln(os.Stderr, "agent does not answer:", err)
			return 1
		}
		time.Sleep(10 * time.Millisecond)
	}
	return m.Run()
}

func needAgent(t *testing.T) {
	t.Helper()
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// setWarm configures the pool (0 disables it) and waits until it is full.
func setWarm(t *testing.T, n int) {
	t.Helper()
	if err := cl.Warm(ctxT(t), baseEnv, n); err != nil {
		t.Fatalf("warm %d: %v", n, err)
	}
}

type result struct {
	stdout, stderr string
	exit           Exit
	warm           bool
	pid            int
}

func bashSpec(cmd string) Spec {
	return Spec{
		Args: []string{"/bin/bash", "-lc", cmd}, Env: baseEnv, Cwd: workDir,
		UID: testUID, GID: testGID,
	}
}

// run starts s, feeds stdin (if not nil), collects the output and waits.
func run(t *testing.T, s Spec, stdin []byte) result {
	t.Helper()
	if stdin != nil {
		s.Stdin = true
	}
	p, err := cl.Start(ctxT(t), s)
	if err != nil {
		t.Fatalf("start %q: %v", s.Args, err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	var out, errb bytes.Buffer
	wg.Add(1)
	go func() { defer wg.Done(); io.Copy(&out, p.Stdout()) }()
	if p.Stderr() != nil {
		wg.Add(1)
		go func() { defer wg.Done(); io.Copy(&errb, p.Stderr()) }()
	}
	if stdin != nil {
		go func() {
			p.Stdin().Write(stdin)
			p.Stdin().Close()
		}()
	}
	exit, err := p.Wait()
	if err != nil {
		t.Fatalf("wait %q: %v", s.Args, err)
	}
	wg.Wait()
	return result{stdout: out.String(), stderr: errb.String(), exit: exit, warm: p.warm, pid: p.Pid()}
}

// modes runs f once with cold starts and once with warm shells.
func modes(t *testing.T, f func(t *testing.T, r func(Spec, []byte) result)) {
	for _, warm := range []bool{false, true} {
		name := map[bool]string{false: "cold", true: "warm"}[warm]
		t.Run(name, func(t *testing.T) {
			n := 0
			if warm {
				n = 2
			}
			setWarm(t, n)
			f(t, func(s Spec, stdin []byte) result {
				if warm {
					setWarm(t, n) // a refill may still be running
				}
				res := run(t, s, stdin)
				if res.warm != warm {
					t.Errorf("%q: warm = %v, want %v", s.Args, res.warm, warm)
				}
				return res
			})
		})
	}
}

func TestExitCodesAndOutput(t *testing.T) {
	needAgent(t)
	cases := []struct {
		cmd, stdout, stderr string
		code                int
	}{
		{"echo hi", "hi\n", "", 0},
		{"exit 7", "", "", 7},
		{"false", "", "", 1},
		{"true; (exit 3)", "", "", 3},
		{"echo out; echo err >&2; exit 4", "out\n", "err\n", 4},
		{"false\necho $?\n(exit 5)", "1\n", "", 5},
		{"for i in 1 2 3; do\n  echo $i\ndone", "1\n2\n3\n", "", 0},
		{"f() { return 9; }; f", "", "", 9},
		{"echo $0 $#", "/bin/bash 0\n", "", 0},
		{"shopt -q login_shell && echo login", "login\n", "", 0},
		{"kill -TERM $$", "", "", 128 + 15},
	}
	modes(t, func(t *testing.T, r func(Spec, []byte) result) {
		for _, c := range cases {
			res := r(bashSpec(c.cmd), nil)
			if res.stdout != c.stdout || res.stderr != c.stderr || res.exit.Code != c.code {
				t.Errorf("%q: got (%q, %q, %+v), want (%q, %q, %d)", c.cmd, res.stdout, res.stderr, res.exit,
					c.stdout, c.stderr, c.code)
			}
		}
	})
}

func TestSignalExit(t *testing.T) {
	needAgent(t)
	setWarm(t, 0)
	res := run(t, Spec{Args: []string{"/bin/sh", "-c", "kill -KILL $$"}, Cwd: workDir, UID: testUID, GID: testGID}, nil)
	if res.exit != (Exit{Code: 137, Signal: "SIGKILL"}) {
		t.Errorf("exit = %+v", res.exit)
	}
}

func TestBurst(t *testing.T) {
	needAgent(t)
	const n = 20000000
	cmd := fmt.Sprintf(`(head -c %d /dev/zero | tr '\0' a) & (head -c %d /dev/zero | tr '\0' b) >&2; wait`, n, n)
	modes(t, func(t *testing.T, r func(Spec, []byte) result) {
		t0 := time.Now()
		res := r(bashSpec(cmd), nil)
		t.Logf("2 x %d bytes in %v", n, time.Since(t0))
		if len(res.stdout) != n || strings.Trim(res.stdout, "a") != "" {
			t.Errorf("stdout: %d bytes, not all 'a'", len(res.stdout))
		}
		if len(res.stderr) != n || strings.Trim(res.stderr, "b") != "" {
			t.Errorf("stderr: %d bytes, not all 'b'", len(res.stderr))
		}
		if res.exit.Code != 0 {
			t.Errorf("exit %+v", res.exit)
		}
	})
}

func TestStdin(t *testing.T) {
	needAgent(t)
	big := bytes.Repeat([]byte("0123456789abcdef\n"), 200000) // 3.4 MB, several frames
	modes(t, func(t *testing.T, r func(Spec, []byte) result) {
		res := r(bashSpec("cat; echo done"), []byte("hello\n"))
		if res.stdout != "hello\ndone\n" {
			t.Errorf("cat: %q", res.stdout)
		}
		res = r(bashSpec("sha256sum"), big)
		h := exec.Command("sha256sum")
		h.Stdin = bytes.NewReader(big)
		exp, _ := h.Output()
		if res.stdout != string(exp) {
			t.Errorf("sha256sum of stdin: %q, want %q", res.stdout, exp)
		}
		t0 := time.Now()
		res = r(bashSpec("cat; echo rc=$?; read x; echo read=$?"), nil)
		if res.stdout != "rc=0\nread=1\n" || time.Since(t0) > 2*time.Second {
			t.Errorf("no stdin: %q after %v", res.stdout, time.Since(t0))
		}
	})
}

func TestQuoting(t *testing.T) {
	needAgent(t)
	cmd := "cat <<'EOF'\n$HOME \"x\" 'y' `z` \\n\nEOF\ncat <<EOF\nv=$((1+2))\nEOF\n" +
		`echo "a'b" 'c"d' $'e\tf' "$(echo sub)" \\ '\\'` + "\n" +
		"printf '%s|' \"two words\" '' x; echo\n# comment ' unbalanced\necho end # trailing"
	want := "$HOME \"x\" 'y' `z` \\n\nv=3\na'b c\"d e\tf sub \\ \\\\\ntwo words||x|\nend\n"
	modes(t, func(t *testing.T, r func(Spec, []byte) result) {
		res := r(bashSpec(cmd), nil)
		if res.stdout != want || res.exit.Code != 0 || res.stderr != "" {
			t.Errorf("got %q %q %+v\nwant %q", res.stdout, res.stderr, res.exit, want)
		}
		res = r(bashSpec("echo ok\n)"), nil)
		if res.stdout != "ok\n" || res.exit.Code != 2 || !strings.Contains(res.stderr, "syntax error") {
			t.Errorf("syntax error: %q %q %+v", res.stdout, res.stderr, res.exit)
		}
	})
}

func TestStartErrors(t *testing.T) {
	needAgent(t)
	for _, warm := range []int{0, 2} {
		setWarm(t, warm)
		s := bashSpec("true")
		s.Cwd = "/nonexistent/dir"
		_, err := cl.Start(ctxT(t), s)
		var ae *AgentError
		if !errors.As(err, &ae) || ae.Message != "working directory does not exist" {
			t.Errorf("missing cwd: %v", err)
		}
	}
	_, err := cl.Start(ctxT(t), Spec{Args: []string{"no-such-command"}, Env: baseEnv, Cwd: workDir, UID: testUID, GID: testGID})
	var ae *AgentError
	if !errors.As(err, &ae) || ae.Message != "executable not found" {
		t.Errorf("missing executable: %v", err)
	}
	// Found in the request's PATH.
	res := run(t, Spec{Args: []string{"id", "-u"}, Env: baseEnv, Cwd: workDir, UID: testUID, GID: testGID}, nil)
	if res.stdout != "1000\n" {
		t.Errorf("id -u: %q", res.stdout)
	}
}

func TestEnvExact(t *testing.T) {
	needAgent(t)
	sorted := func(env ...string) string {
		env = slices.Clone(env)
		sort.Strings(env)
		return strings.Join(env, "\n") + "\n"
	}
	fresh := []string{"PWD=" + workDir, "SHLVL=1", "_=/usr/bin/env"}
	// Only the base env; base env minus LANG plus odd values; SHLVL and
	// OLDPWD inherited.
	reqs := [][]string{
		baseEnv,
		append(slices.DeleteFunc(slices.Clone(baseEnv), func(s string) bool { return strings.HasPrefix(s, "LANG=") }),
			"EXTRA=it's \"quoted\" $HOME `x`", "EMPTY=", "MULTI=line1"),
	}
	modes(t, func(t *testing.T, r func(Spec, []byte) result) {
		for _, env := range reqs {
			s := bashSpec("env | sort")
			s.Env = env
			res := r(s, nil)
			if want := sorted(append(slices.Clone(env), fresh...)...); res.stdout != want {
				t.Errorf("env:\n%s\nwant:\n%s", res.stdout, want)
			}
		}
		s := bashSpec(`echo "$SHLVL $OLDPWD"; cd /; echo "$OLDPWD"; env | grep -c ^OLDPWD=`)
		s.Env = append(slices.Clone(baseEnv), "SHLVL=4")
		res := r(s, nil)
		if want := "5 \n" + workDir + "\n1\n"; res.stdout != want {
			t.Errorf("SHLVL/OLDPWD: %q, want %q", res.stdout, want)
		}
	})
}

// pgrep reports whether a process whose command line matches pattern runs.
func pgrep(pattern string) bool {
	return exec.Command("pgrep", "-f", pattern).Run() == nil
}

func waitGone(t *testing.T, pattern string) {
	t.Helper()
	for i := 0; pgrep(pattern); i++ {
		if i == 200 {
			t.Fatalf("%q still runs", pattern)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestBackgroundChildSurvives(t *testing.T) {
	needAgent(t)
	modes(t, func(t *testing.T, r func(Spec, []byte) result) {
		t0 := time.Now()
		res := r(bashSpec("sleep 3017 & echo started"), nil)
		d := time.Since(t0)
		if res.stdout != "started\n" || res.exit.Code != 0 {
			t.Fatalf("got %q %+v", res.stdout, res.exit)
		}
		t.Logf("returned after %v (drain grace %v)", d, DrainGrace)
		res = r(bashSpec("pgrep -f 'sleep 301[7]' >/dev/null && echo alive"), nil)
		if res.stdout != "alive\n" {
			t.Errorf("background child gone: %q %q", res.stdout, res.stderr)
		}
		r(bashSpec("pkill -f 'sleep 301[7]'"), nil)
		waitGone(t, "sleep 301[7]")
	})
}

func TestCloseKillsGroup(t *testing.T) {
	needAgent(t)
	for _, warm := range []int{0, 2} {
		setWarm(t, warm)
		p, err := cl.Start(ctxT(t), bashSpec("sleep 3101 & sleep 3102; echo never"))
		if err != nil {
			t.Fatal(err)
		}
		if p.warm != (warm > 0) {
			t.Errorf("warm = %v with a pool of %d", p.warm, warm)
		}
		for i := 0; !pgrep("sleep 310[2]"); i++ {
			if i == 200 {
				t.Fatal("sleep 3102 did not start")
			}
			time.Sleep(10 * time.Millisecond)
		}
		p.Close()
		if _, err := p.Wait(); !errors.Is(err, ErrClosed) {
			t.Errorf("Wait after Close: %v", err)
		}
		waitGone(t, "sleep 310[12]")
	}
}

func ttySpec(cmd string, cols, rows uint16) Spec {
	s := bashSpec(cmd)
	s.TTY, s.Cols, s.Rows, s.Stdin = true, cols, rows, true
	return s
}

// readUntil reads r into buf until it contains want or the time is up.
func readUntil(t *testing.T, ch <-chan []byte, buf *bytes.Buffer, want string, d time.Duration) bool {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for !strings.Contains(buf.String(), want) {
		select {
		case b, ok := <-ch:
			if !ok {
				return strings.Contains(buf.String(), want)
			}
			buf.Write(b)
		case <-timer.C:
			return false
		}
	}
	return true
}

func chunks(r io.Reader) <-chan []byte {
	ch := make(chan []byte, 64)
	go func() {
		defer close(ch)
		for {
			b := make([]byte, 4096)
			n, err := r.Read(b)
			if n > 0 {
				ch <- b[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

func TestPTY(t *testing.T) {
	needAgent(t)
	setWarm(t, 2)
	res := run(t, ttySpec("tty; stty size", 100, 30), nil)
	if !strings.Contains(res.stdout, "/dev/pts/") || !strings.Contains(res.stdout, "30 100") || res.warm {
		t.Errorf("tty: %q warm=%v", res.stdout, res.warm)
	}
	if res.exit.Code != 0 {
		t.Errorf("exit %+v", res.exit)
	}

	p, err := cl.Start(ctxT(t), ttySpec(`trap 'echo WINCH; tput cols' WINCH; echo ready; for i in $(seq 100); do sleep 0.05; done`, 80, 24))
	if err != nil {
		t.Fatal(err)
	}
	ch := chunks(p.Stdout())
	var buf bytes.Buffer
	if !readUntil(t, ch, &buf, "ready", 5*time.Second) {
		t.Fatalf("no ready: %q", buf.String())
	}
	if err := p.Resize(132, 40); err != nil {
		t.Fatal(err)
	}
	if !readUntil(t, ch, &buf, "WINCH", 5*time.Second) || !readUntil(t, ch, &buf, "132", 2*time.Second) {
		t.Errorf("after resize: %q", buf.String())
	}
	p.Signal("SIGKILL", true)
	if exit, err := p.Wait(); err != nil || exit.Signal != "SIGKILL" {
		t.Errorf("exit %+v %v", exit, err)
	}
	p.Close()

	// Input through the terminal, echoed by it.
	p, err = cl.Start(ctxT(t), ttySpec("read -r line; echo got=$line", 80, 24))
	if err != nil {
		t.Fatal(err)
	}
	ch = chunks(p.Stdout())
	buf.Reset()
	p.Stdin().Write([]byte("hello\r"))
	if !readUntil(t, ch, &buf, "got=hello", 5*time.Second) {
		t.Errorf("tty input: %q", buf.String())
	}
	p.Wait()
	p.Close()

	p, err = cl.Start(ctxT(t), ttySpec("sleep 100", 80, 24))
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, p.Stdout())
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	if err := p.Signal("SIGINT", true); err != nil {
		t.Fatal(err)
	}
	exit, err := p.Wait()
	if err != nil || exit.Code != 130 || exit.Signal != "SIGINT" {
		t.Errorf("SIGINT: %+v %v", exit, err)
	}
	t.Logf("SIGINT ended sleep after %v", time.Since(t0))
	p.Close()
}

func TestKillAll(t *testing.T) {
	needAgent(t)
	setWarm(t, 2)
	r := run(t, bashSpec("sleep 3201 & (setsid sleep 3202 &) ; echo ok"), nil)
	if r.stdout != "ok\n" {
		t.Fatalf("%q", r.stdout)
	}
	if !pgrep("sleep 320[12]") {
		t.Fatal("sleeps not running")
	}
	t0 := time.Now()
	if res, err := cl.KillAll(ctxT(t), 0); err != nil || !res.Killed() {
		t.Fatal(res, err)
	}
	t.Logf("killall took %v", time.Since(t0))
	if pgrep("sleep 320[12]") {
		t.Error("sleep survived killall")
	}
	// Warm shells come back.
	setWarm(t, 2)
	if res := run(t, bashSpec("echo after"), nil); res.stdout != "after\n" || !res.warm {
		t.Errorf("after killall: %q warm=%v", res.stdout, res.warm)
	}
}

func TestPing(t *testing.T) {
	needAgent(t)
	var ds []time.Duration
	for range 50 {
		d, err := cl.Ping(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	t.Logf("ping p50 %v p90 %v", pct(ds, 50), pct(ds, 90))
}

func pct(ds []time.Duration, p int) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[(len(ds)-1)*p/100]
}

func TestLatency(t *testing.T) {
	needAgent(t)
	const n = 50
	measure := func(warm int, refill bool) (ds []time.Duration, warmRuns int) {
		setWarm(t, warm)
		for range n {
			if refill {
				setWarm(t, warm)
			}
			t0 := time.Now()
			res := run(t, bashSpec("true"), nil)
			ds = append(ds, time.Since(t0))
			if res.exit.Code != 0 {
				t.Fatalf("exit %+v", res.exit)
			}
			if res.warm {
				warmRuns++
			}
		}
		return ds, warmRuns
	}
	cold, _ := measure(0, false)
	warm, wn := measure(2, true)
	b2b, bn := measure(2, false)
	t.Logf("bash -lc true over %d runs: cold p50 %v p90 %v; warm p50 %v p90 %v (%d/%d warm); "+
		"back-to-back with pool of 2: p50 %v p90 %v (%d/%d warm)",
		n, pct(cold, 50), pct(cold, 90), pct(warm, 50), pct(warm, 90), wn, n, pct(b2b, 50), pct(b2b, 90), bn, n)
	if wn != n {
		t.Errorf("only %d of %d runs used a warm shell", wn, n)
	}
	if pct(warm, 50) >= pct(cold, 50) {
		t.Errorf("warm p50 %v not below cold p50 %v", pct(warm, 50), pct(cold, 50))
	}
}

func agentFDs(t *testing.T) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", agentCmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestNoLeaks(t *testing.T) {
	needAgent(t)
	setWarm(t, 2)
	settle := func() (Stats, int) {
		setWarm(t, 2)
		time.Sleep(200 * time.Millisecond) // handlers close after their last write
		fds := agentFDs(t)                 // before stats opens a connection
		st, err := cl.Stats(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		return st, fds
	}
	before, fdBefore := settle()
	for i := range 200 {
		switch i % 8 {
		case 0, 1, 2:
			run(t, bashSpec("echo x; echo y >&2"), nil)
		case 3:
			run(t, bashSpec("cat"), []byte("in"))
		case 4:
			cl.Ping(ctxT(t))
		case 5:
			s := bashSpec("true")
			s.Cwd = "/nonexistent"
			cl.Start(ctxT(t), s)
		case 6:
			p, err := cl.Start(ctxT(t), bashSpec("sleep 10"))
			if err == nil {
				p.Close()
			}
		case 7:
			run(t, ttySpec("echo tty", 80, 24), nil)
		}
	}
	after, fdAfter := settle()
	t.Logf("agent before: %d goroutines, %d fds (/proc: %d); after 200 ops: %d goroutines, %d fds (/proc: %d)",
		before.Goroutines, before.FDs, fdBefore, after.Goroutines, after.FDs, fdAfter)
	if after.Goroutines != before.Goroutines || after.FDs != before.FDs || fdAfter != fdBefore {
		t.Errorf("leak: before %+v/%d after %+v/%d", before, fdBefore, after, fdAfter)
	}
}

func TestDial(t *testing.T) {
	needAgent(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// An upstream that answers what it read, upper-cased, after the client's
	// half-close: the reply proves both directions and the half-close.
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				c.Write(bytes.ToUpper(b))
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	c, err := cl.Dial(ctxT(t), port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := bytes.Repeat([]byte("abcdefgh"), 1<<17) // 1 MiB: more than a socket buffer
	go func() {
		c.Write(big)
		c.(interface{ CloseWrite() error }).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, bytes.ToUpper(big)) {
		t.Fatalf("relay: %d bytes, err %v", len(got), err)
	}

	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln2.Addr().(*net.TCPAddr).Port
	ln2.Close()
	var ae *AgentError
	if _, err := cl.Dial(ctxT(t), closed); !errors.As(err, &ae) || ae.Message != "connection refused" {
		t.Errorf("closed port: %v", err)
	}
	for _, p := range []int{0, -1, 70000} {
		if _, err := cl.Dial(ctxT(t), p); !errors.As(err, &ae) || ae.Message != "bad port" {
			t.Errorf("port %d: %v", p, err)
		}
	}
}

// readLines reads from r until it has seen n more newline-terminated
// numbers, returning them.
func readNumbers(t *testing.T, r io.Reader, n int, buf *[]byte) []int {
	t.Helper()
	var out []int
	tmp := make([]byte, 4096)
	for len(out) < n {
		for {
			i := bytes.IndexByte(*buf, '\n')
			if i < 0 {
				break
			}
			var v int
			if _, err := fmt.Sscan(string((*buf)[:i]), &v); err != nil {
				t.Fatalf("bad line %q", (*buf)[:i])
			}
			out = append(out, v)
			*buf = (*buf)[i+1:]
		}
		if len(out) >= n {
			break
		}
		k, err := r.Read(tmp)
		*buf = append(*buf, tmp[:k]...)
		if err != nil {
			t.Fatalf("read after %v: %v", out, err)
		}
	}
	return out
}

// TestSuspendReattach: a suspend closes the listener and the connections,
// the processes go on parked, and after SIGUSR1 a reattach continues the
// same process with no output lost or repeated. A reattach without a
// suspend takes over the live connection.
func TestSuspendReattach(t *testing.T) {
	needAgent(t)
	ctx := ctxT(t)
	spec := Spec{Args: []string{"/bin/sh", "-c", "i=0; while :; do echo $i; i=$((i+1)); sleep 0.01; done"},
		Env: baseEnv, Cwd: workDir, UID: testUID, GID: testGID, Stdin: true}
	p, err := cl.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var buf []byte
	seen := readNumbers(t, p.Stdout(), 5, &buf)

	p.Park()
	if err := cl.Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Ping(ctx); err == nil {
		t.Fatal("the agent answers while suspended")
	}
	if _, err := p.Stdin().Write([]byte("x")); !errors.Is(err, ErrParked) {
		t.Fatalf("write while parked: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // the loop goes on meanwhile
	if p.Done() {
		t.Fatal("a parked process ended")
	}
	agentCmd.Process.Signal(syscall.SIGUSR1)
	for i := 0; ; i++ {
		if _, err := cl.Ping(ctx); err == nil {
			break
		} else if i == 200 {
			t.Fatalf("no listener after SIGUSR1: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Reattach(ctx); err != nil {
		t.Fatal(err)
	}
	seen = append(seen, readNumbers(t, p.Stdout(), 30, &buf)...)

	// A reattach without a suspend (a checkpoint that failed before it)
	// takes the connection over.
	p.Park()
	if err := p.Reattach(ctx); err != nil {
		t.Fatal(err)
	}
	seen = append(seen, readNumbers(t, p.Stdout(), 10, &buf)...)
	for i, v := range seen {
		if v != seen[0]+i {
			t.Fatalf("output lost or repeated at %d: %v", i, seen)
		}
	}
	if _, err := p.Stdin().Write([]byte("x")); err != nil {
		t.Fatalf("write after reattach: %v", err)
	}
	p.Close()
	if _, err := p.Wait(); !errors.Is(err, ErrClosed) {
		t.Fatalf("wait after close: %v", err)
	}
	// Another process is not found by pid.
	q := &Process{client: *cl, pid: 1 << 30, parked: true, done: make(chan struct{})}
	q.cond.L = &q.mu
	if err := q.Reattach(ctx); err == nil {
		t.Fatal("attach to an unknown pid")
	}
}

// ReadOutput gives both streams in the order the agent sent them, however
// late it is read; Stdout and Stderr still read one stream each.
func TestReadOutputOrder(t *testing.T) {
	needAgent(t)
	p, err := cl.Start(ctxT(t), bashSpec(`for i in 1 2 3; do printf o$i; sleep 0.2; printf e$i >&2; sleep 0.2; done`))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Wait(); err != nil { // all of it queued before the first read
		t.Fatal(err)
	}
	var got []string
	buf := make([]byte, 64)
	for {
		n, isErr, err := p.ReadOutput(buf)
		if n > 0 {
			got = append(got, fmt.Sprintf("%v:%s", isErr, buf[:n]))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if want := "false:o1 true:e1 false:o2 true:e2 false:o3 true:e3"; strings.Join(got, " ") != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// The ordered buffer: a stream's reader skips the other's chunks, each
// stream is bounded on its own, frames in a row of one stream share a
// chunk, and Close wakes a blocked writer.
func TestOutBuf(t *testing.T) {
	b := newOutBuf(4)
	b.write(0, []byte("ab"))
	b.write(1, []byte("XY"))
	b.write(0, []byte("cd"))
	buf := make([]byte, 8)
	if n, err := (streamReader{b, 1}).Read(buf); err != nil || string(buf[:n]) != "XY" {
		t.Fatalf("stderr %q %v", buf[:n], err)
	}
	full := make(chan struct{})
	go func() { b.write(0, []byte("e")); close(full) }() // stdout holds 4: waits
	b.write(1, []byte("Z"))                              // stderr is not held up
	select {
	case <-full:
		t.Fatal("a full stream took more")
	case <-time.After(50 * time.Millisecond):
	}
	var order []string
	for range 3 {
		n, tag, err := b.read(-1, buf[:1])
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, fmt.Sprint(tag, string(buf[:n])))
	}
	<-full
	if strings.Join(order, ",") != "0a,0b,0c" {
		t.Fatalf("order %v", order)
	}
	b.closeWrite(io.EOF)
	var rest []string
	for {
		n, tag, err := b.read(-1, buf)
		if err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			break
		}
		rest = append(rest, fmt.Sprint(tag, string(buf[:n])))
	}
	if strings.Join(rest, ",") != "0d,1Z,0e" {
		t.Fatalf("rest %v", rest)
	}
	// Frames in a row of one stream join one chunk.
	b3 := newOutBuf(1 << 10)
	for range 100 {
		b3.write(1, []byte("x"))
	}
	if len(b3.q[1]) != 1 || b3.queued[1] != 100 {
		t.Fatalf("%d chunks, %d bytes", len(b3.q[1]), b3.queued[1])
	}
	b2 := newOutBuf(1)
	b2.write(0, []byte("x"))
	done := make(chan struct{})
	go func() { b2.write(0, []byte("y")); close(done) }()
	b2.closeRead()
	<-done
	if _, err := (streamReader{b2, 0}).Read(buf); err != ErrClosed {
		t.Fatalf("after closeRead: %v", err)
	}
}
