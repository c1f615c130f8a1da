package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Session is one sandbox session. SessionID is named by the client and is
// unique per org forever, even after the session is deleted.
type Session struct {
	ID                                string // internal id "ses_..."
	OrgID, ProjectID, SessionID       string
	CreatedBy                         string
	ContainerID                       string // runtime container id (set by caller)
	Status                            string // provisioning|running|paused|stopping|stopped|failed|deleted
	StatusReason                      string // e.g. "oom", "" normally
	Size, RequestedSize               string
	VCPUs, MemoryMiB, DiskMiB, Pids   int
	CreditRate                        int64 // milli-credits per hour of running time
	GitRepo, GitBranch                string
	Env                               map[string]string // stored as JSON
	SecretNames                       []string          // names only, stored as JSON
	IdleTimeoutSeconds                int
	IdleAction                        string // what the idle timeout does: "teardown", "pause" ("": the server's default)
	EgressBytesUsed, EgressBytesLimit int64
	CreatedAt                         time.Time
	StartedAt, StoppedAt              *time.Time
	UpdatedAt                         time.Time
	// Saved is the latest save of the session's disk in its organization's
	// storage (written by SetSaved only).
	Saved Saved
}

// Saved describes a session's save: an object in its organization's
// storage. Object "" means never saved.
type Saved struct {
	Object     string
	Bytes      int64
	SHA256     string
	At         *time.Time
	Generation int64
}

const sessionCols = `id, org_id, project_id, session_id, created_by, container_id, status, status_reason,
	size, requested_size, vcpus, memory_mib, disk_mib, pids, credit_rate_milli, git_repo, git_branch,
	env, secret_names, idle_timeout_seconds, egress_bytes_used, egress_bytes_limit,
	created_at, started_at, stopped_at, updated_at,
	saved_object, saved_bytes, saved_sha256, saved_at, saved_generation, idle_action`

func scanSession(r rowScanner) (Session, error) {
	var (
		s                Session
		env, secrets     string
		created, updated int64
		started, stopped sql.NullInt64
		savedAt          sql.NullInt64
	)
	err := r.Scan(&s.ID, &s.OrgID, &s.ProjectID, &s.SessionID, &s.CreatedBy, &s.ContainerID, &s.Status, &s.StatusReason,
		&s.Size, &s.RequestedSize, &s.VCPUs, &s.MemoryMiB, &s.DiskMiB, &s.Pids, &s.CreditRate, &s.GitRepo, &s.GitBranch,
		&env, &secrets, &s.IdleTimeoutSeconds, &s.EgressBytesUsed, &s.EgressBytesLimit,
		&created, &started, &stopped, &updated,
		&s.Saved.Object, &s.Saved.Bytes, &s.Saved.SHA256, &savedAt, &s.Saved.Generation, &s.IdleAction)
	if err != nil {
		return Session{}, err
	}
	if err := json.Unmarshal([]byte(env), &s.Env); err != nil {
		return Session{}, fmt.Errorf("session %s env: %w", s.ID, err)
	}
	if err := json.Unmarshal([]byte(secrets), &s.SecretNames); err != nil {
		return Session{}, fmt.Errorf("session %s secret names: %w", s.ID, err)
	}
	s.CreatedAt, s.UpdatedAt = fromTS(created), fromTS(updated)
	s.StartedAt, s.StoppedAt = fromNullTS(started), fromNullTS(stopped)
	s.Saved.At = fromNullTS(savedAt)
	return s, nil
}

func normTimePtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	n := normTime(*t)
	return &n
}

// InsertSession inserts s, filling ID, Status (provisioning), CreatedAt and
// UpdatedAt when empty. A (OrgID, SessionID) pair that already exists, in any
// status including deleted, yields ErrConflict.
func (db *DB) InsertSession(ctx context.Context, s *Session) error {
	now := db.now()
	if s.ID == "" {
		s.ID = newID("ses")
	}
	if s.Status == "" {
		s.Status = StatusProvisioning
	}
	if s.CreatedAt.IsZero() {
		s.CreatedAt = now
	}
	if s.UpdatedAt.IsZero() {
		s.UpdatedAt = now
	}
	s.CreatedAt, s.UpdatedAt = normTime(s.CreatedAt), normTime(s.UpdatedAt)
	s.StartedAt, s.StoppedAt = normTimePtr(s.StartedAt), normTimePtr(s.StoppedAt)
	env, err := marshalJSON(s.Env)
	if err != nil {
		return fmt.Errorf("store: insert session %s: env: %w", s.SessionID, err)
	}
	secrets, err := marshalJSON(s.SecretNames)
	if err != nil {
		return fmt.Errorf("store: insert session %s: secret names: %w", s.SessionID, err)
	}
	s.Saved.At = normTimePtr(s.Saved.At)
	_, err = db.w.ExecContext(ctx, `INSERT INTO sessions(`+sessionCols+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		s.ID, s.OrgID, s.ProjectID, s.SessionID, s.CreatedBy, s.ContainerID, s.Status, s.StatusReason,
		s.Size, s.RequestedSize, s.VCPUs, s.MemoryMiB, s.DiskMiB, s.Pids, s.CreditRate, s.GitRepo, s.GitBranch,
		env, secrets, s.IdleTimeoutSeconds, s.EgressBytesUsed, s.EgressBytesLimit,
		ts(s.CreatedAt), nullTS(s.StartedAt), nullTS(s.StoppedAt), ts(s.UpdatedAt),
		s.Saved.Object, s.Saved.Bytes, s.Saved.SHA256, nullTS(s.Saved.At), s.Saved.Generation, s.IdleAction)
	if isUnique(err) {
		err = ErrConflict
	}
	if err != nil {
		return fmt.Errorf("store: insert session %s: %w", s.SessionID, err)
	}
	return nil
}

