package store

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Secrets at rest (session secrets, Git credentials) are sealed with
// AES-256-GCM under a key kept outside the database, so a copy of the
// database alone reveals none of them. A sealed value reads
// "sbxenc1:<key id>:<base64url(nonce|ciphertext)>"; the key id (the first 8
// bytes of the key's SHA-256, hex) picks the key, so values sealed under
// the previous key still open while a rotation is unfinished. Each value is
// bound to its row (additional data), so sealed values cannot be swapped
// between rows.

const sealPrefix = "sbxenc1:"

// Key files in a data directory.
const (
	KeyFile    = "secrets.key"
	newKeyFile = "secrets.key.new" // a rotation's key until it is done
)

// ErrNoKeyring is returned when secrets are read or written with no key.
var ErrNoKeyring = errors.New("store: no secrets key")

// Keyring holds the key that seals and the keys that may open.
type Keyring struct {
	current string // key id
	aeads   map[string]cipher.AEAD
}

func keyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// NewKeyring seals with the first key and opens with any of them (32 bytes
// each).
func NewKeyring(keys ...[]byte) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("store: no key")
	}
	k := &Keyring{aeads: map[string]cipher.AEAD{}}
	for i, key := range keys {
		if len(key) != 32 {
			return nil, errors.New("store: a secrets key is 32 bytes")
		}
		b, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		g, err := cipher.NewGCM(b)
		if err != nil {
			return nil, err
		}
		id := keyID(key)
		k.aeads[id] = g
		if i == 0 {
			k.current = id
		}
	}
	return k, nil
}

// Seal encrypts v for the row named by aad.
func (k *Keyring) Seal(v, aad string) string {
	g := k.aeads[k.current]
	nonce := make([]byte, g.NonceSize())
	rand.Read(nonce)
	ct := g.Seal(nonce, nonce, []byte(v), []byte(aad))
	return sealPrefix + k.current + ":" + base64.RawURLEncoding.EncodeToString(ct)
}

// Open decrypts a sealed value of the row named by aad.
func (k *Keyring) Open(sealed, aad string) (string, error) {
	rest, ok := strings.CutPrefix(sealed, sealPrefix)
	id, b64, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 {
		return "", errors.New("store: not a sealed value")
	}
	g := k.aeads[id]
	if g == nil {
		return "", fmt.Errorf("store: value sealed with an unknown key %s (wrong %s?)", id, KeyFile)
	}
	ct, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil || len(ct) < g.NonceSize() {
		return "", errors.New("store: damaged sealed value")
	}
	pt, err := g.Open(nil, ct[:g.NonceSize()], ct[g.NonceSize():], []byte(aad))
	if err != nil {
		return "", errors.New("store: sealed value does not open (wrong key or tampered)")
	}
	return string(pt), nil
}

// sealedWith reports whether v is sealed with the current key.
func (k *Keyring) sealedWith(v string) bool {
	return strings.HasPrefix(v, sealPrefix+k.current+":")
}

// LoadKeyring reads the secrets key of a data directory, creating it (32
// random bytes, 0600) on first use. envKey, if set, is the key instead
// (base64 of 32 bytes, e.g. from SANDBOXD_SECRETS_KEY). The key of an
// unfinished rotation is loaded too, so that every value opens.
func LoadKeyring(dataDir, envKey string) (*Keyring, error) {
	if envKey != "" {
		key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(envKey))
		if err != nil || len(key) != 32 {
			return nil, errors.New("store: SANDBOXD_SECRETS_KEY must be the base64 of 32 bytes")
		}
		return NewKeyring(key)
	}
	key, err := readOrCreateKey(filepath.Join(dataDir, KeyFile))
	if err != nil {
		return nil, err
	}
	keys := [][]byte{key}
	if next, err := os.ReadFile(filepath.Join(dataDir, newKeyFile)); err == nil && len(next) == 32 {
		keys = append(keys, next)
	}
	return NewKeyring(keys...)
}

func readOrCreateKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if err == nil {
		if len(key) != 32 {
			return nil, fmt.Errorf("store: %s is not a 32-byte key", path)
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("store: secrets key: %w", err)
	}
	key = make([]byte, 32)
	rand.Read(key)
	if err := writeKey(path, key); err != nil {
		return nil, err
	}
	return key, nil
}

