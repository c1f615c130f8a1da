package main

// The real test of sandboxd gc: leftovers of two installations planted on
// this host (real runsc containers, netns, cgroups, mounts, sandbox dirs),
// rows in one's database, and gc run on it. Needs root and `make build`
// ($SANDBOXD_BIN); skips in -short mode.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netns"

	"sandboxd/runsc"
	"sandboxd/server"
	"sandboxd/server/config"
	"sandboxd/store"
)

// gcInstall is one installation's data dir, driver and database.
type gcInstall struct {
	dir, prefix string
	rt          *runsc.Runtime
	db          *store.DB
	org         string
}

func newGCInstall(t *testing.T, conf string) *gcInstall {
	t.Helper()
	// Short: agent sockets live under it (107 bytes at most).
	dir, err := os.MkdirTemp("", "sbxgc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ms := mountsBelow(dir); len(ms) > 0 {
			t.Errorf("mounts left under %s, not removing it: %v", dir, ms)
			return
		}
		os.RemoveAll(dir)
	})
	cfg, err := config.Load(config.Overrides{ConfigFile: conf, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	rc := server.RuntimeConfig(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	rc.TrustBundle = ""       // none written: sandboxes keep the image's roots
	rc.CgroupsAnywhere = true // the cleanup finds every planted cgroup
	rt, err := runsc.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(config.DBPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := db.CreateOrg(context.Background(), "gc", "owner")
	if err != nil {
		t.Fatal(err)
	}
	in := &gcInstall{dir: dir, prefix: config.ResourcePrefix(dir), rt: rt, db: db, org: p.Org.ID}
	// Before the data dir goes and after every planted item's own cleanup:
	// whatever is left with the prefix is destroyed, and reported.
	t.Cleanup(func() {
		db.Close()
		ctx := context.Background()
		ls, _ := rt.Leftovers(ctx, nil)
		for _, l := range ls {
			if err := rt.Destroy(ctx, l.ID, runsc.DestroyOpts{}); err != nil {
				t.Errorf("cleanup %s: %v", l.ID, err)
			}
		}
		rt.ReleaseIdle()
		if left := hostState(in); len(left) > 0 {
			t.Errorf("left on the host by %s: %v", dir, left)
		}
	})
	return in
}

func (in *gcInstall) id(name string) string { return in.rt.ContainerID(in.org, name) }
func (in *gcInstall) sandbox(id string) string {
	return filepath.Join(in.dir, "sandboxes", id)
}

func (in *gcInstall) addRow(t *testing.T, name, status string) *store.Session {
	t.Helper()
	s := &store.Session{OrgID: in.org, SessionID: name, ContainerID: in.id(name), Status: status, Size: "small"}
	if err := in.db.InsertSession(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return s
}

func runCmd(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// plantNetns adds a named netns as the driver does (a bind mount of a new
// network namespace on /var/run/netns/<name>), removed at cleanup. Not
// with `ip netns add`: on a host where /var/run/netns is no mount point it
// makes it one, over the netns other servers have there already, which
// then cannot be deleted.
func plantNetns(t *testing.T, name string) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		if serr := netns.Set(orig); serr != nil {
			errc <- serr // the thread stays locked and ends with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("netns %s: %v", name, err)
	}
	t.Cleanup(func() { netns.DeleteNamed(name) })
}

// ownCgroups are this process's cgroup directories in the memory and pids
// hierarchies (v1), or its v2 cgroup: where runsc nests a sandbox's.
func ownCgroups(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		var d string
		switch f[1] {
		case "memory", "pids":
			d = filepath.Join("/sys/fs/cgroup", f[1], f[2])
		case "":
			d = filepath.Join("/sys/fs/cgroup", f[2])
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", "cgroup.controllers")); err != nil {
				continue // v1 with a v2 mount elsewhere
			}
		default:
			continue
		}
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		t.Fatal("no cgroup directory of this process found")
	}
	return out
}

func plantCgroup(t *testing.T, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
}

// plantMount mounts a small tmpfs at p with a file in it.
func plantTmpfs(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o700); err != nil {
		t.Fatal(err)
	}
	runCmd(t, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", p)
	t.Cleanup(func() { syscall.Unmount(p, syscall.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(p, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// plantDisk makes a sandbox dir with a small ext4 disk.img; mounted, it is
// also loop-mounted read-only at disk/ (as a file request does).
func plantDisk(t *testing.T, dir string, mounted bool) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "disk.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(16 << 20)
	f.Close()
	runCmd(t, "mkfs.ext4", "-q", "-F", img)
	if mounted {
		mnt := filepath.Join(dir, "disk")
		os.Mkdir(mnt, 0o700)
		runCmd(t, "mount", "-t", "ext4", "-o", "ro,noload,loop", img, mnt)
		t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	}
}

// realSandbox makes a real runsc container for id: a whole sandbox (disk,
// mounts, netns, cgroups) with the default image, or without it a
// minimal bundle in the sandbox dir (the static agent as init), created
// and started with runsc in the installation's state root.
func realSandbox(t *testing.T, in *gcInstall, id, bin string) {
	t.Helper()
	ctx := context.Background()
	if imgs, _ := filepath.Glob("/var/cache/sandboxd/images/*/rootfs"); len(imgs) > 0 {
		err := in.rt.Create(ctx, runsc.Sandbox{ID: id, Image: imgs[0],
			Limits: runsc.Limits{VCPUs: 1, MemoryMiB: 512, DiskMiB: 64, Pids: 256, Processes: runsc.DefaultProcesses(256)}})
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	d := in.sandbox(id)
	if err := os.MkdirAll(filepath.Join(d, "rootfs"), 0o700); err != nil {
		t.Fatal(err)
	}
	agent, err := os.ReadFile(filepath.Join(bin, "sandboxd-agent"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "rootfs", "init"), agent, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{
		"ociVersion": "1.0.0",
		"process":    map[string]any{"args": []string{"/init", "init"}, "cwd": "/", "env": []string{"PATH=/"}, "user": map[string]int{"uid": 0, "gid": 0}},
		"root":       map[string]any{"path": "rootfs", "readonly": true},
		"linux": map[string]any{"cgroupsPath": id, "namespaces": []map[string]string{
			{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}}},
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(d, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(d, "init.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	root := []string{"--root", filepath.Join(in.dir, "runsc"), "--network", "none", "--overlay2", "none"}
	for _, args := range [][]string{{"create", "--bundle", d, id}, {"start", id}} {
		cmd := exec.Command(filepath.Join(bin, "runsc"), append(root, args...)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Run(); err != nil {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("runsc %s: %v: %s", args[0], err, log)
		}
	}
}

// hostState lists what the host holds for the installations: netns, cgroup
// dirs and runsc containers with their prefixes, mounts and sandbox dirs
// (and disks) under their data dirs.
func hostState(ins ...*gcInstall) []string {
	var out []string
	ents, _ := os.ReadDir("/var/run/netns")
	for _, in := range ins {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), in.prefix) {
				out = append(out, "netns "+e.Name())
			}
		}
		for _, p := range cgroupsNamed(in.prefix) {
			out = append(out, "cgroup "+p)
		}
		for _, m := range mountsBelow(in.dir) {
			out = append(out, "mount "+m)
		}
		sbs, _ := os.ReadDir(filepath.Join(in.dir, "sandboxes"))
		for _, e := range sbs {
			d := filepath.Join(in.dir, "sandboxes", e.Name())
			out = append(out, "dir "+d)
			if _, err := os.Stat(filepath.Join(d, "disk.img")); err == nil {
				out = append(out, "disk "+filepath.Join(d, "disk.img"))
			}
		}
		sts, _ := in.rt.List(context.Background())
		for _, s := range sts {
			out = append(out, "container "+s.ID)
		}
	}
	sort.Strings(out)
	return out
}

func cgroupsNamed(prefix string) []string {
	var out []string
	filepath.WalkDir("/sys/fs/cgroup", func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return nil
		}
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, p)
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

func mountsBelow(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// without returns state without the lines that name any of ids, except
// those keep accepts.
func without(state []string, ids []string, keep func(line string) bool) []string {
	var out []string
	for _, line := range state {
		gone := false
		for _, id := range ids {
			if strings.Contains(line, id) && (keep == nil || !keep(line)) {
				gone = true
			}
		}
		if !gone {
			out = append(out, line)
		}
	}
	return out
}

// gcRunIn runs `sandboxd gc` in-process on dataDir with the test's config.
func gcRunIn(t *testing.T, conf, dataDir string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRoot(&out, &errb)
	root.SetArgs(append([]string{"gc", "--config", conf, "--data-dir", dataDir}, args...))
	code := report(&errb, root.ExecuteContext(context.Background()))
	return code, out.String(), errb.String()
}

func gcJSON(t *testing.T, conf, dataDir string, args ...string) gcReport {
	t.Helper()
	code, out, errs := gcRunIn(t, conf, dataDir, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("gc %v: exit %d\n%s\n%s", args, code, out, errs)
	}
	var rep gcReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("gc --json: %v\n%s", err, out)
	}
	return rep
}

func sameLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s:\n got:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestRealGC(t *testing.T) {
	if testing.Short() {
		t.Skip("real gVisor test (not in -short)")
	}
	bin := os.Getenv("SANDBOXD_BIN")
	if bin == "" {
		t.Skip("SANDBOXD_BIN unset: run `make build`, then SANDBOXD_BIN=$PWD/bin")
	}
	if os.Geteuid() != 0 {
		t.Skip("real gVisor tests need root")
	}
	bin, _ = filepath.Abs(bin)
	conf := filepath.Join(t.TempDir(), "sandboxd.yaml")
	if err := os.WriteFile(conf, []byte("runsc:\n  binary: "+filepath.Join(bin, "runsc")+"\n  agent: "+filepath.Join(bin, "sandboxd-agent")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, b := newGCInstall(t, conf), newGCInstall(t, conf)
	if a.prefix == b.prefix {
		t.Fatal("same prefix for two data dirs")
	}
	own := ownCgroups(t)

	// A: a running session's sandbox (claimed), one with no row, a stopped
	// session's disk with a leftover netns and cgroup, a deleted session's
	// dir with its disk mounted, planted leftovers of an id with no row
	// (netns pair, cgroups here and outside this cgroup, a tmpfs, a disk),
	// a paused session's dir and netns (claimed), and names with the
	// prefix that are not container ids.
	aRun, aGone, aStopped, aDeleted, aPlanted, aPaused := a.id("run"), a.id("gone"), a.id("stopped"), a.id("deleted"), a.id("planted"), a.id("paused")
	realSandbox(t, a, aRun, bin)
	run := a.addRow(t, "run", store.StatusRunning)
	realSandbox(t, a, aGone, bin)
	realSandbox(t, a, aStopped, bin)
	if err := a.rt.Destroy(context.Background(), aStopped, runsc.DestroyOpts{KeepDisk: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a.sandbox(aStopped), "disk.img")); err != nil {
		// The minimal bundle has no disk: give it one.
		plantDisk(t, a.sandbox(aStopped), false)
	}
	a.addRow(t, "stopped", store.StatusStopped)
	plantNetns(t, aStopped)
	plantNetns(t, aStopped+"-px")
	plantCgroup(t, filepath.Join(own[0], aStopped))
	plantDisk(t, a.sandbox(aDeleted), true)
	a.addRow(t, "deleted", store.StatusDeleted)
	plantNetns(t, aPlanted)
	plantNetns(t, aPlanted+"-px")
	for _, d := range own {
		plantCgroup(t, filepath.Join(d, aPlanted))
	}
	// As if the server had run in another cgroup (a systemd unit's).
	for _, d := range own {
		if root := "/sys/fs/cgroup/memory"; d != root && strings.HasPrefix(d, root+"/") {
			plantCgroup(t, filepath.Join(root, aPlanted))
		}
	}
	plantDisk(t, a.sandbox(aPlanted), false)
	plantTmpfs(t, filepath.Join(a.sandbox(aPlanted), "scratch"))
	plantDisk(t, a.sandbox(aPaused), false)
	os.Mkdir(filepath.Join(a.sandbox(aPaused), "checkpoint"), 0o700)
	plantNetns(t, aPaused)
	a.addRow(t, "paused", store.StatusPaused)
	plantNetns(t, a.prefix+"-notanid")
	notID := a.sandbox(a.prefix + "-notanid")
	os.MkdirAll(notID, 0o700)
	t.Cleanup(func() { os.RemoveAll(notID) })
	foreign := "gcforeign" + a.prefix[3:]
	plantNetns(t, foreign)

	// B (another data dir, another prefix): a real sandbox and planted
	// leftovers, none with a row.
	bReal, bPlanted := b.id("real"), b.id("planted")
	realSandbox(t, b, bReal, bin)
	plantNetns(t, bPlanted)
	plantNetns(t, bPlanted+"-px")
	plantCgroup(t, filepath.Join(own[0], bPlanted))
	plantDisk(t, b.sandbox(bPlanted), true)
	plantTmpfs(t, filepath.Join(b.sandbox(bPlanted), "scratch"))

	before := hostState(a, b)
	bBefore := hostState(b)
	for _, want := range []string{"container " + aRun, "container " + aGone, "container " + bReal, "netns " + aPlanted + "-px",
		"mount " + filepath.Join(a.sandbox(aDeleted), "disk"), "disk " + filepath.Join(a.sandbox(aStopped), "disk.img")} {
		if !hasLine(before, want) {
			t.Fatalf("planting failed: no %q in\n%s", want, strings.Join(before, "\n"))
		}
	}
	// This test's namespaces: other tests' servers (other prefixes) come
	// and go meanwhile.
	nsNames := func() []string {
		ents, _ := os.ReadDir("/var/run/netns")
		var out []string
		for _, e := range ents {
			if n := e.Name(); strings.HasPrefix(n, a.prefix+"-") || strings.HasPrefix(n, b.prefix+"-") || n == foreign {
				out = append(out, n)
			}
		}
		return out
	}
	netnsBefore := nsNames()

	// The dry run lists A's unclaimed leftovers and changes nothing.
	code, out, errs := gcRunIn(t, conf, a.dir)
	if code != 0 {
		t.Fatalf("gc: exit %d\n%s\n%s", code, out, errs)
	}
	for _, want := range []string{aGone, aStopped, aDeleted, aPlanted, "dry run", "--apply", "no session row", "its sandbox dir and disk stay",
		"runsc container", "cgroup", "mount", "sandbox dir", filepath.Join(a.sandbox(aPlanted), "scratch")} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, out)
		}
	}
	for _, not := range []string{aRun, aPaused, "notanid", foreign, b.prefix} {
		if strings.Contains(out, not) {
			t.Errorf("dry run output names %q:\n%s", not, out)
		}
	}
	t.Logf("dry run:\n%s", out)
	sameLines(t, "host after the dry run", hostState(a, b), before)
	rep := gcJSON(t, conf, a.dir)
	var ids []string
	for _, e := range rep.Sandboxes {
		ids = append(ids, e.ID)
		if e.KeepDisk != (e.ID == aStopped) || e.Removed || e.Skipped != "" {
			t.Errorf("dry run entry %+v", e)
		}
	}
	sort.Strings(ids)
	wantIDs := []string{aGone, aStopped, aDeleted, aPlanted}
	sort.Strings(wantIDs)
	sameLines(t, "dry run ids", ids, wantIDs)
	if rep.Applied || rep.ServerRunning || rep.NullNetns != nil || rep.Prefix != a.prefix {
		t.Errorf("dry run report %+v", rep)
	}
	sameLines(t, "host after the JSON dry run", hostState(a, b), before)

	// --apply removes exactly those; the stopped session keeps its dir
	// and disk; B and the claimed ones stay.
	rep = gcJSON(t, conf, a.dir, "--apply")
	for _, e := range rep.Sandboxes {
		if !e.Removed || e.Error != "" {
			t.Errorf("apply entry %+v", e)
		}
	}
	want := without(before, []string{aGone, aStopped, aDeleted, aPlanted}, func(line string) bool {
		return line == "dir "+a.sandbox(aStopped) || line == "disk "+filepath.Join(a.sandbox(aStopped), "disk.img")
	})
	after := hostState(a, b)
	sameLines(t, "host after --apply", after, want)
	sameLines(t, "B after --apply", hostState(b), bBefore)
	wantNetns := without(netnsBefore, []string{aGone, aStopped, aPlanted}, nil)
	sameLines(t, "netns after --apply", nsNames(), wantNetns)
	for _, p := range []string{filepath.Join(a.sandbox(aStopped), "disk.img"), filepath.Join(a.sandbox(aPaused), "checkpoint"),
		filepath.Join(b.sandbox(bPlanted), "scratch", "keep")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("gone: %v", err)
		}
	}
	if p, mounted := a.rt.NullNetns(); hasLine(before, "mount "+p) && !mounted {
		t.Error("null-netns unmounted while a sandbox runs")
	}

	// A second run finds nothing.
	if rep := gcJSON(t, conf, a.dir, "--apply"); len(rep.Sandboxes) != 0 || rep.NullNetns != nil {
		t.Fatalf("second run: %+v", rep)
	}
	if code, out, _ := gcRunIn(t, conf, a.dir); code != 0 || !strings.Contains(out, "nothing to remove") {
		t.Fatalf("second dry run: %d\n%s", code, out)
	}

	// While the server runs (it holds the lock), a leftover that changed
	// in the last minute is skipped; once it stops, it goes.
	aFresh := a.id("fresh")
	plantNetns(t, aFresh)
	plantDisk(t, a.sandbox(aFresh), false)
	lock, err := os.OpenFile(filepath.Join(a.dir, "sandboxd.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	held := hostState(a, b)
	// --apply refuses beside a running server and changes nothing.
	if code, out, errs := gcRunIn(t, conf, a.dir, "--apply"); code != 1 || !strings.Contains(errs, "gc --apply needs it stopped") {
		t.Fatalf("gc --apply beside a running server: %d\n%s\n%s", code, out, errs)
	}
	rep = gcJSON(t, conf, a.dir)
	if !rep.ServerRunning || len(rep.Sandboxes) != 1 || rep.Sandboxes[0].ID != aFresh || rep.Sandboxes[0].Skipped == "" || rep.Sandboxes[0].Removed {
		t.Fatalf("gc dry run beside a running server: %+v", rep)
	}
	if code, out, _ := gcRunIn(t, conf, a.dir); code != 0 || !strings.Contains(out, "skipped: changed") || !strings.Contains(out, "server running") {
		t.Fatalf("dry run beside a running server: %d\n%s", code, out)
	}
	sameLines(t, "host after gc beside a running server", hostState(a, b), held)
	syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	rep = gcJSON(t, conf, a.dir, "--apply")
	if len(rep.Sandboxes) != 1 || rep.Sandboxes[0].ID != aFresh || !rep.Sandboxes[0].Removed {
		t.Fatalf("gc once the server stopped: %+v", rep)
	}
	sameLines(t, "host after the fresh leftover", hostState(a, b), without(held, []string{aFresh}, nil))

	// The running session is deleted: its sandbox goes, and with no
	// container left runsc's null-netns is unmounted too.
	run.Status = store.StatusDeleted
	if err := a.db.UpdateSession(context.Background(), run); err != nil {
		t.Fatal(err)
	}
	p, mounted := a.rt.NullNetns()
	rep = gcJSON(t, conf, a.dir, "--apply")
	if len(rep.Sandboxes) != 1 || rep.Sandboxes[0].ID != aRun || !rep.Sandboxes[0].Removed {
		t.Fatalf("gc of the deleted session: %+v", rep)
	}
	if mounted && (rep.NullNetns == nil || !rep.NullNetns.Removed) {
		t.Fatalf("null-netns not released: %+v", rep.NullNetns)
	}
	if _, still := a.rt.NullNetns(); still {
		t.Fatalf("%s still mounted", p)
	}
	if m := mountsBelow(a.dir); len(m) > 0 {
		t.Fatalf("mounts left under A: %v", m)
	}
	sameLines(t, "B at the end", hostState(b), bBefore)
	if code, out, _ := gcRunIn(t, conf, a.dir, "--apply"); code != 0 || !strings.Contains(out, "nothing to remove") {
		t.Fatalf("last run: %d\n%s", code, out)
	}
}

func hasLine(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
