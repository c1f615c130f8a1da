package archive

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

type unpacker struct {
	ctx   context.Context
	root  int
	o     Options
	seen  map[string]bool // every name made, to refuse duplicates
	files map[string]bool // regular files made: the only hard link targets
	dirs  []*tar.Header   // their metadata is applied last, deepest first
	// the parent descriptor of the previous entry, reused while entries
	// stay in one directory
	lastParent string
	lastFd     int
	buf        []byte
	st         Stats
	w          *writers
}

// writers write small regular files for Unpack, so the file system's work
// for one file overlaps reading and checking the next entries. Each job is
// a file whose name was checked and whose parent exists; the worker creates
// it from the root with openat2 under the same resolve restrictions as
// everything else, so it follows no symlink and leaves no mount whatever
// happens meanwhile. The first error stops the rest.
type writers struct {
	u       *unpacker
	jobs    chan fileJob
	done    sync.WaitGroup // workers
	pending sync.WaitGroup // jobs not finished
	mu      sync.Mutex
	err     error
	bufs    sync.Pool
}

type fileJob struct {
	name string
	hdr  *tar.Header
	data *[]byte // the whole body
}

// smallFile: bodies up to this size are written by the writers (at most
// writerQueue+writerCount of them held at once).
const (
	smallFile   = 256 << 10
	writerQueue = 64
	writerCount = 4
)

func newWriters(u *unpacker) *writers {
	w := &writers{u: u, jobs: make(chan fileJob, writerQueue)}
	w.bufs.New = func() any { b := make([]byte, 0, 16<<10); return &b }
	for range writerCount {
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			for j := range w.jobs {
				if w.failed() == nil {
					if err := u.smallFile(j); err != nil {
						w.fail(err)
					}
				}
				w.bufs.Put(j.data)
				w.pending.Done()
			}
		}()
	}
	return w
}

func (w *writers) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

func (w *writers) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// wait returns once every job given so far is done, with the first error.
func (w *writers) wait() error {
	w.pending.Wait()
	return w.failed()
}

// stop ends the workers (after the jobs given so far).
func (w *writers) stop() {
	close(w.jobs)
	w.done.Wait()
}

// add reads a small file's body and gives it to a worker.
func (w *writers) add(name string, hdr *tar.Header, body io.Reader) error {
	bp := w.bufs.Get().(*[]byte)
	if int64(cap(*bp)) < hdr.Size {
		*bp = make([]byte, hdr.Size)
	}
	*bp = (*bp)[:hdr.Size]
	if _, err := io.ReadFull(body, *bp); err != nil {
		w.bufs.Put(bp)
		return fmt.Errorf("unpack: read %q: %w", name, err)
	}
	w.pending.Add(1)
	w.jobs <- fileJob{name: name, hdr: hdr, data: bp}
	return nil
}

const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// UnpackTar is Unpack without compression.
func UnpackTar(ctx context.Context, r io.Reader, dir string, o Options) (Stats, error) {
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("unpack: open %s: %w", dir, err)
	}
	defer unix.Close(root)
	u := &unpacker{ctx: ctx, root: root, o: o, seen: map[string]bool{}, files: map[string]bool{},
		lastFd: -1, buf: make([]byte, 256<<10)}
	defer u.dropParent()
	u.w = newWriters(u)
	defer u.w.stop()
	tr := newTarReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return u.st, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.st, fmt.Errorf("unpack: %w", err)
		}
		if err := u.w.failed(); err != nil {
			return u.st, err
		}
		if err := u.entry(hdr, tr); err != nil {
			return u.st, err
		}
	}
	if err := u.w.wait(); err != nil {
		return u.st, err
	}
	// Directories last (their mode may forbid writing, their mtime moves
	// with every child), children before parents.
	for i := len(u.dirs) - 1; i >= 0; i-- {
		if err := u.dirMeta(u.dirs[i]); err != nil {
			return u.st, err
		}
	}
	return u.st, nil
}

func (u *unpacker) dropParent() {
	if u.lastFd >= 0 && u.lastFd != u.root {
		unix.Close(u.lastFd)
	}
	u.lastFd, u.lastParent = -1, ""
}

