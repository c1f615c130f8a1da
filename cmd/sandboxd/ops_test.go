package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandboxd/server/config"
	"sandboxd/store"
)

// run runs the command in-process on dataDir: its exit status, stdout and
// stderr.
func run(t *testing.T, dataDir string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRoot(&out, &errb)
	root.SetArgs(append([]string{"--data-dir", dataDir}, args...))
	code := report(&errb, root.ExecuteContext(context.Background()))
	return code, out.String(), errb.String()
}

func mustRun(t *testing.T, dataDir string, args ...string) string {
	t.Helper()
	code, out, errs := run(t, dataDir, args...)
	if code != 0 {
		t.Fatalf("sandboxd %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
	}
	return strings.TrimSpace(out)
}

// The operator commands on a data dir with no server: each change lands
// in the database and in the organization's audit log; bad input is a
// usage error (2) or a clear one (1) and changes nothing.
func TestOperatorCommands(t *testing.T) {
	dir := t.TempDir()
	if code, _, errs := run(t, dir, "org", "list"); code != 1 || !strings.Contains(errs, "no database") {
		t.Fatalf("org list on an empty dir: %d %s", code, errs)
	}
	tok := mustRun(t, dir, "org", "create", "acme")
	if !strings.HasPrefix(tok, "sbx_") || strings.Contains(tok, "\n") {
		t.Fatalf("org create printed %q, want the token alone", tok)
	}
	mustRun(t, dir, "org", "create", "acme") // a second acme: names are not unique
	list := mustRun(t, dir, "org", "list")
	if strings.Count(list, "acme") != 2 || !strings.Contains(list, "free") {
		t.Fatalf("org list:\n%s", list)
	}
	if code, _, errs := run(t, dir, "plan", "set", "acme", "pro"); code != 1 || !strings.Contains(errs, "more than one organization is named") {
		t.Fatalf("ambiguous name: %d %s", code, errs)
	}

	db, err := store.Open(config.DBPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.Authenticate(context.Background(), tok)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	org := p.Org.ID

	bob := mustRun(t, dir, "user", "add", org, "bob", "--role", "viewer", "--operator")
	ci := mustRun(t, dir, "token", "create", org, "bob", "--name", "ci")
	mustRun(t, dir, "plan", "set", org, "pro")
	out := mustRun(t, dir, "credits", "grant", org, "12.5", "--note", "launch")
	if !strings.Contains(out, "granted 12.5 credits") || !strings.Contains(out, "512.5 remaining") {
		t.Fatalf("credits grant: %s", out)
	}
	mustRun(t, dir, "credits", "grant", org, "--", "-0.5") // a negative grant takes back

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"plan", "set", org, "gold"}, 2, "one of [free pro team]"},
		{[]string{"plan", "set", org}, 2, "takes 2 arguments"},
		{[]string{"credits", "grant", org, "1.2345"}, 2, "at most 3 decimals"},
		{[]string{"credits", "grant", org, "0"}, 2, "nonzero"},
		{[]string{"credits", "grant", org, "2000000"}, 2, "at most 1000000"},
		{[]string{"credits", "grant", "nosuch", "1"}, 1, `no organization "nosuch"`},
		{[]string{"user", "add", org, "eve", "--role", "root"}, 2, "--role: one of"},
		{[]string{"user", "add", org, "bad/name"}, 2, "user name"},
		{[]string{"token", "create", org, "mallory"}, 1, "has no member \"mallory\"; its members: owner"},
		{[]string{"org", "create", ""}, 2, "organization name"},
		{[]string{"frobnicate"}, 1, "unknown command"},
		{[]string{"org", "list", "--bogus"}, 2, "unknown flag"},
	} {
		code, _, errs := run(t, dir, c.args...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("sandboxd %v: exit %d, stderr %q; want %d and %q", c.args, code, errs, c.code, c.want)
		}
	}

	db, err = store.Open(config.DBPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	pb, err := db.Authenticate(ctx, bob)
	if err != nil || pb.Role != "viewer" || !pb.Operator || pb.Org.ID != org {
		t.Fatalf("bob: %+v %v", pb, err)
	}
	if pc, err := db.Authenticate(ctx, ci); err != nil || pc.User.ID != pb.User.ID {
		t.Fatalf("ci token: %+v %v", pc, err)
	}
	if _, op, _ := db.GetOrg(ctx, org); op.Plan != "pro" {
		t.Fatalf("plan: %+v", op)
	}
	if g, _ := db.CreditsGranted(ctx, org, time.Now().AddDate(0, -1, 0), time.Now().AddDate(0, 1, 0)); g != 12000 {
		t.Fatalf("granted %d milli-credits, want 12000", g)
	}
	recs, err := db.ListAudit(ctx, store.AuditFilter{OrgID: org})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.Action]++
		if r.Details["via"] != "cli" || r.Details["hostUser"] == "" {
			t.Errorf("audit record without its origin: %+v", r)
		}
	}
	if seen["org.create"] != 1 || seen["member.add"] != 1 || seen["token.create"] != 1 || seen["org.plan_set"] != 1 || seen["org.credits_grant"] != 2 || len(recs) != 6 {
		t.Fatalf("audit: %v", seen)
	}
}

