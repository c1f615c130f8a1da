package server

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/runsc"
	"sandboxd/server/errdefs"
	"sandboxd/server/sandbox"
	"sandboxd/server/workspace"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

// Files and artifacts: GET/PUT/DELETE /v1/sandbox/:id/files?path=,
// GET /v1/sandbox/:id/artifacts[/*path]. Every operation holds the session's
// lock for its whole duration, so teardown, delete and resume never run
// under it and a saved disk is never mounted twice. File bytes, names and
// digests pass the session's scrubber (package workspace has the
// descriptor rules).
const (
	// maxUploadBytes caps a PUT body (limits.maxBodyBytes, for JSON,
	// does not apply to it unless larger).
	maxUploadBytes = 256 << 20
	// truncatedHdr says why a listing was cut.
	truncatedHdr = "X-Listing-Truncated"
	// filesRoute is the upload route: its body limit is maxUploadBytes.
	filesRoute = "/v1/sandbox/:sessionId/files"
	// defaultFileIO bounds how long a slow client can hold a session's
	// lock: the whole transfer (upload or download) must fit in it.
	defaultFileIO = 2 * time.Minute
)

func (s *Server) fileIODeadline() time.Duration { return time.Duration(s.fileIO.Load()) }

// withWorkspace runs fn with the session's workspace (useWorkspace), the
// I/O deadline set on the client's connection; fn answers its own errors.
func (s *Server) withWorkspace(c *gin.Context, write bool, fn func(ses *store.Session, d *workspace.Dir, set *scrub.Set)) {
	id, ok := s.sessionID(c)
	if !ok {
		return
	}
	rc := http.NewResponseController(c.Writer)
	rc.SetWriteDeadline(time.Now().Add(s.fileIODeadline()))
	if write {
		rc.SetReadDeadline(time.Now().Add(s.fileIODeadline()))
	}
	defer func() {
		// The connection may serve more requests (keep-alive).
		rc.SetWriteDeadline(time.Time{})
		if write {
			rc.SetReadDeadline(time.Time{})
		}
	}()
	// Errors inside fn are answered there; useWorkspace's own (no such
	// session, wrong state) here.
	err := s.useWorkspace(c.Request.Context(), principal(c), id, write, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) error {
		fn(ses, d, set)
		return nil
	})
	if err != nil {
		s.writeError(c, err)
	}
}

// useWorkspace runs fn with the session's workspace under the session's
// lock and returns its error. A running session's mounted disk is used; a
// stopped or failed one's saved disk is mounted read-only for the call
// (reads only). set is the session's scrubber.
func (s *Server) useWorkspace(ctx context.Context, p store.Principal, id string, write bool, fn func(ses *store.Session, d *workspace.Dir, set *scrub.Set) error) error {
	return s.sessions.Use(ctx, p.Org.ID, id, Can(p.Role, PermProjectUpdate), func(ses *store.Session) error {
		readOnly := false
		switch {
		case ses.Status == store.StatusRunning:
		case write:
			return errdefs.Conflict("session is %s; files can be written only in a running session", ses.Status)
		case ses.Status == store.StatusStopped || ses.Status == store.StatusFailed:
			readOnly = true
		case ses.Status == store.StatusPaused && ses.StatusReason == sandbox.ReasonMemoryPressure:
			return errdefs.Conflict("session is paused for memory pressure; it resumes on the next request of a member who may drive it (%s)", PermProjectUpdate)
		default:
			return errdefs.Conflict("session is %s; files are available while it runs and after teardown", ses.Status)
		}
		if readOnly {
			// The node may have no copy of the saved workspace (any more).
			if err := s.sessions.EnsureDiskLocked(ctx, ses); err != nil {
				return err
			}
		}
		dir, release, err := s.rt.OpenWorkspace(ses.ContainerID, readOnly)
		if errors.Is(err, runsc.ErrNoDisk) {
			return errdefs.NotFound("the session has no saved workspace")
		}
		if f := sandbox.HostFault(err, "its files cannot be read now"); f != nil {
			return f
		}
		if err != nil {
			return err
		}
		defer func() {
			if err := release(); err != nil {
				s.log.Error("release workspace", "session", ses.SessionID, "err", err)
			}
		}()
		set, err := s.sessions.Scrubber(ses.ID)
		if err != nil {
			return err
		}
		return fn(ses, s.files.Dir(dir, ses.ID, set), set)
	})
}

// getFiles: GET /v1/sandbox/:sessionId/files?path=. A directory lists its
// entries; a regular file is its (scrubbed) bytes.
func (s *Server) getFiles(c *gin.Context) {
	p := c.Query("path")
	rel, err := workspace.Rel(p)
	if err != nil {
		s.writeError(c, err)
		return
	}
	s.withWorkspace(c, false, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) {
		auditDetail(c, "path", set.RedactString(p))
		// "a/file/" names a directory, as for open(2): not the file.
		s.serveFile(c, d, rel, set, true, strings.HasSuffix(p, "/"))
	})
}

// getArtifact: GET /v1/sandbox/:sessionId/artifacts/*path, one regular
// file's scrubbed bytes as an attachment.
func (s *Server) getArtifact(c *gin.Context) {
	rel, err := fileRel("/workspace" + c.Param("path"))
	if err != nil {
		s.writeError(c, err)
		return
	}
	s.withWorkspace(c, false, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) {
		auditDetail(c, "path", set.RedactString("/workspace/"+rel))
		s.serveFile(c, d, rel, set, false, false)
	})
}

