package sandbox

// Review of git pairing at the Manager level (fake driver, real store and
// egress proxy). Tests named TestGitAttack* that fail demonstrate a
// problem; the others are regression tests of defenses that held.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/egress"
	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/server/sandbox/sandboxtest"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

// recEgress records the options each session's live Serve got.
type recEgress struct {
	*egress.Proxy
	mu   sync.Mutex
	live map[string]egress.SessionOptions
}

func (r *recEgress) Start(l net.Listener, pk string, o egress.SessionOptions) error {
	r.mu.Lock()
	r.live[pk] = o
	r.mu.Unlock()
	return r.Proxy.Start(l, pk, o)
}

func (r *recEgress) Close(pk string) {
	r.mu.Lock()
	delete(r.live, pk)
	r.mu.Unlock()
	r.Proxy.Close(pk)
}

func (r *recEgress) UpdateGit(pk string, g *egress.GitPairing) {
	r.mu.Lock()
	o := r.live[pk]
	o.Git = g
	r.live[pk] = o
	r.mu.Unlock()
	r.Proxy.UpdateGit(pk, g)
}

func (r *recEgress) pairing(pk string) *egress.GitPairing {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live[pk].Git
}

const attackToken = "ghp_mgrAttackTOKEN0123456789"

func newGitMgrEnv(t *testing.T) (*env, *recEgress) {
	t.Helper()
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "sandboxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := store.LoadKeyring(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	db.SetKeyring(keys)
	p, _, _, err := db.Bootstrap(context.Background(), "default", "owner", "")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := egress.NewPolicy(cfg.Egress)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, rt: &sandboxtest.Runtime{WorkspaceRoot: t.TempDir()}, db: db, p: p, cfg: cfg, hooks: &recHooks{},
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	rec := &recEgress{Proxy: egress.New(pol, egress.Options{Logger: slog.New(slog.DiscardHandler)}), live: map[string]egress.SessionOptions{}}
	rules, _ := scrub.NewSet(nil)
	e.m = New(Options{Limits: cfg.Limits, DataDir: cfg.DataDir, Image: "/image", Runtime: e.rt, Store: db, Egress: rec,
		Policy: pol, Events: e.hooks, Hooks: e.hooks, Rules: rules, Log: slog.New(slog.DiscardHandler), Now: e.clock,
		Git: GitHost{WebURL: "https://git.test", Host: "git.test", Port: 443, User: "x-access-token",
			CloneTimeout: time.Minute, PushTimeout: time.Minute}})
	t.Cleanup(func() {
		e.m.Close()
		rec.Proxy.Shutdown()
		db.Close()
	})
	if _, err := db.SetGitToken(context.Background(), p.User.ID, attackToken); err != nil {
		t.Fatal(err)
	}
	return e, rec
}

// fakeGit answers git commands in the fake sandbox: fn gets the
// arguments after "git" and writes to stdout/stderr.
func fakeGit(e *env, fn func(args []string, stdout, stderr io.Writer) int) {
	e.rt.Mu.Lock()
	defer e.rt.Mu.Unlock()
	e.rt.ExecFn = func(req runsc.ExecRequest) (runsc.ExecResult, error) {
		if len(req.Args) == 0 || req.Args[0] != "git" {
			return runsc.ExecResult{}, nil
		}
		return runsc.ExecResult{ExitCode: fn(req.Args[1:], req.Stdout, req.Stderr)}, nil
	}
}

func hasArg(args []string, a string) bool {
	for _, x := range args {
		if x == a {
			return true
		}
	}
	return false
}

// Finding: DELETE /v1/me/github removes the stored credential, but every
// running session's egress proxy keeps the pairing it read when its
// listener opened, token included, and keeps adding it until the session
// stops or restarts. SECURITY.md: "Once they disconnect it, the session's
// requests go out without one."
func TestGitAttackDisconnectKeepsLiveCredential(t *testing.T) {
	e, rec := newGitMgrEnv(t)
	fakeGit(e, func(args []string, stdout, stderr io.Writer) int { return 0 })
	z, _ := e.cfg.Sizes.Resolve("")
	ses, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "g1", Size: z, GitRepo: "alice/app", GitBranch: "main"})
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	if g := rec.pairing(ses.ID); g == nil || g.Token != attackToken {
		t.Fatalf("the live pairing has no credential: %+v", g)
	}
	if err := e.db.DeleteGitToken(context.Background(), e.p.User.ID); err != nil {
		t.Fatal(err)
	}
	e.m.GitCredentialChanged(context.Background(), e.p.User.ID) // what DELETE /v1/me/github does
	if g := rec.pairing(ses.ID); g != nil && g.Token != "" {
		t.Fatalf("after the user disconnected the credential, the running session's proxy still holds it and adds it to the paired repository's requests")
	}
}

