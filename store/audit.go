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

// auditItem is either a record or, when flush is non-nil, a flush marker
// that the writer closes once everything before it is written.
type auditItem struct {
	rec   AuditRecord
	flush chan struct{}
}

// Audit enqueues rec for the background writer; a zero Time is set to now.
// It never drops a record: if the buffer stays full for ~100ms it writes
// synchronously instead. After Close it also writes synchronously (which
// fails once the database is closed; the error goes to OnError).
func (db *DB) Audit(rec AuditRecord) {
	if rec.Time.IsZero() {
		rec.Time = db.now()
	}
	it := auditItem{rec: rec}
	db.auditMu.RLock()
	if db.auditClosed {
		db.auditMu.RUnlock()
		db.writeAuditSync(rec)
		return
	}
	select {
	case db.auditCh <- it:
		db.auditMu.RUnlock()
		return
	default:
	}
	t := time.NewTimer(auditMaxWait)
	defer t.Stop()
	select {
	case db.auditCh <- it:
		db.auditMu.RUnlock()
	case <-t.C:
		db.auditMu.RUnlock()
		db.writeAuditSync(rec)
	}
}

func (db *DB) writeAuditSync(rec AuditRecord) {
	if err := db.writeAudit(context.Background(), []AuditRecord{rec}); err != nil {
		db.report(fmt.Errorf("store: write audit record: %w", err))
	}
}

// FlushAudit waits until every record enqueued before the call is written.
func (db *DB) FlushAudit(ctx context.Context) error {
	done := make(chan struct{})
	db.auditMu.RLock()
	if db.auditClosed {
		db.auditMu.RUnlock()
		return nil // Close has drained (or is draining) everything
	}
	select {
	case db.auditCh <- auditItem{flush: done}:
		db.auditMu.RUnlock()
	case <-ctx.Done():
		db.auditMu.RUnlock()
		return fmt.Errorf("store: flush audit: %w", ctx.Err())
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("store: flush audit: %w", ctx.Err())
	}
}

// auditLoop batches queued records, writing every auditInterval or every
// auditBatch records, until auditCh is closed and drained.
func (db *DB) auditLoop() {
	defer close(db.auditDone)
	batch := make([]AuditRecord, 0, auditBatch)
	var waiters []chan struct{}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	flush := func() {
		timer.Stop()
		if len(batch) > 0 {
			db.writeAuditRetry(batch)
			batch = batch[:0]
		}
		for _, w := range waiters {
			close(w)
		}
		waiters = waiters[:0]
	}
	for {
		select {
		case it, ok := <-db.auditCh:
			if !ok {
				flush()
				return
			}
			if it.flush != nil {
				waiters = append(waiters, it.flush)
				flush()
				continue
			}
			batch = append(batch, it.rec)
			if len(batch) == 1 {
				timer.Reset(auditInterval)
			}
			if len(batch) >= auditBatch {
				flush()
			}
		case <-timer.C:
			flush()
		}
	}
}

// writeAuditRetry writes a batch, retrying a few times before giving up and
// reporting the error.
func (db *DB) writeAuditRetry(batch []AuditRecord) {
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		}
		if err = db.writeAudit(context.Background(), batch); err == nil {
			return
		}
	}
	db.report(fmt.Errorf("store: write %d audit records: %w", len(batch), err))
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
	OrgID, SessionID, Action string
	Since                    time.Time // records at or after Since
	Limit                    int
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
	if !f.Since.IsZero() {
		q += ` AND time >= ?`
		args = append(args, ts(f.Since))
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
