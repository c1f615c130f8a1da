package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"sandboxd/runsc"
	"sandboxd/runsc/archive"
	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/store/objects"
)

const mib = 1 << 20

// The one to stop is the one that grew the most, not the biggest; small
// and negative growth never counts; an emergency stops every grower.
func TestDiskVictims(t *testing.T) {
	pks := func(v []diskSample) string {
		var out []string
		for _, s := range v {
			out = append(out, s.pk)
		}
		return strings.Join(out, ",")
	}
	samples := []diskSample{
		{pk: "big-idle", bytes: 6000 * mib, grew: 0},
		{pk: "writer", bytes: 900 * mib, grew: 500 * mib},
		{pk: "slow", bytes: 3000 * mib, grew: 100 * mib},
		{pk: "logs", bytes: 50 * mib, grew: 63 * mib},
		{pk: "cleaner", bytes: 10 * mib, grew: -2000 * mib},
	}
	cases := []struct {
		name      string
		samples   []diskSample
		emergency bool
		want      string
	}{
		{"the grower, not the biggest", samples, false, "writer"},
		{"emergency: every grower, most first", samples, true, "writer,slow"},
		{"equal growth: the biggest", []diskSample{{pk: "a", bytes: 100 * mib, grew: 80 * mib}, {pk: "b", bytes: 200 * mib, grew: 80 * mib}}, false, "b"},
		{"nobody grew enough", []diskSample{{pk: "a", bytes: 9000 * mib, grew: diskMinGrowth - 1}}, false, ""},
		{"exactly enough", []diskSample{{pk: "a", bytes: 9000 * mib, grew: diskMinGrowth}}, false, "a"},
		{"none", nil, true, ""},
	}
	for _, c := range cases {
		if got := pks(diskVictims(c.samples, c.emergency)); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// diskEnv is a Manager whose data dir's free space, page cache and
// sandboxes' disks are inputs.
type diskEnv struct {
	*env
	free, dirty atomic.Int64
}

func newDiskEnv(t *testing.T) *diskEnv {
	e := &diskEnv{env: newEnv(t, func(c *config.Config) {
		c.Limits.MinFreeDiskMiB, c.Limits.PressureFreeDiskMiB = 1024, 4096
	})}
	e.free.Store(100_000 * mib)
	e.m.dataFree = e.free.Load
	e.m.hostDirty = e.dirty.Load
	return e
}

func (e *diskEnv) setDisk(id string, host, pending int64) {
	ses, err := e.m.Get(context.Background(), e.p.Org.ID, id)
	if err != nil {
		e.t.Fatal(err)
	}
	e.rt.SetDisk(ses.ContainerID, runsc.DiskUse{Host: host, Pending: pending})
}

func (e *diskEnv) look() {
	e.m.watchDisk(context.Background())
	e.m.idleWG.Wait()
}

func (e *diskEnv) get(id string) store.Session {
	ses, err := e.m.Get(context.Background(), e.p.Org.ID, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return ses
}

// Below the floor the sandbox whose disk grows is stopped (disk kept,
// reason, event, audit), not the bigger one that does not grow nor a
// bystander; it resumes while there is more than minFreeDiskMiB free.
func TestDiskPressureStopsTheGrower(t *testing.T) {
	e := newDiskEnv(t)
	ctx := context.Background()
	for _, id := range []string{"big", "writer", "bystander"} {
		e.provision(id, 0)
	}
	e.setDisk("big", 5000*mib, 0)
	e.setDisk("writer", 100*mib, 0)
	e.setDisk("bystander", 10*mib, 0)

	// Plenty of space: nothing happens, no disk is even read.
	e.look()
	if e.m.disk.base != nil {
		t.Fatal("above the floor, the watcher keeps growth")
	}
	// Free space above the floor, but the writer has more than the
	// difference on its way: that counts.
	e.free.Store(4500 * mib)
	e.dirty.Store(2000 * mib)
	e.setDisk("writer", 100*mib, 1000*mib)
	e.look() // growth counts from here
	if len(e.m.disk.base) != 3 {
		t.Fatalf("bases: %v", e.m.disk.base)
	}
	e.setDisk("writer", 900*mib, 400*mib) // written back, and more
	e.setDisk("big", 5000*mib, 30*mib)    // a little
	e.look()
	for id, want := range map[string]string{"big": store.StatusRunning, "writer": store.StatusStopped, "bystander": store.StatusRunning} {
		if got := e.get(id); got.Status != want {
			t.Errorf("%s: %s, want %s", id, got.Status, want)
		}
	}
	w := e.get("writer")
	if w.StatusReason != ReasonDiskPressure || w.StoppedAt == nil {
		t.Fatalf("stopped writer: %+v", w)
	}
	if got := e.rt.CallsWith("destroy " + w.ContainerID); len(got) != 1 || !strings.Contains(got[0], "keep=true") {
		t.Fatalf("destroy: %v", got)
	}
	if !strings.Contains(e.hooks.list(), "event disk_pressure") {
		t.Fatalf("no disk_pressure event: %s", e.hooks.list())
	}
	e.db.FlushAudit(ctx)
	recs, err := e.db.ListAudit(ctx, store.AuditFilter{OrgID: e.p.Org.ID, Action: "sandbox.disk_pressure_stop"})
	if err != nil || len(recs) != 1 || recs[0].UserID != "system" || recs[0].SessionID != "writer" || recs[0].Outcome != "ok" ||
		recs[0].Details["grewBytes"] != float64(200*mib) {
		t.Fatalf("audit: %+v %v", recs, err)
	}
	// Nobody else grows: nobody else is stopped.
	e.look()
	if e.get("big").Status != store.StatusRunning || e.get("bystander").Status != store.StatusRunning {
		t.Fatal("a session that did not grow was stopped")
	}

	// Below minFreeDiskMiB a resume is refused; above it, it works even
	// under the floor (to delete files), and the reason goes.
	e.free.Store(900 * mib)
	e.dirty.Store(0)
	if _, err := e.m.Resume(ctx, e.p.Org.ID, "writer"); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "low on disk space") {
		t.Fatalf("resume below minFreeDiskMiB: %v", err)
	}
	if got := e.get("writer"); got.Status != store.StatusStopped || got.StatusReason != ReasonDiskPressure {
		t.Fatalf("after a refused resume: %+v", got)
	}
	e.free.Store(2000 * mib)
	ses, err := e.m.Resume(ctx, e.p.Org.ID, "writer")
	if err != nil || ses.Status != store.StatusRunning || ses.StatusReason != "" {
		t.Fatalf("resume under the floor: %+v %v", ses, err)
	}
	// Its growth counts from its first look after the resume.
	e.look()
	e.setDisk("writer", 200*mib, 0) // deleted its files: shrinks
	e.look()
	if e.get("writer").Status != store.StatusRunning {
		t.Fatal("a shrinking disk was stopped")
	}
	// Space again: the watcher forgets.
	e.free.Store(50_000 * mib)
	e.look()
	if e.m.disk.base != nil {
		t.Fatal("above the floor again, growth is kept")
	}
}

// Below minFreeDiskMiB every sandbox that grew is stopped at once; one
// that grew too little runs on.
func TestDiskPressureEmergency(t *testing.T) {
	e := newDiskEnv(t)
	for _, id := range []string{"a", "b", "c"} {
		e.provision(id, 0)
		e.setDisk(id, 100*mib, 0)
	}
	e.free.Store(3000 * mib)
	e.look()
	e.free.Store(800 * mib)
	e.setDisk("a", 300*mib, 0)
	e.setDisk("b", 200*mib, 100*mib)
	e.setDisk("c", 110*mib, 0)
	e.look()
	for id, want := range map[string]string{"a": store.StatusStopped, "b": store.StatusStopped, "c": store.StatusRunning} {
		if got := e.get(id); got.Status != want {
			t.Errorf("%s: %s, want %s", id, got.Status, want)
		}
	}
}

// limits.pressureFreeDiskMiB 0 turns the watcher off.
func TestDiskPressureOff(t *testing.T) {
	e := newDiskEnv(t)
	e.m.lim.PressureFreeDiskMiB = 0
	e.provision("w", 0)
	e.free.Store(2000 * mib)
	e.setDisk("w", 100*mib, 0)
	e.look()
	e.setDisk("w", 1100*mib, 0)
	e.look()
	if e.get("w").Status != store.StatusRunning || e.m.disk.base != nil {
		t.Fatal("the watcher acted while off")
	}
}

// saveRecorder is a storage and a disk driver that record saves.
type saveRecorder struct {
	mu    sync.Mutex
	saved []string // container ids
}

func (r *saveRecorder) Put(ctx context.Context, org, name string, src io.Reader) (objects.Info, error) {
	n, err := io.Copy(io.Discard, src)
	return objects.Info{Name: name, Size: n, SHA256: "00"}, err
}
func (r *saveRecorder) Get(ctx context.Context, org, name string) (io.ReadCloser, objects.Info, error) {
	return nil, objects.Info{}, objects.ErrNotFound
}
func (r *saveRecorder) Delete(ctx context.Context, org, name string) error { return nil }
func (r *saveRecorder) List(ctx context.Context, org, prefix string) ([]objects.Info, error) {
	return nil, nil
}
func (r *saveRecorder) Freeze(ctx context.Context, id string) error { return nil }
func (r *saveRecorder) Thaw(ctx context.Context, id string) error   { return nil }
func (r *saveRecorder) SaveDisk(ctx context.Context, id string, w io.Writer) (archive.Stats, error) {
	r.mu.Lock()
	r.saved = append(r.saved, id)
	r.mu.Unlock()
	_, err := w.Write([]byte("disk"))
	return archive.Stats{}, err
}
func (r *saveRecorder) DiskCache(id string) (bool, string) { return true, "" }
func (r *saveRecorder) MarkSaved(id, sha256 string) error  { return nil }
func (r *saveRecorder) RestoreDisk(ctx context.Context, id string, diskMiB int64, src io.Reader, sha256 string) (archive.Stats, error) {
	return archive.Stats{}, nil
}

// A disk pressure stop that a crash interrupted is finished at the next
// start without the save it never meant to write (the data dir is short
// of space); an interrupted teardown is saved as before.
func TestDiskPressureStopFinishedUnsaved(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for id, reason := range map[string]string{"dp": ReasonDiskPressure, "td": ""} {
		ses := e.provision(id, 0)
		ses.Status, ses.StatusReason = store.StatusStopping, reason
		if err := e.db.UpdateSession(ctx, &ses); err != nil {
			t.Fatal(err)
		}
	}
	rec := &saveRecorder{}
	m2 := New(Options{Limits: e.cfg.Limits, DataDir: e.cfg.DataDir, Runtime: &deadRuntime{e.rt, ""}, Store: e.db,
		Egress: e.m.egress, Policy: e.m.policy, Events: e.hooks, Hooks: e.hooks, Rules: e.m.scrub.base,
		Log: slog.New(slog.DiscardHandler), Now: e.clock, Storage: rec, Disks: rec})
	if err := m2.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	get := func(id string) store.Session {
		ses, err := e.m.Get(ctx, e.p.Org.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		return ses
	}
	dp, td := get("dp"), get("td")
	if dp.Status != store.StatusStopped || dp.StatusReason != ReasonDiskPressure || td.Status != store.StatusStopped {
		t.Fatalf("after reconcile: %s %s, %s", dp.Status, dp.StatusReason, td.Status)
	}
	if len(rec.saved) != 1 || rec.saved[0] != td.ContainerID {
		t.Fatalf("saved %v, want only %s", rec.saved, td.ContainerID)
	}
}

// A pause whose memory image would take the free space below the disk
// watcher's floor is refused before anything is frozen; the session runs
// on, and pauses once there is room.
func TestPauseNeedsRoomForItsImage(t *testing.T) {
	e := newDiskEnv(t)
	ctx := context.Background()
	e.provision("p", 0)
	e.free.Store(4096*mib + 5*mib) // the fake's sandbox uses 11 MiB
	_, err := e.m.Pause(ctx, e.p.Org.ID, "p")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "needs about 11 MiB") || !strings.Contains(err.Error(), "keeps running") {
		t.Fatalf("pause on a nearly full disk: %v", err)
	}
	if got := e.get("p"); got.Status != store.StatusRunning {
		t.Fatalf("after a refused pause: %s", got.Status)
	}
	if c := e.rt.CallsWith("checkpoint "); len(c) > 0 {
		t.Fatalf("checkpointed anyway: %v", c)
	}
	e.free.Store(4096*mib + 12*mib)
	if p, err := e.m.Pause(ctx, e.p.Org.ID, "p"); err != nil || p.Status != store.StatusPaused {
		t.Fatalf("pause with room: %+v %v", p, err)
	}
}
