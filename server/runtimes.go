package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/runsc/kernel"
	"sandboxd/store"
)

// Code runtimes: POST /v1/sandbox/python/:sessionId and /node/:sessionId run
// code in a context, a long-lived interpreter inside the sandbox (started by
// the agent as the sandbox user) whose state persists between runs with the
// same contextId. Contexts live as long as the sandbox and the server
// process: teardown, death of the sandbox or a server restart ends them.
const (
	maxContextsPerSession = 8
	defaultContextID      = "default"
	maxCodeBytes          = 1 << 20
	// interruptGrace is how long a run has to stop after the interrupt
	// (SIGINT: KeyboardInterrupt) before its context is killed.
	interruptGrace = 2 * time.Second
	// maxKernelFrame bounds a run's result frame (rich output included).
	maxKernelFrame = 32 << 20
)

var contextIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

type codeRequest struct {
	Code      string `json:"code"`
	TimeoutMs *int64 `json:"timeoutMs"`
	ContextID string `json:"contextId"`
}

// codeResponse is the contract's run result, plus timedOut and truncated as
// in exec.
type codeResponse struct {
	Stdout     string           `json:"stdout"`
	Stderr     string           `json:"stderr"`
	Result     *string          `json:"result"`
	Error      *kernel.Error    `json:"error"`
	Display    []kernel.Display `json:"display"`
	ContextID  string           `json:"contextId"`
	DurationMs int64            `json:"durationMs"`
	TimedOut   bool             `json:"timedOut"`
	Truncated  bool             `json:"truncated"`
}

// runCode returns the handler of lang's runtime route.
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
		if req.Code == "" || len(req.Code) > maxCodeBytes {
			s.writeError(c, badRequest("code: required, at most 1 MiB"))
			return
		}
		if req.ContextID == "" {
			req.ContextID = defaultContextID
		}
		if !contextIDRe.MatchString(req.ContextID) {
			s.writeError(c, badRequest("contextId: 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"))
			return
		}
		timeout, aerr := s.timeout(req.TimeoutMs, 30*time.Second)
		if aerr != nil {
			s.writeError(c, aerr)
			return
		}
		auditDetail(c, "contextId", req.ContextID)
		if ses.Status != store.StatusRunning {
			s.writeError(c, conflict("session is %s; code runs only in a running session", ses.Status))
			return
		}
		secrets, err := s.db.Secrets(c.Request.Context(), ses.ID)
		if err != nil {
			s.writeError(c, err)
			return
		}
		end, ok := s.sb.begin(ses.ID, s.cfg.Limits.MaxExecsPerSession)
		if !ok {
			s.writeError(c, apiErr(http.StatusTooManyRequests, "rate_limited", "at most %d commands run at once in a session; retry when one ends", s.cfg.Limits.MaxExecsPerSession))
			return
		}
		defer end()
		k, aerr := s.kernels.acquire(kernelKey{ses.ID, lang, req.ContextID})
		if aerr != nil {
			s.writeError(c, aerr)
			return
		}
		defer k.release()
		set := s.scrub.forSession(ses.ID, secrets)
		if k.proc == nil {
			env := setEnv(commandEnv(ses.Env, secrets, nil), "MPLBACKEND", "Agg")
			if err := k.start(c.Request.Context(), s.rt, ses.ContainerID, env); err != nil {
				s.kernels.drop(k)
				s.log.Warn("start code context", "session", ses.SessionID, "runtime", lang, "err", err)
				s.noteDead(ses)
				s.writeError(c, conflict("the %s context could not start: %s", lang, agentMessage(err)))
				return
			}
		}
		s.event(ses, "process_start", map[string]any{"runtime": lang, "contextId": req.ContextID,
			"code": clip(string(set.Redact([]byte(req.Code))), 256)})
		out := newCappedOutput(s.cfg.Limits.ExecOutputBytes)
		stdout, stderr := set.NewWriter(out.writer(&out.stdout)), set.NewWriter(out.writer(&out.stderr))
		start := time.Now()
		res, timedOut, runErr := k.run(c.Request.Context(), req.Code, timeout, stdout, stderr)
		stdout.Close()
		stderr.Close()
		if runErr != nil {
			// The context is gone (it exited, or ignored the interrupt and was
			// killed): the next run starts a fresh one.
			s.kernels.drop(k)
			k.kill()
			s.noteDead(ses)
			name, msg := "ContextLost", "the context's process ended; its state is gone and the next run starts a fresh context"
			if timedOut {
				name, msg = "Timeout", "the run did not stop within timeoutMs after an interrupt; the context was restarted and its state is gone"
			}
			res = kernel.Result{Error: &kernel.Error{Name: name, Value: msg}}
		}
		resp := codeResponse{
			Stdout: out.stdout.String(), Stderr: out.stderr.String(), Error: res.Error,
			ContextID: req.ContextID, DurationMs: time.Since(start).Milliseconds(), TimedOut: timedOut,
		}
		resp.Truncated = out.truncated
		redact := func(v string) string { return string(set.Redact([]byte(v))) }
		if res.Result != nil {
			r := redact(*res.Result)
			if len(r) > s.cfg.Limits.ExecOutputBytes {
				r, resp.Truncated = r[:s.cfg.Limits.ExecOutputBytes], true
			}
			resp.Result = &r
		}
		if resp.Error != nil {
			resp.Error.Value, resp.Error.Traceback = redact(resp.Error.Value), redact(resp.Error.Traceback)
		}
		resp.Display = make([]kernel.Display, 0, len(res.Display))
		for _, d := range res.Display {
			resp.Display = append(resp.Display, kernel.Display{Mime: clip(d.Mime, 128), Data: redact(d.Data)})
		}
		exit := map[string]any{"runtime": lang, "contextId": req.ContextID, "durationMs": resp.DurationMs, "timedOut": timedOut}
		if resp.Error != nil {
			exit["error"] = resp.Error.Name
		}
		s.event(ses, "process_exit", exit)
		auditDetail(c, "durationMs", resp.DurationMs)
		c.JSON(http.StatusOK, resp)
	}
}

