package workspace

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/server/errdefs"
	"sandboxd/streams/scrub"
)

const (
	// Listings: a directory listing returns at most MaxListEntries entries;
	// the artifact walk visits at most MaxListEntries entries, maxWalkDepth
	// levels deep, hashes at most maxHashBytes not yet hashed (digests of
	// unchanged files are cached) within maxHashTime.
	MaxListEntries = 10000
	// MaxListBytes bounds a listing's JSON answer (names may escape to six
	// times their size), built in memory.
	MaxListBytes   = 8 << 20
	maxWalkDepth   = 32
	maxHashBytes   = 1 << 30
	maxHashTime    = 60 * time.Second
	maxDeleteDepth = 256
	uploadPrefix   = ".sandboxd-upload-"
)

// Files is the server's access to workspaces: the owner that created files
// and directories get (the sandbox user), and the digest cache shared by
// all sessions.
type Files struct {
	uid, gid int
	digests  *digestCache
}

// New returns the access for workspaces whose files belong to uid:gid.
func New(uid, gid int) *Files {
	return &Files{uid: uid, gid: gid, digests: &digestCache{m: map[digestKey]digestVal{}, now: time.Now}}
}

// Dir is one session's workspace for one request: dir is the workspace's
// directory (from runsc.OpenWorkspace; the caller closes it), session keys
// the digest cache, set redacts names and the bytes digests describe.
func (fs *Files) Dir(dir *os.File, session string, set *scrub.Set) *Dir {
	return &Dir{fs: fs, fd: int(dir.Fd()), session: session, set: set}
}

// Forget drops a session's cached digests (the session was deleted).
func (fs *Files) Forget(session string) { fs.digests.forget(session) }

// Dir is a workspace seen from the host. Paths given to it are relative to
// /workspace (from Rel).
type Dir struct {
	fs      *Files
	fd      int
	session string
	set     *scrub.Set
}

// Entry is one entry of a directory listing (and of an upload's answer);
// names and paths are redacted.
type Entry struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modifiedAt"`
}

// Kind is what Open found.
type Kind int

const (
	KindOther Kind = iota // FIFO, socket, device: neither listed nor served
	KindFile
	KindDir
)

// Open opens rel for reading (a FIFO does not block) and says what it is.
// The file's name is rel's last component.
func (d *Dir) Open(rel string) (*os.File, Kind, error) {
	fd, err := openat2(d.fd, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, KindOther, fsError(err)
	}
	f := osFile(fd, path.Base("/"+rel))
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, KindOther, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return f, KindDir, nil
	case unix.S_IFREG:
		return f, KindFile, nil
	}
	return f, KindOther, nil
}

// List returns the entries of dir (opened by Open at rel), sorted by name.
// truncated says why the list is incomplete ("entries", "size"), or "".
func (d *Dir) List(dir *os.File, rel string) (out []Entry, truncated string, err error) {
	fd := int(dir.Fd())
	names, more, err := readNames(fd, MaxListEntries)
	if err != nil {
		return nil, "", fsError(err)
	}
	if more {
		truncated = "entries"
	}
	dirPath := "/" + path.Join("workspace", rel)
	sort.Strings(names)
	out = make([]Entry, 0, len(names))
	size := 0
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		typ := fileType(st.Mode)
		if typ == "" {
			continue
		}
		if size += jsonSize(n) + jsonSize(dirPath) + jsonSize(n) + 128; size > MaxListBytes {
			truncated = "size"
			break
		}
		out = append(out, Entry{Name: d.set.RedactString(n), Path: d.set.RedactString(path.Join(dirPath, n)), Type: typ,
			Size: st.Size, ModifiedAt: mtime(&st)})
	}
	return out, truncated, nil
}

// ErrBodyRead wraps an error reading an upload's body (the client's side,
// not the workspace's).
var ErrBodyRead = errors.New("read upload")

