package server

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/store"
)

// TestRealResume tears a session down and resumes it on real gVisor: files
// in the workspace, home and /tmp come back with the same secrets and
// environment, processes do not; a failed, an interrupted and a refused
// resume all leave the session stopped with its disk, and resume works after.
func TestRealResume(t *testing.T) {
	cfg := realConfig(t)
	cfg.Limits.MaxSandboxesPerOrg = 1
	h := startServer(t, cfg)
	const secret = "rs-secret-value-8f3a2c"
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "rs1", "size": "test-tiny",
		"env": map[string]string{"FOO": "bar"}, "secrets": map[string]string{"API_KEY": secret}, "idleTimeoutSeconds": 30})
	if code != 201 {
		t.Fatalf("provision: %d %s", code, b)
	}
	// syscall 442 puts an "Unsupported syscall" line in the kernel log.
	h.sh("rs1", "echo ws > /workspace/kept.txt; echo home > ~/note; echo tmp > /tmp/t; (sleep 999 &); python3 -c 'import ctypes; ctypes.CDLL(None).syscall(442)'")
	teardown := func(h *harness) sandboxObject {
		t.Helper()
		code, b := h.call(h.token, "POST", "/v1/sandbox/rs1/teardown", nil)
		var o sandboxObject
		json.Unmarshal(b, &o)
		if code != 200 || o.Status != "stopped" {
			t.Fatalf("teardown: %d %s", code, b)
		}
		return o
	}
	resume := func(h *harness, want int) sandboxObject {
		t.Helper()
		code, b := h.call(h.token, "POST", "/v1/sandbox/rs1/resume", nil)
		var o sandboxObject
		json.Unmarshal(b, &o)
		if code != want || (want == 200 && o.Status != "running") {
			t.Fatalf("resume: %d %s, want %d", code, b, want)
		}
		return o
	}
	checkBack := func(h *harness) {
		t.Helper()
		r := h.sh("rs1", "cat /workspace/kept.txt ~/note /tmp/t; echo $FOO $API_KEY; ps -eo args= | grep -c '^sleep 999'")
		if r.Stdout != "ws\nhome\ntmp\nbar [REDACTED:API_KEY]\n0\n" {
			t.Fatalf("after resume: %+v", r)
		}
	}
	stopped := teardown(h)
	if code, _ := h.call(h.token, "POST", "/v1/sandbox/terminal/rs1", map[string]any{"action": "exec", "command": "true"}); code != 409 {
		t.Fatalf("exec on a stopped session: %d", code)
	}

	// Capacity is checked like a provision: the org's one slot is taken.
	h.provision("other", "test-tiny")
	resume(h, 503)
	if o := h.get("rs1"); o.Status != "stopped" {
		t.Fatalf("after a refused resume: %+v", o)
	}
	if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/other", nil); code != 204 {
		t.Fatal("delete other")
	}

	o := resume(h, 200)
	if o.StartedAt == nil || !o.StartedAt.After(*stopped.StoppedAt) || o.StoppedAt != nil || o.Egress.BytesLimit != stopped.Egress.BytesLimit {
		t.Fatalf("resumed object: %+v", o)
	}
	checkBack(h)
	resume(h, 200) // idempotent while running
	if code, _ := h.call(h.token, "POST", "/v1/sandbox/nosuch/resume", nil); code != 404 {
		t.Fatalf("resume of an unknown session: %d", code)
	}
	logs := h.logsText("rs1")
	if !strings.Contains(logs, `"resumed":true`) {
		t.Fatalf("no resumed event: %s", logs)
	}
	// The first run's kernel output is read once (runsc appends to its log).
	if n := strings.Count(logs, "Unsupported syscall sys_442"); n != 1 {
		t.Fatalf("kernel line seen %d times: %s", n, logs)
	}
	h.s.db.FlushAudit(context.Background())
	_, ab := h.call(h.token, "GET", "/v1/audit?action=sandbox.resume&sessionId=rs1", nil)
	if strings.Count(string(ab), `"sandbox.resume"`) != 3 {
		t.Fatalf("audit: %s", ab)
	}
	credits := teardown(h).Credits.Used
	if credits <= stopped.Credits.Used {
		t.Fatalf("credits did not grow over the second run: %v then %v", stopped.Credits.Used, credits)
	}

	// A resume whose sandbox fails to start leaves the session stopped
	// with its disk; nothing else is left (the harness checks at the end).
	h.close()
	real := cfg.Runsc.Binary
	cfg.Runsc.Binary = failingRunsc(t, real, "start")
	h = startServer(t, cfg)
	resume(h, 503)
	if o := h.get("rs1"); o.Status != "stopped" {
		t.Fatalf("after a failed resume: %+v", o)
	}
	cid := h.s.rt.ContainerID(o.OrgID, "rs1")
	if !diskExists(h.cfg, cid) {
		t.Fatal("a failed resume lost the disk")
	}
	h.close()

	// A server that stops in the middle of a resume finishes it as stopped.
	db, err := store.Open(config.DBPath(cfg.DataDir))
	if err != nil {
		t.Fatal(err)
	}
	ses, err := db.GetSession(context.Background(), o.OrgID, "rs1")
	if err != nil {
		t.Fatal(err)
	}
	ses.Status = store.StatusProvisioning
	if err := db.UpdateSession(context.Background(), &ses); err != nil {
		t.Fatal(err)
	}
	db.Close()
	cfg.Runsc.Binary = real
	h = startServer(t, cfg)
	if o := h.get("rs1"); o.Status != "stopped" {
		t.Fatalf("an interrupted resume after restart: %+v", o)
	}
	resume(h, 200)
	checkBack(h)

	// A sandbox that died is resumed too (torn down first).
	st, err := h.s.rt.(*runsc.Runtime).Inspect(context.Background(), cid)
	if err != nil || st.Pid <= 0 {
		t.Fatalf("inspect: %+v %v", st, err)
	}
	if err := unix.Kill(st.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st, _ := h.s.rt.(*runsc.Runtime).Inspect(context.Background(), cid); st.Status == runsc.StatusRunning; st, _ = h.s.rt.(*runsc.Runtime).Inspect(context.Background(), cid) {
		if time.Now().After(deadline) {
			t.Fatal("sandbox did not die")
		}
		time.Sleep(50 * time.Millisecond)
	}
	resume(h, 200)
	checkBack(h)
}

