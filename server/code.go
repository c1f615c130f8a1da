package server

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/runsc/interp"
	"sandboxd/server/errdefs"
	"sandboxd/server/procs"
	"sandboxd/server/sandbox"
	"sandboxd/store"
)

// Code: POST /v1/sandbox/python/:sessionId and /node/:sessionId run code in
// a code context of that language (package procs): a long-lived interpreter
// inside the sandbox whose state persists between runs with the same
// contextId. (Events name the language "runtime", as the contract does.)
const (
	defaultContextID = "default"
	maxCodeBytes     = 1 << 20
)

var contextIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

type codeRequest struct {
	Code      string `json:"code"`
	TimeoutMs *int64 `json:"timeoutMs"`
	ContextID string `json:"contextId"`
}

// codeResponse is the contract's run result, plus timedOut, truncated,
// the dropped counts and stoppedForOutput as in exec.
type codeResponse struct {
	Stdout           string           `json:"stdout"`
	Stderr           string           `json:"stderr"`
	Result           *string          `json:"result"`
	Error            *interp.Error    `json:"error"`
	Display          []interp.Display `json:"display"`
	ContextID        string           `json:"contextId"`
	DurationMs       int64            `json:"durationMs"`
	TimedOut         bool             `json:"timedOut"`
	Truncated        bool             `json:"truncated"`
	StdoutDropped    int64            `json:"stdoutDropped"`
	StderrDropped    int64            `json:"stderrDropped"`
	StoppedForOutput bool             `json:"stoppedForOutput"`
}

// runCode returns the handler of lang's route.
func (s *Server) runCode(lang string) gin.HandlerFunc {
	return func(c *gin.Context) {
		ses, ok := s.sessionFor(c)
		if !ok {
			return
		}
		var req codeRequest
		if err := decodeJSON(c, &req); err != nil {
			s.writeError(c, err)
			return
		}
		ctx, lost, stop := s.whileAllowed(c.Request.Context(), principal(c), PermProjectUpdate)
		defer stop()
		resp, err := s.runCodeIn(ctx, ses, lang, &req, ginNote(c))
		if lost() {
			err = errAccessLost // its output is not for a revoked token
		}
		if err != nil {
			s.writeError(c, err)
			return
		}
		c.JSON(http.StatusOK, resp)
	}
}

// checkCode checks a code run's fields (contextId defaults to "default")
// and returns its timeout.
func (s *Server) checkCode(req *codeRequest) (time.Duration, error) {
	if req.Code == "" || len(req.Code) > maxCodeBytes {
		return 0, badRequest("code: required, at most 1 MiB")
	}
	if req.ContextID == "" {
		req.ContextID = defaultContextID
	}
	if !contextIDRe.MatchString(req.ContextID) {
		return 0, badRequest("contextId: 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit")
	}
	return s.timeout(req.TimeoutMs, 30*time.Second)
}

