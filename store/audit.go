package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// AuditRecord is one entry of the audit log.
type AuditRecord struct {
	ID                                                 int64
	Time                                               time.Time
	OrgID, UserID, TokenID, Action, SessionID, Outcome string
	Status                                             int
	RemoteAddr, RequestID                              string
	Details                                            map[string]any // stored as JSON
}

// Audit enqueues rec for the background writer; a zero Time is set to now.
// It never drops a record: if the buffer stays full for ~100ms it writes
// synchronously instead. After Close it also writes synchronously (which
// fails once the database is closed; the error goes to OnError).
func (db *DB) Audit(rec AuditRecord) {
	if rec.Time.IsZero() {
		rec.Time = db.now()
	}
	db.audit.put(rec)
}

// AuditSync writes rec (with whatever else is queued, in one transaction)
// before it returns, so the record of a request that was answered survives
// a kill -9 of the server; Audit's records may wait up to 50 ms.
func (db *DB) AuditSync(ctx context.Context, rec AuditRecord) error {
	db.Audit(rec)
	return db.FlushAudit(ctx)
}

// FlushAudit waits until every record enqueued before the call is written.
func (db *DB) FlushAudit(ctx context.Context) error {
	if err := db.audit.flush(ctx); err != nil {
		return fmt.Errorf("store: flush audit: %w", err)
	}
	return nil
}

func (db *DB) writeAudit(ctx context.Context, recs []AuditRecord) error {
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO audit(time, org_id, user_id, token_id, action, session_id,
		outcome, status, remote_addr, request_id, details) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, r := range recs {
		details, err := json.Marshal(r.Details)
		if err != nil {
			details, _ = json.Marshal(map[string]string{"marshal_error": err.Error()})
		}
		if _, err := stmt.ExecContext(ctx, ts(r.Time), r.OrgID, r.UserID, r.TokenID, r.Action, r.SessionID,
			r.Outcome, r.Status, r.RemoteAddr, r.RequestID, string(details)); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// AuditFilter selects audit records. Empty fields do not filter; Limit
// defaults to 100 and is capped at 1000.
type AuditFilter struct {
	OrgID, SessionID, Action, UserID string
	Since                            time.Time // records at or after Since
	Until                            time.Time // records before Until
	Limit                            int
}

// ListAudit returns matching audit records, newest first.
func (db *DB) ListAudit(ctx context.Context, f AuditFilter) ([]AuditRecord, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	q := `SELECT id, time, org_id, user_id, token_id, action, session_id, outcome, status, remote_addr, request_id, details
		FROM audit WHERE 1 = 1`
	var args []any
	if f.OrgID != "" {
		q += ` AND org_id = ?`
		args = append(args, f.OrgID)
	}
	if f.SessionID != "" {
		q += ` AND session_id = ?`
		args = append(args, f.SessionID)
	}
	if f.Action != "" {
		q += ` AND action = ?`
		args = append(args, f.Action)
	}
	if f.UserID != "" {
		q += ` AND user_id = ?`
		args = append(args, f.UserID)
	}
	if !f.Since.IsZero() {
		q += ` AND time >= ?`
		args = append(args, ts(f.Since))
	}
	if !f.Until.IsZero() {
		q += ` AND time < ?`
		args = append(args, ts(f.Until))
	}
	q += ` ORDER BY time DESC, id DESC LIMIT ?`
	args = append(args, limit)
	rows, err := db.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list audit: %w", err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		var (
			r       AuditRecord
			t       int64
			details string
		)
		if err := rows.Scan(&r.ID, &t, &r.OrgID, &r.UserID, &r.TokenID, &r.Action, &r.SessionID, &r.Outcome,
			&r.Status, &r.RemoteAddr, &r.RequestID, &details); err != nil {
			return nil, fmt.Errorf("store: list audit: %w", err)
		}
		r.Time = fromTS(t)
		if err := json.Unmarshal([]byte(details), &r.Details); err != nil {
			return nil, fmt.Errorf("store: list audit: record %d details: %w", r.ID, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list audit: %w", err)
	}
	return out, nil
}
