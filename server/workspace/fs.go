// Package workspace owns file access inside a session's workspace from the
// host: client paths, fd-relative opens, listings, uploads, deletes, the
// artifact walk with its digest cache, and the disk-usage walk. It never
// opens a host path below the workspace; the driver (runsc.OpenWorkspace)
// hands it the workspace's directory descriptor.
//
// The sandbox user
// owns everything under /workspace: symlinks to host paths, symlinked
// directories, FIFOs, sockets, hard links, sparse files, and a running
// sandbox can swap any entry while the server looks at it. So nothing here
// opens a host path below the workspace: every name is resolved relative to
// a directory descriptor with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
// RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV), in which the kernel refuses any
// step out of the directory, through a symlink (in any component, the last
// one included), through /proc magic links or across a mount, atomically
// with the lookup. Files are opened O_NONBLOCK (a FIFO cannot block the
// server) and checked with fstat on the descriptor that was opened; listings
// use getdents and fstatat(AT_SYMLINK_NOFOLLOW) on directory descriptors;
// writes, renames and deletes are relative to a parent descriptor opened
// the same way.
//
// Concurrency: a Files is safe for concurrent use. A Dir serves one request
// at a time, under the session's lock (the caller's duty), while the
// sandbox itself may change any entry at any moment.
package workspace

import (
	"errors"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"sandboxd/server/errdefs"

	"golang.org/x/sys/unix"
)

const (
	// resolveBeneath: no step out of the directory, through a symlink,
	// a /proc magic link or onto another mount.
	resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV
	maxPathBytes   = 4096
	maxNameBytes   = 255
)

func invalidPath(format string, args ...any) *errdefs.Error {
	return errdefs.Invalid(format, args...).WithCode("invalid_path")
}

var (
	errNoSuchFile = errdefs.NotFound("no such file or directory in the workspace")
	errDiskFull   = errdefs.New(errdefs.ErrNoSpace, "the sandbox's disk is full (ENOSPC); free space in the sandbox or use a larger size")
)

// Rel checks a client's path (in the sandbox's view: absolute,
// /workspace or below, normalized, no NUL) and returns it relative to the
// workspace, "" for /workspace itself. A single trailing slash is allowed.
func Rel(p string) (string, error) {
	if p == "" {
		return "", invalidPath("path: required, an absolute path in /workspace")
	}
	if len(p) > maxPathBytes || strings.IndexByte(p, 0) >= 0 {
		return "", invalidPath("path: at most %d bytes, without NUL", maxPathBytes)
	}
	if !strings.HasPrefix(p, "/") {
		return "", invalidPath("path: must be absolute (/workspace/...)")
	}
	if len(p) > 1 && strings.HasSuffix(p, "/") {
		p = p[:len(p)-1]
	}
	if path.Clean(p) != p {
		return "", invalidPath("path: must be normalized (no '.', '..' or empty components)")
	}
	var rel string
	switch {
	case p == "/workspace":
		return "", nil
	case strings.HasPrefix(p, "/workspace/"):
		rel = p[len("/workspace/"):]
	default:
		return "", invalidPath("path: must be inside /workspace")
	}
	for _, c := range strings.Split(rel, "/") {
		if len(c) > maxNameBytes {
			return "", invalidPath("path: a component is longer than %d bytes", maxNameBytes)
		}
	}
	return rel, nil
}

// openat2 opens name beneath dirfd (see resolveBeneath), retrying when the
// kernel saw a concurrent rename (EAGAIN).
func openat2(dirfd int, name string, flags uint64) (int, error) {
	if name == "" {
		name = "."
	}
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC | unix.O_NOFOLLOW, Resolve: resolveBeneath}
	if flags&unix.O_TMPFILE == unix.O_TMPFILE {
		how.Flags &^= unix.O_NOFOLLOW
		how.Mode = 0o600
	}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, name, &how)
		if (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && i < 16 {
			continue
		}
		return fd, err
	}
}

// openDir opens a directory beneath dirfd for reading entries and as a
// parent for *at calls. A symlink as the last component is ELOOP like one
// anywhere else (O_NOFOLLOW|O_DIRECTORY alone says ENOTDIR).
func openDir(dirfd int, name string) (int, error) {
	fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOTDIR) {
		if pfd, perr := openat2(dirfd, name, unix.O_PATH); perr == nil {
			var st unix.Stat_t
			if unix.Fstat(pfd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
			unix.Close(pfd)
		} else if errors.Is(perr, unix.ELOOP) {
			err = unix.ELOOP
		}
	}
	return fd, err
}

// removeFile unlinks name beneath dirfd. A regular file with no other link
// is truncated first: a running sandbox's file system keeps descriptors of
// files it has looked up, and an unlinked file's blocks would stay in use
// until it looks again, so deleting to free disk space would not. (A
// process in the sandbox that still has it open then reads an empty file.)
func removeFile(dirfd int, name string) error {
	if fd, err := openat2(dirfd, name, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_NOCTTY); err == nil {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1 {
			unix.Ftruncate(fd, 0)
		}
		unix.Close(fd)
	}
	return unix.Unlinkat(dirfd, name, 0)
}

