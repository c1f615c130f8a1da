package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"sandboxd/server/config"
	"sandboxd/server/credits"
	"sandboxd/server/errdefs"
	"sandboxd/store"
)

// Credits and plans. Running time is metered from the lifecycle's own
// transitions (setStatusLocked opens a run when a session starts running
// and closes it when it stops, pauses or dies); the monitor moves every
// open run's end to the moment it last saw the session alive, and a
// restart closes open runs there before adopting what still runs, so a
// crash charges up to the last sighting and never twice. What a period
// cost is a pure function of the runs (credits.Summarize).

// Usage is an organization's usage in one billing period.
type Usage struct {
	Plan      config.Plan
	Period    credits.Period
	Allowance credits.Milli // the plan's monthly credits
	Granted   credits.Milli // operators' grants in the period
	Summary   credits.Summary
	// Runs are the period's runs (for the edge's per-session details).
	Runs []store.Run
}

// Used is what the period's running time cost.
func (u Usage) Used() credits.Milli { return u.Summary.Credits }

// Remaining is what is left of the allowance and grants (may be negative
// by what ran between a check and a teardown).
func (u Usage) Remaining() credits.Milli { return u.Allowance + u.Granted - u.Summary.Credits }

// billing reports whether plans are enforced (a Manager without a plan
// table, as in unit tests of other parts, runs without).
func (m *Manager) billing() bool { return len(m.plans.List) > 0 }

// UsageStore is what computing usage reads.
type UsageStore interface {
	GetOrg(ctx context.Context, orgID string) (store.Org, store.OrgPlan, error)
	CreditsGranted(ctx context.Context, orgID string, from, to time.Time) (int64, error)
	Runs(ctx context.Context, orgID string, from, to time.Time) ([]store.Run, error)
}

// OrgPlan returns an organization's plan and anchor day.
func (m *Manager) OrgPlan(ctx context.Context, orgID string) (config.Plan, int, error) {
	return OrgPlan(ctx, m.db, m.plans, orgID, m.log)
}

// OrgPlan returns an organization's plan in plans and its anchor day; an
// organization on a plan no longer in the table gets the default (logged).
func OrgPlan(ctx context.Context, db UsageStore, plans config.Plans, orgID string, log *slog.Logger) (config.Plan, int, error) {
	_, op, err := db.GetOrg(ctx, orgID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return config.Plan{}, 0, errdefs.NotFound("no such organization")
		}
		return config.Plan{}, 0, err
	}
	pl, ok := plans.Get(op.Plan)
	if !ok {
		log.Warn("organization on an unknown plan; the default applies", "org", orgID, "plan", op.Plan)
		pl, _ = plans.Get("")
	}
	return pl, op.AnchorDay, nil
}

// Usage computes an organization's usage in the period holding at (zero:
// now). Open runs count up to now.
func (m *Manager) Usage(ctx context.Context, orgID string, at time.Time) (Usage, error) {
	return UsageAt(ctx, m.db, m.plans, orgID, m.now(), at, m.log)
}

// UsageAt computes an organization's usage in the period holding at (zero:
// now), open runs counted up to now (zero: up to where they were last
// seen, as with the server stopped): the server's and the operator
// commands' one way to get it.
func UsageAt(ctx context.Context, db UsageStore, plans config.Plans, orgID string, now, at time.Time, log *slog.Logger) (Usage, error) {
	if at.IsZero() {
		at = now
	}
	pl, anchor, err := OrgPlan(ctx, db, plans, orgID, log)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{Plan: pl, Period: credits.PeriodAt(anchor, at), Allowance: pl.MonthlyCredits}
	g, err := db.CreditsGranted(ctx, orgID, u.Period.Start, u.Period.End)
	if err != nil {
		return Usage{}, err
	}
	u.Granted = credits.Milli(g)
	if u.Runs, err = db.Runs(ctx, orgID, u.Period.Start, u.Period.End); err != nil {
		return Usage{}, err
	}
	runs := make([]credits.Run, len(u.Runs))
	for i, r := range u.Runs {
		end := r.End
		if r.Open && now.After(end) {
			end = now
		}
		runs[i] = credits.Run{SessionPK: r.SessionPK, SessionID: r.SessionID, Size: r.Size,
			Rate: credits.Milli(r.RateMilli), Start: r.Start, End: end}
	}
	u.Summary = credits.Summarize(runs, u.Period.Start, u.Period.End)
	return u, nil
}

