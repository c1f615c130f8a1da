package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/store"
)

func TestAPIProvisionValidation(t *testing.T) {
	e := newAPIEnv(t)
	cases := []struct {
		name string
		body map[string]any
		code string
		want string
	}{
		{"missing id", map[string]any{}, "invalid_session_id", "required"},
		{"leading dot", map[string]any{"sessionId": ".x"}, "invalid_session_id", "sessionId"},
		{"slash", map[string]any{"sessionId": "a/b"}, "invalid_session_id", "sessionId"},
		{"too long", map[string]any{"sessionId": strings.Repeat("a", 129)}, "invalid_session_id", "sessionId"},
		{"bad size", map[string]any{"sessionId": "s1", "size": "huge"}, "invalid_size", "standard-1"},
		{"bad repo", map[string]any{"sessionId": "s1", "gitRepo": "not a repo"}, "invalid_repo", "gitRepo"},
		{"repo extra slash", map[string]any{"sessionId": "s1", "gitRepo": "a/b/c"}, "invalid_repo", "gitRepo"},
		{"branch without repo", map[string]any{"sessionId": "s1", "gitBranch": "main"}, "invalid_branch", "needs gitRepo"},
		{"bad branch", map[string]any{"sessionId": "s1", "gitRepo": "a/b", "gitBranch": "a..b"}, "invalid_branch", "gitBranch"},
		{"reserved env", map[string]any{"sessionId": "s1", "env": map[string]string{"HOME": "/root"}}, "invalid_request", "HOME"},
		{"bad env name", map[string]any{"sessionId": "s1", "env": map[string]string{"1A": "x"}}, "invalid_request", "env:"},
		{"short secret", map[string]any{"sessionId": "s1", "secrets": map[string]string{"TOKEN": "abc"}}, "invalid_request", "TOKEN"},
		{"secret NUL", map[string]any{"sessionId": "s1", "secrets": map[string]string{"TOKEN": "abcdef\x00gh"}}, "invalid_request", "secrets: value of TOKEN must not contain NUL"},
		{"blank secret", map[string]any{"sessionId": "s1", "secrets": map[string]string{"TOKEN": "        "}}, "invalid_request", "shows fewer than 6 characters"},
		{"colour-code secret", map[string]any{"sessionId": "s1", "secrets": map[string]string{"TOKEN": "\x1b[31mred\x1b[0m"}}, "invalid_request", "shows fewer than 6 characters"},
		{"long secret", map[string]any{"sessionId": "s1", "secrets": map[string]string{"TOKEN": strings.Repeat("k", 16<<10+1)}}, "invalid_request", "over the 16 KiB a secret may have"},
		{"too many secret bytes", map[string]any{"sessionId": "s1", "secrets": map[string]string{"A": strings.Repeat("a", 16<<10), "B": strings.Repeat("b", 16<<10), "C": "c-secret-1"}}, "invalid_request", "over the 32 KiB a session's secrets may have"},
		{"idle negative", map[string]any{"sessionId": "s1", "idleTimeoutSeconds": -1}, "invalid_request", "idleTimeoutSeconds"},
		{"idle too long", map[string]any{"sessionId": "s1", "idleTimeoutSeconds": 7*24*3600 + 1}, "invalid_request", "idleTimeoutSeconds"},
		{"unknown project", map[string]any{"sessionId": "s1", "projectId": "prj_nope"}, "invalid_request", "projectId"},
	}
	for _, c := range cases {
		msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, c.body), http.StatusBadRequest, c.code)
		if !strings.Contains(msg, c.want) {
			t.Errorf("%s: message %q, want %q", c.name, msg, c.want)
		}
		if strings.Contains(msg, "abcdef") {
			t.Errorf("%s: message leaks a secret value: %q", c.name, msg)
		}
	}
	// JSON text is UTF-8: invalid bytes would reach the sandbox as U+FFFD.
	for _, body := range []string{"{\"sessionId\":\"s1\",\"secrets\":{\"TOKEN\":\"abc\xff\xfedefgh\"}}", "{\"sessionId\":\"s1\",\"env\":{\"X\":\"x\xffy\"}}"} {
		if msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, body), http.StatusBadRequest, "invalid_request"); !strings.Contains(msg, "UTF-8") {
			t.Errorf("invalid UTF-8: %q", msg)
		}
	}
	if n := len(e.rt.CallsWith("create")); n != 0 {
		t.Errorf("Create called %d times", n)
	}
	if l := e.list(e.token); len(l) != 0 {
		t.Errorf("rows left: %+v", l)
	}
	// None of the ids was consumed.
	e.provision(e.token, map[string]any{"sessionId": "s1"})
}

