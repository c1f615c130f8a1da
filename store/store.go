// Package store owns sandboxd's embedded SQLite state: organizations, users,
// memberships with roles, projects, bearer tokens, sessions (sandboxes), the
// sessions' persisted log events and the audit log, together with the schema
// and its migrations.
//
// A *DB is safe for concurrent use by multiple goroutines. Writes go through a
// single connection (SQLite allows one writer at a time, so serializing them in
// Go avoids SQLITE_BUSY); reads use a separate pool of read-only connections
// that run concurrently thanks to WAL mode. Audit records and session events
// are written asynchronously, in batches, by background writers (one
// goroutine each) that Close drains.
package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

var (
	// ErrNotFound is returned (possibly wrapped) when a row does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict is returned (possibly wrapped) on unique violations, e.g. a
	// reused session id within an organization, or when a change would leave
	// an organization without an owner.
	ErrConflict = errors.New("conflict")
	// ErrInvalid is returned (wrapped) for invalid arguments such as an
	// unknown role.
	ErrInvalid = errors.New("invalid argument")
)

// Roles of a member within an organization.
const (
	RoleOwner     = "owner"
	RoleAdmin     = "admin"
	RoleDeveloper = "developer"
	RoleViewer    = "viewer"
)

// ValidRole reports whether r is one of the known roles.
func ValidRole(r string) bool {
	switch r {
	case RoleOwner, RoleAdmin, RoleDeveloper, RoleViewer:
		return true
	}
	return false
}

// Session statuses.
const (
	StatusProvisioning = "provisioning"
	StatusRunning      = "running"
	StatusPaused       = "paused"
	StatusStopping     = "stopping"
	StatusStopped      = "stopped"
	StatusFailed       = "failed"
	StatusDeleted      = "deleted"
)

// Org is an organization, the unit of tenancy.
type Org struct {
	ID, Name  string
	CreatedAt time.Time
}

// User is a person or robot that holds tokens.
type User struct {
	ID, Name  string
	CreatedAt time.Time
}

// Project groups sessions within an organization.
type Project struct {
	ID, OrgID, Name string
	CreatedAt       time.Time
}

// Member is a user's membership in an organization.
type Member struct {
	OrgID, UserID, UserName, Role string
	CreatedAt                     time.Time
}

// Token describes a bearer token; the secret itself is never stored.
type Token struct {
	ID, OrgID, UserID, Name string
	CreatedAt               time.Time
	LastUsedAt, RevokedAt   *time.Time
}

// Principal is who a bearer token authenticates as.
type Principal struct {
	Org       Org
	User      User
	Role      string
	TokenID   string
	ProjectID string // the org's default project
	// Operator: the user operates the installation (changes plans, grants
	// credits), whatever its role in the organization.
	Operator bool
}

// DB is the store handle. Create it with Open.
type DB struct {
	// Now returns the current time; it defaults to time.Now().UTC(). Tests may
	// replace it before using the DB.
	Now func() time.Time
	// OnError, if set, receives errors that cannot be returned to a caller:
	// failed background audit and event writes and failed last_used_at
	// updates.
	OnError func(error)

	w *sql.DB // single writer connection, BEGIN IMMEDIATE
	r *sql.DB // read-only pool

	keys *Keyring // seals secrets at rest (SetKeyring)

	audit     *writer[AuditRecord]
	events    *writer[Event]
	egress    *writer[egressUse]
	closeOnce sync.Once
	closeErr  error
}

const touchEvery = time.Minute