// serveFile answers rel: a regular file's bytes, or with dirs a directory's
// listing (only a directory's with dirOnly).
func (s *Server) serveFile(c *gin.Context, d *workspace.Dir, rel string, set *scrub.Set, dirs, dirOnly bool) {
	f, kind, err := d.Open(rel)
	if err != nil {
		s.writeError(c, err)
		return
	}
	defer f.Close()
	switch {
	case kind != workspace.KindDir && dirOnly:
		s.writeError(c, errdefs.Invalid("path: not a directory (it ends with /)").WithCode("invalid_path"))
	case kind == workspace.KindFile:
		s.sendFile(c, f, path.Base("/"+rel), set)
	case kind == workspace.KindDir && dirs:
		list, truncated, err := d.List(f, rel)
		if err != nil {
			s.writeError(c, err)
			return
		}
		if truncated != "" {
			c.Header(truncatedHdr, truncated)
		}
		c.JSON(http.StatusOK, list)
	case kind == workspace.KindDir:
		s.writeError(c, errdefs.NotFound("not a file; artifacts are regular files"))
	case dirs:
		s.writeError(c, errdefs.Invalid("path: not a regular file or directory").WithCode("invalid_path"))
	default:
		s.writeError(c, errdefs.Invalid("path: not a regular file").WithCode("invalid_path"))
	}
}

// sendFile streams a regular file through the session's scrubber, as an
// attachment that no browser renders or sniffs.
func (s *Server) sendFile(c *gin.Context, f io.Reader, name string, set *scrub.Set) {
	h := c.Writer.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", contentDisposition(set.RedactString(name)))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "sandbox")
	h.Set("Cache-Control", "no-store")
	c.Status(http.StatusOK)
	c.Writer.WriteHeaderNow()
	w := set.NewWriter(c.Writer)
	n, rerr, werr := workspace.CopyFile(w, f)
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

// isAttrChar reports whether b is an RFC 5987 attr-char.
func isAttrChar(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("!#$&+-.^_`|~", b) >= 0
}

// fileRel is workspace.Rel for a path that must name a file: not
// /workspace itself, and without a trailing "/" (which names a directory,
// as for open(2)).
func fileRel(p string) (string, error) {
	rel, err := workspace.Rel(p)
	switch {
	case err != nil:
		return "", err
	case rel == "":
		return "", errdefs.Invalid("path: must name a file in /workspace").WithCode("invalid_path")
	case strings.HasSuffix(p, "/"):
		return "", errdefs.Invalid("path: names a directory (it ends with /); a file's path has no trailing /").WithCode("invalid_path")
	}
	return rel, nil
}

// putFile: PUT /v1/sandbox/:sessionId/files?path= writes the body to a file
// of a running session (workspace.Dir.Put).
func (s *Server) putFile(c *gin.Context) {
	p := c.Query("path")
	rel, err := fileRel(p)
	if err != nil {
		s.writeError(c, err)
		return
	}
	s.withWorkspace(c, true, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) {
		auditDetail(c, "path", set.RedactString(p))
		e, created, n, err := d.Put(rel, c.Request.Body)
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			s.writeError(c, tooLarge(mbe.Limit))
			return
		case errors.Is(err, workspace.ErrBodyRead):
			s.writeError(c, badRequest("could not read the request body (an upload must arrive within %s)", s.fileIODeadline()))
			return
		case err != nil:
			s.writeError(c, err)
			return
		}
		auditDetail(c, "bytes", n)
		status := http.StatusOK
		if created {
			status = http.StatusCreated
		}
		c.JSON(status, e)
	})
}

// deleteFile: DELETE /v1/sandbox/:sessionId/files?path=[&recursive=true]
// removes a file, a symlink (never its target), an empty directory, or with
// recursive a whole tree.
func (s *Server) deleteFile(c *gin.Context) {
	p := c.Query("path")
	rel, err := workspace.Rel(p)
	if err == nil && rel == "" {
		err = errdefs.Invalid("path: /workspace itself cannot be deleted").WithCode("invalid_path")
	}
	if err != nil {
		s.writeError(c, err)
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
	s.withWorkspace(c, true, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) {
		auditDetail(c, "path", set.RedactString(p))
		if err := d.Remove(rel, recursive, strings.HasSuffix(p, "/"), time.Now().Add(s.fileIODeadline())); err != nil {
			s.writeError(c, err)
			return
		}
		c.Status(http.StatusNoContent)
	})
}

// listArtifacts: GET /v1/sandbox/:sessionId/artifacts, every regular file
// under /workspace (recursive, symlinks not followed), sorted by path.
func (s *Server) listArtifacts(c *gin.Context) {
	s.withWorkspace(c, false, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) {
		list, cut, err := d.Artifacts()
		if err != nil {
			s.writeError(c, err)
			return
		}
		if len(cut) > 0 {
			c.Header(truncatedHdr, strings.Join(cut, ","))
		}
		auditDetail(c, "artifacts", len(list))
		c.JSON(http.StatusOK, list)
	})
}