// The memory kept for redacting secrets (limits.maxSecretsMemoryMiB) is a
// budget over the sessions: a provision whose secrets would go over gets a
// 503 and leaves nothing; when a session is deleted, its share is back.
func TestAPIProvisionSecretsMemory(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) { c.Limits.MaxSecretsMemoryMiB = 10 })
	secret := func(c byte) string { // about 5 MiB of index each
		r := rand.New(rand.NewPCG(uint64(c), 1))
		b := make([]byte, 3072)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return base64.StdEncoding.EncodeToString(b)
	}
	e.provision(e.token, map[string]any{"sessionId": "first", "secrets": map[string]string{"KEY": secret('a')}})
	rec := e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "second", "secrets": map[string]string{"KEY": secret('b')}})
	if ra := rec.Header().Get("Retry-After"); ra != "30" {
		t.Errorf("Retry-After %q", ra)
	}
	msg := apiError(t, rec, http.StatusServiceUnavailable, "unavailable")
	if !strings.Contains(msg, "of the 10 MiB it keeps for redacting them") {
		t.Errorf("message %q", msg)
	}
	if n := len(e.rt.CallsWith("create")); n != 1 {
		t.Errorf("Create called %d times", n)
	}
	if l := e.list(e.token); len(l) != 1 {
		t.Errorf("sessions: %+v", l)
	}
	metrics := e.do("GET", "/metrics", "", nil).Body.String()
	var running, stopped float64
	for _, l := range strings.Split(metrics, "\n") {
		fmt.Sscanf(l, `sandboxd_scrub_secrets_memory_bytes{sessions="running"} %g`, &running)
		fmt.Sscanf(l, `sandboxd_scrub_secrets_memory_bytes{sessions="stopped"} %g`, &stopped)
	}
	if running < 4e6 || running > 8<<20 || stopped != 0 { // the first session's 4 KiB
		t.Errorf("secrets memory metrics: running %g, stopped %g", running, stopped)
	}
	// Sessions without secrets are not refused.
	e.provision(e.token, map[string]any{"sessionId": "plain"})
	if rec := e.do("DELETE", "/v1/sandbox/first", e.token, nil); rec.Code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", rec.Code, rec.Body)
	}
	e.provision(e.token, map[string]any{"sessionId": "second", "secrets": map[string]string{"KEY": secret('b')}})
}

func TestAPIProvisionGitHubNotConnected(t *testing.T) {
	e := newAPIEnv(t)
	body := map[string]any{"sessionId": "gh-1", "gitRepo": "octo/repo", "gitBranch": "feature/x-1"}
	apiError(t, e.do("POST", "/v1/sandbox", e.token, body), http.StatusPreconditionFailed, "github_not_connected")
	if c := e.rt.CallsWith("create"); len(c) != 0 {
		t.Errorf("Create called: %v", c)
	}
	apiError(t, e.get(e.token, "gh-1"), http.StatusNotFound, "not_found")
	if l := e.list(e.token); len(l) != 0 {
		t.Errorf("rows left: %+v", l)
	}
	if _, err := e.db.GetSession(context.Background(), e.owner.Org.ID, "gh-1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("session row: %v", err)
	}
	// The id is still free.
	e.provision(e.token, map[string]any{"sessionId": "gh-1"})
}

