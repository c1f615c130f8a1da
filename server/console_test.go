package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"sandboxd/web"
)

// The console is served on the API's origin only, without a token, with
// its CSP; a portal origin never serves it; API errors stay JSON.
func TestConsoleRoutes(t *testing.T) {
	e := newAPIEnv(t)
	rec := e.do("GET", "/", "", nil)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `/assets/app.js`) || rec.Header().Get("Content-Security-Policy") != web.CSP {
		t.Fatalf("GET /: %d %v", rec.Code, rec.Header())
	}
	if rec := e.do("GET", "/assets/app.css", "", nil); rec.Code != 200 || rec.Header().Get("Content-Security-Policy") != web.CSP {
		t.Fatalf("GET /assets/app.css: %d", rec.Code)
	}
	apiError(t, e.do("GET", "/assets/nope.js", "", nil), http.StatusNotFound, "not_found")
	apiError(t, e.do("GET", "/assets/", "", nil), http.StatusNotFound, "not_found")
	apiError(t, e.do("POST", "/", "", nil), http.StatusMethodNotAllowed, "method_not_allowed")
	// On a session's portal origin "/" is the portal's, never the console.
	portalHost := "s0123456789abcdef0123." + e.s.cfg.Portal.Domain
	rec = e.do("GET", "/", "", nil, func(r *http.Request) { r.Host = portalHost })
	if strings.Contains(rec.Body.String(), "/assets/app.js") || rec.Header().Get("Content-Security-Policy") == web.CSP {
		t.Fatalf("the portal origin served the console: %d %s", rec.Code, rec.Body)
	}
	rec = e.do("GET", "/assets/app.js", "", nil, func(r *http.Request) { r.Host = portalHost })
	if rec.Header().Get("Content-Security-Policy") == web.CSP {
		t.Fatalf("the portal origin served the console's script: %d", rec.Code)
	}
}

// GET /v1/sizes lists every size with its rate and the plan's verdict;
// GET .../stats answers for a running sandbox.
func TestSizesAndStats(t *testing.T) {
	e := newAPIEnv(t)
	rec := e.do("GET", "/v1/sizes", e.token, nil)
	var r struct {
		Default, Plan string
		Sizes         []sizeJSON
	}
	if json.Unmarshal(rec.Body.Bytes(), &r); rec.Code != 200 || r.Default != "standard-1" || len(r.Sizes) != len(e.s.cfg.Sizes.List) {
		t.Fatalf("sizes: %d %s", rec.Code, rec.Body)
	}
	if z := r.Sizes[0]; z.Name != "standard-1" || z.VCPUs != 1 || z.MemoryMiB != 1024 || z.CreditsPerHour.Milli != 1000 || !z.Allowed {
		t.Fatalf("standard-1: %+v", z)
	}
	apiError(t, e.do("GET", "/v1/sizes", "", nil), http.StatusUnauthorized, "unauthenticated")

	apiError(t, e.do("GET", "/v1/sandbox/nope/stats", e.token, nil), http.StatusNotFound, "not_found")
	if rec := e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "st1"}); rec.Code != 201 {
		t.Fatalf("provision: %d %s", rec.Code, rec.Body)
	}
	rec = e.do("GET", "/v1/sandbox/st1/stats", e.token, nil)
	var st statsJSON
	if json.Unmarshal(rec.Body.Bytes(), &st); rec.Code != 200 || st.Memory.UsedBytes == nil || *st.Memory.UsedBytes != 11<<20 || st.CPU.VCPUs != 1 || st.Pids.Limit == nil {
		t.Fatalf("stats: %d %s", rec.Code, rec.Body)
	}
	// Answered polls are not in the audit log; refused ones are.
	e.do("GET", "/v1/sandbox/st1/stats", "sbx_wrong", nil)
	e.db.FlushAudit(context.Background())
	rec = e.do("GET", "/v1/audit?sessionId=st1", e.token, nil)
	if strings.Contains(rec.Body.String(), `"sandbox.stats","sessionId":"st1","outcome":"ok"`) || !strings.Contains(rec.Body.String(), "sandbox.provision") {
		t.Fatalf("audit: %s", rec.Body)
	}
	if rec := e.do("POST", "/v1/sandbox/st1/teardown", e.token, nil); rec.Code != 200 {
		t.Fatalf("teardown: %d", rec.Code)
	}
	apiError(t, e.do("GET", "/v1/sandbox/st1/stats", e.token, nil), http.StatusConflict, "conflict")
}

// The audit log filters by user and by a time window.
func TestAuditUserAndUntil(t *testing.T) {
	e := newAPIEnv(t)
	e.do("GET", "/v1/tokens", e.token, nil)
	e.db.FlushAudit(context.Background())
	rec := e.do("GET", "/v1/audit?userId="+e.owner.User.ID, e.token, nil)
	if !strings.Contains(rec.Body.String(), "token.list") {
		t.Fatalf("by user: %s", rec.Body)
	}
	rec = e.do("GET", "/v1/audit?userId=usr_nobody", e.token, nil)
	if rec.Code != 200 || strings.Contains(rec.Body.String(), "token.list") {
		t.Fatalf("another user: %s", rec.Body)
	}
	rec = e.do("GET", "/v1/audit?until=2000-01-01T00:00:00Z", e.token, nil)
	if rec.Code != 200 || strings.Contains(rec.Body.String(), "token.list") {
		t.Fatalf("until 2000: %s", rec.Body)
	}
	apiError(t, e.do("GET", "/v1/audit?until=yesterday", e.token, nil), http.StatusBadRequest, "invalid_request")
}
