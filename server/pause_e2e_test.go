package server

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func (h *harness) pause(id string, want int) sandboxObject {
	h.t.Helper()
	code, b := h.call(h.token, "POST", "/v1/sandbox/"+id+"/pause", nil)
	var o sandboxObject
	json.Unmarshal(b, &o)
	if code != want || (want == 200 && o.Status != "paused") {
		h.t.Fatalf("pause %s: %d %s, want %d", id, code, b, want)
	}
	return o
}

// counterValue reads the counter a loop in the sandbox writes to /tmp/c.
func (h *harness) counterValue(id string) int {
	h.t.Helper()
	r := h.sh(id, "cat /tmp/c")
	n, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if err != nil {
		h.t.Fatalf("counter: %+v", r)
	}
	return n
}

// TestRealPause pauses a session with memory and resumes it on real
// gVisor: a background counter keeps counting from where it was, a Python
// context keeps its variables, a terminal's shell keeps its variables and
// is found again with its terminalId; a paused session refuses commands
// (409) and holds no netns, mount or runsc container; teardown and delete
// of a paused session leave nothing behind; a checkpoint that fails leaves
// the session running.
func TestRealPause(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("pz", "test-tiny")
	// The very first command: every exec is started by the agent (it
	// waits for it), so the loop is carried over the checkpoint.
	h.sh("pz", "(i=0; while :; do echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; i=$((i+1)); sleep 0.1; done) >/dev/null 2>&1 &")
	if code, r, raw := h.runCode("python", "pz", map[string]any{"code": "secret_sauce = 6 * 7\nimport math"}); code != 200 || r.Error != nil {
		t.Fatalf("python: %d %s", code, raw)
	}
	w := h.terminalWS(t, "pz", "cols=80&rows=24")
	if !w.readUntil("$ ", 10*time.Second) {
		t.Fatalf("no prompt: %q", w.out.String())
	}
	w.send("MARK=shell-kept-$((40+2)); echo set-$MARK\n")
	if !w.readUntil("set-shell-kept-42", 5*time.Second) {
		t.Fatalf("%q", w.out.String())
	}
	termID := w.id
	time.Sleep(500 * time.Millisecond)
	before := h.counterValue("pz")

	t0 := time.Now()
	o := h.pause("pz", 200)
	t.Logf("pause %v", time.Since(t0))
	if o.StoppedAt == nil {
		t.Fatalf("paused object: %+v", o)
	}
	// The open terminal socket is told and closed.
	w.readUntil("never", 3*time.Second)
	cid := h.s.rt.ContainerID(o.OrgID, "pz")
	if out, _ := exec.Command("sh", "-c", "mount | grep "+cid+"; ip netns | grep "+cid).Output(); len(out) > 0 {
		t.Fatalf("a paused session holds: %s", out)
	}
	if fi, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid, "checkpoint", "pages.img")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("checkpoint image: %v %v", fi, err)
	}
	code, b := h.call(h.token, "POST", "/v1/sandbox/terminal/pz", map[string]any{"action": "exec", "command": "true"})
	if code != 409 || !strings.Contains(string(b), "resume") {
		t.Fatalf("exec on a paused session: %d %s", code, b)
	}
	if o := h.pause("pz", 200); o.Status != "paused" { // idempotent
		t.Fatal(o.Status)
	}
	time.Sleep(time.Second) // nothing counts meanwhile

	t0 = time.Now()
	h.resumeOK("pz")
	t.Logf("resume %v", time.Since(t0))
	after := h.counterValue("pz")
	if after < before || after > before+15 {
		t.Fatalf("counter: %d before the pause, %d after the resume (not from where it was)", before, after)
	}
	time.Sleep(300 * time.Millisecond)
	if n := h.counterValue("pz"); n <= after {
		t.Fatalf("counter stopped: %d then %d", after, n)
	}
	if code, r, raw := h.runCode("python", "pz", map[string]any{"code": "secret_sauce + math.floor(0.5)"}); code != 200 || r.Result == nil || *r.Result != "42" {
		t.Fatalf("python context after resume: %d %s", code, raw)
	}
	w2 := h.terminalWS(t, "pz", "terminalId="+termID)
	w2.send("echo got-$MARK\n")
	if !w2.readUntil("got-shell-kept-42", 10*time.Second) {
		t.Fatalf("terminal after resume: %q", w2.out.String())
	}
	logs := h.logsText("pz")
	if !strings.Contains(logs, `"paused"`) || !strings.Contains(logs, `"restored":true`) {
		t.Fatalf("events: %s", logs)
	}

	// pause -> teardown: stopped, disk kept, image gone; resume is cold.
	h.pause("pz", 200)
	code, b = h.call(h.token, "POST", "/v1/sandbox/pz/teardown", nil)
	if code != 200 || !strings.Contains(string(b), `"stopped"`) {
		t.Fatalf("teardown of a paused session: %d %s", code, b)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid, "checkpoint")); !os.IsNotExist(err) {
		t.Fatalf("image kept after teardown: %v", err)
	}
	if !diskExists(cfg, cid) {
		t.Fatal("teardown of a paused session lost the disk")
	}
	h.resumeOK("pz")
	if r := h.sh("pz", "ps -eo args= | grep -c '^sleep 0.1$' || true"); strings.TrimSpace(r.Stdout) != "0" {
		t.Fatalf("processes after a cold resume: %+v", r)
	}
	// pause -> delete: nothing left.
	h.pause("pz", 200)
	if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/pz", nil); code != 204 {
		t.Fatalf("delete of a paused session: %d", code)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid)); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir kept after delete: %v", err)
	}
}