// writeKey writes a key file (0600) durably: a temp file, fsync, rename.
func writeKey(path string, key []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".key-*")
	if err != nil {
		return fmt.Errorf("store: secrets key: %w", err)
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o600); err == nil {
		_, err = f.Write(key)
		if err == nil {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("store: secrets key: %w", err)
	}
	return nil
}

// SetKeyring sets the keyring secrets are sealed and opened with.
func (db *DB) SetKeyring(k *Keyring) { db.keys = k }

// sealedColumns are the columns that hold sealed values, with how a row's
// additional data is made.
var sealedColumns = []struct {
	table, column, keys string // keys: the SELECT list that names a row
	aad                 func(vals []string) string
}{
	{"session_secrets", "value", "session_pk, name", func(v []string) string { return secretAAD(v[0], v[1]) }},
	{"git_credentials", "token", "user_id", func(v []string) string { return gitAAD(v[0]) }},
}

func secretAAD(sessionPK, name string) string {
	return "session_secrets\x00" + sessionPK + "\x00" + name
}
func gitAAD(userID string) string { return "git_credentials\x00" + userID }

// Reseal seals every value that is plaintext (rows from before secrets
// were sealed) or sealed with another key than the current one (a
// rotation), in one transaction. It returns how many values changed.
func (db *DB) Reseal(ctx context.Context) (int, error) {
	if db.keys == nil {
		return 0, ErrNoKeyring
	}
	n := 0
	err := db.withTx(ctx, func(tx *sql.Tx) error {
		for _, c := range sealedColumns {
			// Only what is not sealed with the current key (at a start: none).
			rows, err := tx.QueryContext(ctx, `SELECT rowid, `+c.keys+`, `+c.column+` FROM `+c.table+
				` WHERE substr(`+c.column+`, 1, ?) != ?`, len(sealPrefix+db.keys.current+":"), sealPrefix+db.keys.current+":")
			if err != nil {
				return err
			}
			type upd struct {
				rowid int64
				val   string
			}
			var ups []upd
			nk := len(strings.Split(c.keys, ","))
			for rows.Next() {
				var rowid int64
				vals := make([]string, nk)
				var v string
				dest := []any{&rowid}
				for i := range vals {
					dest = append(dest, &vals[i])
				}
				dest = append(dest, &v)
				if err := rows.Scan(dest...); err != nil {
					rows.Close()
					return err
				}
				if db.keys.sealedWith(v) {
					continue
				}
				aad := c.aad(vals)
				plain := v
				if strings.HasPrefix(v, sealPrefix) {
					if plain, err = db.keys.Open(v, aad); err != nil {
						rows.Close()
						return err
					}
				}
				ups = append(ups, upd{rowid, db.keys.Seal(plain, aad)})
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			for _, u := range ups {
				if _, err := tx.ExecContext(ctx, `UPDATE `+c.table+` SET `+c.column+` = ? WHERE rowid = ?`, u.val, u.rowid); err != nil {
					return err
				}
			}
			n += len(ups)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("store: reseal: %w", err)
	}
	return n, nil
}

// RotateKey gives a data directory a new secrets key: the new key is
// written first (secrets.key.new), every value is resealed with it in one
// transaction, then it replaces secrets.key. Interrupted at any point, the
// next LoadKeyring opens every value (both keys are loaded) and running
// RotateKey again finishes. The server must not be running.
func RotateKey(ctx context.Context, dataDir, dbPath string) (resealed int, err error) {
	oldKey, err := readOrCreateKey(filepath.Join(dataDir, KeyFile))
	if err != nil {
		return 0, err
	}
	next, err := os.ReadFile(filepath.Join(dataDir, newKeyFile))
	if err != nil || len(next) != 32 {
		next = make([]byte, 32)
		rand.Read(next)
		if err := writeKey(filepath.Join(dataDir, newKeyFile), next); err != nil {
			return 0, err
		}
	}
	k, err := NewKeyring(next, oldKey)
	if err != nil {
		return 0, err
	}
	db, err := Open(dbPath)
	if err != nil {
		return 0, err
	}
	db.SetKeyring(k)
	n, err := db.Reseal(ctx)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	if err := os.Rename(filepath.Join(dataDir, newKeyFile), filepath.Join(dataDir, KeyFile)); err != nil {
		return 0, fmt.Errorf("store: install the new key: %w", err)
	}
	return n, nil
}
