package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// unpackPlace is a destination for a fuzzed Unpack: base holds dst and a
// victim directory (the rest of the host) with one file, "target".
type unpackPlace struct{ base, dst, victim string }

func newUnpackPlace(t *testing.T) unpackPlace {
	base := t.TempDir()
	p := unpackPlace{base, filepath.Join(base, "dst"), filepath.Join(base, "victim")}
	must(t, os.Mkdir(p.dst, 0o755))
	must(t, os.Mkdir(p.victim, 0o755))
	must(t, os.WriteFile(filepath.Join(p.victim, "target"), []byte("keep"), 0o644))
	return p
}

// unpacked is what a walk of dst found, by name relative to it.
type unpacked struct {
	st    map[string]unix.Stat_t
	alloc int64 // bytes allocated to regular files
}

// check applies what holds whatever the archive was: nothing changed
// outside dst (the victim's one file keeps its content and its single
// link, nothing appears next to dst); every hard link of a file in dst is
// in dst; no device but a whiteout (0:0, character) in an overlay upper
// layer; no FIFO unless allowed. It returns dst's entries.
func (p unpackPlace) check(t *testing.T, o Options) unpacked {
	t.Helper()
	top, _ := os.ReadDir(p.base)
	if len(top) != 2 || top[0].Name() != "dst" || top[1].Name() != "victim" {
		t.Fatalf("written next to the destination: %v", top)
	}
	ents, _ := os.ReadDir(p.victim)
	var vst unix.Stat_t
	b, err := os.ReadFile(filepath.Join(p.victim, "target"))
	if len(ents) != 1 || err != nil || string(b) != "keep" || unix.Lstat(filepath.Join(p.victim, "target"), &vst) != nil ||
		vst.Nlink != 1 || vst.Mode&0o7777 != 0o644 {
		t.Fatalf("the victim changed: %v %q %v nlink %d mode %o", ents, b, err, vst.Nlink, vst.Mode&0o7777)
	}
	u := unpacked{st: map[string]unix.Stat_t{}}
	links := map[uint64]int{}
	filepath.Walk(p.dst, func(path string, _ os.FileInfo, err error) error {
		if err != nil || path == p.dst {
			return nil
		}
		rel, _ := filepath.Rel(p.dst, path)
		var st unix.Stat_t
		if unix.Lstat(path, &st) != nil {
			return nil
		}
		u.st[rel] = st
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			links[st.Ino]++
			u.alloc += st.Blocks * 512
		case unix.S_IFCHR:
			if st.Rdev != 0 || o.Overlay == nil || !o.Overlay(rel) {
				t.Fatalf("device %s (%d)", rel, st.Rdev)
			}
		case unix.S_IFIFO:
			if !o.Fifos {
				t.Fatalf("FIFO %s", rel)
			}
		case unix.S_IFDIR, unix.S_IFLNK:
		default:
			t.Fatalf("%s is of type %o", rel, st.Mode&unix.S_IFMT)
		}
		return nil
	})
	for rel, st := range u.st {
		if st.Mode&unix.S_IFMT == unix.S_IFREG && uint64(links[st.Ino]) != st.Nlink {
			t.Fatalf("%s has %d links, %d of them in the destination", rel, st.Nlink, links[st.Ino])
		}
	}
	return u
}

// Entry names and link targets FuzzUnpackEntries builds archives from:
// plain names, parents, overlay names and every trick.
var (
	fuzzSegs = []string{"a", "l", "upper", "..", "w", "", ".", "victim"}
	// $V is the victim's absolute path: a bug then writes there, not to
	// the host's root.
	fuzzTargets = []string{"..", "../victim", "$V", "a", "a/a", "l", "../victim/target", "l/a", "upper/w", "../../victim", "a/../..", "$V/target"}
	fuzzTypes   = []byte{tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeChar, tar.TypeFifo, tar.TypeReg, tar.TypeBlock}
)

const sparseType = 6 // index in fuzzTypes: a regular file in the sparse format

// fuzzEntry is one entry FuzzUnpackEntries wrote, as it should come out.
type fuzzEntry struct {
	name     string
	typeflag byte
	data     []byte // a regular file's content (sparse: nil; see size)
	size     int64
	segs     int
	link     string
}

