package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Run is a stretch of a session's running time at one rate (milli-credits
// per hour). End of an open run is the last moment the server saw the
// session alive.
type Run struct {
	ID        int64
	OrgID     string
	SessionPK string
	SessionID string
	Size      string
	RateMilli int64
	Start     time.Time
	End       time.Time
	Open      bool
}

// OpenRun starts a run for a session that starts running at t. A session
// with an open run already keeps it (idempotent).
func (db *DB) OpenRun(ctx context.Context, s *Session, t time.Time) error {
	_, err := db.w.ExecContext(ctx, `INSERT INTO usage_runs(org_id, session_pk, session_id, size, rate_milli, start_at, end_at, open)
		VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (session_pk) WHERE open = 1 DO NOTHING`,
		s.OrgID, s.ID, s.SessionID, s.Size, s.CreditRate, ts(t), ts(t))
	if err != nil {
		return fmt.Errorf("store: open run: %w", err)
	}
	return nil
}

// CloseRun ends a session's open run at end, or, with end nil, at the last
// moment it was seen alive. No open run: nothing to do.
func (db *DB) CloseRun(ctx context.Context, sessionPK string, end *time.Time) error {
	var err error
	if end == nil {
		_, err = db.w.ExecContext(ctx, `UPDATE usage_runs SET open = 0 WHERE session_pk = ? AND open = 1`, sessionPK)
	} else {
		_, err = db.w.ExecContext(ctx, `UPDATE usage_runs SET open = 0, end_at = MAX(start_at, ?) WHERE session_pk = ? AND open = 1`,
			ts(*end), sessionPK)
	}
	if err != nil {
		return fmt.Errorf("store: close run: %w", err)
	}
	return nil
}

// CloseAllRuns ends every open run where it was last seen alive (at start,
// before anything is adopted: the time the server was down is not charged).
func (db *DB) CloseAllRuns(ctx context.Context) (int64, error) {
	res, err := db.w.ExecContext(ctx, `UPDATE usage_runs SET open = 0 WHERE open = 1`)
	if err != nil {
		return 0, fmt.Errorf("store: close runs: %w", err)
	}
	return res.RowsAffected()
}

// SeeRuns records that the open runs of the given sessions were alive at
// t (it never moves an end back).
func (db *DB) SeeRuns(ctx context.Context, sessionPKs []string, t time.Time) error {
	if len(sessionPKs) == 0 {
		return nil
	}
	return db.withTx(ctx, func(tx *sql.Tx) error {
		for _, pk := range sessionPKs {
			if _, err := tx.ExecContext(ctx, `UPDATE usage_runs SET end_at = MAX(end_at, ?) WHERE session_pk = ? AND open = 1`, ts(t), pk); err != nil {
				return fmt.Errorf("store: see runs: %w", err)
			}
		}
		return nil
	})
}

