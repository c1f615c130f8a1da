package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/sys/unix"

	"sandboxd/runsc"
	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

// Files and artifacts: GET/PUT/DELETE /v1/sandbox/:id/files?path=,
// GET /v1/sandbox/:id/artifacts[/*path]. Every operation holds the session's
// lock for its whole duration, so teardown, delete and resume never run
// under it and a saved disk is never mounted twice. File bytes, names and
// digests pass the session's scrubber (wsfs.go has the descriptor rules).
const (
	// maxUploadBytes caps a PUT body (limits.maxBodyBytes, for JSON,
	// does not apply to it unless larger).
	maxUploadBytes = 256 << 20
	// Listings: a directory listing returns at most maxListEntries entries;
	// the artifact walk visits at most maxListEntries entries, maxWalkDepth
	// levels deep, hashes at most maxHashBytes not yet hashed (digests of
	// unchanged files are cached) within maxHashTime. A listing that was cut
	// says why in the X-Listing-Truncated header.
	maxListEntries = 10000
	// maxListBytes bounds a listing's JSON answer (names may escape to six
	// times their size), built in memory.
	maxListBytes   = 8 << 20
	maxWalkDepth   = 32
	maxHashBytes   = 1 << 30
	maxHashTime    = 60 * time.Second
	maxDeleteDepth = 256
	truncatedHdr   = "X-Listing-Truncated"
	uploadPrefix   = ".sandboxd-upload-"
)

// fileIODeadline bounds how long a slow client can hold a session's lock:
// the whole transfer (upload or download) must fit in it (2 minutes; tests
// shorten it).
var fileIODeadlineNs atomic.Int64

func init() { fileIODeadlineNs.Store(int64(2 * time.Minute)) }

func fileIODeadline() time.Duration { return time.Duration(fileIODeadlineNs.Load()) }

// fileEntry is one entry of a directory listing (and PUT's answer).
type fileEntry struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modifiedAt"`
}

// artifact is one regular file of the workspace; size and sha256 describe
// the bytes a download delivers (after the scrubber).
type artifact struct {
	Path       string    `json:"path"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modifiedAt"`
	SHA256     string    `json:"sha256"`
}

// withWorkspace runs fn with a descriptor of the session's workspace, under
// the session's lock, the I/O deadline set. A running session's mounted disk
// is used; a stopped or failed one's saved disk is mounted read-only for
// the call (reads only).
func (s *Server) withWorkspace(c *gin.Context, write bool, fn func(ses *store.Session, wsfd int, set *scrub.Set)) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	unlock := s.sb.lock(ses.ID)
	defer unlock()
	cur, ok := s.reload(c, ses)
	if !ok {
		return
	}
	rc := http.NewResponseController(c.Writer)
	rc.SetWriteDeadline(time.Now().Add(fileIODeadline()))
	if write {
		rc.SetReadDeadline(time.Now().Add(fileIODeadline()))
	}
	defer func() {
		// The connection may serve more requests (keep-alive).
		rc.SetWriteDeadline(time.Time{})
		if write {
			rc.SetReadDeadline(time.Time{})
		}
	}()
	readOnly := false
	switch {
	case cur.Status == store.StatusRunning:
		// File use is use: it keeps the session from its idle timeout.
		end, _ := s.sb.begin(cur.ID, 0)
		defer end()
	case write:
		s.writeError(c, errdefs.Conflict("session is %s; files can be written only in a running session", cur.Status))
		return
	case cur.Status == store.StatusStopped || cur.Status == store.StatusFailed:
		readOnly = true
	default:
		s.writeError(c, errdefs.Conflict("session is %s; files are available while it runs and after teardown", cur.Status))
		return
	}
	dir, release, err := s.rt.OpenWorkspace(cur.ContainerID, readOnly)
	if errors.Is(err, runsc.ErrNoDisk) {
		s.writeError(c, errdefs.NotFound("the session has no saved workspace"))
		return
	}
	if err != nil {
		s.writeError(c, err)
		return
	}
	defer func() {
		if err := release(); err != nil {
			s.log.Error("release workspace", "session", cur.SessionID, "err", err)
		}
	}()
	wsfd := int(dir.Fd())
	fn(&cur, wsfd, s.sessionScrubber(cur.ID))
}

