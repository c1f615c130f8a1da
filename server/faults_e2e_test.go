package server

// The faults suite (issue 15, docs/SECURITY.md): real servers, real gVisor
// sandboxes, and a fault injected at one point: kill -9 of the server in
// the middle of a provision, an exec and a terminal stream; runsc killed
// from outside; the data dir's disk full; no loop device; an image build
// that fails; a corrupt save. Each checks what must hold afterwards:
// sessions in a true state, nothing orphaned (netns, cgroup, mount, runsc
// container), no byte of a workspace, audit record or count lost, a clear
// error, the SQLite database intact, the other sessions unaffected.
// Kill -9 at each step of teardown, resume and pause is in
// storage_crash_e2e_test.go and pause_more_e2e_test.go.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	_ "modernc.org/sqlite"

	"sandboxd/runsc/image"
	"sandboxd/server/config"
)

// hardening: the suites' full size (make test-hardening); make test runs
// their quick part.
func hardening() bool { return os.Getenv("SANDBOXD_HARDENING") != "" }

// cidOf is the container id the server gives a session (runsc.ContainerID).
func cidOf(cfg *config.Config, org, sessionID string) string {
	sum := sha256.Sum256([]byte(org + "\x00" + sessionID))
	return config.ResourcePrefix(cfg.DataDir) + "-" + hex.EncodeToString(sum[:8])
}

// hostResources lists what the host holds for sandbox cid: its netns,
// mounts under its dir, cgroups, runsc container and runsc processes.
func hostResources(t *testing.T, cfg *config.Config, cid string) []string {
	t.Helper()
	var out []string
	if _, err := os.Stat("/var/run/netns/" + cid); err == nil {
		out = append(out, "netns")
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), filepath.Join(cfg.DataDir, "sandboxes", cid)+"/") {
		out = append(out, "mounts")
	}
	if cgs := prefixedCgroups(cid); len(cgs) > 0 {
		out = append(out, fmt.Sprintf("cgroups %v", cgs))
	}
	if ls, _ := runCmd(cfg.Runsc.Binary, "--root", filepath.Join(cfg.DataDir, "runsc"), "list", "-quiet"); strings.Contains(ls, cid) {
		out = append(out, "runsc container")
	}
	if pids := runscPids(cfg, cid); len(pids) > 0 {
		out = append(out, fmt.Sprintf("runsc processes %v", pids))
	}
	return out
}

// runscPids are the host processes of sandbox cid's runsc (sandbox, gofer):
// runsc processes whose command line names its bundle dir.
func runscPids(cfg *config.Config, cid string) []int {
	dir := filepath.Join(cfg.DataDir, "sandboxes", cid)
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if strings.HasPrefix(filepath.Base(args[0]), "runsc") && (bytes.Contains(b, []byte("="+dir+"\x00")) || bytes.Contains(b, []byte("\x00"+dir+"\x00"))) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// integrityCheck opens the data dir's database read-only and runs SQLite's
// own check of every page, index and constraint.
func integrityCheck(t *testing.T, cfg *config.Config) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+config.DBPath(cfg.DataDir)+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query("PRAGMA integrity_check")
	if err != nil {
		t.Fatalf("integrity_check: %v", err)
	}
	defer rows.Close()
	var res []string
	for rows.Next() {
		var s string
		rows.Scan(&s)
		res = append(res, s)
	}
	if len(res) != 1 || res[0] != "ok" {
		t.Fatalf("database damaged: %v", res)
	}
	var fk int
	if err := db.QueryRow("SELECT count(*) FROM pragma_foreign_key_check").Scan(&fk); err != nil || fk != 0 {
		t.Fatalf("foreign key check: %d %v", fk, err)
	}
}

// audit returns the organization's audit records of a session (action ""
// for all).
func (h *harness) audit(sessionID, action string) []map[string]any {
	h.t.Helper()
	code, b := h.call(h.token, "GET", "/v1/audit?limit=1000&sessionId="+sessionID+"&action="+action, nil)
	if code != 200 {
		h.t.Fatalf("audit: %d %s", code, b)
	}
	var out struct{ Records []map[string]any }
	json.Unmarshal(b, &out)
	return out.Records
}

// auditEventually waits for the one record of a system action (they are
// written in batches) and checks its details.
func (h *harness) auditEventually(id, action, details string) {
	h.t.Helper()
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		recs := h.audit(id, action)
		if len(recs) == 1 && fmt.Sprint(recs[0]["details"]) == details {
			return
		}
		if len(recs) > 1 || time.Since(start) > 10*time.Second {
			h.t.Fatalf("audit of %s %s: %+v", id, action, recs)
		}
	}
}

