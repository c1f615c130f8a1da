package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/server/config"
	"sandboxd/server/sandbox/sandboxtest"
	"sandboxd/store"
)

// API tests: the real Gin handler and a real SQLite store, with a fake
// runtime that records what the server asks of it. No root, no gVisor.

type apiEnv struct {
	t     *testing.T
	s     *Server
	db    *store.DB
	rt    *sandboxtest.Runtime
	owner store.Principal
	token string // the owner's
	// dbDir holds the SQLite files.
	dbDir string
}

func newAPIEnv(t *testing.T, tweak ...func(*config.Config)) *apiEnv {
	t.Helper()
	clearConfigEnv(t)
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tweak {
		f(cfg)
	}
	return newAPIEnvWith(t, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// newAPIEnvWith is newAPIEnv for a config and logger the test made.
func newAPIEnvWith(t *testing.T, cfg *config.Config, log *slog.Logger) *apiEnv {
	t.Helper()
	dbDir := t.TempDir()
	db, err := store.Open(config.DBPath(dbDir))
	if err != nil {
		t.Fatal(err)
	}
	p, token, created, err := db.Bootstrap(context.Background(), "default", "owner", cfg.Plans.FirstOrg)
	if err != nil || !created {
		t.Fatalf("bootstrap: %v %v", created, err)
	}
	rt := &sandboxtest.Runtime{WorkspaceRoot: t.TempDir()}
	s, err := newServer(cfg, db, rt, "/fake/image", nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &apiEnv{t: t, s: s, db: db, rt: rt, owner: p, token: token, dbDir: dbDir}
}

type reqOpt func(*http.Request)

func withHeader(k, v string) reqOpt { return func(r *http.Request) { r.Header.Set(k, v) } }

func withRemote(addr string) reqOpt { return func(r *http.Request) { r.RemoteAddr = addr } }

// do sends a request; body is a string (sent as is), nil, or a value to
// marshal as JSON. token "" sends no Authorization header.
func (e *apiEnv) do(method, path, token string, body any, opts ...reqOpt) *httptest.ResponseRecorder {
	e.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case io.Reader:
		r = b
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		r = bytes.NewReader(j)
	}
	req := httptest.NewRequest(method, path, r)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, o := range opts {
		o(req)
	}
	rec := httptest.NewRecorder()
	e.s.Handler().ServeHTTP(rec, req)
	return rec
}

// apiError checks the contract's error body and returns its message.
func apiError(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) string {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("content type = %q", ct)
	}
	var raw map[string]map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatalf("error body %q: %v", rec.Body, err)
	}
	if len(raw) != 1 || raw["error"] == nil {
		t.Fatalf("error body %s: want exactly {\"error\":{...}}", rec.Body)
	}
	eb := raw["error"]
	keys := make([]string, 0, len(eb))
	for k := range eb {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"code", "message", "requestId"}) {
		t.Errorf("error keys = %v, want code, message, requestId", keys)
	}
	gotCode, _ := eb["code"].(string)
	msg, _ := eb["message"].(string)
	rid, _ := eb["requestId"].(string)
	if gotCode != code {
		t.Errorf("code = %q, want %q (message %q)", gotCode, code, msg)
	}
	if msg == "" {
		t.Error("empty message")
	}
	if rid == "" || rec.Header().Get("X-Request-Id") != rid {
		t.Errorf("requestId %q, X-Request-Id %q", rid, rec.Header().Get("X-Request-Id"))
	}
	return msg
}

func decodeBody[T any](t *testing.T, rec *httptest.ResponseRecorder, status int) T {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if rec.Header().Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id on a success")
	}
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	return v
}

func (e *apiEnv) provision(token string, body map[string]any) sandboxObject {
	e.t.Helper()
	return decodeBody[sandboxObject](e.t, e.do("POST", "/v1/sandbox", token, body), http.StatusCreated)
}

func (e *apiEnv) get(token, sid string) *httptest.ResponseRecorder {
	return e.do("GET", "/v1/sandbox/"+sid, token, nil)
}

func (e *apiEnv) exec(token, sid string, body any) *httptest.ResponseRecorder {
	return e.do("POST", "/v1/sandbox/terminal/"+sid, token, body)
}

func (e *apiEnv) list(token string) []sandboxObject {
	e.t.Helper()
	return decodeBody[struct {
		Sandboxes []sandboxObject `json:"sandboxes"`
	}](e.t, e.do("GET", "/v1/sandbox", token, nil), http.StatusOK).Sandboxes
}

