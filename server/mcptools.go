package server

// The MCP tools. Each checks the permission its REST equivalent needs, then
// runs the same domain code (the Manager, execCommand, runCodeIn,
// useWorkspace, provisionChecked, teardownJSON); outputs pass the session's
// scrubber exactly as the REST answers do. Errors are tool errors
// (isError) with the contract's code and public message.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandboxd/runsc/interp"
	"sandboxd/server/errdefs"
	"sandboxd/server/sandbox"
	"sandboxd/server/workspace"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

const (
	// mcpFileBytes caps the bytes read_file and get_artifact answer with
	// (after scrubbing); the REST routes stream whole files.
	mcpFileBytes = 1 << 20
	// mcpScrubMargin is read past the cap, so the bytes kept were decided
	// with what follows them (a secret across the cut is never half shown).
	mcpScrubMargin = 256 << 10
)

// addTool registers a tool that needs perm; fn's error becomes a tool error.
func addTool[In, Out any](s *Server, t *mcp.Tool, perm string, fn func(ctx context.Context, call *mcpCall, in In) (*mcp.CallToolResult, Out, error)) {
	s.mcp.tools[t.Name] = true
	mcp.AddTool(s.mcp.srv, t, func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		call, _ := ctx.Value(mcpCallKey{}).(*mcpCall)
		if call == nil || call.caller == nil {
			return nil, zero, s.toolError(call, errUnauthenticated)
		}
		if !Can(call.caller.p.Role, perm) {
			return nil, zero, s.toolError(call, forbidden(perm))
		}
		res, out, err := fn(ctx, call, in)
		if err != nil {
			return nil, zero, s.toolError(call, err)
		}
		return res, out, nil
	})
}

// schemaFor is T's inferred input schema with edits to its properties.
func schemaFor[T any](edit map[string]func(*jsonschema.Schema)) *jsonschema.Schema {
	sc, err := jsonschema.For[T](nil)
	if err != nil {
		panic("mcp schema: " + err.Error())
	}
	for k, f := range edit {
		f(sc.Properties[k])
	}
	return sc
}

func enum(vals ...string) func(*jsonschema.Schema) {
	return func(sc *jsonschema.Schema) {
		for _, v := range vals {
			sc.Enum = append(sc.Enum, v)
		}
	}
}

func yes() *bool { b := true; return &b }
func no() *bool  { b := false; return &b }

// readOnly is the annotation of tools that change nothing.
var readOnly = &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: no()}

const sessionIDHelp = "The sandbox's session id (1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit)."

// mcpSessionID checks id and names it in the call's audit record.
func mcpSessionID(call *mcpCall, id string) error {
	if !validSessionID(id) {
		return errInvalidSessionID
	}
	call.sessionID = id
	return nil
}

// mcpSession loads the caller's session id (another organization's is
// not found).
func (s *Server) mcpSession(ctx context.Context, call *mcpCall, id string) (*store.Session, error) {
	if err := mcpSessionID(call, id); err != nil {
		return nil, err
	}
	ses, err := s.sessions.Get(ctx, call.caller.p.Org.ID, id)
	if err != nil {
		return nil, err
	}
	return &ses, nil
}

type mcpSessionIn struct {
	SessionID string `json:"sessionId" jsonschema:"The sandbox's session id."`
}

type mcpCreateIn struct {
	SessionID          string            `json:"sessionId,omitempty" jsonschema:"A new session id (1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit), unique in the organization and never reused; omitted, one is generated. To continue an earlier session use resume_sandbox."`
	Size               string            `json:"size,omitempty"`
	GitRepo            string            `json:"gitRepo,omitempty" jsonschema:"A GitHub repository owner/name to clone into /workspace, with the caller's connected GitHub credential; teardown pushes the branch's commits."`
	GitBranch          string            `json:"gitBranch,omitempty" jsonschema:"The branch of gitRepo (default: the repository's default branch)."`
	Env                map[string]string `json:"env,omitempty" jsonschema:"Environment variables of every command."`
	Secrets            map[string]string `json:"secrets,omitempty" jsonschema:"Secret environment variables (values of 6 bytes or more): given to commands and redacted from every output, never returned."`
	IdleTimeoutSeconds *int              `json:"idleTimeoutSeconds,omitempty" jsonschema:"Tear the sandbox down (saving its workspace) after this many seconds without use; 0 or omitted: the server's default."`
}

