package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"syscall"
	"time"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/server/workspace"
	"sandboxd/store"
)

// The session lifecycle is one state machine:
//
//	provisioning -> running            (create succeeded)
//	provisioning -> (row removed)      (create failed: every step undone)
//	running      -> stopping -> stopped (teardown: saved, the disk kept as a cache;
//	                                     disk pressure: frozen, not saved, reason disk_pressure)
//	stopping     -> running            (the save failed, e.g. quota: the sandbox runs on)
//	running      -> failed             (sandbox died: oom, exited; its disk failed: disk_error)
//	failed       -> stopping -> stopped (teardown releases what is left)
//	stopped      -> provisioning -> running (resume on the kept disk)
//	provisioning -> stopped            (resume failed: the disk is kept)
//	running      -> paused             (pause: checkpoint with memory, pause.go)
//	paused       -> provisioning -> running (resume restores the checkpoint)
//	provisioning -> paused             (a resume from a checkpoint interrupted before the restore: reconcile)
//	paused       -> stopping -> stopped (teardown drops the checkpoint)
//	any          -> deleted            (delete; the id stays used)
var transitions = map[string][]string{
	store.StatusProvisioning: {store.StatusRunning, store.StatusFailed, store.StatusStopped, store.StatusPaused},
	store.StatusRunning:      {store.StatusStopping, store.StatusFailed, store.StatusDeleted, store.StatusPaused},
	store.StatusPaused:       {store.StatusProvisioning, store.StatusStopping, store.StatusDeleted},
	store.StatusStopping:     {store.StatusStopped, store.StatusFailed, store.StatusRunning},
	store.StatusFailed:       {store.StatusStopping, store.StatusDeleted},
	store.StatusStopped:      {store.StatusProvisioning, store.StatusDeleted},
}

// CanTransition reports whether the state machine allows from -> to.
func CanTransition(from, to string) bool {
	for _, t := range transitions[from] {
		if t == to {
			return true
		}
	}
	return false
}

// Statuses are the statuses a client can see and filter by.
var Statuses = []string{store.StatusProvisioning, store.StatusRunning, store.StatusPaused,
	store.StatusStopping, store.StatusStopped, store.StatusFailed}

// Limits converts a size to the driver's limits.
func Limits(z config.Size) runsc.Limits {
	return runsc.Limits{
		VCPUs:     z.VCPUs,
		MemoryMiB: int64(z.MemoryMiB),
		DiskMiB:   int64(z.DiskMiB),
		Pids:      runsc.HostTasks(int64(z.Pids)),
		Processes: runsc.DefaultProcesses(int64(z.Pids)),
	}
}

// sizeOf is the size a session was provisioned with.
func sizeOf(ses *store.Session) config.Size {
	return config.Size{Name: ses.Size, VCPUs: ses.VCPUs, MemoryMiB: ses.MemoryMiB, DiskMiB: ses.DiskMiB, Pids: ses.Pids}
}

var errNotFound = errdefs.NotFound("no such session")

// Get returns the caller's session by its id: unknown ids and other
// organizations' sessions are the same not-found error. A running
// session's egress count is the proxy's, fresher than the store's.
func (m *Manager) Get(ctx context.Context, orgID, sessionID string) (store.Session, error) {
	ses, err := m.db.GetSession(ctx, orgID, sessionID)
	if errors.Is(err, store.ErrNotFound) {
		return ses, errNotFound
	}
	if err != nil {
		return ses, err
	}
	m.liveEgress(&ses)
	return ses, nil
}

// List returns an organization's sessions (of one status, or all).
func (m *Manager) List(ctx context.Context, orgID, status string) ([]store.Session, error) {
	list, err := m.db.ListSessions(ctx, orgID, status)
	if err != nil {
		return nil, err
	}
	for i := range list {
		m.liveEgress(&list[i])
	}
	return list, nil
}

// locked loads a session, takes its lock and reads it again under the lock
// (it may have changed or, after a failed provision, disappeared while the
// caller waited). On error no lock is held.
func (m *Manager) locked(ctx context.Context, orgID, sessionID string) (*store.Session, func(), error) {
	ses, err := m.db.GetSession(ctx, orgID, sessionID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, errNotFound
	}
	if err != nil {
		return nil, nil, err
	}
	unlock := m.lock(ses.ID)
	cur, err := m.db.GetSessionByID(ctx, ses.ID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && cur.Status == store.StatusDeleted) {
		err = errNotFound
	}
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return &cur, unlock, nil
}

// Use runs fn on a session under its lock, so no teardown, resume or
// delete runs meanwhile (file access). While fn runs, a running session
// counts as in use for its idle timeout. With wake, a session paused for
// memory pressure is resumed first (a caller who may drive the sandbox;
// a reader's look does not start it and draw credits).
func (m *Manager) Use(ctx context.Context, orgID, sessionID string, wake bool, fn func(ses *store.Session) error) error {
	if ses, err := m.db.GetSession(ctx, orgID, sessionID); err == nil && wake {
		if err := m.wake(ctx, &ses); err != nil {
			return err
		}
	}
	ses, unlock, err := m.locked(ctx, orgID, sessionID)
	if err != nil {
		return err
	}
	defer unlock()
	if ses.Status == store.StatusRunning {
		end, _ := m.begin(ses.ID, 0)
		defer end()
	}
	return fn(ses)
}

// Spec is a validated provision request.
type Spec struct {
	SessionID          string
	ProjectID          string // "" for the caller's default project
	Size               config.Size
	RequestedSize      string
	Env, Secrets       map[string]string
	IdleTimeoutSeconds int
	IdleAction         string // "", config.IdleTeardown or config.IdlePause
	GitRepo, GitBranch string
}