func redactStr(set *scrub.Set, v string) string { return string(set.Redact([]byte(v))) }

// openForRead opens rel beneath the workspace for reading (a FIFO does not
// block) and stats it; on failure it has answered.
func (s *Server) openForRead(c *gin.Context, wsfd int, rel string) (*os.File, unix.Stat_t, bool) {
	var st unix.Stat_t
	fd, err := openat2(wsfd, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		s.writeError(c, fsError(err))
		return nil, st, false
	}
	f := osFile(fd, path.Base("/"+rel))
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		s.writeError(c, err)
		return nil, st, false
	}
	return f, st, true
}

// getFiles: GET /v1/sandbox/:sessionId/files?path=. A directory lists its
// entries; a regular file is its (scrubbed) bytes.
func (s *Server) getFiles(c *gin.Context) {
	p := c.Query("path")
	rel, aerr := workspaceRel(p)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	s.withWorkspace(c, false, func(ses *store.Session, wsfd int, set *scrub.Set) {
		auditDetail(c, "path", redactStr(set, p))
		f, st, ok := s.openForRead(c, wsfd, rel)
		if !ok {
			return
		}
		defer f.Close()
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			s.listDir(c, int(f.Fd()), "/"+path.Join("workspace", rel), set)
		case unix.S_IFREG:
			s.sendFile(c, f, path.Base("/"+rel), set)
		default:
			s.writeError(c, invalidPath("path: not a regular file or directory"))
		}
	})
}

func (s *Server) listDir(c *gin.Context, fd int, dirPath string, set *scrub.Set) {
	names, more, err := readNames(fd, maxListEntries)
	if err != nil {
		s.writeError(c, fsError(err))
		return
	}
	sort.Strings(names)
	out := make([]fileEntry, 0, len(names))
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
		if size += jsonSize(n) + jsonSize(dirPath) + jsonSize(n) + 128; size > maxListBytes {
			c.Header(truncatedHdr, "size")
			more = false
			break
		}
		out = append(out, fileEntry{Name: redactStr(set, n), Path: redactStr(set, path.Join(dirPath, n)), Type: typ,
			Size: st.Size, ModifiedAt: mtime(&st)})
	}
	if more {
		c.Header(truncatedHdr, "entries")
	}
	c.JSON(http.StatusOK, out)
}

// sendFile streams a regular file through the session's scrubber, as an
// attachment that no browser renders or sniffs.
func (s *Server) sendFile(c *gin.Context, f io.Reader, name string, set *scrub.Set) {
	h := c.Writer.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", contentDisposition(redactStr(set, name)))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox")
	h.Set("Cache-Control", "no-store")
	c.Status(http.StatusOK)
	c.Writer.WriteHeaderNow()
	w := set.NewWriter(c.Writer)
	n, rerr, werr := copyFile(w, f)
	if werr == nil && rerr == nil {
		werr = w.Close()
	}
	auditDetail(c, "bytes", n)
	if rerr != nil {
		// The status is sent: cut the connection so the client sees a
		// broken transfer, never a short file that looks complete.
		s.log.Error("read workspace file", "requestId", requestID(c), "err", rerr)
		abortConn(c)
	} else if werr != nil {
		abortConn(c)
	}
}

