package server

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/store"
)

func TestCappedOutput(t *testing.T) {
	o := newCappedOutput(10)
	out, errw := o.stdoutWriter(), o.stderrWriter()
	write := func(w capWriter, s string) {
		t.Helper()
		n, err := w.Write([]byte(s))
		if err != nil || n != len(s) {
			t.Fatalf("Write(%q) = %d, %v; want %d, nil (writers always drain)", s, n, err, len(s))
		}
	}
	dropped := func(wantOut, wantErr int64) {
		t.Helper()
		if gotOut, gotErr := o.dropped(); gotOut != wantOut || gotErr != wantErr {
			t.Fatalf("dropped %d, %d; want %d, %d", gotOut, gotErr, wantOut, wantErr)
		}
	}
	write(out, "abcd") // 4 kept, 6 left
	if o.truncated {
		t.Fatal("truncated too early")
	}
	write(errw, "EFG") // 3 kept, 3 left
	dropped(0, 0)
	write(out, "hijkl") // 3 kept ("hij"), 0 left
	if !o.truncated {
		t.Fatal("not truncated after exceeding the cap")
	}
	dropped(2, 0)
	write(errw, "MORE") // nothing kept
	write(out, "")
	dropped(2, 4)
	if got := o.stdout.String(); got != "abcdhij" {
		t.Errorf("stdout = %q, want %q", got, "abcdhij")
	}
	if got := o.stderr.String(); got != "EFG" {
		t.Errorf("stderr = %q, want %q", got, "EFG")
	}
	if n := o.stdout.Len() + o.stderr.Len(); n != 10 {
		t.Errorf("kept %d bytes, want exactly 10", n)
	}

	// Exactly at the cap is not truncated.
	o = newCappedOutput(5)
	w := o.stdoutWriter()
	w.Write([]byte("12345"))
	if o.truncated || o.stdout.String() != "12345" {
		t.Errorf("exact fit: %q truncated=%v", o.stdout.String(), o.truncated)
	}
	dropped(0, 0)
	w.Write([]byte("6"))
	if !o.truncated || o.stdout.String() != "12345" {
		t.Errorf("one past: %q truncated=%v", o.stdout.String(), o.truncated)
	}
	dropped(1, 0)

	// Concurrent writers share the cap and count every byte (run with -race).
	o = newCappedOutput(1000)
	done := make(chan struct{})
	for _, w := range []capWriter{o.stdoutWriter(), o.stderrWriter()} {
		go func() {
			for range 200 {
				w.Write([]byte("0123456789"))
			}
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	if n := o.stdout.Len() + o.stderr.Len(); n != 1000 || !o.truncated {
		t.Errorf("concurrent: kept %d, truncated=%v", n, o.truncated)
	}
	if a, b := o.dropped(); a+b != 3000 || int64(o.stdout.Len())+a != 2000 || int64(o.stderr.Len())+b != 2000 {
		t.Errorf("concurrent: dropped %d, %d; kept %d, %d", a, b, o.stdout.Len(), o.stderr.Len())
	}
}

// Front writers pass bytes to the scrubber (here a stand-in) while the
// answer has room, then only count them.
func TestCappedOutputFront(t *testing.T) {
	o := newCappedOutput(8)
	var seenOut, seenErr bytes.Buffer
	// The stand-in "scrubber" upper-cases and forwards to the cap.
	upper := func(seen *bytes.Buffer, w capWriter) io.Writer {
		return writerFunc(func(p []byte) (int, error) {
			seen.Write(p)
			w.Write(bytes.ToUpper(p))
			return len(p), nil
		})
	}
	out, errw := o.front(upper(&seenOut, o.stdoutWriter()), upper(&seenErr, o.stderrWriter()))
	out.Write([]byte("abcde"))  // 5 kept
	errw.Write([]byte("fghij")) // 3 kept, 2 dropped after the scrubber
	out.Write([]byte("klm"))    // full: skips the scrubber
	errw.Write([]byte("nopq"))
	errw.Write(nil)
	if o.stdout.String() != "ABCDE" || o.stderr.String() != "FGH" || !o.truncated {
		t.Fatalf("kept %q %q truncated %v", o.stdout.String(), o.stderr.String(), o.truncated)
	}
	if seenOut.String() != "abcde" || seenErr.String() != "fghij" {
		t.Errorf("scrubbed %q %q after the answer was full", seenOut.String(), seenErr.String())
	}
	if a, b := o.dropped(); a != 3 || b != 6 {
		t.Errorf("dropped %d, %d; want 3, 6", a, b)
	}

	// Exactly full: the next byte is dropped, and says so.
	o = newCappedOutput(3)
	out, _ = o.front(o.stdoutWriter(), o.stderrWriter())
	out.Write([]byte("abc"))
	if o.truncated {
		t.Fatal("truncated at an exact fit")
	}
	out.Write([]byte("d"))
	if a, _ := o.dropped(); !o.truncated || a != 1 {
		t.Errorf("one past a full answer: truncated %v dropped %d", o.truncated, a)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// The stop channel closes once the dropped bytes of both streams together
// pass the limit, exactly once, and never without a limit.
func TestCappedOutputStop(t *testing.T) {
	closed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	o := newCappedOutput(4)
	stop := o.stopAfter(10)
	out, errw := o.stdoutWriter(), o.stderrWriter()
	out.Write([]byte("abcdef")) // 2 dropped
	errw.Write([]byte("12345")) // 7
	out.Write([]byte("xyz"))    // 10: at the limit, not past it
	if closed(stop) {
		t.Fatal("stopped at the limit")
	}
	errw.Write([]byte("!")) // 11
	if !closed(stop) {
		t.Fatal("not stopped past the limit")
	}
	out.Write(bytes.Repeat([]byte("z"), 100)) // no second close (it would panic)
	if a, b := o.dropped(); a != 105 || b != 6 {
		t.Errorf("dropped %d, %d", a, b)
	}

	// One write that jumps past the limit closes it too.
	o = newCappedOutput(4)
	stop = o.stopAfter(10)
	o.stderrWriter().Write(bytes.Repeat([]byte("e"), 100))
	if !closed(stop) {
		t.Fatal("not stopped by one big write")
	}

	o = newCappedOutput(4)
	if o.stopAfter(0) != nil {
		t.Fatal("limit 0 must never stop")
	}
	o.stdoutWriter().Write(bytes.Repeat([]byte("o"), 1<<20))
	if a, _ := o.dropped(); a != 1<<20-4 {
		t.Errorf("dropped %d without a limit", a)
	}
}

func TestAPIExecValidation(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "x-1"})
	cases := []struct {
		name string
		body any
		want string
	}{
		{"kill", map[string]any{"action": "kill", "command": "id"}, "action"},
		{"no action", map[string]any{"action": "", "command": "id"}, "action"},
		{"missing action", map[string]any{"command": "id"}, "action"},
		{"empty command", map[string]any{"action": "exec", "command": ""}, "command"},
		{"blank command", map[string]any{"action": "exec", "command": " \n\t"}, "command"},
		{"NUL command", map[string]any{"action": "exec", "command": "a\x00b"}, "command"},
		{"huge command", map[string]any{"action": "exec", "command": strings.Repeat("x", maxCommandBytes+1)}, "command"},
		{"relative cwd", map[string]any{"action": "exec", "command": "id", "cwd": "workspace"}, "cwd"},
		{"unclean cwd", map[string]any{"action": "exec", "command": "id", "cwd": "/workspace/../etc"}, "cwd"},
		{"timeout 0", map[string]any{"action": "exec", "command": "id", "timeoutMs": 0}, "timeoutMs"},
		{"timeout negative", map[string]any{"action": "exec", "command": "id", "timeoutMs": -5}, "timeoutMs"},
		{"timeout too long", map[string]any{"action": "exec", "command": "id", "timeoutMs": e.s.cfg.Limits.ExecMaxTimeoutMs + 1}, "timeoutMs"},
		{"reserved env", map[string]any{"action": "exec", "command": "id", "env": map[string]string{"HOME": "/"}}, "HOME"},
		{"unknown field", map[string]any{"action": "exec", "command": "id", "user": "root"}, `"user"`},
		{"wrong type", map[string]any{"action": "exec", "command": []string{"id"}}, "command: must be a string"},
	}
	for _, c := range cases {
		msg := apiError(t, e.exec(e.token, "x-1", c.body), http.StatusBadRequest, "invalid_request")
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s: message %q, want %q", c.name, msg, c.want)
		}
	}
	apiError(t, e.exec(e.token, "-bad", map[string]any{"action": "exec", "command": "id"}), http.StatusBadRequest, "invalid_session_id")
	apiError(t, e.exec(e.token, "nope", map[string]any{"action": "exec", "command": "id"}), http.StatusNotFound, "not_found")
	if c := e.rt.CallsWith("exec"); len(c) != 0 {
		t.Errorf("Exec called: %v", c)
	}
	// Valid: explicit cwd, timeout and stdin reach the runtime.
	var gotStdin string
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		b, _ := io.ReadAll(req.Stdin)
		gotStdin = string(b)
		return runsc.ExecResult{}, nil
	}
	decodeBody[execResponse](t, e.exec(e.token, "x-1", map[string]any{
		"action": "exec", "command": "cat", "cwd": "/tmp", "timeoutMs": 1500, "stdin": "input",
	}), http.StatusOK)
	if xr := e.rt.Execs[0]; xr.Cwd != "/tmp" || xr.Timeout != 1500*time.Millisecond || gotStdin != "input" {
		t.Errorf("exec request cwd %q timeout %v stdin %q", xr.Cwd, xr.Timeout, gotStdin)
	}
}

