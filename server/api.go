package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/web"
)

const (
	ctxRequestID  = "sandboxd.requestId"
	ctxPrincipal  = "sandboxd.principal"
	ctxOutcomeErr = "sandboxd.errorCode"
	ctxDetails    = "sandboxd.auditDetails"
	ctxSessionPK  = "sandboxd.sessionPK" // the session the request is about (sessionFor)
)

func requestID(c *gin.Context) string { return c.GetString(ctxRequestID) }

func principal(c *gin.Context) store.Principal {
	p, _ := c.Get(ctxPrincipal)
	pp, _ := p.(store.Principal)
	return pp
}

// auditDetail adds a key to the request's audit record.
func auditDetail(c *gin.Context, k string, v any) {
	m, _ := c.Get(ctxDetails)
	d, _ := m.(map[string]any)
	if d == nil {
		d = map[string]any{}
		c.Set(ctxDetails, d)
	}
	d[k] = v
}

// noteFn receives a detail for the audit record of the request (REST) or
// tool call (MCP) that the shared code runs for.
type noteFn func(k string, v any)

// ginNote notes into c's audit record.
func ginNote(c *gin.Context) noteFn { return func(k string, v any) { auditDetail(c, k, v) } }

func (s *Server) routes() *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	// Paths are exact: no redirects with HTML bodies, JSON 404s instead.
	e.RedirectTrailingSlash, e.RedirectFixedPath = false, false
	// The socket's address is the client unless a trusted proxy is configured.
	e.SetTrustedProxies(s.cfg.TrustedProxies)
	e.RemoteIPHeaders = []string{"X-Forwarded-For"}
	e.Use(s.recoverer, s.requestIDs, s.met.countRequests, s.limitAddress)
	e.NoRoute(func(c *gin.Context) { s.writeError(c, errdefs.NotFound("no such route")) })
	e.HandleMethodNotAllowed = true
	e.NoMethod(func(c *gin.Context) {
		s.writeError(c, errdefs.New(errdefs.ErrMethod, "method not allowed on this route"))
	})
	e.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	e.GET("/metrics", s.met.handler())
	e.GET("/v1/openapi.json", s.openapi)
	// The web console (web/): static files on the API's origin, never on
	// a portal origin (Handler sends those to the portal first).
	e.GET("/", func(c *gin.Context) { s.console.ServeIndex(c.Writer, c.Request) })
	e.GET(web.AssetsPrefix+"*file", func(c *gin.Context) {
		if !s.console.ServeAsset(c.Writer, c.Request, strings.TrimPrefix(c.Param("file"), "/")) {
			s.writeError(c, errdefs.NotFound("no such file"))
		}
	})

	v1 := e.Group("/v1", s.bodyLimit, s.authenticate, s.limitToken)
	op := func(method, path, action, perm string, h gin.HandlerFunc) {
		v1.Handle(method, path, s.audited(action), s.require(perm), h)
	}
	op("POST", "/sandbox", "sandbox.provision", PermProjectUpdate, s.provision)
	op("GET", "/sandbox", "sandbox.list", PermProjectRead, s.listSandboxes)
	op("GET", "/sandbox/:sessionId", "sandbox.get", PermProjectRead, s.getSandbox)
	op("POST", "/sandbox/:sessionId/teardown", "sandbox.teardown", PermProjectUpdate, s.teardown)
	op("POST", "/sandbox/:sessionId/resume", "sandbox.resume", PermProjectUpdate, s.resume)
	op("POST", "/sandbox/:sessionId/pause", "sandbox.pause", PermProjectUpdate, s.pause)
	op("DELETE", "/sandbox/:sessionId", "sandbox.delete", PermProjectUpdate, s.deleteSandbox)
	op("POST", "/sandbox/terminal/:sessionId", "sandbox.terminal", PermProjectUpdate, s.exec)
	op("POST", "/sandbox/python/:sessionId", "sandbox.python", PermProjectUpdate, s.runCode("python"))
	op("POST", "/sandbox/node/:sessionId", "sandbox.node", PermProjectUpdate, s.runCode("node"))
	op("GET", "/sandbox/terminal/:sessionId/ws", "sandbox.terminal_ws", PermProjectUpdate, s.terminalWS)
	op("POST", "/sandbox/:sessionId/tickets", "sandbox.ticket", PermProjectUpdate, s.createTicket)
	op("GET", "/sandbox/:sessionId/terminals", "sandbox.terminals", PermProjectRead, s.listTerminals)
	op("GET", "/sandbox/:sessionId/logs", "sandbox.logs", PermProjectRead, s.getLogs)
	op("GET", "/sandbox/:sessionId/stats", "sandbox.stats", PermProjectRead, s.getStats)
	op("GET", "/sandbox/:sessionId/logs/ws", "sandbox.logs_ws", PermProjectRead, s.logsWS)
	op("DELETE", "/sandbox/:sessionId/terminals/:terminalId", "sandbox.terminal_kill", PermProjectUpdate, s.killTerminal)
	op("GET", "/sandbox/:sessionId/files", "sandbox.files_get", PermProjectRead, s.getFiles)
	op("PUT", "/sandbox/:sessionId/files", "sandbox.files_put", PermProjectUpdate, s.putFile)
	op("DELETE", "/sandbox/:sessionId/files", "sandbox.files_delete", PermProjectUpdate, s.deleteFile)
	op("GET", "/sandbox/:sessionId/artifacts", "sandbox.artifacts_list", PermProjectRead, s.listArtifacts)
	op("GET", "/sandbox/:sessionId/artifacts/*path", "sandbox.artifact_get", PermProjectRead, s.getArtifact)

	// The portal: an API client's bearer token, or a browser's ticket that
	// is sent on to the session's portal origin. Each open is audited
	// (auditProxyOpen), not each request.
	// (CONNECT and TRACE are not proxied.)
	for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"} {
		e.Handle(m, proxyRoute, s.portalRedirect, s.authenticate, s.limitToken, s.require(PermProjectUpdate), s.proxyAPI)
	}

	// The Model Context Protocol (mcp.go): the same tokens; each tool call
	// checks its permission and is audited (mcp.<tool>).
	for _, m := range []string{"POST", "GET", "DELETE"} {
		e.Handle(m, "/mcp", s.bodyLimit, s.authenticate, s.limitToken, s.serveMCP)
	}

	op("GET", "/me", "me.get", "", s.me)
	op("PUT", "/me/github", "me.github_connect", "", s.connectGitHub)
	op("DELETE", "/me/github", "me.github_disconnect", "", s.disconnectGitHub)
	op("POST", "/tokens", "token.create", "", s.createToken)
	op("GET", "/tokens", "token.list", "", s.listTokens)
	op("DELETE", "/tokens/:id", "token.revoke", "", s.revokeToken)
	op("POST", "/orgs/:orgId/members", "member.add", PermOrgManage, s.addMember)
	op("GET", "/orgs/:orgId/members", "member.list", PermOrgManage, s.listMembers)
	op("PATCH", "/orgs/:orgId/members/:userId", "member.update", PermOrgManage, s.updateMember)
	op("DELETE", "/orgs/:orgId/members/:userId", "member.remove", PermOrgManage, s.removeMember)
	op("GET", "/audit", "audit.list", PermAuditRead, s.listAudit)
	op("GET", "/usage", "usage.get", PermProjectRead, s.getUsage)
	op("GET", "/sizes", "sizes.list", PermProjectRead, s.listSizes)
	op("PUT", "/orgs/:orgId/plan", "org.plan_set", PermOperate, s.setPlan)
	op("POST", "/orgs/:orgId/credits", "org.credits_grant", PermOperate, s.grantCredits)
	return e
}