// copyFile copies f into w; rerr is a read error, werr a write error.
func copyFile(w io.Writer, f io.Reader) (n int64, rerr, werr error) {
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

// abortConn closes the client's connection after a response has started.
func abortConn(c *gin.Context) {
	if conn, _, err := http.NewResponseController(c.Writer).Hijack(); err == nil {
		conn.Close()
	}
}

// contentDisposition is an attachment header for name: an ASCII-only
// fallback filename (no quotes, backslashes or control bytes) and the real
// name percent-encoded as RFC 5987 ext-value.
func contentDisposition(name string) string {
	name = strings.ToValidUTF8(name, "\uFFFD")
	var ascii strings.Builder
	for _, r := range name {
		switch {
		case r < 0x20 || r >= 0x7f || r == '"' || r == '\\' || r == '%' || r == ';':
			ascii.WriteByte('_')
		default:
			ascii.WriteRune(r)
		}
	}
	fallback := ascii.String()
	if fallback == "" {
		fallback = "download"
	}
	var enc strings.Builder
	for i := 0; i < len(name); i++ {
		b := name[i]
		if isAttrChar(b) {
			enc.WriteByte(b)
		} else {
			enc.WriteString("%" + strings.ToUpper(hex.EncodeToString([]byte{b})))
		}
	}
	return `attachment; filename="` + fallback + `"; filename*=UTF-8''` + enc.String()
}

// isAttrChar: RFC 5987 attr-char.
func isAttrChar(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("!#$&+-.^_`|~", b) >= 0
}

// putFile: PUT /v1/sandbox/:sessionId/files?path= writes the body to a file
// of a running session: parents are created (0755), the file is written as
// an unnamed temporary file in its directory (0644, the sandbox user's) and
// renamed over the path, so readers never see half a file.
func (s *Server) putFile(c *gin.Context) {
	p := c.Query("path")
	rel, aerr := workspaceRel(p)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	if rel == "" {
		s.writeError(c, invalidPath("path: must name a file in /workspace"))
		return
	}
	s.withWorkspace(c, true, func(ses *store.Session, wsfd int, set *scrub.Set) {
		auditDetail(c, "path", redactStr(set, p))
		dir, name := path.Split(rel)
		if strings.HasPrefix(name, uploadPrefix) {
			s.writeError(c, invalidPath("path: names starting with %s are reserved", uploadPrefix))
			return
		}
		pfd, err := mkdirs(wsfd, strings.TrimSuffix(dir, "/"), runsc.UserUID, runsc.UserGID)
		if err != nil {
			s.writeError(c, fsError(err))
			return
		}
		defer unix.Close(pfd)
		created := false
		var st unix.Stat_t
		switch err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
		case errors.Is(err, unix.ENOENT):
			created = true
		case err != nil:
			s.writeError(c, fsError(err))
			return
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			s.writeError(c, errdefs.Conflict("path: is a directory"))
			return
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			s.writeError(c, invalidPath("path: is a symbolic link; symlinks are never followed or replaced"))
			return
		case st.Mode&unix.S_IFMT != unix.S_IFREG:
			s.writeError(c, invalidPath("path: not a regular file"))
			return
		}
		tfd, err := openat2(pfd, "", unix.O_TMPFILE|unix.O_WRONLY)
		if err != nil {
			s.writeError(c, fsError(err))
			return
		}
		tf := osFile(tfd, "upload")
		defer tf.Close()
		if err := unix.Fchown(tfd, runsc.UserUID, runsc.UserGID); err != nil {
			s.writeError(c, err)
			return
		}
		if err := unix.Fchmod(tfd, 0o644); err != nil {
			s.writeError(c, err)
			return
		}
		n, rerr, werr := copyFile(tf, c.Request.Body)
		if rerr != nil {
			var mbe *http.MaxBytesError
			if errors.As(rerr, &mbe) {
				s.writeError(c, errTooLarge)
			} else {
				s.writeError(c, badRequest("could not read the request body (an upload must arrive within %s)", fileIODeadline()))
			}
			return
		}
		if werr != nil {
			s.writeError(c, fsError(werr))
			return
		}
		tmp := uploadPrefix + randomHex(8)
		if err := unix.Linkat(tfd, "", pfd, tmp, unix.AT_EMPTY_PATH); err != nil {
			s.writeError(c, fsError(err))
			return
		}
		if err := unix.Renameat(pfd, tmp, pfd, name); err != nil {
			unix.Unlinkat(pfd, tmp, 0)
			s.writeError(c, fsError(err))
			return
		}
		if err := unix.Fstat(tfd, &st); err != nil {
			s.writeError(c, err)
			return
		}
		auditDetail(c, "bytes", n)
		status := http.StatusOK
		if created {
			status = http.StatusCreated
		}
		c.JSON(status, fileEntry{Name: redactStr(set, name), Path: redactStr(set, "/workspace/"+rel), Type: "file",
			Size: st.Size, ModifiedAt: mtime(&st)})
	})
}

