package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/store"
)

// Pause with memory: a running session's sandbox is checkpointed (memory
// and processes) into its checkpoint image and its compute released; a
// resume restores it, so processes, terminals and code contexts go on
// where they were. A checkpoint that fails leaves the sandbox running.
//
//	running -> paused                 (pause; capacity, egress listener and credits stop)
//	paused  -> provisioning -> running (resume: restore, or a cold start on the disk if the image fails)
//	paused  -> stopping -> stopped     (teardown drops the image, keeps the disk)
//	paused  -> deleted                 (delete drops both)

// Checkpoint images stay on the node, in the sandbox's directory
// (Runtime.CheckpointDir, 0700): an image restores only onto the exact
// disk it was taken with, which is the node's disk.img (a pause does not
// save the disk), so a copy in storage could not be resumed anywhere else
// and would cost a second write of up to the sandbox's memory. They count
// against the organization's storage quota with its saves (507 at the
// pause, which then leaves the sandbox running). An image is usable once
// its marker (imageMarker) is written: after runsc wrote every file and
// the quota admitted it, before the sandbox is released.

// imageMarker is the file that marks a checkpoint image complete.
const imageMarker = "complete"

func (m *Manager) imageDir(ses *store.Session) string { return m.rt.CheckpointDir(ses.ContainerID) }

// imageComplete reports whether the session's checkpoint image was fully
// written and admitted (a pause that finished, or got past its commit).
func (m *Manager) imageComplete(ses *store.Session) bool {
	_, err := os.Stat(filepath.Join(m.imageDir(ses), imageMarker))
	return err == nil
}