// fuzzArchive builds a tar from prog, six bytes an entry: type, two bytes
// of name (1-3 segments of fuzzSegs), link target, size, flags (user and
// trusted.overlay attributes, setuid, an absolute name, a huge owner, and
// for sparse files whether the segments overlap).
func fuzzArchive(prog []byte, victim string) ([]byte, []fuzzEntry) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	var out []fuzzEntry
	for ; len(prog) >= 6; prog = prog[6:] {
		typ, na, nb, tg, size, flags := prog[0]%byte(len(fuzzTypes)), prog[1], prog[2], prog[3], prog[4], prog[5]
		segs := []string{fuzzSegs[na>>2&7], fuzzSegs[nb&7], fuzzSegs[nb>>3&7]}[:1+int(na&3)%3]
		name := strings.Join(segs, "/")
		if flags&8 != 0 {
			name = "/" + name
		}
		h := &tar.Header{Name: name, Typeflag: fuzzTypes[typ], Mode: 0o644, Linkname: strings.ReplaceAll(fuzzTargets[int(tg)%len(fuzzTargets)], "$V", victim), PAXRecords: map[string]string{}}
		e := fuzzEntry{name: strings.TrimSuffix(name, "/"), typeflag: h.Typeflag, link: h.Linkname}
		if flags&1 != 0 {
			h.PAXRecords[xattrPrefix+"user.x"] = "v"
		}
		if flags&2 != 0 {
			h.PAXRecords[xattrPrefix+"trusted.overlay.opaque"] = "y"
		}
		if flags&4 != 0 {
			h.Mode = 0o4755
		}
		if flags&16 != 0 {
			h.Uid = 1 << 32
		}
		var data []byte
		switch {
		case typ == sparseType:
			// Segments of size bytes at offsets in MiB; the real size a GiB.
			real := int64(1 << 30)
			offs := []int64{int64(flags>>5) << 20, int64(flags>>5)<<20 + int64(size)}
			if flags&0x20 != 0 {
				offs[1] -= 1 // overlapping
			}
			for _, off := range offs {
				var hdr [segHeader]byte
				binary.BigEndian.PutUint64(hdr[:8], uint64(off))
				binary.BigEndian.PutUint64(hdr[8:], uint64(size))
				data = append(data, hdr[:]...)
				data = append(data, bytes.Repeat([]byte{size | 1}, int(size))...)
			}
			h.PAXRecords[sparseKey] = strconv.FormatInt(real, 10)
			e.size, e.segs = real, 2
		case h.Typeflag == tar.TypeReg:
			data = bytes.Repeat([]byte{size}, int(size)*17)
			e.data, e.size = data, int64(len(data))
		}
		if h.Typeflag != tar.TypeSymlink && h.Typeflag != tar.TypeLink {
			h.Linkname, e.link = "", ""
		}
		h.Size = int64(len(data))
		if tw.WriteHeader(h) != nil {
			break
		}
		tw.Write(data)
		out = append(out, e)
	}
	tw.Close()
	return b.Bytes(), out
}