func (e *apiEnv) addMember(role string) (store.User, string) {
	e.t.Helper()
	u, _, tok, err := e.db.AddMember(context.Background(), e.owner.Org.ID, role+"-user", role)
	if err != nil {
		e.t.Fatal(err)
	}
	return u, tok
}

func TestAPIAuthRequired(t *testing.T) {
	e := newAPIEnv(t)
	for _, h := range []string{"", "Bearer", "Bearer ", "Bearer   ", "Basic dXNlcjpwYXNz", "Bearer nope", "Bearer " + e.token + "x"} {
		rec := e.do("GET", "/v1/sandbox", "", nil, withHeader("Authorization", h))
		apiError(t, rec, http.StatusUnauthorized, "unauthenticated")
	}
	// The scheme is case-insensitive (RFC 7235).
	if rec := e.do("GET", "/v1/sandbox", "", nil, withHeader("Authorization", "bearer "+e.token)); rec.Code != http.StatusOK {
		t.Errorf("lowercase bearer: %d", rec.Code)
	}
	// Auth comes before validation and permission checks.
	apiError(t, e.do("POST", "/v1/sandbox", "bad", "{"), http.StatusUnauthorized, "unauthenticated")
	apiError(t, e.get("", "x"), http.StatusUnauthorized, "unauthenticated")
	if len(e.rt.CallsWith("")) != 0 {
		t.Errorf("runtime called: %v", e.rt.Calls)
	}
	// The good token works; the health check needs none.
	decodeBody[map[string]any](t, e.do("GET", "/v1/sandbox", e.token, nil), http.StatusOK)
	decodeBody[map[string]any](t, e.do("GET", "/healthz", "", nil), http.StatusOK)
	// Unknown routes and methods use the error body too.
	apiError(t, e.do("GET", "/v1/nothing", e.token, nil), http.StatusNotFound, "not_found")
	apiError(t, e.do("PUT", "/v1/sandbox", e.token, nil), http.StatusMethodNotAllowed, "method_not_allowed")
}

func TestAPIRequestIDsUnique(t *testing.T) {
	e := newAPIEnv(t)
	a := e.do("GET", "/v1/sandbox", e.token, nil).Header().Get("X-Request-Id")
	b := e.do("GET", "/v1/sandbox", e.token, nil).Header().Get("X-Request-Id")
	if a == "" || a == b {
		t.Errorf("request ids %q %q", a, b)
	}
}

func TestAPIMalformedBodies(t *testing.T) {
	e := newAPIEnv(t)
	cases := []struct {
		name, body, want string
	}{
		{"truncated", `{"sessionId":`, "malformed JSON"},
		{"syntax", `{sessionId: "a"}`, "malformed JSON"},
		{"not an object", `["a"]`, "JSON object"},
		{"string", `"a"`, "JSON object"},
		{"null", " null\n", "JSON object"}, // found by FuzzDecodeRequest
		{"empty", ``, "JSON object"},
		{"blank", "  \n ", "JSON object"},
		{"trailing data", `{"sessionId":"a"} {"x":1}`, "after the JSON object"},
		{"unknown field", `{"sessionId":"a","sessionID2":"b"}`, `unknown field "sessionID2"`},
		{"unknown nested type", `{"sessionId":"a","size":{"vcpus":2}}`, "size: must be a string"},
		{"wrong type string", `{"sessionId":123}`, "sessionId: must be a string"},
		{"wrong type number", `{"sessionId":"a","idleTimeoutSeconds":"60"}`, "idleTimeoutSeconds: must be a number"},
		{"fraction for an integer", `{"sessionId":"a","idleTimeoutSeconds":1.5}`, "idleTimeoutSeconds: must be a whole number"},
		{"wrong type map", `{"sessionId":"a","env":["A=1"]}`, "env: must be an object"},
		{"wrong type map value", `{"sessionId":"a","env":{"A":1}}`, "env"},
	}
	for _, c := range cases {
		rec := e.do("POST", "/v1/sandbox", e.token, c.body)
		msg := apiError(t, rec, http.StatusBadRequest, "invalid_request")
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s: message %q, want it to contain %q", c.name, msg, c.want)
		}
	}
	// Exec and token bodies are decoded the same way.
	msg := apiError(t, e.do("POST", "/v1/tokens", e.token, `{"name":"x","admin":true}`), http.StatusBadRequest, "invalid_request")
	if !strings.Contains(msg, `"admin"`) {
		t.Errorf("tokens unknown field: %q", msg)
	}
	if n := len(e.rt.CallsWith("create")); n != 0 {
		t.Errorf("Create called %d times", n)
	}
	if l := e.list(e.token); len(l) != 0 {
		t.Errorf("sessions after bad requests: %v", l)
	}
}

