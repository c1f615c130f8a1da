package server

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
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
//	running      -> stopping -> stopped (teardown; the disk is kept)
//	running      -> failed             (sandbox died: oom, exited)
//	failed       -> stopping -> stopped (teardown releases what is left)
//	stopped      -> provisioning -> running (resume on the kept disk)
//	provisioning -> stopped            (resume failed: the disk is kept)
//	any          -> deleted            (delete; the id stays used)
var transitions = map[string][]string{
	store.StatusProvisioning: {store.StatusRunning, store.StatusFailed, store.StatusStopped},
	store.StatusRunning:      {store.StatusStopping, store.StatusFailed, store.StatusDeleted},
	store.StatusStopping:     {store.StatusStopped, store.StatusFailed},
	store.StatusFailed:       {store.StatusStopping, store.StatusDeleted},
	store.StatusStopped:      {store.StatusProvisioning, store.StatusDeleted},
}

func canTransition(from, to string) bool {
	for _, t := range transitions[from] {
		if t == to {
			return true
		}
	}
	return false
}

// manager owns the lifecycle of sessions: per-session locks, capacity, the
// monitor that notices dead sandboxes, and reconciliation at start.
type manager struct {
	s     *Server
	mu    sync.Mutex
	locks map[string]*sync.Mutex // by session pk
	live  int                    // sandboxes provisioning or running
	// perOrg and memUsed (MiB) are what live sandboxes hold; memMax caps memUsed.
	perOrg  map[string]int
	memUsed int
	memMax  int
	// activity tracks use for idle timeouts: commands running now and the
	// last time one started or ended, by session pk.
	activity map[string]*activity
	done     chan struct{}
	wg       sync.WaitGroup
	now      func() time.Time
}

func newManager(s *Server) *manager {
	mm := &manager{s: s, locks: map[string]*sync.Mutex{}, activity: map[string]*activity{}, perOrg: map[string]int{},
		done: make(chan struct{}), now: func() time.Time { return time.Now().UTC() }}
	mm.memMax = s.cfg.Limits.MaxMemoryMiB
	if mm.memMax == 0 {
		mm.memMax = hostMemoryMiB() - 2048
	}
	return mm
}

// hostMemoryMiB reads MemTotal from /proc/meminfo.
func hostMemoryMiB() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb / 1024
		}
	}
	return 0
}

type activity struct {
	running int
	last    time.Time
}

// begin records that a command started in a session; the returned func
// records its end. ok is false (and nothing recorded) when max commands
// already run there.
func (m *manager) begin(pk string, max int) (end func(), ok bool) {
	m.mu.Lock()
	a := m.activity[pk]
	if a == nil {
		a = &activity{}
		m.activity[pk] = a
	}
	if max > 0 && a.running >= max {
		m.mu.Unlock()
		return nil, false
	}
	a.running++
	a.last = m.now()
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		a.running--
		a.last = m.now()
		m.mu.Unlock()
	}, true
}

// idle reports whether a session has run nothing for longer than its idle
// timeout (0: never idle). Time without a record counts from first sight.
func (m *manager) idle(ses *store.Session, now time.Time) bool {
	if ses.IdleTimeoutSeconds <= 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.activity[ses.ID]
	if a == nil {
		m.activity[ses.ID] = &activity{last: now}
		return false
	}
	return a.running == 0 && now.Sub(a.last) > time.Duration(ses.IdleTimeoutSeconds)*time.Second
}

func (m *manager) lock(pk string) func() {
	l := m.sessionMutex(pk)
	l.Lock()
	return l.Unlock
}

// tryLock takes a session's lock only if it is free.
func (m *manager) tryLock(pk string) (func(), bool) {
	l := m.sessionMutex(pk)
	if !l.TryLock() {
		return nil, false
	}
	return l.Unlock, true
}

func (m *manager) sessionMutex(pk string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.locks[pk]
	if l == nil {
		l = &sync.Mutex{}
		m.locks[pk] = l
	}
	return l
}