// Provision creates a session and starts its sandbox. Every step pushes
// its undo; a failure runs them all, so nothing is left and the session id
// can be used again.
func (m *Manager) Provision(ctx context.Context, p store.Principal, spec Spec) (_ store.Session, err error) {
	project := spec.ProjectID
	if project == "" {
		project = p.ProjectID
	} else if project != p.ProjectID {
		if _, err := m.db.GetProject(ctx, p.Org.ID, project); err != nil {
			return store.Session{}, errdefs.Invalid("projectId: no such project in your organization")
		}
	}
	if spec.IdleAction == config.IdlePause {
		// Asked for by name: refused as an explicit pause would be, not
		// turned into a teardown at the first idle timeout.
		if err := m.mayPause(ctx, p.Org.ID); err != nil {
			return store.Session{}, err
		}
	}
	names := make([]string, 0, len(spec.Secrets))
	for k := range spec.Secrets {
		names = append(names, k)
	}
	sort.Strings(names)
	z := spec.Size
	ses := &store.Session{
		OrgID: p.Org.ID, ProjectID: project, SessionID: spec.SessionID, CreatedBy: p.User.ID,
		ContainerID: m.rt.ContainerID(p.Org.ID, spec.SessionID), Status: store.StatusProvisioning,
		Size: z.Name, RequestedSize: spec.RequestedSize, VCPUs: z.VCPUs, MemoryMiB: z.MemoryMiB,
		DiskMiB: z.DiskMiB, Pids: z.Pids, CreditRate: int64(z.CreditsPerHour), EgressBytesLimit: z.EgressBytes(),
		GitRepo: spec.GitRepo, GitBranch: spec.GitBranch, Env: spec.Env, SecretNames: names,
		IdleTimeoutSeconds: spec.IdleTimeoutSeconds, IdleAction: spec.IdleAction,
	}
	if ses.RequestedSize == "" {
		ses.RequestedSize = z.Name
	}
	// Steps before the lock undo at once; after it, the undo runs before
	// the lock is released, so a request waiting for it finds no row.
	var undo undoStack
	fail := func(err error) (store.Session, error) {
		undo.run()
		return store.Session{}, err
	}
	pl, err := m.admit(ctx, ses.OrgID, z)
	if err != nil {
		return fail(err)
	}
	ses.EgressBytesLimit = egressCap(pl, ses.EgressBytesLimit)
	if err := m.checkStart(); err != nil {
		return fail(err)
	}
	if err := m.reserve(ses.OrgID, ses.MemoryMiB, pl); err != nil {
		return fail(err)
	}
	undo.push(func() { m.release(ses.OrgID, ses.MemoryMiB) })
	if err := m.db.InsertSession(ctx, ses); err != nil {
		if errors.Is(err, store.ErrConflict) {
			err = errdefs.Conflict("sessionId %q was already used in this organization; a fresh start is a new session id", spec.SessionID)
		}
		return fail(err)
	}
	// The row goes with its secrets, so the id can be retried.
	undo.push(func() {
		dctx, cancel := detached(ctx)
		defer cancel()
		if err := m.db.DeleteSessionRow(dctx, ses.ID); err != nil {
			m.log.Error("undo session row", "session", ses.SessionID, "err", err)
		}
	})
	unlock := m.lock(ses.ID)
	defer unlock()
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	if len(spec.Secrets) > 0 {
		if err := m.db.SetSecrets(ctx, ses.ID, spec.Secrets); err != nil {
			return store.Session{}, err
		}
	}
	// What startLocked uses, without reading them back; checked against
	// limits.maxSecretsMemoryMiB before it is compiled.
	if err := m.scrub.admit(ctx, ses.ID, spec.Secrets); err != nil {
		return store.Session{}, err
	}
	undo.push(func() { m.scrub.forget(ses.ID) })
	m.hang("provision-inserted")
	if err := m.startLocked(ctx, ses, z, false, &undo); err != nil {
		if errors.Is(err, errdefs.ErrUnprocessable) {
			return store.Session{}, err // the clone failed: the client's to fix
		}
		m.log.Error("provision failed", "session", ses.SessionID, "container", ses.ContainerID, "err", err)
		if f := HostFault(err, "nothing was kept"); f != nil {
			return store.Session{}, f
		}
		return store.Session{}, errdefs.Unavailable("the sandbox could not be started; nothing was kept, retry with the same sessionId")
	}
	return *ses, nil
}

// Resume starts a stopped session's sandbox again on the disk its teardown
// kept: the workspace and the writable root layer (installed packages) come
// back, processes do not. A failed session is torn down first; a running
// one is answered as it is (a dead "running" one is noticed and resumed).
// On failure the session is stopped again with its disk intact, so the
// resume can be retried.
func (m *Manager) Resume(ctx context.Context, orgID, sessionID string) (_ store.Session, err error) {
	ses, unlock, err := m.locked(ctx, orgID, sessionID)
	if err != nil {
		return store.Session{}, err
	}
	defer unlock()
	m.checkAliveLocked(ctx, ses)
	switch ses.Status {
	case store.StatusRunning:
		return *ses, nil
	case store.StatusFailed:
		// Its disk (newer than any save) is what resumes: no save first.
		if _, err := m.stopSessionLocked(ctx, ses, false, true); err != nil {
			return store.Session{}, err
		}
	case store.StatusStopped:
	case store.StatusPaused:
		if err := m.resumePausedLocked(ctx, ses, true); err != nil {
			return store.Session{}, err
		}
		return *ses, nil
	default:
		return store.Session{}, errdefs.Conflict("session is %s; only a stopped, paused or failed session can be resumed", ses.Status)
	}
	var undo undoStack
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	pl, err := m.admit(ctx, ses.OrgID, m.rated(ses))
	if err != nil {
		return store.Session{}, err
	}
	if err := m.checkStart(); err != nil {
		return store.Session{}, err
	}
	if err := m.reserve(ses.OrgID, ses.MemoryMiB, pl); err != nil {
		return store.Session{}, err
	}
	undo.push(func() { m.release(ses.OrgID, ses.MemoryMiB) })
	if err := m.pinScrubber(ctx, ses.ID, true); err != nil {
		return store.Session{}, err
	}
	undo.push(func() { m.scrub.unpin(ses.ID) })
	if err := m.setStatusLocked(ctx, ses, store.StatusProvisioning, ses.StatusReason); err != nil {
		return store.Session{}, err
	}
	undo.push(func() {
		m.events.Event(ses.ID, "resume_failed", nil)
		dctx, cancel := detached(ctx)
		defer cancel()
		if err := m.setStatusLocked(dctx, ses, store.StatusStopped, ses.StatusReason); err != nil {
			m.log.Error("undo resume", "session", ses.SessionID, "err", err)
		}
	})
	if err := m.prepareDiskLocked(ctx, ses); err != nil {
		m.log.Error("restore failed", "session", ses.SessionID, "err", err)
		if pe, ok := errdefs.Public(err); ok {
			return store.Session{}, pe // damaged, or lost
		}
		if f := HostFault(err, "the session stays stopped with its workspace kept"); f != nil {
			return store.Session{}, f
		}
		return store.Session{}, errdefs.Unavailable("the session's saved workspace could not be restored; the session stays stopped, retry the resume")
	}
	m.hang("restore-done")
	if err := m.startLocked(ctx, ses, sizeOf(ses), true, &undo); err != nil {
		m.log.Error("resume failed", "session", ses.SessionID, "container", ses.ContainerID, "err", err)
		if errors.Is(err, errDiskLost) {
			return store.Session{}, err
		}
		if f := HostFault(err, "the session stays stopped with its workspace kept"); f != nil {
			return store.Session{}, f
		}
		return store.Session{}, errdefs.Unavailable("the sandbox could not be started; the session is stopped with its workspace kept, retry the resume")
	}
	return *ses, nil
}