func TestAPIProvisionSizes(t *testing.T) {
	e := newAPIEnv(t)
	sb := e.provision(e.token, map[string]any{"sessionId": "legacy-1", "size": "small"})
	if sb.SessionID != "legacy-1" || sb.Status != store.StatusRunning || sb.Size != "standard-2" || sb.RequestedSize != "small" {
		t.Errorf("sandbox = %+v", sb)
	}
	if sb.Resources != (resources{VCPUs: 2, MemoryMiB: 2048, DiskMiB: 16384}) {
		t.Errorf("resources = %+v", sb.Resources)
	}
	if sb.OrgID != e.owner.Org.ID || sb.ProjectID != e.owner.ProjectID || sb.StartedAt == nil || sb.StoppedAt != nil {
		t.Errorf("sandbox = %+v", sb)
	}
	if sb.GitRepo != nil || sb.GitBranch != nil || sb.StatusReason != nil || sb.SecretNames == nil || sb.URLs == nil {
		t.Errorf("null/empty fields: %+v", sb)
	}
	// The runtime got the resolved size's limits, the image and the container id.
	if len(e.rt.Created) != 1 {
		t.Fatalf("created = %v", e.rt.Created)
	}
	got := e.rt.Created[0]
	wantLimits := runsc.Limits{VCPUs: 2, MemoryMiB: 2048, DiskMiB: 16384, Pids: runsc.HostTasks(1024), Processes: runsc.DefaultProcesses(1024)}
	if got.ID != e.rt.ContainerID(e.owner.Org.ID, "legacy-1") || got.Image != "/fake/image" || got.Limits != wantLimits {
		t.Errorf("Create(%+v)", got)
	}
	// The default size.
	def := e.provision(e.token, map[string]any{"sessionId": "default-1"})
	if def.Size != "standard-1" || def.RequestedSize != "standard-1" || def.Resources.VCPUs != 1 {
		t.Errorf("default = %+v", def)
	}
	// GET shows the same.
	again := decodeBody[sandboxObject](t, e.get(e.token, "legacy-1"), http.StatusOK)
	if again.Size != "standard-2" || again.RequestedSize != "small" || again.Resources != sb.Resources {
		t.Errorf("GET = %+v", again)
	}
}

func TestAPIProvisionSecretsAndEnv(t *testing.T) {
	e := newAPIEnv(t)
	sb := e.provision(e.token, map[string]any{
		"sessionId": "sec-1",
		"env":       map[string]string{"A": "session", "B": "session"},
		"secrets":   map[string]string{"TOKEN": "s3cr3t-value", "API_KEY": "key-123456"},
	})
	if !slices.Equal(sb.SecretNames, []string{"API_KEY", "TOKEN"}) {
		t.Errorf("secretNames = %v", sb.SecretNames)
	}
	// No response ever holds a secret value.
	for _, rec := range []*httptest.ResponseRecorder{e.get(e.token, "sec-1"), e.do("GET", "/v1/sandbox", e.token, nil)} {
		if strings.Contains(rec.Body.String(), "s3cr3t-value") {
			t.Errorf("secret value in %s", rec.Body)
		}
	}
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		fmt.Fprintf(req.Stdout, "token=s3cr3t-value\n")
		fmt.Fprintf(req.Stderr, "key-123456!")
		return runsc.ExecResult{ExitCode: 3, Duration: 1500 * time.Millisecond}, nil
	}
	res := decodeBody[execResponse](t, e.exec(e.token, "sec-1", map[string]any{
		"action": "exec", "command": "env", "env": map[string]string{"B": "request", "C": "request"},
	}), http.StatusOK)
	if res.Stdout != "token=[REDACTED:TOKEN]\n" || res.Stderr != "[REDACTED:API_KEY]!" || res.ExitCode != 3 || res.DurationMs != 1500 {
		t.Errorf("exec = %+v", res)
	}
	xr := e.rt.Execs[0]
	if !slices.Equal(xr.Args, []string{"/bin/bash", "-lc", "env"}) || xr.Cwd != runsc.Workspace || xr.Stdin != nil {
		t.Errorf("exec request args %q cwd %q", xr.Args, xr.Cwd)
	}
	if xr.Timeout != time.Duration(e.s.cfg.Limits.ExecDefaultTimeoutMs)*time.Millisecond {
		t.Errorf("default timeout = %v", xr.Timeout)
	}
	env := map[string]string{}
	for _, kv := range xr.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for k, v := range map[string]string{"A": "session", "B": "request", "C": "request", "TOKEN": "s3cr3t-value",
		"API_KEY": "key-123456", "HOME": runsc.UserHome, "USER": "user", "PATH": runsc.BasePath} {
		if env[k] != v {
			t.Errorf("exec env %s = %q, want %q", k, env[k], v)
		}
	}
}