// reserve takes capacity for a new sandbox: a slot on the server and in
// its organization, and its size's memory. It fails with 503 when any is
// used up.
func (m *manager) reserve(org string, memMiB int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	lim := m.s.cfg.Limits
	switch {
	case m.live >= lim.MaxSandboxes:
		return errdefs.Unavailable("this server runs its maximum of %d sandboxes; retry later", lim.MaxSandboxes)
	case m.perOrg[org] >= lim.MaxSandboxesPerOrg:
		return errdefs.Unavailable("your organization runs its maximum of %d sandboxes; tear one down first", lim.MaxSandboxesPerOrg)
	case m.memUsed+memMiB > m.memMax:
		return errdefs.Unavailable("not enough memory left on this server for this size (%d MiB free); try a smaller size or later", max(m.memMax-m.memUsed, 0))
	}
	m.live++
	m.perOrg[org]++
	m.memUsed += memMiB
	return nil
}

// account counts a sandbox found running at start.
func (m *manager) account(ses *store.Session) {
	m.mu.Lock()
	m.live++
	m.perOrg[ses.OrgID]++
	m.memUsed += ses.MemoryMiB
	m.mu.Unlock()
}

// release gives back what reserve took for a session.
func (m *manager) release(org string, memMiB int) {
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

// setStatus moves a session along the state machine and persists it.
func (m *manager) setStatus(ctx context.Context, ses *store.Session, to, reason string) error {
	if ses.Status != to && !canTransition(ses.Status, to) {
		return fmt.Errorf("session %s: illegal transition %s -> %s", ses.ID, ses.Status, to)
	}
	now := m.now()
	switch to {
	case store.StatusRunning:
		ses.StartedAt, ses.StoppedAt = &now, nil
	case store.StatusStopped, store.StatusFailed:
		if ses.StoppedAt == nil {
			ses.StoppedAt = &now
			ses.CreditsUsed += credits(ses, now)
		}
	}
	ses.Status, ses.StatusReason = to, reason
	return m.s.db.UpdateSession(ctx, ses)
}

// credits drawn by a run that started at StartedAt and ends at end.
func credits(ses *store.Session, end time.Time) float64 {
	if ses.StartedAt == nil || end.Before(*ses.StartedAt) {
		return 0
	}
	return end.Sub(*ses.StartedAt).Hours() * ses.CreditsPerHour
}

// provision creates and starts the sandbox of a freshly inserted session.
// On failure the row is removed again, so nothing is left behind.
func (m *manager) provision(ctx context.Context, ses *store.Session, size config.Size) error {
	return m.start(ses, size, false)
}

// resume starts a stopped session's sandbox again on the disk its teardown
// kept: the workspace and the writable root layer (installed packages) come
// back, processes do not. The caller holds the session's lock and has
// reserved its capacity. On failure the session is stopped again with its
// disk intact, so the resume can be retried.
func (m *manager) resume(ses *store.Session) error {
	if err := m.setStatus(context.Background(), ses, store.StatusProvisioning, ses.StatusReason); err != nil {
		return err
	}
	size := config.Size{Name: ses.Size, VCPUs: ses.VCPUs, MemoryMiB: ses.MemoryMiB, DiskMiB: ses.DiskMiB, Pids: ses.Pids}
	return m.start(ses, size, true)
}

// start creates and starts a provisioning session's sandbox. resumed says
// whether its disk comes from a teardown (and must survive a failure).
func (m *manager) start(ses *store.Session, size config.Size, resumed bool) error {
	sb := runsc.Sandbox{ID: ses.ContainerID, Image: m.s.image, Limits: sizeLimits(size)}
	// A client that goes away must not leave a half-made sandbox: create
	// runs to completion (or full undo) on its own context.
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	created := false
	fail := func(err error) error {
		m.s.log.Error("provision failed", "session", ses.SessionID, "container", ses.ContainerID, "resume", resumed, "err", err)
		if created {
			m.s.egress.Close(ses.ID)
			m.s.rt.Destroy(context.Background(), ses.ContainerID, runsc.DestroyOpts{KeepDisk: resumed})
		}
		m.s.scrub.forget(ses.ID)
		if resumed {
			m.s.logs.Event(ses.ID, "resume_failed", nil)
			if serr := m.setStatus(context.Background(), ses, store.StatusStopped, ses.StatusReason); serr != nil {
				m.s.log.Error("undo resume", "session", ses.SessionID, "err", serr)
			}
			return errdefs.Unavailable("the sandbox could not be started; the session is stopped with its workspace kept, retry the resume")
		}
		if derr := m.s.db.DeleteSessionRow(context.Background(), ses.ID); derr != nil {
			m.s.log.Error("undo session row", "session", ses.SessionID, "err", derr)
		}
		return errdefs.Unavailable("the sandbox could not be started; nothing was kept, retry with the same sessionId")
	}
	if err := m.s.rt.Create(cctx, sb); err != nil {
		return fail(err) // Create undid itself (keeping a teardown's disk)
	}
	created = true
	// Its secrets join the scrubber of text no session can be told from
	// (the standard library's log lines) before the sandbox can reach out.
	m.s.sessionScrubber(ses.ID)
	if err := m.s.startEgress(ses); err != nil {
		return fail(fmt.Errorf("egress listener: %w", err))
	}
	if err := m.setStatus(context.Background(), ses, store.StatusRunning, ""); err != nil {
		return fail(err)
	}
	m.forgetActivity(ses.ID) // idle time counts from now, not from before a teardown
	m.s.logs.Event(ses.ID, "started", map[string]any{"size": ses.Size, "resumed": resumed})
	m.s.logs.StartTail(ses.ID, m.s.rt.KernelLog(ses.ContainerID))
	return nil
}

// closeProcesses ends a session's terminals and code contexts.
func (s *Server) closeProcesses(pk string) {
	s.terms.CloseSession(pk)
	s.contexts.CloseSession(pk)
}

// forgetActivity drops a session's idle record.
func (m *manager) forgetActivity(pk string) {
	m.mu.Lock()
	delete(m.activity, pk)
	m.mu.Unlock()
}

// teardownResult is what teardown reports.
type teardownResult struct {
	WorkspaceBytes int64   `json:"workspaceBytes"`
	GitPushed      bool    `json:"gitPushed"`
	GitError       *string `json:"gitError"`
}

// teardown stops a session's sandbox and releases its compute, keeping its
// disk (workspace and writable root layer). Idempotent on a stopped session.
func (m *manager) teardown(ctx context.Context, ses *store.Session) (teardownResult, error) {
	var res teardownResult
	switch ses.Status {
	case store.StatusStopped:
		return res, nil
	case store.StatusRunning, store.StatusFailed, store.StatusStopping:
	default:
		return res, errdefs.Conflict("session is %s; only a running or failed session can be torn down", ses.Status)
	}
	if ses.Status != store.StatusStopping {
		wasLive := ses.Status == store.StatusRunning
		if err := m.setStatus(ctx, ses, store.StatusStopping, ses.StatusReason); err != nil {
			return res, err
		}
		if wasLive {
			m.release(ses.OrgID, ses.MemoryMiB) // a stopping session holds no capacity
		}
	}
	m.s.closeProcesses(ses.ID)
	m.s.logs.StopTail(ses.ID)
	m.s.stopEgress(ses)
	if dir, release, err := m.s.rt.OpenWorkspace(ses.ContainerID, false); err == nil {
		res.WorkspaceBytes = workspace.DiskUsage(dir)
		release()
	}
	if err := m.s.rt.Destroy(context.Background(), ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}); err != nil {
		m.s.log.Error("teardown", "session", ses.SessionID, "err", err)
		return res, errdefs.Unavailable("the sandbox could not be stopped completely; retry the teardown")
	}
	reason := ses.StatusReason
	m.s.logs.Event(ses.ID, "stopped", map[string]any{"workspaceBytes": res.WorkspaceBytes})
	return res, m.setStatus(context.Background(), ses, store.StatusStopped, reason)
}

