package server

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestRealMCP drives a real server on real gVisor through the MCP SDK's own
// client: a sandbox's whole life (commands, code with state and a
// matplotlib figure, files, artifacts, portal URLs, teardown, resume), the
// scrubber, permissions, the session's owner and the audit log.
func TestRealMCP(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	cs := mcpConnect(t, h.ts.URL, h.token)
	ctx := context.Background()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) < 11 {
		t.Fatalf("tools: %v %v", tools, err)
	}

	secret := "mcp-Secret-9f8e7d6c"
	sb, _ := mcpOK[sandboxObject](t, cs, "create_sandbox", map[string]any{"sessionId": "mcp1", "size": "standard-1",
		"secrets": map[string]string{"API_KEY": secret}})
	t.Cleanup(func() { h.call(h.token, "DELETE", "/v1/sandbox/mcp1", nil) })
	if sb.Status != "running" {
		t.Fatalf("create: %+v", sb)
	}

	t.Run("commands", func(t *testing.T) {
		out, _ := mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "echo hi; whoami; pwd"})
		if out.ExitCode != 0 || out.Stdout != "hi\nuser\n/workspace\n" {
			t.Fatalf("%+v", out)
		}
		out, _ = mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "echo oops >&2; exit 7"})
		if out.ExitCode != 7 || out.Stderr != "oops\n" {
			t.Fatalf("non-zero exit: %+v", out)
		}
		out, _ = mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "cat; echo", "stdin": "in", "cwd": "/tmp",
			"env": map[string]string{"X": "1"}})
		if out.Stdout != "in\n" {
			t.Fatalf("stdin: %+v", out)
		}
		out, _ = mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "sleep 30", "timeoutMs": 300})
		if !out.TimedOut || out.ExitCode != 124 {
			t.Fatalf("timeout: %+v", out)
		}
	})

	t.Run("secret scrubbed", func(t *testing.T) {
		out, res := mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "echo key=$API_KEY; echo $API_KEY > /workspace/key.txt"})
		if strings.Contains(out.Stdout, secret) || !strings.Contains(out.Stdout, "key=[REDACTED") || strings.Contains(mcpText(res), secret) {
			t.Fatalf("run_command: %+v", out)
		}
		code, res := mcpOK[mcpCodeOut](t, cs, "run_code", map[string]any{"sessionId": "mcp1", "language": "python", "code": "import os\nprint(os.environ['API_KEY'])\nos.environ['API_KEY']"})
		if strings.Contains(code.Stdout, secret) || code.Result == nil || strings.Contains(*code.Result, secret) || strings.Contains(mcpText(res), secret) {
			t.Fatalf("run_code: %+v", code)
		}
		f, res := mcpOK[mcpFileOut](t, cs, "read_file", map[string]any{"sessionId": "mcp1", "path": "/workspace/key.txt"})
		if strings.Contains(f.Content, secret) || strings.Contains(mcpText(res), secret) || !strings.Contains(f.Content, "REDACTED") {
			t.Fatalf("read_file: %+v", f)
		}
	})

	t.Run("code", func(t *testing.T) {
		mcpOK[mcpCodeOut](t, cs, "run_code", map[string]any{"sessionId": "mcp1", "language": "python", "code": "x = 41", "contextId": "c1"})
		r, _ := mcpOK[mcpCodeOut](t, cs, "run_code", map[string]any{"sessionId": "mcp1", "language": "python", "code": "print('p')\nx + 1", "contextId": "c1"})
		if r.Result == nil || *r.Result != "42" || r.Stdout != "p\n" || r.ContextID != "c1" {
			t.Fatalf("state across runs: %+v", r)
		}
		r, _ = mcpOK[mcpCodeOut](t, cs, "run_code", map[string]any{"sessionId": "mcp1", "language": "python", "code": "x"})
		if r.Error == nil || r.Error.Name != "NameError" {
			t.Fatalf("the default context saw c1's state: %+v", r)
		}
		n, _ := mcpOK[mcpCodeOut](t, cs, "run_code", map[string]any{"sessionId": "mcp1", "language": "node", "code": "let y = 6; y * 7"})
		if n.Result == nil || *n.Result != "42" {
			t.Fatalf("node: %+v", n)
		}
		r, res := mcpOK[mcpCodeOut](t, cs, "run_code", map[string]any{"sessionId": "mcp1", "language": "python",
			"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('mcp')\nplt.savefig('/workspace/plot.png')"})
		var img *mcp.ImageContent
		for _, c := range res.Content {
			if ic, ok := c.(*mcp.ImageContent); ok {
				img = ic
			}
		}
		if img == nil || img.MIMEType != "image/png" || len(r.Display) == 0 || r.Display[0].Mime != "image/png" || r.Display[0].Data != "" {
			t.Fatalf("no PNG image content: %+v / %d contents", r, len(res.Content))
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(img.Data))
		if err != nil || cfg.Width < 100 || cfg.Height < 100 {
			t.Fatalf("image is not a real PNG: %v %+v", err, cfg)
		}
		if msg := mcpFail(t, cs, "run_code", map[string]any{"sessionId": "mcp1", "language": "ruby", "code": "1"}); !strings.Contains(msg, "language") {
			t.Errorf("ruby: %q", msg)
		}
	})

	t.Run("files and artifacts", func(t *testing.T) {
		w, _ := mcpOK[mcpWriteOut](t, cs, "write_file", map[string]any{"sessionId": "mcp1", "path": "/workspace/notes/a.txt", "content": "hello from mcp\n"})
		if !w.Created || w.Size != 15 {
			t.Fatalf("write: %+v", w)
		}
		f, res := mcpOK[mcpFileOut](t, cs, "read_file", map[string]any{"sessionId": "mcp1", "path": "/workspace/notes/a.txt"})
		if f.Content != "hello from mcp\n" || mcpText(res) != "hello from mcp\n" {
			t.Fatalf("read: %+v", f)
		}
		out, _ := mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "stat -c %U /workspace/notes/a.txt"})
		if out.Stdout != "user\n" {
			t.Fatalf("owner: %+v", out)
		}
		ls, _ := mcpOK[mcpFilesOut](t, cs, "list_files", map[string]any{"sessionId": "mcp1", "path": "/workspace/notes"})
		if len(ls.Entries) != 1 || ls.Entries[0].Name != "a.txt" || ls.Entries[0].Type != "file" {
			t.Fatalf("list: %+v", ls)
		}
		arts, _ := mcpOK[mcpArtifactsOut](t, cs, "list_artifacts", map[string]any{"sessionId": "mcp1"})
		paths := map[string]bool{}
		for _, a := range arts.Artifacts {
			paths[a.Path] = a.SHA256 != ""
		}
		if !paths["notes/a.txt"] || !paths["plot.png"] {
			t.Fatalf("artifacts: %+v", arts)
		}
		a, res := mcpOK[mcpFileOut](t, cs, "get_artifact", map[string]any{"sessionId": "mcp1", "path": "plot.png"})
		ic, ok := res.Content[0].(*mcp.ImageContent)
		if a.MimeType != "image/png" || a.Encoding != "base64" || !ok {
			t.Fatalf("artifact: %+v %#v", a, res.Content[0])
		}
		if _, err := png.DecodeConfig(bytes.NewReader(ic.Data)); err != nil {
			t.Fatalf("artifact PNG: %v", err)
		}
		// The uri serves the same bytes over REST.
		req, _ := http.NewRequest("GET", a.URI, nil)
		req.Header.Set("Authorization", "Bearer "+h.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("uri %s: %v %v", a.URI, resp, err)
		}
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if !bytes.Equal(buf.Bytes(), ic.Data) {
			t.Fatal("artifact differs from its download")
		}
		if msg := mcpFail(t, cs, "read_file", map[string]any{"sessionId": "mcp1", "path": "/workspace/../etc/passwd"}); !strings.HasPrefix(msg, "invalid_path: ") {
			t.Errorf("escape: %q", msg)
		}
		if msg := mcpFail(t, cs, "get_artifact", map[string]any{"sessionId": "mcp1", "path": "nope.txt"}); !strings.HasPrefix(msg, "not_found: ") {
			t.Errorf("missing artifact: %q", msg)
		}
	})

	t.Run("portal urls", func(t *testing.T) {
		g, _ := mcpOK[sandboxObject](t, cs, "get_sandbox", map[string]any{"sessionId": "mcp1"})
		for _, k := range []string{"terminal", "editor", "notebook", "display", "browser"} {
			if g.URLs[k] == "" {
				t.Errorf("no %s URL: %v", k, g.URLs)
			}
		}
		if g.URLs["editor"] != h.ts.URL+"/v1/sandbox/proxy/mcp1/editor/" || !strings.HasPrefix(g.URLs["terminal"], "ws://") || g.Status != "running" {
			t.Fatalf("%+v", g)
		}
	})

	t.Run("permissions and sessions", func(t *testing.T) {
		var me struct {
			Organization struct{ ID string } `json:"organization"`
		}
		_, b := h.call(h.token, "GET", "/v1/me", nil)
		json.Unmarshal(b, &me)
		code, b := h.call(h.token, "POST", "/v1/orgs/"+me.Organization.ID+"/members", map[string]any{"name": "mcp-viewer", "role": "viewer"})
		var added struct {
			Token tokenJSON `json:"token"`
		}
		if code != 201 || json.Unmarshal(b, &added) != nil {
			t.Fatalf("add viewer: %d %s", code, b)
		}
		vs := mcpConnect(t, h.ts.URL, added.Token.Token)
		if msg := mcpFail(t, vs, "run_command", map[string]any{"sessionId": "mcp1", "command": "touch /workspace/viewer"}); msg != "forbidden: your role lacks the project.update permission" {
			t.Fatalf("viewer run_command: %q", msg)
		}
		if msg := mcpFail(t, vs, "write_file", map[string]any{"sessionId": "mcp1", "path": "/workspace/viewer", "content": "x"}); !strings.HasPrefix(msg, "forbidden: ") {
			t.Fatalf("viewer write_file: %q", msg)
		}
		if msg := mcpFail(t, vs, "teardown_sandbox", map[string]any{"sessionId": "mcp1"}); !strings.HasPrefix(msg, "forbidden: ") {
			t.Fatalf("viewer teardown: %q", msg)
		}
		if out, _ := mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "test -e /workspace/viewer"}); out.ExitCode != 1 {
			t.Fatal("a viewer's call changed the workspace")
		}
		if f, _ := mcpOK[mcpFileOut](t, vs, "read_file", map[string]any{"sessionId": "mcp1", "path": "/workspace/notes/a.txt"}); f.Content != "hello from mcp\n" {
			t.Fatalf("viewer read: %+v", f)
		}

		contractError(t, mcpRaw(t, h.ts.URL, "POST", "", "", toolsList), 401, "unauthenticated")
		code, b = h.call(h.token, "POST", "/v1/tokens", map[string]any{"name": "other"})
		var other tokenJSON
		if code != 201 || json.Unmarshal(b, &other) != nil {
			t.Fatalf("token: %d %s", code, b)
		}
		for _, tok := range []string{other.Token, added.Token.Token} {
			contractError(t, mcpRaw(t, h.ts.URL, "POST", tok, cs.ID(), `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"run_command","arguments":{"sessionId":"mcp1","command":"touch /workspace/hijack"}}}`), 403, "forbidden")
			contractError(t, mcpRaw(t, h.ts.URL, "DELETE", tok, cs.ID(), ""), 403, "forbidden")
		}
		if out, _ := mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "test -e /workspace/hijack"}); out.ExitCode != 1 {
			t.Fatal("a hijacked session ran a command")
		}
	})

	t.Run("teardown and resume", func(t *testing.T) {
		td, _ := mcpOK[sandboxObject](t, cs, "teardown_sandbox", map[string]any{"sessionId": "mcp1"})
		if td.Status != "stopped" || td.Teardown == nil || td.Teardown.WorkspaceBytes == 0 {
			t.Fatalf("teardown: %+v", td)
		}
		if f, _ := mcpOK[mcpFileOut](t, cs, "read_file", map[string]any{"sessionId": "mcp1", "path": "/workspace/notes/a.txt"}); f.Content != "hello from mcp\n" {
			t.Fatalf("read after teardown: %+v", f)
		}
		if msg := mcpFail(t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "true"}); !strings.HasPrefix(msg, "conflict: ") {
			t.Fatalf("command on a stopped session: %q", msg)
		}
		rs, _ := mcpOK[sandboxObject](t, cs, "resume_sandbox", map[string]any{"sessionId": "mcp1"})
		if rs.Status != "running" {
			t.Fatalf("resume: %+v", rs)
		}
		out, _ := mcpOK[execResponse](t, cs, "run_command", map[string]any{"sessionId": "mcp1", "command": "cat /workspace/notes/a.txt"})
		if out.Stdout != "hello from mcp\n" {
			t.Fatalf("file after resume: %+v", out)
		}
	})

	t.Run("audit", func(t *testing.T) {
		var recs []auditJSON
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, b := h.call(h.token, "GET", "/v1/audit?action=mcp.run_command&sessionId=mcp1", nil)
			var body struct {
				Records []auditJSON `json:"records"`
			}
			if code != 200 || json.Unmarshal(b, &body) != nil {
				t.Fatalf("audit: %d %s", code, b)
			}
			recs = body.Records
			if len(recs) >= 11 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		outcomes := map[string]int{}
		for _, r := range recs {
			if r.UserID == "" || r.TokenID == "" || r.OrgID == "" || r.RequestID == "" || r.SessionID != "mcp1" {
				t.Errorf("record: %+v", r)
			}
			outcomes[r.Outcome]++
		}
		if outcomes["ok"] < 8 || outcomes["denied"] != 1 || outcomes["error"] != 1 {
			t.Fatalf("run_command records by outcome %v", outcomes)
		}
		if _, b := h.call(h.token, "GET", "/v1/audit?action=mcp.teardown_sandbox", nil); !strings.Contains(string(b), `"outcome":"denied"`) || !strings.Contains(string(b), `"outcome":"ok"`) {
			t.Fatalf("teardown records: %s", b)
		}
	})

	mcpOK[sandboxObject](t, cs, "teardown_sandbox", map[string]any{"sessionId": "mcp1"})
}