// With a real server running on the data dir, what the commands change
// is what the server answers at once: a new organization's token works, a
// plan set and a grant show in GET /v1/usage, and both are in the audit
// log the API serves. rotate-key refuses to run beside the server.
func TestOperatorCommandsServerRunning(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root and the real server (not in -short)")
	}
	bin := os.Getenv("SANDBOXD_BIN")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin")
	}
	exe := filepath.Join(bin, "sandboxd")
	if _, err := os.Stat(exe); err != nil {
		t.Fatalf("%s missing: run `make build`", exe)
	}
	dir, err := os.MkdirTemp("", "sbxo")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var logb bytes.Buffer
	srv := exec.Command(exe, "serve", "--data-dir", dir, "--listen", addr, "--no-image-build")
	srv.Stdout, srv.Stderr = &logb, &logb
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	defer func() {
		srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			srv.Process.Kill()
			<-done
			t.Error("server did not stop after SIGTERM")
		}
		if t.Failed() {
			t.Logf("server log:\n%s", logb.String())
		}
	}()
	url := "http://" + addr
	call := func(token, method, path string, body any) (int, []byte) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequest(method, url+path, rd)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for deadline := time.Now().Add(90 * time.Second); ; {
		if resp, err := http.Get(url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("server exited: %v\n%s", err, logb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("server not healthy after 90 s")
		}
		time.Sleep(100 * time.Millisecond)
	}

	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(exe, append(args, "--data-dir", dir)...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("sandboxd %v: %v\n%s%s", args, err, out.String(), errb.String())
		}
		return strings.TrimSpace(out.String())
	}
	tok := cli("org", "create", "globex", "--plan", "free")
	code, b := call(tok, "GET", "/v1/me", nil)
	if code != 200 || !strings.Contains(string(b), `"globex"`) {
		t.Fatalf("me with the CLI's token: %d %s", code, b)
	}
	var me struct {
		Org struct{ ID string } `json:"organization"`
	}
	json.Unmarshal(b, &me)
	usage := func() (plan string, granted int64) {
		code, b := call(tok, "GET", "/v1/usage", nil)
		var u struct {
			Plan    struct{ Name string }
			Granted struct{ Milli int64 }
		}
		if code != 200 || json.Unmarshal(b, &u) != nil {
			t.Fatalf("usage: %d %s", code, b)
		}
		return u.Plan.Name, u.Granted.Milli
	}
	if p, g := usage(); p != "free" || g != 0 {
		t.Fatalf("usage before: %s %d", p, g)
	}
	cli("plan", "set", "globex", "pro")
	cli("credits", "grant", me.Org.ID, "7.25")
	if p, g := usage(); p != "pro" || g != 7250 {
		t.Fatalf("usage after the CLI's plan set and grant: %s %d", p, g)
	}
	viewer := cli("user", "add", "globex", "val", "--role", "viewer")
	if code, _ := call(viewer, "POST", "/v1/sandbox", map[string]any{"sessionId": "v1"}); code != 403 {
		t.Fatalf("viewer's provision: %d, want 403", code)
	}
	code, b = call(tok, "GET", "/v1/audit", nil)
	for _, a := range []string{"org.plan_set", "org.credits_grant", "member.add", `"via":"cli"`} {
		if code != 200 || !strings.Contains(string(b), a) {
			t.Fatalf("audit lacks %s: %d %s", a, code, b)
		}
	}
	out, err := exec.Command(exe, "secrets", "rotate-key", "--data-dir", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "stop the server first") {
		t.Fatalf("rotate-key beside a running server: %v %s", err, out)
	}
}