// Open opens or creates the SQLite database at path (created with mode 0600),
// enables WAL, busy_timeout(5000), foreign keys and synchronous=NORMAL, and
// applies pending migrations.
func Open(path string) (*DB, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: create %s: %w", path, err)
	}
	f.Close()

	common := "_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
	u := url.URL{Scheme: "file", Opaque: (&url.URL{Path: path}).EscapedPath()}
	base := u.String()
	w, err := sql.Open("sqlite", base+"?"+common+"&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)

	db := &DB{
		Now: func() time.Time { return time.Now().UTC() },
		w:   w,
	}
	ctx := context.Background()
	// Touch the writer first so WAL mode is set before readers connect.
	// Switching a file to WAL while another process opens it can fail with
	// SQLITE_BUSY without waiting for busy_timeout: retry for a while.
	for attempt := 0; ; attempt++ {
		err = w.PingContext(ctx)
		if err == nil {
			err = migrate(ctx, w, db.now().UnixNano())
		}
		if err == nil {
			break
		}
		if attempt >= 100 || !strings.Contains(err.Error(), "SQLITE_BUSY") {
			w.Close()
			return nil, fmt.Errorf("store: open %s: %w", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r, err := sql.Open("sqlite", base+"?"+common+"&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	db.r = r
	db.audit = newWriter("audit records", db.writeAudit, db.report)
	db.events = newWriter("session events", db.writeEvents, db.report)
	db.egress = newWriter("egress counts", db.writeEgress, db.report)
	return db, nil
}

// Close drains the audit, session event and egress count writers, writing every enqueued
// record, then closes the database. It is safe to call more than once.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		db.audit.close()
		db.events.close()
		db.egress.close()
		// Fold the WAL back into the main file; failure is harmless.
		_, _ = db.w.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`)
		db.closeErr = errors.Join(db.r.Close(), db.w.Close())
		if db.closeErr != nil {
			db.closeErr = fmt.Errorf("store: close: %w", db.closeErr)
		}
	})
	return db.closeErr
}

func (db *DB) now() time.Time {
	return normTime(db.Now())
}

func (db *DB) report(err error) {
	if db.OnError != nil && err != nil {
		db.OnError(err)
	}
}

// --- encoding helpers ---

// normTime truncates t to what the database stores, so values handed back to
// callers compare == to values read later.
func normTime(t time.Time) time.Time { return time.Unix(0, t.UnixNano()).UTC() }

func ts(t time.Time) int64 { return t.UnixNano() }

func fromTS(n int64) time.Time { return time.Unix(0, n).UTC() }

func nullTS(t *time.Time) sql.NullInt64 {
	if t == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixNano(), Valid: true}
}

func fromNullTS(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromTS(n.Int64)
	return &t
}

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// newID returns prefix + "_" + 26 random lowercase Crockford base32 chars.
func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:]) // never fails
	return prefix + "_" + idEncoding.EncodeToString(b[:])
}

// newSecret returns a token secret and its sha256 hex hash.
func newSecret() (secret, hash string) {
	var b [32]byte
	rand.Read(b[:])
	secret = "sbx_" + base64.RawURLEncoding.EncodeToString(b[:])
	return secret, hashSecret(secret)
}

func hashSecret(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func isUnique(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return true
	}
	return se.Code()&0xff == sqlite3.SQLITE_CONSTRAINT && strings.Contains(se.Error(), "UNIQUE")
}

// IsDiskFull reports whether err is SQLite's "database or disk is full"
// (the data dir's file system has no space left) or ENOSPC itself.
func IsDiskFull(err error) bool {
	var se *sqlite.Error
	return errors.Is(err, syscall.ENOSPC) || errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL
}

func isForeignKey(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}

func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// withTx runs fn in a write transaction and commits it.
func (db *DB) withTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

type rowScanner interface{ Scan(dest ...any) error }

// --- orgs, users, tokens ---

// Bootstrap creates, only when the database has no organization yet, an org
// on plan, an owner user who operates the installation, a default project
// and an owner token, in one transaction. It returns created=false and an
// empty token when an org already exists.
func (db *DB) Bootstrap(ctx context.Context, orgName, userName, plan string) (p Principal, token string, created bool, err error) {
	err = db.withTx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM orgs`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		if p, token, err = db.createOrg(ctx, tx, orgName, userName); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE orgs SET plan = ? WHERE id = ?`, plan, p.Org.ID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE users SET operator = 1 WHERE id = ?`, p.User.ID); err != nil {
			return err
		}
		p.Operator, created = true, true
		return nil
	})
	if err != nil {
		return Principal{}, "", false, fmt.Errorf("store: bootstrap: %w", err)
	}
	return p, token, created, nil
}

// CreateOrg creates a new org with an owner user, a default project and an
// owner token, in one transaction.
func (db *DB) CreateOrg(ctx context.Context, orgName, userName string) (p Principal, token string, err error) {
	err = db.withTx(ctx, func(tx *sql.Tx) error {
		p, token, err = db.createOrg(ctx, tx, orgName, userName)
		return err
	})
	if err != nil {
		return Principal{}, "", fmt.Errorf("store: create org: %w", err)
	}
	return p, token, nil
}

