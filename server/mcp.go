package server

// MCP: the Model Context Protocol at /mcp, streamable HTTP transport (POST
// for messages, GET for the server's stream, DELETE to end a session), with
// the official Go SDK. This file is the edge: who may (the /v1 bearer
// tokens, an MCP session bound to the token that started it), how much (the
// /v1 body limit, idle sessions closed, a cap of sessions per organization)
// and the audit record of every tool call. The tools (mcptools.go) run the
// same domain code as the REST handlers.
//
// Concurrency: the SDK serves sessions concurrently; mcpEdge's session table
// is guarded by its mutex, and the SDK's server is safe for concurrent use.

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandboxd/server/errdefs"
	"sandboxd/store"
)

const (
	// mcpSessionIdle closes an MCP session that got no request for this
	// long (a client's GET stream alone does not keep it).
	mcpSessionIdle = 15 * time.Minute
	// mcpSessionsPerOrg caps an organization's open MCP sessions; a new one
	// past it closes the organization's least recently used session.
	mcpSessionsPerOrg = 64
	// mcpSessionHeader names the MCP session of a request.
	mcpSessionHeader = "Mcp-Session-Id"
)

// mcpEdge is the server's MCP endpoint: the SDK's server (one, with every
// tool), its HTTP handler, and which token owns each open session.
type mcpEdge struct {
	srv     *mcp.Server
	handler http.Handler
	tools   map[string]bool // registered tool names, for audit actions

	mu     sync.Mutex
	owners map[string]*mcpOwner // by MCP session id
}

// mcpOwner is the identity that started an MCP session and when the session
// was last used.
type mcpOwner struct {
	org, token string
	last       time.Time
}

// mcpCaller is who sent the HTTP request that carries an MCP message: the
// authenticated principal, the request id and client address for the audit
// record, and the API origin the client addressed (for URLs).
type mcpCaller struct {
	p          store.Principal
	requestID  string
	remoteAddr string
	origin     *http.Request // Host and TLS only, for sandboxJSON
}

type mcpCallerKey struct{}

// newMCP builds the MCP server with its tools and its HTTP handler.
func (s *Server) newMCP() *mcpEdge {
	m := &mcpEdge{tools: map[string]bool{}, owners: map[string]*mcpOwner{}}
	// The SDK logs every session's start and end at info: warnings only.
	log := slog.New(warnOnly{s.log.With("component", "mcp").Handler()})
	m.srv = mcp.NewServer(&mcp.Implementation{Name: "sandboxd", Title: "sandboxd: disposable gVisor sandboxes", Version: "1"},
		&mcp.ServerOptions{Instructions: mcpInstructions, Logger: log})
	m.srv.AddReceivingMiddleware(s.mcpAudit)
	s.mcp = m
	s.addMCPTools()
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return m.srv }, &mcp.StreamableHTTPOptions{
		SessionTimeout:      mcpSessionIdle,
		MaxRequestBodyBytes: s.cfg.Limits.MaxBodyBytes,
		Logger:              log,
		// Every request needs a bearer token, which a page that rebinds a
		// name to the loopback address does not have; and a server behind
		// a reverse proxy on loopback sees its public host name.
		DisableLocalhostProtection: true,
	})
	// The request was authenticated by the edge (serveMCP); the SDK gets the
	// identity as its TokenInfo, whose UserID (the token) it binds sessions
	// to as well.
	verify := func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		c, _ := r.Context().Value(mcpCallerKey{}).(*mcpCaller)
		if c == nil {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: c.p.TokenID, Extra: map[string]any{"caller": c}}, nil
	}
	// Browsers' cross-origin writes are refused (Sec-Fetch-Site/Origin).
	m.handler = http.NewCrossOriginProtection().Handler(
		auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(sdk))
	return m
}

const mcpInstructions = `sandboxd runs disposable Linux sandboxes (gVisor) for you.
Start with create_sandbox (pick a sessionId, or get one generated), then use run_command for shell commands,
run_code for Python or Node.js whose state persists per contextId (matplotlib figures come back as images),
and read_file / write_file / list_files for files under /workspace. list_artifacts and get_artifact read the
workspace's files, also after teardown. teardown_sandbox saves the workspace and stops the sandbox;
resume_sandbox brings it back with its files. get_sandbox shows the status and the portal URLs
(terminal, editor, notebook, display, browser) a person can open. Secrets given at creation are redacted
from every output.`