// checkStart refuses a start that cannot succeed: no image, or the data
// dir's file system nearly full (sandbox disks are sparse and grow as
// they are written).
func (m *Manager) checkStart() error {
	if m.noImg != nil {
		return m.noImg
	}
	return m.checkDiskFree()
}

// checkDiskFree refuses what writes much to the data dir (a start, a
// restore) while it has less than limits.minFreeDiskMiB free.
func (m *Manager) checkDiskFree() error {
	free := m.dataFree()
	if free >= 0 && free>>20 < int64(m.lim.MinFreeDiskMiB) {
		return errdefs.Unavailable("the server is low on disk space; retry later")
	}
	return nil
}

// reserve takes capacity for a new sandbox: a slot on the server and in
// its organization (within its plan's concurrency), and its size's memory
// (overcommitted: limits.memoryOvercommit), while the host has memory
// available (limits.minFreeMemoryMiB).
func (m *Manager) reserve(org string, memMiB int, pl config.Plan) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case pl.MaxConcurrent > 0 && m.perOrg[org] >= pl.MaxConcurrent:
		return errdefs.RateLimited("your organization runs %d sandboxes, the most the %s plan allows at once; tear one down or pause it first", m.perOrg[org], pl.Name)
	case m.live >= m.lim.MaxSandboxes:
		return errdefs.Unavailable("this server runs its maximum of %d sandboxes; retry later", m.lim.MaxSandboxes)
	case m.perOrg[org] >= m.lim.MaxSandboxesPerOrg:
		return errdefs.Unavailable("your organization runs its maximum of %d sandboxes; tear one down first", m.lim.MaxSandboxesPerOrg)
	case float64(m.memUsed+memMiB) > float64(m.memMax)*m.overcommit():
		return errdefs.Unavailable("the sizes of the sandboxes running on this server add up to its limit (%d of %d MiB with overcommit); try a smaller size or later",
			m.memUsed, int(float64(m.memMax)*m.overcommit()))
	}
	if avail := m.memAvailable(); avail >= 0 && avail < m.lim.MinFreeMemoryMiB {
		return errdefs.Unavailable("this server's memory is in use (%d MiB available, it keeps %d MiB free); retry later", avail, m.lim.MinFreeMemoryMiB)
	}
	if free := m.pidsFree(); free >= 0 && free < m.lim.MinFreePids {
		return errdefs.Unavailable("this server is short of process ids (%d free, it keeps %d free; each sandbox takes about 30 host threads); retry later", free, m.lim.MinFreePids)
	}
	m.live++
	m.perOrg[org]++
	m.memUsed += memMiB
	return nil
}

// account counts a sandbox found running at start.
func (m *Manager) account(ses *store.Session) {
	m.mu.Lock()
	m.live++
	m.perOrg[ses.OrgID]++
	m.memUsed += ses.MemoryMiB
	m.mu.Unlock()
}

// release gives back what reserve took for a session.
func (m *Manager) release(org string, memMiB int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live > 0 {
		m.live--
	}
	if m.perOrg[org] > 0 {
		m.perOrg[org]--
	}
	m.memUsed = max(m.memUsed-memMiB, 0)
}

// setStatusLocked moves a session along the state machine, persists it
// and meters its running time.
func (m *Manager) setStatusLocked(ctx context.Context, ses *store.Session, to, reason string) error {
	return m.setStatus(ctx, ses, to, reason, false)
}

// setStatus is setStatusLocked; dead says the sandbox was found gone, so
// its running time ends where the monitor last saw it alive.
func (m *Manager) setStatus(ctx context.Context, ses *store.Session, to, reason string, dead bool) error {
	if ses.Status != to && !CanTransition(ses.Status, to) {
		return fmt.Errorf("session %s: illegal transition %s -> %s", ses.ID, ses.Status, to)
	}
	now := m.now()
	switch to {
	case store.StatusRunning:
		ses.StartedAt, ses.StoppedAt = &now, nil
	case store.StatusStopped, store.StatusFailed, store.StatusPaused:
		if ses.StoppedAt == nil {
			ses.StoppedAt = &now
		}
	}
	from := ses.Status
	ses.Status, ses.StatusReason = to, reason
	if err := m.db.UpdateSession(ctx, ses); err != nil {
		return err
	}
	// After the status: a crash between the two is what Reconcile mends
	// (a running session with no open run is adopted with one; a stopped
	// one's open run closes at its last sighting).
	if from != to {
		m.meterLocked(ctx, ses, from, to, now, dead)
	}
	return nil
}