// remove tears down if needed and deletes the session's disk; the row stays
// (status deleted) so the session id is never reused.
func (m *manager) remove(ctx context.Context, ses *store.Session) error {
	if ses.Status == store.StatusProvisioning {
		return errdefs.Conflict("session is still provisioning")
	}
	m.s.closeProcesses(ses.ID)
	m.s.logs.StopTail(ses.ID)
	if ses.Status == store.StatusRunning || ses.Status == store.StatusStopping {
		m.s.stopEgress(ses) // teardown and markDead did it for the others
	}
	if err := m.s.rt.Destroy(context.Background(), ses.ContainerID, runsc.DestroyOpts{}); err != nil {
		m.s.log.Error("delete", "session", ses.SessionID, "err", err)
		return errdefs.Unavailable("the sandbox could not be removed completely; retry the delete")
	}
	if ses.Status == store.StatusRunning || ses.Status == store.StatusStopping {
		if ses.Status == store.StatusRunning {
			m.release(ses.OrgID, ses.MemoryMiB)
		}
		now := m.now()
		ses.StoppedAt = &now
		ses.CreditsUsed += credits(ses, now)
	}
	ses.Status = store.StatusDeleted
	m.s.scrub.forget(ses.ID)
	m.s.logs.Forget(ses.ID)
	m.s.files.Forget(ses.ID)
	return m.s.db.UpdateSession(context.Background(), ses)
}