// A command whose sandbox a teardown ends while a resume starts the next
// one reports on the old sandbox (killed, 137): the resumed one must live
// on. Exec, teardown and resume race for several rounds.
func TestRealResumeRacingExec(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("rr1", "test-tiny")
	for round := range 12 {
		var wg sync.WaitGroup
		for _, req := range []struct{ method, path string }{
			{"POST", "/v1/sandbox/terminal/rr1"}, {"POST", "/v1/sandbox/rr1/teardown"}, {"POST", "/v1/sandbox/rr1/resume"},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var body any
				if strings.Contains(req.path, "terminal") {
					body = map[string]any{"action": "exec", "command": "sleep 0.2; echo hi"}
				}
				h.call(h.token, req.method, req.path, body)
			}()
		}
		wg.Wait()
		// Whatever the order, the session ends running or stopped, never
		// failed, and runs again after a resume.
		if o := h.get("rr1"); o.Status != "running" && o.Status != "stopped" {
			t.Fatalf("round %d: %s %v", round, o.Status, o.StatusReason)
		}
		if code, b := h.call(h.token, "POST", "/v1/sandbox/rr1/resume", nil); code != 200 {
			t.Fatalf("round %d: resume: %d %s", round, code, b)
		}
		if r := h.sh("rr1", "echo ok"); r.Stdout != "ok\n" {
			t.Fatalf("round %d: %+v", round, r)
		}
	}
}