// postJSONAsync sends a request the server will never answer (it hangs,
// then dies); errors are expected.
func (p *serverProc) postJSONAsync(path string, body any) {
	b, _ := json.Marshal(body)
	go func() {
		req, _ := http.NewRequest("POST", p.h.ts.URL+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+p.h.token)
		req.Header.Set("Content-Type", "application/json")
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
}

// errorOf decodes an error body.
func errorOf(b []byte) (code, msg string) {
	var e errorBody
	json.Unmarshal(b, &e)
	return e.Error.Code, e.Error.Message
}

// TestRealFaultsKill9Provision kills the server with SIGKILL at each step
// of a provision (the row written; the disk mounted and the netns made;
// runsc create done; the sandbox started but not yet recorded running) and
// restarts it on the same data dir: the session is never left
// provisioning (here it is undone: 404, the id free again), nothing of its
// sandbox is left on the host, the undo is audited, and a session that
// ran meanwhile keeps running with its files.
// make test runs the two steps after which the most is there to undo;
// TestHardeningFaultsKill9Provision (make test-hardening) the others.
func TestRealFaultsKill9Provision(t *testing.T) {
	kill9Provision(t, "create-created", "provision-started")
}

func TestHardeningFaultsKill9Provision(t *testing.T) {
	if !hardening() {
		t.Skip("SANDBOXD_HARDENING=1 (make test-hardening)")
	}
	kill9Provision(t, "provision-inserted", "create-mounted")
}

func kill9Provision(t *testing.T, steps ...string) {
	cfg := realConfig(t)
	p := startProc(t, cfg, "")
	p.h.provision("bystander", "standard-1")
	p.h.sh("bystander", "echo kept > /workspace/kept")
	org := p.h.get("bystander").OrgID
	p.stop(syscall.SIGTERM)
	for _, step := range steps {
		id := "pv-" + step
		cid := cidOf(cfg, org, id)
		p = startProc(t, cfg, step)
		p.postJSONAsync("/v1/sandbox", map[string]any{"sessionId": id, "size": "standard-1"})
		waitHang(t, cfg, step)
		made := hostResources(t, cfg, cid)
		t.Logf("%s: the host holds %v", step, made)
		if (step == "create-created" || step == "provision-started") && len(made) < 5 {
			t.Fatalf("%s: the step made only %v", step, made)
		}
		p.stop(syscall.SIGKILL)

		p = startProc(t, cfg, "")
		h := p.h
		code, b := h.call(h.token, "GET", "/v1/sandbox/"+id, nil)
		switch {
		case code == 404: // undone
		case code == 200 && strings.Contains(string(b), `"status":"running"`):
			t.Logf("%s: completed as running", step)
		default:
			t.Fatalf("%s: after restart: %d %s", step, code, b)
		}
		if code == 404 {
			if left := hostResources(t, cfg, cid); len(left) > 0 {
				t.Fatalf("%s: left on the host: %v", step, left)
			}
			if _, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid)); err == nil {
				t.Fatalf("%s: sandbox dir left", step)
			}
			if recs := h.audit(id, "sandbox.provision_undone"); len(recs) != 1 {
				t.Fatalf("%s: undo audited %d times", step, len(recs))
			}
		}
		// The id can be used (again).
		if code == 404 {
			h.provision(id, "standard-1")
		}
		if r := h.sh(id, "echo fresh"); r.Stdout != "fresh\n" {
			t.Fatalf("%s: new sandbox: %+v", step, r)
		}
		if code, b := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 {
			t.Fatalf("delete: %d %s", code, b)
		}
		if o := h.get("bystander"); o.Status != "running" {
			t.Fatalf("%s: bystander %+v", step, o)
		}
		if r := h.sh("bystander", "cat /workspace/kept"); r.Stdout != "kept\n" {
			t.Fatalf("%s: bystander: %+v", step, r)
		}
		p.stop(syscall.SIGTERM)
	}
	integrityCheck(t, cfg)
}

// blobServer serves n bytes at /blob on loopback and returns its port.
func blobServer(t *testing.T, n int) int {
	t.Helper()
	blob := bytes.Repeat([]byte("x"), n)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(blob) }))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// egressYAML is config that lets sandboxes reach localhost:port (a test
// upstream) through their proxy.
func egressYAML(t *testing.T, port int) string {
	f := filepath.Join(t.TempDir(), "egress.yaml")
	os.WriteFile(f, []byte(fmt.Sprintf("allowlist:\n  - host: localhost\n    ports: [%d]\nallowNetworks: [127.0.0.0/8]\n", port)), 0o644)
	return "egress:\n  configFile: " + f + "\n"
}

// row is what the database holds of a session.
type row struct{ pk, cid, object, status string }

func sessionRow(t *testing.T, cfg *config.Config, id string) row {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+config.DBPath(cfg.DataDir)+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var r row
	if err := db.QueryRow("SELECT id, container_id, saved_object, status FROM sessions WHERE session_id = ?", id).Scan(&r.pk, &r.cid, &r.object, &r.status); err != nil {
		t.Fatalf("session %s: %v", id, err)
	}
	return r
}

