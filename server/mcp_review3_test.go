package server

import (
	"io"
	"mime"
	"net/http/httptest"
	"testing"
)

// Review 3: on /mcp the edge's own refusals (401, 403, 413) are the
// contract's JSON error body, but a malformed message from an
// authenticated caller is the SDK's text/plain ("malformed payload:
// unmarshaling jsonrpc message: unexpected EOF", "Content-Type must be
// 'application/json'", "GET requires an Mcp-Session-Id header"), neither
// the contract's {"error":{...}} nor a JSON-RPC error object (-32700 parse
// error) a client can read. Bad input on /mcp gets a JSON answer.
func TestReview3MCPMalformedIsJSON(t *testing.T) {
	e := newAPIEnv(t)
	ts := httptest.NewServer(e.s.Handler())
	t.Cleanup(ts.Close)
	for _, c := range []struct{ name, method, body string }{
		{"truncated JSON", "POST", `{`},
		{"wrong version", "POST", `{"jsonrpc":"1.0","id":1,"method":"tools/list"}`},
		{"GET without a session", "GET", ""},
	} {
		resp := mcpRaw(t, ts.URL, c.method, e.token, "", c.body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		if resp.StatusCode < 400 || mt != "application/json" {
			t.Errorf("%s: %d %s %q, want a JSON error", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	}
}