// A failed clone: the class only, never git's output (which a hostile
// host or the sandbox controls), and nothing left behind.
func TestGitAttackCloneFailureLeaksNothing(t *testing.T) {
	e, rec := newGitMgrEnv(t)
	const marker = "MARKER-from-git-stderr"
	for _, stderr := range []string{
		"fatal: unable to access 'https://git.test/alice/app.git/': The requested URL returned error: 403 " + marker + " " + attackToken,
		"remote: " + marker + " Repository not found.\nfatal: repository 'https://x-access-token:" + attackToken + "@git.test/alice/app.git/' not found",
		marker + " ssl " + attackToken,
		marker,
	} {
		fakeGit(e, func(args []string, stdout, se io.Writer) int {
			if hasArg(args, "clone") {
				time.Sleep(200 * time.Millisecond) // a real clone takes time (see the next test)
				io.WriteString(se, stderr)
				io.WriteString(stdout, marker)
				return 128
			}
			return 0
		})
		z, _ := e.cfg.Sizes.Resolve("")
		_, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "c1", Size: z, GitRepo: "alice/app"})
		if err == nil {
			t.Fatal("provision passed")
		}
		var de *errdefs.Error
		if !errors.As(err, &de) || de.Code() != "git_clone_failed" || !errors.Is(err, errdefs.ErrUnprocessable) {
			t.Errorf("error = %#v", err)
		}
		if strings.Contains(err.Error(), marker) || strings.Contains(err.Error(), attackToken) {
			t.Errorf("git's output reached the API error: %v", err)
		}
		if _, err := e.m.Get(context.Background(), e.p.Org.ID, "c1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("the failed session was kept: %v", err)
		}
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			rec.mu.Lock()
			n := len(rec.live)
			rec.mu.Unlock()
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%d egress listeners left", n)
				break
			}
		}
	}
}

// Finding: startEgress starts Serve on a goroutine; when the start fails
// before that goroutine registered the session (a clone, or any later
// step, failing fast), the undo's egress.Close finds no session and the
// listener is served forever: a proxy session (with the pairing and its
// credential) outlives the failed provision.
func TestGitAttackFastFailedProvisionLeaksEgressListener(t *testing.T) {
	e, rec := newGitMgrEnv(t)
	fakeGit(e, func(args []string, stdout, se io.Writer) int { return 128 })
	z, _ := e.cfg.Sizes.Resolve("")
	if _, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "c1", Size: z, GitRepo: "alice/app"}); err == nil {
		t.Fatal("provision passed")
	}
	time.Sleep(500 * time.Millisecond)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for pk, o := range rec.live {
		if _, _, ok := rec.Proxy.Usage(pk); ok {
			t.Errorf("a failed provision left its egress session %s serving (pairing with credential: %v)", pk, o.Git != nil && o.Git.Token != "")
		}
	}
}

// Was a finding (low), fixed: a teardown's gitCommits are whatever the sandbox's
// "git rev-list" printed (up to 64 KiB of arbitrary words), and gitPushed
// is whatever its "git push" exit status says: the API reports the
// sandbox's claims as facts.
func TestGitAttackTeardownCommitsAreSandboxClaims(t *testing.T) {
	e, _ := newGitMgrEnv(t)
	fakeGit(e, func(args []string, stdout, stderr io.Writer) int {
		if hasArg(args, "rev-list") {
			io.WriteString(stdout, "<img/src=x onerror=alert(1)> not-a-commit\n")
		}
		return 0 // the "push" succeeds without reaching any host
	})
	z, _ := e.cfg.Sizes.Resolve("")
	if _, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: "t1", Size: z, GitRepo: "alice/app", GitBranch: "main"}); err != nil {
		t.Fatal(err)
	}
	_, td, err := e.m.Teardown(context.Background(), e.p.Org.ID, "t1")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range td.Git.Commits {
		if len(c) != 40 && len(c) != 64 || strings.Trim(c, "0123456789abcdef") != "" {
			t.Fatalf("teardown reports commit %q (pushed=%v): not an object id, printed by the sandbox", c, td.Git.Pushed)
		}
	}
}
