package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/archive"
	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/store/objects"
)

// Saves: teardown packs a session's disk (its writable state) into its
// organization's storage as the object sessions/<pk>/disk-<generation>.tar.zst,
// records it on the session's row, and only then stops the sandbox, marks
// its local disk as a clean copy of that save (a cache) and deletes older
// generations. Resume uses the local disk when it is that clean copy, or
// newer than any save (it ran since: a teardown that did not finish);
// otherwise it restores the disk from the save. A crash at any step leaves
// the previous save or the new one recorded, and the local disk until the
// save is complete; Reconcile finishes an interrupted teardown (status
// stopping) by saving again from the disk.

// Storage is what the Manager needs from the organizations' storage
// (objects.Backend).
type Storage interface {
	Put(ctx context.Context, org, name string, r io.Reader) (objects.Info, error)
	Get(ctx context.Context, org, name string) (io.ReadCloser, objects.Info, error)
	Delete(ctx context.Context, org, name string) error
	List(ctx context.Context, org, prefix string) ([]objects.Info, error)
}

// Disks is what the Manager needs from the driver to save a sandbox's disk
// and get it back (runsc.Runtime).
type Disks interface {
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error
	SaveDisk(ctx context.Context, id string, w io.Writer) (archive.Stats, error)
	DiskCache(id string) (present bool, savedSHA256 string)
	MarkSaved(id, sha256 string) error
	RestoreDisk(ctx context.Context, id string, diskMiB int64, src io.Reader, sha256 string) (archive.Stats, error)
}

// saving reports whether teardown saves to storage.
func (m *Manager) saving() bool { return m.storage != nil && m.disks != nil }

func objectPrefix(pk string) string { return "sessions/" + pk + "/" }

func objectName(pk string, gen int64) string {
	return fmt.Sprintf("%sdisk-%d.tar.zst", objectPrefix(pk), gen)
}

// saveTimeout bounds one save or restore; it runs on the request's values,
// not its cancellation (a client that goes away does not undo it).
const saveTimeout = 30 * time.Minute

func saveContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), saveTimeout)
}

// orgSaveLock serialises an organization's saves, so its quota is checked
// and used in one step.
func (m *Manager) orgSaveLock(org string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.orgSaves[org]
	if l == nil {
		l = &sync.Mutex{}
		m.orgSaves[org] = l
	}
	return l
}

// hangAt is a test hook (SANDBOXD_TEST_HANG_AT, read at start): at the
// named step of a save or restore the operation writes
// <data-dir>/hang-<step> and blocks for good, so a test can kill -9 the
// server exactly there. Steps: save-frozen, save-writing, save-recorded,
// save-destroyed, restore-reading, restore-done; pause-frozen (image
// written, not yet admitted), pause-released, resume-loaded (before the
// restore), resume-restored; provision-inserted (the row, nothing made
// yet), provision-started (the sandbox runs, the row still says
// provisioning); the driver's create-mounted and create-created (package
// runsc). Empty in production.
var hangAt = os.Getenv("SANDBOXD_TEST_HANG_AT")

func (m *Manager) hang(step string) {
	if hangAt != step {
		return
	}
	os.WriteFile(filepath.Join(m.data, "hang-"+step), nil, 0o600)
	select {} // the test kills the process
}

// hangReader calls hang(step) once more than 1 MiB has passed.
type hangReader struct {
	r    io.Reader
	n    int64
	hang func()
}

func (h *hangReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if h.n += int64(n); h.n > 1<<20 && hangAt != "" {
		h.hang()
	}
	return n, err
}

var errQuota = errors.New("storage quota reached")

// quotaReader fails with errQuota once more than left bytes pass (left < 0:
// no cap).
type quotaReader struct {
	r    io.Reader
	left int64
}

func (q *quotaReader) Read(p []byte) (int, error) {
	n, err := q.r.Read(p)
	if q.left >= 0 {
		if q.left -= int64(n); q.left < 0 {
			return n, errQuota
		}
	}
	return n, err
}

// errDiskFloor: a save was stopped to keep the data dir's free space above
// limits.minFreeDiskMiB.
var errDiskFloor = errors.New("the data dir's free space reached limits.minFreeDiskMiB")

// floorEvery is how many bytes of a save pass between two looks at the
// free space (a statfs): a look lets the next floorEvery bytes through
// only with twice that much room above the floor, so a save never takes
// the floor itself (a read is cut to floorEvery).
const floorEvery = 4 << 20

// floorReader fails with errDiskFloor before the bytes it passes (which
// its caller writes to the data dir's file system, where file systems
// count a buffered write as used at once) would take the free space below
// floor. The first Read looks too.
type floorReader struct {
	r      io.Reader
	free   func() int64 // -1: unknown, nothing is refused
	floor  int64
	since  int64 // bytes passed since the last look
	n      int64 // bytes passed
	looked bool
}

