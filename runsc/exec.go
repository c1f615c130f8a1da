package runsc

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sandboxd/runsc/agent"
)

// ExecRequest is one command to run in a sandbox as the unprivileged user.
type ExecRequest struct {
	Args []string
	Env  []string // KEY=VALUE; passed in a 0600 file, never on argv
	// BaseEnv is the session's environment without this request's own
	// variables: the agent's warm login shells start with it (a request's
	// one-off values must not live on in them).
	BaseEnv []string
	Cwd     string // absolute path inside the sandbox
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
	Timeout time.Duration // 0: none; on expiry the whole process group is killed
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int
	TimedOut bool // killed by Timeout; ExitCode is 124
	OOM      bool // the sandbox hit its memory limit meanwhile; ExitCode is 137
	Died     bool // the sandbox itself is gone (OOM, killed)
	Duration time.Duration
}

// ErrBadCwd is returned when the working directory does not exist or is not
// accessible to the user.
var ErrBadCwd = errors.New("working directory does not exist or is not accessible")

// ErrNotRunning is returned when the sandbox cannot run commands.
var ErrNotRunning = errors.New("sandbox is not running")

// ErrTooManyProcesses is returned when a command cannot start because the
// sandbox's user is at its process limit.
var ErrTooManyProcesses = errors.New("sandbox is at its process limit")

// KernelLog is the path of the sandbox's gVisor kernel log (runsc's boot log).
func (r *Runtime) KernelLog(id string) string {
	return filepath.Join(r.dir(id), "logs", "runsc.boot.log")
}

// Agent returns the client of a sandbox's in-sandbox agent.
func (r *Runtime) Agent(id string) *agent.Client {
	return &agent.Client{Socket: filepath.Join(r.dir(id), "run", "agent.sock"), DialTimeout: 2 * time.Second}
}

// Start starts a process (a PTY or a stream) through the sandbox's agent,
// waiting up to 3 s for an agent that is still coming up.
func (r *Runtime) Start(ctx context.Context, id string, s agent.Spec) (Process, error) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		p, err := r.Agent(id).Start(ctx, s)
		if err == nil {
			r.track(id, p)
			return p, nil
		}
		var ae *agent.AgentError
		if errors.As(err, &ae) || time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err // never a typed nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Exec runs a command and waits for it: through the in-sandbox agent when
// it answers (milliseconds), else with runsc exec (tens of milliseconds).
func (r *Runtime) Exec(ctx context.Context, id string, req ExecRequest) (ExecResult, error) {
	if res, err, ok := r.execAgent(ctx, id, req); ok {
		return res, err
	}
	return r.execRunsc(ctx, id, req)
}

// execAgent runs req through the agent. ok is false when the agent cannot
// be reached (nothing was started), so the caller may fall back.
func (r *Runtime) execAgent(ctx context.Context, id string, req ExecRequest) (res ExecResult, err error, ok bool) {
	start := time.Now()
	r.warm(id, req.BaseEnv)
	oomBefore := r.cg.oomKills(id)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	p, err := r.Agent(id).Start(sctx, agent.Spec{Args: req.Args, Env: req.Env, Cwd: req.Cwd,
		UID: UserUID, GID: UserGID, Stdin: req.Stdin != nil})
	cancel()
	if err == nil {
		r.track(id, p)
	}
	if err != nil {
		var ae *agent.AgentError
		if !errors.As(err, &ae) {
			return res, nil, false
		}
		switch ae.Message {
		case "working directory does not exist", "working directory is not absolute", "permission denied":
			return res, ErrBadCwd, true
		case "process limit reached":
			return res, ErrTooManyProcesses, true
		}
		return res, fmt.Errorf("agent: %s", ae.Message), true
	}
	defer p.Close()
	var copies sync.WaitGroup
	for _, s := range []struct {
		dst io.Writer
		src io.Reader
	}{{req.Stdout, p.Stdout()}, {req.Stderr, p.Stderr()}} {
		copies.Add(1)
		go func() {
			defer copies.Done()
			io.Copy(orDiscard(s.dst), s.src)
		}()
	}
	if req.Stdin != nil {
		go func() {
			io.Copy(p.Stdin(), req.Stdin)
			p.Stdin().Close()
		}()
	}
	type waited struct {
		exit agent.Exit
		err  error
	}
	waitc := make(chan waited, 1)
	go func() {
		e, err := p.Wait()
		waitc <- waited{e, err}
	}()
	var timer <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timer = t.C
	}
	var w waited
	select {
	case w = <-waitc:
	case <-timer:
		res.TimedOut = true
		p.Close() // the agent kills the whole process group
		w = <-waitc
	case <-ctx.Done():
		p.Close()
		w = <-waitc
	}
	copies.Wait()
	res.Duration = time.Since(start)
	res.ExitCode = w.exit.Code
	if n := r.cg.oomKills(id); n > oomBefore {
		res.OOM, res.ExitCode = true, 137
	}
	if w.err != nil && !res.TimedOut && ctx.Err() == nil {
		// The connection broke before an exit status: the sandbox died.
		res.Died, res.ExitCode = !r.alive(id) || res.OOM, 137
		if !res.Died {
			return res, fmt.Errorf("agent: %v", w.err), true
		}
	}
	if res.TimedOut {
		res.ExitCode = 124
	}
	return res, nil, true
}