// dirBytes is the space the files directly in dir take.
func dirBytes(dir string) int64 {
	ents, _ := os.ReadDir(dir)
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// pausedImagesBytes is what the checkpoint images of an organization's
// paused sessions (but except) take on the node.
func (m *Manager) pausedImagesBytes(ctx context.Context, org, except string) (int64, error) {
	list, err := m.db.ListSessions(ctx, org, store.StatusPaused)
	if err != nil {
		return 0, err
	}
	var n int64
	for i := range list {
		if list[i].ID != except {
			n += dirBytes(m.rt.CheckpointDir(list[i].ContainerID))
		}
	}
	return n, nil
}

// keepImageLocked admits a complete checkpoint image (the checkpoint's
// commit, while the sandbox is frozen): within the organization's quota
// (with its saves and other paused sessions' images) it is marked
// complete; over it, errdefs.ErrNoSpace and the sandbox runs on.
func (m *Manager) keepImageLocked(ctx context.Context, ses *store.Session, dir string) error {
	m.hang("pause-frozen")
	size := dirBytes(dir)
	mu := m.orgSaveLock(ses.OrgID)
	mu.Lock()
	defer mu.Unlock()
	if quota := m.storageQuota(ctx, ses.OrgID); quota > 0 {
		used, err := m.pausedImagesBytes(ctx, ses.OrgID, ses.ID)
		if err != nil {
			return err
		}
		if m.storage != nil {
			list, err := m.storage.List(ctx, ses.OrgID, "")
			if err != nil {
				return fmt.Errorf("list storage: %w", err)
			}
			for _, o := range list {
				used += o.Size
			}
		}
		if used+size > quota {
			m.events.Event(ses.ID, "pause_failed", map[string]any{"reason": "quota", "imageBytes": size})
			return errdefs.NoSpace("pausing this session needs %d MiB for its memory image, which would pass your organization's storage quota "+
				"(%d MiB; %d MiB used by saves and paused sessions); the session keeps running: delete sessions you no longer need, or tear it down instead",
				(size+1<<20-1)>>20, quota>>20, used>>20)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, imageMarker), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "%d\n", size)
	return f.Sync()
}

// imageFits refuses a pause whose memory image (about the memory the
// sandbox uses) would take the data dir's free space below the disk
// watcher's floor (limits.pressureFreeDiskMiB, else minFreeDiskMiB): the
// image would otherwise make the watcher stop running sandboxes, or fill
// the disk the database is on.
func (m *Manager) imageFits(ses *store.Session) error {
	free := m.dataFree()
	if free < 0 {
		return nil
	}
	need := int64(ses.MemoryMiB) << 20
	if u, err := m.rt.Usage(ses.ContainerID); err == nil && u.MemoryBytes > 0 {
		need = u.MemoryBytes
	}
	floor := int64(max(m.lim.PressureFreeDiskMiB, m.lim.MinFreeDiskMiB)) << 20
	if free-need < floor {
		return errdefs.Unavailable("the server is low on disk space: this session's memory image needs about %d MiB, and %d MiB are free of which %d MiB are kept free; the session keeps running",
			(need+1<<20-1)>>20, free>>20, floor>>20)
	}
	return nil
}

// IdleAction is what the idle timeout does to a session: its own choice,
// else the server's default.
func (m *Manager) IdleAction(ses *store.Session) string {
	if ses.IdleAction != "" {
		return ses.IdleAction
	}
	if m.lim.IdleAction != "" {
		return m.lim.IdleAction
	}
	return config.IdleTeardown
}

// Pause checkpoints a running session's sandbox with its memory and
// releases its compute. Idempotent on a paused session.
func (m *Manager) Pause(ctx context.Context, orgID, sessionID string) (store.Session, error) {
	ses, unlock, err := m.locked(ctx, orgID, sessionID)
	if err != nil {
		return store.Session{}, err
	}
	defer unlock()
	m.checkAliveLocked(ctx, ses)
	switch ses.Status {
	case store.StatusPaused:
		return *ses, nil
	case store.StatusRunning:
	default:
		return store.Session{}, errdefs.Conflict("session is %s; only a running session can be paused", ses.Status)
	}
	if err := m.mayPause(ctx, orgID); err != nil {
		return store.Session{}, err
	}
	return *ses, m.pauseLocked(ctx, ses, "")
}

// pauseLocked checkpoints a running session; by says who asked ("" a
// client, "idle" the idle timeout). On failure the session runs on.
func (m *Manager) pauseLocked(ctx context.Context, ses *store.Session, by string) error {
	dctx, cancel := detached(ctx)
	defer cancel()
	if err := m.imageFits(ses); err != nil {
		m.events.Event(ses.ID, "pause_failed", map[string]any{"reason": "disk"})
		return err
	}
	// Code runs in flight are interrupted and answered, viewers and
	// services let go, before the agent is suspended.
	m.hooks.Paused(ses.ID)
	t0 := m.now()
	// The disk gets what the sentry holds (e.g. written shared mappings),
	// so a teardown of the paused session, which keeps only the disk, has
	// every file as it was.
	m.syncSandbox(dctx, ses)
	dir := m.imageDir(ses)
	err := m.rt.Checkpoint(dctx, ses.ContainerID, dir, func(ctx context.Context) error { return m.keepImageLocked(ctx, ses, dir) })
	if err != nil {
		m.log.Error("checkpoint", "session", ses.SessionID, "err", err)
		if !errors.Is(err, runsc.ErrCheckpointFailed) {
			m.checkAliveLocked(dctx, ses)
			return errdefs.Unavailable("the sandbox could not be paused and stopped; it is %s", ses.Status)
		}
		m.hooks.Resumed(ses)
		if errors.Is(err, errdefs.ErrNoSpace) {
			var pe *errdefs.Error
			if errors.As(err, &pe) {
				return pe
			}
		}
		m.events.Event(ses.ID, "pause_failed", nil)
		return errdefs.Unavailable("the sandbox could not be paused; it is still running")
	}
	m.hang("pause-released")
	m.stopEgress(ses)
	m.release(ses.OrgID, ses.MemoryMiB)
	if err := m.setStatusLocked(dctx, ses, store.StatusPaused, by); err != nil {
		return err
	}
	m.events.Event(ses.ID, "paused", map[string]any{"ms": m.now().Sub(t0).Milliseconds(), "by": by, "imageBytes": dirBytes(dir)})
	return nil
}

// resumePausedLocked restores a paused session from its checkpoint. If
// the image cannot be restored, the sandbox starts cold on its disk (as
// after a teardown) and an event says so.
// A teardown's restore (to push a paired branch) is not a start the plan
// admits (admit false): it ends in a teardown.
func (m *Manager) resumePausedLocked(ctx context.Context, ses *store.Session, admit bool) (err error) {
	var undo undoStack
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	if err := m.checkStart(); err != nil {
		return err
	}
	var pl config.Plan
	if admit {
		if pl, err = m.admit(ctx, ses.OrgID, m.rated(ses)); err != nil {
			return err
		}
	}
	if err := m.reserve(ses.OrgID, ses.MemoryMiB, pl); err != nil {
		return err
	}
	undo.push(func() { m.release(ses.OrgID, ses.MemoryMiB) })
	if err := m.pinScrubber(ctx, ses.ID, admit); err != nil {
		return err
	}
	undo.push(func() { m.scrub.unpin(ses.ID) })
	if err := m.setStatusLocked(ctx, ses, store.StatusProvisioning, ses.StatusReason); err != nil {
		return err
	}
	undo.push(func() {
		m.events.Event(ses.ID, "resume_failed", nil)
		dctx, cancel := detached(ctx)
		defer cancel()
		if err := m.setStatusLocked(dctx, ses, store.StatusStopped, ""); err != nil {
			m.log.Error("undo resume", "session", ses.SessionID, "err", err)
		}
	})
	cctx, cancel := detached(ctx)
	defer cancel()
	sb := runsc.Sandbox{ID: ses.ContainerID, Image: m.image, Limits: Limits(sizeOf(ses)), Existing: true}
	rerr := errors.New("no complete checkpoint image")
	lost := false
	if m.saving() {
		if present, _ := m.disks.DiskCache(ses.ContainerID); !present {
			lost = true
			// The memory image belongs to a disk the node lost: start cold
			// on the last save instead (never on an empty disk).
			rerr = errors.New("the node lost the sandbox's disk")
			if err := m.prepareDiskLocked(cctx, ses); err != nil {
				m.log.Error("restore the lost disk of a paused session", "session", ses.SessionID, "err", err)
				return errdefs.Unavailable("the session's disk is gone from this server and its save could not be restored; retry the resume")
			}
		}
	}
	if !lost && m.imageComplete(ses) {
		m.hang("resume-loaded")
		rerr = m.rt.Restore(cctx, sb, m.imageDir(ses))
	}
	if rerr == nil {
		m.hang("resume-restored")
	}
	// The image served its one restore: the sandbox's memory now moves on
	// from it (runsc restore --background still reads pages from the open
	// files, which outlive their names).
	m.dropCheckpoint(cctx, ses)
	if rerr != nil {
		// Its processes are gone: what waited for them ends.
		m.log.Error("restore failed; starting from the disk", "session", ses.SessionID, "err", rerr)
		m.rt.AbandonParked(ses.ContainerID)
		m.hooks.Stopped(ses.ID)
		m.events.Event(ses.ID, "restore_failed", map[string]any{
			"message": "the checkpoint could not be restored; the sandbox started from its disk (files kept, processes lost)"})
		if err := m.startLocked(ctx, ses, sizeOf(ses), true, &undo); err != nil {
			m.log.Error("resume failed", "session", ses.SessionID, "err", err)
			if errors.Is(err, errDiskLost) {
				return err
			}
			return errdefs.Unavailable("the sandbox could not be started; the session is stopped with its workspace kept, retry the resume")
		}
		return nil
	}
	undo.push(func() {
		dctx, cancel := detached(ctx)
		defer cancel()
		if err := m.rt.Destroy(dctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}); err != nil {
			m.log.Error("undo restore", "session", ses.SessionID, "err", err)
		}
	})
	if _, err := m.Scrubber(ses.ID); err != nil {
		return err
	}
	undo.push(func() { m.scrub.forget(ses.ID) })
	if err := m.startEgress(ses); err != nil {
		return errdefs.Unavailable("the sandbox could not be resumed (egress); the session is stopped with its workspace kept")
	}
	undo.push(func() { m.egress.Close(ses.ID) })
	if err := m.setStatusLocked(cctx, ses, store.StatusRunning, ""); err != nil {
		return err
	}
	m.forgetActivity(ses.ID) // idle time counts from now, with the session's own timeout
	m.events.Event(ses.ID, "started", map[string]any{"size": ses.Size, "resumed": true, "restored": true})
	m.hooks.Resumed(ses)
	return nil
}

