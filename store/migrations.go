package store

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations are applied in order; migrations[i] has version i+1. Never edit
// an applied migration: append a new one.
var migrations = []string{
	// 1: initial schema. Times are INTEGER unix nanoseconds, UTC.
	`
CREATE TABLE orgs (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	created_at INTEGER NOT NULL
);

CREATE TABLE users (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	created_at INTEGER NOT NULL
);

CREATE TABLE memberships (
	org_id     TEXT NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
	user_id    TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	role       TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'developer', 'viewer')),
	created_at INTEGER NOT NULL,
	PRIMARY KEY (org_id, user_id)
);
CREATE INDEX memberships_user ON memberships(user_id);

CREATE TABLE projects (
	id         TEXT PRIMARY KEY,
	org_id     TEXT NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
	name       TEXT NOT NULL,
	is_default INTEGER NOT NULL DEFAULT 0,
	created_at INTEGER NOT NULL
);
CREATE INDEX projects_org ON projects(org_id);
CREATE UNIQUE INDEX projects_org_default ON projects(org_id) WHERE is_default = 1;

CREATE TABLE tokens (
	id           TEXT PRIMARY KEY,
	org_id       TEXT NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
	user_id      TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
	name         TEXT NOT NULL,
	hash         TEXT NOT NULL,
	created_at   INTEGER NOT NULL,
	last_used_at INTEGER,
	revoked_at   INTEGER
);
CREATE UNIQUE INDEX tokens_hash ON tokens(hash);
CREATE INDEX tokens_org_user ON tokens(org_id, user_id);

CREATE TABLE sessions (
	id                   TEXT PRIMARY KEY,
	org_id               TEXT NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
	project_id           TEXT NOT NULL,
	session_id           TEXT NOT NULL,
	created_by           TEXT NOT NULL,
	container_id         TEXT NOT NULL DEFAULT '',
	status               TEXT NOT NULL,
	status_reason        TEXT NOT NULL DEFAULT '',
	size                 TEXT NOT NULL DEFAULT '',
	requested_size       TEXT NOT NULL DEFAULT '',
	vcpus                INTEGER NOT NULL DEFAULT 0,
	memory_mib           INTEGER NOT NULL DEFAULT 0,
	disk_mib             INTEGER NOT NULL DEFAULT 0,
	pids                 INTEGER NOT NULL DEFAULT 0,
	credits_per_hour     REAL NOT NULL DEFAULT 0,
	git_repo             TEXT NOT NULL DEFAULT '',
	git_branch           TEXT NOT NULL DEFAULT '',
	env                  TEXT NOT NULL DEFAULT 'null',
	secret_names         TEXT NOT NULL DEFAULT 'null',
	idle_timeout_seconds INTEGER NOT NULL DEFAULT 0,
	egress_bytes_used    INTEGER NOT NULL DEFAULT 0,
	egress_bytes_limit   INTEGER NOT NULL DEFAULT 0,
	credits_used         REAL NOT NULL DEFAULT 0,
	created_at           INTEGER NOT NULL,
	started_at           INTEGER,
	stopped_at           INTEGER,
	updated_at           INTEGER NOT NULL
);
CREATE UNIQUE INDEX sessions_org_session ON sessions(org_id, session_id);
CREATE INDEX sessions_org_created ON sessions(org_id, created_at);
CREATE INDEX sessions_status ON sessions(status);

CREATE TABLE audit (
	id          INTEGER PRIMARY KEY AUTOINCREMENT,
	time        INTEGER NOT NULL,
	org_id      TEXT NOT NULL DEFAULT '',
	user_id     TEXT NOT NULL DEFAULT '',
	token_id    TEXT NOT NULL DEFAULT '',
	action      TEXT NOT NULL DEFAULT '',
	session_id  TEXT NOT NULL DEFAULT '',
	outcome     TEXT NOT NULL DEFAULT '',
	status      INTEGER NOT NULL DEFAULT 0,
	remote_addr TEXT NOT NULL DEFAULT '',
	request_id  TEXT NOT NULL DEFAULT '',
	details     TEXT NOT NULL DEFAULT 'null'
);
CREATE INDEX audit_org_time ON audit(org_id, time);
CREATE INDEX audit_org_session_time ON audit(org_id, session_id, time);
CREATE INDEX audit_time ON audit(time);
`,
	// 2: secrets given at provision, kept to inject into every command and to
	// redact from output; never returned by the API.
	`
CREATE TABLE session_secrets (
	session_pk TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
	name       TEXT NOT NULL,
	value      TEXT NOT NULL,
	PRIMARY KEY (session_pk, name)
);
`,
	// 3: server events of a session's log (process_start, exit, ...), so a
	// restart keeps them. seq numbers a session's events 1, 2, ... in write
	// order; entry is the scrubbed JSON object.
	`
CREATE TABLE session_events (
	session_pk TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
	seq        INTEGER NOT NULL,
	time       INTEGER NOT NULL,
	entry      TEXT NOT NULL
);
CREATE UNIQUE INDEX session_events_session_seq ON session_events(session_pk, seq);
`,
	// 4: a user's Git credential (sealed, see seal.go); one per user.
	`
CREATE TABLE git_credentials (
	user_id    TEXT PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
	token      TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
`,
	// 5: a session's latest save in its organization's storage (the object's
	// name, size, SHA-256, when, and its generation: object names carry it).
	`
ALTER TABLE sessions ADD COLUMN saved_object TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN saved_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN saved_sha256 TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN saved_at INTEGER;
ALTER TABLE sessions ADD COLUMN saved_generation INTEGER NOT NULL DEFAULT 0;
`,
	// 6: what a session's idle timeout does (pause with memory or tear
	// down); '' is the server's default.
	`
ALTER TABLE sessions ADD COLUMN idle_action TEXT NOT NULL DEFAULT '';
`,
	// 7: plans and usage credits, in exact milli-credits. An organization's
	// plan ('' is the configured default) and the day of the month its
	// billing periods start (0: the day it was created). usage_runs holds
	// running time: a run opens when a session starts running and closes
	// when it stops; end_at of an open run is the last moment the server
	// saw it alive (the monitor moves it), so a crash charges up to there
	// and not twice. Runs outlive their session (the organization was
	// charged). credit_grants are credits operators added to a period.
	// Operators are users that may change plans and grant credits.
	`
ALTER TABLE orgs ADD COLUMN plan TEXT NOT NULL DEFAULT '';
ALTER TABLE orgs ADD COLUMN anchor_day INTEGER NOT NULL DEFAULT 0;
ALTER TABLE users ADD COLUMN operator INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN credit_rate_milli INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET credit_rate_milli = CAST(ROUND(credits_per_hour * 1000) AS INTEGER);

CREATE TABLE usage_runs (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	org_id     TEXT NOT NULL,
	session_pk TEXT NOT NULL,
	session_id TEXT NOT NULL,
	size       TEXT NOT NULL,
	rate_milli INTEGER NOT NULL,
	start_at   INTEGER NOT NULL,
	end_at     INTEGER NOT NULL,
	open       INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX usage_runs_org_end ON usage_runs(org_id, end_at);
CREATE UNIQUE INDEX usage_runs_open ON usage_runs(session_pk) WHERE open = 1;

CREATE TABLE credit_grants (
	id           INTEGER PRIMARY KEY AUTOINCREMENT,
	org_id       TEXT NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
	amount_milli INTEGER NOT NULL,
	time         INTEGER NOT NULL,
	granted_by   TEXT NOT NULL,
	note         TEXT NOT NULL DEFAULT ''
);
CREATE INDEX credit_grants_org_time ON credit_grants(org_id, time);

-- An installation from before plans: its first organization's owners
-- operate it (the server puts that organization on plans.firstOrg).
UPDATE users SET operator = 1 WHERE id IN (SELECT m.user_id FROM memberships m WHERE m.role = 'owner'
	AND m.org_id = (SELECT id FROM orgs ORDER BY created_at, id LIMIT 1));
`,
}

// migrate applies every migration not yet recorded in schema_migrations,
// each in its own (immediate) transaction, so concurrent openers of the same
// file do not apply a migration twice.
func migrate(ctx context.Context, w *sql.DB, now int64) error {
	if _, err := w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		applied_at INTEGER NOT NULL
	)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	for i, m := range migrations {
		version := i + 1
		if err := applyMigration(ctx, w, version, m, now); err != nil {
			return fmt.Errorf("migration %d: %w", version, err)
		}
	}
	return nil
}

func applyMigration(ctx context.Context, w *sql.DB, version int, stmt string, now int64) error {
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, stmt); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations(version, applied_at) VALUES (?, ?)`, version, now); err != nil {
		return err
	}
	return tx.Commit()
}
