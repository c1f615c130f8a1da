package runsc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/runsc/agent"
)

// realRuntime returns a Runtime on a temp state dir with the binaries of
// bin/ and the default image. It skips in -short mode and when not root.
func realRuntime(t *testing.T) (*Runtime, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("real gVisor test (not in -short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("real gVisor tests need root")
	}
	bin := os.Getenv("SANDBOXD_BIN")
	if bin == "" {
		bin, _ = filepath.Abs("../bin")
	}
	imgs, _ := filepath.Glob("/var/cache/sandboxd/images/*/rootfs")
	if len(imgs) == 0 {
		t.Skip("no image: run `make image`")
	}
	dir := t.TempDir()
	var rnd [3]byte
	rand.Read(rnd[:])
	r, err := New(Config{Binary: filepath.Join(bin, "runsc"), Agent: filepath.Join(bin, "sandboxd-agent"),
		StateDir: dir, Prefix: "sbxt" + hex.EncodeToString(rnd[:])})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.ReleaseIdle)
	return r, imgs[0]
}

func testSandbox(t *testing.T, r *Runtime, img, name string) Sandbox {
	t.Helper()
	sb := Sandbox{ID: r.ContainerID("org", name), Image: img,
		Limits: Limits{VCPUs: 1, MemoryMiB: 1024, DiskMiB: 256, Pids: 512, Processes: DefaultProcesses(512)}}
	if err := r.Create(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Destroy(context.Background(), sb.ID, DestroyOpts{}); err != nil {
			t.Error(err)
		}
		if b, _ := exec.Command("sh", "-c", "mount | grep "+sb.ID+"; ip netns | grep "+sb.ID).Output(); len(b) > 0 {
			t.Errorf("left behind: %s", b)
		}
	})
	return sb
}

// counter starts a loop printing 0, 1, 2, ... through the agent and
// collects its output.
type counter struct {
	p   *agent.Process
	mu  sync.Mutex
	out []byte
}

func startCounter(t *testing.T, r *Runtime, id string) *counter {
	t.Helper()
	p, err := r.Start(context.Background(), id, agent.Spec{Args: []string{"/bin/sh", "-c", "i=0; while :; do echo $i; i=$((i+1)); sleep 0.05; done"}, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	c := &counter{p: p.(*agent.Process)}
	go func() {
		buf := make([]byte, 1024)
		for {
			n, err := p.Stdout().Read(buf)
			c.mu.Lock()
			c.out = append(c.out, buf[:n]...)
			c.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { p.Close() })
	return c
}

// check waits for at least n numbers and that they count up by one.
func (c *counter) check(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		lines := strings.Fields(string(c.out))
		c.mu.Unlock()
		for i, l := range lines {
			if l != strconv.Itoa(i) {
				t.Fatalf("counter output broken at %d: %v", i, lines)
			}
		}
		if len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("counter stuck at %v", lines)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRealCheckpoint pauses a sandbox with memory and restores it: a loop
// started through the agent goes on counting on the same connection, a
// background loop's state survives, and nothing but the disk and the
// image is left while paused.
func TestRealCheckpoint(t *testing.T) {
	r, img := realRuntime(t)
	ctx := context.Background()
	sb := testSandbox(t, r, img, "cp")
	c := startCounter(t, r, sb.ID)
	c.check(t, 5)
	dir := r.CheckpointDir(sb.ID)
	t0 := time.Now()
	if err := r.Checkpoint(ctx, sb.ID, dir, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint %v", time.Since(t0))
	for _, f := range []string{"checkpoint.img", "pages.img"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi, err)
		}
	}
	if b, _ := exec.Command("sh", "-c", "mount | grep "+sb.ID+"; ip netns | grep "+sb.ID).Output(); len(b) > 0 {
		t.Fatalf("a paused sandbox holds: %s", b)
	}
	if st, _ := r.Inspect(ctx, sb.ID); st.Status != StatusMissing {
		t.Fatalf("paused sandbox state %+v", st)
	}
	paused := len(c.check(t, 0))
	time.Sleep(300 * time.Millisecond)
	if n := len(c.check(t, 0)); n != paused {
		t.Fatalf("counted while paused: %d -> %d", paused, n)
	}
	t0 = time.Now()
	if err := r.Restore(ctx, sb, dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("restore %v", time.Since(t0))
	c.check(t, paused+10)
	res, err := r.Exec(ctx, sb.ID, ExecRequest{Args: []string{"/bin/true"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec after restore: %+v %v", res, err)
	}
}

// TestRealCheckpointFails: a checkpoint that cannot write its image
// leaves the sandbox running, with its processes re-attached.
func TestRealCheckpointFails(t *testing.T) {
	r, img := realRuntime(t)
	ctx := context.Background()
	sb := testSandbox(t, r, img, "cpfail")
	c := startCounter(t, r, sb.ID)
	// 20 MB of memory in use, far more than the image's 1 MB tmpfs holds.
	if res, err := r.Exec(ctx, sb.ID, ExecRequest{Args: []string{"/bin/sh", "-c", "python3 -c 'import os,time; b=os.urandom(20<<20); time.sleep(600)' & sleep 1"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	c.check(t, 3)
	dir := r.CheckpointDir(sb.ID)
	os.Mkdir(dir, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() }) // before Destroy
	err := r.Checkpoint(ctx, sb.ID, dir, nil)
	if !errors.Is(err, ErrCheckpointFailed) {
		t.Fatalf("checkpoint into a full dir: %v", err)
	}
	if st, _ := r.Inspect(ctx, sb.ID); st.Status != StatusRunning {
		t.Fatalf("after a failed checkpoint: %+v", st)
	}
	n := len(c.check(t, 0))
	c.check(t, n+5)
	res, err := r.Exec(ctx, sb.ID, ExecRequest{Args: []string{"/bin/true"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec after a failed checkpoint: %+v %v", res, err)
	}
}