// storedEgress is a session's egress count as the database holds it (what
// survives the process).
func storedEgress(t *testing.T, cfg *config.Config, id string) int64 {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+config.DBPath(cfg.DataDir)+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int64
	if err := db.QueryRow("SELECT egress_bytes_used FROM sessions WHERE session_id = ?", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRealFaultsKill9Exec kills the server with SIGKILL while a command
// runs (a plain exec) and while a terminal stream is open with its own
// command, right after answering another exec: after the restart the
// session runs, with every file, its cut commands ended (none left
// behind), new commands and terminals work, and nothing counted is lost:
// the audit record of every answered request, the egress count saved
// before the kill, the running time.
func TestRealFaultsKill9Exec(t *testing.T) {
	cfg := realConfig(t)
	port := blobServer(t, 3<<20)
	opts := procOpts{yaml: egressYAML(t, port)}
	p := startProcWith(t, cfg, opts)
	h := p.h
	h.provision("ex1", "standard-1")
	answered := 0
	sh := func(cmd string) execResponse {
		t.Helper()
		r := h.sh("ex1", cmd)
		answered++
		return r
	}
	if r := sh("head -c 5M /dev/urandom > /workspace/data.bin && sha256sum /workspace/data.bin > /workspace/data.sum && sync"); r.ExitCode != 0 {
		t.Fatalf("%+v", r)
	}
	if r := sh(fmt.Sprintf("curl -sS --noproxy '' -o /dev/null -w '%%{size_download}' http://localhost:%d/blob", port)); r.Stdout != strconv.Itoa(3<<20) {
		t.Fatalf("egress: %+v", r)
	}
	// The monitor saves the count (every few seconds; the proxy also
	// saves it at each 64th of the limit).
	deadline := time.Now().Add(30 * time.Second)
	for storedEgress(t, cfg, "ex1") < 3<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("egress count not saved: %d", storedEgress(t, cfg, "ex1"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	egressBefore := h.get("ex1").Egress.BytesUsed

	// A command that runs on (writing a line every 100 ms), and a terminal
	// with its own.
	go func() {
		b, _ := json.Marshal(map[string]any{"action": "exec", "command": "for i in $(seq 1 3000); do echo $i >> /workspace/cut.txt; sleep 0.1; done", "timeoutMs": 600000})
		req, _ := http.NewRequest("POST", h.ts.URL+"/v1/sandbox/terminal/ex1", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+h.token)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	w := h.terminalWS(t, "ex1", "")
	if !w.readUntil("$ ", 20*time.Second) {
		t.Fatalf("no prompt: %q", w.out.String())
	}
	w.send("echo TERM-$((2+3)); sleep 888\n")
	if !w.readUntil("TERM-5", 10*time.Second) {
		t.Fatalf("terminal: %q", w.out.String())
	}
	for i := 0; ; i++ {
		r := sh("wc -l < /workspace/cut.txt 2>/dev/null || echo 0")
		if n, _ := strconv.Atoi(strings.TrimSpace(r.Stdout)); n >= 3 {
			break
		}
		if i > 100 {
			t.Fatal("the command does not run")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Answered, then killed at once.
	if r := sh("echo last-answered"); r.Stdout != "last-answered\n" {
		t.Fatalf("%+v", r)
	}
	p.stop(syscall.SIGKILL)
	killed := time.Now()

	p = startProcWith(t, cfg, opts)
	h = p.h
	if o := h.get("ex1"); o.Status != "running" {
		t.Fatalf("after restart: %+v", o)
	}
	// The cut command and the terminal's ended with their connections.
	var n1 string
	for i := 0; ; i++ {
		r := h.sh("ex1", "wc -l < /workspace/cut.txt; ps -eo args= | grep -cE '^sleep (888|0.1)' || true")
		f := strings.Fields(r.Stdout)
		if len(f) == 2 && f[1] == "0" {
			n1 = f[0]
			break
		}
		if i > 50 {
			t.Fatalf("cut commands still run: %+v", r)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if r := h.sh("ex1", "wc -l < /workspace/cut.txt"); strings.TrimSpace(r.Stdout) != n1 {
		t.Fatalf("the cut command still writes: %s then %s", n1, r.Stdout)
	}
	if r := h.sh("ex1", "cd /workspace && sha256sum -c data.sum"); r.ExitCode != 0 {
		t.Fatalf("workspace: %+v", r)
	}
	code, b := h.call(h.token, "GET", "/v1/sandbox/ex1/terminals", nil)
	if code != 200 || strings.Contains(string(b), w.id) {
		t.Fatalf("terminals after restart: %d %s", code, b)
	}
	w2 := h.terminalWS(t, "ex1", "")
	if !w2.readUntil("$ ", 20*time.Second) {
		t.Fatalf("no prompt after restart: %q", w2.out.String())
	}
	w2.send("echo NEW-$((3+4))\n")
	if !w2.readUntil("NEW-7", 10*time.Second) {
		t.Fatalf("terminal after restart: %q", w2.out.String())
	}
	// Nothing counted is lost.
	ok := 0
	for _, r := range h.audit("ex1", "sandbox.terminal") {
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(r["time"]))
		if err != nil {
			t.Fatalf("audit time: %v", err)
		}
		if r["outcome"] == "ok" && at.Before(killed) {
			ok++
		}
	}
	if ok < answered {
		t.Fatalf("audit: %d answered execs before the kill, %d recorded", answered, ok)
	}
	if recs := h.audit("ex1", "sandbox.provision"); len(recs) != 1 {
		t.Fatalf("provision audited %d times", len(recs))
	}
	if e := h.get("ex1").Egress.BytesUsed; e < egressBefore {
		t.Fatalf("egress count %d after the restart, %d before", e, egressBefore)
	}
	if u := h.usage(h.token, ""); len(u.Sessions) != 1 || u.Sessions[0].RunningSeconds <= 0 || u.Sessions[0].EgressBytes < egressBefore {
		t.Fatalf("usage: %+v", u)
	}
	if code, b := h.call(h.token, "DELETE", "/v1/sandbox/ex1", nil); code != 204 {
		t.Fatalf("delete: %d %s", code, b)
	}
	p.stop(syscall.SIGTERM)
	integrityCheck(t, cfg)
}

// TestRealFaultsRunscKilled SIGKILLs the runsc processes (sandbox and
// gofer) of one session from the host: within the monitor's period the
// session is failed with the reason "exited" (in its status, its log and
// the audit), everything it held on the host is released but its disk,
// the other session runs on untouched, and a resume brings the workspace
// back as its disk last had it (newer than its last save).
func TestRealFaultsRunscKilled(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("rk1", "test-tiny")
	h.provision("rk2", "test-tiny")
	h.sh("rk1", "echo saved > /workspace/a.txt")
	h.teardownOK("rk1")
	h.resumeOK("rk1")
	h.sh("rk1", "echo after-save > /workspace/b.txt && sync")
	h.sh("rk2", "echo other > /workspace/c.txt")
	cid := cidOf(cfg, h.get("rk1").OrgID, "rk1")
	pids := runscPids(cfg, cid)
	if len(pids) == 0 {
		t.Fatal("no runsc process found")
	}
	t.Logf("killing %v", pids)
	start := time.Now()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	var o sandboxObject
	for {
		if o = h.get("rk1"); o.Status == "failed" {
			break
		}
		if time.Since(start) > 20*time.Second { // the monitor looks every 5 s
			t.Fatalf("not failed after %v: %+v", time.Since(start), o)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("failed after %v", time.Since(start))
	if o.StatusReason == nil || *o.StatusReason != "exited" {
		t.Fatalf("reason: %+v", o.StatusReason)
	}
	h.auditEventually("rk1", "sandbox.failed", "map[reason:exited]")
	if logs := h.logsText("rk1"); !strings.Contains(logs, `"exit"`) {
		t.Fatalf("no exit event in the log: %s", logs)
	}
	// Marked failed first, then released (under the session's lock).
	for left := hostResources(t, cfg, cid); len(left) > 0; left = hostResources(t, cfg, cid) {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("a failed session holds %v", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("released after %v", time.Since(start))
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid, "disk.img")); err != nil {
		t.Fatalf("disk: %v", err)
	}
	if r := h.sh("rk2", "cat /workspace/c.txt"); r.Stdout != "other\n" {
		t.Fatalf("other session: %+v", r)
	}
	code, b := h.call(h.token, "POST", "/v1/sandbox/terminal/rk1", map[string]any{"action": "exec", "command": "true"})
	if code != 409 {
		t.Fatalf("exec in a failed session: %d %s", code, b)
	}
	h.resumeOK("rk1")
	if r := h.sh("rk1", "cat /workspace/a.txt /workspace/b.txt"); r.Stdout != "saved\nafter-save\n" {
		t.Fatalf("after resume: %+v", r)
	}
	if o := h.get("rk2"); o.Status != "running" {
		t.Fatalf("other session: %+v", o)
	}
	integrityCheck(t, cfg)
}

// objectFile is the host file of an organization's storage object.
func objectFile(cfg *config.Config, org, name string) string {
	return filepath.Join(config.StorageDir(cfg.DataDir), org, filepath.FromSlash(name))
}

// TestRealFaultsCorruptSave damages the saved workspace of a torn-down
// session whose node copy is gone (a byte flipped, or cut short): resume
// and file reads answer a clear error, the session stays stopped, the
// damaged save is kept as it is (an operator may recover from it), no
// restore image or mount is left, another session's save restores, the
// database is intact.
func TestRealFaultsCorruptSave(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	for _, id := range []string{"cs1", "cs2", "cs3"} {
		h.provision(id, "test-tiny")
		h.sh(id, "head -c 3M /dev/urandom > /workspace/r.bin && echo "+id+" > /workspace/id.txt")
		h.teardownOK(id)
	}
	org := h.get("cs1").OrgID
	damage := map[string]func(f string){
		"cs1": func(f string) { // one bit in the middle
			b, _ := os.ReadFile(f)
			b[len(b)/2] ^= 0x10
			os.WriteFile(f, b, 0o600)
		},
		"cs2": func(f string) { os.Truncate(f, 4096) }, // cut short
	}
	for id, fn := range damage {
		ses := sessionRow(t, cfg, id)
		f := objectFile(cfg, org, ses.object)
		fn(f)
		before, _ := os.ReadFile(f)
		if err := h.s.rt.(interface{ DropDisk(string) error }).DropDisk(ses.cid); err != nil {
			t.Fatal(err)
		}
		code, b := h.call(h.token, "POST", "/v1/sandbox/"+id+"/resume", nil)
		ecode, msg := errorOf(b)
		if code != 409 || ecode != "conflict" || !strings.Contains(msg, "damaged") {
			t.Fatalf("%s: resume: %d %s", id, code, b)
		}
		if o := h.get(id); o.Status != "stopped" {
			t.Fatalf("%s: after the resume: %+v", id, o)
		}
		code, b = h.call(h.token, "GET", "/v1/sandbox/"+id+"/files?path=/workspace/id.txt", nil)
		if code != 409 || !strings.Contains(string(b), "damaged") {
			t.Fatalf("%s: files: %d %s", id, code, b)
		}
		after, err := os.ReadFile(f)
		if err != nil || !bytes.Equal(after, before) {
			t.Fatalf("%s: the damaged save was changed or removed: %v", id, err)
		}
		if ents, _ := os.ReadDir(filepath.Join(cfg.DataDir, "sandboxes", ses.cid)); len(ents) > 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Fatalf("%s: left in the sandbox dir: %v", id, names)
		}
		if left := hostResources(t, cfg, ses.cid); len(left) > 0 {
			t.Fatalf("%s: left on the host: %v", id, left)
		}
	}
	// The intact save of another session restores.
	if err := h.s.rt.(interface{ DropDisk(string) error }).DropDisk(sessionRow(t, cfg, "cs3").cid); err != nil {
		t.Fatal(err)
	}
	h.resumeOK("cs3")
	if r := h.sh("cs3", "cat /workspace/id.txt"); r.Stdout != "cs3\n" {
		t.Fatalf("cs3: %+v", r)
	}
	// The damaged saves do not stop the organization's other saves (its
	// storage is listed for the quota) nor its usage.
	h.sh("cs3", "echo again > /workspace/again.txt")
	h.teardownOK("cs3")
	if u := h.usage(h.token, ""); len(u.Sessions) != 3 {
		t.Fatalf("usage: %+v", u)
	}
	integrityCheck(t, cfg)
	// Delete is the owner's way out: it removes the damaged save too.
	for _, id := range []string{"cs1", "cs2"} {
		pk := sessionRow(t, cfg, id).pk
		if code, b := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 {
			t.Fatalf("delete %s: %d %s", id, code, b)
		}
		if list, err := h.storage().List(context.Background(), org, "sessions/"+pk); err != nil || len(list) != 0 {
			t.Fatalf("%s's save after delete: %+v %v", id, list, err)
		}
	}
	h.resumeOK("cs3")
	if r := h.sh("cs3", "cat /workspace/id.txt /workspace/again.txt"); r.Stdout != "cs3\nagain\n" {
		t.Fatalf("cs3: %+v", r)
	}
}

// TestRealFaultsNoLoopDevice runs a server whose loop mounts all fail as
// when the host has no loop device left (SANDBOXD_TEST_FAULT makes
// mount(8) set up a device node that does not exist; the rest is real): a
// provision answers a clear 503 and leaves nothing (no row, dir, netns,
// cgroup or container), a resume answers a clear 503 and the session
// stays stopped with its disk, reading a stopped session's files too; a
// running session is unaffected; once loop devices are back, everything
// works.
func TestRealFaultsNoLoopDevice(t *testing.T) {
	cfg := realConfig(t)
	p := startProc(t, cfg, "")
	h := p.h
	h.provision("lp-run", "standard-1")
	h.provision("lp-stop", "standard-1")
	h.sh("lp-stop", "echo stopped-file > /workspace/f.txt")
	h.teardownOK("lp-stop")
	org := h.get("lp-run").OrgID
	p.stop(syscall.SIGTERM)

	p = startProcWith(t, cfg, procOpts{env: []string{"SANDBOXD_TEST_FAULT=no-loop-device"}})
	h = p.h
	noLoop := func(what string, code int, b []byte) {
		t.Helper()
		ecode, msg := errorOf(b)
		if code != 503 || ecode != "unavailable" || !strings.Contains(msg, "loop device") || strings.Contains(msg, cfg.DataDir) {
			t.Fatalf("%s: %d %s", what, code, b)
		}
	}
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "lp-new", "size": "standard-1"})
	noLoop("provision", code, b)
	if code, _ := h.call(h.token, "GET", "/v1/sandbox/lp-new", nil); code != 404 {
		t.Fatalf("row left: %d", code)
	}
	cid := cidOf(cfg, org, "lp-new")
	if left := hostResources(t, cfg, cid); len(left) > 0 {
		t.Fatalf("left on the host: %v", left)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid)); err == nil {
		t.Fatal("sandbox dir left")
	}
	stopped := cidOf(cfg, org, "lp-stop")
	img := filepath.Join(cfg.DataDir, "sandboxes", stopped, "disk.img")
	st0, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	code, b = h.call(h.token, "POST", "/v1/sandbox/lp-stop/resume", nil)
	noLoop("resume", code, b)
	if o := h.get("lp-stop"); o.Status != "stopped" {
		t.Fatalf("after the resume: %+v", o)
	}
	if st, err := os.Stat(img); err != nil || st.Size() != st0.Size() || !st.ModTime().Equal(st0.ModTime()) {
		t.Fatalf("disk changed: %v", err)
	}
	code, b = h.call(h.token, "GET", "/v1/sandbox/lp-stop/files?path=/workspace/f.txt", nil)
	noLoop("files", code, b)
	if left := hostResources(t, cfg, stopped); len(left) > 0 {
		t.Fatalf("left on the host: %v", left)
	}
	if r := h.sh("lp-run", "echo still"); r.Stdout != "still\n" {
		t.Fatalf("running session: %+v", r)
	}
	p.stop(syscall.SIGTERM)

	p = startProc(t, cfg, "")
	h = p.h
	h.resumeOK("lp-stop")
	if r := h.sh("lp-stop", "cat /workspace/f.txt"); r.Stdout != "stopped-file\n" {
		t.Fatalf("after resume: %+v", r)
	}
	h.provision("lp-new", "standard-1")
	for _, id := range []string{"lp-run", "lp-stop", "lp-new"} {
		if code, b := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 {
			t.Fatalf("delete %s: %d %s", id, code, b)
		}
	}
	p.stop(syscall.SIGTERM)
	integrityCheck(t, cfg)
}

// fillDisk takes the free space of the file system at dir but keep bytes
// with a file, and returns its path.
func fillDisk(t *testing.T, dir string, keep int64) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(dir, "filler-")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n := int64(st.Bavail)*st.Bsize - keep; n > 0 {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, n); err != nil {
			t.Fatalf("fill: %v", err)
		}
	}
	if keep == 0 { // what fallocate's rounding left
		buf := make([]byte, 64<<10)
		for {
			if _, err := f.Write(buf); err != nil {
				break
			}
		}
	}
	return f.Name()
}

// TestRealFaultsDataDirFull runs a server whose data dir is a small
// tmpfs, fills it, and checks: a provision is refused with a clear 503
// (first by the free-space check, then, with the check off, by the real
// ENOSPC of making its disk) and leaves nothing; a teardown whose save
// cannot be written answers a clear 503 and the session runs on with its
// data; running sessions keep serving; the database stays intact; once
// space is freed, everything works and no byte was lost.
func TestRealFaultsDataDirFull(t *testing.T) {
	cfg := realConfig(t)
	if err := unix.Mount("tmpfs", cfg.DataDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=400m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		assertNoLeftovers(t, cfg) // before the unmount hides what is left
		if err := unix.Unmount(cfg.DataDir, 0); err != nil {
			t.Errorf("unmount the data dir: %v", err)
			unix.Unmount(cfg.DataDir, unix.MNT_DETACH)
		}
	})
	cfg.Limits.MinFreeDiskMiB = 64
	h := startServer(t, cfg)
	for _, id := range []string{"df-a", "df-b"} {
		h.provision(id, "test-tiny")
		// df-a's save (random bytes do not compress) will not fit.
		if r := h.sh(id, "head -c 24M /dev/urandom > /workspace/r.bin && sha256sum /workspace/r.bin > /workspace/r.sum && sync"); r.ExitCode != 0 {
			t.Fatalf("%s: %+v", id, r)
		}
	}
	org := h.get("df-a").OrgID
	check := func(what string, code int, b []byte, want string) {
		t.Helper()
		ecode, msg := errorOf(b)
		if code != 503 || ecode != "unavailable" || !strings.Contains(msg, want) || strings.Contains(msg, cfg.DataDir) {
			t.Fatalf("%s: %d %s", what, code, b)
		}
	}
	nothingOf := func(id string) {
		t.Helper()
		if code, b := h.call(h.token, "GET", "/v1/sandbox/"+id, nil); code != 404 {
			t.Fatalf("%s: %d %s", id, code, b)
		}
		cid := cidOf(cfg, org, id)
		if left := hostResources(t, cfg, cid); len(left) > 0 {
			t.Fatalf("%s: left on the host: %v", id, left)
		}
		if _, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid)); err == nil {
			t.Fatalf("%s: sandbox dir left", id)
		}
	}
	serving := func() {
		t.Helper()
		for _, id := range []string{"df-a", "df-b"} {
			if r := h.sh(id, "cd /workspace && sha256sum -c r.sum"); r.ExitCode != 0 {
				t.Fatalf("%s: %+v", id, r)
			}
			if o := h.get(id); o.Status != "running" {
				t.Fatalf("%s: %+v", id, o)
			}
		}
	}

	// What the sandboxes wrote is on the host's disk (as after ~30 s of
	// quiet), not only in the host's page cache.
	diskOf := func(id string) string { return filepath.Join(cfg.DataDir, "sandboxes", cidOf(cfg, org, id), "disk") }
	syncfs := func(id string) error {
		f, err := os.Open(diskOf(id))
		if err != nil {
			return err
		}
		defer f.Close()
		return unix.Syncfs(int(f.Fd()))
	}
	for _, id := range []string{"df-a", "df-b"} {
		if err := syncfs(id); err != nil {
			t.Fatal(err)
		}
	}

	// Nearly full: the free-space check refuses.
	f1 := fillDisk(t, cfg.DataDir, 16<<20)
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "df-c", "size": "test-tiny"})
	check("provision, nearly full", code, b, "disk")
	nothingOf("df-c")
	code, b = h.call(h.token, "POST", "/v1/sandbox/df-a/teardown", nil)
	check("teardown, the save does not fit", code, b, "low on disk space")
	serving()

	// Full, and no check: the disk's own ENOSPC.
	h.close()
	cfg.Limits.MinFreeDiskMiB = 0
	h = startServer(t, cfg)
	f2 := fillDisk(t, cfg.DataDir, 0)
	code, b = h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "df-c", "size": "test-tiny"})
	t.Logf("provision, full: %d %s", code, b)
	check("provision, full", code, b, "disk is full")
	nothingOf("df-c")
	code, b = h.call(h.token, "POST", "/v1/sandbox/df-a/teardown", nil)
	t.Logf("teardown, full: %d %s", code, b)
	check("teardown, full", code, b, "disk is full")
	if m, _ := filepath.Glob(filepath.Join(config.StorageDir(cfg.DataDir), "*", ".tmp-*")); len(m) > 0 {
		t.Fatalf("partial save left: %v", m)
	}
	serving()
	// A sandbox that writes meanwhile: its (sparse) disk image cannot
	// grow. What it wrote then is lost (the host reports the write-back
	// failed), and the kernel may abort its disk's journal: then the
	// monitor fails the session (disk_error), see TestRealFaultsDiskAborted.
	r := h.sh("df-b", "dd if=/dev/urandom of=/workspace/w.bin bs=1M count=8 2>&1 | tail -1")
	t.Logf("a write in a sandbox while the host disk is full: %+v; written back: %v", r, syncfs("df-b"))
	integrityCheck(t, cfg)

	// Space again: nothing written before was lost; df-b runs on, or was
	// failed for its disk and resumes.
	os.Remove(f1)
	os.Remove(f2)
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		if o := h.get("df-b"); o.Status == "failed" {
			if o.StatusReason == nil || *o.StatusReason != "disk_error" {
				t.Fatalf("df-b: %+v", o)
			}
			t.Logf("df-b failed: disk_error")
			h.resumeOK("df-b")
			break
		}
		r := h.sh("df-b", "echo probe > /workspace/probe.txt 2>&1")
		if r.ExitCode == 0 && time.Since(start) > 7*time.Second { // a monitor round
			break
		}
		if time.Since(start) > 30*time.Second {
			b, _ := os.ReadFile("/proc/self/mountinfo")
			t.Fatalf("df-b cannot write and is not failed: %+v\n%s", r, b)
		}
	}
	if o := h.get("df-a"); o.Status != "running" {
		t.Fatalf("df-a: %+v", o)
	}
	h.teardownOK("df-a")
	h.resumeOK("df-a")
	h.provision("df-c", "test-tiny")
	serving()
	if r := h.sh("df-b", "echo fine > /workspace/after.txt && sync && cat /workspace/after.txt"); r.Stdout != "fine\n" {
		t.Fatalf("df-b writes after the disk was full: %+v", r)
	}
	integrityCheck(t, cfg)
	for _, id := range []string{"df-a", "df-b", "df-c"} {
		if code, b := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 {
			t.Fatalf("delete %s: %d %s", id, code, b)
		}
	}
	h.close()
}

