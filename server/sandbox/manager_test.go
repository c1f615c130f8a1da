package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/egress"
	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/server/sandbox/sandboxtest"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

// Manager tests: the domain on a real SQLite file, a real egress proxy
// (on loopback listeners) and the fake driver. No root, no gVisor.

type env struct {
	t     testing.TB
	m     *Manager
	rt    *sandboxtest.Runtime
	db    *store.DB
	p     store.Principal
	cfg   *config.Config
	hooks *recHooks
	now   time.Time
	nowMu sync.Mutex
}

// recHooks records hook calls and events.
type recHooks struct {
	mu    sync.Mutex
	calls []string
}

func (h *recHooks) add(s string) {
	h.mu.Lock()
	h.calls = append(h.calls, s)
	h.mu.Unlock()
}

func (h *recHooks) Started(ses *store.Session)                   { h.add("started " + ses.SessionID) }
func (h *recHooks) Stopped(pk string)                            { h.add("stopped") }
func (h *recHooks) Deleted(pk string)                            { h.add("deleted") }
func (h *recHooks) Paused(pk string)                             { h.add("paused") }
func (h *recHooks) Resumed(ses *store.Session)                   { h.add("resumed " + ses.SessionID) }
func (h *recHooks) Event(pk, kind string, fields map[string]any) { h.add("event " + kind) }

func (h *recHooks) list() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.calls, ", ")
}

func newEnv(t testing.TB, tweak ...func(*config.Config)) *env {
	t.Helper()
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tweak {
		f(cfg)
	}
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := store.LoadKeyring(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	db.SetKeyring(keys)
	p, _, _, err := db.Bootstrap(context.Background(), "default", "owner", "")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := egress.NewPolicy(cfg.Egress)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, rt: &sandboxtest.Runtime{WorkspaceRoot: t.TempDir()}, db: db, p: p, cfg: cfg, hooks: &recHooks{},
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	proxy := egress.New(pol, egress.Options{Logger: slog.New(slog.DiscardHandler)})
	rules, _ := scrub.NewSet(nil)
	e.m = New(Options{Limits: cfg.Limits, DataDir: cfg.DataDir, Image: "/image", Runtime: e.rt, Store: db, Egress: proxy,
		Policy: pol, Events: e.hooks, Hooks: e.hooks, Rules: rules, Log: slog.New(slog.DiscardHandler), Now: e.clock})
	t.Cleanup(func() {
		e.m.Close()
		proxy.Shutdown()
		db.Close()
	})
	return e
}

func (e *env) clock() time.Time {
	e.nowMu.Lock()
	defer e.nowMu.Unlock()
	return e.now
}

func (e *env) advance(d time.Duration) {
	e.nowMu.Lock()
	e.now = e.now.Add(d)
	e.nowMu.Unlock()
}

func (e *env) provision(id string, idle int) store.Session {
	e.t.Helper()
	z, _ := e.cfg.Sizes.Resolve("")
	ses, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: id, Size: z, IdleTimeoutSeconds: idle})
	if err != nil {
		e.t.Fatalf("provision %s: %v", id, err)
	}
	return ses
}