// admit checks a start (provision or resume) of size z against the
// organization's plan: the size (403) and the credits for a minimum slice
// (402). Concurrency is reserve's (429).
func (m *Manager) admit(ctx context.Context, orgID string, z config.Size) (config.Plan, error) {
	if !m.billing() {
		return config.Plan{}, nil
	}
	pl, _, err := m.OrgPlan(ctx, orgID)
	if err != nil {
		return pl, err
	}
	if !pl.Allows(m.sizes, z) {
		return pl, errdefs.Forbidden("size %s is above what the %s plan allows (at most %s); choose a smaller size or change plan", z.Name, pl.Name, pl.LargestSize)
	}
	u, err := m.Usage(ctx, orgID, time.Time{})
	if err != nil {
		return pl, err
	}
	need := credits.MinSlice(z.CreditsPerHour, m.plans.MinSliceSeconds)
	if rem := u.Remaining(); need > 0 && rem < need {
		return pl, errdefs.New(errdefs.ErrNoCredits,
			"not enough credits: %s left this period (until %s), and size %s needs %s for its first %d seconds at %s credits an hour; ask an operator for credits or wait for the next period",
			max(rem, 0), u.Period.End.Format(time.RFC3339), z.Name, need, m.plans.MinSliceSeconds, z.CreditsPerHour).
			WithDetails(map[string]any{
				"remaining": max(rem, 0).Credits(), "needed": need.Credits(), "size": z.Name,
				"creditsPerHour": z.CreditsPerHour.Credits(), "periodEnd": u.Period.End.Format(time.RFC3339), "plan": pl.Name,
			})
	}
	return pl, nil
}

// mayPause refuses a pause the organization's plan does not include.
func (m *Manager) mayPause(ctx context.Context, orgID string) error {
	if !m.billing() {
		return nil
	}
	pl, _, err := m.OrgPlan(ctx, orgID)
	if err != nil {
		return err
	}
	if !pl.Pause {
		return errdefs.Forbidden("the %s plan does not include pause with memory; tear the session down instead (its workspace is saved) or change plan", pl.Name)
	}
	return nil
}

// rated is the size a session runs at, with the credit rate it was
// provisioned with (resume draws at that rate).
func (m *Manager) rated(ses *store.Session) config.Size {
	z := sizeOf(ses)
	z.CreditsPerHour = credits.Milli(ses.CreditRate)
	return z
}

// egressCap applies the plan's cap to a size's egress quota.
func egressCap(pl config.Plan, sizeBytes int64) int64 {
	if pl.EgressMiB > 0 && pl.EgressMiB<<20 < sizeBytes {
		return pl.EgressMiB << 20
	}
	return sizeBytes
}

// storageQuota is an organization's cap on its saves in bytes (0: none):
// the plan's and the server's, whichever is smaller.
func (m *Manager) storageQuota(ctx context.Context, orgID string) int64 {
	q := m.quota
	if !m.billing() {
		return q
	}
	pl, _, err := m.OrgPlan(ctx, orgID)
	if err != nil || pl.StorageMiB == 0 {
		return q
	}
	if p := pl.StorageMiB << 20; q == 0 || p < q {
		return p
	}
	return q
}

// meterLocked records a status change's effect on running time: a run
// opens when a session starts running and closes when it leaves running
// for good. dead closes at the last sighting instead of now.
func (m *Manager) meterLocked(ctx context.Context, ses *store.Session, from, to string, now time.Time, dead bool) {
	var err error
	switch {
	case to == store.StatusRunning && from != store.StatusRunning && from != store.StatusStopping:
		err = m.openRun(ctx, ses, now)
	case to == store.StatusStopped || to == store.StatusFailed || to == store.StatusPaused || to == store.StatusDeleted:
		var end *time.Time
		if !dead {
			end = &now
		}
		var drawn credits.Milli
		drawn, err = m.closeRun(ctx, ses.ID, end)
		m.drawn(ses.OrgID, drawn)
	}
	if err != nil {
		m.log.Error("meter", "session", ses.SessionID, "from", from, "to", to, "err", err)
	}
}

// openRun opens a session's run at now (idempotent) and counts it as seen.
func (m *Manager) openRun(ctx context.Context, ses *store.Session, now time.Time) error {
	if err := m.db.OpenRun(ctx, ses, now); err != nil {
		return err
	}
	m.mu.Lock()
	if _, ok := m.seen[ses.ID]; !ok {
		m.seen[ses.ID] = sighting{at: now, rate: credits.Milli(ses.CreditRate)}
	}
	m.mu.Unlock()
	return nil
}

// closeRun closes a session's open run and returns what its last stretch
// (since the last sighting) cost, for the metrics.
func (m *Manager) closeRun(ctx context.Context, pk string, end *time.Time) (credits.Milli, error) {
	seen := m.lastSeen(pk)
	if err := m.db.CloseRun(ctx, pk, end); err != nil {
		return 0, err
	}
	if end == nil || seen.rate == 0 || !end.After(seen.at) {
		return 0, nil
	}
	return credits.Charge(seen.rate, end.Sub(seen.at)), nil
}

// sighting is when the monitor last saw a session's run alive, and its
// rate (for counting drawn credits as they accrue).
type sighting struct {
	at   time.Time
	rate credits.Milli
}