// FuzzUnpackEntries builds archives of entries that aim at every escape
// (names with "..", absolute names, symlinks up, out and to the root
// followed by names through them, hard links out or to what a symlink
// names, devices, FIFOs, attributes, sparse files) and unpacks them: the
// invariants of unpackPlace.check hold, the disk space used is bounded by
// the archive's data, and an archive Unpack accepts comes out exactly: its
// entries and nothing else, each of its type, with its content or target.
func FuzzUnpackEntries(f *testing.F) {
	needRoot(f)
	add := func(entries ...[6]byte) {
		var b []byte
		for _, e := range entries {
			b = append(b, e[:]...)
		}
		f.Add(b)
	}
	const (
		reg, dir, sym, lnk, chr, fifo, sparse = 0, 1, 2, 3, 4, 5, 6
		a, l, upper, dotdot, w                = 0, 1, 2, 3, 4
	)
	one := func(s int) (byte, byte) { return byte(s << 2), 0 }                // one segment
	two := func(s1, s2 int) (byte, byte) { return byte(s1<<2 | 1), byte(s2) } // two
	three := func(s1, s2, s3 int) (byte, byte) { return byte(s1<<2 | 2), byte(s2 | s3<<3) }
	e := func(typ int, n func() (byte, byte), target, size, flags byte) [6]byte {
		x, y := n()
		return [6]byte{byte(typ), x, y, target, size, flags}
	}
	n1 := func(s int) func() (byte, byte) { return func() (byte, byte) { return one(s) } }
	n2 := func(s1, s2 int) func() (byte, byte) { return func() (byte, byte) { return two(s1, s2) } }
	n3 := func(s1, s2, s3 int) func() (byte, byte) { return func() (byte, byte) { return three(s1, s2, s3) } }
	add(e(dir, n1(a), 0, 0, 0), e(reg, n2(a, a), 0, 3, 0), e(sym, n2(a, l), 0, 0, 0))         // a plain tree
	add(e(sym, n1(l), 1, 0, 0), e(reg, n2(l, a), 0, 1, 0))                                    // through a symlink to ../victim
	add(e(sym, n1(l), 2, 0, 0), e(dir, n2(l, a), 0, 0, 0))                                    // an absolute symlink (to the victim)
	add(e(reg, n2(dotdot, a), 0, 1, 0))                                                       // ../a
	add(e(reg, n1(a), 0, 1, 8))                                                               // /a
	add(e(lnk, n1(a), 6, 0, 0))                                                               // hard link to ../victim/target
	add(e(sym, n1(l), 1, 0, 0), e(lnk, n1(a), 7, 0, 0))                                       // hard link through a symlink
	add(e(reg, n1(a), 0, 2, 0), e(lnk, n1(w), 3, 0, 0))                                       // a good hard link
	add(e(dir, n1(upper), 0, 0, 2), e(chr, n2(upper, w), 0, 0, 0), e(chr, n1(w), 0, 0, 0))    // whiteouts, in and out of the upper layer
	add(e(fifo, n1(a), 0, 0, 0), e(7, n1(w), 0, 0, 0))                                        // a FIFO, a block device
	add(e(sparse, n1(a), 0, 200, 0x41), e(reg, n1(w), 0, 0, 0))                               // a sparse file
	add(e(sparse, n1(a), 0, 200, 0x60))                                                       // overlapping segments
	add(e(reg, n1(a), 0, 1, 0), e(sym, n1(a), 0, 0, 0))                                       // a duplicate
	add(e(dir, n1(a), 0, 0, 0), e(dir, n2(a, a), 0, 0, 0), e(reg, n3(a, a, dotdot), 0, 1, 0)) // a/a/..
	add(e(reg, n1(a), 0, 1, 1), e(reg, n1(w), 0, 1, 2), e(reg, n1(l), 0, 1, 4|16))            // attributes, setuid, a huge owner
	add(e(dir, n1(a), 0, 0, 0), e(sym, n2(a, l), 10, 0, 0), e(reg, n3(a, l, a), 0, 1, 0))     // a/l -> a/../..
	add(e(sym, n1(a), 0, 0, 0), e(dir, n1(a), 0, 0, 0), e(reg, n2(a, w), 0, 1, 0))            // a symlink, then a dir of its name
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) > 6*64 {
			return
		}
		p := newUnpackPlace(t)
		data, entries := fuzzArchive(prog, p.victim)
		_, err := UnpackTar(context.Background(), bytes.NewReader(data), p.dst, overlay)
		u := p.check(t, overlay)
		bound := int64(len(data))
		for _, e := range entries {
			bound += 8192 * int64(1+e.segs)
		}
		if u.alloc > bound {
			t.Fatalf("%d bytes allocated to files from an archive of %d bytes", u.alloc, len(data))
		}
		if err != nil {
			return
		}
		names := []string{}
		for _, e := range entries {
			names = append(names, e.name)
			st, ok := u.st[e.name]
			if !ok {
				t.Fatalf("accepted %q but it is not there", e.name)
			}
			path := filepath.Join(p.dst, e.name)
			want := map[byte]uint32{tar.TypeReg: unix.S_IFREG, tar.TypeLink: unix.S_IFREG, tar.TypeDir: unix.S_IFDIR,
				tar.TypeSymlink: unix.S_IFLNK, tar.TypeChar: unix.S_IFCHR, tar.TypeFifo: unix.S_IFIFO}[e.typeflag]
			if st.Mode&unix.S_IFMT != want {
				t.Fatalf("%q is of type %o, want %o", e.name, st.Mode&unix.S_IFMT, want)
			}
			switch {
			case e.typeflag == tar.TypeReg && e.segs == 0:
				if b, _ := os.ReadFile(path); !bytes.Equal(b, e.data) {
					t.Fatalf("%q holds %d bytes, want %d", e.name, len(b), len(e.data))
				}
			case e.typeflag == tar.TypeReg && st.Size != e.size:
				t.Fatalf("sparse %q is %d bytes long, want %d", e.name, st.Size, e.size)
			case e.typeflag == tar.TypeSymlink:
				if l, _ := os.Readlink(path); l != e.link {
					t.Fatalf("%q points to %q, want %q", e.name, l, e.link)
				}
			case e.typeflag == tar.TypeLink:
				if tst, ok := u.st[e.link]; !ok || tst.Ino != st.Ino {
					t.Fatalf("%q is not a link of %q", e.name, e.link)
				}
			}
		}
		got := []string{}
		for rel := range u.st {
			got = append(got, rel)
		}
		slices.Sort(names)
		slices.Sort(got)
		if !slices.Equal(names, got) {
			t.Fatalf("accepted %q but made %q", names, got)
		}
	})
}