// parent opens (O_PATH) the directory that holds name, beneath the root,
// following no symlink and leaving no mount.
func (u *unpacker) parent(parent string) (int, error) {
	if u.lastFd >= 0 && u.lastParent == parent {
		return u.lastFd, nil
	}
	u.dropParent()
	if parent == "" {
		u.lastFd = u.root
		return u.root, nil
	}
	fd, err := u.openDir(parent)
	if err != nil {
		return -1, unsafeEntry(parent, "parent directory: %v", err)
	}
	u.lastFd, u.lastParent = fd, parent
	return fd, nil
}

// openDir opens (O_PATH) the directory rel ("" the root itself) beneath
// the root, following no symlink and leaving no mount: with one openat2
// when rel fits PATH_MAX, else with one per run of whole components that
// does, each beneath the directory the previous one opened (so beneath the
// root; names have no ".." segment).
func (u *unpacker) openDir(rel string) (int, error) {
	fd := u.root
	for first := true; first || rel != ""; first = false {
		part := rel
		if len(part) > pathMax {
			part = rel[:strings.LastIndexByte(rel[:pathMax+1], '/')] // segments are at most 255 bytes
		}
		rel = strings.TrimPrefix(rel[len(part):], "/")
		next, err := unix.Openat2(fd, orDot(part), &unix.OpenHow{
			Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveBeneath})
		if fd != u.root {
			unix.Close(fd)
		}
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

func (u *unpacker) entry(hdr *tar.Header, body io.Reader) error {
	name, err := checkName(hdr.Name)
	if err != nil {
		return err
	}
	if u.seen[name] {
		return unsafeEntry(name, "duplicate entry")
	}
	overlay := u.o.Overlay != nil && u.o.Overlay(name)
	if _, ok := hdr.PAXRecords[sparseKey]; ok && hdr.Typeflag != tar.TypeReg {
		return unsafeEntry(name, "sparse map on a %q entry", hdr.Typeflag)
	}
	for k := range hdr.PAXRecords {
		if key, ok := strings.CutPrefix(k, xattrPrefix); ok && !xattrAllowed(key, overlay) {
			return unsafeEntry(name, "extended attribute %q not allowed here", key)
		}
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > 1<<31 || hdr.Gid > 1<<31 {
		return unsafeEntry(name, "owner out of range")
	}
	parentName, base := splitName(name)
	pfd, err := u.parent(parentName)
	if err != nil {
		return err
	}
	mode := uint32(hdr.Mode & 0o7777)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			var st unix.Stat_t
			if !errors.Is(err, unix.EEXIST) || unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return unsafeEntry(name, "mkdir: %v", err)
			}
		}
		u.dirs = append(u.dirs, hdr)
		u.st.Dirs++
	case tar.TypeReg:
		if v, ok := hdr.PAXRecords[sparseKey]; ok {
			size, err := parseSize(v)
			if err != nil {
				return unsafeEntry(name, "bad sparse file size %q", v)
			}
			data, err := u.sparseFile(pfd, base, name, hdr, body, size)
			if err != nil {
				return err
			}
			u.files[name] = true
			u.st.Files++
			u.st.Bytes += data
			break
		}
		// The writers create from the root: a name too long for one
		// openat2 is made here, below its parent.
		if hdr.Size <= smallFile && len(name) <= pathMax {
			if err := u.w.add(name, hdr, body); err != nil {
				return err
			}
		} else if err := u.file(pfd, base, name, hdr, body); err != nil {
			return err
		}
		u.files[name] = true
		u.st.Files++
		u.st.Bytes += hdr.Size
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 || len(hdr.Linkname) > 4095 {
			return unsafeEntry(name, "bad symlink target")
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return unsafeEntry(name, "symlink: %v", err)
		}
		if err := u.meta(pfd, base, name, hdr, -1); err != nil {
			return err
		}
		u.st.Symlinks++
	case tar.TypeLink:
		target, err := checkName(hdr.Linkname)
		if err != nil {
			return unsafeEntry(name, "hard link target: %v", err)
		}
		if !u.files[target] {
			return unsafeEntry(name, "hard link to %q, which is not a regular file of this archive", target)
		}
		if err := u.w.wait(); err != nil { // the target is made
			return err
		}
		tParent, tBase := splitName(target)
		tfd, err := u.openDir(tParent)
		if err != nil {
			return unsafeEntry(name, "hard link target's directory: %v", err)
		}
		err = unix.Linkat(tfd, tBase, pfd, base, 0)
		unix.Close(tfd)
		if err != nil {
			return unsafeEntry(name, "link: %v", err)
		}
		u.st.HardLinks++
	case tar.TypeChar:
		if !overlay || hdr.Devmajor != 0 || hdr.Devminor != 0 {
			return unsafeEntry(name, "device node (only overlay whiteouts, 0:0 in an upper layer, are allowed)")
		}
		if err := unix.Mknodat(pfd, base, unix.S_IFCHR|mode&0o777, 0); err != nil {
			return unsafeEntry(name, "whiteout: %v", err)
		}
		if err := u.meta(pfd, base, name, hdr, -1); err != nil {
			return err
		}
		u.st.Whiteouts++
	case tar.TypeFifo:
		if !u.o.Fifos {
			return unsafeEntry(name, "named pipe not allowed")
		}
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return unsafeEntry(name, "fifo: %v", err)
		}
		if err := u.meta(pfd, base, name, hdr, -1); err != nil {
			return err
		}
		u.st.Fifos++
	default:
		return unsafeEntry(name, "entry type %q not allowed", hdr.Typeflag)
	}
	u.seen[name] = true
	return nil
}

