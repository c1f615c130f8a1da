package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"sandboxd/egress"
	"sandboxd/server/config"
	"sandboxd/server/credits"
	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

// A plan table for tests: "tiny" (the default) has one credit a month.
const testPlans = `
default: tiny
firstOrg: tiny
minSliceSeconds: 300
plans:
  - {name: tiny, monthlyCredits: 1, largestSize: standard-1, maxConcurrent: 1, egressMiB: 16, storageMiB: 0, pause: false}
  - {name: big, monthlyCredits: 100, largestSize: "", maxConcurrent: 4, egressMiB: 0, storageMiB: 0, pause: true}
`

func billingEnv(t *testing.T) *env {
	e := newEnv(t)
	plans, err := config.ParsePlans([]byte(testPlans), e.cfg.Sizes)
	if err != nil {
		t.Fatal(err)
	}
	e.cfg.Plans = plans
	e.m.Close()
	e.m = e.newManager()
	return e
}

// newManager is a Manager on e's store and driver, as a restarted server
// makes one.
func (e *env) newManager() *Manager {
	pol, _ := egress.NewPolicy(e.cfg.Egress)
	proxy := egress.New(pol, egress.Options{Logger: slog.New(slog.DiscardHandler)})
	rules, _ := scrub.NewSet(nil)
	m := New(Options{Limits: e.cfg.Limits, DataDir: e.cfg.DataDir, Image: "/image", Runtime: e.rt, Store: e.db, Egress: proxy,
		Policy: pol, Events: e.hooks, Hooks: e.hooks, Rules: rules, Log: slog.New(slog.DiscardHandler), Now: e.clock,
		Plans: e.cfg.Plans, Sizes: e.cfg.Sizes})
	e.t.Cleanup(func() { m.Close(); proxy.Shutdown() })
	return m
}

func (e *env) size(name string) config.Size {
	z, ok := e.cfg.Sizes.Resolve(name)
	if !ok {
		e.t.Fatalf("no size %s", name)
	}
	return z
}

func (e *env) used() credits.Milli {
	u, err := e.m.Usage(context.Background(), e.p.Org.ID, time.Time{})
	if err != nil {
		e.t.Fatal(err)
	}
	return u.Used()
}

func TestPlanLimits(t *testing.T) {
	e := billingEnv(t)
	ctx := context.Background()
	// Above the plan's largest size: 403 naming the plan; nothing kept.
	_, err := e.m.Provision(ctx, e.p, Spec{SessionID: "big", Size: e.size("standard-2")})
	if !errors.Is(err, errdefs.ErrForbidden) || !strings.Contains(err.Error(), "tiny plan") {
		t.Fatalf("size above plan: %v", err)
	}
	// An idle pause the plan lacks: 403 at provision, not a teardown later.
	_, err = e.m.Provision(ctx, e.p, Spec{SessionID: "ip", Size: e.size("standard-1"), IdleAction: config.IdlePause})
	if !errors.Is(err, errdefs.ErrForbidden) || !strings.Contains(err.Error(), "does not include pause") {
		t.Fatalf("idleAction pause on the tiny plan: %v", err)
	}
	ses, err := e.m.Provision(ctx, e.p, Spec{SessionID: "s1", Size: e.size("standard-1")})
	if err != nil {
		t.Fatal(err)
	}
	// The plan caps the size's egress quota (16 MiB under 1 GiB).
	if ses.EgressBytesLimit != 16<<20 {
		t.Fatalf("egress limit %d", ses.EgressBytesLimit)
	}
	// Concurrency: 429.
	if _, err := e.m.Provision(ctx, e.p, Spec{SessionID: "s2", Size: e.size("standard-1")}); !errors.Is(err, errdefs.ErrRateLimited) {
		t.Fatalf("over concurrency: %v", err)
	}
	// Pause is not in the plan.
	if _, err := e.m.Pause(ctx, e.p.Org.ID, "s1"); !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("pause: %v", err)
	}
	// After a teardown the slot is free, and the id s2 is still unused.
	if _, _, err := e.m.Teardown(ctx, e.p.Org.ID, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Provision(ctx, e.p, Spec{SessionID: "s2", Size: e.size("standard-1")}); err != nil {
		t.Fatal(err)
	}
}

