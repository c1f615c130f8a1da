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
	out, errw := o.writer(&o.stdout), o.writer(&o.stderr)
	write := func(w capWriter, s string) {
		t.Helper()
		n, err := w.Write([]byte(s))
		if err != nil || n != len(s) {
			t.Fatalf("Write(%q) = %d, %v; want %d, nil (writers always drain)", s, n, err, len(s))
		}
	}
	write(out, "abcd") // 4 kept, 6 left
	if o.truncated {
		t.Fatal("truncated too early")
	}
	write(errw, "EFG")  // 3 kept, 3 left
	write(out, "hijkl") // 3 kept ("hij"), 0 left
	if !o.truncated {
		t.Fatal("not truncated after exceeding the cap")
	}
	write(errw, "MORE") // nothing kept
	write(out, "")
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
	w := o.writer(&o.stdout)
	w.Write([]byte("12345"))
	if o.truncated || o.stdout.String() != "12345" {
		t.Errorf("exact fit: %q truncated=%v", o.stdout.String(), o.truncated)
	}
	w.Write([]byte("6"))
	if !o.truncated || o.stdout.String() != "12345" {
		t.Errorf("one past: %q truncated=%v", o.stdout.String(), o.truncated)
	}

	// Concurrent writers share the cap (run with -race).
	o = newCappedOutput(1000)
	done := make(chan struct{})
	for _, b := range []*bytes.Buffer{&o.stdout, &o.stderr} {
		go func() {
			w := o.writer(b)
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
