package procs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/runsc/interp"
	"sandboxd/server/errdefs"
)

// Code contexts: a context is a long-lived interpreter inside a sandbox
// (started by the agent as the sandbox user) whose state persists between
// runs with the same contextId. Contexts live as long as the sandbox and
// the server process: teardown, death of the sandbox or a server restart
// ends them.
const (
	// MaxContextsPerSession bounds a session's live contexts; the least
	// recently used idle one makes room for a new one.
	MaxContextsPerSession = 8
	// interruptGrace is how long a run has to stop after the interrupt
	// (SIGINT: KeyboardInterrupt) before its context is killed.
	interruptGrace = 2 * time.Second
)

// Key names one context.
type Key struct{ PK, Lang, ContextID string }

// Contexts holds the live contexts of all sessions.
type Contexts struct {
	mu sync.Mutex
	m  map[Key]*Context
}

// Context is one interpreter. Holding slot (a one-place semaphore) is
// running in it; the first run starts its process.
type Context struct {
	cs       *Contexts
	key      Key
	slot     chan struct{}
	users    int       // requests between Acquire and Release; guarded by cs.mu
	lastUsed time.Time // guarded by cs.mu
	seq      uint64    // the last request's number; with the slot held

	pmu      sync.Mutex // guards proc, out, err and stop against kill, and the run's pause channels
	proc     runsc.Process
	out, err *markReader
	stop     chan struct{} // closed by kill
	// While a run is in flight: pausing is closed by Pause (the session is
	// being paused), runDone by the run when it returns.
	pausing, runDone chan struct{}
}

// ErrRunPaused: the run was interrupted because its session was paused; the
// context keeps its state.
var ErrRunPaused = errors.New("session paused during the run")

// pauseWait bounds how long Pause waits for interrupted runs to answer.
const pauseWait = interruptGrace + time.Second

// Pause interrupts the runs in flight in a session's contexts (its sandbox
// is about to be checkpointed) and waits, at most pauseWait, for them to
// return: each is interrupted as at its timeout (Python: KeyboardInterrupt)
// and answers ErrRunPaused, so no client waits on a frozen sandbox and the
// interpreters are idle in the checkpoint.
func (cs *Contexts) Pause(pk string) {
	cs.mu.Lock()
	var list []*Context
	for key, k := range cs.m {
		if key.PK == pk {
			list = append(list, k)
		}
	}
	cs.mu.Unlock()
	var done []chan struct{}
	for _, k := range list {
		k.pmu.Lock()
		if k.pausing != nil {
			close(k.pausing)
			k.pausing = nil
			done = append(done, k.runDone)
		}
		k.pmu.Unlock()
	}
	t := time.NewTimer(pauseWait)
	defer t.Stop()
	for _, d := range done {
		select {
		case <-d:
		case <-t.C:
			return
		}
	}
}

// Acquire returns key's context with its slot held, making room for a new
// one by ending the session's least recently used unused context (one no
// request holds or waits for). It waits for a busy context until wait
// passes or ctx ends. The caller calls Release.
func (cs *Contexts) Acquire(ctx context.Context, key Key, wait time.Duration) (*Context, error) {
	cs.mu.Lock()
	k := cs.m[key]
	var evict *Context
	if k == nil {
		var n int
		for kk, v := range cs.m {
			if kk.PK != key.PK {
				continue
			}
			n++
			if v.users == 0 && (evict == nil || v.lastUsed.Before(evict.lastUsed)) {
				evict = v
			}
		}
		if n >= MaxContextsPerSession {
			if evict == nil {
				cs.mu.Unlock()
				return nil, errdefs.RateLimited("at most %d code contexts per session, all busy; retry when a run ends", MaxContextsPerSession)
			}
			delete(cs.m, evict.key)
		} else {
			evict = nil
		}
		if cs.m == nil {
			cs.m = map[Key]*Context{}
		}
		k = &Context{cs: cs, key: key, slot: make(chan struct{}, 1)}
		cs.m[key] = k
	}
	// Counted under the lock that eviction takes: a context a request has
	// found is never evicted under it.
	k.users++
	k.lastUsed = time.Now()
	cs.mu.Unlock()
	if evict != nil {
		evict.Kill() // no user can reach it any more
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case k.slot <- struct{}{}:
	case <-ctx.Done():
		k.unuse()
		return nil, errdefs.Unavailable("the request ended while waiting for the context")
	case <-t.C:
		k.unuse()
		return nil, errdefs.RateLimited("context %q is busy with another run; retry when it ends", key.ContextID)
	}
	if ctx.Err() != nil { // the client left while the slot was taken
		k.Release()
		return nil, errdefs.Unavailable("the request ended while waiting for the context")
	}
	return k, nil
}

