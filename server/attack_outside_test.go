package server

// Attacks from outside (issue 15): what a client of the API or of a portal
// origin can try without a sandbox of its own doing it. The real Gin
// engine and http.Server of Run (apiServer) on a loopback port, a real
// SQLite file, the fake runtime (its workspaces are plain directories, so
// file and symlink handling run for real). attack_real_e2e_test.go has
// the part that needs a real sandbox.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"sandboxd/server/config"
	"sandboxd/store"
)

// atkEnv: two organizations. Org A (the attacker's own, the bootstrap org
// whose owner operates the installation) has a running session and one
// member of each role; org B (the victim) has a running session whose id
// exists only there.
type atkEnv struct {
	*apiEnv
	addr string
	l    *capListener
	hs   *http.Server
	cl   *http.Client

	mine    string // org A's session
	tok     map[string]string
	orgA    store.Principal
	adminID string // org A's admin (not an operator)

	orgB     store.Principal
	tokB     string
	theirs   string // org B's session
	theirsCt string // its container id
}

const (
	atkMine   = "a-mine"
	atkTheirs = "zz-other-org-session"
)

func newAtkEnv(t *testing.T, tweak ...func(*config.Config)) *atkEnv {
	t.Helper()
	e := newAPIEnv(t, tweak...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs, capped := e.s.apiServer(ln)
	go hs.Serve(capped)
	t.Cleanup(func() { hs.Close() })
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	a := &atkEnv{apiEnv: e, addr: ln.Addr().String(), l: capped, hs: hs,
		cl:   &http.Client{Transport: tr, Timeout: 20 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		mine: atkMine, theirs: atkTheirs, orgA: e.owner,
		tok: map[string]string{store.RoleOwner: e.token}}
	for _, role := range []string{store.RoleAdmin, store.RoleDeveloper, store.RoleViewer} {
		u, tk := e.addMember(role)
		a.tok[role] = tk
		if role == store.RoleAdmin {
			a.adminID = u.ID
		}
	}
	e.provision(e.token, map[string]any{"sessionId": atkMine})
	b, tokB, err := e.db.CreateOrg(context.Background(), "victim-org", "victim")
	if err != nil {
		t.Fatal(err)
	}
	a.orgB, a.tokB = b, tokB
	if p, err := e.db.Authenticate(context.Background(), tokB); err != nil {
		t.Fatal(err)
	} else {
		a.orgB.TokenID = p.TokenID
	}
	o := e.provision(tokB, map[string]any{"sessionId": atkTheirs})
	if o.OrgID != b.Org.ID {
		t.Fatalf("victim session in org %s", o.OrgID)
	}
	ses, err := e.db.GetSession(context.Background(), b.Org.ID, atkTheirs)
	if err != nil {
		t.Fatal(err)
	}
	a.theirsCt = ses.ContainerID
	return a
}

// atkResp is an answer read off the wire.
type atkResp struct {
	status int
	hdr    http.Header
	body   []byte
}

// do sends one request to the loopback server. token "" sends none.
func (a *atkEnv) do(t testing.TB, method, target, token string, body io.Reader, hdr ...string) atkResp {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+a.addr+target, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "Host") {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := a.cl.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return atkResp{resp.StatusCode, resp.Header, b}
}

// contractErr checks r is the contract's error body (exactly code,
// message, requestId; the id also in X-Request-Id) with status and code,
// and returns the message.
func contractErr(t testing.TB, what string, r atkResp, status int, code string) string {
	t.Helper()
	if r.status != status {
		t.Errorf("%s: status %d, want %d; body %.300s", what, r.status, status, r.body)
		return ""
	}
	if ct := r.hdr.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s: content type %q", what, ct)
	}
	var raw map[string]map[string]any
	if err := json.Unmarshal(r.body, &raw); err != nil || len(raw) != 1 || raw["error"] == nil {
		t.Errorf("%s: error body %.300s: want exactly {\"error\":{...}}", what, r.body)
		return ""
	}
	eb := raw["error"]
	keys := make([]string, 0, len(eb))
	for k := range eb {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if !slices.Equal(keys, []string{"code", "message", "requestId"}) {
		t.Errorf("%s: error keys %v", what, keys)
	}
	msg, _ := eb["message"].(string)
	if eb["code"] != code || msg == "" {
		t.Errorf("%s: code %v message %q, want code %s", what, eb["code"], msg, code)
	}
	if rid, _ := eb["requestId"].(string); rid == "" || r.hdr.Get("X-Request-Id") != rid {
		t.Errorf("%s: requestId %q, X-Request-Id %q", what, rid, r.hdr.Get("X-Request-Id"))
	}
	return msg
}

// routeCase is what a route must answer to an attacker.
type routeCase struct {
	// public: why the route needs no token ("" = it needs one).
	public string
	// perm: the permission checked before the handler ("" = any member;
	// MCP checks each tool's, TestAttackMCPTools).
	perm string
	// crossOrg: why "another organization's object is 404" does not apply
	// ("" = it does: the route names a session, organization or token).
	crossOrg string
	// body and query: valid ones for the route (the checks must not stop
	// at a 400).
	body, query string
}

// routeCases has one entry per routed method and path: a new route fails
// TestAttackRouteTable until it is added here with what it must answer.
var routeCases = map[string]routeCase{
	"GET /healthz":                                        {public: "health check for load balancers: {\"status\":\"ok\"} only"},
	"GET /metrics":                                        {public: "Prometheus aggregates: counts by status and route, no organization, session or user"},
	"GET /v1/openapi.json":                                {public: "the API's published description"},
	"GET /":                                               {public: "the web console's page; it holds nothing until a token is pasted"},
	"GET /assets/*file":                                   {public: "the web console's bundled script, style and icon"},
	"POST /v1/sandbox":                                    {perm: PermProjectUpdate, crossOrg: "session ids are per organization: the same id makes the caller's own session", body: `{"sessionId":"x-new"}`},
	"GET /v1/sandbox":                                     {perm: PermProjectRead, crossOrg: "lists the caller's organization only (checked: no other organization's data)"},
	"GET /v1/sandbox/:sessionId":                          {perm: PermProjectRead},
	"POST /v1/sandbox/:sessionId/teardown":                {perm: PermProjectUpdate},
	"POST /v1/sandbox/:sessionId/resume":                  {perm: PermProjectUpdate},
	"POST /v1/sandbox/:sessionId/pause":                   {perm: PermProjectUpdate},
	"DELETE /v1/sandbox/:sessionId":                       {perm: PermProjectUpdate},
	"POST /v1/sandbox/terminal/:sessionId":                {perm: PermProjectUpdate, body: `{"action":"exec","command":"id"}`},
	"POST /v1/sandbox/python/:sessionId":                  {perm: PermProjectUpdate, body: `{"code":"1"}`},
	"POST /v1/sandbox/node/:sessionId":                    {perm: PermProjectUpdate, body: `{"code":"1"}`},
	"GET /v1/sandbox/terminal/:sessionId/ws":              {perm: PermProjectUpdate},
	"POST /v1/sandbox/:sessionId/tickets":                 {perm: PermProjectUpdate},
	"GET /v1/sandbox/:sessionId/terminals":                {perm: PermProjectRead},
	"GET /v1/sandbox/:sessionId/logs":                     {perm: PermProjectRead},
	"GET /v1/sandbox/:sessionId/stats":                    {perm: PermProjectRead},
	"GET /v1/sandbox/:sessionId/logs/ws":                  {perm: PermProjectRead},
	"DELETE /v1/sandbox/:sessionId/terminals/:terminalId": {perm: PermProjectUpdate},
	"GET /v1/sandbox/:sessionId/files":                    {perm: PermProjectRead, query: "?path=/workspace/README"},
	"PUT /v1/sandbox/:sessionId/files":                    {perm: PermProjectUpdate, body: "bytes", query: "?path=/workspace/new.txt"},
	"DELETE /v1/sandbox/:sessionId/files":                 {perm: PermProjectUpdate, query: "?path=/workspace/README"},
	"GET /v1/sandbox/:sessionId/artifacts":                {perm: PermProjectRead},
	"GET /v1/sandbox/:sessionId/artifacts/*path":          {perm: PermProjectRead},
	"GET " + proxyRoute:                                   {perm: PermProjectUpdate},
	"POST " + proxyRoute:                                  {perm: PermProjectUpdate, body: "bytes"},
	"PUT " + proxyRoute:                                   {perm: PermProjectUpdate, body: "bytes"},
	"PATCH " + proxyRoute:                                 {perm: PermProjectUpdate, body: "bytes"},
	"DELETE " + proxyRoute:                                {perm: PermProjectUpdate},
	"HEAD " + proxyRoute:                                  {perm: PermProjectUpdate},
	"OPTIONS " + proxyRoute:                               {perm: PermProjectUpdate},
	"POST /mcp":                                           {crossOrg: "each tool call checks its session (TestAttackMCPTools)", body: `{"jsonrpc":"2.0","id":1,"method":"ping"}`},
	"GET /mcp":                                            {crossOrg: "an MCP session is its token's only (TestMCPEdge)"},
	"DELETE /mcp":                                         {crossOrg: "an MCP session is its token's only (TestMCPEdge)"},
	"GET /v1/me":                                          {crossOrg: "the caller itself"},
	"PUT /v1/me/github":                                   {crossOrg: "the caller's own credential", body: `{"token":"ghp_attacker"}`},
	"DELETE /v1/me/github":                                {crossOrg: "the caller's own credential"},
	"POST /v1/tokens":                                     {crossOrg: "makes a token of the caller's own", body: `{"name":"x"}`},
	"GET /v1/tokens":                                      {crossOrg: "lists the caller's organization only (checked: no other organization's data)"},
	"DELETE /v1/tokens/:id":                               {},
	"POST /v1/orgs/:orgId/members":                        {perm: PermOrgManage, body: `{"name":"intruder","role":"owner"}`},
	"GET /v1/orgs/:orgId/members":                         {perm: PermOrgManage},
	"PATCH /v1/orgs/:orgId/members/:userId":               {perm: PermOrgManage, body: `{"role":"owner"}`},
	"DELETE /v1/orgs/:orgId/members/:userId":              {perm: PermOrgManage},
	"GET /v1/audit":                                       {perm: PermAuditRead, crossOrg: "lists the caller's organization only (checked: no other organization's data)"},
	"GET /v1/usage":                                       {perm: PermProjectRead, crossOrg: "the caller's organization only (checked: no other organization's data)"},
	"GET /v1/sizes":                                       {perm: PermProjectRead, crossOrg: "the installation's sizes, the same for everyone"},
	"PUT /v1/orgs/:orgId/plan":                            {perm: PermOperate, crossOrg: "operators act on every organization by design (TestAPIUsageAndOperators)", body: `{"plan":"free"}`},
	"POST /v1/orgs/:orgId/credits":                        {perm: PermOperate, crossOrg: "operators act on every organization by design (TestAPIUsageAndOperators)", body: `{"credits":1000}`},
}

// lacking is the role of the caller's own organization that lacks perm
// ("" when every role has it).
func lacking(perm string) string {
	switch perm {
	case PermProjectUpdate:
		return store.RoleViewer
	case PermOrgManage, PermAuditRead:
		return store.RoleDeveloper
	case PermOperate:
		return store.RoleAdmin // an owner-level role, but not an operator
	}
	return ""
}

var routeParam = regexp.MustCompile(`[:*][A-Za-z]+`)

// fill gives a route's parameters values: ids of the caller's own
// organization (own), of the victim's (theirs), or that never existed.
func (a *atkEnv) fill(path, which string) string {
	return routeParam.ReplaceAllStringFunc(path, func(p string) string {
		switch p {
		case ":sessionId":
			return map[string]string{"own": a.mine, "theirs": a.theirs, "never": "zz-never-existed"}[which]
		case ":orgId":
			return map[string]string{"own": a.orgA.Org.ID, "theirs": a.orgB.Org.ID, "never": "org_never_existed"}[which]
		case ":userId":
			return map[string]string{"own": a.adminID, "theirs": a.orgB.User.ID, "never": "usr_never_existed"}[which]
		case ":id":
			return map[string]string{"own": a.orgA.TokenID, "theirs": a.orgB.TokenID, "never": "tok_never_existed"}[which]
		case ":terminalId":
			return "t-none"
		case "*path":
			return "README"
		case "*rest":
			return "port/8000/"
		case "*file":
			return "app.js"
		}
		panic("no value for route parameter " + p)
	})
}

func (rc routeCase) reader() io.Reader {
	if rc.body == "" {
		return nil
	}
	return strings.NewReader(rc.body)
}

// victimMarkers are strings of org B's that no answer to org A may hold.
func (a *atkEnv) victimMarkers() []string {
	return []string{a.orgB.Org.ID, a.orgB.User.ID, a.orgB.TokenID, a.theirs, a.theirsCt, "victim"}
}

func (a *atkEnv) assertNoVictimData(t testing.TB, what string, body []byte) {
	t.Helper()
	for _, m := range a.victimMarkers() {
		if bytes.Contains(body, []byte(m)) {
			t.Errorf("%s: the answer holds the other organization's %q: %.400s", what, m, body)
		}
	}
}

// victimCalls are the fake runtime's calls on org B's sandbox that
// anything but its creation and state checks made.
func (a *atkEnv) victimCalls() []string {
	var out []string
	for _, c := range a.rt.CallsWith("") {
		if strings.Contains(c, a.theirsCt) && !strings.HasPrefix(c, "create ") && !strings.HasPrefix(c, "inspect ") && !strings.HasPrefix(c, "usage ") {
			out = append(out, c)
		}
	}
	return out
}

// TestAttackRouteTable walks every route the engine has: without a token
// it is 401 (but for the public ones, which show nothing of anyone's),
// with another organization's session, organization or token it is the
// same 404 as for an id that never existed, and with a role that lacks its
// permission it is 403 naming the permission. Nothing is done to either
// organization's sandbox.
func TestAttackRouteTable(t *testing.T) {
	a := newAtkEnv(t)
	routed := map[string]bool{}
	for _, r := range a.s.engine.Routes() {
		routed[r.Method+" "+r.Path] = true
	}
	for k := range routed {
		if _, ok := routeCases[k]; !ok {
			t.Errorf("route %s is not in routeCases: add what it must answer to an attacker", k)
		}
	}
	for k := range routeCases {
		if !routed[k] {
			t.Errorf("routeCases has %s, which is not routed", k)
		}
	}
	keys := make([]string, 0, len(routed))
	for k := range routed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	before := len(a.rt.CallsWith("exec")) + len(a.rt.CallsWith("destroy")) + len(a.rt.CallsWith("dial"))

	// First the listings: they show nothing of the other organization's.
	// (Before the attacks below, whose own requests name its ids in the
	// caller's audit log.)
	if err := a.db.FlushAudit(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		rc := routeCases[k]
		method, path, _ := strings.Cut(k, " ")
		if rc.crossOrg == "" || rc.public != "" || method != http.MethodGet || rc.perm == PermOperate || strings.HasSuffix(path, "/ws") || path == "/mcp" {
			continue
		}
		r := a.do(t, method, a.fill(path, "own")+rc.query, a.token, nil)
		if r.status >= 300 {
			t.Errorf("%s as the owner: %d %.300s", k, r.status, r.body)
		}
		a.assertNoVictimData(t, k, r.body)
	}

	for _, k := range keys {
		rc := routeCases[k]
		method, path, _ := strings.Cut(k, " ")
		upgrade := []string{}
		if strings.HasSuffix(path, "/ws") {
			upgrade = []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
		}
		own := a.fill(path, "own") + rc.query

		// No token.
		r := a.do(t, method, own, "", rc.reader(), upgrade...)
		if rc.public != "" {
			if r.status != http.StatusOK {
				t.Errorf("%s (public: %s): %d without a token", k, rc.public, r.status)
			}
			a.assertNoVictimData(t, k+" (public)", r.body)
			for _, m := range []string{a.orgA.Org.ID, a.orgA.User.ID, a.mine} {
				if bytes.Contains(r.body, []byte(m)) {
					t.Errorf("%s (public) shows %q", k, m)
				}
			}
			continue
		}
		if method == http.MethodHead {
			if r.status != http.StatusUnauthorized || len(r.body) != 0 {
				t.Errorf("%s without a token: %d %q", k, r.status, r.body)
			}
		} else {
			contractErr(t, k+" without a token", r, http.StatusUnauthorized, "unauthenticated")
		}
		// A token that is not one.
		if method != http.MethodHead {
			contractErr(t, k+" with a bad token", a.do(t, method, own, "sbx_not_a_token", rc.reader(), upgrade...), http.StatusUnauthorized, "unauthenticated")
		}

		// A role without the permission, on the caller's own objects.
		if role := lacking(rc.perm); role != "" {
			r := a.do(t, method, own, a.tok[role], rc.reader(), upgrade...)
			if method == http.MethodHead {
				if r.status != http.StatusForbidden {
					t.Errorf("%s as %s: %d", k, role, r.status)
				}
			} else if msg := contractErr(t, k+" as "+role, r, http.StatusForbidden, "forbidden"); msg != "" && !strings.Contains(msg, rc.perm) {
				t.Errorf("%s as %s: message %q does not name %s", k, role, msg, rc.perm)
			}
		}

		// Another organization's objects, as its peer's owner.
		if rc.crossOrg == "" {
			if !strings.ContainsAny(path, ":") {
				t.Errorf("%s: names no object, so crossOrg needs a reason", k)
				continue
			}
			theirs := a.do(t, method, a.fill(path, "theirs")+rc.query, a.token, rc.reader(), upgrade...)
			never := a.do(t, method, a.fill(path, "never")+rc.query, a.token, rc.reader(), upgrade...)
			if method == http.MethodHead {
				if theirs.status != http.StatusNotFound || never.status != http.StatusNotFound {
					t.Errorf("%s across organizations: %d (never existed: %d)", k, theirs.status, never.status)
				}
				continue
			}
			m1 := contractErr(t, k+" on the other organization's", theirs, http.StatusNotFound, "not_found")
			m2 := contractErr(t, k+" on an id that never existed", never, http.StatusNotFound, "not_found")
			if m1 != m2 {
				t.Errorf("%s: the other organization's object answers %q, one that never existed %q", k, m1, m2)
			}
			a.assertNoVictimData(t, k+" across organizations", theirs.body)
		}
	}

	// Members: the caller's own organization id with the other one's user.
	for _, m := range []string{"PATCH", "DELETE"} {
		p := "/v1/orgs/" + a.orgA.Org.ID + "/members/" + a.orgB.User.ID
		var body io.Reader
		if m == "PATCH" {
			body = strings.NewReader(`{"role":"viewer"}`)
		}
		contractErr(t, m+" another organization's member", a.do(t, m, p, a.token, body), http.StatusNotFound, "not_found")
	}

	// Nothing reached a sandbox: no command, no teardown, no portal dial.
	if after := len(a.rt.CallsWith("exec")) + len(a.rt.CallsWith("destroy")) + len(a.rt.CallsWith("dial")); after != before {
		t.Errorf("runtime calls during the attacks: %v", a.rt.CallsWith(""))
	}
	if c := a.victimCalls(); len(c) > 0 {
		t.Errorf("calls on the other organization's sandbox: %v", c)
	}
	for _, s := range []struct{ tok, id string }{{a.tokB, a.theirs}, {a.token, a.mine}} {
		if o := decodeBody[sandboxObject](t, a.get(s.tok, s.id), http.StatusOK); o.Status != "running" {
			t.Errorf("%s is %s after the attacks", s.id, o.Status)
		}
	}
	ms := decodeBody[struct {
		Members []struct{ Role string } `json:"members"`
	}](t, a.apiEnv.do("GET", "/v1/orgs/"+a.orgB.Org.ID+"/members", a.tokB, nil), http.StatusOK)
	if len(ms.Members) != 1 || ms.Members[0].Role != store.RoleOwner {
		t.Errorf("the other organization's members changed: %+v", ms.Members)
	}
	if p, err := a.db.Authenticate(context.Background(), a.tokB); err != nil || p.Role != store.RoleOwner {
		t.Errorf("the other organization's token: %+v %v", p, err)
	}
}

// mcpToolCases: the MCP endpoint is one route with many tools; each tool
// is listed with its permission and valid arguments (a new tool fails
// TestAttackMCPTools until it is added).
var mcpToolCases = map[string]struct {
	perm string
	args map[string]any
}{
	"create_sandbox":   {PermProjectUpdate, map[string]any{"sessionId": "x-mcp"}},
	"run_command":      {PermProjectUpdate, map[string]any{"command": "id"}},
	"run_code":         {PermProjectUpdate, map[string]any{"language": "python", "code": "1"}},
	"read_file":        {PermProjectRead, map[string]any{"path": "/workspace/README"}},
	"write_file":       {PermProjectUpdate, map[string]any{"path": "/workspace/x.txt", "content": "x"}},
	"list_files":       {PermProjectRead, map[string]any{}},
	"list_artifacts":   {PermProjectRead, map[string]any{}},
	"get_artifact":     {PermProjectRead, map[string]any{"path": "README"}},
	"get_sandbox":      {PermProjectRead, map[string]any{}},
	"list_sandboxes":   {PermProjectRead, map[string]any{}},
	"teardown_sandbox": {PermProjectUpdate, map[string]any{}},
	"resume_sandbox":   {PermProjectUpdate, map[string]any{}},
}

// TestAttackMCPTools: every MCP tool that names a session answers another
// organization's exactly as one that never existed, and every tool that
// needs project.update refuses a viewer, naming it. Generated from the
// server's own tools/list.
func TestAttackMCPTools(t *testing.T) {
	a := newAtkEnv(t)
	base := "http://" + a.addr
	owner := mcpConnect(t, base, a.token)
	viewer := mcpConnect(t, base, a.tok[store.RoleViewer])
	tools, err := owner.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	before := len(a.rt.CallsWith("exec")) + len(a.rt.CallsWith("destroy")) + len(a.rt.CallsWith("checkpoint"))
	for _, tool := range tools.Tools {
		seen[tool.Name] = true
		tc, ok := mcpToolCases[tool.Name]
		if !ok {
			t.Errorf("MCP tool %s is not in mcpToolCases", tool.Name)
			continue
		}
		props := map[string]any{}
		if b, err := json.Marshal(tool.InputSchema); err == nil {
			var sc struct {
				Properties map[string]any `json:"properties"`
			}
			json.Unmarshal(b, &sc)
			props = sc.Properties
		}
		args := func(session string) map[string]any {
			m := map[string]any{}
			for k, v := range tc.args {
				m[k] = v
			}
			if _, ok := props["sessionId"]; ok && session != "" {
				m["sessionId"] = session
			}
			return m
		}
		if tc.perm == PermProjectUpdate {
			if msg := mcpFail(t, viewer, tool.Name, args(a.mine)); msg != "forbidden: your role lacks the project.update permission" {
				t.Errorf("%s as a viewer: %q", tool.Name, msg)
			}
		}
		if _, named := props["sessionId"]; !named || tool.Name == "create_sandbox" {
			if tool.Name == "list_sandboxes" {
				res := mcpTool(t, owner, tool.Name, args(""))
				b, _ := json.Marshal(res)
				a.assertNoVictimData(t, "MCP "+tool.Name, b)
			}
			continue
		}
		theirs := mcpFail(t, owner, tool.Name, args(a.theirs))
		never := mcpFail(t, owner, tool.Name, args("zz-never-existed"))
		if theirs != never || !strings.HasPrefix(theirs, "not_found:") {
			t.Errorf("MCP %s: the other organization's session %q, one that never existed %q", tool.Name, theirs, never)
		}
		a.assertNoVictimData(t, "MCP "+tool.Name, []byte(theirs))
	}
	for name := range mcpToolCases {
		if !seen[name] {
			t.Errorf("mcpToolCases has %s, which the server does not list", name)
		}
	}
	if after := len(a.rt.CallsWith("exec")) + len(a.rt.CallsWith("destroy")) + len(a.rt.CallsWith("checkpoint")); after != before {
		t.Errorf("runtime calls during the attacks: %v", a.rt.CallsWith(""))
	}
	if c := a.victimCalls(); len(c) > 0 {
		t.Errorf("calls on the other organization's sandbox: %v", c)
	}
}