// GetSession returns the org's session by client session id. Deleted
// sessions yield ErrNotFound.
func (db *DB) GetSession(ctx context.Context, orgID, sessionID string) (Session, error) {
	s, err := scanSession(db.r.QueryRowContext(ctx, `SELECT `+sessionCols+` FROM sessions
		WHERE org_id = ? AND session_id = ? AND status <> ?`, orgID, sessionID, StatusDeleted))
	if err != nil {
		return Session{}, fmt.Errorf("store: get session %s: %w", sessionID, notFound(err))
	}
	return s, nil
}

// GetSessionByID returns a session by internal id, in any status.
func (db *DB) GetSessionByID(ctx context.Context, id string) (Session, error) {
	s, err := scanSession(db.r.QueryRowContext(ctx, `SELECT `+sessionCols+` FROM sessions WHERE id = ?`, id))
	if err != nil {
		return Session{}, fmt.Errorf("store: get session %s: %w", id, notFound(err))
	}
	return s, nil
}

// GetSessionsByID reads the sessions with these primary keys in one query
// (the monitor's round re-reads each session it has locked); a key with no
// row is absent from the map.
func (db *DB) GetSessionsByID(ctx context.Context, ids []string) (map[string]Session, error) {
	out := make(map[string]Session, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	list, err := db.querySessions(ctx, `SELECT `+sessionCols+` FROM sessions WHERE id IN (?`+strings.Repeat(`, ?`, len(ids)-1)+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: get sessions: %w", err)
	}
	for _, s := range list {
		out[s.ID] = s
	}
	return out, nil
}

// ListSessions lists the org's sessions newest first. status "" lists all
// but deleted sessions; otherwise only sessions with that status.
func (db *DB) ListSessions(ctx context.Context, orgID, status string) ([]Session, error) {
	q := `SELECT ` + sessionCols + ` FROM sessions WHERE org_id = ? AND status <> ? ORDER BY created_at DESC, rowid DESC`
	args := []any{orgID, StatusDeleted}
	if status != "" {
		q = `SELECT ` + sessionCols + ` FROM sessions WHERE org_id = ? AND status = ? ORDER BY created_at DESC, rowid DESC`
		args = []any{orgID, status}
	}
	out, err := db.querySessions(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list sessions: %w", err)
	}
	return out, nil
}

// ListLiveSessions lists sessions of all orgs whose status is provisioning,
// running, paused or stopping, oldest first.
func (db *DB) ListLiveSessions(ctx context.Context) ([]Session, error) {
	out, err := db.querySessions(ctx, `SELECT `+sessionCols+` FROM sessions
		WHERE status IN (?, ?, ?, ?) ORDER BY created_at, rowid`,
		StatusProvisioning, StatusRunning, StatusPaused, StatusStopping)
	if err != nil {
		return nil, fmt.Errorf("store: list live sessions: %w", err)
	}
	return out, nil
}

// SessionContainer is a session row's container id and status: what a
// row claims on the host (sandboxd gc).
type SessionContainer struct {
	ID, ContainerID, Status string
}

// ListSessionContainers lists the container id and status of every session
// row of all orgs, deleted rows included.
func (db *DB) ListSessionContainers(ctx context.Context) ([]SessionContainer, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT id, container_id, status FROM sessions ORDER BY rowid`)
	if err != nil {
		return nil, fmt.Errorf("store: list session containers: %w", err)
	}
	defer rows.Close()
	var out []SessionContainer
	for rows.Next() {
		var c SessionContainer
		if err := rows.Scan(&c.ID, &c.ContainerID, &c.Status); err != nil {
			return nil, fmt.Errorf("store: list session containers: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list session containers: %w", err)
	}
	return out, nil
}

func (db *DB) querySessions(ctx context.Context, q string, args ...any) ([]Session, error) {
	rows, err := db.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Session
	for rows.Next() {
		s, err := scanSession(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// UpdateSession writes the mutable fields of s by ID: container id, status,
// reason, size and limits, idle timeout, usage counters, started/stopped
// times; UpdatedAt is set to now. The egress byte count only grows (a
// stale copy never lowers what SetEgressUsed wrote). ErrNotFound if no such row.
func (db *DB) UpdateSession(ctx context.Context, s *Session) error {
	s.UpdatedAt = db.now()
	s.StartedAt, s.StoppedAt = normTimePtr(s.StartedAt), normTimePtr(s.StoppedAt)
	res, err := db.w.ExecContext(ctx, `UPDATE sessions SET
		container_id = ?, status = ?, status_reason = ?, size = ?, vcpus = ?, memory_mib = ?, disk_mib = ?, pids = ?,
		credit_rate_milli = ?, idle_timeout_seconds = ?, egress_bytes_used = MAX(egress_bytes_used, ?), egress_bytes_limit = ?,
		started_at = ?, stopped_at = ?, updated_at = ?, git_branch = ?
		WHERE id = ?`,
		s.ContainerID, s.Status, s.StatusReason, s.Size, s.VCPUs, s.MemoryMiB, s.DiskMiB, s.Pids,
		s.CreditRate, s.IdleTimeoutSeconds, s.EgressBytesUsed, s.EgressBytesLimit,
		nullTS(s.StartedAt), nullTS(s.StoppedAt), ts(s.UpdatedAt), s.GitBranch, s.ID)
	if err == nil {
		err = mustAffect(res)
	}
	if err != nil {
		return fmt.Errorf("store: update session %s: %w", s.ID, err)
	}
	return nil
}

// DeleteSessionRow removes the row completely; it is only for undoing a
// failed provision. To delete a session, set Status to "deleted" and call
// UpdateSession. ErrNotFound if no such row.
func (db *DB) DeleteSessionRow(ctx context.Context, id string) error {
	res, err := db.w.ExecContext(ctx, `DELETE FROM sessions WHERE id = ?`, id)
	if err == nil {
		err = mustAffect(res)
	}
	if err != nil {
		return fmt.Errorf("store: delete session row %s: %w", id, err)
	}
	return nil
}

// CountByStatus counts sessions of all organizations by status (deleted
// rows excluded), for metrics.
func (db *DB) CountByStatus(ctx context.Context) (map[string]int, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT status, COUNT(*) FROM sessions WHERE status != ? GROUP BY status`, StatusDeleted)
	if err != nil {
		return nil, fmt.Errorf("count sessions: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("count sessions: %w", err)
		}
		out[s] = n
	}
	return out, rows.Err()
}

