package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"sandboxd/runsc"
	"sandboxd/store"
)

// bearer adds a token to every request of the SDK's client.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpConnect opens an MCP session at base/mcp with token, using the SDK's
// own client; it is closed (DELETE) when the test ends.
func mcpConnect(t testing.TB, base, token string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "sandboxd-test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: bearer{token}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("mcp connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// mcpTool calls a tool; a protocol error fails the test.
func mcpTool(t testing.TB, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

// mcpOK calls a tool that must succeed and decodes its structured output.
func mcpOK[T any](t testing.TB, cs *mcp.ClientSession, name string, args map[string]any) (T, *mcp.CallToolResult) {
	t.Helper()
	res := mcpTool(t, cs, name, args)
	var out T
	if res.IsError {
		t.Fatalf("%s(%v): tool error %s", name, args, mcpText(res))
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: structured content %s: %v", name, b, err)
	}
	return out, res
}

// mcpFail calls a tool that must fail and returns its message.
func mcpFail(t testing.TB, cs *mcp.ClientSession, name string, args map[string]any) string {
	t.Helper()
	res := mcpTool(t, cs, name, args)
	if !res.IsError {
		t.Fatalf("%s(%v) succeeded, want a tool error: %s", name, args, mcpText(res))
	}
	return mcpText(res)
}

// mcpText is the text content of a result.
func mcpText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mcpRaw sends one JSON-RPC message to /mcp as a client would.
func mcpRaw(t testing.TB, base, method, token, session string, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, base+"/mcp", strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// contractError checks resp is the contract's error body with code.
func contractError(t testing.TB, resp *http.Response, status int, code string) string {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb errorBody
	if resp.StatusCode != status || json.Unmarshal(b, &eb) != nil || eb.Error.Code != code || eb.Error.RequestID == "" {
		t.Fatalf("got %d %s, want %d with code %s", resp.StatusCode, b, status, code)
	}
	return eb.Error.Message
}

const toolsList = `{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{}}`

// TestMCPEdge runs the MCP endpoint on the fake driver: tools, permissions,
// the session's owner, scrubbing, errors and the audit records.
func TestMCPEdge(t *testing.T) {
	e := newAPIEnv(t)
	ts := httptest.NewServer(e.s.Handler())
	t.Cleanup(ts.Close)
	cs := mcpConnect(t, ts.URL, e.token)

	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" || tl.InputSchema == nil {
			t.Errorf("%s: no description or schema", tl.Name)
		}
	}
	slices.Sort(names)
	want := []string{"create_sandbox", "get_artifact", "get_sandbox", "list_artifacts", "list_files", "list_sandboxes",
		"read_file", "resume_sandbox", "run_code", "run_command", "teardown_sandbox", "write_file"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	secret := "s3cr3t-Value-42"
	sb, _ := mcpOK[sandboxObject](t, cs, "create_sandbox", map[string]any{"sessionId": "m1", "size": "standard-1",
		"secrets": map[string]string{"API_KEY": secret}})
	if sb.SessionID != "m1" || sb.Status != "running" || sb.URLs["editor"] != ts.URL+"/v1/sandbox/proxy/m1/editor/" {
		t.Fatalf("create: %+v", sb)
	}
	if msg := mcpFail(t, cs, "create_sandbox", map[string]any{"sessionId": "m1"}); !strings.HasPrefix(msg, "conflict: ") {
		t.Errorf("reused id: %q", msg)
	}
	if msg := mcpFail(t, cs, "create_sandbox", map[string]any{"sessionId": "m2", "size": "huge"}); !strings.HasPrefix(msg, "invalid_size: ") {
		t.Errorf("bad size: %q", msg)
	}
	gen, _ := mcpOK[sandboxObject](t, cs, "create_sandbox", map[string]any{})
	if !strings.HasPrefix(gen.SessionID, "mcp-") {
		t.Errorf("generated id %q", gen.SessionID)
	}

	// The fake sandbox echoes the secret; the exit code passes through.
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		io.WriteString(req.Stdout, "key="+secret+"\n")
		return runsc.ExecResult{ExitCode: 3}, nil
	}
	out, res := mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "m1", "command": "echo $API_KEY; exit 3"})
	if out.ExitCode != 3 || strings.Contains(out.Stdout, secret) || !strings.Contains(out.Stdout, "REDACTED") || strings.Contains(mcpText(res), secret) {
		t.Fatalf("run_command: %+v / %s", out, mcpText(res))
	}
	// An internal error says nothing of its cause.
	e.rt.ExecFn = func(runsc.ExecRequest) (runsc.ExecResult, error) {
		return runsc.ExecResult{}, errors.New("runsc exec /var/lib/secret/path failed")
	}
	if msg := mcpFail(t, cs, "run_command", map[string]any{"sessionId": "m1", "command": "true"}); !strings.HasPrefix(msg, "internal: ") || strings.Contains(msg, "/var/lib") {
		t.Errorf("internal error: %q", msg)
	}
	e.rt.ExecFn = nil
	if msg := mcpFail(t, cs, "run_command", map[string]any{"sessionId": "nosuch", "command": "true"}); msg != "not_found: no such session" {
		t.Errorf("unknown session: %q", msg)
	}
	if msg := mcpFail(t, cs, "run_command", map[string]any{"sessionId": "../x", "command": "true"}); !strings.HasPrefix(msg, "invalid_session_id: ") {
		t.Errorf("bad id: %q", msg)
	}
	if msg := mcpFail(t, cs, "run_command", map[string]any{"sessionId": "m1", "command": "true", "bogus": 1}); msg == "" {
		t.Error("unknown argument accepted")
	}

	// Files: write, read (scrubbed), list, artifacts.
	w, _ := mcpOK[mcpWriteOut](t, cs, "write_file", map[string]any{"sessionId": "m1", "path": "/workspace/d/a.txt", "content": "hello " + secret})
	if !w.Created || w.Path != "/workspace/d/a.txt" {
		t.Fatalf("write: %+v", w)
	}
	f, res := mcpOK[mcpFileOut](t, cs, "read_file", map[string]any{"sessionId": "m1", "path": "/workspace/d/a.txt"})
	if f.Encoding != "utf-8" || !strings.HasPrefix(f.Content, "hello [REDACTED") || strings.Contains(mcpText(res), secret) || f.Truncated {
		t.Fatalf("read: %+v", f)
	}
	mcpOK[mcpWriteOut](t, cs, "write_file", map[string]any{"sessionId": "m1", "path": "/workspace/bin.dat", "content": "AAEC/w==", "encoding": "base64"})
	f, res = mcpOK[mcpFileOut](t, cs, "get_artifact", map[string]any{"sessionId": "m1", "path": "bin.dat"})
	if f.Encoding != "base64" || f.Content != "AAEC/w==" || f.URI != ts.URL+"/v1/sandbox/m1/artifacts/bin.dat" {
		t.Fatalf("artifact: %+v", f)
	}
	if er, ok := res.Content[0].(*mcp.EmbeddedResource); !ok || !bytes.Equal(er.Resource.Blob, []byte{0, 1, 2, 255}) {
		t.Fatalf("artifact content: %#v", res.Content[0])
	}
	ls, _ := mcpOK[mcpFilesOut](t, cs, "list_files", map[string]any{"sessionId": "m1"})
	if len(ls.Entries) != 3 || ls.Entries[1].Name != "bin.dat" || ls.Entries[2].Type != "dir" {
		t.Fatalf("list: %+v", ls)
	}
	arts, _ := mcpOK[mcpArtifactsOut](t, cs, "list_artifacts", map[string]any{"sessionId": "m1"})
	if len(arts.Artifacts) != 3 || arts.Artifacts[2].Path != "d/a.txt" {
		t.Fatalf("artifacts: %+v", arts)
	}
	if msg := mcpFail(t, cs, "read_file", map[string]any{"sessionId": "m1", "path": "/etc/passwd"}); !strings.HasPrefix(msg, "invalid_path: ") {
		t.Errorf("outside path: %q", msg)
	}
	if msg := mcpFail(t, cs, "read_file", map[string]any{"sessionId": "m1", "path": "/workspace/d"}); !strings.HasPrefix(msg, "invalid_path: ") {
		t.Errorf("directory: %q", msg)
	}

	// A viewer reads but cannot change anything; nothing happens.
	_, viewer := e.addMember(store.RoleViewer)
	vs := mcpConnect(t, ts.URL, viewer)
	calls := len(e.rt.Execs)
	for name, args := range map[string]map[string]any{
		"create_sandbox":   {"sessionId": "v1"},
		"run_command":      {"sessionId": "m1", "command": "touch /workspace/x"},
		"run_code":         {"sessionId": "m1", "language": "python", "code": "1"},
		"write_file":       {"sessionId": "m1", "path": "/workspace/v.txt", "content": "x"},
		"teardown_sandbox": {"sessionId": "m1"},
		"resume_sandbox":   {"sessionId": "m1"},
	} {
		if msg := mcpFail(t, vs, name, args); msg != "forbidden: your role lacks the project.update permission" {
			t.Errorf("viewer %s: %q", name, msg)
		}
	}
	if len(e.rt.Execs) != calls || e.get(e.token, "v1").Code != 404 {
		t.Fatal("a viewer's call did something")
	}
	if g, _ := mcpOK[sandboxObject](t, vs, "get_sandbox", map[string]any{"sessionId": "m1"}); g.Status != "running" {
		t.Fatalf("viewer get: %+v", g)
	}

	// Authentication: the contract's 401; a session is its token's only.
	contractError(t, mcpRaw(t, ts.URL, "POST", "", "", toolsList), 401, "unauthenticated")
	contractError(t, mcpRaw(t, ts.URL, "POST", "nope", "", toolsList), 401, "unauthenticated")
	big := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`
	contractError(t, mcpRaw(t, ts.URL, "POST", e.token, cs.ID(), big), 413, "too_large")
	other := createToken(t, e)
	for _, m := range []string{"POST", "GET", "DELETE"} {
		body := ""
		if m == "POST" {
			body = toolsList
		}
		contractError(t, mcpRaw(t, ts.URL, m, other, cs.ID(), body), 403, "forbidden")
		contractError(t, mcpRaw(t, ts.URL, m, viewer, cs.ID(), body), 403, "forbidden")
	}
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatalf("the owner's session after refused hijacks: %v", err)
	}

	// Teardown; files stay readable.
	td, _ := mcpOK[sandboxObject](t, cs, "teardown_sandbox", map[string]any{"sessionId": "m1"})
	if td.Status != "stopped" || td.Teardown == nil {
		t.Fatalf("teardown: %+v", td)
	}
	mcpOK[sandboxObject](t, cs, "teardown_sandbox", map[string]any{"sessionId": gen.SessionID})

	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "no_such_tool"}); err == nil {
		t.Error("an unknown tool answered")
	}

	// Audit: every call, with the identity and the session.
	e.db.FlushAudit(context.Background())
	recs, err := e.db.ListAudit(context.Background(), store.AuditFilter{OrgID: e.owner.Org.ID, Action: "mcp.run_command"})
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int{}
	for _, r := range recs {
		if r.UserID == "" || r.TokenID == "" || r.RequestID == "" {
			t.Errorf("audit record without identity: %+v", r)
		}
		outcomes[r.Outcome+":"+r.SessionID]++
	}
	if outcomes["ok:m1"] != 1 || outcomes["error:m1"] != 2 || outcomes["denied:m1"] != 1 || outcomes["error:nosuch"] != 1 {
		t.Fatalf("run_command audit outcomes %v", outcomes)
	}
	recs, _ = e.db.ListAudit(context.Background(), store.AuditFilter{OrgID: e.owner.Org.ID, Action: "mcp.unknown_tool"})
	if len(recs) != 1 || recs[0].Status != 404 || recs[0].Details["tool"] != "no_such_tool" {
		t.Fatalf("unknown tool audit: %+v", recs)
	}
}

func createToken(t testing.TB, e *apiEnv) string {
	t.Helper()
	rec := e.do("POST", "/v1/tokens", e.token, map[string]any{"name": "second"})
	var tj tokenJSON
	if rec.Code != 201 || json.Unmarshal(rec.Body.Bytes(), &tj) != nil {
		t.Fatalf("token: %d %s", rec.Code, rec.Body)
	}
	return tj.Token
}

// TestMCPSessionsBounded: an organization's sessions are capped (the least
// recently used closes) and a closed session is gone.
func TestMCPSessionsBounded(t *testing.T) {
	e := newAPIEnv(t)
	ts := httptest.NewServer(e.s.Handler())
	t.Cleanup(ts.Close)
	first := mcpConnect(t, ts.URL, e.token)
	for i := 0; i < mcpSessionsPerOrg; i++ {
		mcpConnect(t, ts.URL, e.token)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		for range e.s.mcp.srv.Sessions() {
			n++
		}
		if n <= mcpSessionsPerOrg {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions open, cap %d", n, mcpSessionsPerOrg)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp := mcpRaw(t, ts.URL, "POST", e.token, first.ID(), toolsList)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the evicted session answered %d", resp.StatusCode)
	}
}