// Credits: metered from transitions, drawn only while running, exhausted
// credits tear running sessions down (saved), a start without a minimum
// slice is 402 with the numbers, grants add to the period.
func TestCreditsDrawnAndExhausted(t *testing.T) {
	e := billingEnv(t)
	ctx := context.Background()
	org := e.p.Org.ID
	if _, err := e.m.Provision(ctx, e.p, Spec{SessionID: "s1", Size: e.size("standard-1")}); err != nil {
		t.Fatal(err)
	}
	e.advance(30 * time.Minute)
	if got := e.used(); got != 500 {
		t.Fatalf("after 30 min at 1/h: %d", got)
	}
	e.m.sweep()
	e.m.idleWG.Wait()
	if e.status("s1") != store.StatusRunning {
		t.Fatal("torn down early")
	}
	// Stopped sessions draw nothing.
	if _, _, err := e.m.Teardown(ctx, org, "s1"); err != nil {
		t.Fatal(err)
	}
	e.advance(10 * time.Hour)
	if got := e.used(); got != 500 {
		t.Fatalf("stopped session drew: %d", got)
	}
	if _, err := e.m.Resume(ctx, org, "s1"); err != nil {
		t.Fatal(err)
	}
	// Runs out after 30 more minutes: the monitor tears it down, saved.
	e.advance(31 * time.Minute)
	e.m.sweep()
	e.m.idleWG.Wait()
	if got := e.status("s1"); got != store.StatusStopped {
		t.Fatalf("after exhaustion: %s", got)
	}
	if !strings.Contains(e.hooks.list(), "event credits_exhausted") {
		t.Fatalf("no credits_exhausted event: %s", e.hooks.list())
	}
	e.db.FlushAudit(ctx)
	recs, err := e.db.ListAudit(ctx, store.AuditFilter{OrgID: org, Action: "sandbox.credits_exhausted"})
	if err != nil || len(recs) != 1 || recs[0].UserID != "system" {
		t.Fatalf("audit: %+v %v", recs, err)
	}
	used := e.used()
	if used != 1016 { // 61 minutes at 1/h, rounded down per piece
		t.Fatalf("used %d", used)
	}
	// A start now: 402, with the numbers, and nothing changes.
	_, err = e.m.Resume(ctx, org, "s1")
	pe, ok := errdefs.Public(err)
	if !errors.Is(err, errdefs.ErrNoCredits) || !ok || pe.Details()["needed"] != 0.084 || pe.Details()["remaining"] != 0.0 {
		t.Fatalf("resume without credits: %v %+v", err, pe)
	}
	if e.status("s1") != store.StatusStopped {
		t.Fatal("a refused resume changed the session")
	}
	// A grant in the period lets it run again.
	if _, err := e.db.AddCreditGrant(ctx, store.CreditGrant{OrgID: org, AmountMilli: 2000, Time: e.clock(), GrantedBy: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Resume(ctx, org, "s1"); err != nil {
		t.Fatalf("resume after grant: %v", err)
	}
	// The next period starts afresh (anchor: the org's creation day).
	_, anchor, _ := e.m.OrgPlan(ctx, org)
	p := credits.PeriodAt(anchor, e.clock())
	e.advance(p.End.Sub(e.clock()) + time.Hour)
	u, _ := e.m.Usage(ctx, org, time.Time{})
	if u.Used() != 1000 || u.Granted != 0 || !u.Period.Start.Equal(p.End) {
		t.Fatalf("next period: used %d granted %d period %+v", u.Used(), u.Granted, u.Period)
	}
}

// A crash charges running time up to the last moment the monitor saw the
// session alive, and not twice: the restart closes the run there and the
// adopted sandbox starts a new one.
func TestCreditsAcrossRestart(t *testing.T) {
	e := billingEnv(t)
	ctx := context.Background()
	if err := e.db.SetPlan(ctx, e.p.Org.ID, "big"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Provision(ctx, e.p, Spec{SessionID: "s1", Size: e.size("standard-1")}); err != nil {
		t.Fatal(err)
	}
	e.advance(20 * time.Minute)
	e.m.sweep() // last sighting
	e.advance(40 * time.Minute)
	e.m.Close() // the server dies: no transition, no sighting
	e.advance(time.Hour)
	e.m = e.newManager()
	if err := e.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	// 20 minutes charged before, none for the hour down; the adopted
	// session runs on from now.
	if got := e.used(); got != 333 {
		t.Fatalf("after restart: %d", got)
	}
	e.advance(6 * time.Minute)
	if got := e.used(); got != 433 {
		t.Fatalf("after restart and 6 min: %d", got)
	}
	// Reconcile again (another restart) does not charge twice.
	e.m.sweep()
	e.m.Close()
	e.m = e.newManager()
	if err := e.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.used(); got != 433 {
		t.Fatalf("second restart: %d", got)
	}
	runs, _ := e.db.Runs(ctx, e.p.Org.ID, time.Time{}, e.clock().Add(time.Hour))
	if len(runs) != 3 || !runs[2].Open || runs[0].Open || runs[1].Open {
		t.Fatalf("runs %+v", runs)
	}
	// A sandbox found dead is charged up to its last sighting.
	e.advance(10 * time.Minute)
	e.m.sweep()
	e.advance(30 * time.Minute)
	e.rt.Mu.Lock()
	e.rt.InspectState.Status = "stopped"
	e.rt.Mu.Unlock()
	e.m.sweep()
	if e.status("s1") != store.StatusFailed {
		t.Fatal("not marked dead")
	}
	if got := e.used(); got != 433+166 {
		t.Fatalf("dead: %d", got)
	}
}