func (db *DB) createOrg(ctx context.Context, tx *sql.Tx, orgName, userName string) (Principal, string, error) {
	now := db.now()
	org := Org{ID: newID("org"), Name: orgName, CreatedAt: now}
	user := User{ID: newID("usr"), Name: userName, CreatedAt: now}
	prj := Project{ID: newID("prj"), OrgID: org.ID, Name: "default", CreatedAt: now}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orgs(id, name, created_at) VALUES (?, ?, ?)`,
		org.ID, org.Name, ts(now)); err != nil {
		return Principal{}, "", err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO users(id, name, created_at) VALUES (?, ?, ?)`,
		user.ID, user.Name, ts(now)); err != nil {
		return Principal{}, "", err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO memberships(org_id, user_id, role, created_at) VALUES (?, ?, ?, ?)`,
		org.ID, user.ID, RoleOwner, ts(now)); err != nil {
		return Principal{}, "", err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO projects(id, org_id, name, is_default, created_at) VALUES (?, ?, ?, 1, ?)`,
		prj.ID, prj.OrgID, prj.Name, ts(now)); err != nil {
		return Principal{}, "", err
	}
	tok, secret, err := insertToken(ctx, tx, org.ID, user.ID, "owner", now)
	if err != nil {
		return Principal{}, "", err
	}
	return Principal{Org: org, User: user, Role: RoleOwner, TokenID: tok.ID, ProjectID: prj.ID}, secret, nil
}

func insertToken(ctx context.Context, tx *sql.Tx, orgID, userID, name string, now time.Time) (Token, string, error) {
	secret, hash := newSecret()
	t := Token{ID: newID("tok"), OrgID: orgID, UserID: userID, Name: name, CreatedAt: now}
	_, err := tx.ExecContext(ctx, `INSERT INTO tokens(id, org_id, user_id, name, hash, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
		t.ID, t.OrgID, t.UserID, t.Name, hash, ts(now))
	if err != nil {
		return Token{}, "", err
	}
	return t, secret, nil
}

// Authenticate returns the principal for a bearer token. Unknown or revoked
// tokens, and tokens whose user is no longer a member, yield ErrNotFound.
// last_used_at is updated at most once a minute per token.
func (db *DB) Authenticate(ctx context.Context, token string) (Principal, error) {
	var (
		p        Principal
		lastUsed sql.NullInt64
		orgAt    int64
		userAt   int64
		project  sql.NullString
	)
	err := db.r.QueryRowContext(ctx, `
		SELECT t.id, t.last_used_at, o.id, o.name, o.created_at, u.id, u.name, u.created_at, m.role, p.id, u.operator
		FROM tokens t
		JOIN orgs o ON o.id = t.org_id
		JOIN users u ON u.id = t.user_id
		JOIN memberships m ON m.org_id = t.org_id AND m.user_id = t.user_id
		LEFT JOIN projects p ON p.org_id = t.org_id AND p.is_default = 1
		WHERE t.hash = ? AND t.revoked_at IS NULL`, hashSecret(token)).Scan(
		&p.TokenID, &lastUsed, &p.Org.ID, &p.Org.Name, &orgAt, &p.User.ID, &p.User.Name, &userAt, &p.Role, &project, &p.Operator)
	if err != nil {
		return Principal{}, fmt.Errorf("store: authenticate: %w", notFound(err))
	}
	p.Org.CreatedAt, p.User.CreatedAt, p.ProjectID = fromTS(orgAt), fromTS(userAt), project.String

	now := db.now()
	if !lastUsed.Valid || now.Sub(fromTS(lastUsed.Int64)) >= touchEvery {
		_, err := db.w.ExecContext(ctx, `UPDATE tokens SET last_used_at = ?
			WHERE id = ? AND (last_used_at IS NULL OR last_used_at <= ?)`,
			ts(now), p.TokenID, ts(now.Add(-touchEvery)))
		if err != nil {
			db.report(fmt.Errorf("store: touch token %s: %w", p.TokenID, err))
		}
	}
	return p, nil
}

// TokenRole returns the role a token's user has now in the token's
// organization. ErrNotFound: the token was revoked or its user is no
// longer a member.
func (db *DB) TokenRole(ctx context.Context, tokenID string) (string, error) {
	var role string
	err := db.r.QueryRowContext(ctx, `
		SELECT m.role FROM tokens t
		JOIN memberships m ON m.org_id = t.org_id AND m.user_id = t.user_id
		WHERE t.id = ? AND t.revoked_at IS NULL`, tokenID).Scan(&role)
	if err != nil {
		return "", fmt.Errorf("store: token role: %w", notFound(err))
	}
	return role, nil
}

// CreateToken creates a token for a member of the org. It returns ErrNotFound
// if userID is not a member of orgID. The secret is returned only here.
func (db *DB) CreateToken(ctx context.Context, orgID, userID, name string) (Token, string, error) {
	var (
		tok    Token
		secret string
	)
	err := db.withTx(ctx, func(tx *sql.Tx) error {
		if err := checkMember(ctx, tx, orgID, userID); err != nil {
			return err
		}
		var err error
		tok, secret, err = insertToken(ctx, tx, orgID, userID, name, db.now())
		return err
	})
	if err != nil {
		return Token{}, "", fmt.Errorf("store: create token: %w", err)
	}
	return tok, secret, nil
}

func checkMember(ctx context.Context, tx *sql.Tx, orgID, userID string) error {
	var role string
	err := tx.QueryRowContext(ctx, `SELECT role FROM memberships WHERE org_id = ? AND user_id = ?`, orgID, userID).Scan(&role)
	return notFound(err)
}

const tokenCols = `id, org_id, user_id, name, created_at, last_used_at, revoked_at`

func scanToken(s rowScanner) (Token, error) {
	var (
		t         Token
		created   int64
		lastUsed  sql.NullInt64
		revokedAt sql.NullInt64
	)
	if err := s.Scan(&t.ID, &t.OrgID, &t.UserID, &t.Name, &created, &lastUsed, &revokedAt); err != nil {
		return Token{}, err
	}
	t.CreatedAt, t.LastUsedAt, t.RevokedAt = fromTS(created), fromNullTS(lastUsed), fromNullTS(revokedAt)
	return t, nil
}

// ListTokens lists the org's tokens (including revoked ones), oldest first;
// userID "" lists all of the org's tokens.
func (db *DB) ListTokens(ctx context.Context, orgID, userID string) ([]Token, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT `+tokenCols+` FROM tokens
		WHERE org_id = ? AND (? = '' OR user_id = ?) ORDER BY created_at, rowid`, orgID, userID, userID)
	if err != nil {
		return nil, fmt.Errorf("store: list tokens: %w", err)
	}
	defer rows.Close()
	var out []Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list tokens: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list tokens: %w", err)
	}
	return out, nil
}