// TestRealFaultsImageBuild restarts a server with a recipe whose build
// fails (its mirror refuses connections) and autoBuild on: the server
// comes up anyway and says why in its log; what needs no new sandbox
// works (a running session's commands and files, a stopped one's files,
// listings, audit); provisions and resumes answer a clear 503 and make
// nothing; the failed build leaves nothing in the image cache (no build
// dir, no mount, no lock held); with the recipe fixed, everything starts.
func TestRealFaultsImageBuild(t *testing.T) {
	cfg := realConfig(t)
	// An image cache of its own, with the default image linked in.
	cache := t.TempDir()
	r, err := cfg.ImageRecipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(cfg.Image.CacheDir, r.Key()), filepath.Join(cache, r.Key())); err != nil {
		t.Fatal(err)
	}
	good := procOpts{image: fmt.Sprintf("image:\n  cacheDir: %s\n  autoBuild: false\n", cache)}
	p := startProcWith(t, cfg, good)
	h := p.h
	h.provision("ib-run", "standard-1")
	h.sh("ib-run", "echo running-file > /workspace/f.txt")
	h.provision("ib-stop", "standard-1")
	h.sh("ib-stop", "echo stopped-file > /workspace/f.txt")
	h.teardownOK("ib-stop")
	p.stop(syscall.SIGTERM)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mirror := "http://" + l.Addr().String() + "/debian"
	l.Close() // refuses connections
	t0 := time.Now()
	p = startProcWith(t, cfg, procOpts{image: fmt.Sprintf("image:\n  cacheDir: %s\n  autoBuild: true\n  mirror: %s\n", cache, mirror)})
	h = p.h
	t.Logf("up after %v with a failed build", time.Since(t0))
	if log, _ := os.ReadFile(filepath.Join(cfg.DataDir, "server.log")); !strings.Contains(string(log), "image build failed") {
		t.Fatalf("the log does not say: %s", log)
	}
	noImage := func(what string, code int, b []byte) {
		t.Helper()
		ecode, msg := errorOf(b)
		if code != 503 || ecode != "unavailable" || !strings.Contains(msg, "no sandbox image") {
			t.Fatalf("%s: %d %s", what, code, b)
		}
	}
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "ib-new", "size": "standard-1"})
	noImage("provision", code, b)
	if code, _ := h.call(h.token, "GET", "/v1/sandbox/ib-new", nil); code != 404 {
		t.Fatalf("row left: %d", code)
	}
	if left := hostResources(t, cfg, cidOf(cfg, h.get("ib-run").OrgID, "ib-new")); len(left) > 0 {
		t.Fatalf("left on the host: %v", left)
	}
	code, b = h.call(h.token, "POST", "/v1/sandbox/ib-stop/resume", nil)
	noImage("resume", code, b)
	if o := h.get("ib-stop"); o.Status != "stopped" {
		t.Fatalf("after the resume: %+v", o)
	}
	if r := h.sh("ib-run", "cat /workspace/f.txt"); r.Stdout != "running-file\n" {
		t.Fatalf("running session: %+v", r)
	}
	for _, id := range []string{"ib-run", "ib-stop"} {
		code, b := h.call(h.token, "GET", "/v1/sandbox/"+id+"/files?path=/workspace/f.txt", nil)
		if code != 200 || !strings.Contains(string(b), "-file") {
			t.Fatalf("%s: files: %d %s", id, code, b)
		}
	}
	if len(h.audit("ib-new", "sandbox.provision")) != 1 {
		t.Fatal("the refused provision is not audited")
	}
	// Nothing of the build is left.
	ents, _ := os.ReadDir(cache)
	for _, e := range ents {
		if e.Name() != r.Key() && e.Name() != ".lock" {
			t.Fatalf("left in the image cache: %s", e.Name())
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], cache+"/") {
			t.Fatalf("mount left in the image cache: %s", line)
		}
	}
	if image.Building(cache) {
		t.Fatal("the image cache is still locked")
	}
	p.stop(syscall.SIGTERM)

	p = startProcWith(t, cfg, good)
	h = p.h
	h.resumeOK("ib-stop")
	h.provision("ib-new", "standard-1")
	if r := h.sh("ib-stop", "cat /workspace/f.txt"); r.Stdout != "stopped-file\n" {
		t.Fatalf("after resume: %+v", r)
	}
	for _, id := range []string{"ib-run", "ib-stop", "ib-new"} {
		if code, b := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 {
			t.Fatalf("delete %s: %d %s", id, code, b)
		}
	}
	p.stop(syscall.SIGTERM)
	integrityCheck(t, cfg)
}