// deleteFile: DELETE /v1/sandbox/:sessionId/files?path=[&recursive=true]
// removes a file, a symlink (never its target), an empty directory, or with
// recursive a whole tree.
func (s *Server) deleteFile(c *gin.Context) {
	p := c.Query("path")
	rel, aerr := workspaceRel(p)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	if rel == "" {
		s.writeError(c, invalidPath("path: /workspace itself cannot be deleted"))
		return
	}
	recursive := false
	switch c.Query("recursive") {
	case "", "false":
	case "true":
		recursive = true
	default:
		s.writeError(c, badRequest("recursive: must be true or false"))
		return
	}
	s.withWorkspace(c, true, func(ses *store.Session, wsfd int, set *scrub.Set) {
		auditDetail(c, "path", redactStr(set, p))
		dir, name := path.Split(rel)
		pfd, err := openDir(wsfd, strings.TrimSuffix(dir, "/"))
		if err != nil {
			s.writeError(c, fsError(err))
			return
		}
		defer unix.Close(pfd)
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			s.writeError(c, fsError(err))
			return
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			if recursive {
				err = removeTree(pfd, name, 1, time.Now().Add(fileIODeadline()))
			} else {
				err = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
			}
		} else {
			err = removeFile(pfd, name)
		}
		if err != nil {
			s.writeError(c, fsError(err))
			return
		}
		c.Status(http.StatusNoContent)
	})
}

// listArtifacts: GET /v1/sandbox/:sessionId/artifacts, every regular file
// under /workspace (recursive, symlinks not followed), sorted by path.
func (s *Server) listArtifacts(c *gin.Context) {
	s.withWorkspace(c, false, func(ses *store.Session, wsfd int, set *scrub.Set) {
		w := &artifactWalk{set: set, pk: ses.ID, deadline: time.Now().Add(maxHashTime), budget: maxHashBytes, cut: map[string]bool{}}
		fd, err := unix.Dup(wsfd)
		if err != nil {
			s.writeError(c, err)
			return
		}
		if err := w.walk(fd, "", 1); err != nil {
			s.writeError(c, fsError(err))
			return
		}
		sort.Slice(w.out, func(i, j int) bool { return w.out[i].Path < w.out[j].Path })
		if len(w.cut) > 0 {
			var why []string
			for k := range w.cut {
				why = append(why, k)
			}
			sort.Strings(why)
			c.Header(truncatedHdr, strings.Join(why, ","))
		}
		auditDetail(c, "artifacts", len(w.out))
		if w.out == nil {
			w.out = []artifact{}
		}
		c.JSON(http.StatusOK, w.out)
	})
}

type artifactWalk struct {
	set      *scrub.Set
	pk       string
	entries  int
	size     int // estimated bytes of the JSON answer
	budget   int64
	deadline time.Time
	cut      map[string]bool // why the listing is incomplete
	out      []artifact
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

// walk lists the directory fd (which it closes) at rel, depth levels below
// the workspace.
func (w *artifactWalk) walk(fd int, rel string, depth int) error {
	defer unix.Close(fd)
	left := maxListEntries - w.entries
	if w.cut["size"] {
		return nil
	}
	if left <= 0 {
		w.cut["entries"] = true
		return nil
	}
	names, more, err := readNames(fd, left)
	if err != nil {
		return err
	}
	if more {
		w.cut["entries"] = true
	}
	w.entries += len(names)
	sort.Strings(names)
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		p := path.Join(rel, n)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if depth >= maxWalkDepth {
				w.cut["depth"] = true
				continue
			}
			sub, err := openDir(fd, n)
			if err != nil {
				continue // swapped for something else meanwhile
			}
			if err := w.walk(sub, p, depth+1); err != nil {
				return err
			}
		case unix.S_IFREG:
			if w.size += jsonSize(p) + 160; w.size > maxListBytes {
				w.cut["size"] = true
				return nil
			}
			a, ok := w.digest(fd, n, &st)
			if ok {
				a.Path = string(w.set.Redact([]byte(p)))
				w.out = append(w.out, a)
			}
		}
	}
	return nil
}