func TestAPIExecOutputCapped(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) { c.Limits.ExecOutputBytes = 1024 })
	e.provision(e.token, map[string]any{"sessionId": "cap"})
	// Bytes no scrubber keyword begins with: a keyword's prefix at the end
	// of a write is held back until more comes, and the cap counts bytes as
	// they are released.
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		req.Stdout.Write(bytes.Repeat([]byte("#"), 1000))
		req.Stderr.Write(bytes.Repeat([]byte("~"), 1000))
		return runsc.ExecResult{}, nil
	}
	res := decodeBody[execResponse](t, e.exec(e.token, "cap", map[string]any{"action": "exec", "command": "x"}), http.StatusOK)
	if len(res.Stdout) != 1000 || len(res.Stderr) != 24 || !res.Truncated {
		t.Errorf("stdout %d stderr %d truncated %v", len(res.Stdout), len(res.Stderr), res.Truncated)
	}
	if res.StdoutDropped != 0 || res.StderrDropped != 976 || res.StoppedForOutput {
		t.Errorf("dropped %d, %d, stopped %v", res.StdoutDropped, res.StderrDropped, res.StoppedForOutput)
	}
	// A secret cut by the cap: what is kept is redacted, and the count is
	// of the redacted text.
	secret := "token ghp_" + strings.Repeat("a", 36) + " end"
	redacted := string(e.s.sessions.RedactAllSessions([]byte(secret)))
	if redacted == secret {
		t.Fatal("not a secret to the scrubber")
	}
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		req.Stdout.Write(bytes.Repeat([]byte("#"), 1010))
		io.WriteString(req.Stderr, secret)
		return runsc.ExecResult{}, nil
	}
	res = decodeBody[execResponse](t, e.exec(e.token, "cap", map[string]any{"action": "exec", "command": "x"}), http.StatusOK)
	if !res.Truncated || res.Stderr != redacted[:14] || res.StderrDropped != int64(len(redacted)-14) {
		t.Errorf("secret cut: stderr %q dropped %d, want %q and %d", res.Stderr, res.StderrDropped, redacted[:14], len(redacted)-14)
	}
	// Once the answer is full, output is counted as written.
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		req.Stdout.Write(bytes.Repeat([]byte("#"), 1024))
		io.WriteString(req.Stderr, secret)
		return runsc.ExecResult{}, nil
	}
	res = decodeBody[execResponse](t, e.exec(e.token, "cap", map[string]any{"action": "exec", "command": "x"}), http.StatusOK)
	if !res.Truncated || res.Stderr != "" || res.StderrDropped != int64(len(secret)) {
		t.Errorf("after a full answer: stderr %q dropped %d, want %d", res.Stderr, res.StderrDropped, len(secret))
	}
}