type mcpListIn struct {
	Status string `json:"status,omitempty" jsonschema:"Only sessions with this status."`
}

type mcpSandboxes struct {
	Sandboxes []sandboxObject `json:"sandboxes"`
}

type mcpCommandIn struct {
	SessionID string            `json:"sessionId" jsonschema:"The sandbox's session id."`
	Command   string            `json:"command" jsonschema:"A bash command line, run as /bin/bash -lc <command> by the sandbox's unprivileged user."`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"Working directory, an absolute path (default /workspace)."`
	Env       map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables."`
	TimeoutMs *int64            `json:"timeoutMs,omitempty" jsonschema:"Kill the command (its whole process group) after this many milliseconds; it then answers timedOut with exit code 124 (default 60000)."`
	Stdin     *string           `json:"stdin,omitempty" jsonschema:"Text given to the command on its standard input."`
}

type mcpCodeIn struct {
	SessionID string `json:"sessionId" jsonschema:"The sandbox's session id."`
	Language  string `json:"language" jsonschema:"python or node."`
	Code      string `json:"code" jsonschema:"The code to run (at most 1 MiB). Python: the value of a last expression is the result; matplotlib figures and IPython.display objects come back as display outputs (images as image content)."`
	ContextID string `json:"contextId,omitempty" jsonschema:"The code context: variables and imports persist between runs with the same contextId (default: default). 1-64 characters of letters, digits, '.', '_' or '-'."`
	TimeoutMs *int64 `json:"timeoutMs,omitempty" jsonschema:"Interrupt the run after this many milliseconds (default 30000)."`
}

// mcpCodeOut is a code run's answer; images of display outputs are sent as
// image content, not repeated here.
type mcpCodeOut struct {
	Stdout     string        `json:"stdout"`
	Stderr     string        `json:"stderr"`
	Result     *string       `json:"result"`
	Error      *interp.Error `json:"error"`
	Display    []mcpDisplay  `json:"display"`
	ContextID  string        `json:"contextId"`
	DurationMs int64         `json:"durationMs"`
	TimedOut   bool          `json:"timedOut"`
	Truncated  bool          `json:"truncated"`
	// As in run_command.
	StdoutDropped    int64 `json:"stdoutDropped"`
	StderrDropped    int64 `json:"stderrDropped"`
	StoppedForOutput bool  `json:"stoppedForOutput"`
}

type mcpDisplay struct {
	Mime string `json:"mime"`
	Data string `json:"data,omitempty" jsonschema:"The output (base64 for binary types); empty for an image sent as image content."`
}

type mcpPathIn struct {
	SessionID string `json:"sessionId" jsonschema:"The sandbox's session id."`
	Path      string `json:"path" jsonschema:"An absolute path in /workspace, e.g. /workspace/notes.txt."`
}

type mcpListFilesIn struct {
	SessionID string `json:"sessionId" jsonschema:"The sandbox's session id."`
	Path      string `json:"path,omitempty" jsonschema:"A directory in /workspace (default /workspace)."`
}

type mcpFilesOut struct {
	Entries   []workspace.Entry `json:"entries"`
	Truncated string            `json:"truncated,omitempty" jsonschema:"Why the list is incomplete (entries, size), if it is."`
}

type mcpWriteIn struct {
	SessionID string `json:"sessionId" jsonschema:"The sandbox's session id."`
	Path      string `json:"path" jsonschema:"An absolute path in /workspace; missing parent directories are created, an existing file is replaced."`
	Content   string `json:"content" jsonschema:"The file's content (the whole request is limited to the API's body limit, 1 MiB by default)."`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf-8 (default): content is the text; base64: content is base64 of the bytes."`
}

type mcpWriteOut struct {
	workspace.Entry
	Created bool `json:"created"`
}

type mcpArtifactIn struct {
	SessionID string `json:"sessionId" jsonschema:"The sandbox's session id."`
	Path      string `json:"path" jsonschema:"The artifact's path as list_artifacts shows it (relative to /workspace, e.g. out/report.pdf); /workspace/... works too."`
}

