package main

// Review 4: sandboxd gc against things planted in its own sandboxes dir
// that lead out of it. Real components (runsc, mounts, netns), as in
// gc_real_test.go; needs root and SANDBOXD_BIN, skips in -short mode.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/store"
)

func review4GCConf(t *testing.T) (bin, conf string) {
	t.Helper()
	if testing.Short() {
		t.Skip("real gVisor test (not in -short)")
	}
	bin = os.Getenv("SANDBOXD_BIN")
	if bin == "" {
		t.Skip("SANDBOXD_BIN unset: run `make build`, then SANDBOXD_BIN=$PWD/bin")
	}
	if os.Geteuid() != 0 {
		t.Skip("real gVisor tests need root")
	}
	bin, _ = filepath.Abs(bin)
	conf = filepath.Join(t.TempDir(), "sandboxd.yaml")
	if err := os.WriteFile(conf, []byte("runsc:\n  binary: "+filepath.Join(bin, "runsc")+"\n  agent: "+filepath.Join(bin, "sandboxd-agent")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return bin, conf
}

// Review 4: gc of data dir A unmounts the live sandbox of data dir B (and
// deletes files outside A) through symlinks in A's sandboxes dir.
//
// gc promises "never another data dir's" and "a directory that is still a
// mount point is never deleted". Destroy, which gc --apply (and the
// server's start-up Collect) runs on an unclaimed id, unmounts
// <dir>/rootfs and <dir>/disk by path with umount(2), which follows
// symlinks (no UMOUNT_NOFOLLOW), and on EBUSY detaches them; for a
// stopped/failed row it then RemoveAll()s <dir>/config.json, run, rootfs,
// disk, ... through a sandbox dir that is itself a symlink. Its "mounts
// under the dir" check reads mountinfo by the unresolved path, so it sees
// nothing.
//
// Planted in A (no server running):
//   - a sandbox dir <A>-<16hex> (no row) whose rootfs and disk are
//     symlinks to B's running sandbox's rootfs and disk mounts;
//   - a sandbox dir <A>-<16hex> that is a symlink to a directory outside
//     A (config.json, run/, a tmpfs at disk/), with a stopped row and a
//     leftover netns (so gc removes "its container, netns, cgroups and
//     mounts" and keeps "its sandbox dir and disk").
//
// Seen: B's sandbox loses its disk and rootfs mounts (its teardown then
// fails for ever: "the session could not be saved", as on a live node
// with two servers), and the outside directory loses config.json, run/
// and its tmpfs. Expected: nothing outside A's sandboxes dir is touched
// (umount with UMOUNT_NOFOLLOW, a sandbox dir that is a symlink or leads
// elsewhere is refused or only unlinked).
func TestReview4GCFollowsSymlinksOutOfTheDataDir(t *testing.T) {
	bin, conf := review4GCConf(t)
	a, b := newGCInstall(t, conf), newGCInstall(t, conf)

	bReal := b.id("victim")
	realSandbox(t, b, bReal, bin)
	bDisk, bRoot := filepath.Join(b.sandbox(bReal), "disk"), filepath.Join(b.sandbox(bReal), "rootfs")
	bMounts := mountsBelow(b.dir)
	if !slices.Contains(bMounts, bDisk) || !slices.Contains(bMounts, bRoot) {
		t.Skipf("B's sandbox has no disk and rootfs mounts (no image in /var/cache/sandboxd/images?): %v", bMounts)
	}

	// A sandbox dir of A whose rootfs and disk lead into B's sandbox.
	aLinks := a.id("links")
	if err := os.MkdirAll(a.sandbox(aLinks), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(a.sandbox(aLinks)) }) // before A's own cleanup, which would follow them too
	for _, n := range []string{"rootfs", "disk"} {
		if err := os.Symlink(filepath.Join(b.sandbox(bReal), n), filepath.Join(a.sandbox(aLinks), n)); err != nil {
			t.Fatal(err)
		}
	}

	// A sandbox dir of A that is a symlink to a directory elsewhere, with
	// a stopped row and a leftover netns.
	outside := t.TempDir()
	for _, p := range []string{"config.json", "sandbox.pid", "disk.img"} {
		if err := os.WriteFile(filepath.Join(outside, p), []byte("not A's\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(outside, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "run", "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	plantTmpfs(t, filepath.Join(outside, "disk"))
	aLinked := a.id("linked")
	if err := os.MkdirAll(filepath.Join(a.dir, "sandboxes"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, a.sandbox(aLinked)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(a.sandbox(aLinked)) })
	a.addRow(t, "linked", store.StatusStopped)
	plantNetns(t, aLinked)

	code, out, errs := gcRunIn(t, conf, a.dir, "--apply")
	t.Logf("gc --apply: exit %d\n%s%s", code, out, errs)

	after := mountsBelow(b.dir)
	for _, m := range []string{bDisk, bRoot} {
		if !slices.Contains(after, m) {
			t.Errorf("gc of %s unmounted %s of another data dir's running sandbox (mounts under B now: %v)", a.dir, m, after)
		}
	}
	for _, p := range []string{"config.json", "sandbox.pid", "disk.img", "run/keep", "disk/keep"} {
		if _, err := os.Stat(filepath.Join(outside, p)); err != nil {
			t.Errorf("gc of %s removed %s outside its data dir: %v", a.dir, filepath.Join(outside, p), err)
		}
	}
	if !isMount(filepath.Join(outside, "disk")) {
		t.Errorf("gc of %s unmounted %s outside its data dir", a.dir, filepath.Join(outside, "disk"))
	}
}

func isMount(p string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}

// spawnWithPid starts `sleep` as the process with pid want (pid reuse, as
// after a reboot or a wrap of pid_max: /proc/sys/kernel/ns_last_pid),
// retrying while other processes of the machine take it first.
func spawnWithPid(t *testing.T, want int) *exec.Cmd {
	t.Helper()
	for i := 0; i < 500; i++ {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(want-1)), 0o644); err != nil {
			t.Skipf("cannot set ns_last_pid: %v", err)
		}
		cmd := exec.Command("sleep", "600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == want {
			return cmd
		}
		cmd.Process.Kill()
		cmd.Wait()
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", want)); err == nil {
			t.Skipf("pid %d is taken by another process", want)
		}
	}
	t.Skipf("could not get pid %d", want)
	return nil
}

// Review 4: gc --apply (like the server's Destroy and its start-up
// Collect) SIGKILLs an unrelated host process that has the pid a dead
// sandbox had.
//
// runsc's state root is <data-dir>/runsc, on the persistent disk: after a
// reboot (or, with pid_max 32768 as on this host, a wrap of the pids while
// the sandbox was dead) its state files still name the old sandbox and
// gofer pids. `runsc list` then calls the container "running" (the pid
// exists), and `runsc delete --force`, which Destroy runs first, kills
// that pid; Destroy's own fallback kills <dir>/sandbox.pid as well, with
// no check of what the process is. Here a dead sandbox of no session
// (a leftover gc is meant to remove) had pid P; an unrelated `sleep` now
// has pid P; gc --apply kills it. Expected: gc removes the leftover and
// leaves every process that is not that sandbox's runsc process alone
// (check the process, e.g. its start time against the state file's, or
// its cmdline/root; or keep runsc's state on a tmpfs such as /run).
//
// (The server itself, started after such a reboot, adopts the dead
// sandbox as running because pidAlive(P) is true, answers exec with
// "internal error", fails every teardown, and its delete kills P and the
// reused gofer pid.)
func TestReview4GCKillsProcessWithReusedSandboxPid(t *testing.T) {
	bin, conf := review4GCConf(t)
	a := newGCInstall(t, conf)
	id := a.id("dead")
	realSandbox(t, a, id, bin)
	ms, _ := filepath.Glob(filepath.Join(a.dir, "runsc", id+"_sandbox:*.state"))
	if len(ms) != 1 {
		t.Fatalf("runsc state files of %s: %v", id, ms)
	}
	raw, err := os.ReadFile(ms[0])
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		GoferPid int `json:"goferPid"`
		Sandbox  struct {
			Pid int `json:"pid"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || st.Sandbox.Pid <= 1 {
		t.Fatalf("runsc state %s: %v %+v", ms[0], err, st)
	}
	// The sandbox dies (its processes are gone; runsc's state stays).
	for _, p := range []int{st.Sandbox.Pid, st.GoferPid} {
		if p > 1 {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range []int{st.Sandbox.Pid, st.GoferPid} {
		for p > 1 && time.Now().Before(deadline) {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// An unrelated process now has the sandbox's pid.
	victim := spawnWithPid(t, st.Sandbox.Pid)
	exited := make(chan error, 1)
	go func() { exited <- victim.Wait() }()
	t.Cleanup(func() { victim.Process.Kill(); <-exited })

	code, out, errs := gcRunIn(t, conf, a.dir, "--apply")
	t.Logf("gc --apply: exit %d\n%s%s", code, out, errs)
	if !strings.Contains(out, id) {
		t.Errorf("gc did not list the dead sandbox %s", id)
	}
	select {
	case err := <-exited:
		exited <- err
		t.Fatalf("gc --apply killed pid %d, an unrelated process (sleep) that reused the dead sandbox's pid: %v", st.Sandbox.Pid, err)
	case <-time.After(2 * time.Second):
	}
}

// Review 4: a server that starts while `sandboxd gc --apply` runs (gc saw
// it stopped) has the sandbox it resumes meanwhile destroyed by gc.
//
// gc decides once, at its start, whether the server runs, and does not
// hold <data-dir>/sandboxd.lock while it removes: with the server seen
// stopped it neither skips recent changes nor reads a row again before
// removing. A server started meanwhile (systemd's Restart=, a deploy, an
// operator in another shell) adopts its sessions and users resume them;
// here a failed session with a leftover netns (gc plans: remove its
// container, netns, cgroups and mounts, keep its dir and disk) is resumed
// while gc's `runsc delete` runs (a wrapper holds it until the resume is
// done, standing in for a slow runsc on a loaded node). gc then deletes
// the resumed session's new container, netns and mounts: the session is
// "running" in its row with no sandbox. Expected: gc --apply with the
// server stopped holds the data dir's lock while it removes (a server
// cannot start meanwhile), or treats a server that appears as the running
// case (skip, read the row again).
func TestReview4GCServerStartsDuringApply(t *testing.T) { review4ResumeDuringGC(t, false) }

// Review 4: beside a running server, gc --apply destroys a session that
// is resumed while gc removes its leftovers.
//
// While the server runs, gc reads an entry's row (and its files' times)
// again just before removing it, then runs Destroy without any lock the
// server respects: a resume that begins after that read and before
// Destroy ends (runsc delete, cgroups, netns, unmounts, files: a second
// or more on a loaded node; here a wrapper holds gc's runsc delete until
// the resume is done) has its new container deleted, its netns removed
// and its disk and rootfs unmounted, while its row says running. The
// leftover is a failed session's netns a minute old (the server's own
// release of it failed); the resume is the server's (Destroy keeping the
// disk, then Create on it). Expected: a per-session lock (e.g. a flock on
// a file in the sandbox dir) that the server holds for a lifecycle step
// and gc holds across its re-read and Destroy, or gc leaving live-kind
// removals to the server while it runs.
func TestReview4GCResumeBesideRunningServer(t *testing.T) {
	if testing.Short() {
		t.Skip("real gVisor test (not in -short)")
	}
	review4ResumeDuringGC(t, true)
}

// review4ResumeDuringGC: a failed session with a leftover netns; gc
// --apply; while gc's runsc delete runs, the session is resumed. running:
// the server runs all along (its lock held; the leftover is left to age
// past gc's minute), else it starts when gc's delete begins.
func review4ResumeDuringGC(t *testing.T, running bool) {
	bin, conf := review4GCConf(t)
	a := newGCInstall(t, conf)
	ctx := context.Background()
	imgs, _ := filepath.Glob("/var/cache/sandboxd/images/*/rootfs")
	if len(imgs) == 0 {
		t.Skip("no image in /var/cache/sandboxd/images")
	}
	limits := runsc.Limits{VCPUs: 1, MemoryMiB: 512, DiskMiB: 64, Pids: 256, Processes: runsc.DefaultProcesses(256)}

	// A failed session (its sandbox died; the release of its netns
	// failed): its disk, and a leftover netns.
	id := a.id("resumed")
	if err := a.rt.Create(ctx, runsc.Sandbox{ID: id, Image: imgs[0], Limits: limits}); err != nil {
		t.Fatal(err)
	}
	if err := a.rt.Destroy(ctx, id, runsc.DestroyOpts{KeepDisk: true}); err != nil {
		t.Fatal(err)
	}
	a.addRow(t, "resumed", store.StatusFailed)
	plantNetns(t, id)
	lock, err := os.OpenFile(filepath.Join(a.dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if running {
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatal(err)
		}
	}

	// gc's runsc: `delete` waits for the go file (at most 60 s).
	gate := t.TempDir()
	wrapper := filepath.Join(gate, "runsc")
	script := "#!/bin/sh\nfor a in \"$@\"; do if [ \"$a\" = delete ]; then touch " + gate + "/deleting; i=0; while [ ! -e " + gate + "/go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; fi; done\nexec " + filepath.Join(bin, "runsc") + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	gcConf := filepath.Join(gate, "gc.yaml")
	if err := os.WriteFile(gcConf, []byte("runsc:\n  binary: "+wrapper+"\n  agent: "+filepath.Join(bin, "sandboxd-agent")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errs := gcRunIn(t, gcConf, a.dir, "--apply")
		done <- result{code, out, errs}
	}()
	if running {
		// Fixed: --apply refuses beside a running server and removes nothing.
		res := <-done
		if res.code != 1 || !strings.Contains(res.err, "gc --apply needs it stopped") {
			t.Fatalf("gc --apply beside a running server: %+v", res)
		}
		if _, err := os.Stat("/var/run/netns/" + id); err != nil {
			t.Fatalf("gc --apply beside a running server removed the leftover netns: %v", err)
		}
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(gate, "deleting")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			os.WriteFile(filepath.Join(gate, "go"), nil, 0o600)
			t.Fatalf("gc never ran runsc delete: %+v", <-done)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The server starts (it takes the lock), or runs; the session is resumed.
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		os.WriteFile(filepath.Join(gate, "go"), nil, 0o600)
		t.Fatalf("a server could start while gc --apply removes: %+v", <-done)
	}
	// Fixed: gc holds the data dir's lock, so no server starts (and
	// resumes) meanwhile; gc finishes.
	os.WriteFile(filepath.Join(gate, "go"), nil, 0o600)
	if res := <-done; res.code != 0 {
		t.Fatalf("gc --apply: %+v", res)
	}
}

// Review 4: with a space in the data dir's path, gc deletes through a
// mount and lists no mounts at all.
//
// The driver finds mounts by comparing the raw mount point field of
// /proc/self/mountinfo with the path, but the kernel escapes space, tab,
// newline and backslash there as \040, \011, \012 and \134: under
// "/tmp/sbx gc123/" no mount is ever found. So gc's dry run does not
// list a leftover's mount, and --apply (Destroy: "unmounts whatever is
// below the dir first and never deletes through a mount") RemoveAll()s
// into it: here the file on a tmpfs mounted in a leftover sandbox dir of
// no session is deleted, then gc fails with "device or resource busy".
// (The same comparison makes the server leave runsc's null-netns mounted
// when it stops, and gc then says "nothing to remove".) Expected: the
// mount listed and unmounted, the file kept.
func TestReview4GCDataDirWithSpaceDeletesThroughMount(t *testing.T) {
	_, conf := review4GCConf(t)
	dir, err := os.MkdirTemp("", "sbx gc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ms := mountsBelow(strings.ReplaceAll(dir, " ", `\040`)); len(ms) > 0 {
			t.Errorf("mounts left under %s, not removing it: %v", dir, ms)
			return
		}
		os.RemoveAll(dir)
	})
	db, err := store.Open(config.DBPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	id := config.ResourcePrefix(dir) + "-00000000000000a1"
	scratch := filepath.Join(dir, "sandboxes", id, "scratch")
	plantTmpfs(t, scratch) // with scratch/keep

	rep := gcJSON(t, conf, dir)
	var listed bool
	for _, e := range rep.Sandboxes {
		for _, it := range e.Items {
			listed = listed || (it.Kind == "mount" && it.Name == scratch)
		}
	}
	if !listed {
		t.Errorf("dry run does not list the mount %s: %+v", scratch, rep.Sandboxes)
	}
	code, out, errs := gcRunIn(t, conf, dir, "--apply")
	t.Logf("gc --apply: exit %d\n%s%s", code, out, errs)
	if _, err := os.Stat(filepath.Join(scratch, "keep")); err != nil && isMount(strings.ReplaceAll(scratch, " ", `\040`)) {
		t.Fatalf("gc deleted through the mount at %s: %v", scratch, err)
	}
}
