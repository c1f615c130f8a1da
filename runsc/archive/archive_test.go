package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func needRoot(t testing.TB) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (owners, device nodes, trusted.* attributes)")
	}
}

// describe lists every entry below dir with everything Pack promises to
// keep, hard links grouped by inode.
func describe(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	inodes := map[uint64]string{}
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." || rel == "lost+found" || strings.HasPrefix(rel, "lost+found/") {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		d := fmt.Sprintf("type=%o mode=%o uid=%d gid=%d rdev=%d", st.Mode&unix.S_IFMT, st.Mode&0o7777, st.Uid, st.Gid, st.Rdev)
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			d += fmt.Sprintf(" mtime=%d.%09d", st.Mtim.Sec, st.Mtim.Nsec)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s := sha256.Sum256(b)
			d += " size=" + fmt.Sprint(len(b)) + " sha=" + hex.EncodeToString(s[:8])
			if st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					d += " link=" + first
				} else {
					inodes[st.Ino] = rel
				}
			}
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			d += " target=" + l
		}
		sz, _ := unix.Llistxattr(p, nil)
		if sz > 0 {
			b := make([]byte, sz)
			sz, _ = unix.Llistxattr(p, b)
			keys := strings.Split(strings.TrimRight(string(b[:sz]), "\x00"), "\x00")
			sort.Strings(keys)
			for _, k := range keys {
				v := make([]byte, 1024)
				n, _ := unix.Lgetxattr(p, k, v)
				d += fmt.Sprintf(" %s=%q", k, v[:max(n, 0)])
			}
		}
		out[rel] = d
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// oddTree makes a tree with every kind of entry Pack keeps.
func oddTree(t testing.TB, dir string) {
	w := func(p string, data []byte, mode os.FileMode) {
		must(t, os.WriteFile(filepath.Join(dir, p), data, mode))
		must(t, os.Chmod(filepath.Join(dir, p), mode))
	}
	for _, d := range []string{"upper", "upper/etc", "upper/opaque", "workspace", "workspace/deep/a/b/c", "tmp", "workspace/ro"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	must(t, os.Chown(filepath.Join(dir, "workspace"), 1000, 1000))
	w("workspace/plain.txt", []byte("hello\n"), 0o644)
	w("workspace/empty", nil, 0o600)
	w("workspace/new\nline", []byte("nl"), 0o644)
	w("workspace/bad\xff\xfeutf8", []byte("bytes"), 0o644)
	w("workspace/ spaces and 'quotes' \"", []byte("q"), 0o644)
	w("workspace/deep/a/b/c/"+strings.Repeat("n", 200), []byte("long"), 0o644)
	w("workspace/setuid", []byte("#!/bin/sh\n"), 0o4755|os.ModeSetuid)
	must(t, os.Chmod(filepath.Join(dir, "workspace/setuid"), 0o755|os.ModeSetuid|os.ModeSetgid))
	must(t, os.Chmod(filepath.Join(dir, "tmp"), 0o777|os.ModeSticky))
	w("workspace/exec", []byte("x"), 0o751)
	big := make([]byte, 3<<20)
	for i := range big {
		big[i] = byte(i * 7 % 251)
	}
	copy(big[1<<20:], make([]byte, 1<<20)) // a run of zeros in the middle
	w("workspace/big.bin", big, 0o644)
	// A sparse file.
	f, err := os.Create(filepath.Join(dir, "workspace/sparse"))
	must(t, err)
	f.WriteAt([]byte("end"), 50<<20)
	f.Close()
	must(t, os.Link(filepath.Join(dir, "workspace/plain.txt"), filepath.Join(dir, "workspace/deep/hardlink")))
	must(t, os.Symlink("../plain.txt", filepath.Join(dir, "workspace/deep/rel-link")))
	must(t, os.Symlink("/etc/shadow", filepath.Join(dir, "workspace/abs-link")))
	must(t, os.Symlink("dangling/nowhere", filepath.Join(dir, "workspace/dangling")))
	must(t, unix.Mknod(filepath.Join(dir, "upper/etc/removed"), unix.S_IFCHR|0o000, 0))
	must(t, unix.Mkfifo(filepath.Join(dir, "workspace/fifo"), 0o640))
	must(t, unix.Setxattr(filepath.Join(dir, "upper/opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, unix.Setxattr(filepath.Join(dir, "workspace/plain.txt"), "user.note", []byte("v\x00\xff"), 0))
	must(t, unix.Lchown(filepath.Join(dir, "workspace/deep/rel-link"), 1000, 1001))
	for _, p := range []string{"workspace/plain.txt", "workspace/exec", "workspace/deep"} {
		must(t, os.Lchown(filepath.Join(dir, p), 1000, 1000))
	}
	mt := time.Date(2020, 1, 2, 3, 4, 5, 123456789, time.UTC)
	must(t, os.Chtimes(filepath.Join(dir, "workspace/exec"), mt, mt))
	must(t, os.Chmod(filepath.Join(dir, "workspace/ro"), 0o555))
}

var overlay = Options{Overlay: func(n string) bool { return n == "upper" || strings.HasPrefix(n, "upper/") }, Fifos: true}

func TestRoundTrip(t *testing.T) {
	needRoot(t)
	src, dst := t.TempDir(), t.TempDir()
	oddTree(t, src)
	must(t, os.WriteFile(filepath.Join(src, "excluded"), []byte("x"), 0o644))
	var buf bytes.Buffer
	ctx := context.Background()
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	must(t, os.Chtimes(filepath.Join(src, "workspace/plain.txt"), old, time.Time{}))
	pst, err := Pack(ctx, src, []string{"upper", "workspace", "tmp"}, &buf)
	must(t, err)
	var ast unix.Stat_t
	must(t, unix.Stat(filepath.Join(src, "workspace/plain.txt"), &ast))
	if ast.Atim.Sec != old.Unix() {
		t.Errorf("Pack changed an atime: %v", time.Unix(ast.Atim.Sec, 0))
	}
	ust, err := Unpack(ctx, &buf, dst, overlay)
	must(t, err)
	if pst.Files != ust.Files || pst.HardLinks != 1 || ust.Whiteouts != 1 || pst.Symlinks != 3 || pst.Fifos != 1 {
		t.Fatalf("stats: pack %+v unpack %+v", pst, ust)
	}
	for _, top := range []string{"upper", "workspace", "tmp"} {
		var du int64
		filepath.Walk(filepath.Join(src, top), func(p string, _ os.FileInfo, err error) error {
			var st unix.Stat_t
			if err == nil && unix.Lstat(p, &st) == nil {
				du += st.Blocks * 512
			}
			return err
		})
		if pst.Usage[top] != du || du == 0 {
			t.Errorf("usage of %s: %d, a walk says %d", top, pst.Usage[top], du)
		}
	}
	want, got := describe(t, src), describe(t, dst)
	delete(want, "excluded")
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q:\n want %s\n got  %s", k, v, got[k])
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("extra %q", k)
		}
	}
	// Holes stay holes.
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(dst, "workspace/sparse"), &st))
	if st.Blocks*512 > 1<<20 {
		t.Errorf("sparse file takes %d bytes", st.Blocks*512)
	}
}