type mcpArtifactsOut struct {
	Artifacts []workspace.Artifact `json:"artifacts"`
	Truncated []string             `json:"truncated,omitempty" jsonschema:"Why the list is incomplete (bytes, depth, entries, size, time), if it is."`
}

// mcpFileOut is a file's (scrubbed) content: text as is, other bytes as
// base64; it is also sent as text, image or embedded resource content.
type mcpFileOut struct {
	Path      string `json:"path"`
	URI       string `json:"uri" jsonschema:"Where the REST API serves the whole file (with the same bearer token)."`
	MimeType  string `json:"mimeType"`
	Encoding  string `json:"encoding" jsonschema:"utf-8 or base64."`
	Content   string `json:"content"`
	Bytes     int    `json:"bytes" jsonschema:"Bytes of content (before base64)."`
	Truncated bool   `json:"truncated" jsonschema:"The file is longer than the 1 MiB a tool answers with; get it whole from uri."`
}

// addMCPTools registers every tool on s.mcp.srv.
func (s *Server) addMCPTools() {
	sizes := "The sandbox size: " + strings.Join(s.cfg.Sizes.Names(), ", ") + " (default standard-1). Larger sizes have more vCPUs, memory and disk and cost more credits."
	addTool(s, &mcp.Tool{Name: "create_sandbox", Title: "Create a sandbox",
		Description: "Create (provision) a new disposable Linux sandbox (Debian with Python, Node.js, git, a browser and an editor) and start it. " +
			"Its workspace is /workspace. Returns the sandbox object: sessionId, status (running), resources and portal URLs. " +
			"Needs the project.update permission.",
		InputSchema: schemaFor[mcpCreateIn](map[string]func(*jsonschema.Schema){"size": func(sc *jsonschema.Schema) { sc.Description = sizes }}),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: no(), OpenWorldHint: yes()},
	}, PermProjectUpdate, s.mcpCreate)
	addTool(s, &mcp.Tool{Name: "run_command", Title: "Run a shell command",
		Description: "Run a shell command in a running sandbox to completion and return its exit code, stdout and stderr " +
			"(output is capped: truncated says so, stdoutDropped and stderrDropped count the bytes left out, and a command that keeps writing " +
			"far past the cap is stopped: stoppedForOutput, exit code 141; secrets are redacted; redirect big output to a file). " +
			"A non-zero exit code is a normal result, not an error. " +
			"State on disk persists; each command starts a new shell. Needs project.update.",
	}, PermProjectUpdate, s.mcpRunCommand)
	addTool(s, &mcp.Tool{Name: "run_code", Title: "Run Python or Node.js code",
		Description: "Run code in a persistent code context (like a notebook kernel) of a running sandbox: variables and imports stay between calls " +
			"with the same contextId. Returns stdout, stderr, the value of the last expression (result), an exception (error) and rich display outputs; " +
			"images (e.g. matplotlib figures, which are captured automatically) are returned as image content. Needs project.update.",
		InputSchema: schemaFor[mcpCodeIn](map[string]func(*jsonschema.Schema){"language": enum("python", "node")}),
	}, PermProjectUpdate, s.mcpRunCode)
	addTool(s, &mcp.Tool{Name: "read_file", Title: "Read a file",
		Description: "Read a regular file of a sandbox's /workspace (also after teardown, from the saved workspace). Text comes back as text, " +
			"images as image content, other bytes base64 as an embedded resource; at most 1 MiB (truncated says when the file is longer). Secrets are redacted.",
		Annotations: readOnly,
	}, PermProjectRead, s.mcpReadFile)
	addTool(s, &mcp.Tool{Name: "write_file", Title: "Write a file",
		Description: "Create or replace a file in a running sandbox's /workspace (parent directories are created), owned by the sandbox's user. Needs project.update.",
		InputSchema: schemaFor[mcpWriteIn](map[string]func(*jsonschema.Schema){"encoding": enum("utf-8", "base64")}),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: yes(), IdempotentHint: true, OpenWorldHint: no()},
	}, PermProjectUpdate, s.mcpWriteFile)
	addTool(s, &mcp.Tool{Name: "list_files", Title: "List a directory",
		Description: "List a directory of a sandbox's /workspace: name, path, type (file, dir, symlink), size and modification time of each entry.",
		Annotations: readOnly,
	}, PermProjectRead, s.mcpListFiles)
	addTool(s, &mcp.Tool{Name: "list_artifacts", Title: "List artifacts",
		Description: "List every regular file under a sandbox's /workspace (recursively) with size, modification time and SHA-256; works while it runs and after teardown.",
		Annotations: readOnly,
	}, PermProjectRead, s.mcpListArtifacts)
	addTool(s, &mcp.Tool{Name: "get_artifact", Title: "Get an artifact",
		Description: "Fetch one artifact (a regular file of /workspace, path as list_artifacts shows it): text as text, images as image content, " +
			"other bytes base64 as an embedded resource; at most 1 MiB, the uri serves it whole.",
		Annotations: readOnly,
	}, PermProjectRead, s.mcpGetArtifact)
	addTool(s, &mcp.Tool{Name: "get_sandbox", Title: "Get a sandbox",
		Description: "A sandbox's status (provisioning, running, paused, stopping, stopped, failed), size, usage and URLs: terminal (WebSocket), " +
			"editor (VS Code), notebook (Jupyter), display (noVNC desktop), browser (Chrome DevTools) and portal; a person opens them with the same token or a ticket.",
		Annotations: readOnly,
	}, PermProjectRead, s.mcpGetSandbox)
	addTool(s, &mcp.Tool{Name: "list_sandboxes", Title: "List sandboxes",
		Description: "The organization's sandboxes, newest first, optionally only those with one status.",
		InputSchema: schemaFor[mcpListIn](map[string]func(*jsonschema.Schema){"status": enum(sandbox.Statuses...)}),
		Annotations: readOnly,
	}, PermProjectRead, s.mcpListSandboxes)
	addTool(s, &mcp.Tool{Name: "teardown_sandbox", Title: "Tear down a sandbox",
		Description: "Save a sandbox's workspace (files, installed packages) to storage and stop it, releasing its compute; running processes end. " +
			"Files stay readable (read_file, artifacts) and resume_sandbox brings it back. Idempotent. Needs project.update.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: yes(), IdempotentHint: true, OpenWorldHint: no()},
	}, PermProjectUpdate, s.mcpTeardown)
	addTool(s, &mcp.Tool{Name: "resume_sandbox", Title: "Resume a sandbox",
		Description: "Start a stopped (or paused) sandbox again with the same session id and its saved workspace. Needs project.update.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: no(), OpenWorldHint: no()},
	}, PermProjectUpdate, s.mcpResume)
}