// warm configures a sandbox's pool of warm login shells once (in the
// background: the first commands run cold meanwhile).
func (r *Runtime) warm(id string, base []string) {
	if base == nil {
		return
	}
	key := strings.Join(base, "\x00")
	if v, ok := r.warmed.Load(id); ok && v == key {
		return
	}
	r.warmed.Store(id, key)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := r.Agent(id).Warm(ctx, base, 2); err != nil {
			r.warmed.Delete(id)
		}
	}()
}

// execRunsc runs a command with runsc exec and waits for it. stdout and
// stderr are written by the sandbox straight into pipes read here.
func (r *Runtime) execRunsc(ctx context.Context, id string, req ExecRequest) (ExecResult, error) {
	start := time.Now()
	oomBefore := r.cg.oomKills(id)
	procFile, pidFile, err := r.processFile(id, UserProcess(req.Args, req.Env, req.Cwd))
	if err != nil {
		return ExecResult{}, err
	}
	defer os.Remove(procFile)
	defer os.Remove(pidFile)

	args := append(r.globalArgs(), "exec", "--process", procFile, "--internal-pid-file", pidFile, id)
	cmd := exec.Command(r.cfg.Binary, args...)
	if req.Stdin != nil {
		cmd.Stdin = req.Stdin
	} // nil: /dev/null, so a command reading stdin sees EOF at once
	// stderr is inspected for runsc's own start failure before passing on.
	errTap := &headTap{w: req.Stderr, limit: 1024}
	cmd.Stdout, cmd.Stderr = orDiscard(req.Stdout), errTap
	// Background processes inside may keep the pipes open after the command
	// exits; stop reading shortly after it does.
	cmd.WaitDelay = 250 * time.Millisecond
	if err := cmd.Start(); err != nil {
		return ExecResult{}, fmt.Errorf("runsc exec: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var timer <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timer = t.C
	}
	res := ExecResult{}
	var waitErr error
	select {
	case waitErr = <-done:
	case <-timer:
		res.TimedOut = true
		r.killGroup(id, pidFile)
		waitErr = waitOrKill(cmd, done)
	case <-ctx.Done():
		r.killGroup(id, pidFile)
		waitErr = waitOrKill(cmd, done)
	}
	res.Duration = time.Since(start)
	res.ExitCode = exitCode(waitErr)
	if res.ExitCode < 0 {
		return res, fmt.Errorf("runsc exec: %w", waitErr)
	}
	// runsc writes the internal pid file once the process started. Exit
	// 128 without it is runsc failing to start the process, and only then
	// is stderr runsc's own text (never trust it otherwise: the command
	// controls its stderr).
	if _, perr := os.Stat(pidFile); res.ExitCode == 128 && perr != nil && !res.TimedOut {
		return res, startError(errTap.head.String(), r.alive(id))
	}
	if n := r.cg.oomKills(id); n > oomBefore {
		res.OOM, res.ExitCode = true, 137
	}
	if res.ExitCode == 128 && (res.OOM || !r.alive(id)) {
		res.Died, res.ExitCode = true, 137
	}
	if res.TimedOut {
		res.ExitCode = 124
	}
	errTap.finish(res.Died)
	return res, nil
}

func startError(msg string, alive bool) error {
	switch {
	case !alive:
		return ErrNotRunning
	case strings.Contains(msg, "working directory"):
		return ErrBadCwd
	case strings.Contains(msg, "try again"), strings.Contains(msg, "resource temporarily unavailable"):
		// EAGAIN: RLIMIT_NPROC of the sandbox user, or the cwd is not
		// accessible (gVisor answers EAGAIN for both; processes are checked
		// by the caller's retry advice).
		return ErrTooManyProcesses
	case strings.Contains(msg, "control socket"), strings.Contains(msg, "connecting to control server"),
		strings.Contains(msg, "does not exist"), strings.Contains(msg, "not found"):
		return ErrNotRunning
	}
	return fmt.Errorf("runsc exec: %s", strings.TrimSpace(msg))
}

// killAllExec kills every process in the sandbox except its PID 1 (the
// agent) with runsc exec, as root with CAP_SYS_RESOURCE, so the user's
// process limit does not stop it.
func (r *Runtime) killAllExec(ctx context.Context, id string) error {
	p := &specs.Process{
		User: specs.User{UID: 0, GID: 0},
		Args: []string{agentPath, "killall"},
		Env:  []string{"PATH=" + BasePath},
		Cwd:  "/",
		Capabilities: &specs.LinuxCapabilities{
			Bounding: []string{"CAP_KILL", "CAP_SYS_RESOURCE"}, Effective: []string{"CAP_KILL", "CAP_SYS_RESOURCE"},
			Permitted: []string{"CAP_KILL", "CAP_SYS_RESOURCE"},
		},
		NoNewPrivileges: true,
	}
	f, _, err := r.processFile(id, p)
	if err != nil {
		return err
	}
	defer os.Remove(f)
	if _, err := r.run(ctx, "exec", "--process", f, id); err != nil {
		if !r.alive(id) {
			return ErrNotRunning
		}
		return err
	}
	return nil
}

// KillAll kills every process in the sandbox but PID 1: through the agent
// when it answers, else with a root runsc exec of the agent's killall.
func (r *Runtime) KillAll(ctx context.Context, id string) error {
	if err := r.Agent(id).KillAll(ctx); err == nil {
		return nil
	}
	return r.killAllExec(ctx, id)
}

// CleanExecFiles removes process files left by a crash (they may hold
// secrets in their environment).
func (r *Runtime) CleanExecFiles() {
	dirs, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, "sandboxes", "*", "exec"))
	for _, d := range dirs {
		os.RemoveAll(d)
	}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// alive reports whether the sandbox process still exists.
