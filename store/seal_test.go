package store

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testKeyring(t *testing.T) *Keyring {
	t.Helper()
	k, err := NewKeyring([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSealedAtRest(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sandboxd.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, _, _, err := db.Bootstrap(ctx, "org", "owner", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.SetSecrets(ctx, "x", map[string]string{"A": "plain-secret-value"}); err != ErrNoKeyring {
		t.Fatalf("without a key: %v", err)
	}
	k, err := LoadKeyring(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, KeyFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v", fi.Mode())
	}
	db.SetKeyring(k)
	ses := newTestSession(t, db, p)
	if err := db.SetSecrets(ctx, ses, map[string]string{"API_KEY": "sk-live-very-secret-123"}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.SetGitToken(ctx, p.User.ID, "ghp_secretgittoken000000"); err != nil {
		t.Fatal(err)
	}
	// A row written before secrets were sealed is migrated.
	if _, err := db.w.Exec(`INSERT INTO session_secrets(session_pk, name, value) VALUES (?, 'OLD', 'old-plaintext-value')`, ses); err != nil {
		t.Fatal(err)
	}
	if n, err := db.Reseal(ctx); err != nil || n != 1 {
		t.Fatalf("reseal: %d %v", n, err)
	}
	got, err := db.Secrets(ctx, ses)
	if err != nil || got["API_KEY"] != "sk-live-very-secret-123" || got["OLD"] != "old-plaintext-value" {
		t.Fatalf("secrets: %v %v", got, err)
	}
	if tok, err := db.GitToken(ctx, p.User.ID); err != nil || tok != "ghp_secretgittoken000000" {
		t.Fatalf("git token: %q %v", tok, err)
	}
	db.Close()
	// The database file alone reveals nothing.
	raw := readAllFiles(t, dir, "sandboxd.db")
	for _, s := range []string{"sk-live-very-secret-123", "old-plaintext-value", "ghp_secretgittoken000000"} {
		if strings.Contains(raw, s) {
			t.Errorf("%q is in the database files", s)
		}
	}
	// Swapping sealed values between rows does not open them.
	db2, _ := Open(path)
	db2.SetKeyring(k)
	defer db2.Close()
	db2.w.Exec(`UPDATE session_secrets SET value = (SELECT value FROM session_secrets WHERE name = 'OLD') WHERE name = 'API_KEY'`)
	if _, err := db2.Secrets(ctx, ses); err == nil {
		t.Error("a value moved to another row opened")
	}
	// The wrong key says so.
	other, _ := NewKeyring([]byte("another key, another key, 32 byt"))
	db2.SetKeyring(other)
	if _, err := db2.GitToken(ctx, p.User.ID); err == nil || !strings.Contains(err.Error(), "unknown key") {
		t.Errorf("wrong key: %v", err)
	}
}

func TestRotateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sandboxd.db")
	db, _ := Open(path)
	ctx := context.Background()
	p, _, _, _ := db.Bootstrap(ctx, "org", "owner", "")
	k, _ := LoadKeyring(dir, "")
	db.SetKeyring(k)
	ses := newTestSession(t, db, p)
	db.SetSecrets(ctx, ses, map[string]string{"A": "value-a"})
	db.SetGitToken(ctx, p.User.ID, "tok")
	db.Close()
	old, _ := os.ReadFile(filepath.Join(dir, KeyFile))
	// An interrupted rotation (the new key written, nothing resealed):
	// both keys load and every value opens; running it again finishes.
	writeKey(filepath.Join(dir, newKeyFile), []byte("interrupted-rotation-key-32bytes"))
	k2, err := LoadKeyring(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	db, _ = Open(path)
	db.SetKeyring(k2)
	if v, err := db.Secrets(ctx, ses); err != nil || v["A"] != "value-a" {
		t.Fatalf("mid-rotation: %v %v", v, err)
	}
	db.Close()
	n, err := RotateKey(ctx, dir, path)
	if err != nil || n != 2 {
		t.Fatalf("rotate: %d %v", n, err)
	}
	now, _ := os.ReadFile(filepath.Join(dir, KeyFile))
	if string(now) == string(old) || string(now) != "interrupted-rotation-key-32bytes" {
		t.Fatal("key not replaced by the rotation's")
	}
	if _, err := os.Stat(filepath.Join(dir, newKeyFile)); !os.IsNotExist(err) {
		t.Error("rotation key file left behind")
	}
	k3, _ := LoadKeyring(dir, "")
	db, _ = Open(path)
	defer db.Close()
	db.SetKeyring(k3)
	if v, err := db.Secrets(ctx, ses); err != nil || v["A"] != "value-a" {
		t.Fatalf("after rotation: %v %v", v, err)
	}
	oldOnly, _ := NewKeyring(old)
	db.SetKeyring(oldOnly)
	if _, err := db.GitToken(ctx, p.User.ID); err == nil {
		t.Error("the old key still opens values")
	}
}

func newTestSession(t *testing.T, db *DB, p Principal) string {
	t.Helper()
	s := newSession(p, "sealed")
	if err := db.InsertSession(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return s.ID
}

func readAllFiles(t *testing.T, dir, prefix string) string {
	t.Helper()
	var b strings.Builder
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			x, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			b.Write(x)
		}
	}
	return b.String()
}