// SetEgressUsed raises a session's egress byte count to used (it never
// lowers it). ErrNotFound if no such row.
// NoteEgressUsed saves a session's egress byte count in the background
// (batched, like the audit log; drained by Close), as SetEgressUsed does: it
// never lowers the stored count. For callers in a data path.
func (db *DB) NoteEgressUsed(id string, used int64) {
	db.egress.put(egressUse{id, used})
}

type egressUse struct {
	id   string
	used int64
}

func (db *DB) writeEgress(ctx context.Context, items []egressUse) error {
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, u := range items {
		// A session deleted meanwhile (a failed provision) updates nothing.
		if _, err := tx.ExecContext(ctx, `UPDATE sessions SET egress_bytes_used = MAX(egress_bytes_used, ?) WHERE id = ?`, u.used, u.id); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func (db *DB) SetEgressUsed(ctx context.Context, id string, used int64) error {
	res, err := db.w.ExecContext(ctx, `UPDATE sessions SET egress_bytes_used = MAX(egress_bytes_used, ?) WHERE id = ?`, used, id)
	if err == nil {
		err = mustAffect(res)
	}
	if err != nil {
		return fmt.Errorf("store: set egress usage %s: %w", id, err)
	}
	return nil
}

// SetSaved records a session's latest save (UpdateSession leaves it alone,
// so a stale copy of a session never forgets a save). ErrNotFound if no
// such row.
func (db *DB) SetSaved(ctx context.Context, id string, sv Saved) error {
	sv.At = normTimePtr(sv.At)
	res, err := db.w.ExecContext(ctx, `UPDATE sessions SET saved_object = ?, saved_bytes = ?, saved_sha256 = ?,
		saved_at = ?, saved_generation = ? WHERE id = ?`,
		sv.Object, sv.Bytes, sv.SHA256, nullTS(sv.At), sv.Generation, id)
	if err == nil {
		err = mustAffect(res)
	}
	if err != nil {
		return fmt.Errorf("store: set saved %s: %w", id, err)
	}
	return nil
}