// digest computes the size and sha256 of a file's scrubbed bytes, from the
// cache when the file is unchanged.
func (w *artifactWalk) digest(dirfd int, name string, lst *unix.Stat_t) (artifact, bool) {
	key := digestKey{pk: w.pk, set: w.set, dev: lst.Dev, ino: lst.Ino, size: lst.Size, mtime: lst.Mtim, ctime: lst.Ctim}
	if d, ok := digests.get(key); ok {
		return artifact{Size: d.size, SHA256: d.sum, ModifiedAt: mtime(lst)}, true
	}
	if lst.Size > w.budget {
		w.cut["bytes"] = true
		return artifact{}, false
	}
	if time.Now().After(w.deadline) {
		w.cut["time"] = true
		return artifact{}, false
	}
	fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return artifact{}, false
	}
	f := osFile(fd, "artifact")
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return artifact{}, false
	}
	h := sha256.New()
	cw := &countWriter{w: h}
	sw := w.set.NewWriter(cw)
	// A file that grows while it is read is cut at the budget.
	n, rerr, _ := copyFile(sw, io.LimitReader(f, w.budget+1))
	sw.Close()
	w.budget -= n
	if rerr != nil {
		return artifact{}, false
	}
	if w.budget < 0 {
		w.cut["bytes"] = true
		return artifact{}, false
	}
	d := digestVal{size: cw.n, sum: hex.EncodeToString(h.Sum(nil))}
	var after unix.Stat_t
	if unix.Fstat(fd, &after) == nil && after.Size == st.Size && after.Mtim == st.Mtim && after.Ctim == st.Ctim {
		key = digestKey{pk: w.pk, set: w.set, dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
		digests.put(key, d)
	}
	return artifact{Size: d.size, SHA256: d.sum, ModifiedAt: mtime(&st)}, true
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// getArtifact: GET /v1/sandbox/:sessionId/artifacts/*path, one regular
// file's scrubbed bytes as an attachment.
func (s *Server) getArtifact(c *gin.Context) {
	p := c.Param("path")
	rel, aerr := workspaceRel("/workspace" + p)
	if aerr == nil && rel == "" {
		aerr = invalidPath("path: must name a file in /workspace")
	}
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	s.withWorkspace(c, false, func(ses *store.Session, wsfd int, set *scrub.Set) {
		auditDetail(c, "path", redactStr(set, rel))
		f, st, ok := s.openForRead(c, wsfd, rel)
		if !ok {
			return
		}
		defer f.Close()
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			s.sendFile(c, f, path.Base("/"+rel), set)
		case unix.S_IFDIR:
			s.writeError(c, errdefs.NotFound("not a file; artifacts are regular files"))
		default:
			s.writeError(c, invalidPath("path: not a regular file"))
		}
	})
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// digests caches artifact digests of files that did not change, so listing
// a workspace again does not read it again. A file counts as unchanged while
// its inode, size, mtime and ctime are (the sandbox cannot set ctime, and a
// file whose ctime is within the last two seconds is not cached: a write in
// the same clock tick would not change it).
var digests = &digestCache{m: map[digestKey]digestVal{}}

const maxDigests = 100000

type digestKey struct {
	pk           string
	set          *scrub.Set
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

type digestVal struct {
	size int64
	sum  string
}

type digestCache struct {
	mu sync.Mutex
	m  map[digestKey]digestVal
}

func (d *digestCache) get(k digestKey) (digestVal, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.m[k]
	return v, ok
}

func (d *digestCache) put(k digestKey, v digestVal) {
	if time.Since(time.Unix(k.ctime.Sec, k.ctime.Nsec)) < 2*time.Second {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.m) >= maxDigests {
		clear(d.m)
	}
	d.m[k] = v
}

// filesRoute is the upload route: its body limit is maxUploadBytes.
const filesRoute = "/v1/sandbox/:sessionId/files"