// serveMCP: POST, GET and DELETE /mcp, after bodyLimit and authenticate.
func (s *Server) serveMCP(c *gin.Context) {
	p := principal(c)
	id := c.GetHeader(mcpSessionHeader)
	switch {
	case id != "":
		if !s.mcp.touch(id, p, time.Now()) {
			s.auditDenied(c, http.StatusForbidden)
			s.writeError(c, errdefs.Forbidden("this MCP session was started with another token; start a new session (initialize) with yours"))
			return
		}
	case c.Request.Method == http.MethodPost:
		s.mcp.makeRoom(p.Org.ID)
	}
	caller := &mcpCaller{p: p, requestID: requestID(c), remoteAddr: c.ClientIP(),
		origin: &http.Request{Host: c.Request.Host, TLS: c.Request.TLS}}
	// A tool call (a command may run an hour) or a stream outliving the
	// token is stopped.
	ctx, _, stop := s.whileAllowed(c.Request.Context(), p, PermProjectRead)
	defer stop()
	r := c.Request.WithContext(context.WithValue(ctx, mcpCallerKey{}, caller))
	w := &mcpWriter{ResponseWriter: c.Writer}
	if id == "" {
		// A new session's id is in the answer's header: bind it to the
		// token before the client can use it.
		w.onHeader = func(h http.Header) {
			if sid := h.Get(mcpSessionHeader); sid != "" {
				s.mcp.bind(sid, p, time.Now())
			}
		}
	}
	s.mcp.handler.ServeHTTP(w, r)
	w.finish(c)
}

// touch reports whether p may use MCP session id: yes unless the session is
// known and was started with another token (an unknown id is the SDK's to
// answer). It marks the session used.
func (m *mcpEdge) touch(id string, p store.Principal, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	o := m.owners[id]
	if o == nil {
		return true
	}
	if o.token != p.TokenID || o.org != p.Org.ID {
		return false
	}
	o.last = now
	return true
}

// bind records that p started MCP session id.
func (m *mcpEdge) bind(id string, p store.Principal, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.owners[id] = &mcpOwner{org: p.Org.ID, token: p.TokenID, last: now}
}

// makeRoom forgets sessions the SDK has closed (idle, deleted) and, when
// org has mcpSessionsPerOrg open, closes its least recently used ones so a
// new one fits. Closing waits for the session's calls in flight, so it
// runs in the background.
func (m *mcpEdge) makeRoom(org string) {
	live := map[string]*mcp.ServerSession{}
	for ss := range m.srv.Sessions() {
		live[ss.ID()] = ss
	}
	var victims []*mcp.ServerSession
	m.mu.Lock()
	var mine []string
	for id, o := range m.owners {
		switch {
		case live[id] == nil:
			delete(m.owners, id)
		case o.org == org:
			mine = append(mine, id)
		}
	}
	if n := len(mine) - (mcpSessionsPerOrg - 1); n > 0 {
		slices.SortFunc(mine, func(a, b string) int { return m.owners[a].last.Compare(m.owners[b].last) })
		for _, id := range mine[:n] {
			victims = append(victims, live[id])
			delete(m.owners, id)
		}
	}
	m.mu.Unlock()
	for _, ss := range victims {
		go ss.Close()
	}
}

// closeAll ends every MCP session (their GET streams too), waiting at most
// wait for calls in flight.
func (m *mcpEdge) closeAll(wait time.Duration) {
	var wg sync.WaitGroup
	for ss := range m.srv.Sessions() {
		wg.Go(func() { ss.Close() })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
	}
}

// warnOnly passes records of level warning and above.
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnOnly) WithAttrs(a []slog.Attr) slog.Handler { return warnOnly{h.Handler.WithAttrs(a)} }
func (h warnOnly) WithGroup(n string) slog.Handler      { return warnOnly{h.Handler.WithGroup(n)} }

// mcpWriter calls onHeader once, just before the response's header is
// sent.
type mcpWriter struct {
	http.ResponseWriter
	onHeader func(http.Header)
	sent     bool
	// The SDK answers malformed requests with http.Error's text/plain:
	// held back (status and text) and sent as the contract's JSON error
	// by finish.
	plainStatus int
	plain       bytes.Buffer
}

// finish sends a held-back text/plain error as the contract's error body.
func (w *mcpWriter) finish(c *gin.Context) {
	if w.plainStatus == 0 {
		return
	}
	h := w.Header()
	h.Del("Content-Type")
	h.Del("Content-Length")
	code := "invalid_request"
	if w.plainStatus >= 500 {
		code = "internal"
	}
	for _, k := range classes {
		if k.status == w.plainStatus {
			code = k.code
		}
	}
	answerError(c, w.plainStatus, code, strings.TrimSpace(w.plain.String()))
}

func (w *mcpWriter) header() {
	if !w.sent {
		w.sent = true
		if w.onHeader != nil {
			w.onHeader(w.Header())
		}
	}
}

func (w *mcpWriter) WriteHeader(code int) {
	if code >= 400 && !w.sent && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.plainStatus = code
		return
	}
	w.header()
	w.ResponseWriter.WriteHeader(code)
}