type kernelKey struct{ pk, lang, contextID string }

// kernels holds the live contexts of all sessions.
type kernels struct {
	mu sync.Mutex
	m  map[kernelKey]*kernelProc
}

// kernelProc is one context. Its mutex serializes runs; proc is set by the
// first run, under the mutex.
type kernelProc struct {
	ks       *kernels
	key      kernelKey
	mu       sync.Mutex
	proc     Process
	mark     []byte
	out, err *markReader
	stop     chan struct{} // closed by kill
	killOnce sync.Once
	lastUsed time.Time // guarded by ks.mu
}

// acquire returns key's context, locked for one run, making room for a new
// one by ending the session's least recently used idle context.
func (ks *kernels) acquire(key kernelKey) (*kernelProc, *APIError) {
	ks.mu.Lock()
	k := ks.m[key]
	if k == nil {
		var n int
		var idle *kernelProc
		for kk, v := range ks.m {
			if kk.pk != key.pk {
				continue
			}
			n++
			if v.mu.TryLock() {
				v.mu.Unlock()
				if idle == nil || v.lastUsed.Before(idle.lastUsed) {
					idle = v
				}
			}
		}
		if n >= maxContextsPerSession {
			if idle == nil {
				ks.mu.Unlock()
				return nil, apiErr(http.StatusTooManyRequests, "rate_limited", "at most %d code contexts per session, all busy; retry when a run ends", maxContextsPerSession)
			}
			delete(ks.m, idle.key)
			go idle.kill()
		}
		if ks.m == nil {
			ks.m = map[kernelKey]*kernelProc{}
		}
		k = &kernelProc{ks: ks, key: key}
		ks.m[key] = k
	}
	k.lastUsed = time.Now()
	ks.mu.Unlock()
	k.mu.Lock()
	return k, nil
}

func (k *kernelProc) release() {
	k.ks.mu.Lock()
	k.lastUsed = time.Now()
	k.ks.mu.Unlock()
	k.mu.Unlock()
}

// drop forgets a context (a later run with its id starts afresh).
func (ks *kernels) drop(k *kernelProc) {
	ks.mu.Lock()
	if ks.m[k.key] == k {
		delete(ks.m, k.key)
	}
	ks.mu.Unlock()
}

// closeSession ends every context of a session ("": of all sessions).
func (ks *kernels) closeSession(pk string) {
	ks.mu.Lock()
	var list []*kernelProc
	for key, k := range ks.m {
		if pk == "" || key.pk == pk {
			list = append(list, k)
			delete(ks.m, key)
		}
	}
	ks.mu.Unlock()
	for _, k := range list {
		k.kill()
	}
}

