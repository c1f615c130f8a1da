package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openChain opens (O_PATH) a relative name longer than PATH_MAX below dir,
// one component at a time.
func openChain(t *testing.T, dir, rel string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	must(t, err)
	for _, seg := range strings.Split(rel, "/") {
		next, err := unix.Openat(fd, seg, unix.O_PATH|unix.O_NOFOLLOW, 0)
		unix.Close(fd)
		must(t, err)
		fd = next
	}
	return fd
}

func readAt(t *testing.T, dfd int, name string) string {
	t.Helper()
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	must(t, err)
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	b, err := io.ReadAll(f)
	must(t, err)
	return string(b)
}

// A deep tree keeps every kind of entry at its bottom: small and large
// files, a hard link, a symlink, a directory's mode.
func TestDeepTreeKeepsEverything(t *testing.T) {
	needRoot(t)
	src, dst := t.TempDir(), t.TempDir()
	mkDeep(t, src)
	rel := "deep" + strings.Repeat("/"+strings.Repeat("d", 200), 21)
	fd := openChain(t, src, rel)
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	unix.Close(fd)
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: not a writer's job
	f, err := unix.Openat(dfd, "big", unix.O_CREAT|unix.O_WRONLY, 0o600)
	must(t, err)
	must(t, pwriteFull(f, big, 0))
	unix.Close(f)
	must(t, unix.Linkat(dfd, "leaf", dfd, "hard", 0))
	must(t, unix.Symlinkat("leaf", dfd, "sym"))
	must(t, unix.Mkdirat(dfd, "sub", 0o751))
	unix.Close(dfd)

	var buf bytes.Buffer
	st, err := Pack(context.Background(), src, nil, &buf)
	must(t, err)
	ust, err := Unpack(context.Background(), &buf, dst, Options{})
	must(t, err)
	if st.Files != ust.Files || st.Dirs != ust.Dirs || ust.HardLinks != 1 || ust.Symlinks != 1 {
		t.Fatalf("packed %+v, unpacked %+v", st, ust)
	}
	fd = openChain(t, dst, rel)
	defer unix.Close(fd)
	if got := readAt(t, fd, "leaf"); got != "leaf\n" {
		t.Fatalf("leaf: %q", got)
	}
	if got := readAt(t, fd, "big"); got != string(big) {
		t.Fatalf("big differs")
	}
	var s1, s2 unix.Stat_t
	must(t, unix.Fstatat(fd, "leaf", &s1, unix.AT_SYMLINK_NOFOLLOW))
	must(t, unix.Fstatat(fd, "hard", &s2, unix.AT_SYMLINK_NOFOLLOW))
	if s1.Ino != s2.Ino {
		t.Fatal("hard link lost")
	}
	b := make([]byte, 64)
	n, err := unix.Readlinkat(fd, "sym", b)
	if err != nil || string(b[:n]) != "leaf" {
		t.Fatalf("symlink: %q %v", b[:n], err)
	}
	must(t, unix.Fstatat(fd, "sub", &s1, unix.AT_SYMLINK_NOFOLLOW))
	if s1.Mode&0o7777 != 0o751 {
		t.Fatalf("sub mode %o", s1.Mode&0o7777)
	}
}

// Past PATH_MAX every escape check still holds: a symlink deep in a long
// name is not followed.
func TestDeepTreeRejectsEscapes(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	dst := filepath.Join(base, "dst")
	must(t, os.Mkdir(dst, 0o755))
	var hdrs []*tar.Header
	name := "a"
	hdrs = append(hdrs, dirH(name))
	for range 25 {
		name += "/" + strings.Repeat("d", 200)
		hdrs = append(hdrs, dirH(name))
	}
	for _, tc := range []struct{ name, target string }{{"up", ".."}, {"abs", "/"}, {"out", "../../" + strings.Repeat("../", 30) + "victim"}} {
		t.Run(tc.name, func(t *testing.T) {
			d := filepath.Join(base, "dst", tc.name)
			must(t, os.Mkdir(d, 0o755))
			h := append(append([]*tar.Header{}, hdrs...), &tar.Header{Name: name + "/l", Typeflag: tar.TypeSymlink, Linkname: tc.target},
				fileH(name+"/l/x"), &tar.Header{Name: name + "/l/y", Typeflag: tar.TypeLink, Linkname: "a/x"})
			for _, hh := range h {
				hh.Size = 0
			}
			_, err := UnpackTar(context.Background(), bytes.NewReader(hostile(h...)), d, Options{})
			if !errors.Is(err, ErrUnsafe) {
				t.Fatalf("want ErrUnsafe, got %v", err)
			}
		})
	}
	if top, _ := os.ReadDir(base); len(top) != 1 {
		t.Fatalf("written next to the destination: %v", top)
	}
}

