package server

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandboxd/server/config"
	"sandboxd/store/objects"
)

// serverProc is a real bin/sandboxd process on a data dir, to be killed
// with SIGKILL.
type serverProc struct {
	t   *testing.T
	cmd *osexec.Cmd
	h   *harness
}

func startProc(t *testing.T, cfg *config.Config, hangAt string) *serverProc {
	t.Helper()
	return startProcWith(t, cfg, procOpts{hangAt: hangAt})
}

// procOpts: how startProcWith starts the server.
type procOpts struct {
	hangAt string   // SANDBOXD_TEST_HANG_AT
	image  string   // the config's image section (default: autoBuild false)
	yaml   string   // more top-level config sections
	env    []string // more environment
}

func startProcWith(t *testing.T, cfg *config.Config, o procOpts) *serverProc {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	conf := filepath.Join(cfg.DataDir, "test-config.yaml")
	if o.image == "" {
		o.image = "image:\n  autoBuild: false\n"
	}
	os.WriteFile(conf, []byte(fmt.Sprintf("runsc:\n  binary: %s\n  agent: %s\n", cfg.Runsc.Binary, cfg.Runsc.Agent)+o.image+o.yaml), 0o600)
	logf, err := os.OpenFile(filepath.Join(cfg.DataDir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := osexec.Command(filepath.Join(binDir(t), "sandboxd"), "serve", "--config", conf, "--data-dir", cfg.DataDir, "--listen", addr)
	cmd.Env = append(append(os.Environ(), "SANDBOXD_TEST_HANG_AT="+o.hangAt), o.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serverProc{t: t, cmd: cmd}
	t.Cleanup(func() { p.stop(syscall.SIGTERM) })
	url := "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(url + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(cfg.DataDir, "server.log"))
			t.Fatalf("server did not come up: %s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	tok, err := os.ReadFile(filepath.Join(cfg.DataDir, "owner.token"))
	if err != nil {
		t.Fatal(err)
	}
	p.h = &harness{t: t, cfg: cfg, ts: &httptest.Server{URL: url}, token: strings.TrimSpace(string(tok))}
	return p
}

// stop ends the process with sig (SIGKILL: no cleanup at all) and waits.
func (p *serverProc) stop(sig syscall.Signal) {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Signal(sig)
	p.cmd.Wait()
}

// post sends a request that the server will never answer (it hangs, then
// dies); errors are expected.
func (p *serverProc) postAsync(path string) {
	go func() {
		req, _ := http.NewRequest("POST", p.h.ts.URL+path, bytes.NewReader(nil))
		req.Header.Set("Authorization", "Bearer "+p.h.token)
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
}

// waitHang waits until the server reached step (it wrote hang-<step>).
func waitHang(t *testing.T, cfg *config.Config, step string) {
	t.Helper()
	f := filepath.Join(cfg.DataDir, "hang-"+step)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := os.Stat(f); err == nil {
			os.Remove(f)
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(cfg.DataDir, "server.log"))
			t.Fatalf("step %s not reached: %s", step, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkStorageClean: exactly the recorded save is in storage, no
// temporary object.
func checkStorageClean(t *testing.T, cfg *config.Config, org string, want string) {
	t.Helper()
	d, err := objects.NewDir(config.StorageDir(cfg.DataDir))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := filepath.Glob(filepath.Join(config.StorageDir(cfg.DataDir), "*", ".tmp-*"))
	if len(m) > 0 {
		t.Fatalf("temporary objects left: %v", m)
	}
	list, err := d.List(context.Background(), org, "")
	if err != nil || len(list) != 1 || (want != "" && list[0].Name != want) {
		t.Fatalf("storage holds %+v (%v), want only %q", list, err, want)
	}
}

// TestRealStorageKill9 kills the server process with SIGKILL at each step
// of a teardown's save and of a resume's restore, restarts it on the same
// data dir and checks that the session comes back with every file, that
// storage holds exactly the recorded save and nothing temporary, and
// (at the end) that no mount, netns, cgroup or container is left.
func TestRealStorageKill9(t *testing.T) {
	cfg := realConfig(t)
	p := startProc(t, cfg, "")
	h := p.h
	h.provision("k1", "standard-1")
	if r := h.exec("k1", map[string]any{"command": "python3 -c \"$S\" && head -c 20M /dev/urandom > /workspace/r.bin",
		"env": map[string]string{"S": oddTreeScript}, "timeoutMs": 300000}); r.ExitCode != 0 {
		t.Fatalf("make tree: %+v", r)
	}
	org := h.get("k1").OrgID
	p.stop(syscall.SIGTERM)

	for _, step := range []string{"save-frozen", "save-writing", "save-recorded", "save-destroyed"} {
		p = startProc(t, cfg, step)
		h = p.h
		if o := h.get("k1"); o.Status != "running" {
			h.resumeOK("k1")
		}
		h.sh("k1", "echo "+step+" > /workspace/step-"+step)
		want := h.manifest("k1")
		p.postAsync("/v1/sandbox/k1/teardown")
		waitHang(t, cfg, step)
		p.stop(syscall.SIGKILL)

		p = startProc(t, cfg, "")
		h = p.h
		o := h.get("k1")
		if o.Status != "stopped" || o.Storage.SavedBytes == 0 {
			t.Fatalf("%s: after restart: %+v", step, o)
		}
		checkStorageClean(t, cfg, org, "")
		h.resumeOK("k1")
		if got := h.manifest("k1"); got != want {
			t.Fatalf("%s: after resume:\n%s\nwant\n%s", step, got, want)
		}
		p.stop(syscall.SIGTERM)
	}

	// Resume from storage alone, killed while restoring and after.
	p = startProc(t, cfg, "")
	h = p.h
	h.sh("k1", "echo restore > /workspace/step-restore")
	want := h.manifest("k1")
	h.teardownOK("k1")
	cid := ""
	ents, _ := os.ReadDir(filepath.Join(cfg.DataDir, "sandboxes"))
	for _, e := range ents {
		cid = e.Name()
	}
	p.stop(syscall.SIGTERM)
	for _, step := range []string{"restore-reading", "restore-done"} {
		if err := os.RemoveAll(filepath.Join(cfg.DataDir, "sandboxes", cid)); err != nil {
			t.Fatal(err)
		}
		p = startProc(t, cfg, step)
		p.postAsync("/v1/sandbox/k1/resume")
		waitHang(t, cfg, step)
		p.stop(syscall.SIGKILL)
		p = startProc(t, cfg, "")
		h = p.h
		if o := h.get("k1"); o.Status != "stopped" {
			t.Fatalf("%s: after restart: %+v", step, o)
		}
		if _, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid, "disk.restore.img")); err == nil {
			t.Fatalf("%s: restore image left", step)
		}
		if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), filepath.Join(cfg.DataDir, "sandboxes")) {
			t.Fatalf("%s: mounts left", step)
		}
		checkStorageClean(t, cfg, org, "")
		h.resumeOK("k1")
		if got := h.manifest("k1"); got != want {
			t.Fatalf("%s: after resume:\n%s\nwant\n%s", step, got, want)
		}
		h.teardownOK("k1")
		p.stop(syscall.SIGTERM)
	}
	p = startProc(t, cfg, "")
	if code, _ := p.h.call(p.h.token, "DELETE", "/v1/sandbox/k1", nil); code != 204 {
		t.Fatal("delete")
	}
	if list, _ := p.h.storage().List(context.Background(), org, ""); len(list) != 0 {
		t.Fatalf("saves left after delete: %+v", list)
	}
	p.stop(syscall.SIGTERM)
}