// markDead records that a running sandbox died (reason "oom" or "exited")
// and releases its host resources, keeping its disk.
func (m *manager) markDead(ses *store.Session, reason string) {
	if ses.Status != store.StatusRunning {
		return
	}
	m.s.stopEgress(ses)
	if err := m.setStatus(context.Background(), ses, store.StatusFailed, reason); err != nil {
		m.s.log.Error("mark failed", "session", ses.SessionID, "err", err)
		return
	}
	m.release(ses.OrgID, ses.MemoryMiB)
	m.s.closeProcesses(ses.ID)
	m.s.logs.StopTail(ses.ID)
	if reason == "oom" {
		m.s.logs.Event(ses.ID, "oom", map[string]any{"memoryMiB": ses.MemoryMiB})
	}
	m.s.logs.Event(ses.ID, "exit", map[string]any{"reason": reason})
	m.s.log.Warn("sandbox died", "session", ses.SessionID, "reason", reason)
	m.auditSystem("sandbox.failed", ses, map[string]any{"reason": reason})
	if err := m.s.rt.Destroy(context.Background(), ses.ContainerID, runsc.DestroyOpts{KeepDisk: true}); err != nil {
		m.s.log.Error("release dead sandbox", "session", ses.SessionID, "err", err)
	}
}

// checkAlive inspects a running session's sandbox and marks it failed if it
// is gone. Callers hold the session's lock.
func (m *manager) checkAlive(ctx context.Context, ses *store.Session) {
	if ses.Status != store.StatusRunning {
		return
	}
	st, err := m.s.rt.Inspect(ctx, ses.ContainerID)
	if err != nil {
		return
	}
	if st.Status == runsc.StatusRunning && st.OOMKills == 0 {
		return
	}
	reason := "exited"
	if st.OOMKills > 0 {
		reason = "oom"
	}
	m.markDead(ses, reason)
}