// startLocked creates and starts a provisioning session's sandbox, pushing
// each step's undo. resumed says whether its disk comes from a teardown
// (and must survive a failure).
func (m *Manager) startLocked(ctx context.Context, ses *store.Session, z config.Size, resumed bool, undo *undoStack) error {
	// A client that goes away must not leave a half-made sandbox: create
	// runs to completion (or full undo) on its own context.
	cctx, cancel := detached(ctx)
	defer cancel()
	if err := m.rt.Create(cctx, runsc.Sandbox{ID: ses.ContainerID, Image: m.image, Limits: Limits(z), Existing: resumed}); err != nil {
		if errors.Is(err, runsc.ErrDiskMissing) {
			return errDiskLost
		}
		return err // Create undid itself (keeping a teardown's disk)
	}
	undo.push(func() {
		dctx, cancel := detached(ctx)
		defer cancel()
		if err := m.rt.Destroy(dctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: resumed}); err != nil {
			m.log.Error("undo create", "session", ses.SessionID, "err", err)
		}
	})
	if !resumed {
		m.hang("provision-started")
	}
	// Its secrets join the scrubber of text no session can be told from
	// (the standard library's log lines) before the sandbox can reach out;
	// pinned while it runs (its start checked the budget).
	if err := m.pinScrubber(cctx, ses.ID, false); err != nil {
		return fmt.Errorf("scrubber: %w", err)
	}
	undo.push(func() { m.scrub.forget(ses.ID) })
	if err := m.startEgress(ses); err != nil {
		return fmt.Errorf("egress listener: %w", err)
	}
	undo.push(func() { m.egress.Close(ses.ID) })
	if !resumed && ses.GitRepo != "" {
		if err := m.cloneLocked(cctx, ses); err != nil {
			return err
		}
	}
	if err := m.setStatusLocked(cctx, ses, store.StatusRunning, ""); err != nil {
		return err
	}
	m.forgetActivity(ses.ID) // idle time counts from now, not from before a teardown
	m.events.Event(ses.ID, "started", map[string]any{"size": ses.Size, "resumed": resumed})
	m.hooks.Started(ses)
	return nil
}

// stopLocked ends what a running sandbox has outside the driver: its
// processes and log tail (hooks) and its egress listener.
func (m *Manager) stopLocked(ses *store.Session) {
	m.hooks.Stopped(ses.ID)
	m.stopEgress(ses)
}

// HostFault is the public error of a step that a limit of the host
// stopped: no loop device left for a disk image, or the data dir's disk
// full; nil for any other error. what says what became of the session.
func HostFault(err error, what string) error {
	switch {
	case errors.Is(err, runsc.ErrNoLoopDevice):
		return errdefs.Unavailable("this server has no free loop device for the session's disk; %s, retry later", what).WithCause(err)
	case errors.Is(err, syscall.ENOSPC):
		return errdefs.Unavailable("this server's disk is full; %s, retry later", what).WithCause(err)
	}
	return nil
}

// errDiskLost: a resume found neither the session's disk on this node nor
// a save to restore it from. Starting on an empty disk would hide the loss
// (and the next teardown would save the emptiness over nothing).
var errDiskLost = errdefs.Conflict("the session's disk is gone from this server and it has no save in storage; its files cannot be brought back (delete the session)")

// Teardown is what a teardown did.
type Teardown struct {
	WorkspaceBytes int64
	Git            *GitResult // nil: not paired
	// SavedBytes is the size of the session's save in its organization's
	// storage.
	SavedBytes int64
}

// Teardown stops a session's sandbox and releases its compute, keeping its
// disk (workspace and writable root layer). Idempotent on a stopped session.
func (m *Manager) Teardown(ctx context.Context, orgID, sessionID string) (store.Session, Teardown, error) {
	ses, unlock, err := m.locked(ctx, orgID, sessionID)
	if err != nil {
		return store.Session{}, Teardown{}, err
	}
	defer unlock()
	res, err := m.teardownLocked(ctx, ses)
	return *ses, res, err
}

func (m *Manager) teardownLocked(ctx context.Context, ses *store.Session) (Teardown, error) {
	return m.stopSessionLocked(ctx, ses, true, true)
}

