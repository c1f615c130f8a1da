package sandbox

import (
	"context"
	"errors"
	"os"

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

// Images keeps checkpoint images between a pause and its resume: the one
// place that saves and loads them. The driver writes and reads an image
// in a local directory (Dir); Save may then move it to storage, Load brings
// it back into Dir, Delete drops it wherever it is.
type Images interface {
	Dir(containerID string) string
	Save(ctx context.Context, containerID string) error
	Load(ctx context.Context, containerID string) error
	Delete(ctx context.Context, containerID string) error
}

// LocalImages keeps images where the driver wrote them, under the
// sandbox's directory (runsc.Runtime.CheckpointDir).
type LocalImages struct {
	DirOf func(containerID string) string
}

func (l LocalImages) Dir(id string) string                      { return l.DirOf(id) }
func (l LocalImages) Save(ctx context.Context, id string) error { return nil }

func (l LocalImages) Load(ctx context.Context, id string) error {
	_, err := os.Stat(l.DirOf(id))
	return err
}

func (l LocalImages) Delete(ctx context.Context, id string) error {
	if err := os.RemoveAll(l.DirOf(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
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
	return *ses, m.pauseLocked(ctx, ses, "")
}

// pauseLocked checkpoints a running session; by says who asked ("" a
// client, "idle" the idle timeout). On failure the session runs on.
func (m *Manager) pauseLocked(ctx context.Context, ses *store.Session, by string) error {
	dctx, cancel := detached(ctx)
	defer cancel()
	m.hooks.Paused(ses.ID) // viewers and services let go before the agent is suspended
	t0 := m.now()
	if err := m.rt.Checkpoint(dctx, ses.ContainerID, m.images.Dir(ses.ContainerID)); err != nil {
		m.log.Error("checkpoint", "session", ses.SessionID, "err", err)
		if !errors.Is(err, runsc.ErrCheckpointFailed) {
			m.checkAliveLocked(dctx, ses)
			return errdefs.Unavailable("the sandbox could not be paused and stopped; it is %s", ses.Status)
		}
		m.hooks.Resumed(ses)
		m.events.Event(ses.ID, "pause_failed", nil)
		return errdefs.Unavailable("the sandbox could not be paused; it is still running")
	}
	if err := m.images.Save(dctx, ses.ContainerID); err != nil {
		m.log.Error("save checkpoint", "session", ses.SessionID, "err", err)
	}
	m.stopEgress(ses)
	m.release(ses.OrgID, ses.MemoryMiB)
	if err := m.setStatusLocked(dctx, ses, store.StatusPaused, by); err != nil {
		return err
	}
	m.events.Event(ses.ID, "paused", map[string]any{"ms": m.now().Sub(t0).Milliseconds(), "by": by})
	return nil
}

// resumePausedLocked restores a paused session from its checkpoint. If
// the image cannot be restored, the sandbox starts cold on its disk (as
// after a teardown) and an event says so.
func (m *Manager) resumePausedLocked(ctx context.Context, ses *store.Session) (err error) {
	var undo undoStack
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	if err := m.checkDisk(); err != nil {
		return err
	}
	if err := m.reserve(ses.OrgID, ses.MemoryMiB); err != nil {
		return err
	}
	undo.push(func() { m.release(ses.OrgID, ses.MemoryMiB) })
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
	sb := runsc.Sandbox{ID: ses.ContainerID, Image: m.image, Limits: Limits(sizeOf(ses))}
	rerr := m.images.Load(cctx, ses.ContainerID)
	if rerr == nil {
		rerr = m.rt.Restore(cctx, sb, m.images.Dir(ses.ContainerID))
	}
	if err := m.images.Delete(cctx, ses.ContainerID); err != nil {
		m.log.Warn("delete checkpoint", "session", ses.SessionID, "err", err)
	}
	if rerr != nil {
		// Its processes are gone: what waited for them ends.
		m.log.Error("restore failed; starting from the disk", "session", ses.SessionID, "err", rerr)
		m.rt.AbandonParked(ses.ContainerID)
		m.hooks.Stopped(ses.ID)
		m.events.Event(ses.ID, "restore_failed", map[string]any{
			"message": "the checkpoint could not be restored; the sandbox started from its disk (files kept, processes lost)"})
		if err := m.startLocked(ctx, ses, sizeOf(ses), true, &undo); err != nil {
			m.log.Error("resume failed", "session", ses.SessionID, "err", err)
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
	m.Scrubber(ses.ID)
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
	if err := m.images.Delete(ctx, ses.ContainerID); err != nil {
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
