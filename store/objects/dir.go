package objects

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is the Backend of one host directory: <root>/<org>/<name>. Each
// object file starts with a header (magic, size, SHA-256 of the data) that
// Put fills in once the data is written, so an object and its checksum are
// one file and one rename: a Put writes <root>/<org>/.tmp-<random>,
// hashing the data as it is written, fsyncs it, checks the size and header
// the file system holds, renames it over the name and fsyncs the
// directory. Temporary files left by a crash are removed by
// NewDir.
type Dir struct {
	root string
}

const (
	tmpPrefix  = ".tmp-"
	headerSize = 128
	magic      = "SBXOBJ1\n"
)

var _ Backend = (*Dir)(nil)

// NewDir opens (creating it 0700) the storage directory root and removes
// the temporary files of Puts a crash interrupted.
func NewDir(root string) (*Dir, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("storage dir: %w", err)
	}
	d := &Dir{root: root}
	orgs, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("storage dir: %w", err)
	}
	for _, o := range orgs {
		if !o.IsDir() {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(root, o.Name()))
		if err != nil {
			return nil, fmt.Errorf("storage dir: %w", err)
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), tmpPrefix) {
				if err := os.Remove(filepath.Join(root, o.Name(), e.Name())); err != nil {
					return nil, fmt.Errorf("remove leftover upload: %w", err)
				}
			}
		}
	}
	return d, nil
}

// Leftovers lists temporary files (interrupted Puts); for tests.
func (d *Dir) Leftovers() []string {
	m, _ := filepath.Glob(filepath.Join(d.root, "*", tmpPrefix+"*"))
	return m
}

func (d *Dir) path(org, name string) (string, error) {
	if !validSegment(org) || strings.HasPrefix(org, ".") || !ValidName(name) {
		return "", ErrInvalidName
	}
	return filepath.Join(d.root, org, filepath.FromSlash(name)), nil
}

type header struct {
	size int64
	sum  [32]byte
}

func (h header) marshal() []byte {
	b := make([]byte, headerSize)
	copy(b, magic)
	binary.BigEndian.PutUint64(b[8:], uint64(h.size))
	copy(b[16:], h.sum[:])
	return b
}

func readHeader(f *os.File) (header, error) {
	b := make([]byte, headerSize)
	if _, err := f.ReadAt(b, 0); err != nil {
		return header{}, fmt.Errorf("%w: header: %v", ErrCorrupt, err)
	}
	if string(b[:8]) != magic {
		return header{}, fmt.Errorf("%w: bad header", ErrCorrupt)
	}
	var h header
	h.size = int64(binary.BigEndian.Uint64(b[8:]))
	copy(h.sum[:], b[16:48])
	st, err := f.Stat()
	if err != nil {
		return header{}, err
	}
	if st.Size() != headerSize+h.size {
		return header{}, fmt.Errorf("%w: size %d, header says %d", ErrCorrupt, st.Size()-headerSize, h.size)
	}
	return h, nil
}

func (h header) info(name string, mod time.Time) Info {
	return Info{Name: name, Size: h.size, SHA256: hex.EncodeToString(h.sum[:]), ModTime: mod}
}

// ctxReader ends a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Put implements Backend.
func (d *Dir) Put(ctx context.Context, org, name string, r io.Reader) (_ Info, err error) {
	p, err := d.path(org, name)
	if err != nil {
		return Info{}, err
	}
	orgDir := filepath.Join(d.root, org)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", name, err)
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(orgDir, tmpPrefix+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", name, err)
	}
	defer func() {
		f.Close()
		if err != nil {
			os.Remove(tmp)
		}
	}()
	h := sha256.New()
	n, err := io.CopyBuffer(&syncingWriter{f: f, h: h, off: headerSize, started: headerSize}, ctxReader{ctx, r}, make([]byte, 1<<20))
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", name, err)
	}
	var hd header
	hd.size = n
	copy(hd.sum[:], h.Sum(nil))
	if _, err := f.WriteAt(hd.marshal(), 0); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		return Info{}, fmt.Errorf("put %s: sync: %w", name, err)
	}
	// Check what the file system holds before it replaces anything: its
	// size and header. The data is not read back: the checksum is of the
	// very bytes each write(2) took whole, and a read now would come from
	// the page cache those writes filled, proving nothing fsync did not;
	// what the disk returns later is checked by every Get.
	if got, err := readHeader(f); err != nil || got != hd {
		return Info{}, fmt.Errorf("put %s: verify: %w (%v)", name, ErrCorrupt, err)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}
	if err := os.Rename(tmp, p); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", name, err)
	}
	if err := syncDir(filepath.Dir(p)); err != nil {
		return Info{}, fmt.Errorf("put %s: sync dir: %w", name, err)
	}
	if filepath.Dir(p) != orgDir {
		syncDir(orgDir) // the temp file's removal
	}
	st, _ := f.Stat()
	return hd.info(name, st.ModTime().UTC()), nil
}