func (k *Context) unuse() {
	k.cs.mu.Lock()
	k.users--
	k.lastUsed = time.Now()
	k.cs.mu.Unlock()
}

// Release gives the slot back.
func (k *Context) Release() {
	<-k.slot
	k.unuse()
}

// Count is the number of live contexts of all sessions.
func (cs *Contexts) Count() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.m)
}

// Drop forgets a context (a later run with its id starts afresh).
func (cs *Contexts) Drop(k *Context) {
	cs.mu.Lock()
	if cs.m[k.key] == k {
		delete(cs.m, k.key)
	}
	cs.mu.Unlock()
}

// CloseSession ends every context of a session ("": of all sessions).
func (cs *Contexts) CloseSession(pk string) {
	cs.mu.Lock()
	var list []*Context
	for key, k := range cs.m {
		if pk == "" || key.PK == pk {
			list = append(list, k)
			delete(cs.m, key)
		}
	}
	cs.mu.Unlock()
	for _, k := range list {
		k.Kill()
	}
}

// Started reports whether the context's interpreter runs.
func (k *Context) Started() bool {
	k.pmu.Lock()
	defer k.pmu.Unlock()
	return k.proc != nil
}

// Starter starts a process in a sandbox (runsc.Runtime.Start).
type Starter interface {
	Start(ctx context.Context, id string, s agent.Spec) (runsc.Process, error)
}

// Start launches the context's interpreter in container id with env and
// hands it its nonce. maxFrame bounds one result frame.
func (k *Context) Start(ctx context.Context, st Starter, id string, env []string, maxFrame int) error {
	args, err := interp.Args(k.key.Lang)
	if err != nil {
		return err
	}
	nonce := make([]byte, 16)
	rand.Read(nonce)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p, err := st.Start(sctx, id, agent.Spec{Args: args, Env: env, Cwd: runsc.Workspace,
		UID: runsc.UserUID, GID: runsc.UserGID, Stdin: true})
	if err != nil {
		return err
	}
	// A context dropped meanwhile (teardown closed the session's) must not
	// get a process nobody would end: the check and the store are under the
	// map's lock, which CloseSession and Drop take before killing.
	k.cs.mu.Lock()
	live := k.cs.m[k.key] == k
	if live {
		k.pmu.Lock()
		k.proc, k.stop = p, make(chan struct{})
		mark := interp.Mark(hex.EncodeToString(nonce))
		k.out = newMarkReader(p.Stdout(), mark, maxFrame, k.stop)
		k.err = newMarkReader(p.Stderr(), mark, 64, k.stop)
		k.pmu.Unlock()
	}
	k.cs.mu.Unlock()
	if !live {
		p.Close()
		return ErrContextEnded
	}
	if _, err := io.WriteString(p.Stdin(), hex.EncodeToString(nonce)+"\n"); err != nil {
		k.Kill()
		return err
	}
	return nil
}