func TestAPIProvisionConflict(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "dup"})
	msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "dup", "size": "large"}), http.StatusConflict, "conflict")
	if !strings.Contains(msg, "dup") {
		t.Errorf("message %q", msg)
	}
	if n := len(e.rt.CallsWith("create")); n != 1 {
		t.Errorf("Create called %d times", n)
	}
	// The first session is unchanged.
	if sb := decodeBody[sandboxObject](t, e.get(e.token, "dup"), http.StatusOK); sb.Size != "standard-1" || sb.Status != "running" {
		t.Errorf("after conflict: %+v", sb)
	}
}

func TestAPIProvisionCreateFailure(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) { c.Limits.MaxSandboxes = 1 })
	e.rt.CreateErr = errors.New("runsc create: /var/lib/secret/path exploded")
	body := map[string]any{"sessionId": "retry-1", "secrets": map[string]string{"TOKEN": "s3cr3t-value"}}
	msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, body), http.StatusServiceUnavailable, "unavailable")
	if strings.Contains(msg, "exploded") || strings.Contains(msg, "/var/lib") {
		t.Errorf("runtime error leaked to the client: %q", msg)
	}
	// Nothing was kept.
	apiError(t, e.get(e.token, "retry-1"), http.StatusNotFound, "not_found")
	if l := e.list(e.token); len(l) != 0 {
		t.Errorf("rows left: %+v", l)
	}
	// The same id can be provisioned again, and the capacity slot was given back
	// (MaxSandboxes is 1).
	e.rt.Mu.Lock()
	e.rt.CreateErr = nil
	e.rt.Mu.Unlock()
	sb := e.provision(e.token, body)
	if sb.Status != store.StatusRunning || !slices.Equal(sb.SecretNames, []string{"TOKEN"}) {
		t.Errorf("retry = %+v", sb)
	}
	if n := len(e.rt.CallsWith("create")); n != 2 {
		t.Errorf("Create called %d times", n)
	}
	// At capacity now.
	apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "retry-2"}), http.StatusServiceUnavailable, "unavailable")
	apiError(t, e.get(e.token, "retry-2"), http.StatusNotFound, "not_found")
	// Teardown frees the slot.
	decodeBody[sandboxObject](t, e.do("POST", "/v1/sandbox/retry-1/teardown", e.token, nil), http.StatusOK)
	e.provision(e.token, map[string]any{"sessionId": "retry-2"})
}

// While a provision is in flight the session is visible as provisioning;
// a teardown that waits for it and then finds the row gone (the create
// failed) must answer 404, like for any unknown session.
func TestAPITeardownDuringFailedProvision(t *testing.T) {
	e := newAPIEnv(t)
	e.rt.CreateGate, e.rt.CreateStarted = make(chan struct{}), make(chan struct{})
	e.rt.CreateErr = errors.New("boom")
	provDone := make(chan *httptest.ResponseRecorder)
	go func() { provDone <- e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "race-1"}) }()
	<-e.rt.CreateStarted
	if sb := decodeBody[sandboxObject](t, e.get(e.token, "race-1"), http.StatusOK); sb.Status != store.StatusProvisioning {
		t.Errorf("during create: %s", sb.Status)
	}
	// A second provision of the same id while the first is in flight conflicts.
	apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "race-1"}), http.StatusConflict, "conflict")
	tdDone := make(chan *httptest.ResponseRecorder)
	// Whether the teardown finds the row and waits for the lock (the path
	// sandbox's TestTeardownWaitingForFailedProvision pins down) or comes
	// after the undo, the answer is the same.
	go func() { tdDone <- e.do("POST", "/v1/sandbox/race-1/teardown", e.token, nil) }()
	close(e.rt.CreateGate)
	apiError(t, <-provDone, http.StatusServiceUnavailable, "unavailable")
	apiError(t, <-tdDone, http.StatusNotFound, "not_found")
}