// Output beyond limits.execMaxDroppedBytes past the cap stops the command
// (runsc kills its process group when Stop closes); the answer says so.
func TestAPIExecStoppedForOutput(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) { c.Limits.ExecOutputBytes = 1024; c.Limits.ExecMaxDroppedBytes = 4096 })
	e.provision(e.token, map[string]any{"sessionId": "flood"})
	var written int
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		chunk := bytes.Repeat([]byte("#"), 512)
		for range 1000 {
			select {
			case <-req.Stop:
				return runsc.ExecResult{ExitCode: 141, Stopped: true}, nil
			default:
			}
			req.Stdout.Write(chunk)
			written += len(chunk)
		}
		return runsc.ExecResult{}, nil
	}
	res := decodeBody[execResponse](t, e.exec(e.token, "flood", map[string]any{"action": "exec", "command": "yes"}), http.StatusOK)
	if !res.StoppedForOutput || res.ExitCode != 141 || !res.Truncated || res.TimedOut || len(res.Stdout) != 1024 {
		t.Fatalf("%+v", res)
	}
	if res.StdoutDropped <= 4096 || res.StdoutDropped != int64(written-1024) {
		t.Errorf("dropped %d of %d written", res.StdoutDropped, written)
	}

	// 0: never stopped; it writes to its end.
	e.s.cfg.Limits.ExecMaxDroppedBytes = 0
	written = 0
	res = decodeBody[execResponse](t, e.exec(e.token, "flood", map[string]any{"action": "exec", "command": "yes"}), http.StatusOK)
	if res.StoppedForOutput || res.ExitCode != 0 || res.StdoutDropped != 512*1000-1024 {
		t.Fatalf("without a limit: %+v", res)
	}
}

