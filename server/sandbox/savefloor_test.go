package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"sandboxd/runsc/archive"
	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/store/objects"
)

// fillingStorage is storage on the data dir's file system: what a Put
// writes is taken from the fake free space (given back when it fails: the
// temp file is removed), the least free space seen recorded. Its disks
// pack size bytes that do not compress.
type fillingStorage struct {
	saveRecorder
	free   *atomic.Int64
	size   int64
	low    atomic.Int64
	mu     sync.Mutex
	freeze int
	thaw   int
	lost   atomic.Bool // the node has no disk
}

func (f *fillingStorage) DiskCache(id string) (bool, string) { return !f.lost.Load(), "" }

func (f *fillingStorage) Put(ctx context.Context, org, name string, src io.Reader) (objects.Info, error) {
	buf := make([]byte, 1<<20) // as objects.Dir copies
	var n int64
	for {
		k, err := src.Read(buf)
		n += int64(k)
		if now := f.free.Add(-int64(k)); now < f.low.Load() {
			f.low.Store(now)
		}
		if err == io.EOF {
			return objects.Info{Name: name, Size: n, SHA256: "00"}, nil
		}
		if err != nil {
			f.free.Add(n)
			return objects.Info{}, fmt.Errorf("put %s: %w", name, err)
		}
	}
}

func (f *fillingStorage) SaveDisk(ctx context.Context, id string, w io.Writer) (archive.Stats, error) {
	chunk := bytes.Repeat([]byte{0xa5}, 256<<10)
	for left := f.size; left > 0; left -= int64(len(chunk)) {
		if _, err := w.Write(chunk[:min(left, int64(len(chunk)))]); err != nil {
			return archive.Stats{}, err
		}
	}
	return archive.Stats{}, nil
}

func (f *fillingStorage) Freeze(ctx context.Context, id string) error {
	f.mu.Lock()
	f.freeze++
	f.mu.Unlock()
	return nil
}

func (f *fillingStorage) Thaw(ctx context.Context, id string) error {
	f.mu.Lock()
	f.thaw++
	f.mu.Unlock()
	return nil
}

func newFillingEnv(t *testing.T, size int64) (*diskEnv, *fillingStorage) {
	e := newDiskEnv(t) // minFreeDiskMiB 1024
	f := &fillingStorage{free: &e.free, size: size}
	e.m.storage, e.m.disks = f, f
	return e, f
}

// A teardown whose save would take the data dir below minFreeDiskMiB is
// stopped before it does: the same clear 503 as a full disk, the session
// running on (thawed) with its data, the space given back; with room the
// same teardown saves.
func TestSaveKeepsTheDiskFloor(t *testing.T) {
	ctx := context.Background()
	e, f := newFillingEnv(t, 300*mib)
	e.provision("s", 0)
	floor := int64(e.cfg.Limits.MinFreeDiskMiB) * mib
	start := floor + 100*mib
	e.free.Store(start)
	f.low.Store(start)
	_, _, err := e.m.Teardown(ctx, e.p.Org.ID, "s")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "low on disk space: this session's save needs more than the 9") ||
		!strings.Contains(err.Error(), "1124 MiB are free of which 1024 MiB are kept free") || !strings.Contains(err.Error(), "keeps its data") {
		t.Fatalf("teardown over the floor: %v", err)
	}
	if _, ok := errdefs.Public(err); !ok {
		t.Fatalf("not a public error: %v", err)
	}
	if got := e.get("s"); got.Status != store.StatusRunning || got.Saved.Object != "" {
		t.Fatalf("after a stopped save: %s %+v", got.Status, got.Saved)
	}
	if low := f.low.Load(); low < floor || low > floor+16*mib {
		t.Fatalf("least free %d MiB, floor %d MiB", low/mib, floor/mib)
	}
	if e.free.Load() != start || f.freeze != 1 || f.thaw != 1 {
		t.Fatalf("free %d MiB (was %d), freeze %d thaw %d", e.free.Load()/mib, start/mib, f.freeze, f.thaw)
	}
	if !strings.Contains(e.hooks.list(), "event save_failed") {
		t.Fatalf("events: %s", e.hooks.list())
	}
	e.free.Store(floor + 400*mib)
	f.low.Store(e.free.Load())
	if ses, res, err := e.m.Teardown(ctx, e.p.Org.ID, "s"); err != nil || ses.Status != store.StatusStopped || res.SavedBytes != 300*mib {
		t.Fatalf("teardown with room: %s %+v %v", ses.Status, res, err)
	}
	if low := f.low.Load(); low != floor+100*mib {
		t.Fatalf("least free with room: %d MiB", low/mib)
	}
}