// GetToken returns a token of the org, or ErrNotFound.
func (db *DB) GetToken(ctx context.Context, orgID, tokenID string) (Token, error) {
	t, err := scanToken(db.r.QueryRowContext(ctx, `SELECT `+tokenCols+` FROM tokens WHERE org_id = ? AND id = ?`, orgID, tokenID))
	if err != nil {
		return Token{}, fmt.Errorf("store: get token %s: %w", tokenID, notFound(err))
	}
	return t, nil
}

// RevokeToken revokes a token of the org; ErrNotFound if it is not in the
// org. Revoking an already revoked token keeps the original revocation time.
func (db *DB) RevokeToken(ctx context.Context, orgID, tokenID string) error {
	res, err := db.w.ExecContext(ctx, `UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE org_id = ? AND id = ?`,
		ts(db.now()), orgID, tokenID)
	if err == nil {
		err = mustAffect(res)
	}
	if err != nil {
		return fmt.Errorf("store: revoke token %s: %w", tokenID, err)
	}
	return nil
}

func mustAffect(res sql.Result) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

// --- members and projects ---

// AddMember creates a new user named userName as a member of the org with
// role, and a token for them. ErrNotFound if the org does not exist.
func (db *DB) AddMember(ctx context.Context, orgID, userName, role string) (User, Token, string, error) {
	if !ValidRole(role) {
		return User{}, Token{}, "", fmt.Errorf("store: add member: role %q: %w", role, ErrInvalid)
	}
	var (
		user   User
		tok    Token
		secret string
	)
	err := db.withTx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM orgs WHERE id = ?`, orgID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return ErrNotFound
		}
		now := db.now()
		user = User{ID: newID("usr"), Name: userName, CreatedAt: now}
		if _, err := tx.ExecContext(ctx, `INSERT INTO users(id, name, created_at) VALUES (?, ?, ?)`,
			user.ID, user.Name, ts(now)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO memberships(org_id, user_id, role, created_at) VALUES (?, ?, ?, ?)`,
			orgID, user.ID, role, ts(now)); err != nil {
			return err
		}
		var err error
		tok, secret, err = insertToken(ctx, tx, orgID, user.ID, "default", now)
		return err
	})
	if err != nil {
		return User{}, Token{}, "", fmt.Errorf("store: add member: %w", err)
	}
	return user, tok, secret, nil
}