func TestAPIExecRuntimeErrors(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "err-1"})
	body := map[string]any{"action": "exec", "command": "id", "cwd": "/nope"}
	e.rt.ExecFn = func(runsc.ExecRequest) (runsc.ExecResult, error) { return runsc.ExecResult{}, runsc.ErrBadCwd }
	apiError(t, e.exec(e.token, "err-1", body), http.StatusBadRequest, "invalid_request")

	e.rt.ExecFn = func(runsc.ExecRequest) (runsc.ExecResult, error) {
		return runsc.ExecResult{}, errors.New("runsc exec: /host/path secret argv")
	}
	msg := apiError(t, e.exec(e.token, "err-1", body), http.StatusInternalServerError, "internal")
	if strings.Contains(msg, "/host/path") {
		t.Errorf("internal error leaked: %q", msg)
	}

	// The sandbox died with an OOM during the command (the driver says so
	// too): the session is failed.
	e.rt.ExecFn = func(runsc.ExecRequest) (runsc.ExecResult, error) {
		return runsc.ExecResult{ExitCode: 137, OOM: true, Died: true}, nil
	}
	e.rt.Mu.Lock()
	e.rt.InspectState = runsc.State{Status: runsc.StatusStopped, OOMKills: 1}
	e.rt.Mu.Unlock()
	res := decodeBody[execResponse](t, e.exec(e.token, "err-1", map[string]any{"action": "exec", "command": "id"}), http.StatusOK)
	if !res.OOM || res.ExitCode != 137 {
		t.Errorf("exec = %+v", res)
	}
	sb := decodeBody[sandboxObject](t, e.get(e.token, "err-1"), http.StatusOK)
	if sb.Status != store.StatusFailed || sb.StatusReason == nil || *sb.StatusReason != "oom" || sb.StoppedAt == nil {
		t.Errorf("after OOM: %+v", sb)
	}
	apiError(t, e.exec(e.token, "err-1", body), http.StatusConflict, "conflict")

	// ErrNotRunning: the server inspects the sandbox and records its death.
	e.provision(e.token, map[string]any{"sessionId": "err-2"})
	e.rt.Mu.Lock()
	e.rt.InspectState = runsc.State{Status: runsc.StatusStopped}
	e.rt.Mu.Unlock()
	e.rt.ExecFn = func(runsc.ExecRequest) (runsc.ExecResult, error) { return runsc.ExecResult{}, runsc.ErrNotRunning }
	apiError(t, e.exec(e.token, "err-2", map[string]any{"action": "exec", "command": "id"}), http.StatusConflict, "conflict")
	sb = decodeBody[sandboxObject](t, e.get(e.token, "err-2"), http.StatusOK)
	if sb.Status != store.StatusFailed || sb.StatusReason == nil || *sb.StatusReason != "exited" {
		t.Errorf("after not running: %+v", sb)
	}
	// A failed session can still be torn down.
	sb = decodeBody[sandboxObject](t, e.do("POST", "/v1/sandbox/err-2/teardown", e.token, nil), http.StatusOK)
	if sb.Status != store.StatusStopped {
		t.Errorf("teardown of failed: %+v", sb)
	}
}

func TestExecConcurrencyLimit(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) { c.Limits.MaxExecsPerSession = 2 })
	e.provision(e.token, map[string]any{"sessionId": "x1"})
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		started <- struct{}{}
		<-release
		return runsc.ExecResult{}, nil
	}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.exec(e.token, "x1", map[string]any{"action": "exec", "command": "sleep 1"})
		}()
	}
	<-started
	<-started
	apiError(t, e.exec(e.token, "x1", map[string]any{"action": "exec", "command": "true"}), http.StatusTooManyRequests, "rate_limited")
	close(release)
	wg.Wait()
	if rec := e.exec(e.token, "x1", map[string]any{"action": "exec", "command": "true"}); rec.Code != http.StatusOK {
		t.Fatalf("after the others ended: %d", rec.Code)
	}
}

func TestKillActionAndStartErrors(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "k1"})
	rec := e.exec(e.token, "k1", map[string]any{"action": "kill"})
	if rec.Code != http.StatusOK || len(e.rt.CallsWith("killall")) != 1 {
		t.Fatalf("kill: %d %s %v", rec.Code, rec.Body, e.rt.Calls)
	}
	apiError(t, e.exec(e.token, "k1", map[string]any{"action": "kill", "command": "x"}), http.StatusBadRequest, "invalid_request")
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		return runsc.ExecResult{}, runsc.ErrTooManyProcesses
	}
	msg := apiError(t, e.exec(e.token, "k1", map[string]any{"action": "exec", "command": "true"}), http.StatusConflict, "conflict")
	if !strings.Contains(msg, "kill") {
		t.Errorf("no advice: %q", msg)
	}
}