// reconcile runs at start: sessions whose sandboxes still run stay usable,
// records of dead ones are marked failed, interrupted operations are
// finished, and leftovers of this server's prefix are collected.
func (m *manager) reconcile(ctx context.Context) error {
	sessions, err := m.s.db.ListLiveSessions(ctx)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for i := range sessions {
		ses := &sessions[i]
		st, err := m.s.rt.Inspect(ctx, ses.ContainerID)
		if err != nil {
			return fmt.Errorf("inspect %s: %w", ses.ContainerID, err)
		}
		switch ses.Status {
		case store.StatusRunning:
			if st.Status == runsc.StatusRunning && st.OOMKills == 0 {
				keep[ses.ContainerID] = true
				m.account(ses)
				m.s.logs.StartTail(ses.ID, m.s.rt.KernelLog(ses.ContainerID))
				m.s.sessionScrubber(ses.ID) // as in provision
				if err := m.s.startEgress(ses); err != nil {
					// The sandbox lives on without a way out; say so.
					m.s.log.Error("reconcile: egress listener", "session", ses.SessionID, "err", err)
				}
				continue
			}
			m.account(ses) // released again by markDead
			reason := "exited"
			if st.OOMKills > 0 {
				reason = "oom"
			}
			m.markDead(ses, reason)
		case store.StatusProvisioning:
			if ses.StartedAt != nil {
				// A resume was interrupted: back to stopped, disk kept.
				m.s.rt.Destroy(ctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true})
				m.setStatus(ctx, ses, store.StatusStopped, ses.StatusReason)
				m.auditSystem("sandbox.resume_undone", ses, nil)
				continue
			}
			// The server stopped in the middle of a create: undo it.
			m.s.rt.Destroy(ctx, ses.ContainerID, runsc.DestroyOpts{})
			m.s.db.DeleteSessionRow(ctx, ses.ID)
			m.auditSystem("sandbox.provision_undone", ses, nil)
		case store.StatusStopping:
			m.s.rt.Destroy(ctx, ses.ContainerID, runsc.DestroyOpts{KeepDisk: true})
			m.setStatus(ctx, ses, store.StatusStopped, ses.StatusReason)
			m.auditSystem("sandbox.teardown_finished", ses, nil)
		}
	}
	m.s.rt.CleanExecFiles()
	if ids := m.s.rt.Collect(ctx, keep); len(ids) > 0 {
		m.s.log.Info("collected leftover sandboxes", "count", len(ids))
	}
	return nil
}

// auditSystem records what the server did on its own (user "system").
func (m *manager) auditSystem(action string, ses *store.Session, details map[string]any) {
	m.s.db.Audit(store.AuditRecord{
		Time: m.now(), OrgID: ses.OrgID, UserID: "system", Action: action,
		SessionID: ses.SessionID, Outcome: "ok", Details: details,
	})
}

// startMonitor checks running sandboxes periodically, so a sandbox that dies
// (OOM) is reported even when no command is running.
func (m *manager) startMonitor() {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-t.C:
				m.sweep()
			}
		}
	}()
}

func (m *manager) sweep() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sessions, err := m.s.db.ListLiveSessions(ctx)
	if err != nil {
		return
	}
	for i := range sessions {
		ses := &sessions[i]
		if ses.Status != store.StatusRunning {
			continue
		}
		// A session busy with a long operation (a download holds its lock for
		// up to minutes) waits for the next round, not the others.
		unlock, ok := m.tryLock(ses.ID)
		if !ok {
			continue
		}
		// Re-read under the lock: the session may have moved on.
		if cur, err := m.s.db.GetSessionByID(ctx, ses.ID); err == nil {
			m.checkAlive(ctx, &cur)
			if cur.Status == store.StatusRunning {
				m.s.persistEgress(ctx, &cur)
			}
			if cur.Status == store.StatusRunning && m.idle(&cur, m.now()) {
				m.s.log.Info("idle timeout: tearing down", "session", cur.SessionID, "idleTimeoutSeconds", cur.IdleTimeoutSeconds)
				_, err := m.teardown(ctx, &cur)
				if err != nil {
					m.s.log.Error("idle teardown", "session", cur.SessionID, "err", err)
				}
				m.auditSystem("sandbox.idle_teardown", &cur, map[string]any{"idleTimeoutSeconds": cur.IdleTimeoutSeconds, "ok": err == nil})
			}
		}
		unlock()
	}
}

func (m *manager) stop() {
	select {
	case <-m.done:
	default:
		close(m.done)
	}
	m.wg.Wait()
}