func (e *env) status(id string) string {
	e.t.Helper()
	ses, err := e.m.Get(context.Background(), e.p.Org.ID, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return ses.Status
}

// Idle timeout: a session with idleTimeoutSeconds is torn down by the
// monitor once no command has run for that long; time is an input.
func TestIdleTimeoutTearsDown(t *testing.T) {
	e := newEnv(t)
	e.provision("idle1", 60)
	busy := e.provision("busy1", 60)
	forever := e.provision("forever", 0)
	watched := e.provision("watched", 60)
	e.m.sweep() // first sight of the sessions
	e.m.idleWG.Wait()
	// An attached terminal is use for as long as it is attached.
	term, err := e.m.Command(context.Background(), watched, Admit{Use: true})
	if err != nil {
		t.Fatal(err)
	}

	e.advance(50 * time.Second)
	cmd, err := e.m.Command(context.Background(), busy, Admit{NotRunning: "x", Slot: true})
	if err != nil {
		t.Fatal(err)
	}
	cmd.End()
	e.advance(20 * time.Second) // idle1: 70 s idle; busy1: 20 s
	// A session whose lock is held (a long download) does not hold up the
	// monitor for the others.
	unlock := e.m.lock(forever.ID)
	swept := make(chan struct{})
	go func() { e.m.sweep(); close(swept) }()
	select {
	case <-swept:
	case <-time.After(5 * time.Second):
		t.Fatal("the monitor waited for a locked session")
	}
	unlock()
	e.m.idleWG.Wait()
	for id, want := range map[string]string{"idle1": "stopped", "busy1": "running", "forever": "running", "watched": "running"} {
		if got := e.status(id); got != want {
			t.Errorf("%s: status %s, want %s", id, got, want)
		}
	}
	e.advance(time.Hour)
	e.m.sweep()
	e.m.idleWG.Wait()
	if got := e.status("forever"); got != "running" {
		t.Errorf("no idle timeout: status %s", got)
	}
	if got := e.status("watched"); got != "running" {
		t.Errorf("attached terminal: status %s", got)
	}
	term.End() // detached: idle from now
	e.advance(61 * time.Second)
	e.m.sweep()
	e.m.idleWG.Wait()
	if got := e.status("watched"); got != "stopped" {
		t.Errorf("detached terminal past the timeout: status %s", got)
	}
}

// A failed start undoes every step: no row (the id can be retried), no
// capacity held, the sandbox destroyed with its disk.
func TestProvisionFailureUndoesAll(t *testing.T) {
	e := newEnv(t, func(c *config.Config) { c.Limits.MaxSandboxes = 1 })
	e.rt.CreateErr = errors.New("boom")
	z, _ := e.cfg.Sizes.Resolve("")
	_, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "f1", Size: z, Secrets: map[string]string{"K": "a-secret-value"}})
	if !errors.Is(err, errdefs.ErrUnavailable) || strings.Contains(err.Error(), "boom") && !strings.Contains(err.Error(), "retry") {
		t.Fatalf("provision = %v", err)
	}
	if _, err := e.m.Get(context.Background(), e.p.Org.ID, "f1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the row was kept: %v", err)
	}
	e.rt.CreateErr = nil
	e.provision("f1", 0) // the id and the one slot are free again
	if _, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "f2", Size: z}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("over capacity: %v", err)
	}
	if _, _, err := e.m.Teardown(context.Background(), e.p.Org.ID, "f1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "f1", Size: z}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("id reused: %v", err)
	}
}

// Resume of a stopped session; a failed resume leaves it stopped with its
// disk, and the capacity it reserved free.
func TestResumeAndFailedResume(t *testing.T) {
	e := newEnv(t, func(c *config.Config) { c.Limits.MaxSandboxes = 1 })
	e.provision("r1", 0)
	if _, res, err := e.m.Teardown(context.Background(), e.p.Org.ID, "r1"); err != nil || res.WorkspaceBytes <= 0 {
		t.Fatalf("teardown: %+v %v", res, err)
	}
	e.rt.CreateErr = errors.New("boom")
	if _, err := e.m.Resume(context.Background(), e.p.Org.ID, "r1"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("failed resume: %v", err)
	}
	if got := e.status("r1"); got != store.StatusStopped {
		t.Fatalf("after a failed resume: %s", got)
	}
	if !strings.Contains(e.hooks.list(), "event resume_failed") {
		t.Errorf("events: %s", e.hooks.list())
	}
	e.rt.CreateErr = nil
	ses, err := e.m.Resume(context.Background(), e.p.Org.ID, "r1")
	if err != nil || ses.Status != store.StatusRunning {
		t.Fatalf("resume: %+v %v", ses, err)
	}
	if keep := e.rt.CallsWith("destroy"); len(keep) == 0 || !strings.HasSuffix(keep[len(keep)-1], "keep=true") {
		t.Errorf("destroys: %v", keep)
	}
	// Running: answered as it is.
	if ses, err := e.m.Resume(context.Background(), e.p.Org.ID, "r1"); err != nil || ses.Status != store.StatusRunning {
		t.Fatalf("resume of a running session: %v", err)
	}
}

