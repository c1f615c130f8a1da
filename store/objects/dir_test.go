package objects

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestDirPutGetListDelete(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	d, err := NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("sandboxd "), 300000)
	sum := sha256.Sum256(data)
	in, err := d.Put(ctx, "org_1", "sessions/ses_a/disk-1.tar.zst", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if in.Size != int64(len(data)) || in.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("info %+v", in)
	}
	rc, gin, err := d.Get(ctx, "org_1", "sessions/ses_a/disk-1.tar.zst")
	if err != nil || gin.SHA256 != in.SHA256 {
		t.Fatal(err, gin)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get: %v, %d bytes", err, len(got))
	}
	if _, err := d.Put(ctx, "org_1", "other", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Put(ctx, "org_2", "other", strings.NewReader("yy")); err != nil {
		t.Fatal(err)
	}
	list, err := d.List(ctx, "org_1", "sessions/")
	if err != nil || len(list) != 1 || list[0].Name != "sessions/ses_a/disk-1.tar.zst" {
		t.Fatalf("list %+v %v", list, err)
	}
	if n, err := Used(ctx, d, "org_1"); err != nil || n != int64(len(data))+1 {
		t.Fatalf("used %d %v", n, err)
	}
	if l, _ := d.List(ctx, "org_none", ""); len(l) != 0 {
		t.Fatal(l)
	}
	if err := d.Delete(ctx, "org_1", "sessions/ses_a/disk-1.tar.zst"); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "org_1", "sessions/ses_a/disk-1.tar.zst"); err != nil {
		t.Fatal("second delete:", err)
	}
	if _, err := d.Stat(ctx, "org_1", "sessions/ses_a/disk-1.tar.zst"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "org_1", "sessions")); !os.IsNotExist(err) {
		t.Fatal("empty parents kept")
	}
}

func TestDirNames(t *testing.T) {
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []string{"", "/abs", "../x", "a/../../x", "a//b", "a/./b", ".tmp-x", "a/.tmp-y", "a\x00b", "a b", strings.Repeat("a", 600), "a/"} {
		if _, err := d.Put(ctx, "org", n, strings.NewReader("x")); !errors.Is(err, ErrInvalidName) {
			t.Errorf("name %q: %v", n, err)
		}
	}
	for _, o := range []string{"", "..", ".", "a/b", ".hidden"} {
		if _, err := d.Put(ctx, o, "x", strings.NewReader("x")); !errors.Is(err, ErrInvalidName) {
			t.Errorf("org %q: %v", o, err)
		}
	}
}

type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("boom")
	}
	f.n--
	return copy(p, "some bytes"), nil
}

// A failed Put leaves the previous object and no temporary file; a
// temporary file left by a crash is removed at open.
func TestDirAtomic(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	d, _ := NewDir(root)
	if _, err := d.Put(ctx, "o", "n", strings.NewReader("old")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Put(ctx, "o", "n", &failingReader{n: 100}); err == nil {
		t.Fatal("put of a failing reader succeeded")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := d.Put(cctx, "o", "n", strings.NewReader("new")); err == nil {
		t.Fatal("put with a cancelled context succeeded")
	}
	rc, _, err := d.Get(ctx, "o", "n")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "old" || len(d.Leftovers()) != 0 {
		t.Fatalf("%q %v", b, d.Leftovers())
	}
	os.WriteFile(filepath.Join(root, "o", ".tmp-crash"), []byte("half"), 0o600)
	d, err = NewDir(root)
	if err != nil || len(d.Leftovers()) != 0 {
		t.Fatal(err, d.Leftovers())
	}
	if l, _ := d.List(ctx, "o", ""); len(l) != 1 {
		t.Fatal(l)
	}
	// Concurrent Puts of one name: each atomic, one wins.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.Put(ctx, "o", "n", bytes.NewReader(bytes.Repeat([]byte{byte('a' + i)}, 100000)))
		}()
	}
	wg.Wait()
	rc, _, _ = d.Get(ctx, "o", "n")
	b, err = io.ReadAll(rc)
	rc.Close()
	if err != nil || len(b) != 100000 || strings.Trim(string(b), string(b[:1])) != "" {
		t.Fatalf("after concurrent puts: %v %d", err, len(b))
	}
}

// A damaged object is never read as good: Get fails at EOF, Stat on a
// truncated one.
func TestDirCorrupt(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	d, _ := NewDir(root)
	if _, err := d.Put(ctx, "o", "n", strings.NewReader("hello world")); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, "o", "n")
	f, _ := os.OpenFile(p, os.O_RDWR, 0)
	f.WriteAt([]byte("J"), headerSize)
	f.Close()
	rc, _, err := d.Get(ctx, "o", "n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(rc); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a flipped byte: %v", err)
	}
	rc.Close()
	os.Truncate(p, headerSize+3)
	if _, err := d.Stat(ctx, "o", "n"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("stat of a truncated object: %v", err)
	}
	// Listed as damaged, beside the others, and deletable.
	if _, err := d.Put(ctx, "o", "m", strings.NewReader("fine")); err != nil {
		t.Fatal(err)
	}
	list, err := d.List(ctx, "o", "")
	if err != nil || len(list) != 2 || list[0].Name != "m" || list[0].Damaged || list[1].Name != "n" || !list[1].Damaged || list[1].Size != 3 {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := d.Delete(ctx, "o", "n"); err != nil {
		t.Fatal(err)
	}
	if list, err := d.List(ctx, "o", ""); err != nil || len(list) != 1 {
		t.Fatalf("after delete: %+v %v", list, err)
	}
}