func orDot(s string) string {
	if s == "" {
		return "."
	}
	return s
}

// file writes a regular file, leaving holes where the data is zeros.
func (u *unpacker) file(pfd int, base, name string, hdr *tar.Header, body io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return unsafeEntry(name, "create: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, hdr.Size); err != nil { // holes where nothing is written
		return fmt.Errorf("unpack: size %q: %w", name, err)
	}
	if err := u.copyAt(fd, name, body, 0, hdr.Size); err != nil {
		return err
	}
	return u.meta(pfd, base, name, hdr, fd)
}

// copyAt writes n bytes of body at off in fd, leaving holes for zero
// blocks, checking for cancellation between reads.
func (u *unpacker) copyAt(fd int, name string, body io.Reader, off, n int64) error {
	for n > 0 {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		m, err := io.ReadFull(body, u.buf[:min(int64(len(u.buf)), n)])
		if err != nil {
			return fmt.Errorf("unpack: read %q: %w", name, err)
		}
		if _, err := writeData(fd, u.buf[:m], off); err != nil {
			return fmt.Errorf("unpack: write %q: %w", name, err)
		}
		off += int64(m)
		n -= int64(m)
	}
	return nil
}

// sparseFile writes a sparse file's segments (see sparseKey), each checked
// to lie past the previous one and within the file's size, and the whole
// of them to fill the entry's data exactly. It returns the data's size.
func (u *unpacker) sparseFile(pfd int, base, name string, hdr *tar.Header, body io.Reader, size int64) (int64, error) {
	fd, err := unix.Openat(pfd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, unsafeEntry(name, "create: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		return 0, fmt.Errorf("unpack: size %q: %w", name, err)
	}
	var seg [segHeader]byte
	var end, data int64 // end: past the previous segment
	for left := hdr.Size; left > 0; {
		if left < segHeader {
			return 0, unsafeEntry(name, "sparse data: truncated segment header")
		}
		if _, err := io.ReadFull(body, seg[:]); err != nil {
			return 0, fmt.Errorf("unpack: read %q: %w", name, err)
		}
		off, n := binary.BigEndian.Uint64(seg[:8]), binary.BigEndian.Uint64(seg[8:])
		left -= segHeader
		if n == 0 || off < uint64(end) || off > uint64(size) || n > uint64(size)-off || n > uint64(left) {
			return 0, unsafeEntry(name, "sparse data: segment %d+%d out of order, empty, or past the size %d or the data", off, n, size)
		}
		if err := u.copyAt(fd, name, body, int64(off), int64(n)); err != nil {
			return 0, err
		}
		end, left, data = int64(off+n), left-int64(n), data+int64(n)
	}
	return data, u.meta(pfd, base, name, hdr, fd)
}

// parseSize parses a non-negative decimal size, digits only.
func parseSize(v string) (int64, error) {
	if v == "" || len(v) > 19 || strings.Trim(v, "0123456789") != "" {
		return 0, errHeader
	}
	return strconv.ParseInt(v, 10, 64)
}

// smallFile writes a file a worker was given: created from the root
// beneath it (no symlink followed, no mount left), its body written but
// for zero blocks (holes), its metadata set through its descriptor.
func (u *unpacker) smallFile(j fileJob) error {
	fd, err := unix.Openat2(u.root, j.name, &unix.OpenHow{
		Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Mode: 0o600, Resolve: resolveBeneath})
	if err != nil {
		return unsafeEntry(j.name, "create: %v", err)
	}
	defer unix.Close(fd)
	data := *j.data
	end, err := writeData(fd, data, 0)
	if err != nil {
		return fmt.Errorf("unpack: write %q: %w", j.name, err)
	}
	if end != int64(len(data)) { // a hole at the end
		if err := unix.Ftruncate(fd, int64(len(data))); err != nil {
			return fmt.Errorf("unpack: size %q: %w", j.name, err)
		}
	}
	return u.meta(-1, "", j.name, j.hdr, fd)
}

// holeBlock is the granularity of the holes Unpack leaves: the file
// system's block size, so a restored file takes no more space than the
// one packed (whose holes are whole blocks).
const holeBlock = 4096

// writeData writes b at off in fd but for the blocks (holeBlock-aligned in
// the file) that are all zeros, which stay holes: runs of other blocks
// are written with one pwrite each. It returns the end (file offset) of
// the last write, 0 if none.
func writeData(fd int, b []byte, off int64) (end int64, err error) {
	run := -1 // start in b of the run of blocks to write
	flush := func(i int) error {
		if run < 0 {
			return nil
		}
		if err := pwriteFull(fd, b[run:i], off+int64(run)); err != nil {
			return err
		}
		end, run = off+int64(i), -1
		return nil
	}
	for i := 0; i < len(b); {
		j := min(len(b), i+int(holeBlock-(off+int64(i))%holeBlock))
		if allZero(b[i:j]) {
			if err := flush(i); err != nil {
				return 0, err
			}
		} else if run < 0 {
			run = i
		}
		i = j
	}
	if err := flush(len(b)); err != nil {
		return 0, err
	}
	return end, nil
}

func pwriteFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// meta applies owner, mode (after the owner: chown clears setuid bits),
// extended attributes and times. fd is the entry's own descriptor, or -1
// for entries without one (symlinks, nodes), which are reached through
// their parent without following them.
func (u *unpacker) meta(pfd int, base, name string, hdr *tar.Header, fd int) error {
	mode := uint32(hdr.Mode & 0o7777)
	if fd >= 0 {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("unpack: chown %q: %w", name, err)
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return fmt.Errorf("unpack: chmod %q: %w", name, err)
		}
	} else {
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("unpack: chown %q: %w", name, err)
		}
		if hdr.Typeflag != tar.TypeSymlink {
			// A node just made by mknodat, not a symlink: chmod follows
			// nothing here.
			if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
				return fmt.Errorf("unpack: chmod %q: %w", name, err)
			}
		}
	}
	for k, v := range hdr.PAXRecords {
		key, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok {
			continue
		}
		var err error
		if fd >= 0 {
			err = unix.Fsetxattr(fd, key, []byte(v), 0)
		} else {
			err = unix.Lsetxattr(procPath(pfd, base), key, []byte(v), 0)
		}
		if err != nil {
			return fmt.Errorf("unpack: attribute %s of %q: %w", key, name, err)
		}
	}
	t := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	if hdr.ModTime.IsZero() {
		t = unix.NsecToTimespec(time.Now().UnixNano())
	}
	var err error
	if fd >= 0 {
		err = futimens(fd, &[2]unix.Timespec{t, t})
	} else {
		err = unix.UtimesNanoAt(pfd, base, []unix.Timespec{t, t}, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return fmt.Errorf("unpack: times of %q: %w", name, err)
	}
	return nil
}

// futimens sets an open file's times: utimensat with a NULL path acts on
// the descriptor itself.
func futimens(fd int, ts *[2]unix.Timespec) error {
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(ts)), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// dirMeta applies a directory's metadata once its children are made.
func (u *unpacker) dirMeta(hdr *tar.Header) error {
	name, _ := checkName(hdr.Name)
	parentName, base := splitName(name)
	pfd, err := u.parent(parentName)
	if err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return unsafeEntry(name, "reopen directory: %v", err)
	}
	defer unix.Close(fd)
	return u.meta(pfd, base, name, hdr, fd)
}
