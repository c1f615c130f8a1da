package server

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/server/config"
	"sandboxd/server/sandbox"
)

// smallDataDir mounts a fresh ext4 file system of sizeMiB (a sparse image
// under the system's temp dir, named sbx-diskpressure-*) on cfg's data dir,
// so a test can fill it without touching the host's real disk. Unmounted
// and removed at the end, on failure too.
func smallDataDir(t *testing.T, dataDir string, sizeMiB int64) {
	t.Helper()
	f, err := os.CreateTemp("", "sbx-diskpressure-*.img")
	if err != nil {
		t.Fatal(err)
	}
	img := f.Name()
	err = f.Truncate(sizeMiB << 20)
	f.Close()
	if err != nil {
		os.Remove(img)
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		os.Remove(img)
		t.Fatalf("mkfs: %v %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop,nosuid,nodev", img, dataDir).CombinedOutput(); err != nil {
		os.Remove(img)
		t.Fatalf("mount: %v %s", err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dataDir, 0); err != nil {
			t.Errorf("unmount the data dir: %v", err)
			unix.Unmount(dataDir, unix.MNT_DETACH)
		}
		os.Remove(img)
	})
	if err := os.Chmod(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
}

// TestRealDiskPressure: three standard-1 sandboxes on a 4 GiB data dir.
// One wrote 1.5 GiB and is idle (the biggest disk), one writes until it
// is stopped, one is a bystander that keeps working. Below
// limits.pressureFreeDiskMiB the writer is stopped (reason disk_pressure,
// an event, an audit record, a metric) before the file system is full;
// the others run on, the database is intact, and the writer resumes with
// what it wrote, deletes it, and the space comes back.
func TestRealDiskPressure(t *testing.T) {
	cfg := realConfig(t)
	rootFree := sandbox.FreeBytes("/")
	t.Cleanup(func() { // last: the image is gone
		t.Logf("free on /: %d MiB before, %d MiB after", rootFree>>20, sandbox.FreeBytes("/")>>20)
	})
	smallDataDir(t, cfg.DataDir, 4096)
	t.Cleanup(func() { assertNoLeftovers(t, cfg) }) // before the unmount hides what is left
	cfg.Limits.MinFreeDiskMiB, cfg.Limits.PressureFreeDiskMiB = 256, 1536
	h := startServer(t, cfg)
	free := func() int64 { return sandbox.FreeBytes(cfg.DataDir) >> 20 }
	t.Logf("data dir: %d MiB free", free())
	for _, id := range []string{"dp-old", "dp-writer", "dp-bystander"} {
		h.provision(id, "standard-1")
	}
	if r := h.sh("dp-old", "dd if=/dev/zero of=/workspace/old.bin bs=1M count=1500 2>&1 | tail -1 && sync"); r.ExitCode != 0 {
		t.Fatalf("dp-old: %+v", r)
	}
	t.Logf("dp-old wrote 1500 MiB: %d MiB free", free())
	if f := free(); f < int64(cfg.Limits.PressureFreeDiskMiB) {
		t.Fatalf("below the floor before the writer starts: %d MiB", f)
	}

	// The lowest free space while the writer writes.
	var lowest atomic.Int64
	lowest.Store(free())
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if f := free(); f < lowest.Load() {
				lowest.Store(f)
			}
		}
	}()
	stopSampling := func() { close(done); wg.Wait() }

	start := time.Now()
	if r := h.sh("dp-writer", "(dd if=/dev/zero of=/workspace/big.bin bs=1M count=6000 >/tmp/dd.log 2>&1 &)"); r.ExitCode != 0 {
		stopSampling()
		t.Fatalf("dp-writer: %+v", r)
	}
	var w sandboxObject
	var stopping time.Duration // when the stop was first seen
	for probes := 0; ; probes++ {
		if w = h.get("dp-writer"); w.Status != "running" && w.Status != "stopping" {
			break
		}
		if w.Status == "stopping" && stopping == 0 {
			stopping = time.Since(start)
		}
		if r := h.sh("dp-bystander", "echo "+strconv.Itoa(probes)+" > /workspace/probe && cat /workspace/probe"); r.ExitCode != 0 {
			stopSampling()
			t.Fatalf("bystander probe %d: %+v", probes, r)
		}
		if time.Since(start) > 90*time.Second {
			stopSampling()
			t.Fatalf("the writer was not stopped in 90 s: %d MiB free (lowest %d MiB)", free(), lowest.Load())
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start)
	// What the writer had in the page cache lands on its disk image as
	// it stops; wait for it to settle before reading the lowest point.
	time.Sleep(2 * time.Second)
	stopSampling()
	t.Logf("writer stopping after %v, %s after %v; free now %d MiB, lowest %d MiB", stopping.Round(100*time.Millisecond), w.Status,
		took.Round(100*time.Millisecond), free(), lowest.Load())
	if w.Status != "stopped" || w.StatusReason == nil || *w.StatusReason != sandbox.ReasonDiskPressure {
		t.Fatalf("writer: %+v", w)
	}
	if low := lowest.Load(); low < int64(cfg.Limits.MinFreeDiskMiB)/2 {
		t.Fatalf("the data dir's free space fell to %d MiB before the writer was stopped", low)
	}
	for _, id := range []string{"dp-old", "dp-bystander"} {
		if o := h.get(id); o.Status != "running" {
			t.Fatalf("%s: %+v", id, o)
		}
	}
	if r := h.sh("dp-bystander", "echo after > /workspace/probe && cat /workspace/probe"); r.ExitCode != 0 || r.Stdout != "after\n" {
		t.Fatalf("bystander after the stop: %+v", r)
	}
	if r := h.sh("dp-old", "stat -c %s /workspace/old.bin"); r.Stdout != strconv.Itoa(1500<<20)+"\n" {
		t.Fatalf("dp-old: %+v", r)
	}
	// Said where the user looks, and audited.
	logs := h.logsText("dp-writer")
	if !strings.Contains(logs, `"kind":"disk_pressure"`) {
		t.Fatalf("no disk_pressure event: %s", logs)
	}
	var recs []map[string]any
	for start := time.Now(); len(recs) == 0 && time.Since(start) < 10*time.Second; time.Sleep(100 * time.Millisecond) {
		recs = h.audit("dp-writer", "sandbox.disk_pressure_stop")
	}
	if len(recs) != 1 || recs[0]["userId"] != "system" || recs[0]["outcome"] != "ok" {
		b, _ := json.Marshal(recs)
		t.Fatalf("audit: %s", b)
	}
	if code, b := h.call(h.token, "GET", "/metrics", nil); code != 200 || !strings.Contains(string(b), "sandboxd_disk_pressure_stops_total 1\n") {
		t.Fatalf("metrics: %d", code)
	}
	integrityCheck(t, cfg)

	// The writer resumes with what it wrote, deletes it, and the space
	// comes back (its disk is mounted with discard); it is not stopped
	// again.
	h.resumeOK("dp-writer")
	r := h.sh("dp-writer", "stat -c %s /workspace/big.bin")
	written, _ := strconv.ParseInt(strings.TrimSpace(r.Stdout), 10, 64)
	t.Logf("the writer had written %d MiB", written>>20)
	if written < 64<<20 {
		t.Fatalf("the writer's file after the resume: %+v", r)
	}
	if r := h.sh("dp-writer", "rm /workspace/big.bin && sync"); r.ExitCode != 0 {
		t.Fatalf("rm: %+v", r)
	}
	for start := time.Now(); free() < int64(cfg.Limits.PressureFreeDiskMiB); time.Sleep(500 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("space not back: %d MiB free", free())
		}
	}
	t.Logf("after the delete: %d MiB free", free())
	time.Sleep(3 * time.Second) // a few looks of the watcher
	for _, id := range []string{"dp-old", "dp-writer", "dp-bystander"} {
		if o := h.get(id); o.Status != "running" {
			t.Fatalf("%s: %+v", id, o)
		}
	}
	integrityCheck(t, cfg)
	for _, id := range []string{"dp-old", "dp-writer", "dp-bystander"} {
		if code, b := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code/100 != 2 {
			t.Fatalf("delete %s: %d %s", id, code, b)
		}
	}
}