// Delete removes the disk, keeps the row hidden, drops per-session state
// and frees the capacity; the lock table does not keep sessions nobody uses.
func TestDeletePrunes(t *testing.T) {
	e := newEnv(t)
	ses := e.provision("d1", 0)
	cmd, err := e.m.Command(context.Background(), ses, Admit{Slot: true})
	if err != nil {
		t.Fatal(err)
	}
	cmd.End()
	if err := e.m.Delete(context.Background(), e.p.Org.ID, "d1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Get(context.Background(), e.p.Org.ID, "d1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a deleted session: %v", err)
	}
	if err := e.m.Delete(context.Background(), e.p.Org.ID, "d1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if got := e.hooks.list(); !strings.Contains(got, "stopped") || !strings.Contains(got, "deleted") {
		t.Errorf("hooks: %s", got)
	}
	e.m.mu.Lock()
	locks, acts, live := len(e.m.locks), len(e.m.activity), e.m.live
	e.m.mu.Unlock()
	if locks != 0 || acts != 0 || live != 0 {
		t.Errorf("after delete: %d locks, %d activity records, %d live", locks, acts, live)
	}
	if _, ok := e.m.scrub.cached(ses.ID); ok {
		t.Error("the scrubber of a deleted session is kept")
	}
	if keep := e.rt.CallsWith("destroy"); keep[len(keep)-1] != "destroy "+ses.ContainerID+" keep=false" {
		t.Errorf("destroys: %v", keep)
	}
}

// At most limits.maxExecsPerSession commands hold a slot at once.
func TestCommandSlots(t *testing.T) {
	e := newEnv(t, func(c *config.Config) { c.Limits.MaxExecsPerSession = 2 })
	ses := e.provision("c1", 0)
	a, _ := e.m.Command(context.Background(), ses, Admit{Slot: true})
	b, _ := e.m.Command(context.Background(), ses, Admit{Slot: true})
	if _, err := e.m.Command(context.Background(), ses, Admit{Slot: true}); !errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("third command: %v", err)
	}
	if _, err := e.m.Command(context.Background(), ses, Admit{}); err != nil {
		t.Fatalf("a terminal takes no slot: %v", err)
	}
	a.End()
	a.End() // twice frees one slot only
	c, err := e.m.Command(context.Background(), ses, Admit{Slot: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Command(context.Background(), ses, Admit{Slot: true}); !errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("End counted twice: %v", err)
	}
	b.End()
	c.End()
	e.m.Teardown(context.Background(), e.p.Org.ID, "c1")
	stopped, _ := e.m.Get(context.Background(), e.p.Org.ID, "c1")
	_, err = e.m.Command(context.Background(), stopped, Admit{NotRunning: "commands run only in a running session"})
	if !errors.Is(err, errdefs.ErrConflict) || err.Error() != "session is stopped; commands run only in a running session" {
		t.Fatalf("stopped: %v", err)
	}
}

// A command that sees its sandbox die marks the session failed once the
// driver confirms it; a command that reports on a sandbox a teardown and
// resume replaced leaves the new one alone.
func TestExecNoticesDeath(t *testing.T) {
	e := newEnv(t)
	ses := e.provision("x1", 0)
	e.rt.ExecFn = func(runsc.ExecRequest) (runsc.ExecResult, error) {
		return runsc.ExecResult{OOM: true, ExitCode: 137}, nil
	}
	// The sandbox the command ran in was replaced: the current one runs.
	cmd, _ := e.m.Command(context.Background(), ses, Admit{Slot: true})
	if _, err := e.m.Exec(context.Background(), cmd, runsc.ExecRequest{}); err != nil {
		t.Fatal(err)
	}
	cmd.End()
	if got := e.status("x1"); got != store.StatusRunning {
		t.Fatalf("a stale result killed the running sandbox: %s", got)
	}
	// The sandbox really died of OOM.
	e.rt.Mu.Lock()
	e.rt.InspectState = runsc.State{Status: runsc.StatusStopped, OOMKills: 1}
	e.rt.Mu.Unlock()
	cmd, _ = e.m.Command(context.Background(), ses, Admit{Slot: true})
	if _, err := e.m.Exec(context.Background(), cmd, runsc.ExecRequest{}); err != nil {
		t.Fatal(err)
	}
	cmd.End()
	cur, _ := e.m.Get(context.Background(), e.p.Org.ID, "x1")
	if cur.Status != store.StatusFailed || cur.StatusReason != "oom" {
		t.Fatalf("after an OOM: %s %s", cur.Status, cur.StatusReason)
	}
	if got := e.hooks.list(); !strings.Contains(got, "event oom") || !strings.Contains(got, "event exit") {
		t.Errorf("events: %s", got)
	}
}