// TestAPITrailingCloser: a body with a closer after the object (`{...}]`,
// `{...}}`) is refused (dec.More() alone, once used, is false before '}' and
// ']', and accepted them).
func TestAPITrailingCloser(t *testing.T) {
	e := newAPIEnv(t)
	for i, body := range []string{`{"sessionId":"tc-1"}]`, `{"sessionId":"tc-2"}}`} {
		rec := e.do("POST", "/v1/sandbox", e.token, body)
		msg := apiError(t, rec, http.StatusBadRequest, "invalid_request")
		if !strings.Contains(msg, "after the JSON object") {
			t.Errorf("%d: message %q", i, msg)
		}
	}
}

func TestAPIBodyTooLarge(t *testing.T) {
	e := newAPIEnv(t)
	limit := e.s.cfg.Limits.MaxBodyBytes
	big := `{"sessionId":"big","env":{"A":"` + strings.Repeat("x", int(limit)) + `"}}`
	// With a Content-Length.
	apiError(t, e.do("POST", "/v1/sandbox", e.token, big), http.StatusRequestEntityTooLarge, "too_large")
	// Chunked (no Content-Length): the limit applies while reading.
	apiError(t, e.do("POST", "/v1/sandbox", e.token, io.MultiReader(strings.NewReader(big))),
		http.StatusRequestEntityTooLarge, "too_large")
	// Just at the limit is decoded (and here rejected for its content only).
	pad := int(limit) - len(`{"sessionId":"big","env":{"A":""}}`)
	atLimit := `{"sessionId":"big","env":{"A":"` + strings.Repeat("x", pad) + `"}}`
	if len(atLimit) != int(limit) {
		t.Fatalf("len %d", len(atLimit))
	}
	rec := e.do("POST", "/v1/sandbox", e.token, atLimit)
	if rec.Code == http.StatusRequestEntityTooLarge {
		t.Errorf("body of exactly maxBodyBytes rejected as too large")
	}
	if n := len(e.rt.CallsWith("create")); n > 1 {
		t.Errorf("Create called %d times", n)
	}
}

func TestAPIViewer(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "v-1"})
	viewer, vtok := e.addMember(store.RoleViewer)

	msg := apiError(t, e.do("POST", "/v1/sandbox", vtok, map[string]any{"sessionId": "v-2"}), http.StatusForbidden, "forbidden")
	if !strings.Contains(msg, PermProjectUpdate) {
		t.Errorf("message %q", msg)
	}
	apiError(t, e.exec(vtok, "v-1", map[string]any{"action": "exec", "command": "id"}), http.StatusForbidden, "forbidden")
	apiError(t, e.do("POST", "/v1/sandbox/v-1/teardown", vtok, nil), http.StatusForbidden, "forbidden")
	apiError(t, e.do("DELETE", "/v1/sandbox/v-1", vtok, nil), http.StatusForbidden, "forbidden")
	apiError(t, e.do("GET", "/v1/audit", vtok, nil), http.StatusForbidden, "forbidden")
	apiError(t, e.do("GET", "/v1/orgs/"+e.owner.Org.ID+"/members", vtok, nil), http.StatusForbidden, "forbidden")
	// Permission is checked before the body is read.
	apiError(t, e.do("POST", "/v1/sandbox", vtok, "{"), http.StatusForbidden, "forbidden")

	if l := e.list(vtok); len(l) != 1 || l[0].SessionID != "v-1" {
		t.Errorf("viewer list = %+v", l)
	}
	decodeBody[sandboxObject](t, e.get(vtok, "v-1"), http.StatusOK)
	me := decodeBody[map[string]any](t, e.do("GET", "/v1/me", vtok, nil), http.StatusOK)
	if me["role"] != "viewer" || fmt.Sprint(me["permissions"]) != "[project.read]" {
		t.Errorf("viewer /v1/me = %v", me)
	}
	if u, _ := me["user"].(map[string]any); u["id"] != viewer.ID {
		t.Errorf("viewer /v1/me user = %v", me["user"])
	}
	if n := len(e.rt.CallsWith("create")); n != 1 {
		t.Errorf("Create called %d times", n)
	}
	if n := len(e.rt.CallsWith("exec")) + len(e.rt.CallsWith("destroy")); n != 0 {
		t.Errorf("runtime calls by a viewer: %v", e.rt.Calls)
	}
	// A developer may provision and exec, but not read the audit log.
	_, dtok := e.addMember(store.RoleDeveloper)
	e.provision(dtok, map[string]any{"sessionId": "d-1"})
	decodeBody[execResponse](t, e.exec(dtok, "d-1", map[string]any{"action": "exec", "command": "id"}), http.StatusOK)
	apiError(t, e.do("GET", "/v1/audit", dtok, nil), http.StatusForbidden, "forbidden")
}