func (f *floorReader) Read(p []byte) (int, error) {
	if !f.looked || f.since >= floorEvery {
		if free := f.free(); free >= 0 && free-2*floorEvery < f.floor {
			return 0, errDiskFloor
		}
		f.looked, f.since = true, 0
	}
	if len(p) > floorEvery {
		p = p[:floorEvery]
	}
	n, err := f.r.Read(p)
	f.since += int64(n)
	f.n += int64(n)
	return n, err
}

// saveFloor is the free space a save keeps on the data dir's file system
// (where storage is): limits.minFreeDiskMiB, below which starts are
// refused too; 0: none.
func (m *Manager) saveFloor() int64 { return int64(m.lim.MinFreeDiskMiB) << 20 }

// errSaveNoRoom is the public error of a save refused or stopped for the
// data dir's free space (free, now: a stopped save's temp file is gone);
// written is what the stopped save could write. What a save takes is not
// known before it is written (the pack is compressed: a disk of zeros or
// text packs to little), so a save is refused up front only when even its
// first bytes would not fit; otherwise floorReader stops it.
func (m *Manager) errSaveNoRoom(free, written int64) error {
	floor, free := m.saveFloor()>>20, max(free, 0)>>20
	if written < 0 {
		return errdefs.Unavailable("the server is low on disk space: %d MiB are free of which %d MiB are kept free, too little to save this session; "+
			"the session keeps its data (a running session runs on), retry the teardown later", free, floor)
	}
	return errdefs.Unavailable("the server is low on disk space: this session's save needs more than the %d MiB it could write (%d MiB are free of which %d MiB are kept free); "+
		"the session keeps its data (a running session runs on), retry the teardown later", written>>20, free, floor)
}

// saveFits refuses a save that could not write anything above the floor,
// before the sandbox is frozen for it.
func (m *Manager) saveFits(ses *store.Session) error {
	floor := m.saveFloor()
	if free := m.dataFree(); floor > 0 && free >= 0 && free-2*floorEvery < floor {
		m.events.Event(ses.ID, "save_failed", map[string]any{"reason": "disk"})
		return m.errSaveNoRoom(free, -1)
	}
	return nil
}

