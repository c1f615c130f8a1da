package server

// Tests for what the first adversarial review found.

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/store"
)

func TestAdminCannotActAgainstOwners(t *testing.T) {
	e := newAPIEnv(t)
	admin, adminTok := e.addMember(store.RoleAdmin)
	_ = admin
	org := e.owner.Org.ID
	owner := e.owner.User.ID
	apiError(t, e.do("PATCH", "/v1/orgs/"+org+"/members/"+owner, adminTok, map[string]any{"role": "viewer"}), http.StatusForbidden, "forbidden")
	apiError(t, e.do("DELETE", "/v1/orgs/"+org+"/members/"+owner, adminTok, nil), http.StatusForbidden, "forbidden")
	apiError(t, e.do("DELETE", "/v1/tokens/"+e.owner.TokenID, adminTok, nil), http.StatusForbidden, "forbidden")
	msg := apiError(t, e.do("POST", "/v1/orgs/"+org+"/members", adminTok, map[string]any{"name": "x", "role": "owner"}), http.StatusForbidden, "forbidden")
	if strings.Contains(msg, "lacks the") {
		t.Errorf("message reads badly: %q", msg)
	}
	// The owner still works, and an admin still manages non-owners.
	if rec := e.do("GET", "/v1/me", e.token, nil); rec.Code != http.StatusOK {
		t.Fatalf("owner token after attempts: %d", rec.Code)
	}
	dev, _ := e.addMember(store.RoleDeveloper)
	if rec := e.do("PATCH", "/v1/orgs/"+org+"/members/"+dev.ID, adminTok, map[string]any{"role": "viewer"}); rec.Code != http.StatusOK {
		t.Fatalf("admin demotes developer: %d %s", rec.Code, rec.Body)
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

func TestCapacityLimits(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.MaxSandboxesPerOrg = 2
		c.Limits.MaxMemoryMiB = 3 * 1024
	})
	e.provision(e.token, map[string]any{"sessionId": "c1"}) // 1 GiB
	msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "c2", "size": "standard-3"}), http.StatusServiceUnavailable, "unavailable")
	if !strings.Contains(msg, "memory") {
		t.Errorf("memory message: %q", msg)
	}
	e.provision(e.token, map[string]any{"sessionId": "c3"})
	msg = apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "c4"}), http.StatusServiceUnavailable, "unavailable")
	if !strings.Contains(msg, "organization") {
		t.Errorf("org message: %q", msg)
	}
	// Teardown gives the capacity back.
	if rec := e.do("POST", "/v1/sandbox/c1/teardown", e.token, nil); rec.Code != http.StatusOK {
		t.Fatal(rec.Code)
	}
	e.provision(e.token, map[string]any{"sessionId": "c4"})
}

func TestExecConcurrencyLimit(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) { c.Limits.MaxExecsPerSession = 2 })
	e.provision(e.token, map[string]any{"sessionId": "x1"})
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		started <- struct{}{}
		<-release
		return runsc.ExecResult{}, nil
	}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.exec(e.token, "x1", map[string]any{"action": "exec", "command": "sleep 1"})
		}()
	}
	<-started
	<-started
	apiError(t, e.exec(e.token, "x1", map[string]any{"action": "exec", "command": "true"}), http.StatusTooManyRequests, "rate_limited")
	close(release)
	wg.Wait()
	if rec := e.exec(e.token, "x1", map[string]any{"action": "exec", "command": "true"}); rec.Code != http.StatusOK {
		t.Fatalf("after the others ended: %d", rec.Code)
	}
}

func TestKillActionAndStartErrors(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "k1"})
	rec := e.exec(e.token, "k1", map[string]any{"action": "kill"})
	if rec.Code != http.StatusOK || len(e.rt.CallsWith("killall")) != 1 {
		t.Fatalf("kill: %d %s %v", rec.Code, rec.Body, e.rt.Calls)
	}
	apiError(t, e.exec(e.token, "k1", map[string]any{"action": "kill", "command": "x"}), http.StatusBadRequest, "invalid_request")
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		return runsc.ExecResult{}, runsc.ErrTooManyProcesses
	}
	msg := apiError(t, e.exec(e.token, "k1", map[string]any{"action": "exec", "command": "true"}), http.StatusConflict, "conflict")
	if !strings.Contains(msg, "kill") {
		t.Errorf("no advice: %q", msg)
	}
}

func TestRevokedTokenAttemptAudited(t *testing.T) {
	e := newAPIEnv(t)
	_, tok := e.addMember(store.RoleDeveloper)
	p, err := e.db.Authenticate(t.Context(), tok)
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.do("DELETE", "/v1/tokens/"+p.TokenID, e.token, nil); rec.Code != http.StatusNoContent {
		t.Fatal(rec.Code)
	}
	apiError(t, e.do("GET", "/v1/sandbox", tok, nil), http.StatusUnauthorized, "unauthenticated")
	e.db.FlushAudit(t.Context())
	recs, err := e.db.ListAudit(t.Context(), store.AuditFilter{OrgID: e.owner.Org.ID, Action: "auth"})
	if err != nil || len(recs) != 1 || recs[0].TokenID != p.TokenID || recs[0].Outcome != "denied" {
		t.Fatalf("audit: %+v %v", recs, err)
	}
}

func TestDeleteTwiceAndTeardownAfterDelete(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "d1"})
	if rec := e.do("DELETE", "/v1/sandbox/d1", e.token, nil); rec.Code != http.StatusNoContent {
		t.Fatal(rec.Code)
	}
	apiError(t, e.do("DELETE", "/v1/sandbox/d1", e.token, nil), http.StatusNotFound, "not_found")
	apiError(t, e.do("POST", "/v1/sandbox/d1/teardown", e.token, nil), http.StatusNotFound, "not_found")
	if n := len(e.rt.CallsWith("destroy")); n != 1 {
		t.Fatalf("destroy called %d times", n)
	}
}

// Tickets and subprotocol tokens authenticate WebSocket routes only.
func TestTicketOnlyForWebSockets(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "t1"})
	rec := e.do("POST", "/v1/sandbox/t1/tickets", e.token, nil)
	if rec.Code != http.StatusCreated {
		t.Fatal(rec.Code)
	}
	var tk struct{ Ticket string }
	json.Unmarshal(rec.Body.Bytes(), &tk)
	upgrade := func(r *http.Request) {
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Protocol", "bearer."+e.token)
	}
	apiError(t, e.do("DELETE", "/v1/sandbox/t1?ticket="+tk.Ticket, "", nil, upgrade), http.StatusUnauthorized, "unauthenticated")
	apiError(t, e.do("POST", "/v1/sandbox/t1/tickets?ticket="+tk.Ticket, "", nil, upgrade), http.StatusUnauthorized, "unauthenticated")
	if rec := e.get(e.token, "t1"); rec.Code != http.StatusOK {
		t.Fatalf("session gone: %d", rec.Code)
	}
}