func (s *Server) recoverer(c *gin.Context) {
	defer func() {
		if r := recover(); r != nil {
			if r == http.ErrAbortHandler {
				// A proxied body failed after its headers were sent:
				// net/http cuts the connection, so the client sees a
				// truncated answer rather than a complete-looking one.
				panic(r)
			}
			s.log.Error("panic", "requestId", requestID(c), "path", c.FullPath(), "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			status, code, msg := statusOf(nil) // internal
			answerError(c, status, code, msg)
		}
	}()
	c.Next()
}

func (s *Server) requestIDs(c *gin.Context) {
	id := newRequestID()
	c.Set(ctxRequestID, id)
	c.Header("X-Request-Id", id)
	c.Next()
}

func (s *Server) bodyLimit(c *gin.Context) {
	limit := s.cfg.Limits.MaxBodyBytes
	if c.Request.Method == http.MethodPut && c.FullPath() == filesRoute {
		limit = max(limit, maxUploadBytes) // file uploads (files.go)
	}
	if c.Request.ContentLength > limit {
		s.writeError(c, tooLarge(limit))
		return
	}
	if c.Request.Body != nil {
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, limit)
	}
	c.Next()
}

func (s *Server) authenticate(c *gin.Context) {
	// The scheme name is case-insensitive (RFC 7235).
	scheme, token, ok := strings.Cut(strings.TrimSpace(c.GetHeader("Authorization")), " ")
	if c.GetHeader("Authorization") == "" && websocket.IsWebSocketUpgrade(c.Request) && strings.HasSuffix(c.FullPath(), "/ws") {
		// Browsers cannot set headers on a WebSocket: a bearer token in
		// the subprotocol list, or a single-use ticket for this session.
		if t := wsToken(c.Request); t != "" {
			scheme, token, ok = "Bearer", t, true
		} else if tk := c.Query("ticket"); tk != "" {
			// A page of a foreign origin must not use the ticket up.
			if !s.originAllowed(c.Request) {
				s.writeError(c, errdefs.Forbidden("cross-origin WebSocket refused"))
				return
			}
			t, valid, err := s.redeemTicket(c.Request.Context(), tk)
			if err != nil {
				s.writeError(c, err)
				return
			}
			if valid && t.sessionID == c.Param("sessionId") {
				c.Set(ctxPrincipal, t.p)
				c.Next()
				return
			}
		}
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		s.auditDenied(c, http.StatusUnauthorized)
		s.writeError(c, errUnauthenticated)
		return
	}
	token = strings.TrimSpace(token)
	p, err := s.db.Authenticate(c.Request.Context(), token)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			s.writeError(c, err)
			return
		}
		// A revoked token is still attributed, so its org's admins see the attempt.
		if org, user, tok, err := s.db.TokenOwner(c.Request.Context(), token); err == nil {
			c.Set(ctxPrincipal, store.Principal{Org: store.Org{ID: org}, User: store.User{ID: user}, TokenID: tok})
		}
		s.auditDenied(c, http.StatusUnauthorized)
		s.writeError(c, errUnauthenticated)
		return
	}
	c.Set(ctxPrincipal, p)
	c.Next()
}