// stopSessionLocked is a teardown; with save (and storage configured) the
// session's disk is saved to its organization's storage before anything
// is released, and a failed save leaves the session as it was (a running
// sandbox thawed and running on). Without push a paired session's commits
// are not pushed (they stay on its disk for the next teardown): the
// sandbox was frozen to stop at once.
func (m *Manager) stopSessionLocked(ctx context.Context, ses *store.Session, save, push bool) (Teardown, error) {
	var res Teardown
	switch ses.Status {
	case store.StatusStopped:
		res.SavedBytes = ses.Saved.Bytes
		return res, nil
	case store.StatusRunning, store.StatusFailed, store.StatusStopping, store.StatusPaused:
	default:
		return res, errdefs.Conflict("session is %s; only a running, paused or failed session can be torn down", ses.Status)
	}
	if ses.Status == store.StatusPaused && save && ses.GitRepo != "" && m.git.Host != "" {
		// The paired branch's commits are pushed by git inside the sandbox
		// (never on the host): the paused sandbox is restored first, then
		// torn down as a running one (push, save). If it cannot be, the
		// session stays paused with its memory and the teardown can be retried.
		m.log.Info("teardown of a paused paired session: restoring it to push", "session", ses.SessionID)
		if err := m.resumePausedLocked(ctx, ses, false); err != nil {
			m.log.Error("restore for the push", "session", ses.SessionID, "err", err)
			if ses.Status == store.StatusPaused {
				if pe, ok := errdefs.Public(err); ok && errors.Is(err, errdefs.ErrUnavailable) {
					return res, pe // e.g. no capacity: it says why
				}
				return res, errdefs.Unavailable("the paused session could not be restored to push its commits; it stays paused with its memory, retry the teardown")
			}
			return res, errdefs.Unavailable("the paused session could not be restored to push its commits; it is %s with its workspace kept, resume it and retry the teardown", ses.Status)
		}
		m.events.Event(ses.ID, "restored_for_push", nil)
	}
	if save && m.saving() {
		// Refused before anything changes: no push, no freeze to undo.
		if err := m.saveFits(ses); err != nil {
			m.log.Warn("save refused", "session", ses.SessionID, "err", err)
			return res, err
		}
	}
	prev := ses.Status
	if ses.Status != store.StatusStopping {
		if err := m.setStatusLocked(ctx, ses, store.StatusStopping, ses.StatusReason); err != nil {
			return res, err
		}
	}
	// The paired branch's commits go out first, while the sandbox (and its
	// egress listener) still run, so the save has them; a failed push keeps
	// everything.
	res.Git = m.pushLocked(ctx, ses, push && prev == store.StatusRunning)
	save = save && m.saving()
	saved := false
	if save {
		st, err := m.saveLocked(ctx, ses, prev == store.StatusRunning)
		if err != nil {
			m.undoStoppingLocked(ctx, ses, prev)
			if _, ok := errdefs.Public(err); ok {
				m.log.Warn("save refused", "session", ses.SessionID, "err", err)
				return res, err
			}
			m.log.Error("save", "session", ses.SessionID, "err", err)
			if f := HostFault(err, "the session could not be saved and keeps its data"); f != nil {
				return res, f
			}
			return res, errdefs.Unavailable("the session could not be saved; it keeps its data, retry the teardown")
		}
		res.SavedBytes = ses.Saved.Bytes
		// The pack walked the (frozen) workspace already.
		res.WorkspaceBytes, saved = st.Usage["workspace"]
	}
	if prev == store.StatusRunning {
		m.release(ses.OrgID, ses.MemoryMiB) // a stopping session holds no capacity
	}
	m.stopLocked(ses)
	if !saved {
		if dir, release, err := m.rt.OpenWorkspace(ses.ContainerID, false); err == nil {
			res.WorkspaceBytes = workspace.DiskUsage(dir)
			if err := release(); err != nil {
				m.log.Warn("release workspace", "session", ses.SessionID, "err", err)
			}
		}
	}
	dctx, cancel := detached(ctx)
	defer cancel()
	if err := m.rt.Destroy(dctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}); err != nil {
		m.log.Error("teardown", "session", ses.SessionID, "err", err)
		return res, errdefs.Unavailable("the sandbox could not be stopped completely; retry the teardown")
	}
	if save {
		m.hang("save-destroyed")
		m.finishSaveLocked(dctx, ses)
	}
	m.dropCheckpoint(dctx, ses) // a paused session's memory is not kept
	m.events.Event(ses.ID, "stopped", map[string]any{"workspaceBytes": res.WorkspaceBytes, "savedBytes": res.SavedBytes})
	return res, m.setStatusLocked(dctx, ses, store.StatusStopped, ses.StatusReason)
}

// finishSaveLocked runs once a saved session's sandbox is gone: its disk is
// marked a clean copy of the save, older saves are deleted.
func (m *Manager) finishSaveLocked(ctx context.Context, ses *store.Session) {
	if err := m.disks.MarkSaved(ses.ContainerID, ses.Saved.SHA256); err != nil {
		m.log.Warn("mark disk saved", "session", ses.SessionID, "err", err) // it counts as newer: still right
	}
	if err := m.dropOldSavesLocked(ctx, ses); err != nil {
		m.log.Warn("drop old saves", "session", ses.SessionID, "err", err)
	}
}

// undoStoppingLocked puts a session whose save failed back as it was: a
// running one is thawed and runs on (its run's start time kept), a failed
// one stays failed; one found stopping stays so (a retry, or the next
// start, finishes it).
func (m *Manager) undoStoppingLocked(ctx context.Context, ses *store.Session, prev string) {
	dctx, cancel := detached(ctx)
	defer cancel()
	switch prev {
	case store.StatusRunning:
		if err := m.disks.Thaw(dctx, ses.ContainerID); err != nil {
			m.log.Warn("thaw after a failed save", "session", ses.SessionID, "err", err)
		}
		ses.Status = store.StatusRunning
		if err := m.db.UpdateSession(dctx, ses); err != nil {
			m.log.Error("undo stopping", "session", ses.SessionID, "err", err)
		}
	case store.StatusPaused: // its checkpoint is still there: resume restores it
		ses.Status = store.StatusPaused
		if err := m.db.UpdateSession(dctx, ses); err != nil {
			m.log.Error("undo stopping", "session", ses.SessionID, "err", err)
		}
	case store.StatusFailed:
		if err := m.setStatusLocked(dctx, ses, store.StatusFailed, ses.StatusReason); err != nil {
			m.log.Error("undo stopping", "session", ses.SessionID, "err", err)
		}
	}
}