func TestAPICrossOrg(t *testing.T) {
	e := newAPIEnv(t)
	other, otok, err := e.db.CreateOrg(context.Background(), "other", "mallory")
	if err != nil {
		t.Fatal(err)
	}
	theirs := e.provision(otok, map[string]any{"sessionId": "shared"})
	if theirs.OrgID != other.Org.ID {
		t.Fatalf("org = %s", theirs.OrgID)
	}
	unknownMsg := apiError(t, e.get(e.token, "never-existed"), http.StatusNotFound, "not_found")
	crossMsg := apiError(t, e.get(e.token, "shared"), http.StatusNotFound, "not_found")
	if unknownMsg != crossMsg {
		t.Errorf("cross-org 404 %q differs from unknown-id 404 %q", crossMsg, unknownMsg)
	}
	// Nothing else reaches the other org's session either.
	apiError(t, e.exec(e.token, "shared", map[string]any{"action": "exec", "command": "id"}), http.StatusNotFound, "not_found")
	apiError(t, e.do("POST", "/v1/sandbox/shared/teardown", e.token, nil), http.StatusNotFound, "not_found")
	apiError(t, e.do("DELETE", "/v1/sandbox/shared", e.token, nil), http.StatusNotFound, "not_found")
	if l := e.list(e.token); len(l) != 0 {
		t.Errorf("owner sees %+v", l)
	}
	if n := len(e.rt.CallsWith("exec")) + len(e.rt.CallsWith("destroy")); n != 0 {
		t.Errorf("runtime calls across orgs: %v", e.rt.Calls)
	}
	// Session ids are per organization: the owner may use the same one, and
	// gets a different container.
	mine := e.provision(e.token, map[string]any{"sessionId": "shared"})
	if mine.OrgID != e.owner.Org.ID || e.rt.Created[0].ID == e.rt.Created[1].ID {
		t.Errorf("same session id in two orgs: %+v %v", mine, e.rt.Created)
	}
	// The other org's session is untouched.
	if sb := decodeBody[sandboxObject](t, e.get(otok, "shared"), http.StatusOK); sb.Status != "running" || sb.OrgID != other.Org.ID {
		t.Errorf("theirs = %+v", sb)
	}
	// Members of another org are managed only there.
	apiError(t, e.do("GET", "/v1/orgs/"+other.Org.ID+"/members", e.token, nil), http.StatusNotFound, "not_found")
}

type auditJSON struct {
	Time       time.Time      `json:"time"`
	OrgID      string         `json:"orgId"`
	UserID     string         `json:"userId"`
	TokenID    string         `json:"tokenId"`
	Action     string         `json:"action"`
	SessionID  string         `json:"sessionId"`
	Outcome    string         `json:"outcome"`
	Status     int            `json:"status"`
	RemoteAddr string         `json:"remoteAddr"`
	RequestID  string         `json:"requestId"`
	Details    map[string]any `json:"details"`
}