// TestRealPauseFails: a checkpoint that cannot be written (its image dir
// is a full 1 MB file system) answers 503 and the session runs on, its
// processes too.
func TestRealPauseFails(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	o := h.provision("pf", "test-tiny")
	h.sh("pf", "true")
	time.Sleep(300 * time.Millisecond)
	h.sh("pf", "(i=0; while :; do echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; i=$((i+1)); sleep 0.1; done) >/dev/null 2>&1 &")
	time.Sleep(300 * time.Millisecond)
	cid := h.s.rt.ContainerID(o.OrgID, "pf")
	dir := h.s.rt.CheckpointDir(cid)
	os.Mkdir(dir, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	code, b := h.call(h.token, "POST", "/v1/sandbox/pf/pause", nil)
	if code != 503 || !strings.Contains(string(b), "still running") {
		t.Fatalf("pause into a full dir: %d %s", code, b)
	}
	exec.Command("umount", "-l", dir).Run()
	if got := h.get("pf").Status; got != "running" {
		t.Fatalf("after a failed pause: %s", got)
	}
	n := h.counterValue("pf")
	time.Sleep(400 * time.Millisecond)
	if m := h.counterValue("pf"); m <= n {
		t.Fatalf("counter stopped after a failed pause: %d then %d", n, m)
	}
	h.pause("pf", 200) // works once there is room
	h.resumeOK("pf")
}

// TestRealIdlePause: a session with idleAction pause is paused by the
// monitor when idle, resumed with its own idle timeout, and paused again.
func TestRealIdlePause(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "ip", "size": "test-tiny",
		"idleTimeoutSeconds": 2, "idleAction": "pause"})
	if code != 201 {
		t.Fatalf("provision: %d %s", code, b)
	}
	if code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "bad", "idleAction": "sleep"}); code != 400 || !strings.Contains(string(b), "idleAction") {
		t.Fatalf("bad idleAction: %d %s", code, b)
	}
	h.sh("ip", "true")
	time.Sleep(300 * time.Millisecond)
	h.sh("ip", "echo 7 > /tmp/state; (sleep 1000 &)")
	waitStatus := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for h.get("ip").Status != want {
			if time.Now().After(deadline) {
				t.Fatalf("status %s, want %s", h.get("ip").Status, want)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	waitStatus("paused")
	o := h.resumeOK("ip")
	if o.IdleTimeout != 2 || o.IdleAction != "pause" {
		t.Fatalf("resumed object: %+v", o)
	}
	if r := h.sh("ip", "cat /tmp/state; ps -eo args= | grep -c '^sleep 1000'"); r.Stdout != "7\n1\n" {
		t.Fatalf("after an idle pause: %+v", r)
	}
	waitStatus("paused")
	if _, err := os.Stat(h.s.rt.CheckpointDir(h.s.rt.ContainerID(o.OrgID, "ip"))); err != nil {
		t.Fatal(err)
	}
}