// auditDenied records a request that failed authentication: a bounded
// number per address, each of bounded size (what it names is the
// client's, unchecked).
func (s *Server) auditDenied(c *gin.Context, status int) {
	if _, ref := s.fair.deniedAudit.Admit(s.clientKey(c.Request)); ref != nil {
		s.met.auditDeniedDropped.Inc()
		return
	}
	p := principal(c)
	s.db.Audit(store.AuditRecord{
		Time: time.Now().UTC(), OrgID: p.Org.ID, UserID: p.User.ID, TokenID: p.TokenID,
		Action: "auth", SessionID: auditedSessionID(c),
		Outcome: "denied", Status: status, RemoteAddr: c.ClientIP(), RequestID: requestID(c),
		Details: map[string]any{"method": clip(c.Request.Method, 16), "path": clip(c.Request.URL.Path, maxAuditedPath)},
	})
}

// maxAuditedPath bounds a path kept in the audit log.
const maxAuditedPath = 256

// auditedSessionID is the request's session id as the audit log keeps it:
// "" when it is none a session could have.
func auditedSessionID(c *gin.Context) string {
	if id := c.Param("sessionId"); validSessionID(id) {
		return id
	}
	return ""
}

func (s *Server) require(perm string) gin.HandlerFunc {
	return func(c *gin.Context) {
		p := principal(c)
		if perm == PermOperate && !p.Operator || perm != PermOperate && perm != "" && !Can(p.Role, perm) {
			s.writeError(c, forbidden(perm))
			return
		}
		c.Next()
	}
}

// statusReads are the reads that consoles and dashboards poll: answered
// ones are not recorded (they would bury the log); denied and failed ones
// are.
var statusReads = map[string]bool{
	"sandbox.list": true, "sandbox.get": true, "sandbox.stats": true, "sandbox.terminals": true,
	"me.get": true, "sizes.list": true, "usage.get": true,
}

