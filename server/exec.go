package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"sandboxd/runsc"
	"sandboxd/server/sandbox"
	"sandboxd/store"
)

type execRequest struct {
	Action    string            `json:"action"`
	Command   string            `json:"command"`
	Cwd       string            `json:"cwd"`
	Env       map[string]string `json:"env"`
	TimeoutMs *int64            `json:"timeoutMs"`
	Stdin     *string           `json:"stdin"`
}

type execResponse struct {
	ExitCode   int    `json:"exitCode"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMs int64  `json:"durationMs"`
	TimedOut   bool   `json:"timedOut"`
	Truncated  bool   `json:"truncated"`
	OOM        bool   `json:"oom"`
	// Beyond the contract: what the cap dropped, and whether the command
	// was stopped for writing more than limits.execMaxDroppedBytes past it.
	StdoutDropped    int64 `json:"stdoutDropped"`
	StderrDropped    int64 `json:"stderrDropped"`
	StoppedForOutput bool  `json:"stoppedForOutput"`
}

const maxCommandBytes = 256 * 1024

// timeout checks a request's timeoutMs (1 to limits.execMaxTimeoutMs) and
// returns it, or def when it is absent.
func (s *Server) timeout(ms *int64, def time.Duration) (time.Duration, error) {
	if ms == nil {
		return def, nil
	}
	if *ms < 1 || *ms > s.cfg.Limits.ExecMaxTimeoutMs {
		return 0, badRequest("timeoutMs: must be 1-%d", s.cfg.Limits.ExecMaxTimeoutMs)
	}
	return time.Duration(*ms) * time.Millisecond, nil
}

// exec: POST /v1/sandbox/terminal/:sessionId (action exec or kill).
func (s *Server) exec(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	var req execRequest
	if err := decodeJSON(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	auditDetail(c, "action", req.Action)
	switch req.Action {
	case "exec":
	case "kill":
		s.killAll(c, ses, &req)
		return
	default:
		s.writeError(c, badRequest("action: must be \"exec\" or \"kill\""))
		return
	}
	ctx, lost, stop := s.whileAllowed(c.Request.Context(), principal(c), PermProjectUpdate)
	defer stop()
	resp, err := s.execCommand(ctx, ses, &req, ginNote(c))
	if lost() {
		err = errAccessLost // its output is not for a revoked token
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, resp)
}

// execCommand checks req (action exec) and runs its command in ses to
// completion: the REST exec's and the MCP run_command's one path. Output
// passes the session's scrubber, then the shared cap; note receives the
// audit details.
func (s *Server) execCommand(ctx context.Context, ses *store.Session, req *execRequest, note noteFn) (execResponse, error) {
	timeout, err := s.checkExec(req)
	if err != nil {
		return execResponse{}, err
	}
	cmd, err := s.sessions.Command(ctx, *ses, sandbox.Admit{NotRunning: "commands run only in a running session", Slot: true})
	if err != nil {
		return execResponse{}, err
	}
	*ses = cmd.Session // resumed if it was paused for memory pressure
	defer cmd.End()
	// Output passes the session's scrubber first, then the shared cap: what
	// is cut is already redacted, so no secret is ever cut in half. Past
	// the cap output is only counted (unscrubbed), and a command that goes
	// on writing is stopped rather than drained until its timeout.
	set := cmd.Scrubber
	out := newCappedOutput(s.cfg.Limits.ExecOutputBytes)
	stop := out.stopAfter(s.cfg.Limits.ExecMaxDroppedBytes)
	// One Pair: a value split between stdout and stderr is caught too.
	pair := set.NewPair(out.stdoutWriter(), out.stderrWriter())
	stdout, stderr := out.front(pair.Stdout(), pair.Stderr())
	xr := runsc.ExecRequest{
		Args:    []string{"/bin/bash", "-lc", req.Command},
		Env:     cmd.Env(req.Env),
		BaseEnv: cmd.Env(nil),
		Cwd:     req.Cwd,
		Stdout:  stdout,
		Stderr:  stderr,
		Timeout: timeout,
		Stop:    stop,
	}
	if req.Stdin != nil {
		xr.Stdin = strings.NewReader(*req.Stdin)
	}
	s.logs.Event(ses.ID, "process_start", map[string]any{"command": clip(set.RedactString(req.Command), 256), "cwd": req.Cwd})
	res, err := s.sessions.Exec(ctx, cmd, xr)
	cmd.End()
	pair.Close()
	s.met.exec.Observe(res.Duration.Seconds())
	if err != nil {
		return execResponse{}, err
	}
	redactions := map[string]int64{}
	for k, n := range pair.Counts() {
		if n > 0 {
			redactions[k] += n
		}
	}
	outDropped, errDropped := out.dropped()
	exit := map[string]any{"exitCode": res.ExitCode, "durationMs": res.Duration.Milliseconds(),
		"timedOut": res.TimedOut, "oom": res.OOM, "redactions": redactions}
	if out.truncated {
		exit["stdoutDropped"], exit["stderrDropped"], exit["stoppedForOutput"] = outDropped, errDropped, res.Stopped
	}
	s.logs.Event(ses.ID, "process_exit", exit)
	note("exitCode", res.ExitCode)
	note("durationMs", res.Duration.Milliseconds())
	if res.Stopped {
		note("stoppedForOutput", true)
	}
	return execResponse{
		ExitCode:         res.ExitCode,
		Stdout:           out.stdout.String(),
		Stderr:           out.stderr.String(),
		DurationMs:       res.Duration.Milliseconds(),
		TimedOut:         res.TimedOut,
		Truncated:        out.truncated,
		OOM:              res.OOM,
		StdoutDropped:    outDropped,
		StderrDropped:    errDropped,
		StoppedForOutput: res.Stopped,
	}, nil
}

// checkExec checks an exec request's fields (cwd defaults to /workspace)
// and returns its timeout.
func (s *Server) checkExec(req *execRequest) (time.Duration, error) {
	if strings.TrimSpace(req.Command) == "" || len(req.Command) > maxCommandBytes || strings.ContainsRune(req.Command, 0) {
		return 0, badRequest("command: required, under 256 KiB, without NUL bytes")
	}
	if req.Cwd == "" {
		req.Cwd = runsc.Workspace
	}
	if !validCwd(req.Cwd) {
		return 0, badRequest("cwd: must be an absolute, normalized path")
	}
	if e := checkEnv("env", req.Env); e != nil {
		return 0, e
	}
	return s.timeout(req.TimeoutMs, time.Duration(s.cfg.Limits.ExecDefaultTimeoutMs)*time.Millisecond)
}

// checkKill: {"action": "kill"} takes no other field.
func checkKill(req *execRequest) error {
	if req.Command != "" || req.Cwd != "" || req.Env != nil || req.TimeoutMs != nil || req.Stdin != nil {
		return badRequest("action kill takes no command, cwd, env, timeoutMs or stdin")
	}
	return nil
}

// killAll: {"action": "kill"} stops every process in the sandbox but its
// init, e.g. after a fork bomb or forgotten background jobs. It keeps
// killing for up to agent.DefaultKillWait while something is left.
func (s *Server) killAll(c *gin.Context, ses *store.Session, req *execRequest) {
	if err := checkKill(req); err != nil {
		s.writeError(c, err)
		return
	}
	res, err := s.sessions.KillAll(c.Request.Context(), *ses)
	if err != nil {
		s.writeError(c, err)
		return
	}
	// killed is true only when a last look found nothing left; a /proc
	// the agent could not read is "unknown", never "killed".
	ans := gin.H{"action": "kill", "killed": res.Killed(), "survivors": res.Survivors}
	if res.Unknown {
		ans["unknown"] = true
	}
	c.JSON(http.StatusOK, ans)
}

// clip cuts s to at most n bytes, on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// cappedOutput collects stdout and stderr up to a shared byte cap and keeps
// draining (so the command never blocks on a full pipe) past it, counting
// per stream the bytes it drops. Its writers sit after the scrubber, so
// what the answer holds is redacted and never a secret cut in half; its
// front writers sit before it: once the answer is full, output skips the
// scrubber (nothing of it can be shown) and is only counted, so a flood
// past the cap costs no scrubbing. Dropped bytes are thus counted after
// scrubbing while the answer has room and as written once it is full.
type cappedOutput struct {
	mu                           sync.Mutex
	left                         int
	stdout, stderr               bytes.Buffer
	truncated                    bool
	stdoutDropped, stderrDropped int64
	stopAt                       int64 // drop more than this and stop closes; 0: never
	stop                         chan struct{}
}

func newCappedOutput(limit int) *cappedOutput { return &cappedOutput{left: limit} }

// stopAfter returns a channel closed once more than n bytes (both streams)
// have been dropped; for n <= 0, nil, which never closes. Call it before
// the first write.
func (o *cappedOutput) stopAfter(n int64) <-chan struct{} {
	if n <= 0 {
		return nil
	}
	o.stopAt, o.stop = n, make(chan struct{})
	return o.stop
}

// dropped returns the bytes dropped from stdout and stderr so far.
func (o *cappedOutput) dropped() (stdout, stderr int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stdoutDropped, o.stderrDropped
}

// drop counts n bytes dropped from the stream of counter; o.mu is held.
func (o *cappedOutput) drop(counter *int64, n int) {
	if n == 0 {
		return
	}
	o.truncated = true
	before := o.stdoutDropped + o.stderrDropped
	*counter += int64(n)
	if o.stop != nil && before <= o.stopAt && before+int64(n) > o.stopAt {
		close(o.stop)
	}
}

type capWriter struct {
	o       *cappedOutput
	buf     *bytes.Buffer
	dropped *int64
}

func (o *cappedOutput) stdoutWriter() capWriter { return capWriter{o, &o.stdout, &o.stdoutDropped} }
func (o *cappedOutput) stderrWriter() capWriter { return capWriter{o, &o.stderr, &o.stderrDropped} }

func (w capWriter) Write(p []byte) (int, error) {
	o := w.o
	o.mu.Lock()
	defer o.mu.Unlock()
	n := min(len(p), o.left)
	w.buf.Write(p[:n])
	o.left -= n
	o.drop(w.dropped, len(p)-n)
	return len(p), nil
}

// front returns the writers to put before the scrubber's stdout and stderr
// (see cappedOutput).
func (o *cappedOutput) front(stdout, stderr io.Writer) (io.Writer, io.Writer) {
	return frontWriter{o, stdout, &o.stdoutDropped}, frontWriter{o, stderr, &o.stderrDropped}
}

type frontWriter struct {
	o       *cappedOutput
	next    io.Writer
	dropped *int64
}

func (w frontWriter) Write(p []byte) (int, error) {
	o := w.o
	o.mu.Lock()
	if o.left > 0 {
		o.mu.Unlock()
		return w.next.Write(p)
	}
	o.drop(w.dropped, len(p))
	o.mu.Unlock()
	return len(p), nil
}