// With no room for even the first bytes the save is refused before the
// sandbox is frozen; so is the save a restart's reconcile would finish.
func TestSaveRefusedWithoutRoom(t *testing.T) {
	ctx := context.Background()
	e, f := newFillingEnv(t, 1*mib)
	e.provision("s", 0)
	e.free.Store(int64(e.cfg.Limits.MinFreeDiskMiB)*mib + 5*mib)
	_, _, err := e.m.Teardown(ctx, e.p.Org.ID, "s")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "1029 MiB are free of which 1024 MiB are kept free, too little") {
		t.Fatalf("teardown without room: %v", err)
	}
	if got := e.get("s"); got.Status != store.StatusRunning || f.freeze != 0 {
		t.Fatalf("after a refused save: %s, frozen %d times", got.Status, f.freeze)
	}
}

// floorReader: a look every floorEvery bytes, none of them taking the free
// space below the floor; an unknown free space refuses nothing.
func TestFloorReader(t *testing.T) {
	var free atomic.Int64
	free.Store(100 * mib)
	r := &floorReader{r: bytes.NewReader(make([]byte, 200*mib)), free: free.Load, floor: 50 * mib}
	buf := make([]byte, 16<<20) // cut to floorEvery
	var n int64
	var err error
	for err == nil {
		var k int
		k, err = r.Read(buf)
		n += int64(k)
		free.Add(-int64(k))
		if free.Load() < 50*mib {
			t.Fatalf("free %d below the floor after %d bytes", free.Load(), n)
		}
	}
	if !errors.Is(err, errDiskFloor) || n < 40*mib {
		t.Fatalf("after %d MiB: %v", n/mib, err)
	}
	r = &floorReader{r: bytes.NewReader(make([]byte, 20*mib)), free: func() int64 { return -1 }, floor: 50 * mib}
	if k, err := io.Copy(io.Discard, r); k != 20*mib || err != nil {
		t.Fatalf("unknown free space: %d %v", k, err)
	}
}

// A restore (here: to read a stopped session's files when the node lost
// its disk) is refused below minFreeDiskMiB, as a start is.
func TestRestoreNeedsTheDiskFloor(t *testing.T) {
	ctx := context.Background()
	e, f := newFillingEnv(t, 1*mib)
	e.provision("s", 0)
	if _, _, err := e.m.Teardown(ctx, e.p.Org.ID, "s"); err != nil {
		t.Fatal(err)
	}
	f.lost.Store(true)
	ensure := func() error {
		return e.m.Use(ctx, e.p.Org.ID, "s", true, func(ses *store.Session) error { return e.m.EnsureDiskLocked(ctx, ses) })
	}
	e.free.Store(int64(e.cfg.Limits.MinFreeDiskMiB)*mib - 1)
	if err := ensure(); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "low on disk space") {
		t.Fatalf("restore below the floor: %v", err)
	}
	e.free.Store(int64(e.cfg.Limits.MinFreeDiskMiB) * mib)
	if err := ensure(); err != errDiskLost { // the fake storage has nothing to restore
		t.Fatalf("restore with room: %v", err)
	}
}
