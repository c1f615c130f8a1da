package server

// Review 2 (issue 11): data loss around teardown, storage and pause, with
// real gVisor sandboxes. Each test fails today; see the report of review2.

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"sandboxd/runsc"
)

// TestReview2PausedNoDisk (a short name: the agent socket path under
// t.TempDir() must fit 108 bytes): a session saved once (teardown,
// resume), then paused, whose node loses disk.img while it is paused. Its
// resume answers 200 "running" on a brand-new empty disk (the checkpoint
// restores onto it: "restored": true), and the next teardown saves that
// empty disk as the next generation and deletes the good save: every file
// is gone for good, with no error anywhere. Resume of a paused session
// must restore the disk from storage (prepareDiskLocked) or fail, never
// make an empty one.
func TestReview2PausedNoDisk(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	o := h.provision("pz1", "test-tiny")
	if r := h.sh("pz1", "echo one > /workspace/one.txt && echo h > ~/homefile"); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	h.teardownOK("pz1")
	h.resumeOK("pz1")
	h.sh("pz1", "echo two > /workspace/two.txt")
	if code, b := h.call(h.token, "POST", "/v1/sandbox/pz1/pause", nil); code != 200 {
		t.Fatalf("pause: %d %s", code, b)
	}
	cid := h.s.rt.ContainerID(o.OrgID, "pz1")
	if err := os.Remove(filepath.Join(cfg.DataDir, "sandboxes", cid, "disk.img")); err != nil {
		t.Fatal(err)
	}
	code, b := h.call(h.token, "POST", "/v1/sandbox/pz1/resume", nil)
	if code == 200 {
		if r := h.sh("pz1", "cat /workspace/one.txt ~/homefile"); r.Stdout != "one\nh\n" {
			t.Errorf("resumed (200) on a disk without the session's files: %+v", r)
		}
		h.teardownOK("pz1")
		rt := h.s.rt.(*runsc.Runtime)
		if err := rt.DropDisk(cid); err != nil {
			t.Fatal(err)
		}
		h.resumeOK("pz1")
		if r := h.sh("pz1", "cat /workspace/one.txt ~/homefile"); r.Stdout != "one\nh\n" {
			t.Fatalf("the saved files are lost for good (the empty disk replaced the save): %+v", r)
		}
		return
	}
	t.Logf("resume refused: %d %s", code, b)
}

// TestReview2DeepTreeSave: a tree deeper than PATH_MAX in /workspace (made
// with relative mkdir/chdir) is saved without complaint by teardown, but the
// save cannot be restored ("name too long" in Unpack): once the node's copy
// is gone the whole session, precious.txt and home included, is lost.
func TestReview2DeepTreeSave(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	o := h.provision("dt1", "test-tiny")
	script := `
import os
open('/workspace/precious.txt', 'w').write('precious\n')
os.chdir('/workspace'); os.mkdir('deep'); os.chdir('deep')
for i in range(21):
    os.mkdir('d' * 200); os.chdir('d' * 200)
open('leaf', 'w').write('x')
`
	if r := h.exec("dt1", map[string]any{"command": "python3 -c \"$S\"", "env": map[string]string{"S": script}}); r.ExitCode != 0 {
		t.Fatalf("deep tree: %+v", r)
	}
	code, b := h.call(h.token, "POST", "/v1/sandbox/dt1/teardown", nil)
	if code != 200 {
		t.Logf("teardown refused the save (acceptable): %d %s", code, b)
		return
	}
	rt := h.s.rt.(*runsc.Runtime)
	if err := rt.DropDisk(h.s.rt.ContainerID(o.OrgID, "dt1")); err != nil {
		t.Fatal(err)
	}
	code, b = h.call(h.token, "POST", "/v1/sandbox/dt1/resume", nil)
	if code != 200 {
		t.Fatalf("a save teardown accepted cannot be restored: %d %s", code, b)
	}
	if r := h.sh("dt1", "cat /workspace/precious.txt"); r.Stdout != "precious\n" {
		t.Fatalf("after restore: %+v", r)
	}
}

// TestReview2XattrBlocksTeardown: one user.* attribute whose name has '='
// (any sandbox user can set it) makes every teardown fail with 503, for
// good: the session can never be saved or stopped by teardown (nor by the
// idle timeout, retried every sweep), and keeps its capacity and credits.
func TestReview2XattrBlocksTeardown(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("xa1", "test-tiny")
	if r := h.sh("xa1", `python3 -c "import os; open('/workspace/x','w'); os.setxattr('/workspace/x', 'user.a=b', b'v')"`); r.ExitCode != 0 {
		t.Skipf("setxattr refused in the sandbox: %+v", r)
	}
	code, b := h.call(h.token, "POST", "/v1/sandbox/xa1/teardown", nil)
	if code != 200 {
		t.Fatalf("teardown: %d %s", code, b)
	}
	if list, _ := h.storage().List(context.Background(), h.get("xa1").OrgID, ""); len(list) != 1 {
		t.Fatalf("storage: %+v", list)
	}
}