func (s *Server) mcpCreate(ctx context.Context, call *mcpCall, in mcpCreateIn) (*mcp.CallToolResult, sandboxObject, error) {
	if in.SessionID == "" {
		in.SessionID = "mcp-" + newRequestID()[:16]
	}
	req := provisionRequest{SessionID: in.SessionID, Size: in.Size, GitRepo: in.GitRepo, GitBranch: in.GitBranch,
		Env: in.Env, Secrets: in.Secrets, IdleTimeoutSeconds: in.IdleTimeoutSeconds}
	size, err := s.validateProvision(&req)
	if err != nil {
		return nil, sandboxObject{}, err
	}
	call.sessionID = req.SessionID
	call.note("size", size.Name)
	ses, err := s.provisionChecked(ctx, call.caller.p, &req, size, call.note)
	if err != nil {
		return nil, sandboxObject{}, err
	}
	return nil, s.sandboxJSON(call.caller.origin, &ses), nil
}

func (s *Server) mcpRunCommand(ctx context.Context, call *mcpCall, in mcpCommandIn) (*mcp.CallToolResult, execResponse, error) {
	ses, err := s.mcpSession(ctx, call, in.SessionID)
	if err != nil {
		return nil, execResponse{}, err
	}
	call.note("action", "exec")
	out, err := s.execCommand(ctx, ses, &execRequest{Action: "exec", Command: in.Command, Cwd: in.Cwd, Env: in.Env,
		TimeoutMs: in.TimeoutMs, Stdin: in.Stdin}, call.note)
	return nil, out, err
}