// Delete tears a session down if needed and deletes its disk; the row
// stays (status deleted) so the session id is never reused.
func (m *Manager) Delete(ctx context.Context, orgID, sessionID string) error {
	ses, unlock, err := m.locked(ctx, orgID, sessionID)
	if err != nil {
		return err
	}
	defer unlock()
	if ses.Status == store.StatusProvisioning {
		return errdefs.Conflict("session is still provisioning")
	}
	live := ses.Status == store.StatusRunning || ses.Status == store.StatusStopping
	if live {
		m.stopLocked(ses) // teardown and markDead did it for the others
	} else {
		m.hooks.Stopped(ses.ID)
	}
	dctx, cancel := detached(ctx)
	defer cancel()
	if err := m.rt.Destroy(dctx, ses.ContainerID, runsc.DestroyOpts{}); err != nil {
		m.log.Error("delete", "session", ses.SessionID, "err", err)
		return errdefs.Unavailable("the sandbox could not be removed completely; retry the delete")
	}
	if err := m.deleteSavesLocked(dctx, ses); err != nil {
		m.log.Error("delete saves", "session", ses.SessionID, "err", err)
		return errdefs.Unavailable("the session's saved workspace could not be deleted completely; retry the delete")
	}
	m.dropCheckpoint(dctx, ses)
	if live {
		if ses.Status == store.StatusRunning {
			m.release(ses.OrgID, ses.MemoryMiB)
		}
		now := m.now()
		ses.StoppedAt = &now
		drawn, err := m.closeRun(dctx, ses.ID, &now)
		if err != nil {
			m.log.Error("meter", "session", ses.SessionID, "err", err)
		}
		m.drawn(ses.OrgID, drawn)
	}
	ses.Status = store.StatusDeleted
	m.scrub.forget(ses.ID)
	m.forgetActivity(ses.ID)
	m.hooks.Deleted(ses.ID)
	return m.db.UpdateSession(dctx, ses)
}

// deathReason names why a sandbox is not running: "oom" when its memory
// cgroup killed it, else "exited".
func deathReason(oom bool) string {
	if oom {
		return "oom"
	}
	return "exited"
}

// markDeadLocked records that a running sandbox died (reason "oom" or
// "exited"), or that its disk failed ("disk_error": it is stopped), and
// releases its host resources, keeping its disk.
func (m *Manager) markDeadLocked(ctx context.Context, ses *store.Session, reason string) {
	if ses.Status != store.StatusRunning {
		return
	}
	m.stopEgress(ses)
	dctx, cancel := detached(ctx)
	defer cancel()
	if err := m.setStatus(dctx, ses, store.StatusFailed, reason, true); err != nil {
		m.log.Error("mark failed", "session", ses.SessionID, "err", err)
		return
	}
	m.release(ses.OrgID, ses.MemoryMiB)
	m.hooks.Stopped(ses.ID)
	if reason == "oom" {
		m.events.Event(ses.ID, "oom", map[string]any{"memoryMiB": ses.MemoryMiB})
	}
	m.events.Event(ses.ID, "exit", map[string]any{"reason": reason})
	m.log.Warn("sandbox died", "session", ses.SessionID, "reason", reason)
	m.auditSystem("sandbox.failed", ses, map[string]any{"reason": reason})
	if err := m.rt.Destroy(dctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}); err != nil {
		m.log.Error("release dead sandbox", "session", ses.SessionID, "err", err)
	}
}

// checkAliveLocked inspects a running session's sandbox and marks it
// failed if it is gone.
func (m *Manager) checkAliveLocked(ctx context.Context, ses *store.Session) {
	if ses.Status != store.StatusRunning {
		return
	}
	st, err := m.rt.Inspect(ctx, ses.ContainerID)
	if err != nil {
		m.log.Warn("inspect sandbox", "session", ses.SessionID, "err", err)
		return
	}
	if st.Status == runsc.StatusRunning && st.OOMKills == 0 && !st.DiskFailed {
		return
	}
	reason := deathReason(st.OOMKills > 0)
	if st.Status == runsc.StatusRunning && st.OOMKills == 0 {
		// Nothing it writes can be kept any more; a resume mounts the disk
		// again (checked and repaired first).
		reason = "disk_error"
	}
	m.markDeadLocked(ctx, ses, reason)
}

// NoteDead checks a session whose command failed as if its sandbox were
// gone, and marks it failed if the driver says its current sandbox is (a
// command may report on a sandbox a teardown and resume have replaced).
func (m *Manager) NoteDead(pk string) {
	unlock := m.lock(pk)
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if cur, err := m.db.GetSessionByID(ctx, pk); err == nil {
		m.checkAliveLocked(ctx, &cur)
	}
}

// Reconcile runs at start: sessions whose sandboxes still run stay usable,
// records of dead ones are marked failed, interrupted operations are
// finished, and leftovers of this server's prefix are collected. What it
// cannot do for one session is logged and does not stop the others.
func (m *Manager) Reconcile(ctx context.Context) error {
	if err := m.followMovedDataDir(ctx); err != nil {
		return err
	}
	sessions, err := m.db.ListLiveSessions(ctx)
	if err != nil {
		return err
	}
	// Running time while the server was down is not charged: every run
	// ends where it was last seen, and what still runs starts a new one.
	if _, err := m.db.CloseAllRuns(ctx); err != nil {
		return err
	}
	keep := map[string]bool{}
	for i := range sessions {
		ses := &sessions[i]
		st, err := m.rt.Inspect(ctx, ses.ContainerID)
		if err != nil {
			return fmt.Errorf("inspect %s: %w", ses.ContainerID, err)
		}
		m.reconcileOne(ctx, ses, st, keep)
	}
	m.rt.CleanExecFiles()
	if ids := m.rt.Collect(ctx, keep); len(ids) > 0 {
		m.log.Info("collected leftover sandboxes", "count", len(ids))
	}
	return nil
}

// followMovedDataDir gives the sessions of a data dir that was moved
// (its resource prefix, a hash of its path, changed) the container ids of
// this one: each sandbox dir is renamed to the new id and the row follows.
// What ran at the old path is gone with it (runsc's state moved too), so
// such a session is then found dead and resumes from its disk.
func (m *Manager) followMovedDataDir(ctx context.Context) error {
	rows, err := m.db.ListSessionContainers(ctx)
	if err != nil {
		return err
	}
	moved := 0
	for _, r := range rows {
		if r.Status == store.StatusDeleted {
			continue
		}
		ses, err := m.db.GetSessionByID(ctx, r.ID)
		if err != nil {
			return err
		}
		id := m.rt.ContainerID(ses.OrgID, ses.SessionID)
		if id == ses.ContainerID {
			continue
		}
		if err := m.rt.MoveDir(ses.ContainerID, id); err != nil {
			m.log.Error("data dir moved: the session's sandbox dir stays under its old id", "session", ses.SessionID, "err", err)
			continue
		}
		ses.ContainerID = id
		if err := m.db.UpdateSession(ctx, &ses); err != nil {
			return err
		}
		moved++
	}
	if moved > 0 {
		m.log.Warn("the data dir was moved: its sessions now use this path's sandbox ids", "sessions", moved)
	}
	return nil
}