// audited writes one audit record per request once the handler is done:
// identity, action, session, outcome and status.

func (s *Server) audited(action string) gin.HandlerFunc {
	return func(c *gin.Context) {
		c.Next()
		status := c.Writer.Status()
		if statusReads[action] && status < 400 {
			return
		}
		outcome := "ok"
		switch {
		case status == http.StatusUnauthorized || status == http.StatusForbidden:
			outcome = "denied"
		case status >= 400:
			outcome = "error"
		}
		p := principal(c)
		d, _ := c.Get(ctxDetails)
		details, _ := d.(map[string]any)
		if code := c.GetString(ctxOutcomeErr); code != "" {
			if details == nil {
				details = map[string]any{}
			}
			details["error"] = code
		}
		s.auditSync(store.AuditRecord{
			Time: time.Now().UTC(), OrgID: p.Org.ID, UserID: p.User.ID, TokenID: p.TokenID,
			Action: action, SessionID: auditedSessionID(c), Outcome: outcome, Status: status,
			RemoteAddr: c.ClientIP(), RequestID: requestID(c), Details: details,
		})
	}
}

// auditSync writes a request's record before its answer is complete (the
// handler chain returns after it): a client that got an answer finds it
// audited, even if the server is killed right after.
func (s *Server) auditSync(rec store.AuditRecord) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.db.AuditSync(ctx, rec); err != nil {
		s.log.Error("audit", "action", rec.Action, "err", err)
	}
}

// decodeJSON reads a strict JSON object into v: unknown fields, trailing
// data and wrong types are 400 with the field named; a body over the limit
// is 413.
func decodeJSON(c *gin.Context, v any) error {
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooLarge(mbe.Limit)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return badRequest("the request body did not arrive in time")
		}
		return badRequest("could not read the request body")
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return badRequest("request body must be a JSON object")
	}
	// encoding/json would turn invalid bytes into U+FFFD: a secret or an
	// environment value would not be what the client sent.
	if !utf8.Valid(body) {
		return badRequest("request body is not valid UTF-8 (JSON text must be)")
	}
	if err := exactKeys(body, v); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body has data after the JSON object")
	}
	if trimmed[0] != '{' { // null, which decodes into a struct as nothing
		return badRequest("request body must be a JSON object")
	}
	return nil
}

// noFields accepts an empty body or an empty JSON object, for a route
// that takes no fields: anything else is 400 as for other routes.
func noFields(c *gin.Context) error {
	if c.Request.ContentLength == 0 {
		return nil
	}
	body, err := io.ReadAll(c.Request.Body)
	if err == nil && len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	c.Request.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
	var none struct{}
	return decodeJSON(c, &none)
}

// errReader returns its error (io.EOF for nil).
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) {
	if r.err == nil {
		return 0, io.EOF
	}
	return 0, r.err
}

// exactKeys rejects top-level keys that match a field only case-insensitively
// (encoding/json would accept "SIZE" for "size").
func exactKeys(body []byte, v any) error {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil // not an object: the strict decode reports it
	}
	allowed := map[string]bool{}
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			allowed[name] = true
		}
	}
	for k := range m {
		if !allowed[k] {
			return badRequest("unknown field %q", k)
		}
	}
	return nil
}

func jsonError(err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return badRequest("malformed JSON at byte %d", se.Offset)
	case errors.As(err, &te):
		if te.Field == "" {
			return badRequest("request body must be a JSON object")
		}
		want := jsonKind(te.Type.Kind().String())
		switch {
		case te.Type == reflect.TypeFor[json.Number]():
			want = "a number"
		case strings.HasPrefix(te.Value, "number") && want == "a number": // 1.5 for an integer
			want = "a whole number"
		}
		return badRequest("%s: must be %s", te.Field, want)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("malformed JSON: unexpected end of input")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return badRequest("unknown field %s", f)
	}
	return badRequest("malformed JSON")
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "map":
		return "an object"
	case "int", "int64", "uint64", "int32", "uint32", "int16", "uint16", "int8", "uint8", "uint":
		return "a number"
	case "float64", "float32":
		return "a number"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	}
	return "of another type"
}