// fsError maps an errno from a workspace operation to the public error
// classes; others stay internal.
func fsError(err error) error {
	var en syscall.Errno
	if !errors.As(err, &en) {
		return err
	}
	switch en {
	case unix.ENOENT, unix.ENOTDIR:
		return errNoSuchFile
	case unix.ELOOP:
		return invalidPath("path: goes through a symbolic link; symlinks are never followed")
	case unix.EXDEV:
		return invalidPath("path: leaves the workspace")
	case unix.ENAMETOOLONG:
		return invalidPath("path: too long")
	case unix.ENXIO, unix.EACCES, unix.EPERM:
		return invalidPath("path: not a regular file or directory")
	case unix.ENOSPC, unix.EDQUOT:
		return errDiskFull
	case unix.EISDIR:
		return errdefs.Conflict("path: is a directory")
	case unix.ENOTEMPTY, unix.EEXIST:
		return errdefs.Conflict("path: the directory is not empty; DELETE with ?recursive=true removes a tree")
	case unix.EROFS:
		return errdefs.Conflict("the workspace is read-only now")
	}
	return err
}

// readNames reads at most limit entry names of the directory fd (from its
// current offset; "." and ".." left out). more is true if there were more.
func readNames(fd, limit int) (names []string, more bool, err error) {
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return names, false, err
		}
		if n <= 0 {
			return names, false, nil
		}
		for b := buf[:n]; len(b) > 0; {
			consumed, _, nn := unix.ParseDirent(b, -1, names)
			names = nn
			if consumed <= 0 {
				break
			}
			b = b[consumed:]
		}
		if len(names) > limit {
			return names[:limit], true, nil
		}
	}
}

// fileType is the listing type of a stat mode; "" for special files (FIFOs,
// sockets, devices), which are neither listed nor served.
func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	}
	return ""
}

func mtime(st *unix.Stat_t) time.Time {
	return time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC()
}

// mkdirs opens the directory rel beneath wsfd, creating missing components
// (mode 0755, owned by the sandbox user). The caller closes the result.
func mkdirs(wsfd int, rel string, uid, gid int) (int, error) {
	cur := wsfd
	closeCur := func() {
		if cur != wsfd {
			unix.Close(cur)
		}
	}
	if rel == "" {
		return unix.Dup(wsfd)
	}
	for _, comp := range strings.Split(rel, "/") {
		fd, err := openDir(cur, comp)
		if errors.Is(err, unix.ENOENT) {
			made := false
			if err := unix.Mkdirat(cur, comp, 0o755); err == nil {
				made = true
			} else if !errors.Is(err, unix.EEXIST) {
				closeCur()
				return -1, err
			}
			fd, err = openDir(cur, comp)
			if err == nil && made {
				// On the directory that was opened (whatever a race put
				// there, it is beneath the workspace).
				if err = unix.Fchown(fd, uid, gid); err == nil {
					err = unix.Fchmod(fd, 0o755)
				}
				if err != nil {
					unix.Close(fd)
				}
			}
		}
		closeCur()
		if err != nil {
			if errors.Is(err, unix.ENOTDIR) {
				return -1, errdefs.Conflict("path: a parent is not a directory")
			}
			return -1, err
		}
		cur = fd
	}
	return cur, nil
}

// removeTree removes name (a directory) beneath parent with everything in
// it, without following symlinks; it gives up below maxDepth levels or after
// the deadline.
func removeTree(parent int, name string, depth int, deadline time.Time) error {
	if depth > maxDeleteDepth {
		return errdefs.Conflict("the tree is deeper than %d levels; remove it with a command in the sandbox", maxDeleteDepth)
	}
	for attempt := 0; ; attempt++ {
		if time.Now().After(deadline) {
			return errdefs.Unavailable("the tree could not be removed in time; part of it may be gone, retry or use a command in the sandbox")
		}
		fd, err := openDir(parent, name)
		if err != nil {
			return err
		}
		err = removeEntries(fd, depth, deadline)
		unix.Close(fd)
		if err != nil {
			return err
		}
		err = unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
		if errors.Is(err, unix.ENOTEMPTY) && attempt < 3 {
			continue // the sandbox added entries meanwhile
		}
		return err
	}
}

func removeEntries(fd, depth int, deadline time.Time) error {
	for {
		names, more, err := readNames(fd, 4096)
		if err != nil {
			return err
		}
		for _, n := range names {
			if time.Now().After(deadline) {
				return errdefs.Unavailable("the tree could not be removed in time; part of it may be gone, retry or use a command in the sandbox")
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return err
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				err = removeTree(fd, n, depth+1, deadline)
			} else {
				err = removeFile(fd, n)
			}
			if err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
		if !more {
			return nil
		}
		// Entries were removed while reading: start again from the top.
		if _, err := unix.Seek(fd, 0, 0); err != nil {
			return err
		}
	}
}

// osFile wraps a descriptor this package opened (it closes it).
func osFile(fd int, name string) *os.File { return os.NewFile(uintptr(fd), name) }