func TestAPIAudit(t *testing.T) {
	e := newAPIEnv(t)
	viewer, vtok := e.addMember(store.RoleViewer)
	remote := withRemote("203.0.113.7:41000")
	spoof := withHeader("X-Forwarded-For", "198.51.100.99")

	ok := e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "aud-1", "size": "small"}, remote, spoof)
	decodeBody[sandboxObject](t, ok, http.StatusCreated)
	notFound := e.do("GET", "/v1/sandbox/missing", e.token, nil, remote, spoof)
	apiError(t, notFound, http.StatusNotFound, "not_found")
	denied := e.do("POST", "/v1/sandbox", vtok, map[string]any{"sessionId": "aud-2"}, remote, spoof)
	apiError(t, denied, http.StatusForbidden, "forbidden")
	unauth := e.do("GET", "/v1/sandbox/aud-1", "wrong-token", nil, remote, spoof)
	apiError(t, unauth, http.StatusUnauthorized, "unauthenticated")

	if err := e.db.FlushAudit(context.Background()); err != nil {
		t.Fatal(err)
	}
	recs := decodeBody[struct {
		Records []auditJSON `json:"records"`
	}](t, e.do("GET", "/v1/audit", e.token, nil), http.StatusOK).Records
	byReq := map[string]auditJSON{}
	for _, r := range recs {
		byReq[r.RequestID] = r
		if r.OrgID != e.owner.Org.ID {
			t.Errorf("record of another org listed: %+v", r)
		}
	}
	check := func(rec *httptest.ResponseRecorder, action, outcome string, status int, userID, tokenID, sessionID, errCode string) {
		t.Helper()
		rid := rec.Header().Get("X-Request-Id")
		r, found := byReq[rid]
		if !found {
			t.Errorf("no audit record for %s (request %s); have %+v", action, rid, recs)
			return
		}
		if r.Action != action || r.Outcome != outcome || r.Status != status || r.UserID != userID ||
			r.TokenID != tokenID || r.SessionID != sessionID || r.Time.IsZero() {
			t.Errorf("audit record = %+v; want %s %s %d user %s token %s session %q",
				r, action, outcome, status, userID, tokenID, sessionID)
		}
		// The socket address without port; X-Forwarded-For is ignored
		// without trusted proxies.
		if r.RemoteAddr != "203.0.113.7" {
			t.Errorf("%s: remoteAddr = %q, want 203.0.113.7", action, r.RemoteAddr)
		}
		if got, _ := r.Details["error"].(string); got != errCode {
			t.Errorf("%s: details.error = %q, want %q", action, got, errCode)
		}
	}
	check(ok, "sandbox.provision", "ok", 201, e.owner.User.ID, e.owner.TokenID, "aud-1", "")
	check(notFound, "sandbox.get", "error", 404, e.owner.User.ID, e.owner.TokenID, "missing", "not_found")
	vp, err := e.db.Authenticate(context.Background(), vtok)
	if err != nil {
		t.Fatal(err)
	}
	check(denied, "sandbox.provision", "denied", 403, viewer.ID, vp.TokenID, "", "forbidden")
	if byReq[ok.Header().Get("X-Request-Id")].Details["size"] != "standard-2" {
		t.Errorf("provision details = %v", byReq[ok.Header().Get("X-Request-Id")].Details)
	}
	// Newest first.
	for i := 1; i < len(recs); i++ {
		if recs[i].Time.After(recs[i-1].Time) {
			t.Errorf("records not newest first at %d", i)
		}
	}

	// The 401 has no organization, so it is not in any org's listing; it is
	// in the log.
	if _, listed := byReq[unauth.Header().Get("X-Request-Id")]; listed {
		t.Error("unauthenticated request listed in the org's audit log")
	}
	all, err := e.db.ListAudit(context.Background(), store.AuditFilter{Action: "auth"})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 {
		t.Fatalf("auth records = %+v", all)
	}
	a := all[0]
	if a.Outcome != "denied" || a.Status != 401 || a.RemoteAddr != "203.0.113.7" || a.UserID != "" ||
		a.RequestID != unauth.Header().Get("X-Request-Id") || a.SessionID != "aud-1" {
		t.Errorf("auth record = %+v", a)
	}

	// Filters.
	filtered := decodeBody[struct {
		Records []auditJSON `json:"records"`
	}](t, e.do("GET", "/v1/audit?action=sandbox.get&limit=5", e.token, nil), http.StatusOK).Records
	if len(filtered) != 1 || filtered[0].SessionID != "missing" {
		t.Errorf("filtered = %+v", filtered)
	}
	apiError(t, e.do("GET", "/v1/audit?limit=0", e.token, nil), http.StatusBadRequest, "invalid_request")
	apiError(t, e.do("GET", "/v1/audit?since=yesterday", e.token, nil), http.StatusBadRequest, "invalid_request")
	apiError(t, e.do("GET", "/v1/audit", vtok, nil), http.StatusForbidden, "forbidden")
}

