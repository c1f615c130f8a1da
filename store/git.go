package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// SetGitToken connects (or replaces) a user's Git credential, sealed.
func (db *DB) SetGitToken(ctx context.Context, userID, token string) (time.Time, error) {
	if db.keys == nil {
		return time.Time{}, ErrNoKeyring
	}
	now := db.now()
	_, err := db.w.ExecContext(ctx, `INSERT INTO git_credentials(user_id, token, created_at) VALUES (?, ?, ?)
		ON CONFLICT(user_id) DO UPDATE SET token = excluded.token, created_at = excluded.created_at`,
		userID, db.keys.Seal(token, gitAAD(userID)), now.UnixNano())
	if err != nil {
		return time.Time{}, fmt.Errorf("store: set git token: %w", err)
	}
	return now, nil
}

// DeleteGitToken removes a user's Git credential; ErrNotFound if none.
func (db *DB) DeleteGitToken(ctx context.Context, userID string) error {
	res, err := db.w.ExecContext(ctx, `DELETE FROM git_credentials WHERE user_id = ?`, userID)
	if err != nil {
		return fmt.Errorf("store: delete git token: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: delete git token: %w", ErrNotFound)
	}
	return nil
}

// GitConnected says whether a user has a Git credential, and since when.
func (db *DB) GitConnected(ctx context.Context, userID string) (bool, time.Time, error) {
	var at int64
	err := db.r.QueryRowContext(ctx, `SELECT created_at FROM git_credentials WHERE user_id = ?`, userID).Scan(&at)
	if errors.Is(err, sql.ErrNoRows) {
		return false, time.Time{}, nil
	}
	if err != nil {
		return false, time.Time{}, fmt.Errorf("store: git credential: %w", err)
	}
	return true, time.Unix(0, at).UTC(), nil
}

// GitToken returns a user's Git credential in clear (for the clone and
// push on the host side only); ErrNotFound if none.
func (db *DB) GitToken(ctx context.Context, userID string) (string, error) {
	var v string
	err := db.r.QueryRowContext(ctx, `SELECT token FROM git_credentials WHERE user_id = ?`, userID).Scan(&v)
	if err != nil {
		return "", fmt.Errorf("store: git credential: %w", notFound(err))
	}
	if db.keys == nil {
		return "", ErrNoKeyring
	}
	return db.keys.Open(v, gitAAD(userID))
}
