package server

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// loopCmd starts a counter loop in the background that writes its value
// to /tmp/c every 0.1 s.
const loopCmd = "(i=0; while :; do echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; i=$((i+1)); sleep 0.1; done) >/dev/null 2>&1 &"

// counterGoesOn checks that the counter went on from before (not from 0,
// not far ahead: it did not count while paused) and keeps counting.
func (h *harness) counterGoesOn(id string, before, slack int) {
	h.t.Helper()
	after := h.counterValue(id)
	if after < before || after > before+slack {
		h.t.Fatalf("counter: %d before, %d after (not from where it was)", before, after)
	}
	deadline := time.Now().Add(5 * time.Second)
	for h.counterValue(id) <= after {
		if time.Now().After(deadline) {
			h.t.Fatalf("counter stopped at %d", after)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRealPauseGitTeardown: teardown of a paused session paired with a
// repository restores it, pushes its branch's commits from inside the
// sandbox, then saves and stops it.
func TestRealPauseGitTeardown(t *testing.T) {
	h := startGitHarness(t)
	if code, b := h.call(h.harness.token, "PUT", "/v1/me/github", map[string]any{"token": h.token}); code != http.StatusOK {
		t.Fatalf("connect: %d %s", code, b)
	}
	if code, _, b := h.provisionGit("gp", map[string]any{"gitRepo": "alice/app"}); code != http.StatusCreated {
		t.Fatalf("provision: %d %s", code, b)
	}
	r := h.sh("gp", "cd /workspace/app && echo paused > p.txt && git add p.txt && git -c user.name=u -c user.email=u@example.com commit -q -m 'before the pause' && git rev-parse HEAD")
	if r.ExitCode != 0 {
		t.Fatalf("commit: %+v", r)
	}
	commit := strings.TrimSpace(r.Stdout)
	o := h.pause("gp", 200)
	cid := h.s.rt.ContainerID(o.OrgID, "gp")
	td := h.teardownGit("gp")
	if !td.GitPushed || td.GitError != nil || len(td.GitCommits) != 1 || td.GitCommits[0] != commit {
		t.Fatalf("teardown of the paused session: %+v (want %s pushed)", td, commit)
	}
	if got := h.gs.Head(t, "alice/app", "main"); got != commit {
		t.Fatalf("the Git host's main is %s, want %s", got, commit)
	}
	if got := h.get("gp"); got.Status != "stopped" || got.Storage.SavedBytes == 0 {
		t.Fatalf("after the teardown: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.DataDir, "sandboxes", cid, "checkpoint")); !os.IsNotExist(err) {
		t.Fatalf("image kept: %v", err)
	}
	if logs := h.logsText("gp"); !strings.Contains(logs, "restored_for_push") {
		t.Fatalf("events: %s", logs)
	}
	// The work is in the save too.
	h.resumeOK("gp")
	if r := h.sh("gp", "cat /workspace/app/p.txt; git -C /workspace/app status --porcelain"); r.Stdout != "paused\n" {
		t.Fatalf("after resume: %+v", r)
	}
	if code, _ := h.call(h.harness.token, "DELETE", "/v1/sandbox/gp", nil); code != http.StatusNoContent {
		t.Fatal("delete")
	}
}

// TestRealPauseRestart: a server restart while a session is paused. The
// resume restores its processes (a loop started by the very first command
// of the sandbox, before its agent was warm, counts on); what lived in
// the old server's memory is gone cleanly: a terminal id is a 404 that
// says so, the code context starts afresh, and the processes the agent
// had parked for them (the shell, the interpreter) are ended, not leaked.
func TestRealPauseRestart(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("pr", "test-tiny")
	h.sh("pr", loopCmd) // the first command: it waits for the agent
	if code, r, raw := h.runCode("python", "pr", map[string]any{"code": "kept = 41"}); code != 200 || r.Error != nil {
		t.Fatalf("python: %d %s", code, raw)
	}
	w := h.terminalWS(t, "pr", "cols=80&rows=24")
	if !w.readUntil("$ ", 10*time.Second) {
		t.Fatalf("no prompt: %q", w.out.String())
	}
	termID := w.id
	time.Sleep(300 * time.Millisecond)
	before := h.counterValue("pr")
	h.pause("pr", 200)
	h.close()

	h = startServer(t, cfg)
	if o := h.get("pr"); o.Status != "paused" {
		t.Fatalf("after restart: %+v", o)
	}
	h.resumeOK("pr")
	h.counterGoesOn("pr", before, 15)
	// The parked terminal shell and interpreter have no client any more.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := h.sh("pr", "ps -eo args= | grep -c -e '^python3 -u' -e '^/bin/bash -l$' || true")
		if strings.TrimSpace(r.Stdout) == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("parked processes of the old server still run: %+v\n%s", r, h.sh("pr", "ps -eo pid,args").Stdout)
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, resp, err := h.dialWS("/v1/sandbox/terminal/pr/ws?terminalId="+termID, http.Header{"Authorization": {"Bearer " + h.token}})
	if err == nil || resp == nil || resp.StatusCode != 404 {
		t.Fatalf("old terminal id: %v %+v", err, resp)
	}
	b := make([]byte, 500)
	n, _ := resp.Body.Read(b)
	if !strings.Contains(string(b[:n]), "server restarted") {
		t.Fatalf("old terminal id: %s", b[:n])
	}
	if code, r, raw := h.runCode("python", "pr", map[string]any{"code": "kept"}); code != 200 || r.Error == nil || r.Error.Name != "NameError" {
		t.Fatalf("a fresh context after restart: %d %s", code, raw)
	}
	if code, r, raw := h.runCode("python", "pr", map[string]any{"code": "kept = 1\nkept + 1"}); code != 200 || r.Result == nil || *r.Result != "2" {
		t.Fatalf("the fresh context: %d %s", code, raw)
	}
}

// TestRealPauseRunInFlight: a code run in flight when the session is
// paused answers at once with SessionPaused; the context keeps its state
// across the pause.
func TestRealPauseRunInFlight(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("pi", "test-tiny")
	if code, r, raw := h.runCode("python", "pi", map[string]any{"code": "x = 5"}); code != 200 || r.Error != nil {
		t.Fatalf("python: %d %s", code, raw)
	}
	type ran struct {
		code int
		r    codeResponse
		raw  string
	}
	ch := make(chan ran, 1)
	go func() {
		code, r, raw := h.runCode("python", "pi", map[string]any{"code": "import time\nprint('started', flush=True)\nfor i in range(300): time.sleep(0.1)\nprint('never')", "timeoutMs": 60000})
		ch <- ran{code, r, raw}
	}()
	time.Sleep(time.Second)
	t0 := time.Now()
	h.pause("pi", 200)
	select {
	case got := <-ch:
		if got.code != 200 || got.r.Error == nil || got.r.Error.Name != "SessionPaused" || !strings.Contains(got.r.Stdout, "started") || strings.Contains(got.r.Stdout, "never") {
			t.Fatalf("the run in flight: %d %s", got.code, got.raw)
		}
		t.Logf("the run answered %v after the pause began", time.Since(t0))
	case <-time.After(10 * time.Second):
		t.Fatal("the run in flight did not answer")
	}
	h.resumeOK("pi")
	if code, r, raw := h.runCode("python", "pi", map[string]any{"code": "x + 1"}); code != 200 || r.Result == nil || *r.Result != "6" {
		t.Fatalf("context after the pause: %d %s", code, raw)
	}
}

// TestRealPauseQuota: a checkpoint image that would pass the
// organization's storage quota is refused (507) and the session runs on.
func TestRealPauseQuota(t *testing.T) {
	cfg := realConfig(t)
	cfg.Storage.OrgQuotaMiB = 1
	h := startServer(t, cfg)
	o := h.provision("pq", "test-tiny")
	h.sh("pq", loopCmd)
	time.Sleep(300 * time.Millisecond)
	code, b := h.call(h.token, "POST", "/v1/sandbox/pq/pause", nil)
	if code != 507 || !strings.Contains(string(b), "quota") {
		t.Fatalf("pause over the quota: %d %s", code, b)
	}
	if got := h.get("pq").Status; got != "running" {
		t.Fatalf("after a refused pause: %s", got)
	}
	n := h.counterValue("pq")
	h.counterGoesOn("pq", n, 10)
	if _, err := os.Stat(h.s.rt.CheckpointDir(h.s.rt.ContainerID(o.OrgID, "pq"))); !os.IsNotExist(err) {
		t.Fatalf("a refused image is kept: %v", err)
	}
	if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/pq", nil); code != 204 {
		t.Fatal("delete")
	}
}

// TestRealPauseKill9 kills the server with SIGKILL at each step of a
// pause and of a resume from its checkpoint, restarts it and checks that
// the session is paused with a usable checkpoint or running with its
// processes, never lost, and that nothing is left behind.
func TestRealPauseKill9(t *testing.T) {
	cfg := realConfig(t)
	p := startProc(t, cfg, "")
	h := p.h
	h.provision("k9", "standard-1")
	h.sh("k9", loopCmd)
	p.stop(syscall.SIGTERM)
	ents, _ := os.ReadDir(filepath.Join(cfg.DataDir, "sandboxes"))
	if len(ents) != 1 {
		t.Fatalf("sandboxes: %v", ents)
	}
	cid := ents[0].Name()
	imageDir := filepath.Join(cfg.DataDir, "sandboxes", cid, "checkpoint")
	for _, c := range []struct {
		step, want string // status after the restart
		pause      bool   // the step is in a pause (else in a resume)
	}{
		{"pause-frozen", "running", true},
		{"pause-released", "paused", true},
		{"resume-loaded", "paused", false},
		{"resume-restored", "running", false},
	} {
		p = startProc(t, cfg, c.step)
		h = p.h
		if h.get("k9").Status != "running" {
			h.resumeOK("k9")
		}
		time.Sleep(300 * time.Millisecond)
		before := h.counterValue("k9")
		if c.pause {
			p.postAsync("/v1/sandbox/k9/pause")
		} else {
			h.pause("k9", 200)
			p.postAsync("/v1/sandbox/k9/resume")
		}
		waitHang(t, cfg, c.step)
		p.stop(syscall.SIGKILL)

		p = startProc(t, cfg, "")
		h = p.h
		got := h.get("k9")
		if got.Status != c.want {
			b, _ := os.ReadFile(filepath.Join(cfg.DataDir, "server.log"))
			t.Fatalf("%s: after restart: %s, want %s\n%s", c.step, got.Status, c.want, b)
		}
		if c.want == "paused" {
			if _, err := os.Stat(filepath.Join(imageDir, "complete")); err != nil {
				t.Fatalf("%s: paused without a complete image: %v", c.step, err)
			}
			if out, _ := runCmd("sh", "-c", "mount | grep "+cid+"; ip netns | grep "+cid); out != "" {
				t.Fatalf("%s: a paused session holds: %s", c.step, out)
			}
			h.resumeOK("k9")
			h.counterGoesOn("k9", before, 30)
		} else {
			if _, err := os.Stat(imageDir); !os.IsNotExist(err) {
				t.Fatalf("%s: image left on a running session: %v", c.step, err)
			}
			// Its agent answers (every command goes through it) and the
			// loop counts on.
			h.counterGoesOn("k9", before, 300)
			if code, r, raw := h.runCode("python", "k9", map[string]any{"code": "1 + 1"}); code != 200 || r.Result == nil || *r.Result != "2" {
				t.Fatalf("%s: python after restart: %d %s", c.step, code, raw)
			}
		}
		p.stop(syscall.SIGTERM)
	}
	p = startProc(t, cfg, "")
	if code, _ := p.h.call(p.h.token, "DELETE", "/v1/sandbox/k9", nil); code != 204 {
		t.Fatal("delete")
	}
	p.stop(syscall.SIGTERM)
}