func TestAPITrustedProxy(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) { c.TrustedProxies = []string{"203.0.113.7"} })
	rec := e.do("GET", "/v1/tokens", e.token, nil, withRemote("203.0.113.7:41000"), withHeader("X-Forwarded-For", "198.51.100.99"))
	untrusted := e.do("GET", "/v1/tokens", e.token, nil, withRemote("203.0.113.8:41000"), withHeader("X-Forwarded-For", "198.51.100.99"))
	if err := e.db.FlushAudit(context.Background()); err != nil {
		t.Fatal(err)
	}
	recs, err := e.db.ListAudit(context.Background(), store.AuditFilter{OrgID: e.owner.Org.ID})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range recs {
		got[r.RequestID] = r.RemoteAddr
	}
	if a := got[rec.Header().Get("X-Request-Id")]; a != "198.51.100.99" {
		t.Errorf("via trusted proxy: remoteAddr = %q", a)
	}
	if a := got[untrusted.Header().Get("X-Request-Id")]; a != "203.0.113.8" {
		t.Errorf("via untrusted peer: remoteAddr = %q", a)
	}
}

// clearConfigEnv makes the test independent of the caller's environment.
func clearConfigEnv(t *testing.T) {
	for _, k := range config.EnvVars {
		t.Setenv(k, "")
	}
}

// writeTempFile writes content to a new file in a temporary directory.
func writeTempFile(t *testing.T, name, content string) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A handler that panics is answered 500 internal with the request id, and
// the log has the panic and its stack.
func TestAPIPanicRecovered(t *testing.T) {
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	e := newAPIEnvWith(t, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	e.s.engine.GET("/v1/boom", func(c *gin.Context) { panic("kaboom") })
	rec := e.do("GET", "/v1/boom", e.token, nil)
	apiError(t, rec, http.StatusInternalServerError, "internal")
	if out := logs.String(); !strings.Contains(out, "kaboom") || !strings.Contains(out, "TestAPIPanicRecovered") ||
		!strings.Contains(out, rec.Header().Get("X-Request-Id")) {
		t.Fatalf("log lacks the panic, its stack or the request id:\n%s", out)
	}
}

func TestAPIStrictKeysAndPaths(t *testing.T) {
	e := newAPIEnv(t)
	msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, `{"sessionId":"k1","SIZE":"bad"}`), http.StatusBadRequest, "invalid_request")
	if !strings.Contains(msg, "SIZE") {
		t.Errorf("message does not name the field: %q", msg)
	}
	e.provision(e.token, map[string]any{"sessionId": "k1"})
	rec := e.do("GET", "/v1/sandbox/k1/", e.token, nil)
	apiError(t, rec, http.StatusNotFound, "not_found")
}

// Failed authentications from one address write a bounded number of audit
// records, each of bounded size: a client without a token cannot fill the
// data dir's disk through the audit log (found by a review in session 21:
// 30 KB paths, 6 MiB/s of database growth from one client).
func TestAuditDeniedBounded(t *testing.T) {
	e := newAPIEnv(t)
	long := strings.Repeat("a", 30000)
	for range 150 {
		w := e.do("GET", "/v1/sandbox/"+long+"/artifacts/"+long, "", nil, withRemote("198.51.100.9:4000"))
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("%d %s", w.Code, w.Body)
		}
	}
	w := e.do("GET", "/v1/sandbox/s-ok/files", "", nil, withRemote("198.51.100.10:4000")) // another address: its own budget
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if err := e.db.FlushAudit(context.Background()); err != nil {
		t.Fatal(err)
	}
	recs, err := e.db.ListAudit(context.Background(), store.AuditFilter{Action: "auth", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var fromFlood, size int
	for _, r := range recs {
		if r.RemoteAddr == "198.51.100.10" {
			if r.SessionID != "s-ok" || r.Details["path"] != "/v1/sandbox/s-ok/files" {
				t.Errorf("an ordinary denial: %+v", r)
			}
			continue
		}
		fromFlood++
		b, _ := json.Marshal(r)
		size += len(b)
		if r.SessionID != "" {
			t.Errorf("an impossible session id kept: %.60s", r.SessionID)
		}
	}
	if fromFlood < deniedAuditBurst || fromFlood > deniedAuditBurst+3 || size > fromFlood*1024 {
		t.Errorf("%d records, %d bytes, from one address's 150 denials", fromFlood, size)
	}
	if n := metricValue(t, e, `sandboxd_audit_denied_dropped_total`); n < 150-deniedAuditBurst-3 {
		t.Errorf("sandboxd_audit_denied_dropped_total = %v", n)
	}
}