// syncSandbox asks a running sandbox to write what its kernel (gVisor's
// sentry) holds back to the host's file system.
func (m *Manager) syncSandbox(ctx context.Context, ses *store.Session) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := m.rt.Exec(sctx, ses.ContainerID, runsc.ExecRequest{Args: []string{"/bin/sync"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/",
		Stdout: io.Discard, Stderr: io.Discard, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 {
		m.log.Warn("sync before save", "session", ses.SessionID, "exit", res.ExitCode, "err", err)
	}
}

// saveLocked packs the session's disk into its organization's storage as
// the next generation and records it on the row. With live, the sandbox
// runs: it is synced and frozen first and left frozen (the caller thaws it
// if the save fails, or destroys it). Older generations stay until
// dropOldSavesLocked. A quota that would be passed is errdefs.ErrNoSpace; the caller checks saveFits first.
// The stats are the pack's (Usage: the disk space of each saved part).
func (m *Manager) saveLocked(ctx context.Context, ses *store.Session, live bool) (archive.Stats, error) {
	ctx, cancel := saveContext(ctx)
	defer cancel()
	var syncMs, freezeMs int64
	if live {
		t0 := time.Now()
		m.syncSandbox(ctx, ses)
		t1 := time.Now()
		if err := m.disks.Freeze(ctx, ses.ContainerID); err != nil {
			return archive.Stats{}, fmt.Errorf("freeze: %w", err)
		}
		syncMs, freezeMs = t1.Sub(t0).Milliseconds(), time.Since(t1).Milliseconds()
		m.hang("save-frozen")
	}
	mu := m.orgSaveLock(ses.OrgID)
	mu.Lock()
	defer mu.Unlock()
	left := int64(-1)
	var others int64
	quota := m.storageQuota(ctx, ses.OrgID)
	if quota > 0 {
		list, err := m.storage.List(ctx, ses.OrgID, "")
		if err != nil {
			return archive.Stats{}, fmt.Errorf("list storage: %w", err)
		}
		for _, o := range list {
			if !strings.HasPrefix(o.Name, objectPrefix(ses.ID)) { // this session's are replaced
				others += o.Size
			}
		}
		images, err := m.pausedImagesBytes(ctx, ses.OrgID, ses.ID) // the quota counts paused sessions' memory too
		if err != nil {
			return archive.Stats{}, err
		}
		others += images
		left = max(quota-others, 0)
	}
	gen := ses.Saved.Generation + 1
	name := objectName(ses.ID, gen)
	start := time.Now()
	pr, pw := io.Pipe()
	packed := make(chan archive.Stats, 1)
	go func() { // ends when SaveDisk does: Put reads until EOF, or closes pr
		st, err := m.disks.SaveDisk(ctx, ses.ContainerID, pw)
		pw.CloseWithError(err)
		packed <- st
	}()
	src := io.Reader(&quotaReader{r: pr, left: left})
	fr := &floorReader{r: src, free: m.dataFree, floor: m.saveFloor()}
	if fr.floor > 0 { // storage is on the data dir's file system
		src = fr
	}
	if hangAt != "" {
		src = &hangReader{r: src, hang: func() { m.hang("save-writing") }}
	}
	info, err := m.storage.Put(ctx, ses.OrgID, name, src)
	pr.CloseWithError(errors.New("save aborted"))
	st := <-packed
	if errors.Is(err, errQuota) {
		m.events.Event(ses.ID, "save_failed", map[string]any{"reason": "quota"})
		return st, errdefs.NoSpace("saving this session would pass your organization's storage quota (%d MiB; %d MiB used by other sessions' saves); "+
			"the session keeps its data: delete sessions you no longer need and retry the teardown", quota>>20, others>>20)
	}
	if errors.Is(err, errDiskFloor) {
		m.events.Event(ses.ID, "save_failed", map[string]any{"reason": "disk"})
		return st, m.errSaveNoRoom(m.dataFree(), fr.n)
	}
	if err != nil {
		m.events.Event(ses.ID, "save_failed", nil)
		return st, fmt.Errorf("save: %w", err)
	}
	now := m.now()
	sv := store.Saved{Object: name, Bytes: info.Size, SHA256: info.SHA256, At: &now, Generation: gen}
	if err := m.db.SetSaved(ctx, ses.ID, sv); err != nil {
		if derr := m.storage.Delete(ctx, ses.OrgID, name); derr != nil {
			m.log.Warn("drop unrecorded save", "session", ses.SessionID, "err", derr)
		}
		return st, err
	}
	ses.Saved = sv
	m.hang("save-recorded")
	ev := map[string]any{"bytes": info.Size, "files": st.Files, "dataBytes": st.Bytes,
		"generation": gen, "ms": time.Since(start).Milliseconds(), "syncMs": syncMs, "freezeMs": freezeMs}
	if st.XattrsSkipped > 0 { // attributes the save format cannot carry (a name with '=')
		ev["xattrsSkipped"] = st.XattrsSkipped
		m.log.Warn("save left out extended attributes it cannot encode", "session", ses.SessionID, "count", st.XattrsSkipped)
	}
	m.events.Event(ses.ID, "saved", ev)
	return st, nil
}

// dropOldSavesLocked deletes every object of the session but its recorded
// save (older generations, a save a crash left unrecorded).
func (m *Manager) dropOldSavesLocked(ctx context.Context, ses *store.Session) error {
	list, err := m.storage.List(ctx, ses.OrgID, objectPrefix(ses.ID))
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range list {
		if o.Name != ses.Saved.Object {
			errs = append(errs, m.storage.Delete(ctx, ses.OrgID, o.Name))
		}
	}
	return errors.Join(errs...)
}

// prepareDiskLocked makes sure a stopped session's sandbox has its disk
// before it starts again or its files are read: the local disk when it is
// a clean copy of the recorded save or newer than any save, else the save
// restored (verified) from storage.
func (m *Manager) prepareDiskLocked(ctx context.Context, ses *store.Session) error {
	if !m.saving() || ses.Saved.Object == "" {
		return nil
	}
	present, sum := m.disks.DiskCache(ses.ContainerID)
	if present && (sum == "" || sum == ses.Saved.SHA256) {
		return nil
	}
	// A restore writes the whole disk to the data dir: refused below
	// limits.minFreeDiskMiB, as a start is (a read of a stopped session's
	// files restores too).
	if err := m.checkDiskFree(); err != nil {
		return err
	}
	ctx, cancel := saveContext(ctx)
	defer cancel()
	start := time.Now()
	rc, info, err := m.storage.Get(ctx, ses.OrgID, ses.Saved.Object)
	switch {
	case errors.Is(err, objects.ErrCorrupt):
		m.events.Event(ses.ID, "restore_failed", map[string]any{"reason": "damaged"})
		return errSaveDamaged.WithCause(err)
	case errors.Is(err, objects.ErrNotFound) && !present:
		return errDiskLost
	case err != nil:
		return fmt.Errorf("open save: %w", err)
	}
	defer rc.Close()
	if info.SHA256 != ses.Saved.SHA256 {
		m.events.Event(ses.ID, "restore_failed", map[string]any{"reason": "damaged"})
		return errSaveDamaged.WithCause(fmt.Errorf("save %s: checksum %s, recorded %s", ses.Saved.Object, info.SHA256, ses.Saved.SHA256))
	}
	src := io.Reader(rc)
	if hangAt != "" {
		src = &hangReader{r: src, hang: func() { m.hang("restore-reading") }}
	}
	st, err := m.disks.RestoreDisk(ctx, ses.ContainerID, int64(ses.DiskMiB), src, ses.Saved.SHA256)
	if err != nil {
		// Unpacking damaged bytes may fail before the checksum at the end
		// is reached: the save is read through once more to tell.
		if errors.Is(err, objects.ErrCorrupt) || m.saveDamaged(ctx, ses) {
			m.events.Event(ses.ID, "restore_failed", map[string]any{"reason": "damaged"})
			return errSaveDamaged.WithCause(err)
		}
		m.events.Event(ses.ID, "restore_failed", nil)
		return err
	}
	m.events.Event(ses.ID, "restored", map[string]any{"bytes": info.Size, "files": st.Files, "generation": ses.Saved.Generation,
		"ms": time.Since(start).Milliseconds()})
	return nil
}

// errSaveDamaged: the session's save does not match its checksum (or its
// record) and the node has no copy of its disk. The save is kept as it is:
// an operator may recover files from it; deleting the session drops it.
var errSaveDamaged = errdefs.Conflict("the session's saved workspace is damaged (it does not match its checksum) and this server has no other copy of its disk, so it cannot be restored; the damaged save is kept as it is (delete the session to drop it)")

// saveDamaged reads the session's save through and reports whether it
// fails its checksum.
func (m *Manager) saveDamaged(ctx context.Context, ses *store.Session) bool {
	rc, _, err := m.storage.Get(ctx, ses.OrgID, ses.Saved.Object)
	if err != nil {
		return errors.Is(err, objects.ErrCorrupt)
	}
	defer rc.Close()
	_, err = io.Copy(io.Discard, rc)
	return errors.Is(err, objects.ErrCorrupt)
}

// EnsureDiskLocked gives a stopped or failed session's sandbox its disk
// (restored from its save when the node has none), for reading its files.
// The caller holds the session's lock (Use).
func (m *Manager) EnsureDiskLocked(ctx context.Context, ses *store.Session) error {
	if ses.Status != store.StatusStopped && ses.Status != store.StatusFailed {
		return nil
	}
	if err := m.prepareDiskLocked(ctx, ses); err != nil {
		m.log.Error("restore for files", "session", ses.SessionID, "err", err)
		if pe, ok := errdefs.Public(err); ok {
			return pe // damaged, or lost
		}
		if f := HostFault(err, "its files cannot be read now"); f != nil {
			return f
		}
		return errdefs.Unavailable("the session's saved workspace could not be restored; retry later")
	}
	return nil
}

// deleteSavesLocked removes every object of a session (delete).
func (m *Manager) deleteSavesLocked(ctx context.Context, ses *store.Session) error {
	if m.storage == nil {
		return nil
	}
	keep := ses.Saved
	ses.Saved = store.Saved{}
	err := m.dropOldSavesLocked(ctx, ses)
	ses.Saved = keep
	return err
}

// finishInterruptedSaveLocked completes the save of a teardown a crash
// interrupted (the sandbox destroyed, its disk kept): unless the disk is
// already marked as the recorded save, it is saved again from the disk. If
// that fails the session still stops: its local disk, newer than any save,
// is what a resume uses.
func (m *Manager) finishInterruptedSaveLocked(ctx context.Context, ses *store.Session) {
	if !m.saving() {
		return
	}
	// A disk with a marker is a clean copy of a save (the recorded one, or
	// one older than a save made elsewhere): nothing newer to save.
	if present, sum := m.disks.DiskCache(ses.ContainerID); present && sum == "" {
		if err := m.saveFits(ses); err != nil {
			m.log.Error("reconcile: save", "session", ses.SessionID, "err", err)
			return
		}
		if _, err := m.saveLocked(ctx, ses, false); err != nil {
			m.log.Error("reconcile: save", "session", ses.SessionID, "err", err)
			return
		}
		m.finishSaveLocked(ctx, ses)
		return
	}
	if err := m.dropOldSavesLocked(ctx, ses); err != nil { // a save a crash left unrecorded
		m.log.Warn("reconcile: drop old saves", "session", ses.SessionID, "err", err)
	}
}