// Reconcile logs what it cannot finish for one session and goes on with
// the others; an interrupted create is undone.
func TestReconcile(t *testing.T) {
	e := newEnv(t)
	run := e.provision("alive", 0)
	dead := e.provision("dead", 0)
	// An interrupted create: a provisioning row.
	half := store.Session{OrgID: e.p.Org.ID, ProjectID: e.p.ProjectID, SessionID: "half", CreatedBy: e.p.User.ID,
		ContainerID: e.rt.ContainerID(e.p.Org.ID, "half"), Status: store.StatusProvisioning}
	if err := e.db.InsertSession(context.Background(), &half); err != nil {
		t.Fatal(err)
	}
	m2 := New(Options{Limits: e.cfg.Limits, DataDir: e.cfg.DataDir, Runtime: &deadRuntime{e.rt, dead.ContainerID}, Store: e.db,
		Egress: e.m.egress, Policy: e.m.policy, Events: e.hooks, Hooks: e.hooks, Rules: e.m.scrub.base,
		Log: slog.New(slog.DiscardHandler), Now: e.clock})
	if err := m2.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{run.SessionID: "running", dead.SessionID: "failed"} {
		if got := e.status(id); got != want {
			t.Errorf("%s: %s, want %s", id, got, want)
		}
	}
	if _, err := e.m.Get(context.Background(), e.p.Org.ID, "half"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("interrupted create kept: %v", err)
	}
	if m2.live != 1 {
		t.Errorf("capacity after reconcile: %d live, want 1", m2.live)
	}
}

// deadRuntime reports one container as gone.
type deadRuntime struct {
	*sandboxtest.Runtime
	dead string
}

func (d *deadRuntime) Inspect(ctx context.Context, id string) (runsc.State, error) {
	if id == d.dead {
		return runsc.State{ID: id, Status: runsc.StatusStopped}, nil
	}
	return d.Runtime.Inspect(ctx, id)
}

// A teardown that waits for the lock of a session whose provision fails
// finds no session when it gets the lock.
func TestTeardownWaitingForFailedProvision(t *testing.T) {
	e := newEnv(t)
	e.rt.CreateGate, e.rt.CreateStarted = make(chan struct{}), make(chan struct{})
	e.rt.CreateErr = errors.New("boom")
	z, _ := e.cfg.Sizes.Resolve("")
	provErr := make(chan error)
	go func() {
		_, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "race-1", Size: z})
		provErr <- err
	}()
	<-e.rt.CreateStarted
	ses, err := e.m.Get(context.Background(), e.p.Org.ID, "race-1")
	if err != nil || ses.Status != store.StatusProvisioning {
		t.Fatalf("during create: %+v %v", ses, err)
	}
	tdErr := make(chan error)
	go func() {
		_, _, err := e.m.Teardown(context.Background(), e.p.Org.ID, "race-1")
		tdErr <- err
	}()
	// The teardown is waiting once the lock has two users.
	for deadline := time.Now().Add(5 * time.Second); ; {
		e.m.mu.Lock()
		refs := 0
		if l := e.m.locks[ses.ID]; l != nil {
			refs = l.refs
		}
		e.m.mu.Unlock()
		if refs == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the teardown never waited for the lock (%d users)", refs)
		}
		runtime.Gosched()
	}
	close(e.rt.CreateGate)
	if err := <-provErr; !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("provision: %v", err)
	}
	if err := <-tdErr; !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("teardown after the failed create: %v", err)
	}
}