func (w *mcpWriter) Write(b []byte) (int, error) {
	if w.plainStatus != 0 {
		if w.plain.Len() < 4096 {
			w.plain.Write(b[:min(len(b), 4096-w.plain.Len())])
		}
		return len(b), nil
	}
	w.header()
	return w.ResponseWriter.Write(b)
}

func (w *mcpWriter) Flush() {
	if w.plainStatus != 0 {
		return
	}
	w.header()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *mcpWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// mcpCall is one tool call as its audit record sees it; the middleware puts
// it in the call's context and the tool fills it in.
type mcpCall struct {
	caller    *mcpCaller
	sessionID string
	details   map[string]any
}

type mcpCallKey struct{}

func (c *mcpCall) note(k string, v any) { c.details[k] = v }

// mcpToolError is a tool's failure: its text is the contract's code and
// public message; err (the class, and a cause for the log) stays here.
type mcpToolError struct {
	err  error
	text string
}

func (e *mcpToolError) Error() string { return e.text }
func (e *mcpToolError) Unwrap() error { return e.err }

// toolError turns a domain error into a tool error with its public message,
// logging what is not public as writeError does.
func (s *Server) toolError(call *mcpCall, err error) error {
	_, code, msg := statusOf(err)
	rid := ""
	if call != nil && call.caller != nil {
		rid = call.caller.requestID
	}
	if pe, ok := errdefs.Public(err); !ok {
		s.log.Error("mcp tool failed", "requestId", rid, "err", err)
		msg = "internal error; see the server log with request id " + rid
	} else if pe.Cause() != nil {
		s.log.Warn("mcp tool failed", "requestId", rid, "code", code, "err", pe.Cause())
	}
	return &mcpToolError{err: err, text: code + ": " + msg}
}

// mcpAudit wraps every tools/call: it gives the tool its mcpCall, answers a
// panic as an internal tool error, and writes one audit record (action
// mcp.<tool>, the identity, the session, outcome and the HTTP status the
// REST equivalent would have had).
func (s *Server) mcpAudit(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (res mcp.Result, err error) {
		ctr, ok := req.(*mcp.CallToolRequest)
		if method != "tools/call" || !ok || ctr.Params == nil {
			return next(ctx, method, req)
		}
		call := &mcpCall{details: map[string]any{}}
		if ctr.Extra != nil && ctr.Extra.TokenInfo != nil {
			call.caller, _ = ctr.Extra.TokenInfo.Extra["caller"].(*mcpCaller)
		}
		var args struct {
			SessionID any `json:"sessionId"`
		}
		json.Unmarshal(ctr.Params.Arguments, &args)
		if id, ok := args.SessionID.(string); ok && validSessionID(id) {
			call.sessionID = id
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					s.log.Error("mcp tool panic", "tool", ctr.Params.Name, "panic", r)
					tr := &mcp.CallToolResult{}
					tr.SetError(s.toolError(call, errPanic))
					res, err = tr, nil
				}
			}()
			res, err = next(context.WithValue(ctx, mcpCallKey{}, call), method, req)
		}()
		s.auditToolCall(call, ctr.Params.Name, res, err)
		return res, err
	}
}

// errPanic is the internal error a panicking tool answers with.
var errPanic = internalError("tool panicked")

type internalError string

func (e internalError) Error() string { return string(e) }

func (s *Server) auditToolCall(call *mcpCall, tool string, res mcp.Result, err error) {
	known := s.mcp.tools[tool]
	action := "mcp." + tool
	if !known {
		action = "mcp.unknown_tool"
		call.note("tool", clip(tool, 64))
	}
	status, outcome := http.StatusOK, "ok"
	tr, _ := res.(*mcp.CallToolResult)
	switch {
	case err != nil && !known:
		status, outcome = http.StatusNotFound, "error"
	case err != nil:
		status, outcome = http.StatusInternalServerError, "error"
	case tr != nil && tr.IsError:
		cause := tr.GetError()
		var code string
		if te, ok := cause.(*mcpToolError); ok {
			status, code, _ = statusOf(te.err)
		} else {
			// The SDK refused the arguments (its schema check).
			status, code = http.StatusBadRequest, "invalid_request"
		}
		call.note("error", code)
		outcome = "error"
		if status == http.StatusUnauthorized || status == http.StatusForbidden {
			outcome = "denied"
		}
	}
	var c mcpCaller
	if call.caller != nil {
		c = *call.caller
	}
	s.auditSync(store.AuditRecord{
		Time: time.Now().UTC(), OrgID: c.p.Org.ID, UserID: c.p.User.ID, TokenID: c.p.TokenID,
		Action: action, SessionID: call.sessionID, Outcome: outcome, Status: status,
		RemoteAddr: c.remoteAddr, RequestID: c.requestID, Details: call.details,
	})
}