// A name longer than Unpack accepts fails Pack, with the reason.
func TestPackRefusesNameRestoreWouldRefuse(t *testing.T) {
	src := t.TempDir()
	fd, err := unix.Open(src, unix.O_PATH|unix.O_DIRECTORY, 0)
	must(t, err)
	seg := strings.Repeat("e", 250)
	for n := 0; n <= MaxName; n += len(seg) + 1 {
		must(t, unix.Mkdirat(fd, seg, 0o755))
		next, err := unix.Openat(fd, seg, unix.O_PATH|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(fd)
		fd = next
	}
	unix.Close(fd)
	_, err = Pack(context.Background(), src, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "restore accepts") {
		t.Fatalf("Pack: %v", err)
	}
}

func TestSparseRoundTrip(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	p := filepath.Join(src, "s")
	f, err := os.Create(p)
	must(t, err)
	const size = 1 << 30
	writes := map[int64][]byte{0: []byte("head"), 10 << 20: bytes.Repeat([]byte{7}, 300<<10), 700<<20 + 5: []byte("mid"), size - 1: {9}}
	for off, b := range writes {
		_, err := f.WriteAt(b, off)
		must(t, err)
	}
	f.Close()
	must(t, os.WriteFile(filepath.Join(src, "tailhole"), []byte("x"), 0o644))
	must(t, os.Truncate(filepath.Join(src, "tailhole"), 64<<20))
	must(t, os.WriteFile(filepath.Join(src, "empty-sparse"), nil, 0o644))
	must(t, os.Truncate(filepath.Join(src, "empty-sparse"), 1<<40))
	var buf bytes.Buffer
	pst, err := Pack(context.Background(), src, nil, &buf)
	must(t, err)
	if buf.Len() > 1<<20 {
		t.Fatalf("archive of %d bytes for a few KiB of data", buf.Len())
	}
	ust, err := Unpack(context.Background(), &buf, dst, Options{})
	must(t, err)
	if pst.Bytes != ust.Bytes || pst.Files != 3 || ust.Files != 3 {
		t.Fatalf("packed %+v unpacked %+v", pst, ust)
	}
	g, err := os.Open(filepath.Join(dst, "s"))
	must(t, err)
	defer g.Close()
	fi, _ := g.Stat()
	if fi.Size() != size {
		t.Fatalf("size %d", fi.Size())
	}
	for off, b := range writes {
		got := make([]byte, len(b)+2)
		n, _ := g.ReadAt(got, off-1)
		want := append(append([]byte{0}, b...), 0)
		if off == 0 {
			n, _ = g.ReadAt(got, 0)
			want = want[1:]
		}
		if off+int64(len(b)) == size {
			want = want[:len(want)-1]
		}
		if n < len(want) || !bytes.Equal(got[:len(want)], want) {
			t.Fatalf("at %d: %q", off, got[:n])
		}
	}
	// Which files were sparse entries: the small hole is packed as zeros.
	var raw bytes.Buffer
	_, err = PackTar(context.Background(), src, nil, &raw)
	must(t, err)
	tr := newTarReader(&raw)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		_, sparse := h.PAXRecords[sparseKey]
		if sparse != (h.Name != "tailhole") {
			t.Errorf("%s: sparse entry %v", h.Name, sparse)
		}
	}
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(dst, "s"), &st))
	if st.Blocks*512 > 2<<20 {
		t.Fatalf("restored sparse file takes %d KiB", st.Blocks/2)
	}
	for name, want := range map[string]int64{"tailhole": 64 << 20, "empty-sparse": 1 << 40} {
		fi, err := os.Stat(filepath.Join(dst, name))
		if err != nil || fi.Size() != want {
			t.Fatalf("%s: %v %v", name, fi, err)
		}
	}
}

