package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/store"
)

// Pause checkpoints and releases capacity and credits; resume restores
// (keeping the session's own idle timeout); a failed checkpoint leaves the
// session running; a restore that fails starts cold and says so; teardown
// and delete of a paused session drop the image.
func TestPauseResume(t *testing.T) {
	e := newEnv(t, func(c *config.Config) { c.Limits.MaxSandboxesPerOrg = 1 })
	ctx := context.Background()
	org := e.p.Org.ID
	ses := e.provision("p1", 300)
	img := e.rt.CheckpointDir(ses.ContainerID)

	e.rt.CheckpointErr = fmt.Errorf("%w: disk full", runsc.ErrCheckpointFailed)
	if _, err := e.m.Pause(ctx, org, "p1"); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "still running") {
		t.Fatalf("failed pause: %v", err)
	}
	if got := e.status("p1"); got != store.StatusRunning {
		t.Fatalf("after a failed pause: %s", got)
	}
	e.rt.CheckpointErr = nil

	e.advance(time.Hour)
	p, err := e.m.Pause(ctx, org, "p1")
	if err != nil || p.Status != store.StatusPaused {
		t.Fatalf("pause: %+v %v", p, err)
	}
	credits, _ := e.m.SessionCredits(ctx, &p)
	if credits <= 0 {
		t.Fatalf("credits of the hour run: %v", credits)
	}
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("no image: %v", err)
	}
	if p2, err := e.m.Pause(ctx, org, "p1"); err != nil || p2.Status != store.StatusPaused {
		t.Fatalf("pause again: %v", err)
	}
	// Credits stop, capacity is free, commands are refused.
	e.advance(time.Hour)
	p, _ = e.m.Get(ctx, org, "p1")
	if c, _ := e.m.SessionCredits(ctx, &p); c != credits {
		t.Fatal("credits grew while paused")
	}
	if _, err := e.m.Command(ctx, p, Admit{NotRunning: "resume it first"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("command on a paused session: %v", err)
	}
	other := e.provision("other", 0) // the org's one slot is free
	// ... so a resume is refused while it is taken, and stays paused.
	if _, err := e.m.Resume(ctx, org, "p1"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("resume without capacity: %v", err)
	}
	if got := e.status("p1"); got != store.StatusPaused {
		t.Fatalf("a refused resume must leave it paused, got %s", got)
	}
	if err := e.m.Delete(ctx, org, other.SessionID); err != nil {
		t.Fatal(err)
	}

	r, err := e.m.Resume(ctx, org, "p1")
	if err != nil || r.Status != store.StatusRunning || r.IdleTimeoutSeconds != 300 {
		t.Fatalf("resume: %+v %v", r, err)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Fatalf("image kept after resume: %v", err)
	}
	if calls := strings.Join(e.rt.CallsWith("restore"), ","); calls != "restore "+ses.ContainerID {
		t.Fatalf("restore calls: %s", calls)
	}
	if h := e.hooks.list(); !strings.Contains(h, "paused") || !strings.Contains(h, "resumed p1") || !strings.Contains(h, "event paused") {
		t.Fatalf("hooks: %s", h)
	}

	// A restore that fails starts cold on the disk and says so.
	if _, err := e.m.Pause(ctx, org, "p1"); err != nil {
		t.Fatal(err)
	}
	e.rt.RestoreErr = errors.New("bad image")
	if r, err := e.m.Resume(ctx, org, "p1"); err != nil || r.Status != store.StatusRunning {
		t.Fatalf("cold fallback: %+v %v", r, err)
	}
	if h := e.hooks.list(); !strings.Contains(h, "event restore_failed") {
		t.Fatalf("no restore_failed event: %s", h)
	}
	e.rt.RestoreErr = nil

	// Teardown and delete of a paused session drop the image.
	if _, err := e.m.Pause(ctx, org, "p1"); err != nil {
		t.Fatal(err)
	}
	if s, _, err := e.m.Teardown(ctx, org, "p1"); err != nil || s.Status != store.StatusStopped {
		t.Fatalf("teardown of a paused session: %+v %v", s, err)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Fatalf("image kept after teardown: %v", err)
	}
	if _, err := e.m.Pause(ctx, org, "p1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("pause of a stopped session: %v", err)
	}
	if _, err := e.m.Resume(ctx, org, "p1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Pause(ctx, org, "p1"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Delete(ctx, org, "p1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Fatalf("image kept after delete: %v", err)
	}
}

// The idle timeout pauses a session whose idleAction (or the server's
// default) is pause, and tears it down if the checkpoint fails.
func TestIdlePause(t *testing.T) {
	e := newEnv(t, func(c *config.Config) { c.Limits.IdleAction = config.IdlePause })
	ctx := context.Background()
	z, _ := e.cfg.Sizes.Resolve("")
	if _, err := e.m.Provision(ctx, e.p, Spec{SessionID: "td", Size: z, IdleTimeoutSeconds: 60, IdleAction: config.IdleTeardown}); err != nil {
		t.Fatal(err)
	}
	e.provision("dflt", 60)
	e.m.sweep()
	e.m.idleWG.Wait()
	e.advance(61 * time.Second)
	e.m.sweep()
	e.m.idleWG.Wait()
	if a, b := e.status("td"), e.status("dflt"); a != store.StatusStopped || b != store.StatusPaused {
		t.Fatalf("idle: td %s, dflt %s", a, b)
	}
	// Resumed, it gets its own timeout again, counted from the resume.
	if _, err := e.m.Resume(ctx, e.p.Org.ID, "dflt"); err != nil {
		t.Fatal(err)
	}
	e.m.sweep()
	e.m.idleWG.Wait()
	e.advance(30 * time.Second)
	e.m.sweep()
	e.m.idleWG.Wait()
	if got := e.status("dflt"); got != store.StatusRunning {
		t.Fatalf("paused again before its own timeout: %s", got)
	}
	e.rt.CheckpointErr = fmt.Errorf("%w: no space", runsc.ErrCheckpointFailed)
	e.advance(31 * time.Second)
	e.m.sweep()
	e.m.idleWG.Wait()
	if got := e.status("dflt"); got != store.StatusStopped {
		t.Fatalf("a failed idle pause tears down: %s", got)
	}
}