// Runs returns an organization's runs that overlap [from, to), oldest
// first.
func (db *DB) Runs(ctx context.Context, orgID string, from, to time.Time) ([]Run, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT id, org_id, session_pk, session_id, size, rate_milli, start_at, end_at, open
		FROM usage_runs WHERE org_id = ? AND (end_at > ? OR open = 1) AND start_at < ? ORDER BY start_at, id`, orgID, ts(from), ts(to))
	if err != nil {
		return nil, fmt.Errorf("store: runs: %w", err)
	}
	defer rows.Close()
	return scanRuns(rows)
}

// CreditGrant is credits an operator added to an organization.
type CreditGrant struct {
	ID          int64
	OrgID       string
	AmountMilli int64
	Time        time.Time
	GrantedBy   string
	Note        string
}

// AddCreditGrant records a credit grant.
func (db *DB) AddCreditGrant(ctx context.Context, g CreditGrant) (CreditGrant, error) {
	g.Time = normTime(g.Time)
	res, err := db.w.ExecContext(ctx, `INSERT INTO credit_grants(org_id, amount_milli, time, granted_by, note) VALUES (?, ?, ?, ?, ?)`,
		g.OrgID, g.AmountMilli, ts(g.Time), g.GrantedBy, g.Note)
	if err != nil {
		if isForeignKey(err) {
			return CreditGrant{}, fmt.Errorf("store: grant: %w", ErrNotFound)
		}
		return CreditGrant{}, fmt.Errorf("store: grant: %w", err)
	}
	g.ID, _ = res.LastInsertId()
	return g, nil
}

// CreditsGranted sums an organization's grants in [from, to).
func (db *DB) CreditsGranted(ctx context.Context, orgID string, from, to time.Time) (int64, error) {
	var n sql.NullInt64
	err := db.r.QueryRowContext(ctx, `SELECT SUM(amount_milli) FROM credit_grants WHERE org_id = ? AND time >= ? AND time < ?`,
		orgID, ts(from), ts(to)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: granted: %w", err)
	}
	return n.Int64, nil
}

// OrgPlan is an organization's plan (” the default) and anchor day (the
// day of the month its periods start).
type OrgPlan struct {
	Plan      string
	AnchorDay int
}

// GetOrg returns an organization with its plan.
func (db *DB) GetOrg(ctx context.Context, orgID string) (Org, OrgPlan, error) {
	var o Org
	var op OrgPlan
	var at int64
	err := db.r.QueryRowContext(ctx, `SELECT id, name, created_at, plan, anchor_day FROM orgs WHERE id = ?`, orgID).
		Scan(&o.ID, &o.Name, &at, &op.Plan, &op.AnchorDay)
	if err != nil {
		return Org{}, OrgPlan{}, fmt.Errorf("store: get org: %w", notFound(err))
	}
	o.CreatedAt = fromTS(at)
	if op.AnchorDay == 0 {
		op.AnchorDay = o.CreatedAt.Day()
	}
	return o, op, nil
}

// ListOrgs lists every organization, oldest first.
func (db *DB) ListOrgs(ctx context.Context) ([]Org, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT id, name, created_at FROM orgs ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list orgs: %w", err)
	}
	defer rows.Close()
	var out []Org
	for rows.Next() {
		var o Org
		var at int64
		if err := rows.Scan(&o.ID, &o.Name, &at); err != nil {
			return nil, fmt.Errorf("store: list orgs: %w", err)
		}
		o.CreatedAt = fromTS(at)
		out = append(out, o)
	}
	return out, rows.Err()
}

// FindOrg returns the organization with this id or, failing that, this
// name (names are not unique: more than one is ErrConflict).
func (db *DB) FindOrg(ctx context.Context, idOrName string) (Org, error) {
	if o, _, err := db.GetOrg(ctx, idOrName); err == nil {
		return o, nil
	} else if !errors.Is(err, ErrNotFound) {
		return Org{}, err
	}
	rows, err := db.r.QueryContext(ctx, `SELECT id FROM orgs WHERE name = ? LIMIT 2`, idOrName)
	if err != nil {
		return Org{}, fmt.Errorf("store: find org: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return Org{}, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	switch len(ids) {
	case 0:
		return Org{}, fmt.Errorf("store: find org %q: %w", idOrName, ErrNotFound)
	case 1:
		o, _, err := db.GetOrg(ctx, ids[0])
		return o, err
	}
	return Org{}, fmt.Errorf("store: find org %q: more than one organization has this name, use its id: %w", idOrName, ErrConflict)
}

// SetPlan moves an organization to a plan.
func (db *DB) SetPlan(ctx context.Context, orgID, plan string) error {
	res, err := db.w.ExecContext(ctx, `UPDATE orgs SET plan = ? WHERE id = ?`, plan, orgID)
	if err != nil {
		return fmt.Errorf("store: set plan: %w", err)
	}
	return mustAffect(res)
}

// OrgsWithOpenRuns lists the organizations that have a session running.
func (db *DB) OrgsWithOpenRuns(ctx context.Context) ([]string, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT DISTINCT org_id FROM usage_runs WHERE open = 1`)
	if err != nil {
		return nil, fmt.Errorf("store: orgs with runs: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// SetOperator marks a user as an operator of the installation (or not).
func (db *DB) SetOperator(ctx context.Context, userID string, on bool) error {
	res, err := db.w.ExecContext(ctx, `UPDATE users SET operator = ? WHERE id = ?`, on, userID)
	if err != nil {
		return fmt.Errorf("store: set operator: %w", err)
	}
	return mustAffect(res)
}

// SessionRuns returns a session's runs, oldest first.
func (db *DB) SessionRuns(ctx context.Context, orgID, sessionPK string) ([]Run, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT id, org_id, session_pk, session_id, size, rate_milli, start_at, end_at, open
		FROM usage_runs WHERE org_id = ? AND session_pk = ? ORDER BY start_at, id`, orgID, sessionPK)
	if err != nil {
		return nil, fmt.Errorf("store: session runs: %w", err)
	}
	defer rows.Close()
	return scanRuns(rows)
}

func scanRuns(rows *sql.Rows) ([]Run, error) {
	var out []Run
	for rows.Next() {
		var r Run
		var start, end int64
		if err := rows.Scan(&r.ID, &r.OrgID, &r.SessionPK, &r.SessionID, &r.Size, &r.RateMilli, &start, &end, &r.Open); err != nil {
			return nil, fmt.Errorf("store: runs: %w", err)
		}
		r.Start, r.End = fromTS(start), fromTS(end)
		out = append(out, r)
	}
	return out, rows.Err()
}

// SetFirstOrgPlan puts the installation's first organization on plan if
// it is on none (an installation from before plans); idempotent.
func (db *DB) SetFirstOrgPlan(ctx context.Context, plan string) error {
	_, err := db.w.ExecContext(ctx, `UPDATE orgs SET plan = ? WHERE plan = '' AND id = (SELECT id FROM orgs ORDER BY created_at, id LIMIT 1)`, plan)
	if err != nil {
		return fmt.Errorf("store: first org plan: %w", err)
	}
	return nil
}