// A teardown whose Destroy fails leaves the session stopping; the retried
// teardown must give the capacity slot back.
func TestAPITeardownRetryReleasesCapacity(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) { c.Limits.MaxSandboxes = 1 })
	e.provision(e.token, map[string]any{"sessionId": "td-1"})
	e.rt.Mu.Lock()
	e.rt.DestroyErr = errors.New("device busy")
	e.rt.Mu.Unlock()
	apiError(t, e.do("POST", "/v1/sandbox/td-1/teardown", e.token, nil), http.StatusServiceUnavailable, "unavailable")
	if sb := decodeBody[sandboxObject](t, e.get(e.token, "td-1"), http.StatusOK); sb.Status != store.StatusStopping {
		t.Errorf("after failed teardown: %s", sb.Status)
	}
	e.rt.Mu.Lock()
	e.rt.DestroyErr = nil
	e.rt.Mu.Unlock()
	sb := decodeBody[sandboxObject](t, e.do("POST", "/v1/sandbox/td-1/teardown", e.token, nil), http.StatusOK)
	if sb.Status != store.StatusStopped {
		t.Errorf("after retried teardown: %s", sb.Status)
	}
	// The slot was released when the first teardown left running (once).
	decodeBody[sandboxObject](t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "td-2"}), http.StatusCreated)
}

func TestAPITeardownIdempotent(t *testing.T) {
	e := newAPIEnv(t)
	created := e.provision(e.token, map[string]any{"sessionId": "td"})
	cid := e.rt.ContainerID(e.owner.Org.ID, "td")
	first := decodeBody[sandboxObject](t, e.do("POST", "/v1/sandbox/td/teardown", e.token, nil), http.StatusOK)
	if first.Status != store.StatusStopped || first.StoppedAt == nil || first.Teardown == nil {
		t.Fatalf("first teardown = %+v", first)
	}
	// Allocated blocks, not apparent sizes (a sparse file counts what it uses).
	if first.Teardown.WorkspaceBytes < int64(len("hello")) || first.Teardown.WorkspaceBytes%512 != 0 || first.Teardown.GitPushed || first.Teardown.GitError != nil {
		t.Errorf("teardown result = %+v", *first.Teardown)
	}
	if !first.StartedAt.Equal(*created.StartedAt) || first.StoppedAt.Before(*first.StartedAt) {
		t.Errorf("times: %v %v", first.StartedAt, first.StoppedAt)
	}
	second := decodeBody[sandboxObject](t, e.do("POST", "/v1/sandbox/td/teardown", e.token, nil), http.StatusOK)
	if second.Status != store.StatusStopped || !second.StoppedAt.Equal(*first.StoppedAt) || second.Credits != first.Credits {
		t.Errorf("second teardown = %+v", second)
	}
	if d := e.rt.CallsWith("destroy"); !slices.Equal(d, []string{"destroy " + cid + " keep=true"}) {
		t.Errorf("destroy calls = %v, want one keeping the disk", d)
	}
	if sb := decodeBody[sandboxObject](t, e.get(e.token, "td"), http.StatusOK); sb.Status != store.StatusStopped {
		t.Errorf("GET after teardown = %+v", sb)
	}
	msg := apiError(t, e.exec(e.token, "td", map[string]any{"action": "exec", "command": "id"}), http.StatusConflict, "conflict")
	if !strings.Contains(msg, "stopped") {
		t.Errorf("message %q", msg)
	}
	if c := e.rt.CallsWith("exec"); len(c) != 0 {
		t.Errorf("Exec called on a stopped session: %v", c)
	}
	apiError(t, e.do("POST", "/v1/sandbox/nope/teardown", e.token, nil), http.StatusNotFound, "not_found")
}

func TestAPIDelete(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "del"})
	rec := e.do("DELETE", "/v1/sandbox/del", e.token, nil)
	if rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
		t.Fatalf("DELETE = %d %q", rec.Code, rec.Body)
	}
	cid := e.rt.ContainerID(e.owner.Org.ID, "del")
	if d := e.rt.CallsWith("destroy"); !slices.Equal(d, []string{"destroy " + cid + " keep=false"}) {
		t.Errorf("destroy calls = %v", d)
	}
	apiError(t, e.get(e.token, "del"), http.StatusNotFound, "not_found")
	apiError(t, e.do("DELETE", "/v1/sandbox/del", e.token, nil), http.StatusNotFound, "not_found")
	apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "del"}), http.StatusConflict, "conflict")
	if l := e.list(e.token); len(l) != 0 {
		t.Errorf("list after delete = %+v", l)
	}
	// Deleting a stopped session works too.
	e.provision(e.token, map[string]any{"sessionId": "del-2"})
	decodeBody[sandboxObject](t, e.do("POST", "/v1/sandbox/del-2/teardown", e.token, nil), http.StatusOK)
	if rec := e.do("DELETE", "/v1/sandbox/del-2", e.token, nil); rec.Code != http.StatusNoContent {
		t.Errorf("DELETE stopped = %d %s", rec.Code, rec.Body)
	}
}