// start launches the context's interpreter and hands it its nonce.
func (k *kernelProc) start(ctx context.Context, rt Runtime, containerID string, env []string) error {
	args, err := kernel.Args(k.key.lang)
	if err != nil {
		return err
	}
	nonce := make([]byte, 16)
	rand.Read(nonce)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := rt.Start(sctx, containerID, agent.Spec{Args: args, Env: env, Cwd: runsc.Workspace,
		UID: runsc.UserUID, GID: runsc.UserGID, Stdin: true})
	if err != nil {
		return err
	}
	k.proc = p
	k.mark = kernel.Mark(hex.EncodeToString(nonce))
	k.stop = make(chan struct{})
	k.out = newMarkReader(p.Stdout(), k.mark, true, k.stop)
	k.err = newMarkReader(p.Stderr(), k.mark, false, k.stop)
	if _, err := io.WriteString(p.Stdin(), hex.EncodeToString(nonce)+"\n"); err != nil {
		k.kill()
		return err
	}
	return nil
}

// kill ends the context's process group. Safe on a context never started.
func (k *kernelProc) kill() {
	if p := k.proc; p != nil {
		k.killOnce.Do(func() {
			close(k.stop)
			p.Signal("SIGKILL", true)
			p.Close()
		})
	}
}

var errContextEnded = errors.New("code context ended")

// run sends code to the context and collects its output until the result.
// At the deadline (or when ctx ends) the run is interrupted; if it does not
// stop within interruptGrace, run returns an error and the caller kills the
// context.
func (k *kernelProc) run(ctx context.Context, code string, timeout time.Duration, stdout, stderr io.Writer) (res kernel.Result, timedOut bool, err error) {
	line, _ := json.Marshal(map[string]string{"code": code})
	if _, err := k.proc.Stdin().Write(append(line, '\n')); err != nil {
		return res, false, errContextEnded
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	done := ctx.Done()
	interrupted := false
	interrupt := func() {
		if interrupted {
			return
		}
		interrupted = true
		k.proc.Signal("SIGINT", false)
		timer.Reset(interruptGrace)
	}
	var gotOut, gotErr bool
	for !gotOut || !gotErr {
		select {
		case ev := <-k.out.ch:
			if ev.err != nil {
				return res, timedOut, errContextEnded
			}
			stdout.Write(ev.data)
			if ev.end {
				gotOut = true
				if jerr := json.Unmarshal(ev.frame, &res); jerr != nil {
					return res, timedOut, fmt.Errorf("code context: bad result frame: %w", jerr)
				}
			}
		case ev := <-k.err.ch:
			if ev.err != nil {
				return res, timedOut, errContextEnded
			}
			stderr.Write(ev.data)
			gotErr = gotErr || ev.end
		case <-timer.C:
			if interrupted {
				return res, true, errContextEnded
			}
			timedOut = true
			interrupt()
		case <-done:
			done = nil // the client left: stop the run, keep the context
			interrupt()
		}
	}
	return res, timedOut, nil
}

// markEvent is a piece of a kernel stream: output, and whether the run's
// mark (with its frame, on stdout) ended it; or the stream's end.
type markEvent struct {
	data  []byte
	end   bool
	frame []byte
	err   error
}

// markReader splits a kernel stream at its marks. Its goroutine ends with
// the stream, or when stop is closed and nobody reads.
type markReader struct {
	ch   chan markEvent
	stop chan struct{}
}

func newMarkReader(r io.Reader, mark []byte, frames bool, stop chan struct{}) *markReader {
	m := &markReader{ch: make(chan markEvent, 64), stop: stop}
	go m.loop(r, mark, frames)
	return m
}

func (m *markReader) send(ev markEvent) bool {
	select {
	case m.ch <- ev:
		return true
	case <-m.stop:
		return false
	}
}

func (m *markReader) loop(r io.Reader, mark []byte, frames bool) {
	var pending []byte
	inFrame := false
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			if inFrame {
				i := bytes.IndexByte(pending, '\n')
				if i < 0 {
					if len(pending) > maxKernelFrame {
						m.send(markEvent{err: errors.New("code context: result frame too large")})
						return
					}
					break
				}
				ev := markEvent{end: true}
				if frames {
					ev.frame = append([]byte(nil), pending[:i]...)
				}
				if !m.send(ev) {
					return
				}
				pending = pending[i+1:]
				inFrame = false
				continue
			}
			if i := bytes.Index(pending, mark); i >= 0 {
				if i > 0 && !m.send(markEvent{data: append([]byte(nil), pending[:i]...)}) {
					return
				}
				pending = pending[i+len(mark):]
				inFrame = true
				continue
			}
			// Keep a tail that may be the start of a mark.
			if keep := len(mark) - 1; len(pending) > keep {
				if !m.send(markEvent{data: append([]byte(nil), pending[:len(pending)-keep]...)}) {
					return
				}
				pending = append(pending[:0:0], pending[len(pending)-keep:]...)
			}
			break
		}
		if err != nil {
			m.send(markEvent{err: err})
			return
		}
	}
}