// dropCheckpoint deletes a session's checkpoint image, if any (teardown,
// delete: the memory of a paused session is not kept).
func (m *Manager) dropCheckpoint(ctx context.Context, ses *store.Session) {
	if err := os.RemoveAll(m.imageDir(ses)); err != nil {
		m.log.Warn("delete checkpoint", "session", ses.SessionID, "err", err)
	}
}

// idlePauseLocked pauses an idle session (its idleAction is pause); if
// the checkpoint fails, the session is torn down instead, as an idle one
// would be without pause.
func (m *Manager) idlePauseLocked(ctx context.Context, ses *store.Session) {
	m.log.Info("idle timeout: pausing", "session", ses.SessionID, "idleTimeoutSeconds", ses.IdleTimeoutSeconds)
	err := m.pauseLocked(ctx, ses, "idle")
	m.auditSystem("sandbox.idle_pause", ses, map[string]any{"idleTimeoutSeconds": ses.IdleTimeoutSeconds, "ok": err == nil})
	if err == nil || ses.Status != store.StatusRunning {
		return
	}
	_, err = m.teardownLocked(ctx, ses)
	if err != nil {
		m.log.Error("idle teardown", "session", ses.SessionID, "err", err)
	}
	m.auditSystem("sandbox.idle_teardown", ses, map[string]any{"idleTimeoutSeconds": ses.IdleTimeoutSeconds, "ok": err == nil})
}