// ListMembers lists the org's members, oldest first.
func (db *DB) ListMembers(ctx context.Context, orgID string) ([]Member, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT m.org_id, m.user_id, u.name, m.role, m.created_at
		FROM memberships m JOIN users u ON u.id = m.user_id
		WHERE m.org_id = ? ORDER BY m.created_at, m.rowid`, orgID)
	if err != nil {
		return nil, fmt.Errorf("store: list members: %w", err)
	}
	defer rows.Close()
	var out []Member
	for rows.Next() {
		var (
			m       Member
			created int64
		)
		if err := rows.Scan(&m.OrgID, &m.UserID, &m.UserName, &m.Role, &created); err != nil {
			return nil, fmt.Errorf("store: list members: %w", err)
		}
		m.CreatedAt = fromTS(created)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list members: %w", err)
	}
	return out, nil
}

// ensureOtherOwner returns ErrConflict if userID is the org's only owner.
func ensureOtherOwner(ctx context.Context, tx *sql.Tx, orgID, userID string) error {
	var n int
	err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM memberships WHERE org_id = ? AND role = ? AND user_id <> ?`,
		orgID, RoleOwner, userID).Scan(&n)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("org would have no owner: %w", ErrConflict)
	}
	return nil
}

// SetMemberRole changes a member's role. ErrNotFound if not a member;
// ErrConflict if it would demote the org's last owner.
func (db *DB) SetMemberRole(ctx context.Context, orgID, userID, role string) error {
	if !ValidRole(role) {
		return fmt.Errorf("store: set member role: role %q: %w", role, ErrInvalid)
	}
	err := db.withTx(ctx, func(tx *sql.Tx) error {
		if err := checkMember(ctx, tx, orgID, userID); err != nil {
			return err
		}
		if role != RoleOwner {
			if err := ensureOtherOwner(ctx, tx, orgID, userID); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `UPDATE memberships SET role = ? WHERE org_id = ? AND user_id = ?`, role, orgID, userID)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: set member role: %w", err)
	}
	return nil
}

// RemoveMember removes a user from the org and revokes that user's tokens in
// the org. ErrNotFound if not a member; ErrConflict if it is the last owner.
func (db *DB) RemoveMember(ctx context.Context, orgID, userID string) error {
	err := db.withTx(ctx, func(tx *sql.Tx) error {
		if err := checkMember(ctx, tx, orgID, userID); err != nil {
			return err
		}
		if err := ensureOtherOwner(ctx, tx, orgID, userID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE tokens SET revoked_at = ? WHERE org_id = ? AND user_id = ? AND revoked_at IS NULL`,
			ts(db.now()), orgID, userID); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM memberships WHERE org_id = ? AND user_id = ?`, orgID, userID)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: remove member: %w", err)
	}
	return nil
}

// GetProject returns a project of the org, or ErrNotFound.
func (db *DB) GetProject(ctx context.Context, orgID, projectID string) (Project, error) {
	var (
		p       Project
		created int64
	)
	err := db.r.QueryRowContext(ctx, `SELECT id, org_id, name, created_at FROM projects WHERE org_id = ? AND id = ?`,
		orgID, projectID).Scan(&p.ID, &p.OrgID, &p.Name, &created)
	if err != nil {
		return Project{}, fmt.Errorf("store: get project %s: %w", projectID, notFound(err))
	}
	p.CreatedAt = fromTS(created)
	return p, nil
}

// --- JSON helpers ---

func marshalJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$`)

// ValidName checks an organization, user or token name.
func ValidName(s string) error {
	if !nameRe.MatchString(s) {
		return errors.New("1-64 characters of letters, digits, space, '.', '_' or '-', starting with a letter or digit")
	}
	return nil
}