func (m *Manager) reconcileOne(ctx context.Context, ses *store.Session, st runsc.State, keep map[string]bool) {
	unlock := m.lock(ses.ID)
	defer unlock()
	logErr := func(what string, err error) {
		if err != nil {
			m.log.Error("reconcile: "+what, "session", ses.SessionID, "err", err)
		}
	}
	// adopt keeps a live sandbox as the session's running one. Its agent
	// may have been left suspended by an interrupted pause or restore:
	// woken, and what it parked for the lost server ends.
	adopt := func() {
		keep[ses.ContainerID] = true
		m.account(ses)
		if ses.Status == store.StatusRunning {
			logErr("meter", m.openRun(ctx, ses, m.now()))
		}
		logErr("wake agent", m.rt.Wake(ses.ContainerID))
		m.hooks.Started(ses)
		logErr("scrubber", m.pinScrubber(ctx, ses.ID, false)) // as in a start, running already
		// The sandbox lives on without a way out if this fails; say so.
		logErr("egress listener", m.startEgress(ses))
	}
	switch ses.Status {
	case store.StatusRunning:
		if st.Status == runsc.StatusFrozen && st.OOMKills == 0 {
			// A pause was interrupted with the sandbox frozen: finished if
			// its image was complete, else undone.
			if m.imageComplete(ses) {
				logErr("destroy", m.rt.Destroy(ctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}))
				logErr("status", m.setStatusLocked(ctx, ses, store.StatusPaused, ""))
				m.events.Event(ses.ID, "paused", map[string]any{"by": "reconcile"})
				m.auditSystem("sandbox.pause_finished", ses, nil)
				return
			}
			logErr("thaw", m.rt.Thaw(ctx, ses.ContainerID))
			st.Status = runsc.StatusRunning
		}
		if st.Status == runsc.StatusRunning && st.OOMKills == 0 {
			m.dropCheckpoint(ctx, ses) // of a pause that did not finish
			adopt()
			return
		}
		if m.imageComplete(ses) {
			// The pause got past its image and was stopped releasing the sandbox.
			logErr("destroy", m.rt.Destroy(ctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}))
			logErr("status", m.setStatusLocked(ctx, ses, store.StatusPaused, ""))
			m.events.Event(ses.ID, "paused", map[string]any{"by": "reconcile"})
			m.auditSystem("sandbox.pause_finished", ses, nil)
			return
		}
		m.account(ses) // released again by markDead
		m.markDeadLocked(ctx, ses, deathReason(st.OOMKills > 0))
	case store.StatusProvisioning:
		if ses.StartedAt != nil && m.imageComplete(ses) {
			// A resume from a checkpoint was interrupted. A sandbox that
			// runs was restored: it goes on. Otherwise the image was not
			// used yet and the session is paused again.
			if (st.Status == runsc.StatusRunning || st.Status == runsc.StatusCreated) && st.OOMKills == 0 {
				m.dropCheckpoint(ctx, ses)
				adopt()
				logErr("status", m.setStatusLocked(ctx, ses, store.StatusRunning, ""))
				m.forgetActivity(ses.ID)
				m.events.Event(ses.ID, "started", map[string]any{"size": ses.Size, "resumed": true, "restored": true})
				m.auditSystem("sandbox.resume_finished", ses, nil)
				return
			}
			logErr("destroy", m.rt.Destroy(ctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}))
			logErr("status", m.setStatusLocked(ctx, ses, store.StatusPaused, ses.StatusReason))
			m.auditSystem("sandbox.resume_undone", ses, map[string]any{"paused": true})
			return
		}
		if ses.StartedAt != nil {
			// A resume was interrupted: back to stopped, disk kept.
			logErr("destroy", m.rt.Destroy(ctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}))
			m.dropCheckpoint(ctx, ses) // an incomplete image, if any
			logErr("status", m.setStatusLocked(ctx, ses, store.StatusStopped, ses.StatusReason))
			m.auditSystem("sandbox.resume_undone", ses, nil)
			return
		}
		// The server stopped in the middle of a create: undo it.
		logErr("destroy", m.rt.Destroy(ctx, ses.ContainerID, runsc.DestroyOpts{}))
		logErr("delete row", m.db.DeleteSessionRow(ctx, ses.ID))
		m.auditSystem("sandbox.provision_undone", ses, nil)
	case store.StatusStopping:
		logErr("destroy", m.rt.Destroy(ctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}))
		if ses.StatusReason != ReasonDiskPressure { // that stop saves nothing: the data dir is short of space
			m.finishInterruptedSaveLocked(ctx, ses)
		}
		logErr("status", m.setStatusLocked(ctx, ses, store.StatusStopped, ses.StatusReason))
		m.auditSystem("sandbox.teardown_finished", ses, nil)
	}
}

// monitorEvery is how often the monitor checks running sandboxes.
const monitorEvery = 5 * time.Second

// StartMonitor checks running sandboxes periodically, so a sandbox that
// dies (OOM) is reported even when no command is running, idle sessions
// are torn down and egress counts are saved; and starts the disk watcher
// (diskpressure.go).
func (m *Manager) StartMonitor() {
	m.startDiskWatch()
	m.every(monitorEvery, m.sweep)
}

// every runs f every d on a goroutine of the manager's until Close.
func (m *Manager) every(d time.Duration, f func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-t.C:
				f()
			}
		}
	}()
}

