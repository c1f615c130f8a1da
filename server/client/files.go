package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Files: GET/PUT/DELETE /v1/sandbox/:id/files?path=, artifacts under
// /v1/sandbox/:id/artifacts. Paths are the sandbox's view: absolute, in
// /workspace. Transfers stream: nothing is held in memory.

// ErrIsDirectory is returned by Download for a directory.
var ErrIsDirectory = errors.New("is a directory")

// ErrNotDirectory is returned by ListDir for a file.
var ErrNotDirectory = errors.New("not a directory")

// Progress is told how many bytes were transferred so far and the total
// (-1 when unknown). It is called from the transferring goroutine.
type Progress func(done, total int64)

// FileEntry is one entry of a workspace directory.
type FileEntry struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"` // file, dir or symlink
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modifiedAt"`
}

// FileList is a directory's listing. Truncated says why the server cut it
// (its X-Listing-Truncated header), empty when complete.
type FileList struct {
	Entries   []FileEntry
	Truncated string
	Raw       json.RawMessage
}

func filesPath(id string) string { return sandboxPath(id) + "/files" }

func pathQuery(p string) url.Values { return url.Values{"path": {p}} }

// isJSON reports whether a response is a JSON document (a listing) rather
// than a file's bytes.
func isJSON(resp *http.Response) bool {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt == "application/json"
}

// ListDir lists a directory of the session's workspace (the session may be
// running, stopped or failed).
func (c *Client) ListDir(ctx context.Context, sessionID, dir string) (*FileList, error) {
	req, err := c.request(ctx, http.MethodGet, filesPath(sessionID), pathQuery(dir), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if !isJSON(resp) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNotDirectory)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONBody))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	l := &FileList{Raw: raw, Truncated: resp.Header.Get("X-Listing-Truncated")}
	if err := json.Unmarshal(raw, &l.Entries); err != nil {
		return nil, fmt.Errorf("list %s: decode answer: %w", dir, err)
	}
	return l, nil
}

// Download writes a file of the session's workspace to w and returns the
// number of bytes written. The bytes are the file's after the session's
// secret scrubber. A directory is ErrIsDirectory (nothing is written); a
// transfer the server cut short is an error, never a short file.
func (c *Client) Download(ctx context.Context, sessionID, file string, w io.Writer, progress Progress) (int64, error) {
	return c.download(ctx, filesPath(sessionID), pathQuery(file), file, w, progress)
}

func (c *Client) download(ctx context.Context, p string, q url.Values, name string, w io.Writer, progress Progress) (int64, error) {
	req, err := c.request(ctx, http.MethodGet, p, q, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.send(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if isJSON(resp) {
		return 0, fmt.Errorf("%s: %w", name, ErrIsDirectory)
	}
	var dst io.Writer = w
	if progress != nil {
		progress(0, resp.ContentLength)
		dst = &progressWriter{w: w, total: resp.ContentLength, fn: progress}
	}
	n, err := io.Copy(dst, resp.Body)
	if err != nil {
		return n, fmt.Errorf("download %s: %w", name, err)
	}
	return n, nil
}

// UploadResult answers Upload: the file's new entry and whether it was
// created (false: replaced).
type UploadResult struct {
	Entry   FileEntry
	Created bool
	Raw     json.RawMessage
}

// Upload writes r to a file of a running session (parent directories are
// created; the file belongs to the sandbox user, mode 0644). size is r's
// length, or -1 when unknown (then the body is sent chunked). The server
// accepts up to 256 MiB and replaces the file atomically. An upload
// refused by the server's rate limits is retried only when r is an
// io.Seeker (a file, a bytes.Reader): it is sent again from where it
// started (and progress starts again from 0).
func (c *Client) Upload(ctx context.Context, sessionID, file string, r io.Reader, size int64, progress Progress) (*UploadResult, error) {
	wrap := func(r io.Reader) io.Reader {
		if progress == nil {
			return r
		}
		progress(0, size)
		return &progressReader{r: r, total: size, fn: progress}
	}
	// A reader the transport cannot see through: ContentLength says the size.
	req, err := c.request(ctx, http.MethodPut, filesPath(sessionID), pathQuery(file), nil)
	if err != nil {
		return nil, err
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
		if progress != nil {
			progress(0, 0)
		}
	} else {
		seekBody(req, r, wrap)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if err != nil {
		return nil, fmt.Errorf("upload %s: read answer: %w", file, err)
	}
	res := &UploadResult{Created: resp.StatusCode == http.StatusCreated, Raw: raw}
	if err := json.Unmarshal(raw, &res.Entry); err != nil {
		return nil, fmt.Errorf("upload %s: decode answer: %w", file, err)
	}
	return res, nil
}

// DeleteFile removes a file, a symlink or an empty directory of a running
// session; with recursive a whole tree.
func (c *Client) DeleteFile(ctx context.Context, sessionID, file string, recursive bool) error {
	q := pathQuery(file)
	if recursive {
		q.Set("recursive", "true")
	}
	_, _, err := c.doJSON(ctx, http.MethodDelete, filesPath(sessionID), q, nil, nil)
	return err
}

// Artifact is a regular file of the workspace; Size and SHA256 are those
// of its download.
type Artifact struct {
	Path       string    `json:"path"` // relative to /workspace
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modifiedAt"`
	SHA256     string    `json:"sha256"`
}

// ArtifactList is the answer of Artifacts. Truncated lists why the server
// cut the walk (entries, size, depth, bytes, time), empty when complete.
type ArtifactList struct {
	Artifacts []Artifact
	Truncated []string
	Raw       json.RawMessage
}

// Artifacts lists every regular file under /workspace, while the session
// runs and after teardown.
func (c *Client) Artifacts(ctx context.Context, sessionID string) (*ArtifactList, error) {
	var l ArtifactList
	raw, resp, err := c.doJSON(ctx, http.MethodGet, sandboxPath(sessionID)+"/artifacts", nil, nil, &l.Artifacts)
	if err != nil {
		return nil, err
	}
	l.Raw = raw
	if t := resp.Header.Get("X-Listing-Truncated"); t != "" {
		l.Truncated = strings.Split(t, ",")
	}
	return &l, nil
}

// DownloadArtifact writes one artifact (a path relative to /workspace, as
// Artifacts lists it; a leading "/workspace/" is accepted) to w.
func (c *Client) DownloadArtifact(ctx context.Context, sessionID, file string, w io.Writer, progress Progress) (int64, error) {
	rel := strings.TrimPrefix(strings.TrimPrefix(file, "/workspace/"), "/")
	parts := strings.Split(rel, "/")
	for i, p := range parts {
		parts[i] = seg(p)
	}
	return c.download(ctx, sandboxPath(sessionID)+"/artifacts/"+strings.Join(parts, "/"), nil, file, w, progress)
}

type progressReader struct {
	r     io.Reader
	done  int64
	total int64
	fn    Progress
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.done += int64(n)
		p.fn(p.done, p.total)
	}
	return n, err
}

type progressWriter struct {
	w     io.Writer
	done  int64
	total int64
	fn    Progress
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	if n > 0 {
		p.done += int64(n)
		p.fn(p.done, p.total)
	}
	return n, err
}
