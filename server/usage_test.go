package server

import (
	"context"
	"net/http"
	"testing"

	"sandboxd/store"
)

// Operators change other organizations' plans and grant them credits; the
// change is audited in both organizations. Owners of other organizations
// are not operators: 403 on the operator routes, 404 on another
// organization's usage.
func TestAPIUsageAndOperators(t *testing.T) {
	e := newAPIEnv(t)
	ctx := context.Background()
	other, otok, err := e.db.CreateOrg(ctx, "other", "mallory")
	if err != nil {
		t.Fatal(err)
	}
	u := decodeBody[usageJSON](t, e.do("GET", "/v1/usage", otok, nil), http.StatusOK)
	if u.Plan.Name != "free" || u.Allowance.Milli != 20_000 || u.Used.Milli != 0 || u.Remaining.Milli != 20_000 ||
		len(u.Sessions) != 0 || len(u.Days) != 0 {
		t.Fatalf("a new organization's usage: %+v", u)
	}
	// Not operators: the other org's owner.
	apiError(t, e.do("PUT", "/v1/orgs/"+e.owner.Org.ID+"/plan", otok, map[string]any{"plan": "team"}), http.StatusForbidden, "forbidden")
	apiError(t, e.do("POST", "/v1/orgs/"+other.Org.ID+"/credits", otok, map[string]any{"credits": 5}), http.StatusForbidden, "forbidden")
	apiError(t, e.do("GET", "/v1/usage?orgId="+e.owner.Org.ID, otok, nil), http.StatusNotFound, "not_found")
	// The first owner operates the installation.
	apiError(t, e.do("PUT", "/v1/orgs/org_nope/plan", e.token, map[string]any{"plan": "pro"}), http.StatusNotFound, "not_found")
	apiError(t, e.do("PUT", "/v1/orgs/"+other.Org.ID+"/plan", e.token, map[string]any{"plan": "gold"}), http.StatusBadRequest, "invalid_request")
	apiError(t, e.do("PUT", "/v1/orgs/"+other.Org.ID+"/plan", e.token, map[string]any{"plan": "pro", "x": 1}), http.StatusBadRequest, "invalid_request")
	if rec := e.do("PUT", "/v1/orgs/"+other.Org.ID+"/plan", e.token, map[string]any{"plan": "pro"}); rec.Code != http.StatusOK {
		t.Fatalf("set plan: %d %s", rec.Code, rec.Body)
	}
	for _, bad := range []any{0, "x", 1e12, 0.0001, nil} {
		apiError(t, e.do("POST", "/v1/orgs/"+other.Org.ID+"/credits", e.token, map[string]any{"credits": bad}), http.StatusBadRequest, "invalid_request")
	}
	if rec := e.do("POST", "/v1/orgs/"+other.Org.ID+"/credits", e.token, map[string]any{"credits": 12.5, "note": "welcome"}); rec.Code != http.StatusCreated {
		t.Fatalf("grant: %d %s", rec.Code, rec.Body)
	}
	u = decodeBody[usageJSON](t, e.do("GET", "/v1/usage?orgId="+other.Org.ID, e.token, nil), http.StatusOK)
	if u.Plan.Name != "pro" || u.Granted.Milli != 12_500 || u.Remaining.Milli != 512_500 {
		t.Fatalf("after plan and grant: %+v", u)
	}
	apiError(t, e.do("GET", "/v1/usage?period=yesterday", e.token, nil), http.StatusBadRequest, "invalid_request")
	if rec := e.do("GET", "/v1/usage?period=previous", e.token, nil); rec.Code != http.StatusOK {
		t.Fatalf("previous: %d", rec.Code)
	}
	if rec := e.do("GET", "/v1/usage?period=2020-01-15", e.token, nil); rec.Code != http.StatusOK {
		t.Fatalf("by date: %d", rec.Code)
	}
	// Audited in the target organization too.
	e.db.FlushAudit(ctx)
	for _, action := range []string{"org.plan_set", "org.credits_grant"} {
		recs, err := e.db.ListAudit(ctx, store.AuditFilter{OrgID: other.Org.ID, Action: action})
		if err != nil || len(recs) == 0 || recs[0].UserID != e.owner.User.ID || recs[0].Outcome != "ok" {
			t.Fatalf("%s in the target org's audit: %+v %v", action, recs, err)
		}
	}
}
