package procs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"testing"
	"time"

	"sandboxd/runsc/interp"
	"sandboxd/server/errdefs"
)

// fakeInterp speaks the interpreters' protocol (runsc/interp): a nonce line,
// then one request a line; the code says what to do.
func fakeInterp(p *fakeProc) int {
	in := bufio.NewReader(p.inR)
	nonce, err := in.ReadString('\n')
	if err != nil {
		return 1
	}
	mark := interp.Mark(nonce[:len(nonce)-1])
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return 0
		}
		var req interp.Request
		if json.Unmarshal(line, &req) != nil {
			return 2
		}
		res := interp.Result{Seq: req.Seq}
		switch req.Code {
		case "die":
			p.outW.Write([]byte("last words"))
			return 9
		case "hang": // ignores the interrupt until killed
			io.Copy(io.Discard, in)
			return 0
		case "sleep": // stops at the interrupt
			for !slices.Contains(p.signalsNow(), "SIGINT") {
				time.Sleep(5 * time.Millisecond)
			}
			res.Error = &interp.Error{Name: "KeyboardInterrupt"}
		case "forge": // a frame for another run first, then its own
			fmt.Fprintf(p.outW, "%s{\"seq\":%d,\"result\":\"forged\"}\n", mark, req.Seq+100)
			fallthrough
		default:
			r := "=" + req.Code
			res.Result = &r
		}
		fmt.Fprintf(p.outW, "out:%s", req.Code)
		fmt.Fprintf(p.errW, "err:%s", req.Code)
		frame, _ := json.Marshal(res)
		p.outW.Write(append(append(mark, frame...), '\n'))
		p.errW.Write(append(mark, []byte(strconv.FormatUint(req.Seq, 10)+"\n")...))
	}
}

func (p *fakeProc) signalsNow() []string { s, _ := p.got(); return s }

// run acquires, starts if needed, runs code and releases.
func run(t *testing.T, cs *Contexts, st Starter, key Key, code string, timeout time.Duration) (interp.Result, bool, string, error) {
	t.Helper()
	k, err := cs.Acquire(context.Background(), key, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Release()
	if !k.Started() {
		if err := k.Start(context.Background(), st, "sbx", nil, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	var out, errs bytes.Buffer
	res, timedOut, err := k.Run(context.Background(), code, 1<<20, timeout, &out, &errs)
	if err != nil {
		cs.Drop(k)
		k.Kill()
	}
	return res, timedOut, out.String() + "|" + errs.String(), err
}

func TestContextRuns(t *testing.T) {
	var cs Contexts
	defer cs.CloseSession("")
	st := &fakeStarter{run: fakeInterp}
	key := Key{"pk", "python", "default"}
	res, timedOut, out, err := run(t, &cs, st, key, "a", time.Second)
	if err != nil || timedOut || *res.Result != "=a" || out != "out:a|err:a" {
		t.Fatalf("run a: %+v %v %q %v", res, timedOut, out, err)
	}
	// A forged frame (another run's number) is skipped.
	res, _, _, err = run(t, &cs, st, key, "forge", time.Second)
	if err != nil || *res.Result != "=forge" {
		t.Fatalf("forge: %+v %v", res, err)
	}
	if n := len(st.all()); n != 1 {
		t.Fatalf("%d interpreters for one context", n)
	}
	// At the timeout the run is interrupted and the context lives on.
	res, timedOut, _, err = run(t, &cs, st, key, "sleep", 50*time.Millisecond)
	if err != nil || !timedOut || res.Error == nil || res.Error.Name != "KeyboardInterrupt" {
		t.Fatalf("sleep: %+v %v %v", res, timedOut, err)
	}
	if res, _, _, err = run(t, &cs, st, key, "b", time.Second); err != nil || *res.Result != "=b" {
		t.Fatalf("after the interrupt: %+v %v", res, err)
	}
	// A context that dies: its last words, then it is gone.
	_, _, out, err = run(t, &cs, st, key, "die", time.Second)
	if !errors.Is(err, ErrContextEnded) || out != "last words|" {
		t.Fatalf("die: %q %v", out, err)
	}
	// One that ignores the interrupt is given up after the grace time.
	start := time.Now()
	_, timedOut, _, err = run(t, &cs, st, key, "hang", 50*time.Millisecond)
	if !errors.Is(err, ErrContextEnded) || !timedOut || time.Since(start) < interruptGrace {
		t.Fatalf("hang: %v %v after %v", timedOut, err, time.Since(start))
	}
	// Both dropped contexts' interpreters are gone.
	for i, p := range st.all() {
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			t.Errorf("interpreter %d still runs after its context was dropped", i)
		}
	}
	if cs.Count() != 0 {
		t.Errorf("%d contexts left", cs.Count())
	}
}

// A busy context makes the next run wait at most its timeout; a context a
// request holds or waits for is never evicted to make room.
func TestContextBusyAndEviction(t *testing.T) {
	var cs Contexts
	defer cs.CloseSession("")
	st := &fakeStarter{run: fakeInterp}
	held, err := cs.Acquire(context.Background(), Key{"pk", "python", "c0"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Acquire(context.Background(), Key{"pk", "python", "c0"}, 20*time.Millisecond); !errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("busy context: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := cs.Acquire(ctx, Key{"pk", "python", "c0"}, time.Second); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("client gone: %v", err)
	}
	// c0 is the least recently used, but held: the others make room.
	for i := 1; i < MaxContextsPerSession; i++ {
		run(t, &cs, st, Key{"pk", "python", fmt.Sprint("c", i)}, "x", time.Second)
	}
	run(t, &cs, st, Key{"pk", "python", "new"}, "x", time.Second)
	if _, err := cs.Acquire(context.Background(), Key{"pk", "python", "c0"}, 20*time.Millisecond); !errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("the held context was replaced: %v", err)
	}
	if n := cs.Count(); n != MaxContextsPerSession {
		t.Fatalf("%d contexts, want %d", n, MaxContextsPerSession)
	}
	if !st.all()[0].wasClosed() {
		t.Fatal("the least recently used idle context was not ended")
	}
	// Another session has its own budget.
	run(t, &cs, st, Key{"other", "node", "c0"}, "x", time.Second)
	held.Release()
}

// A context closed (teardown) while its interpreter starts does not keep
// the interpreter.
func TestContextStartAfterClose(t *testing.T) {
	var cs Contexts
	st := &fakeStarter{run: fakeInterp, gate: make(chan struct{})}
	k, err := cs.Acquire(context.Background(), Key{"pk", "python", "c"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error)
	go func() { started <- k.Start(context.Background(), st, "sbx", nil, 1<<20) }()
	cs.CloseSession("pk")
	close(st.gate)
	if err := <-started; !errors.Is(err, ErrContextEnded) {
		t.Fatalf("Start after close: %v", err)
	}
	if !st.all()[0].wasClosed() {
		t.Fatal("the interpreter of a closed context was kept")
	}
	k.Release()
}
