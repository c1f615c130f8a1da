package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/runsc/kernel"
	"sandboxd/server/errdefs"
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
			s.writeError(c, errdefs.Conflict("session is %s; code runs only in a running session", ses.Status))
			return
		}
		secrets, err := s.db.Secrets(c.Request.Context(), ses.ID)
		if err != nil {
			s.writeError(c, err)
			return
		}
		end, ok := s.sb.begin(ses.ID, s.cfg.Limits.MaxExecsPerSession)
		if !ok {
			s.writeError(c, errdefs.RateLimited("at most %d commands run at once in a session; retry when one ends", s.cfg.Limits.MaxExecsPerSession))
			return
		}
		defer end()
		// A run waits for the context's previous one at most its own timeout,
		// and never runs for a client that has gone.
		k, aerr := s.kernels.acquire(c.Request.Context(), kernelKey{ses.ID, lang, req.ContextID}, timeout)
		if aerr != nil {
			s.writeError(c, aerr)
			return
		}
		defer k.release()
		set := s.scrub.forSession(ses.ID, secrets)
		if !k.started() {
			env := setEnv(commandEnv(ses.Env, secrets, nil), "MPLBACKEND", "Agg")
			// A frame holds the result (at most 4 bytes a character in UTF-8)
			// and the rich output.
			maxFrame := 4*s.cfg.Limits.ExecOutputBytes + kernel.MaxDisplayBytes + 64<<10
			if err := k.start(c.Request.Context(), s.rt, ses.ContainerID, env, maxFrame); err != nil {
				s.kernels.drop(k)
				s.log.Warn("start code context", "session", ses.SessionID, "runtime", lang, "err", err)
				s.noteDead(ses)
				s.writeError(c, errdefs.Conflict("the %s context could not start: %s", lang, agentMessage(err)))
				return
			}
		}
		s.logs.Event(ses.ID, "process_start", map[string]any{"runtime": lang, "contextId": req.ContextID,
			"code": clip(string(set.Redact([]byte(req.Code))), 256)})
		out := newCappedOutput(s.cfg.Limits.ExecOutputBytes)
		stdout, stderr := set.NewWriter(out.writer(&out.stdout)), set.NewWriter(out.writer(&out.stderr))
		start := time.Now()
		res, timedOut, runErr := k.run(c.Request.Context(), req.Code, s.cfg.Limits.ExecOutputBytes, timeout, stdout, stderr)
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
		resp.Truncated = out.truncated || res.Truncated
		redact := func(v string) string { return string(set.Redact([]byte(v))) }
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
		resp.Display = make([]kernel.Display, 0, len(res.Display))
		for _, d := range res.Display {
			resp.Display = append(resp.Display, kernel.Display{Mime: clip(redact(d.Mime), 128), Data: redact(d.Data)})
		}
		exit := map[string]any{"runtime": lang, "contextId": req.ContextID, "durationMs": resp.DurationMs, "timedOut": timedOut}
		if resp.Error != nil {
			exit["error"] = resp.Error.Name
		}
		s.logs.Event(ses.ID, "process_exit", exit)
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

// kernelProc is one context. Holding slot (a one-place semaphore) is
// running in it; the first run starts its process.
type kernelProc struct {
	ks       *kernels
	key      kernelKey
	slot     chan struct{}
	lastUsed time.Time // guarded by ks.mu
	seq      uint64    // the last request's number; with the slot held

	pmu      sync.Mutex // guards proc and stop against kill
	proc     Process
	out, err *markReader
	stop     chan struct{} // closed by kill
}

// acquire returns key's context with its slot held, making room for a new
// one by ending the session's least recently used idle context. It waits
// for a busy context until wait passes or ctx ends.
func (ks *kernels) acquire(ctx context.Context, key kernelKey, wait time.Duration) (*kernelProc, error) {
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
			if len(v.slot) == 0 && (idle == nil || v.lastUsed.Before(idle.lastUsed)) {
				idle = v
			}
		}
		if n >= maxContextsPerSession {
			if idle == nil {
				ks.mu.Unlock()
				return nil, errdefs.RateLimited("at most %d code contexts per session, all busy; retry when a run ends", maxContextsPerSession)
			}
			delete(ks.m, idle.key)
			go idle.kill()
		}
		if ks.m == nil {
			ks.m = map[kernelKey]*kernelProc{}
		}
		k = &kernelProc{ks: ks, key: key, slot: make(chan struct{}, 1)}
		ks.m[key] = k
	}
	k.lastUsed = time.Now()
	ks.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case k.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, errdefs.Unavailable("the request ended while waiting for the context")
	case <-t.C:
		return nil, errdefs.RateLimited("context %q is busy with another run; retry when it ends", key.contextID)
	}
	if ctx.Err() != nil { // the client left while the slot was taken
		<-k.slot
		return nil, errdefs.Unavailable("the request ended while waiting for the context")
	}
	return k, nil
}

