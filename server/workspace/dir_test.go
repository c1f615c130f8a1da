package workspace

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandboxd/server/errdefs"
	"sandboxd/streams/scrub"
)

// Rootless tests of the workspace logic on a temporary directory: the
// same descriptor rules run here as on a sandbox's mounted disk (the real
// ones, with a sandbox changing entries underneath, are in server's
// files_e2e_test.go).

const secret = "sk-test-0123456789abcdef"

type env struct {
	t    *testing.T
	root string // the host side of /workspace
	dir  *Dir
	fs   *Files
}

func newEnv(t *testing.T) *env {
	t.Helper()
	root := t.TempDir()
	f, err := os.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	set, err := scrub.NewSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	if set, err = set.WithValues(map[string]string{"KEY": secret}); err != nil {
		t.Fatal(err)
	}
	fs := New(os.Getuid(), os.Getgid())
	return &env{t: t, root: root, dir: fs.Dir(f, "pk1", set), fs: fs}
}

func (e *env) write(rel, content string) {
	e.t.Helper()
	p := filepath.Join(e.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// code is the contract code of a public error ("" for none).
func code(err error) string {
	pe, ok := errdefs.Public(err)
	if !ok {
		return ""
	}
	if pe.Code() != "" {
		return pe.Code()
	}
	for c, name := range map[error]string{errdefs.ErrNotFound: "not_found", errdefs.ErrConflict: "conflict", errdefs.ErrInvalid: "invalid"} {
		if errors.Is(err, c) {
			return name
		}
	}
	return "other"
}

func TestOpenListAndRead(t *testing.T) {
	e := newEnv(t)
	e.write("out/report.txt", "token "+secret+"\n")
	e.write("out/b.txt", "b")
	os.Mkdir(filepath.Join(e.root, "out", "sub"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(e.root, "out", "link"))
	syscall.Mkfifo(filepath.Join(e.root, "out", "fifo"), 0o644)
	os.Symlink("/etc", filepath.Join(e.root, "etc"))

	f, kind, err := e.dir.Open("out")
	if err != nil || kind != KindDir {
		t.Fatalf("Open(out) = %v, %v", kind, err)
	}
	list, truncated, err := e.dir.List(f, "out")
	f.Close()
	if err != nil || truncated != "" {
		t.Fatal(err, truncated)
	}
	var got []string
	for _, en := range list {
		got = append(got, en.Name+":"+en.Type+":"+en.Path)
	}
	want := "b.txt:file:/workspace/out/b.txt link:symlink:/workspace/out/link report.txt:file:/workspace/out/report.txt sub:dir:/workspace/out/sub"
	if strings.Join(got, " ") != want { // the FIFO is neither listed nor served
		t.Fatalf("list = %q", got)
	}

	// The file's bytes pass the scrubber at the edge; here they are raw.
	f, kind, err = e.dir.Open("out/report.txt")
	if err != nil || kind != KindFile || f.Name() != "report.txt" {
		t.Fatalf("Open(file) = %v %v", kind, err)
	}
	f.Close()
	// A FIFO opens without blocking and is not a file.
	done := make(chan struct{})
	go func() {
		defer close(done)
		if f, kind, err := e.dir.Open("out/fifo"); err == nil {
			f.Close()
			if kind != KindOther {
				t.Errorf("fifo kind %v", kind)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("opening a FIFO blocked")
	}
	// Symlinks are never followed: as the last component or in the middle.
	for _, rel := range []string{"out/link", "etc/passwd", "etc"} {
		if f, _, err := e.dir.Open(rel); err == nil || code(err) != "invalid_path" {
			if f != nil {
				f.Close()
			}
			t.Errorf("Open(%s) = %v, want invalid_path", rel, err)
		}
	}
	if _, _, err := e.dir.Open("missing"); code(err) != "not_found" {
		t.Errorf("Open(missing) = %v", err)
	}
}

func TestPut(t *testing.T) {
	e := newEnv(t)
	en, created, n, err := e.dir.Put("new/dir/a.txt", strings.NewReader("hello"))
	if err != nil || !created || n != 5 || en.Size != 5 || en.Path != "/workspace/new/dir/a.txt" {
		t.Fatalf("Put = %+v %v %d %v", en, created, n, err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.root, "new/dir/a.txt")); string(b) != "hello" {
		t.Fatalf("content %q", b)
	}
	st, _ := os.Stat(filepath.Join(e.root, "new/dir/a.txt"))
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v", st.Mode())
	}
	if _, created, _, err = e.dir.Put("new/dir/a.txt", strings.NewReader("again")); err != nil || created {
		t.Fatalf("overwrite: %v %v", created, err)
	}
	// A name holding a secret comes back redacted.
	if en, _, _, err := e.dir.Put("k-"+secret, strings.NewReader("x")); err != nil || strings.Contains(en.Name+en.Path, secret) {
		t.Errorf("Put(secret name) = %+v %v", en, err)
	}

	os.Symlink("/tmp", filepath.Join(e.root, "ln"))
	os.Symlink(filepath.Join(t.TempDir(), "target"), filepath.Join(e.root, "dangling"))
	os.Mkdir(filepath.Join(e.root, "adir"), 0o755)
	for rel, want := range map[string]string{
		"ln/x":                 "invalid_path", // through a symlinked directory
		"dangling":             "invalid_path", // a symlink is never written through
		"adir":                 "conflict",     // a directory
		uploadPrefix + "x":     "invalid_path", // reserved names
		"new/dir/a.txt/deeper": "conflict",     // a parent that is a file
	} {
		if _, _, _, err := e.dir.Put(rel, strings.NewReader("x")); code(err) != want {
			t.Errorf("Put(%s) = %v, want %s", rel, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(t.TempDir(), "target")); err == nil {
		t.Error("Put wrote through a dangling symlink")
	}
	// A body that fails to read is the client's error, and no file appears.
	_, _, _, err = e.dir.Put("partial", io.MultiReader(strings.NewReader("abc"), errReader{}))
	if !errors.Is(err, ErrBodyRead) {
		t.Errorf("body error = %v", err)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "partial")); err == nil {
		t.Error("a failed upload left a file")
	}
	ents, _ := os.ReadDir(e.root)
	for _, en := range ents {
		if strings.HasPrefix(en.Name(), uploadPrefix) {
			t.Errorf("temporary upload left: %s", en.Name())
		}
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("client went away") }

func TestRemove(t *testing.T) {
	e := newEnv(t)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "keep"), []byte("host"), 0o644)
	e.write("tree/a/b/c.txt", "c")
	e.write("tree/d.txt", "d")
	os.Symlink(outside, filepath.Join(e.root, "tree", "a", "out"))
	os.Symlink(outside, filepath.Join(e.root, "hostlink"))

	if err := e.dir.Remove("tree", false, false, time.Now().Add(time.Minute)); code(err) != "conflict" {
		t.Errorf("non-recursive remove of a tree = %v", err)
	}
	if err := e.dir.Remove("hostlink", false, false, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := e.dir.Remove("tree", true, false, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatal("removing a tree followed a symlink out of the workspace")
	}
	if _, err := os.Lstat(filepath.Join(e.root, "tree")); err == nil {
		t.Fatal("tree still there")
	}
	if err := e.dir.Remove("", false, false, time.Now()); code(err) != "invalid_path" {
		t.Errorf("remove /workspace = %v", err)
	}
	if err := e.dir.Remove("nope", false, false, time.Now()); code(err) != "not_found" {
		t.Errorf("remove missing = %v", err)
	}
	// "f.txt/" names a directory, as for rmdir(2): the file stays.
	e.write("f.txt", "f")
	os.Mkdir(filepath.Join(e.root, "d"), 0o755)
	if err := e.dir.Remove("f.txt", false, true, time.Now()); code(err) != "invalid_path" {
		t.Errorf("remove f.txt/ = %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.root, "f.txt")); err != nil {
		t.Fatal("f.txt/ removed the file")
	}
	if err := e.dir.Remove("d", false, true, time.Now()); err != nil {
		t.Errorf("remove d/ = %v", err)
	}
}

func TestArtifactsDigestScrubbedBytesAndCache(t *testing.T) {
	e := newEnv(t)
	e.write("a.txt", "plain")
	e.write("d/s.txt", "key="+secret)
	os.Symlink("/etc/passwd", filepath.Join(e.root, "d", "passwd"))
	os.Symlink("/etc", filepath.Join(e.root, "etc"))
	past := time.Now().Add(-time.Hour)
	for _, p := range []string{"a.txt", "d/s.txt"} { // old enough to be cached
		os.Chtimes(filepath.Join(e.root, p), past, past)
	}
	e.fs.digests.now = func() time.Time { return time.Now().Add(time.Hour) }

	list, cut, err := e.dir.Artifacts()
	if err != nil || len(cut) != 0 {
		t.Fatal(err, cut)
	}
	if len(list) != 2 || list[0].Path != "a.txt" || list[1].Path != "d/s.txt" {
		t.Fatalf("artifacts = %+v", list)
	}
	scrubbed := e.dir.set.RedactString("key=" + secret)
	if strings.Contains(scrubbed, secret) {
		t.Fatal("the test's scrubber does not redact")
	}
	sum := sha256.Sum256([]byte(scrubbed))
	if list[1].SHA256 != hex.EncodeToString(sum[:]) || list[1].Size != int64(len(scrubbed)) {
		t.Errorf("digest of s.txt describes the raw bytes: %+v", list[1])
	}
	// Unchanged files come from the cache (a sentinel put there shows it).
	e.fs.digests.mu.Lock()
	if len(e.fs.digests.m) != 2 {
		t.Fatalf("%d digests cached, want 2", len(e.fs.digests.m))
	}
	for k, v := range e.fs.digests.m {
		v.sum = "cached"
		e.fs.digests.m[k] = v
	}
	e.fs.digests.mu.Unlock()
	again, _, _ := e.dir.Artifacts()
	if len(again) != 2 || again[0].SHA256 != "cached" || again[1].SHA256 != "cached" {
		t.Errorf("cached digests not used: %+v", again)
	}
	// A changed file (new size, mtime, ctime) is read again.
	e.write("a.txt", "changed")
	again, _, _ = e.dir.Artifacts()
	if again[0].SHA256 == "cached" || again[1].SHA256 != "cached" {
		t.Errorf("after a change: %+v", again)
	}
	e.fs.Forget("pk1")
	if n := len(e.fs.digests.m); n != 0 {
		t.Errorf("Forget left %d digests", n)
	}
}

func TestCopyFileSeparatesReadErrors(t *testing.T) {
	var buf bytes.Buffer
	n, rerr, werr := CopyFile(&buf, io.MultiReader(strings.NewReader("abc"), errReader{}))
	if n != 3 || rerr == nil || werr != nil || buf.String() != "abc" {
		t.Errorf("CopyFile = %d %v %v", n, rerr, werr)
	}
}
