package server

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"sandboxd/server/config"
)

// Review 4: a data dir moved to another path (a bigger disk, a rename)
// strands every session made before the move. The resource prefix is a
// hash of the data dir's path, and each session row keeps the container
// id made with the old prefix; the new runtime refuses it ("container id
// ... not made by this runtime"). So resume answers 503 "the sandbox
// could not be started; ... retry the resume" (retrying never helps),
// delete answers 503 "could not be removed completely; retry the delete",
// `sandboxd gc` says "nothing to remove" about the stranded sandbox dirs
// and disks (another prefix), and `sandboxd doctor` says "no problems".
// Nothing in README's "Running a node" says a data dir must never move.
// Expected: the stopped session resumes on the moved data dir with its
// files (or, at the least, the server and doctor say why it cannot and
// the session can still be deleted).
func TestReview4MovedDataDirStrandsSessions(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("mv1", "test-tiny")
	if r := h.sh("mv1", "echo before-the-move > /workspace/f"); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	if code, b := h.call(h.token, "POST", "/v1/sandbox/mv1/teardown", nil); code != http.StatusOK {
		t.Fatalf("teardown: %d %s", code, b)
	}
	h.close()

	// The operator moves the data dir (server stopped, nothing mounted).
	unix.Unmount(filepath.Join(cfg.DataDir, "runsc", "null-netns"), unix.MNT_DETACH)
	moved := cfg.DataDir + "m"
	if err := os.Rename(cfg.DataDir, moved); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Unmount(filepath.Join(moved, "runsc", "null-netns"), unix.MNT_DETACH)
		os.RemoveAll(moved)
	})
	cfg2 := *cfg
	cfg2.DataDir = moved
	t.Cleanup(func() { assertNoLeftovers(t, &cfg2) })
	// Before that: the old prefix's sandbox dirs (stopped, nothing
	// mounted), which no runtime of the moved data dir may destroy.
	t.Cleanup(func() {
		old, _ := filepath.Glob(filepath.Join(moved, "sandboxes", config.ResourcePrefix(cfg.DataDir)+"-*"))
		for _, d := range old {
			if mi, _ := os.ReadFile("/proc/self/mountinfo"); !strings.Contains(string(mi), d+"/") {
				os.RemoveAll(d)
			}
		}
	})
	if config.ResourcePrefix(moved) == config.ResourcePrefix(cfg.DataDir) {
		t.Fatal("same prefix")
	}
	h2 := startServer(t, &cfg2)
	h2.token = h.token
	t.Cleanup(func() {
		if h2.ts != nil {
			h2.call(h2.token, "DELETE", "/v1/sandbox/mv1", nil)
		}
	})

	code, b := h2.call(h2.token, "POST", "/v1/sandbox/mv1/resume", nil)
	if code != http.StatusOK {
		dcode, db := h2.call(h2.token, "DELETE", "/v1/sandbox/mv1", nil)
		t.Fatalf("resume after the data dir moved from %s to %s: %d %s\n(delete: %d %s)", cfg.DataDir, moved, code, b, dcode, db)
	}
	if r := h2.sh("mv1", "cat /workspace/f"); r.Stdout != "before-the-move\n" {
		t.Fatalf("after the move: %+v", r)
	}
}