// Put writes body to the file rel: parents are created (0755, the owner's),
// the file is written as an unnamed temporary file in its directory (0644,
// the owner's) and renamed over rel, so readers never see half a file. A
// symlink, directory or special file at rel is refused, never written
// through. created says whether rel is new; n is the body's length.
func (d *Dir) Put(rel string, body io.Reader) (e Entry, created bool, n int64, err error) {
	if rel == "" {
		return e, false, 0, invalidPath("path: must name a file in /workspace")
	}
	dir, name := path.Split(rel)
	if strings.HasPrefix(name, uploadPrefix) {
		return e, false, 0, invalidPath("path: names starting with %s are reserved", uploadPrefix)
	}
	pfd, err := mkdirs(d.fd, strings.TrimSuffix(dir, "/"), d.fs.uid, d.fs.gid)
	if err != nil {
		return e, false, 0, fsError(err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	switch err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case errors.Is(err, unix.ENOENT):
		created = true
	case err != nil:
		return e, false, 0, fsError(err)
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return e, false, 0, errdefs.Conflict("path: is a directory")
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return e, false, 0, invalidPath("path: is a symbolic link; symlinks are never followed or replaced")
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return e, false, 0, invalidPath("path: not a regular file")
	}
	tfd, err := openat2(pfd, "", unix.O_TMPFILE|unix.O_WRONLY)
	if err != nil {
		return e, false, 0, fsError(err)
	}
	tf := osFile(tfd, "upload")
	defer tf.Close()
	if err := unix.Fchown(tfd, d.fs.uid, d.fs.gid); err != nil {
		return e, false, 0, err
	}
	if err := unix.Fchmod(tfd, 0o644); err != nil {
		return e, false, 0, err
	}
	n, rerr, werr := CopyFile(tf, body)
	if rerr != nil {
		return e, false, n, fmt.Errorf("%w: %w", ErrBodyRead, rerr)
	}
	if werr != nil {
		return e, false, n, fsError(werr)
	}
	tmp := uploadPrefix + randomHex(8)
	if err := unix.Linkat(tfd, "", pfd, tmp, unix.AT_EMPTY_PATH); err != nil {
		return e, false, n, fsError(err)
	}
	if err := unix.Renameat(pfd, tmp, pfd, name); err != nil {
		unix.Unlinkat(pfd, tmp, 0)
		return e, false, n, fsError(err)
	}
	if err := unix.Fstat(tfd, &st); err != nil {
		return e, false, n, err
	}
	return Entry{Name: d.set.RedactString(name), Path: d.set.RedactString("/workspace/" + rel), Type: "file",
		Size: st.Size, ModifiedAt: mtime(&st)}, created, n, nil
}

// Remove deletes rel: a file, a symlink (never its target), an empty
// directory, or with recursive a whole tree (given up at the deadline).
// With dirOnly (the path ended with "/", as for rmdir(2)) it must be a
// directory.
func (d *Dir) Remove(rel string, recursive, dirOnly bool, deadline time.Time) error {
	if rel == "" {
		return invalidPath("path: /workspace itself cannot be deleted")
	}
	dir, name := path.Split(rel)
	pfd, err := openDir(d.fd, strings.TrimSuffix(dir, "/"))
	if err != nil {
		return fsError(err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fsError(err)
	}
	if dirOnly && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return invalidPath("path: not a directory (it ends with /)")
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if recursive {
			err = removeTree(pfd, name, 1, deadline)
		} else {
			err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
		}
	} else {
		err = removeFile(pfd, name)
	}
	return fsError(err)
}

// CopyFile copies f into w; rerr is a read error, werr a write error.
func CopyFile(w io.Writer, f io.Reader) (n int64, rerr, werr error) {
	buf := make([]byte, 64<<10)
	for {
		m, err := f.Read(buf)
		if m > 0 {
			if _, err := w.Write(buf[:m]); err != nil {
				return n, nil, err
			}
			n += int64(m)
		}
		if err == io.EOF {
			return n, nil, nil
		}
		if err != nil {
			return n, err, nil
		}
	}
}

// jsonSize bounds the length of s as a JSON string body: bytes that may be
// escaped (controls, <>&, non-ASCII or invalid UTF-8) count six.
func jsonSize(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x80 || c == '<' || c == '>' || c == '&':
			n += 6
		case c == '"' || c == '\\':
			n += 2
		default:
			n++
		}
	}
	return n
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