func (r *Runtime) alive(id string) bool {
	st, err := r.Inspect(context.Background(), id)
	return err == nil && st.Status == StatusRunning
}

// processFile writes an OCI process for `runsc exec --process` as a 0600
// file in the sandbox's exec dir (its env may hold secrets: never argv),
// and names the pid file to go with it. The caller removes both.
func (r *Runtime) processFile(id string, p *specs.Process) (procFile, pidFile string, err error) {
	xdir := filepath.Join(r.dir(id), "exec")
	if err := os.MkdirAll(xdir, 0o700); err != nil {
		return "", "", err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return "", "", err
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	base := filepath.Join(xdir, hex.EncodeToString(rnd[:]))
	if err := os.WriteFile(base+".json", b, 0o600); err != nil {
		return "", "", err
	}
	return base + ".json", base + ".pid", nil
}

// signalGroup sends sig to the process group of an exec'd process (runsc
// exec makes each one a session and group leader). Its pid is read from
// pidFile, which appears once the process started; done (may be nil) ends
// the wait early.
func (r *Runtime) signalGroup(id, pidFile, sig string, done <-chan struct{}) error {
	pid := 0
	for i := 0; i < 50 && pid == 0; i++ {
		if b, err := os.ReadFile(pidFile); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
				pid = n
				break
			}
		}
		select {
		case <-done:
			return errors.New("process ended")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if pid == 0 {
		return errors.New("process not started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.run(ctx, "kill", "--pgid", strconv.Itoa(pid), id, strings.TrimPrefix(sig, "SIG"))
	return err
}

// killGroup kills a timed-out command's whole process group.
func (r *Runtime) killGroup(id, pidFile string) {
	if err := r.signalGroup(id, pidFile, "KILL", nil); err != nil {
		r.log.Warn("kill process group", "id", id, "err", err)
	}
}

// waitOrKill waits for runsc exec to return after the group was killed, and
// kills runsc exec itself if it does not.
func waitOrKill(cmd *exec.Cmd, done chan error) error {
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		return <-done
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ee.ExitCode() >= 0 {
			return ee.ExitCode()
		}
		return 128 + 9
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		return 0
	}
	return -1
}

// headTap passes stderr through to w, keeps its first limit bytes, and holds
// back its last line until finish: when the sandbox dies under a command,
// runsc appends its own error line there, which is not the command's output.
type headTap struct {
	mu    sync.Mutex
	w     io.Writer
	limit int
	head  bytes.Buffer
	last  []byte // bytes since (and including) the last complete line
}

const maxHeld = 4096

func (h *headTap) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if room := h.limit - h.head.Len(); room > 0 {
		h.head.Write(p[:min(room, len(p))])
	}
	h.last = append(h.last, p...)
	// Keep only the final line (with its newline) and anything after it.
	cut := bytes.LastIndexByte(h.last[:max(len(h.last)-1, 0)], '\n') + 1
	if len(h.last)-cut > maxHeld {
		cut = len(h.last)
	}
	if cut > 0 {
		if _, err := orDiscard(h.w).Write(h.last[:cut]); err != nil {
			return 0, err
		}
		h.last = append(h.last[:0], h.last[cut:]...)
	}
	return len(p), nil
}

// finish releases the held line, unless it is runsc's own report of a
// sandbox that went away.
func (h *headTap) finish(died bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if died && bytes.Contains(h.last, []byte("waiting on pid")) {
		h.last = nil
		return
	}
	orDiscard(h.w).Write(h.last)
	h.last = nil
}

// DialPort connects to 127.0.0.1:port inside a running sandbox through its
// agent: the portal's way in, which reaches nothing but that loopback.
func (r *Runtime) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	return r.Agent(id).Dial(ctx, port)
}