func (m *Manager) lastSeen(pk string) sighting {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.seen[pk]
	delete(m.seen, pk)
	return s
}

// drawn adds credits to the metrics' counter.
func (m *Manager) drawn(org string, c credits.Milli) {
	if c > 0 && m.onDrawn != nil {
		m.onDrawn(c)
	}
}

// seeRuns moves the open runs of the sessions the monitor saw alive to
// now, and counts what they drew since the last sighting.
func (m *Manager) seeRuns(ctx context.Context, alive []*store.Session) {
	if len(alive) == 0 {
		return
	}
	now := m.now()
	pks := make([]string, len(alive))
	for i, s := range alive {
		pks[i] = s.ID
	}
	if err := m.db.SeeRuns(ctx, pks, now); err != nil {
		m.log.Warn("monitor: record running time", "err", err)
		return
	}
	m.mu.Lock()
	for _, s := range alive {
		prev, ok := m.seen[s.ID]
		m.seen[s.ID] = sighting{at: now, rate: credits.Milli(s.CreditRate)}
		if ok && now.After(prev.at) && m.onDrawn != nil {
			m.onDrawn(credits.Charge(prev.rate, now.Sub(prev.at)))
		}
	}
	m.mu.Unlock()
}

// enforceCredits tears down (with a save) the running sessions of every
// organization whose credits ran out. Run by the monitor.
func (m *Manager) enforceCredits(ctx context.Context) {
	if !m.billing() {
		return
	}
	orgs, err := m.db.OrgsWithOpenRuns(ctx)
	if err != nil {
		m.log.Warn("monitor: credits", "err", err)
		return
	}
	for _, org := range orgs {
		u, err := m.Usage(ctx, org, time.Time{})
		if err != nil {
			m.log.Warn("monitor: credits", "org", org, "err", err)
			continue
		}
		if u.Remaining() > 0 {
			continue
		}
		list, err := m.db.ListSessions(ctx, org, store.StatusRunning)
		if err != nil {
			continue
		}
		for i := range list {
			m.actAsync(list[i].ID, func(ctx context.Context, pk string) { m.exhaustedLocked(ctx, pk, u) })
		}
	}
}

// exhaustedLocked tears a running session down because its organization's
// credits ran out: saved like any teardown, with an event and an audit
// record. A save that fails (over the storage quota, or the storage
// failing) must not keep the sandbox drawing credits nobody has: it is then
// stopped without a save, its disk kept on the node (a resume starts from
// it, as from any disk newer than its save), and the event and the audit
// record say so.
func (m *Manager) exhaustedLocked(ctx context.Context, pk string, u Usage) {
	cur, err := m.db.GetSessionByID(ctx, pk)
	if err != nil || cur.Status != store.StatusRunning {
		return
	}
	m.log.Info("credits exhausted: tearing down", "session", cur.SessionID, "org", cur.OrgID)
	fields := map[string]any{"plan": u.Plan.Name, "used": u.Used().Credits(), "allowance": (u.Allowance + u.Granted).Credits()}
	cur.StatusReason = "credits_exhausted" // what the stopped session says until it runs again
	_, err = m.teardownLocked(ctx, &cur)
	fields["saved"] = err == nil
	outcome := "ok"
	if err != nil {
		m.log.Warn("credits exhausted: the save failed; stopping without it, the disk kept on the node", "session", cur.SessionID, "err", err)
		fields["saveError"] = "internal"
		if pe, ok := errdefs.Public(err); ok {
			fields["saveError"] = pe.Message()
		}
		if cur.Status == store.StatusRunning {
			_, err = m.stopSessionLocked(ctx, &cur, false, true)
		}
		if err != nil {
			m.log.Error("credits teardown", "session", cur.SessionID, "err", err)
			outcome = "error" // still running: the next round tries again
		} else {
			outcome = "unsaved"
		}
	}
	fields["stopped"] = cur.Status != store.StatusRunning
	m.events.Event(cur.ID, "credits_exhausted", fields)
	m.auditSystemOutcome("sandbox.credits_exhausted", &cur, outcome, fields)
}

// SessionCredits is what a session has drawn over its life (an open run
// counts up to now).
func (m *Manager) SessionCredits(ctx context.Context, ses *store.Session) (credits.Milli, error) {
	runs, err := m.db.SessionRuns(ctx, ses.OrgID, ses.ID)
	if err != nil {
		return 0, err
	}
	now := m.now()
	var total credits.Milli
	for _, r := range runs {
		end := r.End
		if r.Open && now.After(end) {
			end = now
		}
		cr := credits.Run{SessionPK: r.SessionPK, Rate: credits.Milli(r.RateMilli), Start: r.Start, End: end}
		total += credits.Summarize([]credits.Run{cr}, r.Start, end.Add(time.Nanosecond)).Credits
	}
	return total, nil
}

// Now is the Manager's clock.
func (m *Manager) Now() time.Time { return m.now() }