// runCodeIn checks req and runs its code in a code context of lang in ses:
// the REST code run's and the MCP run_code's one path. The answer passes
// the session's scrubber and the output cap; note receives the audit
// details.
func (s *Server) runCodeIn(ctx context.Context, ses *store.Session, lang string, req *codeRequest, note noteFn) (codeResponse, error) {
	timeout, aerr := s.checkCode(req)
	if aerr != nil {
		return codeResponse{}, aerr
	}
	note("contextId", req.ContextID)
	cmd, err := s.sessions.Command(ctx, *ses, sandbox.Admit{NotRunning: "code runs only in a running session", Slot: true})
	if err != nil {
		return codeResponse{}, err
	}
	*ses = cmd.Session // resumed if it was paused for memory pressure
	defer cmd.End()
	// A run waits for the context's previous one at most its own timeout,
	// and never runs for a client that has gone.
	k, aerr := s.contexts.Acquire(ctx, procs.Key{PK: ses.ID, Lang: lang, ContextID: req.ContextID}, timeout)
	if aerr != nil {
		return codeResponse{}, aerr
	}
	defer k.Release()
	set := cmd.Scrubber
	if !k.Started() {
		env := sandbox.SetEnv(cmd.Env(nil), "MPLBACKEND", "Agg")
		// A frame holds the result (at most 4 bytes a character in UTF-8)
		// and the rich output.
		maxFrame := 4*s.cfg.Limits.ExecOutputBytes + interp.MaxDisplayBytes + 64<<10
		if err := k.Start(ctx, s.rt, ses.ContainerID, env, maxFrame); err != nil {
			s.contexts.Drop(k)
			s.log.Warn("start code context", "session", ses.SessionID, "language", lang, "err", err)
			s.sessions.NoteDead(ses.ID)
			return codeResponse{}, errdefs.Conflict("the %s context could not start: %s", lang, procs.AgentMessage(err))
		}
	}
	s.logs.Event(ses.ID, "process_start", map[string]any{"runtime": lang, "contextId": req.ContextID,
		"code": clip(set.RedactString(req.Code), 256)})
	out := newCappedOutput(s.cfg.Limits.ExecOutputBytes)
	pair := set.NewPair(out.stdoutWriter(), out.stderrWriter())
	stdout, stderr := out.front(pair.Stdout(), pair.Stderr())
	// A run that goes on writing past the cap is interrupted as for a
	// client that left (the context and its state stay).
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	stop := out.stopAfter(s.cfg.Limits.ExecMaxDroppedBytes)
	if stop != nil {
		ended := make(chan struct{})
		defer close(ended)
		go func() {
			select {
			case <-stop:
				cancelRun()
			case <-ended:
			}
		}()
	}
	start := time.Now()
	res, timedOut, runErr := k.Run(runCtx, req.Code, s.cfg.Limits.ExecOutputBytes, timeout, stdout, stderr)
	// Stopped if the limit was passed while it ran (not by the bytes the
	// scrubber releases at Close), and not timed out first.
	stopped := false
	select {
	case <-stop:
		stopped = !timedOut
	default:
	}
	pair.Close()
	if errors.Is(runErr, procs.ErrRunPaused) {
		// Interrupted for a pause: the context and its state stay.
		res = interp.Result{Error: &interp.Error{Name: "SessionPaused", Value: "the session was paused during the run: the run was interrupted " +
			"(its output so far is above) and the context keeps its state; resume the session and run again"}}
		runErr = nil
	}
	if runErr != nil {
		// The context is gone (it exited, or ignored the interrupt and was
		// killed): the next run starts a fresh one.
		s.contexts.Drop(k)
		k.Kill()
		s.sessions.NoteDead(ses.ID)
		name, msg := "ContextLost", "the context's process ended; its state is gone and the next run starts a fresh context"
		if timedOut {
			name, msg = "Timeout", "the run did not stop within timeoutMs after an interrupt; the context was restarted and its state is gone"
		}
		res = interp.Result{Error: &interp.Error{Name: name, Value: msg}}
	}
	resp := codeResponse{
		Stdout: out.stdout.String(), Stderr: out.stderr.String(), Error: res.Error,
		ContextID: req.ContextID, DurationMs: time.Since(start).Milliseconds(), TimedOut: timedOut,
	}
	resp.Truncated = out.truncated || res.Truncated
	resp.StdoutDropped, resp.StderrDropped = out.dropped()
	resp.StoppedForOutput = stopped
	redact := set.RedactString
	if res.Result != nil {
		r := redact(*res.Result)
		if len(r) > s.cfg.Limits.ExecOutputBytes {
			r, resp.Truncated = r[:s.cfg.Limits.ExecOutputBytes], true
		}
		resp.Result = &r
	}
	if resp.Error != nil {
		e := resp.Error
		e.Name, e.Value, e.Traceback = clip(redact(e.Name), 256), redact(e.Value), redact(e.Traceback)
	}
	resp.Display = make([]interp.Display, 0, len(res.Display))
	for _, d := range res.Display {
		resp.Display = append(resp.Display, interp.Display{Mime: clip(redact(d.Mime), 128), Data: redact(d.Data)})
	}
	exit := map[string]any{"runtime": lang, "contextId": req.ContextID, "durationMs": resp.DurationMs, "timedOut": timedOut}
	if out.truncated {
		exit["stdoutDropped"], exit["stderrDropped"], exit["stoppedForOutput"] = resp.StdoutDropped, resp.StderrDropped, stopped
	}
	if stopped {
		note("stoppedForOutput", true)
	}
	if resp.Error != nil {
		exit["error"] = resp.Error.Name
	}
	s.logs.Event(ses.ID, "process_exit", exit)
	note("durationMs", resp.DurationMs)
	return resp, nil
}