// Kill ends the context: closing the agent connection makes the agent kill
// its process group. Safe on a context never started, and more than once.
func (k *Context) Kill() {
	k.pmu.Lock()
	p, stop := k.proc, k.stop
	k.proc = nil
	k.pmu.Unlock()
	if p != nil {
		close(stop)
		p.Close()
	}
}

// ErrContextEnded: the context's interpreter is gone.
var ErrContextEnded = errors.New("code context ended")

// Run sends code to the context and collects its output until the result
// of this request (frames carry the request's number, so a frame forged or
// left over from an earlier run is skipped). At the deadline (or when ctx
// ends) the run is interrupted; if it does not stop within interruptGrace,
// Run returns ErrContextEnded and the caller kills the context. The caller
// holds the slot.
func (k *Context) Run(ctx context.Context, code string, maxResult int, timeout time.Duration, stdout, stderr io.Writer) (res interp.Result, timedOut bool, err error) {
	k.pmu.Lock()
	p, outR, errR, stop := k.proc, k.out, k.err, k.stop
	pausing, runDone := make(chan struct{}), make(chan struct{})
	k.pausing, k.runDone = pausing, runDone
	k.pmu.Unlock()
	defer func() {
		k.pmu.Lock()
		if k.runDone == runDone {
			k.pausing, k.runDone = nil, nil
		}
		k.pmu.Unlock()
		close(runDone)
	}()
	if p == nil {
		return res, false, ErrContextEnded
	}
	k.seq++
	seq := k.seq
	line, _ := json.Marshal(interp.Request{Code: code, Seq: seq, MaxResult: maxResult, MaxDisplay: interp.MaxDisplayBytes})
	written := make(chan error, 1)
	go func() { // an interpreter that stops reading stdin must not hold the run; ends when Kill closes p
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
			go p.Signal("SIGINT", false) // one frame on the connection; ends with it
			timer.Reset(interruptGrace)
		}
	}
	wantErr := []byte(strconv.FormatUint(seq, 10))
	var gotOut, gotErr, lost, paused bool
	outCh, errCh := outR.ch, errR.ch
	for !gotOut || !gotErr {
		select {
		case ev := <-outCh:
			stdout.Write(ev.data)
			switch {
			case ev.err != nil:
				lost, gotOut, outCh = true, true, nil
				interrupt() // the context is gone: take what is left, briefly
			case ev.end:
				var f interp.Result
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
			if errors.Is(err, agent.ErrParked) {
				// The session is being paused: nothing was sent.
				return res, false, ErrRunPaused
			}
			if err != nil {
				lost = true
				interrupt() // collect what is left, then give up
			}
		case <-pausing:
			pausing = nil
			paused = true
			interrupt()
		case <-stop:
			return res, timedOut, ErrContextEnded
		case <-timer.C:
			if interrupted {
				return res, timedOut, ErrContextEnded
			}
			timedOut = true
			interrupt()
		case <-done:
			done = nil // the client left: stop the run, keep the context
			interrupt()
		}
	}
	if lost {
		return res, timedOut, ErrContextEnded
	}
	if paused {
		return res, timedOut, ErrRunPaused
	}
	return res, timedOut, nil
}

// markEvent is a piece of an interpreter's stream: output, and whether a
// mark (with the line after it) ended it; or the stream's end.
type markEvent struct {
	data  []byte
	end   bool
	frame []byte
	err   error
}

// markReader splits an interpreter's stream at its marks. Its goroutine
// ends with the stream, or when stop is closed and nobody reads.
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
			// Keep only a tail that is the start of a mark: output goes on
			// as it comes (the merged stdout/stderr view depends on it).
			if keep := markPrefixTail(pending, mark); len(pending) > keep {
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

// markPrefixTail is the length of the longest proper prefix of mark that
// b ends with.
func markPrefixTail(b, mark []byte) int {
	for k := min(len(mark)-1, len(b)); k > 0; k-- {
		if bytes.HasSuffix(b, mark[:k]) {
			return k
		}
	}
	return 0
}
