package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sandboxd/egress/gittest"
	"sandboxd/server/config"
)

// The caller's Git credential: connected write-only, sealed at rest,
// audited without the value, removable; provisioning with a repository
// needs it.
func TestAPIGitHubCredential(t *testing.T) {
	const secret = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"
	gs := gittest.New(t, "localhost")
	gs.Grant(secret, "octo/repo")
	e := newAPIEnv(t, gitHostConfig(t, gs, gs.URL()))
	type me struct {
		GitHub struct {
			Connected   bool
			ConnectedAt *time.Time
		}
	}
	if m := decodeBody[me](t, e.do("GET", "/v1/me", e.token, nil), http.StatusOK); m.GitHub.Connected || m.GitHub.ConnectedAt != nil {
		t.Fatalf("before: %+v", m)
	}
	for _, bad := range []any{map[string]any{}, map[string]any{"token": ""}, map[string]any{"token": "a b"},
		map[string]any{"token": strings.Repeat("x", 1025)}, map[string]any{"token": 5}, map[string]any{"token": "x", "extra": 1}} {
		apiError(t, e.do("PUT", "/v1/me/github", e.token, bad), http.StatusBadRequest, "invalid_request")
	}
	// The Git host's API is asked whether it knows the credential.
	apiError(t, e.do("PUT", "/v1/me/github", e.token, map[string]any{"token": "ghp_unknown"}), http.StatusBadRequest, "invalid_request")
	rec := e.do("PUT", "/v1/me/github", e.token, map[string]any{"token": secret})
	if rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), secret) {
		t.Fatalf("connect: %d %s", rec.Code, rec.Body)
	}
	m := decodeBody[me](t, e.do("GET", "/v1/me", e.token, nil), http.StatusOK)
	if !m.GitHub.Connected || m.GitHub.ConnectedAt == nil {
		t.Fatalf("after: %+v", m)
	}
	if tok, err := e.db.GitToken(context.Background(), e.owner.User.ID); err != nil || tok != secret {
		t.Fatalf("stored: %q %v", tok, err)
	}
	// Connected, the repository is cloned in the sandbox, by git, from the
	// configured host, never with the credential on its command line.
	e.provision(e.token, map[string]any{"sessionId": "gh-2", "gitRepo": "octo/repo"})
	cloned := false
	for _, x := range e.rt.Execs {
		line := strings.Join(x.Args, " ")
		if strings.Contains(line+strings.Join(x.Env, " "), secret) {
			t.Fatalf("the credential was given to the sandbox: %q", line)
		}
		cloned = cloned || strings.HasPrefix(line, "git -c credential.helper= clone --quiet -- "+gs.URL()+"/octo/repo.git /workspace/repo")
	}
	if !cloned {
		t.Errorf("no clone: %+v", e.rt.Execs)
	}
	e.s.db.FlushAudit(context.Background())
	audit := e.do("GET", "/v1/audit?action=me.github_connect", e.token, nil).Body.String()
	if !strings.Contains(audit, "me.github_connect") || strings.Contains(audit, secret) {
		t.Errorf("audit: %s", audit)
	}
	if rec := e.do("DELETE", "/v1/me/github", e.token, nil); rec.Code != http.StatusNoContent {
		t.Fatalf("disconnect: %d %s", rec.Code, rec.Body)
	}
	apiError(t, e.do("DELETE", "/v1/me/github", e.token, nil), http.StatusNotFound, "not_found")
	apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "gh-3", "gitRepo": "octo/repo"}),
		http.StatusPreconditionFailed, "github_not_connected")
}

// gitHostConfig points the Git host at gs (web at webURL, API by
// localhost, whose name the host resolves).
func gitHostConfig(t testing.TB, gs *gittest.Server, webURL string) func(*config.Config) {
	ca := filepath.Join(t.TempDir(), "git-ca.pem")
	if err := os.WriteFile(ca, gs.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return func(c *config.Config) {
		c.Git.WebURL = webURL
		c.Git.APIURL = "https://localhost:" + strconv.Itoa(gs.Port) + "/api/v3"
		c.Git.CAFile = ca
	}
}

// Session secrets and the credential are sealed: the database files alone
// show neither.
func TestSecretsSealedInTheDatabase(t *testing.T) {
	const secret, cred = "sekrit-value-4242-zz", "ghp_credential_zzzz_0000"
	gs := gittest.New(t, "localhost")
	gs.Grant(cred, "octo/repo")
	e := newAPIEnv(t, gitHostConfig(t, gs, gs.URL()))
	e.provision(e.token, map[string]any{"sessionId": "sealed-1", "secrets": map[string]string{"TOKEN": secret}})
	e.do("PUT", "/v1/me/github", e.token, map[string]any{"token": cred})
	e.s.Close()
	var raw strings.Builder
	ents, _ := os.ReadDir(e.dbDir)
	for _, f := range ents {
		if strings.HasPrefix(f.Name(), "sandboxd.db") {
			b, _ := os.ReadFile(filepath.Join(e.dbDir, f.Name()))
			raw.Write(b)
		}
	}
	if raw.Len() == 0 {
		t.Fatal("no database files read")
	}
	for _, s := range []string{secret, cred} {
		if strings.Contains(raw.String(), s) {
			t.Errorf("%q is in the database files in clear", s)
		}
	}
}
