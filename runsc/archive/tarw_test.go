package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestTarWriterMatchesArchiveTar: every header Pack's writer makes reads
// back through archive/tar as written, edge cases included.
func TestTarWriterMatchesArchiveTar(t *testing.T) {
	long := strings.Repeat("d/", 80) + "file"
	entries := []tarEntry{
		{name: "plain", typeflag: tar.TypeReg, mode: 0o644, uid: 1000, gid: 1000, size: 5, mtimeSec: 1700000000, mtimeNsec: 123456789},
		{name: "secs-only", typeflag: tar.TypeReg, mode: 0o600, size: 0, mtimeSec: 1700000000},
		{name: "dir", typeflag: tar.TypeDir, mode: 0o1777 | 0o6000, mtimeSec: 1, mtimeNsec: 1},
		{name: long, typeflag: tar.TypeReg, mode: 0o644, size: 3, mtimeSec: 5, mtimeNsec: 500000000},
		{name: "bad\xff\xfeutf8\nnl", typeflag: tar.TypeReg, mode: 0o644, size: 1, mtimeSec: 5},
		{name: "link", linkname: "../" + long, typeflag: tar.TypeSymlink, mode: 0o777, mtimeSec: 5},
		{name: "hard", linkname: "plain", typeflag: tar.TypeLink, mtimeSec: 5},
		{name: "wh", typeflag: tar.TypeChar, mode: 0, mtimeSec: 5,
			xattrs: []xattr{{"trusted.overlay.opaque", "y"}, {"user.b", "v\x00\xff"}}},
		{name: "fifo", typeflag: tar.TypeFifo, mode: 0o640, mtimeSec: 5},
		{name: "bigids", typeflag: tar.TypeReg, mode: 0o644, uid: 1 << 31, gid: maxOctal7 + 1, mtimeSec: 5},
		{name: "old", typeflag: tar.TypeReg, mode: 0o644, mtimeSec: -2, mtimeNsec: 500000000},
		{name: "older", typeflag: tar.TypeReg, mode: 0o644, mtimeSec: -1, mtimeNsec: 999999999},
		{name: "future", typeflag: tar.TypeReg, mode: 0o644, mtimeSec: maxOctal11 + 10},
		{name: strings.Repeat("x", 100), typeflag: tar.TypeReg, mode: 0o644, mtimeSec: 5},
		{name: "rec9", typeflag: tar.TypeReg, mode: 0o644, mtimeSec: 5, xattrs: []xattr{{"user.k", strings.Repeat("v", 86)}}},
	}
	var buf bytes.Buffer
	tw := newTarWriter(&buf, true)
	for i := range entries {
		e := &entries[i]
		must(t, tw.header(e))
		data := bytes.Repeat([]byte{byte('a' + i)}, int(e.size))
		must(t, tw.data(data))
		tw.pad(e.size)
	}
	must(t, tw.close())
	tr := tar.NewReader(&buf)
	for i, e := range entries {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		want := time.Unix(e.mtimeSec, e.mtimeNsec)
		got := map[string]any{"name": h.Name, "link": h.Linkname, "type": h.Typeflag, "mode": h.Mode,
			"uid": int64(h.Uid), "gid": int64(h.Gid), "size": h.Size, "mtime": h.ModTime.Equal(want)}
		exp := map[string]any{"name": e.name, "link": e.linkname, "type": e.typeflag, "mode": e.mode,
			"uid": e.uid, "gid": e.gid, "size": e.size, "mtime": true}
		if !reflect.DeepEqual(got, exp) {
			t.Errorf("entry %d: got %v (mtime %v), want %v (mtime %v)", i, got, h.ModTime, exp, want)
		}
		var xs []xattr
		for k, v := range h.PAXRecords {
			if key, ok := strings.CutPrefix(k, xattrPrefix); ok {
				xs = append(xs, xattr{key, v})
			}
		}
		sortXattrs(xs)
		if len(xs) != len(e.xattrs) || (len(xs) > 0 && !reflect.DeepEqual(xs, e.xattrs)) {
			t.Errorf("entry %d: xattrs %q, want %q", i, xs, e.xattrs)
		}
		b, _ := io.ReadAll(tr)
		if !bytes.Equal(b, bytes.Repeat([]byte{byte('a' + i)}, int(e.size))) {
			t.Errorf("entry %d: data %q", i, b)
		}
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Fatalf("after the last entry: %v", err)
	}
}