// hostile builds an uncompressed tar from headers (bodies are the
// Linkname of regular files, for brevity).
func hostile(hdrs ...*tar.Header) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		body := ""
		if h.Typeflag == tar.TypeReg {
			body, h.Linkname = h.Linkname, ""
			h.Size = int64(len(body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			panic(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	return b.Bytes()
}

func dirH(n string) *tar.Header { return &tar.Header{Name: n, Typeflag: tar.TypeDir, Mode: 0o755} }
func fileH(n string) *tar.Header {
	return &tar.Header{Name: n, Typeflag: tar.TypeReg, Linkname: "pwned"}
}

// Each class of escape is refused and nothing lands outside the
// destination (a sibling directory stands for the rest of the host).
func TestUnpackRejectsEscapes(t *testing.T) {
	needRoot(t)
	cases := map[string][]*tar.Header{
		"dotdot":          {fileH("../victim/x")},
		"dotdot inside":   {dirH("a"), fileH("a/../../victim/x")},
		"absolute":        {fileH("/tmp/victim-abs")},
		"symlink parent":  {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../victim"}, fileH("l/x")},
		"symlink abs dir": {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}, dirH("l/tmp")},
		"symlink overwrite": {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../victim/x"},
			fileH("l")},
		"duplicate dir to link": {dirH("d"), {Name: "d", Typeflag: tar.TypeSymlink, Linkname: "../victim"}, fileH("d/x")},
		"hardlink out":          {{Name: "h", Typeflag: tar.TypeLink, Linkname: "../victim/target"}},
		"hardlink abs":          {{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}},
		"hardlink not yet":      {{Name: "h", Typeflag: tar.TypeLink, Linkname: "later"}, fileH("later")},
		"hardlink via symlink": {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../victim"},
			{Name: "h", Typeflag: tar.TypeLink, Linkname: "l/target"}},
		"hardlink to dir":   {dirH("d"), {Name: "h", Typeflag: tar.TypeLink, Linkname: "d"}},
		"block device":      {{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8}},
		"char device":       {{Name: "upper/mem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 1}},
		"whiteout outside":  {{Name: "workspace-wh", Typeflag: tar.TypeChar}},
		"trusted xattr":     {{Name: "f", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.redirect": "/x"}}},
		"unknown xattr":     {{Name: "f", Typeflag: tar.TypeReg, PAXRecords: map[string]string{"SCHILY.xattr.system.foo": "x"}}},
		"empty segment":     {fileH("a//b")},
		"dot segment":       {dirH("a"), fileH("a/./b")},
		"missing parent":    {fileH("nodir/x")},
		"duplicate file":    {fileH("f"), fileH("f")},
		"fifo not allowed":  {{Name: "p", Typeflag: tar.TypeFifo}},
		"huge owner":        {{Name: "f", Typeflag: tar.TypeReg, Uid: 1 << 40}},
		"existing file":     {fileH("pre")},
		"existing symlink":  {dirH("presym/x")},
		"symlink then file": {{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}, fileH("s")},
	}
	for name, hdrs := range cases {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			dst, victim := filepath.Join(base, "dst"), filepath.Join(base, "victim")
			must(t, os.Mkdir(dst, 0o755))
			must(t, os.Mkdir(victim, 0o755))
			must(t, os.WriteFile(filepath.Join(victim, "target"), []byte("keep"), 0o644))
			must(t, os.WriteFile(filepath.Join(dst, "pre"), []byte("pre"), 0o644))
			must(t, os.Symlink("../victim", filepath.Join(dst, "presym")))
			o := Options{Overlay: func(n string) bool { return strings.HasPrefix(n, "upper/") }}
			_, err := UnpackTar(context.Background(), bytes.NewReader(hostile(hdrs...)), dst, o)
			if !errors.Is(err, ErrUnsafe) {
				t.Fatalf("want ErrUnsafe, got %v", err)
			}
			ents, _ := os.ReadDir(victim)
			if len(ents) != 1 {
				t.Fatalf("victim dir changed: %v", ents)
			}
			if b, _ := os.ReadFile(filepath.Join(victim, "target")); string(b) != "keep" {
				t.Fatal("victim file changed")
			}
			top, _ := os.ReadDir(base)
			if len(top) != 2 {
				t.Fatalf("written next to the destination: %v", top)
			}
			if _, err := os.Stat("/tmp/victim-abs"); err == nil {
				t.Fatal("absolute path written")
			}
		})
	}
}

// A damaged stream fails the Unpack (the zstd frame's checksum, or the
// source's error at EOF).
func TestUnpackSourceError(t *testing.T) {
	needRoot(t)
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "f"), bytes.Repeat([]byte("abc"), 1000), 0o644))
	var buf bytes.Buffer
	_, err := Pack(context.Background(), src, nil, &buf)
	must(t, err)
	bad := io.MultiReader(&buf, errReader{})
	if _, err := Unpack(context.Background(), bad, t.TempDir(), Options{}); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("source error not seen: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("checksum mismatch at EOF") }

// FuzzUnpack: tar bytes as they come (FuzzUnpackEntries builds entries
// that aim at escapes); unpackPlace.check's invariants hold whatever they
// are, and the disk space the files take grows at most linearly with the
// archive (every file costs a 512-byte header, every sparse segment 16
// bytes and one of data; each takes at most two blocks more than its
// data).
func FuzzUnpack(f *testing.F) {
	needRoot(f)
	f.Add(hostile(dirH("a"), fileH("a/b"), &tar.Header{Name: "a/l", Typeflag: tar.TypeSymlink, Linkname: ".."}))
	f.Add(hostile(fileH("x"), &tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "x"}))
	f.Add(hostile(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}, fileH("l/etc/x")))
	f.Add(hostile(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../victim"}, fileH("l/x")))
	f.Add(hostile(&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../victim/target"}))
	f.Add(hostile(dirH("upper"), &tar.Header{Name: "upper/w", Typeflag: tar.TypeChar}))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := newUnpackPlace(t)
		UnpackTar(context.Background(), bytes.NewReader(data), p.dst, overlay)
		if u := p.check(t, overlay); u.alloc > 8192/16*int64(len(data))+8192 {
			t.Fatalf("%d bytes allocated to files from an archive of %d bytes", u.alloc, len(data))
		}
	})
}