// TestRealFaultsDiskAborted aborts the journal of a running sandbox's disk
// with ext4's own abort (what the kernel does when a write to disk.img
// fails, e.g. the host's disk full; mount -o remount,abort is the fault
// injection, the rest is real): the sandbox cannot write any more, so
// within the monitor's period the session is failed with the reason
// disk_error and released; another session runs on; a resume checks and
// repairs the disk (e2fsck) and brings back what was written before.
func TestRealFaultsDiskAborted(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("da1", "test-tiny")
	h.provision("da2", "test-tiny")
	if r := h.sh("da1", "head -c 4M /dev/urandom > /workspace/r.bin && sha256sum /workspace/r.bin > /workspace/r.sum && sync"); r.ExitCode != 0 {
		t.Fatalf("%+v", r)
	}
	cid := cidOf(cfg, h.get("da1").OrgID, "da1")
	disk := filepath.Join(cfg.DataDir, "sandboxes", cid, "disk")
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	unix.Syncfs(int(f.Fd())) // on the host's disk, as after ~30 s of quiet
	f.Close()
	if out, err := runCmd("mount", "-o", "remount,abort", disk); err != nil {
		t.Fatalf("abort: %v %s", err, out)
	}
	start := time.Now()
	if r := h.sh("da1", "echo x > /workspace/after.txt"); r.ExitCode == 0 {
		t.Logf("a write after the abort succeeded: %+v", r)
	}
	var o sandboxObject
	for {
		if o = h.get("da1"); o.Status == "failed" {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("not failed after %v: %+v", time.Since(start), o)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("failed after %v", time.Since(start))
	if o.StatusReason == nil || *o.StatusReason != "disk_error" {
		t.Fatalf("reason: %+v", o.StatusReason)
	}
	h.auditEventually("da1", "sandbox.failed", "map[reason:disk_error]")
	for left := hostResources(t, cfg, cid); len(left) > 0; left = hostResources(t, cfg, cid) {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("a failed session holds %v", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r := h.sh("da2", "echo other"); r.Stdout != "other\n" {
		t.Fatalf("other session: %+v", r)
	}
	h.resumeOK("da1")
	if r := h.sh("da1", "cd /workspace && sha256sum -c r.sum && echo y > y.txt && cat y.txt"); r.ExitCode != 0 || !strings.HasSuffix(r.Stdout, "y\n") {
		t.Fatalf("after resume: %+v", r)
	}
	// Running again, with a clean disk: not failed again.
	time.Sleep(7 * time.Second)
	if o := h.get("da1"); o.Status != "running" {
		t.Fatalf("after resume: %+v", o)
	}
	integrityCheck(t, cfg)
}