// mcpImageTypes are the display outputs sent as image content.
var mcpImageTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

func (s *Server) mcpRunCode(ctx context.Context, call *mcpCall, in mcpCodeIn) (*mcp.CallToolResult, mcpCodeOut, error) {
	ses, err := s.mcpSession(ctx, call, in.SessionID)
	if err != nil {
		return nil, mcpCodeOut{}, err
	}
	if in.Language != "python" && in.Language != "node" {
		return nil, mcpCodeOut{}, badRequest("language: must be python or node")
	}
	call.note("language", in.Language)
	r, err := s.runCodeIn(ctx, ses, in.Language, &codeRequest{Code: in.Code, TimeoutMs: in.TimeoutMs, ContextID: in.ContextID}, call.note)
	if err != nil {
		return nil, mcpCodeOut{}, err
	}
	out := mcpCodeOut{Stdout: r.Stdout, Stderr: r.Stderr, Result: r.Result, Error: r.Error, Display: []mcpDisplay{},
		ContextID: r.ContextID, DurationMs: r.DurationMs, TimedOut: r.TimedOut, Truncated: r.Truncated,
		StdoutDropped: r.StdoutDropped, StderrDropped: r.StderrDropped, StoppedForOutput: r.StoppedForOutput}
	var images []mcp.Content
	for _, d := range r.Display {
		if slices.Contains(mcpImageTypes, d.Mime) {
			// Already scrubbed (runCodeIn); one that no longer decodes is
			// left as text.
			if b, err := base64.StdEncoding.DecodeString(d.Data); err == nil {
				images = append(images, &mcp.ImageContent{MIMEType: d.Mime, Data: b})
				out.Display = append(out.Display, mcpDisplay{Mime: d.Mime})
				continue
			}
		}
		out.Display = append(out.Display, mcpDisplay{Mime: d.Mime, Data: d.Data})
	}
	text, err := json.Marshal(out)
	if err != nil {
		return nil, mcpCodeOut{}, err
	}
	res := &mcp.CallToolResult{Content: append([]mcp.Content{&mcp.TextContent{Text: string(text)}}, images...)}
	return res, out, nil
}

func (s *Server) mcpReadFile(ctx context.Context, call *mcpCall, in mcpPathIn) (*mcp.CallToolResult, mcpFileOut, error) {
	rel, err := workspace.Rel(in.Path)
	if err != nil {
		return nil, mcpFileOut{}, err
	}
	return s.mcpRead(ctx, call, in.SessionID, rel, false)
}

func (s *Server) mcpGetArtifact(ctx context.Context, call *mcpCall, in mcpArtifactIn) (*mcp.CallToolResult, mcpFileOut, error) {
	p := in.Path
	if !strings.HasPrefix(p, "/") {
		p = "/workspace/" + p
	}
	rel, err := workspace.Rel(p)
	if err == nil && rel == "" {
		err = errdefs.Invalid("path: must name a file in /workspace").WithCode("invalid_path")
	}
	if err != nil {
		return nil, mcpFileOut{}, err
	}
	return s.mcpRead(ctx, call, in.SessionID, rel, true)
}

// mcpRead answers a regular file of the workspace (rel), scrubbed and
// capped at mcpFileBytes.
func (s *Server) mcpRead(ctx context.Context, call *mcpCall, id, rel string, artifact bool) (*mcp.CallToolResult, mcpFileOut, error) {
	if err := mcpSessionID(call, id); err != nil {
		return nil, mcpFileOut{}, err
	}
	var res *mcp.CallToolResult
	var out mcpFileOut
	err := s.useWorkspace(ctx, call.caller.p, id, false, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) error {
		shown := set.RedactString(strings.TrimSuffix("/workspace/"+rel, "/"))
		call.note("path", shown)
		f, kind, err := d.Open(rel)
		if err != nil {
			return err
		}
		defer f.Close()
		switch {
		case kind == workspace.KindFile:
		case kind == workspace.KindDir && artifact:
			return errdefs.NotFound("not a file; artifacts are regular files")
		case kind == workspace.KindDir:
			return errdefs.Invalid("path: a directory; list it with list_files").WithCode("invalid_path")
		default:
			return errdefs.Invalid("path: not a regular file").WithCode("invalid_path")
		}
		data, truncated, err := readScrubbed(f, set, mcpFileBytes)
		if err != nil {
			return err
		}
		call.note("bytes", len(data))
		res, out = fileResult(call.caller.origin, ses.SessionID, shown, data, truncated)
		return nil
	})
	return res, out, err
}