// sparseEntry is a tar with one sparse file of the given real size and
// raw data.
func sparseEntry(size string, data []byte, typ byte) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	h := &tar.Header{Name: "f", Typeflag: typ, Mode: 0o644, PAXRecords: map[string]string{sparseKey: size}}
	if typ == tar.TypeReg {
		h.Size = int64(len(data))
	}
	tw.WriteHeader(h)
	if typ == tar.TypeReg {
		tw.Write(data)
	}
	tw.Close()
	return b.Bytes()
}

func segs(s ...any) []byte {
	var b []byte
	for i := 0; i < len(s); i += 3 {
		b = binary.BigEndian.AppendUint64(b, uint64(s[i].(int)))
		b = binary.BigEndian.AppendUint64(b, uint64(s[i+1].(int)))
		b = append(b, s[i+2].(string)...)
	}
	return b
}

func TestSparseRejectsBadMaps(t *testing.T) {
	cases := map[string][]byte{
		"out of order":      sparseEntry("100", segs(50, 2, "ab", 10, 2, "cd"), tar.TypeReg),
		"overlapping":       sparseEntry("100", segs(10, 5, "abcde", 12, 2, "cd"), tar.TypeReg),
		"past size":         sparseEntry("100", segs(99, 2, "ab"), tar.TypeReg),
		"offset past size":  sparseEntry("100", segs(1<<62, 2, "ab"), tar.TypeReg),
		"huge length":       sparseEntry("100", segs(0, -1, "ab"), tar.TypeReg),
		"empty segment":     sparseEntry("100", segs(0, 0, ""), tar.TypeReg),
		"longer than data":  sparseEntry("100", segs(0, 5, "ab"), tar.TypeReg),
		"truncated header":  sparseEntry("100", segs(0, 2, "ab")[:20], tar.TypeReg),
		"negative size":     sparseEntry("-1", nil, tar.TypeReg),
		"signed size":       sparseEntry("+5", nil, tar.TypeReg),
		"size not a number": sparseEntry("5k", nil, tar.TypeReg),
		"on a directory":    sparseEntry("5", nil, tar.TypeDir),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := UnpackTar(context.Background(), bytes.NewReader(data), t.TempDir(), Options{})
			if err == nil {
				t.Fatal("accepted")
			}
		})
	}
	// A well-formed one is accepted.
	dst := t.TempDir()
	_, err := UnpackTar(context.Background(), bytes.NewReader(sparseEntry("100", segs(10, 2, "ab", 98, 2, "cd"), tar.TypeReg)), dst, Options{})
	must(t, err)
	b, err := os.ReadFile(filepath.Join(dst, "f"))
	must(t, err)
	want := make([]byte, 100)
	copy(want[10:], "ab")
	copy(want[98:], "cd")
	if !bytes.Equal(b, want) {
		t.Fatalf("got %q", b)
	}
}

// Pack stops inside one file's copy when ctx ends.
func TestPackCancelsInsideFile(t *testing.T) {
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte{1}, 64<<20), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &cancelWriter{cancel: cancel}
	_, err := PackTar(ctx, src, nil, w)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Pack: %v", err)
	}
	if w.n > 8<<20 {
		t.Fatalf("went on for %d bytes after the cancel", w.n)
	}
}

type cancelWriter struct {
	cancel func()
	n      int
}

func (w *cancelWriter) Write(p []byte) (int, error) {
	w.cancel()
	w.n += len(p)
	return len(p), nil
}

// An attribute the format cannot carry is left out and counted; the save
// restores with the rest.
func TestPackSkipsUnencodableXattr(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	p := filepath.Join(src, "x")
	must(t, os.WriteFile(p, []byte("x"), 0o644))
	if err := unix.Setxattr(p, "user.a=b", []byte("v"), 0); err != nil {
		t.Skipf("no user attributes here: %v", err)
	}
	must(t, unix.Setxattr(p, "user.ok", []byte("kept"), 0))
	var buf bytes.Buffer
	st, err := Pack(context.Background(), src, nil, &buf)
	must(t, err)
	if st.XattrsSkipped != 1 {
		t.Fatalf("XattrsSkipped %d", st.XattrsSkipped)
	}
	_, err = Unpack(context.Background(), &buf, dst, Options{})
	must(t, err)
	v := make([]byte, 16)
	n, err := unix.Getxattr(filepath.Join(dst, "x"), "user.ok", v)
	if err != nil || string(v[:n]) != "kept" {
		t.Fatalf("user.ok: %q %v", v[:max(n, 0)], err)
	}
}
