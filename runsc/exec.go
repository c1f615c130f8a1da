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
	// Stop, when closed, kills the whole process group as Timeout does
	// (the caller's output limit); nil: never.
	Stop <-chan struct{}
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int
	TimedOut bool // killed by Timeout; ExitCode is 124
	Stopped  bool // killed by Stop; ExitCode is 141 (128+SIGPIPE: its reader went away)
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

// ErrAgentSlow is returned when the sandbox's agent, alive, did not answer
// in time: the sandbox (or the node) is too busy.
var ErrAgentSlow = errors.New("the sandbox's agent did not answer in time")

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

// agentWait is how long a command waits for a sandbox's agent to answer
// (it starts a few milliseconds after the sandbox; a pause suspends it for
// a moment).
const agentWait = 10 * time.Second

// Exec runs a command through the in-sandbox agent and waits for it. Every
// command is started by the agent, never by runsc exec, so its processes
// (and the background processes it leaves) are the agent's and survive a
// pause with memory: a command that comes before the agent answers waits
// for it (agentWait).
func (r *Runtime) Exec(ctx context.Context, id string, req ExecRequest) (ExecResult, error) {
	start := time.Now()
	r.warm(id, req.BaseEnv)
	oomBefore := r.cg.oomKills(id)
	var res ExecResult
	sctx, cancel := context.WithTimeout(ctx, agentWait)
	var p *agent.Process
	var err error
	for {
		p, err = r.Agent(id).Start(sctx, agent.Spec{Args: req.Args, Env: req.Env, Cwd: req.Cwd,
			UID: UserUID, GID: UserGID, Stdin: req.Stdin != nil})
		var ae *agent.AgentError
		if err == nil || errors.As(err, &ae) || sctx.Err() != nil {
			break
		}
		if !r.alive(id) {
			cancel()
			return res, ErrNotRunning
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err == nil {
		r.track(id, p)
	}
	if err != nil {
		var ae *agent.AgentError
		if !errors.As(err, &ae) {
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			if !r.alive(id) {
				return res, ErrNotRunning
			}
			return res, fmt.Errorf("%w (%v): %w", ErrAgentSlow, agentWait, err)
		}
		switch ae.Message {
		case "working directory does not exist", "working directory is not absolute", "permission denied":
			return res, ErrBadCwd
		case "process limit reached":
			return res, ErrTooManyProcesses
		}
		return res, fmt.Errorf("agent: %s", ae.Message)
	}
	defer p.Close()
	// One goroutine, in the agent's order: a value split between stdout and
	// stderr reaches the scrubber's merged view as the agent sent it.
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		copyOutput(p, orDiscard(req.Stdout), orDiscard(req.Stderr))
	}()
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
	case <-req.Stop:
		res.Stopped = true
		p.Close()
		w = <-waitc
	case <-ctx.Done():
		p.Close()
		w = <-waitc
	}
	<-copied
	res.Duration = time.Since(start)
	res.ExitCode = w.exit.Code
	if n := r.cg.oomKills(id); n > oomBefore {
		res.OOM, res.ExitCode = true, 137
	}
	if w.err != nil && !res.TimedOut && !res.Stopped && ctx.Err() == nil {
		// The connection broke before an exit status: the sandbox died.
		res.Died, res.ExitCode = !r.alive(id) || res.OOM, 137
		if !res.Died {
			return res, fmt.Errorf("agent: %v", w.err)
		}
	}
	switch {
	case res.TimedOut:
		res.ExitCode = 124
	case res.Stopped:
		res.ExitCode = 141
	}
	return res, nil
}

// warm configures a sandbox's pool of warm login shells once (in the
// background: the first commands run cold meanwhile). An agent that
// answered has the configuration even if its shells failed to start (a
// slow login profile): it retries with a back-off of its own, so only a
// warm op that did not get through is sent again, by the next command.
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
		var ae *agent.AgentError
		if err := r.Agent(id).Warm(ctx, base, 2); err != nil && !errors.As(err, &ae) {
			r.warmed.CompareAndDelete(id, key)
		}
	}()
}

// KillResult says what a KillAll left alive.
type KillResult = agent.KillResult

// killAllExec is KillAll with a root runsc exec of the agent's killall
// (CAP_SYS_RESOURCE, so the user's process limit does not stop it), which
// prints its KillResult.
func (r *Runtime) killAllExec(ctx context.Context, id string) (agent.KillResult, error) {
	var res agent.KillResult
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
		return res, err
	}
	defer os.Remove(f)
	out, err := r.run(ctx, "exec", "--process", f, id)
	if err != nil {
		if !r.alive(id) {
			return res, ErrNotRunning
		}
		return res, err
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &res); err != nil {
		return res, fmt.Errorf("runsc: killall answer %q: %w", out, err)
	}
	return res, nil
}

// KillAll kills every process in the sandbox but PID 1 until none is left
// or agent.DefaultKillWait passed, and says what survived: through the
// agent when it answers, else with a root runsc exec of the agent's
// killall.
func (r *Runtime) KillAll(ctx context.Context, id string) (agent.KillResult, error) {
	actx, cancel := context.WithTimeout(ctx, agent.DefaultKillWait+5*time.Second)
	res, err := r.Agent(id).KillAll(actx, agent.DefaultKillWait)
	cancel()
	if err == nil {
		return res, nil
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

// DialPort connects to 127.0.0.1:port inside a running sandbox through its
// agent: the portal's way in, which reaches nothing but that loopback.
func (r *Runtime) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	return r.Agent(id).Dial(ctx, port)
}

// copyOutput writes p's output to stdout and stderr in the order it came
// until it ends. A destination that fails is given no more (the rest of
// its stream is read and dropped, so the other stream is not held up).
func copyOutput(p *agent.Process, stdout, stderr io.Writer) {
	dst := [2]io.Writer{stdout, stderr}
	buf := make([]byte, 32<<10)
	for {
		n, isErr, err := p.ReadOutput(buf)
		if n > 0 {
			i := 0
			if isErr {
				i = 1
			}
			if dst[i] != io.Discard {
				if _, werr := dst[i].Write(buf[:n]); werr != nil {
					dst[i] = io.Discard
				}
			}
		}
		if err != nil {
			return
		}
	}
}