func (m *Manager) sweep() {
	if m.onSweep != nil {
		defer func(t0 time.Time) { m.onSweep(time.Since(t0)) }(time.Now())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sessions, err := m.db.ListLiveSessions(ctx)
	if err != nil {
		m.log.Warn("monitor: list sessions", "err", err)
		return
	}
	var alive []*store.Session
	var running []string
	for i := range sessions {
		if sessions[i].Status == store.StatusStopping {
			alive = append(alive, &sessions[i]) // saving: still drawing
		}
		if sessions[i].Status == store.StatusRunning {
			running = append(running, sessions[i].ID)
		}
	}
	byID := make(map[string]*store.Session, len(sessions))
	for i := range sessions {
		byID[sessions[i].ID] = &sessions[i]
	}
	for len(running) > 0 {
		n := min(len(running), sweepBatch)
		alive = m.sweepBatch(ctx, running[:n], byID, alive)
		running = running[n:]
	}
	// Their own deadline: at hundreds of sandboxes on a loaded node the
	// round above can use up its own (measured: 700 idle sandboxes and 50
	// busy ones on 2 cores), and running time and credits must still be
	// recorded.
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	m.seeRuns(rctx, alive)
	m.enforceCredits(rctx)
	m.relievePressure(rctx, alive)
}

// maxIdleActions bounds the monitor's teardowns and pauses running at once.
const maxIdleActions = 2

// actAsync runs the monitor's action on a session (an idle teardown or
// pause, a teardown for exhausted credits) off the monitor's goroutine,
// holding the session's lock: a save or checkpoint may take long, and the
// sweep must go on noticing deaths and counting egress for everyone else.
// One action per session at a time; the Manager's Close cancels and waits
// for them.
func (m *Manager) actAsync(pk string, act func(ctx context.Context, pk string)) {
	m.actIn(&m.idleBusy, maxIdleActions, pk, act)
}

// actIn is actAsync on a pool of actions: busy (guarded by m.mu) holds
// the sessions it acts on, at most limit at once.
func (m *Manager) actIn(busy *map[string]bool, limit int, pk string, act func(ctx context.Context, pk string)) {
	m.mu.Lock()
	if *busy == nil {
		*busy = map[string]bool{}
	}
	if (*busy)[pk] || len(*busy) >= limit {
		m.mu.Unlock()
		return // next round
	}
	(*busy)[pk] = true
	m.mu.Unlock()
	m.wg.Add(1)
	m.idleWG.Add(1)
	go func() {
		defer m.wg.Done()
		defer m.idleWG.Done()
		defer func() {
			m.mu.Lock()
			delete(*busy, pk)
			m.mu.Unlock()
		}()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-m.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		unlock := m.lock(pk)
		defer unlock()
		act(ctx, pk)
	}()
}

// sweepBatch is how many sessions the monitor locks at once to re-read
// them in one query: one read per session took most of a round at a
// thousand sandboxes; a command waits at most for the batch's checks.
const sweepBatch = 64

// sweepBatch checks running sessions pks (listed in byID before their
// locks were taken) and returns alive with those still running appended.
// A session busy with a long operation (a download holds its lock for up
// to minutes) waits for the next round, not the others.
func (m *Manager) sweepBatch(ctx context.Context, pks []string, byID map[string]*store.Session, alive []*store.Session) []*store.Session {
	unlocks := map[string]func(){}
	defer func() {
		for _, u := range unlocks {
			u()
		}
	}()
	var locked []string
	for _, pk := range pks {
		if unlock, ok := m.tryLock(pk); ok {
			unlocks[pk] = unlock
			locked = append(locked, pk)
		} else {
			alive = append(alive, byID[pk]) // busy, so still there
		}
	}
	// Re-read under the locks: a session may have moved on since the list.
	cur, err := m.db.GetSessionsByID(ctx, locked)
	if err != nil {
		m.log.Warn("monitor: read sessions", "err", err)
		return alive
	}
	for _, pk := range locked {
		var idle bool
		if ses, ok := cur[pk]; ok {
			var a *store.Session
			if a, idle = m.sweepOneLocked(ctx, ses); a != nil {
				alive = append(alive, a)
			}
		}
		unlocks[pk]()
		delete(unlocks, pk)
		if idle {
			m.actAsync(pk, m.idleActLocked)
		}
	}
	return alive
}

// sweepOneLocked checks a live session read under its lock: it returns
// the session if it runs and says whether it is idle past its timeout (its
// action runs in actAsync).
func (m *Manager) sweepOneLocked(ctx context.Context, cur store.Session) (alive *store.Session, idle bool) {
	m.checkAliveLocked(ctx, &cur)
	if cur.Status != store.StatusRunning {
		return nil, false
	}
	m.persistEgress(ctx, &cur)
	return &cur, m.idle(&cur, m.now())
}

// idleActLocked pauses or tears down a session still idle past its
// timeout.
func (m *Manager) idleActLocked(ctx context.Context, pk string) {
	cur, err := m.db.GetSessionByID(ctx, pk)
	if err != nil || cur.Status != store.StatusRunning || !m.idle(&cur, m.now()) {
		return
	}
	if m.IdleAction(&cur) == config.IdlePause && m.mayPause(ctx, cur.OrgID) == nil {
		m.idlePauseLocked(ctx, &cur)
		return
	}
	if m.idle(&cur, m.now()) {
		m.log.Info("idle timeout: tearing down", "session", cur.SessionID, "idleTimeoutSeconds", cur.IdleTimeoutSeconds)
		_, err := m.teardownLocked(ctx, &cur)
		if err != nil {
			m.log.Error("idle teardown", "session", cur.SessionID, "err", err)
		}
		m.auditSystem("sandbox.idle_teardown", &cur, map[string]any{"idleTimeoutSeconds": cur.IdleTimeoutSeconds, "ok": err == nil})
	}
}

// Close stops the monitor. Sandboxes keep running.
func (m *Manager) Close() {
	select {
	case <-m.done:
	default:
		close(m.done)
	}
	m.wg.Wait()
}