// TestRealDiskPressureSave: a teardown whose save (random data: it does
// not compress) would take the data dir below limits.minFreeDiskMiB is
// stopped before it does: 503 "low on disk space", the free space never
// below the floor, no partial save left, the session running on with its
// files; once they are deleted the teardown saves.
func TestRealDiskPressureSave(t *testing.T) {
	cfg := realConfig(t)
	smallDataDir(t, cfg.DataDir, 2048)
	t.Cleanup(func() { assertNoLeftovers(t, cfg) }) // before the unmount hides what is left
	cfg.Limits.MinFreeDiskMiB, cfg.Limits.PressureFreeDiskMiB = 512, 768
	h := startServer(t, cfg)
	free := func() int64 { return sandbox.FreeBytes(cfg.DataDir) >> 20 }
	h.provision("ds", "standard-1")
	// Leave 400 MiB above minFreeDiskMiB: the save needs more.
	size := free() - int64(cfg.Limits.MinFreeDiskMiB) - 400
	if r := h.sh("ds", "head -c "+strconv.FormatInt(size, 10)+"M /dev/urandom > /workspace/r.bin && sync"); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	before := free()
	t.Logf("wrote %d MiB of random data: %d MiB free, minFreeDiskMiB %d", size, before, cfg.Limits.MinFreeDiskMiB)

	var lowest atomic.Int64
	lowest.Store(before)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if f := free(); f < lowest.Load() {
				lowest.Store(f)
			}
		}
	}()
	start := time.Now()
	code, b := h.call(h.token, "POST", "/v1/sandbox/ds/teardown", nil)
	took := time.Since(start)
	close(done)
	wg.Wait()
	t.Logf("teardown: %d %s in %v; lowest free %d MiB, now %d MiB", code, b, took.Round(100*time.Millisecond), lowest.Load(), free())
	if code != 503 || !strings.Contains(string(b), "low on disk space: this session's save needs more than") {
		t.Fatalf("teardown: %d %s", code, b)
	}
	if low := lowest.Load(); low < int64(cfg.Limits.MinFreeDiskMiB) {
		t.Fatalf("the free space fell to %d MiB, below minFreeDiskMiB", low)
	}
	if left, _ := filepath.Glob(filepath.Join(config.StorageDir(cfg.DataDir), "*", ".tmp-*")); len(left) > 0 {
		t.Fatalf("partial save left: %v", left)
	}
	if o := h.get("ds"); o.Status != "running" {
		t.Fatalf("after the stopped save: %+v", o)
	}
	if r := h.sh("ds", "stat -c %s /workspace/r.bin"); r.Stdout != strconv.FormatInt(size<<20, 10)+"\n" {
		t.Fatalf("the file after the stopped save: %+v", r)
	}
	if logs := h.logsText("ds"); !strings.Contains(logs, `"kind":"save_failed"`) || !strings.Contains(logs, `"reason":"disk"`) {
		t.Fatalf("no save_failed event: %s", logs)
	}
	if f := free(); f < before-16 {
		t.Fatalf("space not given back: %d MiB free, %d before", f, before)
	}
	if r := h.sh("ds", "rm /workspace/r.bin && sync"); r.ExitCode != 0 {
		t.Fatalf("rm: %+v", r)
	}
	h.teardownOK("ds")
	integrityCheck(t, cfg)
	if code, b := h.call(h.token, "DELETE", "/v1/sandbox/ds", nil); code/100 != 2 {
		t.Fatalf("delete: %d %s", code, b)
	}
}