// readScrubbed reads f through set and keeps at most limit bytes of the
// redacted stream. It reads at most mcpScrubMargin past the limit; when it
// stops there, the bytes the scrubber still holds (which could begin a
// secret) are dropped, never flushed.
func readScrubbed(f io.Reader, set *scrub.Set, limit int) (data []byte, truncated bool, err error) {
	out := newCappedOutput(limit)
	w := set.NewWriter(out.stdoutWriter())
	lr := &io.LimitedReader{R: f, N: int64(limit) + mcpScrubMargin}
	if _, rerr, _ := workspace.CopyFile(w, lr); rerr != nil {
		return nil, false, rerr
	}
	if lr.N > 0 {
		w.Close() // the whole file: decide the held bytes
	} else {
		truncated = true
	}
	return out.stdout.Bytes(), truncated || out.truncated, nil
}

// fileResult is a file's answer: text as text content; images as image
// content; other bytes as an embedded resource (base64 on the wire).
func fileResult(origin *http.Request, sessionID, shown string, data []byte, truncated bool) (*mcp.CallToolResult, mcpFileOut) {
	if truncated {
		data = cutPartialRune(data)
	}
	uri := apiBase(origin) + "/v1/sandbox/" + url.PathEscape(sessionID) + "/artifacts"
	for _, seg := range strings.Split(strings.TrimPrefix(shown, "/workspace/"), "/") {
		uri += "/" + url.PathEscape(seg)
	}
	out := mcpFileOut{Path: shown, URI: uri, Bytes: len(data), Truncated: truncated, MimeType: http.DetectContentType(data)}
	if utf8.Valid(data) && bytes.IndexByte(data, 0) < 0 {
		out.Encoding, out.Content = "utf-8", string(data)
		if !strings.HasPrefix(out.MimeType, "text/") {
			out.MimeType = "text/plain; charset=utf-8"
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out.Content}}}, out
	}
	out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
	var c mcp.Content = &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: uri, MIMEType: out.MimeType, Blob: data}}
	if slices.Contains(mcpImageTypes, out.MimeType) && !truncated {
		c = &mcp.ImageContent{MIMEType: out.MimeType, Data: data}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{c}}, out
}

// cutPartialRune drops an incomplete UTF-8 sequence at the end of b.
func cutPartialRune(b []byte) []byte {
	for i := 1; i <= utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			return b
		}
	}
	return b
}

func (s *Server) mcpWriteFile(ctx context.Context, call *mcpCall, in mcpWriteIn) (*mcp.CallToolResult, mcpWriteOut, error) {
	if err := mcpSessionID(call, in.SessionID); err != nil {
		return nil, mcpWriteOut{}, err
	}
	rel, err := fileRel(in.Path)
	if err != nil {
		return nil, mcpWriteOut{}, err
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8":
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, mcpWriteOut{}, badRequest("content: not valid base64")
		}
	default:
		return nil, mcpWriteOut{}, badRequest("encoding: must be utf-8 or base64")
	}
	var out mcpWriteOut
	err = s.useWorkspace(ctx, call.caller.p, in.SessionID, true, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) error {
		call.note("path", set.RedactString(in.Path))
		e, created, n, err := d.Put(rel, bytes.NewReader(data))
		if err != nil {
			return err
		}
		call.note("bytes", n)
		out = mcpWriteOut{Entry: e, Created: created}
		return nil
	})
	return nil, out, err
}