func TestAPIListFilter(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "l-1"})
	e.provision(e.token, map[string]any{"sessionId": "l-2"})
	decodeBody[sandboxObject](t, e.do("POST", "/v1/sandbox/l-1/teardown", e.token, nil), http.StatusOK)
	got := decodeBody[struct {
		Sandboxes []sandboxObject `json:"sandboxes"`
	}](t, e.do("GET", "/v1/sandbox?status=running", e.token, nil), http.StatusOK).Sandboxes
	if len(got) != 1 || got[0].SessionID != "l-2" {
		t.Errorf("running = %+v", got)
	}
	if all := e.list(e.token); len(all) != 2 || all[0].SessionID != "l-2" {
		t.Errorf("all (newest first) = %+v", all)
	}
	apiError(t, e.do("GET", "/v1/sandbox?status=bogus", e.token, nil), http.StatusBadRequest, "invalid_request")
}

func TestCapacityLimits(t *testing.T) {
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.MaxSandboxesPerOrg = 2
		c.Limits.MaxMemoryMiB = 3 * 1024
		c.Limits.MemoryOvercommit = 1
	})
	e.provision(e.token, map[string]any{"sessionId": "c1"}) // 1 GiB
	msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "c2", "size": "standard-3"}), http.StatusServiceUnavailable, "unavailable")
	if !strings.Contains(msg, "3072 MiB with overcommit") {
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

// sizes.configFile replaces the built-in table: provisioning uses its
// limits and egress quota, and only its names are accepted.
func TestSizesConfigFile(t *testing.T) {
	clearConfigEnv(t)
	sizes, _ := filepath.Abs("config/testdata/custom-sizes.yaml")
	plans, _ := filepath.Abs("config/testdata/custom-plans.yaml")
	conf := writeTempFile(t, "sandboxd.yaml", "sizes:\n  configFile: "+sizes+"\nplans:\n  configFile: "+plans+"\n")
	cfg, err := config.Load(config.Overrides{ConfigFile: conf, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Sizes.Default != "basic" || len(cfg.Sizes.List) != 2 || cfg.SizesOptions.ConfigFile != sizes {
		t.Fatalf("sizes = %+v", cfg.Sizes)
	}
	e := newAPIEnvWith(t, cfg, slog.New(slog.DiscardHandler))

	o := e.provision(e.token, map[string]any{"sessionId": "dflt"})
	if o.Size != "basic" || o.Resources != (resources{VCPUs: 1, MemoryMiB: 768, DiskMiB: 4096}) || o.Egress.BytesLimit != 64<<20 {
		t.Fatalf("default size: %+v", o)
	}
	o = e.provision(e.token, map[string]any{"sessionId": "legacy", "size": "standard"})
	if o.Size != "basic" || o.RequestedSize != "standard" || o.Egress.BytesLimit != 64<<20 {
		t.Fatalf("legacy name: %+v", o)
	}
	o = e.provision(e.token, map[string]any{"sessionId": "big", "size": "big"})
	if o.Resources != (resources{VCPUs: 4, MemoryMiB: 4096, DiskMiB: 20480}) || o.Egress.BytesLimit != 0 {
		t.Fatalf("big: %+v", o)
	}
	e.rt.Mu.Lock()
	got := e.rt.Created[len(e.rt.Created)-1].Limits
	e.rt.Mu.Unlock()
	if want := (runsc.Limits{VCPUs: 4, MemoryMiB: 4096, DiskMiB: 20480, Pids: runsc.HostTasks(2048), Processes: runsc.DefaultProcesses(2048)}); got != want {
		t.Errorf("runtime limits = %+v, want %+v", got, want)
	}
	// The built-in names are gone, and the error lists the file's.
	msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "old", "size": "standard-1"}), http.StatusBadRequest, "invalid_size")
	if !strings.Contains(msg, "basic, big, standard") {
		t.Errorf("invalid size message = %q", msg)
	}
}
