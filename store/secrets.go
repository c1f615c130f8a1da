package store

import (
	"context"
	"database/sql"
	"fmt"
)

// SetSecrets replaces the secrets of a session (by internal id).
func (db *DB) SetSecrets(ctx context.Context, sessionPK string, secrets map[string]string) error {
	if db.keys == nil && len(secrets) > 0 {
		return ErrNoKeyring
	}
	return db.withTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM session_secrets WHERE session_pk = ?`, sessionPK); err != nil {
			return fmt.Errorf("set secrets: %w", err)
		}
		for k, v := range secrets {
			sealed := db.keys.Seal(v, secretAAD(sessionPK, k))
			if _, err := tx.ExecContext(ctx, `INSERT INTO session_secrets(session_pk, name, value) VALUES (?, ?, ?)`, sessionPK, k, sealed); err != nil {
				return fmt.Errorf("set secrets: %w", err)
			}
		}
		return nil
	})
}

// Secrets returns the secrets of a session (by internal id), name -> value.
func (db *DB) Secrets(ctx context.Context, sessionPK string) (map[string]string, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT name, value FROM session_secrets WHERE session_pk = ?`, sessionPK)
	if err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, fmt.Errorf("secrets: %w", err)
		}
		if db.keys == nil {
			return nil, ErrNoKeyring
		}
		plain, err := db.keys.Open(v, secretAAD(sessionPK, k))
		if err != nil {
			return nil, fmt.Errorf("secrets: %w", err)
		}
		out[k] = plain
	}
	return out, rows.Err()
}

// TokenOwner identifies a token that no longer authenticates (revoked, or
// its user left the org), so a denied attempt can be audited under its
// organization. Unknown tokens are ErrNotFound.
func (db *DB) TokenOwner(ctx context.Context, token string) (orgID, userID, tokenID string, err error) {
	err = db.r.QueryRowContext(ctx, `SELECT org_id, user_id, id FROM tokens WHERE hash = ?`, hashSecret(token)).Scan(&orgID, &userID, &tokenID)
	if err != nil {
		return "", "", "", fmt.Errorf("store: token owner: %w", notFound(err))
	}
	return orgID, userID, tokenID, nil
}
