package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
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
	fd, err := unix.Openat2(u.root, parent, &unix.OpenHow{
		Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveBeneath})
	if err != nil {
		return -1, unsafeEntry(parent, "parent directory: %v", err)
	}
	u.lastFd, u.lastParent = fd, parent
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
		if hdr.Size <= smallFile {
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
		tfd, err := unix.Openat2(u.root, orDot(tParent), &unix.OpenHow{
			Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveBeneath})
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
	var off, end int64 // end: past the last byte written
	for off < hdr.Size {
		n, err := io.ReadFull(body, u.buf[:min(int64(len(u.buf)), hdr.Size-off)])
		if err != nil {
			return fmt.Errorf("unpack: read %q: %w", name, err)
		}
		chunk := u.buf[:n]
		if allZero(chunk) {
			off += int64(n)
			continue
		}
		if err := pwriteFull(fd, chunk, off); err != nil {
			return fmt.Errorf("unpack: write %q: %w", name, err)
		}
		off += int64(n)
		end = off
	}
	if end != hdr.Size {
		if err := unix.Ftruncate(fd, hdr.Size); err != nil { // a hole at the end
			return fmt.Errorf("unpack: size %q: %w", name, err)
		}
	}
	return u.meta(pfd, base, name, hdr, fd)
}

// smallFile writes a file a worker was given: created from the root
// beneath it (no symlink followed, no mount left), its body written unless
// all zeros (then a hole), its metadata set through its descriptor.
func (u *unpacker) smallFile(j fileJob) error {
	fd, err := unix.Openat2(u.root, j.name, &unix.OpenHow{
		Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Mode: 0o600, Resolve: resolveBeneath})
	if err != nil {
		return unsafeEntry(j.name, "create: %v", err)
	}
	defer unix.Close(fd)
	data := *j.data
	if allZero(data) {
		if len(data) > 0 {
			if err := unix.Ftruncate(fd, int64(len(data))); err != nil {
				return fmt.Errorf("unpack: size %q: %w", j.name, err)
			}
		}
	} else if err := pwriteFull(fd, data, 0); err != nil {
		return fmt.Errorf("unpack: write %q: %w", j.name, err)
	}
	return u.meta(-1, "", j.name, j.hdr, fd)
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
