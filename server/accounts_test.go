package server

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"sandboxd/store"
)

func TestAPIMe(t *testing.T) {
	e := newAPIEnv(t)
	me := decodeBody[struct {
		User         struct{ ID, Name string } `json:"user"`
		Organization struct{ ID, Name string } `json:"organization"`
		ProjectID    string                    `json:"projectId"`
		Role         string                    `json:"role"`
		Permissions  []string                  `json:"permissions"`
		TokenID      string                    `json:"tokenId"`
	}](t, e.do("GET", "/v1/me", e.token, nil), http.StatusOK)
	if me.User.ID != e.owner.User.ID || me.User.Name != "owner" || me.Organization.ID != e.owner.Org.ID ||
		me.Organization.Name != "default" || me.ProjectID != e.owner.ProjectID || me.TokenID != e.owner.TokenID {
		t.Errorf("me = %+v", me)
	}
	// The first owner also operates the installation.
	if me.Role != "owner" || !slices.Equal(me.Permissions, append(Permissions(store.RoleOwner), PermOperate)) || len(me.Permissions) != 5 {
		t.Errorf("role %q permissions %v", me.Role, me.Permissions)
	}
}

func TestAPITokens(t *testing.T) {
	e := newAPIEnv(t)
	created := decodeBody[tokenJSON](t, e.do("POST", "/v1/tokens", e.token, map[string]any{"name": "ci"}), http.StatusCreated)
	if created.Token == "" || created.ID == "" || created.Name != "ci" || created.UserID != e.owner.User.ID || created.RevokedAt != nil {
		t.Fatalf("created = %+v", created)
	}
	me := decodeBody[map[string]any](t, e.do("GET", "/v1/me", created.Token, nil), http.StatusOK)
	if me["tokenId"] != created.ID || me["role"] != "owner" {
		t.Errorf("new token /v1/me = %v", me)
	}
	list := e.do("GET", "/v1/tokens", e.token, nil)
	if strings.Contains(list.Body.String(), created.Token) || strings.Contains(list.Body.String(), e.token) {
		t.Error("token list shows a secret")
	}
	toks := decodeBody[struct {
		Tokens []tokenJSON `json:"tokens"`
	}](t, list, http.StatusOK).Tokens
	ids := []string{}
	for _, tk := range toks {
		ids = append(ids, tk.ID)
	}
	if !slices.Contains(ids, created.ID) || !slices.Contains(ids, e.owner.TokenID) || len(ids) != 2 {
		t.Errorf("token ids = %v", ids)
	}
	apiError(t, e.do("POST", "/v1/tokens", e.token, map[string]any{"name": ""}), http.StatusBadRequest, "invalid_request")
	apiError(t, e.do("POST", "/v1/tokens", e.token, map[string]any{"name": "-x"}), http.StatusBadRequest, "invalid_request")

	// A viewer cannot see or revoke the owner's tokens.
	_, vtok := e.addMember(store.RoleViewer)
	apiError(t, e.do("DELETE", "/v1/tokens/"+created.ID, vtok, nil), http.StatusNotFound, "not_found")
	vt := decodeBody[struct {
		Tokens []tokenJSON `json:"tokens"`
	}](t, e.do("GET", "/v1/tokens?all=true", vtok, nil), http.StatusOK).Tokens
	if len(vt) != 1 {
		t.Errorf("viewer sees %d tokens", len(vt))
	}
	all := decodeBody[struct {
		Tokens []tokenJSON `json:"tokens"`
	}](t, e.do("GET", "/v1/tokens?all=true", e.token, nil), http.StatusOK).Tokens
	if len(all) != 3 {
		t.Errorf("owner ?all=true sees %d tokens", len(all))
	}

	rec := e.do("DELETE", "/v1/tokens/"+created.ID, e.token, nil)
	if rec.Code != http.StatusNoContent {
		t.Fatalf("revoke = %d %s", rec.Code, rec.Body)
	}
	apiError(t, e.do("GET", "/v1/me", created.Token, nil), http.StatusUnauthorized, "unauthenticated")
	// Revoking again is fine.
	if rec := e.do("DELETE", "/v1/tokens/"+created.ID, e.token, nil); rec.Code != http.StatusNoContent {
		t.Errorf("second revoke = %d %s", rec.Code, rec.Body)
	}
	apiError(t, e.do("DELETE", "/v1/tokens/tok_nope", e.token, nil), http.StatusNotFound, "not_found")
	// The owner's original token still works, and the list shows the revocation.
	toks = decodeBody[struct {
		Tokens []tokenJSON `json:"tokens"`
	}](t, e.do("GET", "/v1/tokens", e.token, nil), http.StatusOK).Tokens
	for _, tk := range toks {
		if (tk.ID == created.ID) != (tk.RevokedAt != nil) {
			t.Errorf("token %s revokedAt = %v", tk.ID, tk.RevokedAt)
		}
	}
}

func TestAPIMembers(t *testing.T) {
	e := newAPIEnv(t)
	base := "/v1/orgs/" + e.owner.Org.ID + "/members"
	added := decodeBody[struct {
		User  struct{ ID string } `json:"user"`
		Role  string              `json:"role"`
		Token tokenJSON           `json:"token"`
	}](t, e.do("POST", base, e.token, map[string]any{"name": "dev", "role": "developer"}), http.StatusCreated)
	if added.Role != "developer" || added.Token.Token == "" {
		t.Fatalf("added = %+v", added)
	}
	me := decodeBody[map[string]any](t, e.do("GET", "/v1/me", added.Token.Token, nil), http.StatusOK)
	if me["role"] != "developer" {
		t.Errorf("new member role = %v", me["role"])
	}
	apiError(t, e.do("POST", base, e.token, map[string]any{"name": "x", "role": "root"}), http.StatusBadRequest, "invalid_request")
	// An admin cannot make owners.
	_, atok := e.addMember(store.RoleAdmin)
	apiError(t, e.do("POST", base, atok, map[string]any{"name": "o2", "role": "owner"}), http.StatusForbidden, "forbidden")
	apiError(t, e.do("PATCH", base+"/"+added.User.ID, atok, map[string]any{"role": "owner"}), http.StatusForbidden, "forbidden")
	// Downgrading takes effect on the next request.
	decodeBody[map[string]any](t, e.do("PATCH", base+"/"+added.User.ID, atok, map[string]any{"role": "viewer"}), http.StatusOK)
	apiError(t, e.do("POST", "/v1/sandbox", added.Token.Token, map[string]any{"sessionId": "m-1"}), http.StatusForbidden, "forbidden")
	// The last owner stays.
	apiError(t, e.do("DELETE", base+"/"+e.owner.User.ID, e.token, nil), http.StatusConflict, "conflict")
	if rec := e.do("DELETE", base+"/"+added.User.ID, e.token, nil); rec.Code != http.StatusNoContent {
		t.Fatalf("remove = %d %s", rec.Code, rec.Body)
	}
	apiError(t, e.do("GET", "/v1/me", added.Token.Token, nil), http.StatusUnauthorized, "unauthenticated")
}

func TestAdminCannotActAgainstOwners(t *testing.T) {
	e := newAPIEnv(t)
	_, adminTok := e.addMember(store.RoleAdmin)
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