// syncingWriter writes an object's data at off, hashing it, and starts
// the write-back of every full 8 MiB behind it (sync_file_range), so the
// final fsync has little left to wait for and the disk works while the
// data is still being made.
type syncingWriter struct {
	f       *os.File
	h       hash.Hash
	off     int64
	started int64 // write-back asked for up to here
}

const writeBackChunk = 8 << 20

func (w *syncingWriter) Write(p []byte) (int, error) {
	n, err := w.f.WriteAt(p, w.off)
	w.h.Write(p[:n])
	w.off += int64(n)
	if err != nil {
		return n, err
	}
	if w.off-w.started >= writeBackChunk {
		// Advice only: an error here leaves the work to the final fsync.
		unix.SyncFileRange(int(w.f.Fd()), w.started, w.off-w.started, unix.SYNC_FILE_RANGE_WRITE)
		w.started = w.off
	}
	return n, nil
}

func syncDir(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Get implements Backend.
func (d *Dir) Get(ctx context.Context, org, name string) (io.ReadCloser, Info, error) {
	p, err := d.path(org, name)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Info{}, ErrNotFound
	}
	if err != nil {
		return nil, Info{}, err
	}
	hd, err := readHeader(f)
	if err != nil {
		f.Close()
		return nil, Info{}, fmt.Errorf("get %s: %w", name, err)
	}
	st, _ := f.Stat()
	return &verifyingReader{f: f, r: io.NewSectionReader(f, headerSize, hd.size), h: sha256.New(), want: hd.sum},
		hd.info(name, st.ModTime().UTC()), nil
}

// verifyingReader hashes what is read and answers ErrCorrupt instead of
// io.EOF when the hash differs from the header's.
type verifyingReader struct {
	f    *os.File
	r    io.Reader
	h    hash.Hash
	want [32]byte
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	if err == io.EOF && !bytes.Equal(v.h.Sum(nil), v.want[:]) {
		return n, ErrCorrupt
	}
	return n, err
}

func (v *verifyingReader) Close() error { return v.f.Close() }

// Stat implements Backend.
func (d *Dir) Stat(ctx context.Context, org, name string) (Info, error) {
	p, err := d.path(org, name)
	if err != nil {
		return Info{}, err
	}
	return statFile(p, name)
}

func statFile(p, name string) (Info, error) {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, ErrNotFound
	}
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	hd, err := readHeader(f)
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", name, err)
	}
	st, _ := f.Stat()
	return hd.info(name, st.ModTime().UTC()), nil
}

// Delete implements Backend. Emptied parent directories are removed too.
func (d *Dir) Delete(ctx context.Context, org, name string) error {
	p, err := d.path(org, name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	orgDir := filepath.Join(d.root, org)
	dir := filepath.Dir(p)
	for ; dir != orgDir && strings.HasPrefix(dir, orgDir+"/"); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil { // not empty
			break
		}
	}
	if err := syncDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// List implements Backend.
func (d *Dir) List(ctx context.Context, org, prefix string) ([]Info, error) {
	if !validSegment(org) || strings.HasPrefix(org, ".") {
		return nil, ErrInvalidName
	}
	orgDir := filepath.Join(d.root, org)
	var out []Info
	err := filepath.WalkDir(orgDir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), tmpPrefix) {
			return nil
		}
		rel, _ := filepath.Rel(orgDir, p)
		name := filepath.ToSlash(rel)
		if !strings.HasPrefix(name, prefix) {
			return nil
		}
		in, err := statFile(p, name)
		if errors.Is(err, ErrNotFound) {
			return nil // deleted meanwhile
		}
		if errors.Is(err, ErrCorrupt) {
			// Listed as damaged, with the space it takes: it counts, and
			// can be deleted; one damaged object must not hide the others.
			fi, serr := e.Info()
			if serr != nil {
				return nil // deleted meanwhile
			}
			in, err = Info{Name: name, Size: max(fi.Size()-headerSize, 0), ModTime: fi.ModTime().UTC(), Damaged: true}, nil
		}
		if err != nil {
			return err
		}
		out = append(out, in)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", org, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