// TestGNUTarReadsPack: a Pack of every kind of entry extracts with plain
// tar and zstd, names, modes and nanosecond mtimes kept.
func TestGNUTarReadsPack(t *testing.T) {
	needRoot(t)
	for _, c := range []string{"tar", "zstd"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skip(c + " missing")
		}
	}
	src, dst := t.TempDir(), t.TempDir()
	oddTree(t, src)
	out := filepath.Join(t.TempDir(), "a.tar.zst")
	f, err := os.Create(out)
	must(t, err)
	_, err = Pack(context.Background(), src, []string{"upper", "workspace", "tmp"}, f)
	must(t, err)
	must(t, f.Close())
	cmd := exec.Command("sh", "-c", `zstd -q -d -c "$1" | tar --xattrs --xattrs-include='*' -C "$2" -xpf -`, "sh", out, dst)
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, o)
	}
	want, got := describe(t, src), describe(t, dst)
	for k, v := range want {
		if strings.HasPrefix(k, "workspace/fifo") {
			continue
		}
		if got[k] != v {
			t.Errorf("%q: tar made %q, want %q", k, got[k], v)
		}
	}
}

// FuzzTarReader: Unpack's tar reader reads what archive/tar reads, the
// same way, and fails where it fails (up to sparse files and global
// headers, which Unpack refuses either way).
func FuzzTarReader(f *testing.F) {
	f.Add(hostile(dirH("a"), fileH("a/b"), &tar.Header{Name: "a/l", Typeflag: tar.TypeSymlink, Linkname: ".."}))
	f.Add(hostile(fileH(strings.Repeat("long/", 40)+"x"), &tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "x", Uid: 1 << 30}))
	f.Add(hostile(&tar.Header{Name: "w", Typeflag: tar.TypeChar, PAXRecords: map[string]string{"SCHILY.xattr.user.x": "y"},
		ModTime: time.Unix(-5, 7)}))
	for _, format := range []tar.Format{tar.FormatGNU, tar.FormatUSTAR} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(&tar.Header{Name: strings.Repeat("g", 120), Typeflag: tar.TypeReg, Size: 3, Format: format, Mode: 0o644})
		tw.Write([]byte("abc"))
		tw.Close()
		f.Add(b.Bytes())
	}
	var packed bytes.Buffer
	must(f, newTarWriterFor(&packed))
	f.Add(packed.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		theirs, ours := tar.NewReader(bytes.NewReader(data)), newTarReader(bytes.NewReader(data))
		for i := 0; ; i++ {
			th, terr := theirs.Next()
			oh, oerr := ours.Next()
			if terr == nil && (th.Typeflag == tar.TypeXGlobalHeader || th.Typeflag == tar.TypeGNUSparse) {
				return
			}
			if errors.Is(oerr, errSparse) {
				return
			}
			if (terr == nil) != (oerr == nil) {
				t.Fatalf("entry %d: archive/tar %v, ours %v", i, terr, oerr)
			}
			if terr != nil {
				return
			}
			for k := range th.PAXRecords {
				if strings.HasPrefix(k, "GNU.sparse.") {
					return
				}
			}
			got := fmt.Sprint(oh.Name, "|", oh.Linkname, "|", oh.Typeflag, "|", oh.Size, "|", oh.Mode, "|", oh.Uid, "|", oh.Gid, "|",
				oh.ModTime.UnixNano(), "|", oh.Devmajor, "|", oh.Devminor, "|", oh.PAXRecords)
			want := fmt.Sprint(th.Name, "|", th.Linkname, "|", th.Typeflag, "|", th.Size, "|", th.Mode, "|", th.Uid, "|", th.Gid, "|",
				th.ModTime.UnixNano(), "|", th.Devmajor, "|", th.Devminor, "|", th.PAXRecords)
			if got != want {
				t.Fatalf("entry %d:\n ours %s\n want %s", i, got, want)
			}
			tb, terr := io.ReadAll(theirs)
			ob, oerr := io.ReadAll(ours)
			if !bytes.Equal(tb, ob) || (terr == nil) != (oerr == nil) {
				t.Fatalf("entry %d data: ours %q %v, archive/tar %q %v", i, ob, oerr, tb, terr)
			}
			if terr != nil {
				return
			}
		}
	})
}

// newTarWriterFor writes a few entries with Pack's writer.
func newTarWriterFor(w io.Writer) error {
	tw := newTarWriter(w, true)
	for _, e := range []tarEntry{
		{name: "a", typeflag: tar.TypeReg, mode: 0o644, size: 2, mtimeSec: 1, mtimeNsec: 2},
		{name: strings.Repeat("é", 80), typeflag: tar.TypeDir, mode: 0o755, mtimeSec: 1, xattrs: []xattr{{"user.a", "b"}}},
	} {
		tw.header(&e)
		tw.data(make([]byte, e.size))
		tw.pad(e.size)
	}
	return tw.close()
}