func (s *Server) mcpListFiles(ctx context.Context, call *mcpCall, in mcpListFilesIn) (*mcp.CallToolResult, mcpFilesOut, error) {
	if in.Path == "" {
		in.Path = "/workspace"
	}
	if err := mcpSessionID(call, in.SessionID); err != nil {
		return nil, mcpFilesOut{}, err
	}
	rel, err := workspace.Rel(in.Path)
	if err != nil {
		return nil, mcpFilesOut{}, err
	}
	var out mcpFilesOut
	err = s.useWorkspace(ctx, call.caller.p, in.SessionID, false, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) error {
		call.note("path", set.RedactString(in.Path))
		f, kind, err := d.Open(rel)
		if err != nil {
			return err
		}
		defer f.Close()
		if kind != workspace.KindDir {
			return errdefs.Invalid("path: not a directory; read a file with read_file").WithCode("invalid_path")
		}
		list, truncated, err := d.List(f, rel)
		if err != nil {
			return err
		}
		if list == nil {
			list = []workspace.Entry{}
		}
		out = mcpFilesOut{Entries: list, Truncated: truncated}
		return nil
	})
	return nil, out, err
}

func (s *Server) mcpListArtifacts(ctx context.Context, call *mcpCall, in mcpSessionIn) (*mcp.CallToolResult, mcpArtifactsOut, error) {
	if err := mcpSessionID(call, in.SessionID); err != nil {
		return nil, mcpArtifactsOut{}, err
	}
	var out mcpArtifactsOut
	err := s.useWorkspace(ctx, call.caller.p, in.SessionID, false, func(ses *store.Session, d *workspace.Dir, set *scrub.Set) error {
		list, cut, err := d.Artifacts()
		if err != nil {
			return err
		}
		if list == nil {
			list = []workspace.Artifact{}
		}
		call.note("artifacts", len(list))
		out = mcpArtifactsOut{Artifacts: list, Truncated: cut}
		return nil
	})
	return nil, out, err
}

func (s *Server) mcpGetSandbox(ctx context.Context, call *mcpCall, in mcpSessionIn) (*mcp.CallToolResult, sandboxObject, error) {
	ses, err := s.mcpSession(ctx, call, in.SessionID)
	if err != nil {
		return nil, sandboxObject{}, err
	}
	return nil, s.sandboxJSON(call.caller.origin, ses), nil
}

func (s *Server) mcpListSandboxes(ctx context.Context, call *mcpCall, in mcpListIn) (*mcp.CallToolResult, mcpSandboxes, error) {
	if in.Status != "" && !slices.Contains(sandbox.Statuses, in.Status) {
		return nil, mcpSandboxes{}, badRequest("status: must be %s", strings.Join(sandbox.Statuses, ", "))
	}
	list, err := s.sessions.List(ctx, call.caller.p.Org.ID, in.Status)
	if err != nil {
		return nil, mcpSandboxes{}, err
	}
	out := mcpSandboxes{Sandboxes: make([]sandboxObject, 0, len(list))}
	for i := range list {
		out.Sandboxes = append(out.Sandboxes, s.sandboxJSON(call.caller.origin, &list[i]))
	}
	return nil, out, nil
}

func (s *Server) mcpTeardown(ctx context.Context, call *mcpCall, in mcpSessionIn) (*mcp.CallToolResult, sandboxObject, error) {
	if err := mcpSessionID(call, in.SessionID); err != nil {
		return nil, sandboxObject{}, err
	}
	ses, res, err := s.sessions.Teardown(ctx, call.caller.p.Org.ID, in.SessionID)
	if err != nil {
		return nil, sandboxObject{}, err
	}
	return nil, s.teardownJSON(call.caller.origin, &ses, res, call.note), nil
}

func (s *Server) mcpResume(ctx context.Context, call *mcpCall, in mcpSessionIn) (*mcp.CallToolResult, sandboxObject, error) {
	if err := mcpSessionID(call, in.SessionID); err != nil {
		return nil, sandboxObject{}, err
	}
	start := time.Now()
	ses, err := s.sessions.Resume(ctx, call.caller.p.Org.ID, in.SessionID)
	if err != nil {
		return nil, sandboxObject{}, err
	}
	s.startTook(call.note, start)
	return nil, s.sandboxJSON(call.caller.origin, &ses), nil
}
