package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/store"
)

// Admission overcommits sizes and refuses on the memory actually in use.
func TestAdmissionOvercommit(t *testing.T) {
	var avail atomic.Int64
	avail.Store(8192)
	e := newEnv(t, func(c *config.Config) {
		c.Limits.MaxMemoryMiB, c.Limits.MemoryOvercommit, c.Limits.MaxSandboxesPerOrg = 2048, 3, 100
	})
	e.m.memAvailable = func() int { return int(avail.Load()) }
	z, _ := e.cfg.Sizes.Resolve("")
	n := 0
	for ; n < 100; n++ {
		if _, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "o" + string(rune('a'+n)), Size: z}); err != nil {
			if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "with overcommit") {
				t.Fatalf("refusal %d: %v", n, err)
			}
			break
		}
	}
	if want := 3 * 2048 / z.MemoryMiB; n != want {
		t.Fatalf("admitted %d sandboxes of %d MiB, want %d (2048 MiB x 3)", n, z.MemoryMiB, want)
	}
	e.m.Delete(context.Background(), e.p.Org.ID, "oa")
	avail.Store(500) // below minFreeMemoryMiB (1024)
	_, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "late", Size: z})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "500 MiB available") {
		t.Fatalf("provision with the memory in use: %v", err)
	}
}

// Under memory pressure the monitor pauses the coldest idle sessions, not
// busy or recently used ones, and a paused one resumes on its next command.
func TestPressurePausesColdest(t *testing.T) {
	var avail atomic.Int64
	avail.Store(8192)
	e := newEnv(t, func(c *config.Config) { c.Limits.MaxSandboxesPerOrg = 10 })
	e.m.memAvailable = func() int { return int(avail.Load()) }
	ctx := context.Background()
	for _, id := range []string{"cold", "warm", "busy", "fresh"} {
		e.provision(id, 0)
	}
	get := func(id string) store.Session {
		ses, err := e.m.Get(ctx, e.p.Org.ID, id)
		if err != nil {
			t.Fatal(err)
		}
		return ses
	}
	use := func(id string) func() {
		ses := get(id)
		end, _ := e.m.begin(ses.ID, 0)
		return end
	}
	use("cold")()
	e.advance(5 * time.Minute)
	use("warm")()
	end := use("busy") // still running a command
	defer end()
	e.advance(2 * time.Minute)
	use("fresh")()
	e.advance(30 * time.Second) // fresh: idle 30 s < pressureMinIdleSeconds (60)

	e.m.sweep() // plenty of memory: nothing happens
	e.m.idleWG.Wait()
	avail.Store(1000)
	e.m.sweep()
	e.m.idleWG.Wait()
	want := map[string]string{"cold": store.StatusPaused, "warm": store.StatusPaused, "busy": store.StatusRunning, "fresh": store.StatusRunning}
	for id, st := range want {
		if got := get(id); got.Status != st || (st == store.StatusPaused && got.StatusReason != ReasonMemoryPressure) {
			t.Errorf("%s: %s (%s), want %s", id, got.Status, got.StatusReason, st)
		}
	}
	// The next command finds it paused and runs anyway.
	avail.Store(8192)
	cmd, err := e.m.Command(ctx, get("cold"), Admit{NotRunning: "x", Slot: true})
	if err != nil || cmd.Session.Status != store.StatusRunning {
		t.Fatalf("command on a pressure-paused session: %v", err)
	}
	cmd.End()
	// A session a client paused stays paused.
	if _, err := e.m.Pause(ctx, e.p.Org.ID, "fresh"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Command(ctx, get("fresh"), Admit{NotRunning: "x"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("command on a client-paused session: %v", err)
	}
}

// A start is refused while the host is short of process ids (a sandbox
// that cannot make a host thread dies), and admitted again once there are.
func TestAdmissionPids(t *testing.T) {
	var free atomic.Int64
	free.Store(100_000)
	e := newEnv(t)
	e.m.pidsFree = func() int { return int(free.Load()) }
	z, _ := e.cfg.Sizes.Resolve("")
	if _, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "p1", Size: z}); err != nil {
		t.Fatal(err)
	}
	free.Store(int64(e.cfg.Limits.MinFreePids - 1))
	_, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "p2", Size: z})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "short of process ids") {
		t.Fatalf("provision short of pids: %v", err)
	}
	if _, err := e.m.Get(context.Background(), e.p.Org.ID, "p2"); err == nil {
		t.Fatal("the refused provision left a session")
	}
	free.Store(100_000)
	if _, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "p2", Size: z}); err != nil {
		t.Fatalf("provision once pids are free: %v", err)
	}
}

func TestHostPids(t *testing.T) {
	used, limit := HostPids()
	if used < 1 || limit < used {
		t.Fatalf("HostPids: %d of %d", used, limit)
	}
}