func (k *kernelProc) release() {
	k.ks.mu.Lock()
	k.lastUsed = time.Now()
	k.ks.mu.Unlock()
	<-k.slot
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

func (k *kernelProc) started() bool {
	k.pmu.Lock()
	defer k.pmu.Unlock()
	return k.proc != nil
}

// start launches the context's interpreter and hands it its nonce.
func (k *kernelProc) start(ctx context.Context, rt Runtime, containerID string, env []string, maxFrame int) error {
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
	k.pmu.Lock()
	k.proc, k.stop = p, make(chan struct{})
	mark := kernel.Mark(hex.EncodeToString(nonce))
	k.out = newMarkReader(p.Stdout(), mark, maxFrame, k.stop)
	k.err = newMarkReader(p.Stderr(), mark, 64, k.stop)
	k.pmu.Unlock()
	if _, err := io.WriteString(p.Stdin(), hex.EncodeToString(nonce)+"\n"); err != nil {
		k.kill()
		return err
	}
	return nil
}

// kill ends the context: closing the agent connection makes the agent kill
// its process group. Safe on a context never started, and more than once.
func (k *kernelProc) kill() {
	k.pmu.Lock()
	p, stop := k.proc, k.stop
	k.proc = nil
	k.pmu.Unlock()
	if p != nil {
		close(stop)
		p.Close()
	}
}

var errContextEnded = errors.New("code context ended")

// run sends code to the context and collects its output until the result
// of this request (frames carry the request's number, so a frame forged or
// left over from an earlier run is skipped). At the deadline (or when ctx
// ends) the run is interrupted; if it does not stop within interruptGrace,
// run returns an error and the caller kills the context.
func (k *kernelProc) run(ctx context.Context, code string, maxResult int, timeout time.Duration, stdout, stderr io.Writer) (res kernel.Result, timedOut bool, err error) {
	k.seq++
	seq := k.seq
	line, _ := json.Marshal(kernel.Request{Code: code, Seq: seq, MaxResult: maxResult, MaxDisplay: kernel.MaxDisplayBytes})
	p := k.proc
	written := make(chan error, 1)
	go func() { // a kernel that stops reading stdin must not hold the run
		_, err := p.Stdin().Write(append(line, '\n'))
		written <- err
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	done := ctx.Done()
	interrupted := false
	interrupt := func() {
		if !interrupted {
			interrupted = true
			go p.Signal("SIGINT", false)
			timer.Reset(interruptGrace)
		}
	}
	wantErr := []byte(strconv.FormatUint(seq, 10))
	var gotOut, gotErr, lost bool
	outCh, errCh := k.out.ch, k.err.ch
	for !gotOut || !gotErr {
		select {
		case ev := <-outCh:
			stdout.Write(ev.data)
			switch {
			case ev.err != nil:
				lost, gotOut, outCh = true, true, nil
				interrupt() // the context is gone: take what is left, briefly
			case ev.end:
				var f kernel.Result
				if json.Unmarshal(ev.frame, &f) == nil && f.Seq == seq {
					res, gotOut = f, true
				}
			}
		case ev := <-errCh:
			stderr.Write(ev.data)
			switch {
			case ev.err != nil:
				lost, gotErr, errCh = true, true, nil
				interrupt() // the context is gone: take what is left, briefly
			case ev.end && bytes.Equal(ev.frame, wantErr):
				gotErr = true
			}
		case err := <-written:
			if err != nil {
				lost = true
				interrupt() // collect what is left, then give up
			}
		case <-k.stop:
			return res, timedOut, errContextEnded
		case <-timer.C:
			if interrupted {
				return res, timedOut, errContextEnded
			}
			timedOut = true
			interrupt()
		case <-done:
			done = nil // the client left: stop the run, keep the context
			interrupt()
		}
	}
	if lost {
		return res, timedOut, errContextEnded
	}
	return res, timedOut, nil
}

// markEvent is a piece of a kernel stream: output, and whether a mark (with
// the line after it) ended it; or the stream's end.
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

func newMarkReader(r io.Reader, mark []byte, maxFrame int, stop chan struct{}) *markReader {
	m := &markReader{ch: make(chan markEvent, 64), stop: stop}
	go m.loop(r, mark, maxFrame)
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

func (m *markReader) loop(r io.Reader, mark []byte, maxFrame int) {
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
					if len(pending) > maxFrame {
						m.send(markEvent{err: errors.New("code context: result frame too large")})
						return
					}
					break
				}
				if !m.send(markEvent{end: true, frame: pending[:i:i]}) {
					return
				}
				// A new array: the frame's may be large and must not stay pinned.
				pending = append([]byte(nil), pending[i+1:]...)
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
				pending = append([]byte(nil), pending[len(pending)-keep:]...)
			}
			break
		}
		if err != nil {
			if !inFrame && len(pending) > 0 { // the last words of a dying context
				m.send(markEvent{data: pending})
			}
			m.send(markEvent{err: err})
			return
		}
	}
}
