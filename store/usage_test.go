package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestRunsOpenSeeClose(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	p, _, _ := db.CreateOrg(ctx, "a", "u")
	s := newSession(p, "r1")
	s.Size, s.CreditRate = "standard-1", 1000
	if err := db.InsertSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	if err := db.OpenRun(ctx, s, t0); err != nil {
		t.Fatal(err)
	}
	// A second open keeps the first.
	if err := db.OpenRun(ctx, s, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := db.SeeRuns(ctx, []string{s.ID}, t0.Add(30*time.Minute)); err != nil {
		t.Fatal(err)
	}
	// Never backwards.
	if err := db.SeeRuns(ctx, []string{s.ID}, t0.Add(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	runs, err := db.Runs(ctx, p.Org.ID, t0.Add(-time.Hour), t0.Add(time.Hour))
	if err != nil || len(runs) != 1 || !runs[0].Open || !runs[0].End.Equal(t0.Add(30*time.Minute)) || runs[0].RateMilli != 1000 {
		t.Fatalf("runs %+v %v", runs, err)
	}
	// A crash: closed where last seen.
	if n, err := db.CloseAllRuns(ctx); err != nil || n != 1 {
		t.Fatalf("close all: %d %v", n, err)
	}
	if err := db.OpenRun(ctx, s, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	end := t0.Add(3 * time.Hour)
	if err := db.CloseRun(ctx, s.ID, &end); err != nil {
		t.Fatal(err)
	}
	runs, _ = db.Runs(ctx, p.Org.ID, t0, t0.Add(24*time.Hour))
	if len(runs) != 2 || runs[0].Open || runs[1].Open || !runs[1].End.Equal(end) {
		t.Fatalf("runs %+v", runs)
	}
	if orgs, _ := db.OrgsWithOpenRuns(ctx); len(orgs) != 0 {
		t.Fatalf("open orgs %v", orgs)
	}
}

func TestGrantsAndPlans(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	p, _, _ := db.CreateOrg(ctx, "acme", "u")
	t0 := time.Date(2030, 1, 5, 0, 0, 0, 0, time.UTC)
	if _, err := db.AddCreditGrant(ctx, CreditGrant{OrgID: p.Org.ID, AmountMilli: 5000, Time: t0, GrantedBy: "operator"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.AddCreditGrant(ctx, CreditGrant{OrgID: "org_nope", AmountMilli: 1, Time: t0}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("grant to unknown org: %v", err)
	}
	if n, _ := db.CreditsGranted(ctx, p.Org.ID, t0, t0.Add(time.Hour)); n != 5000 {
		t.Fatalf("granted %d", n)
	}
	if n, _ := db.CreditsGranted(ctx, p.Org.ID, t0.Add(time.Second), t0.Add(time.Hour)); n != 0 {
		t.Fatalf("granted outside %d", n)
	}
	if err := db.SetPlan(ctx, p.Org.ID, "pro"); err != nil {
		t.Fatal(err)
	}
	_, op, err := db.GetOrg(ctx, p.Org.ID)
	if err != nil || op.Plan != "pro" || op.AnchorDay != p.Org.CreatedAt.Day() {
		t.Fatalf("org plan %+v %v", op, err)
	}
	if o, err := db.FindOrg(ctx, "acme"); err != nil || o.ID != p.Org.ID {
		t.Fatalf("find by name %v %v", o, err)
	}
	db.CreateOrg(ctx, "acme", "v")
	if _, err := db.FindOrg(ctx, "acme"); !errors.Is(err, ErrConflict) {
		t.Fatalf("ambiguous name: %v", err)
	}
	if err := db.SetPlan(ctx, "org_nope", "pro"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("set plan unknown: %v", err)
	}
}

func TestSetFirstOrgPlan(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	a, _, _ := db.CreateOrg(ctx, "first", "u")
	b, _, _ := db.CreateOrg(ctx, "second", "v")
	if err := db.SetFirstOrgPlan(ctx, "team"); err != nil {
		t.Fatal(err)
	}
	_, pa, _ := db.GetOrg(ctx, a.Org.ID)
	_, pb, _ := db.GetOrg(ctx, b.Org.ID)
	if pa.Plan != "team" || pb.Plan != "" {
		t.Fatalf("plans %q %q", pa.Plan, pb.Plan)
	}
	// An operator's choice stays.
	db.SetPlan(ctx, a.Org.ID, "free")
	db.SetFirstOrgPlan(ctx, "team")
	if _, pa, _ = db.GetOrg(ctx, a.Org.ID); pa.Plan != "free" {
		t.Fatalf("overwrote %q", pa.Plan)
	}
}
