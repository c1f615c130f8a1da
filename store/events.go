package store

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// EventsKept bounds the events kept per session: every write trims a
// session's oldest events beyond it.
const EventsKept = 2000

// Event is a persisted entry of a session's log: a server event such as
// process_start, process_exit, oom or exit, kept across restarts.
type Event struct {
	Seq       int64 // 1, 2, ... per session, in write order
	SessionPK string
	Time      time.Time
	Entry     []byte // the entry's JSON object, already scrubbed
}

// AppendEvent enqueues an event of a session (by internal id) for the
// background writer, which writes it within ~50ms and Close drains; the
// caller must not modify entry afterwards. Like Audit it never drops an
// event, but events of a session whose row is gone are discarded.
func (db *DB) AppendEvent(sessionPK string, entry []byte) {
	db.events.put(Event{SessionPK: sessionPK, Time: db.now(), Entry: entry})
}

// FlushEvents waits until every event enqueued before the call is written.
func (db *DB) FlushEvents(ctx context.Context) error {
	if err := db.events.flush(ctx); err != nil {
		return fmt.Errorf("store: flush events: %w", err)
	}
	return nil
}

// writeEvents inserts a batch in one transaction, then trims each session
// in the batch to its EventsKept newest events, so the bound holds at every
// commit. seq is per session, so both the next seq and the trim are index
// range operations: a trim costs what it deletes, not a scan of the rest.
func (db *DB) writeEvents(ctx context.Context, evs []Event) error {
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// A session row is deleted only to undo a failed provision; its late
	// events must not fail the whole batch on the foreign key.
	ins, err := tx.PrepareContext(ctx, `INSERT INTO session_events(session_pk, seq, time, entry)
		SELECT ?1, COALESCE((SELECT MAX(seq) FROM session_events WHERE session_pk = ?1), 0) + 1, ?2, ?3
		WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1)`)
	if err != nil {
		return err
	}
	defer ins.Close()
	var pks []string // distinct, in order; batches are small
	for _, e := range evs {
		if _, err := ins.ExecContext(ctx, e.SessionPK, ts(e.Time), string(e.Entry)); err != nil {
			return err
		}
		if !slices.Contains(pks, e.SessionPK) {
			pks = append(pks, e.SessionPK)
		}
	}
	for _, pk := range pks {
		if _, err := tx.ExecContext(ctx, `DELETE FROM session_events WHERE session_pk = ?1
			AND seq <= (SELECT MAX(seq) FROM session_events WHERE session_pk = ?1) - ?2`,
			pk, EventsKept); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// LastEvents returns a session's last n written events (n <= 0 or above
// EventsKept means EventsKept), oldest first. Events still queued are not
// included; FlushEvents first to see them.
func (db *DB) LastEvents(ctx context.Context, sessionPK string, n int) ([]Event, error) {
	if n <= 0 || n > EventsKept {
		n = EventsKept
	}
	rows, err := db.r.QueryContext(ctx, `SELECT seq, time, entry FROM (
		SELECT seq, time, entry FROM session_events WHERE session_pk = ? ORDER BY seq DESC LIMIT ?
	) ORDER BY seq`, sessionPK, n)
	if err != nil {
		return nil, fmt.Errorf("store: last events: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		e := Event{SessionPK: sessionPK}
		var t int64
		var entry string
		if err := rows.Scan(&e.Seq, &t, &entry); err != nil {
			return nil, fmt.Errorf("store: last events: %w", err)
		}
		e.Time, e.Entry = fromTS(t), []byte(entry)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: last events: %w", err)
	}
	return out, nil
}
