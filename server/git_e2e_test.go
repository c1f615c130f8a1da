package server

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/egress/gittest"
	"sandboxd/server/config"
)

// gitHarness is a real server whose sessions pair with a real Git server
// on loopback (git http-backend behind HTTPS, wanting a token).
type gitHarness struct {
	*harness
	gs    *gittest.Server
	token string // the user's credential: reads and writes alice/app only
}

func startGitHarness(t *testing.T) *gitHarness {
	t.Helper()
	cfg := realConfig(t)
	gs := gittest.New(t, "git."+testDomain)
	gs.AddRepo(t, "alice/app", "main", "feature")
	gs.AddRepo(t, "bob/private", "main") // the server could reach it; the user may not
	// No pattern the scrubber knows, so a leak would show.
	b := make([]byte, 16)
	rand.Read(b)
	token := "alicecred" + hex.EncodeToString(b)
	gs.Grant(token, "alice/app")
	gs.Grant("someone-else", "bob/private")
	cfg.Egress.AllowNetworks = append(cfg.Egress.AllowNetworks, "127.0.0.0/8")
	cfg.EgressResolver = testResolver{}
	cfg.Sizes.List = append(cfg.Sizes.List, config.Size{Name: "test-git", VCPUs: 1, MemoryMiB: 512, DiskMiB: 512, Pids: 512, CreditsPerHour: 1000, EgressMiB: 64})
	gitHostConfig(t, gs, gs.URL())(cfg)
	return &gitHarness{harness: startServer(t, cfg), gs: gs, token: token}
}

func (h *gitHarness) provisionGit(id string, body map[string]any) (int, sandboxObject, []byte) {
	h.t.Helper()
	body["sessionId"], body["size"] = id, "test-git"
	code, b := h.call(h.harness.token, "POST", "/v1/sandbox", body)
	var o sandboxObject
	json.Unmarshal(b, &o)
	return code, o, b
}

func (h *gitHarness) teardownGit(id string) teardownResult {
	h.t.Helper()
	code, b := h.call(h.harness.token, "POST", "/v1/sandbox/"+id+"/teardown", nil)
	if code != http.StatusOK {
		h.t.Fatalf("teardown %s: %d %s", id, code, b)
	}
	var o sandboxObject
	json.Unmarshal(b, &o)
	if o.Teardown == nil {
		h.t.Fatalf("teardown %s: no result: %s", id, b)
	}
	return *o.Teardown
}

// TestRealGitPairing: clone of a private repository and of a branch with
// the user's credential, refusals (no credential, no access, no branch), a
// push at teardown, a rejected non-fast-forward push that keeps the
// workspace, pushes elsewhere refused, planted git configuration that
// never runs on the host, and the credential nowhere the sandbox can read.
func TestRealGitPairing(t *testing.T) {
	h := startGitHarness(t)
	code, _, b := h.provisionGit("git-nocred", map[string]any{"gitRepo": "alice/app"})
	if code != http.StatusPreconditionFailed || !strings.Contains(string(b), "github_not_connected") {
		t.Fatalf("without a credential: %d %s", code, b)
	}
	if code, b := h.call(h.harness.token, "PUT", "/v1/me/github", map[string]any{"token": h.token}); code != http.StatusOK {
		t.Fatalf("connect: %d %s", code, b)
	}

	// Failures leave nothing and name their class, never the credential.
	for _, c := range []struct{ id, repo, branch, class string }{
		{"git-noaccess", "bob/private", "", "no_access"},
		{"git-missing", "alice/nothing-here", "", "no_access"},
		{"git-nobranch", "alice/app", "nope", "no_such_branch"},
	} {
		body := map[string]any{"gitRepo": c.repo}
		if c.branch != "" {
			body["gitBranch"] = c.branch
		}
		code, _, b := h.provisionGit(c.id, body)
		if code != http.StatusUnprocessableEntity || !strings.Contains(string(b), `"git_clone_failed"`) || !strings.Contains(string(b), c.class) {
			t.Errorf("%s: %d %s", c.id, code, b)
		}
		if strings.Contains(string(b), h.token) || strings.Contains(string(b), "fatal:") {
			t.Errorf("%s: the answer quotes the credential or git: %s", c.id, b)
		}
		if code, _ := h.call(h.harness.token, "GET", "/v1/sandbox/"+c.id, nil); code != http.StatusNotFound {
			t.Errorf("%s: a failed clone left its session (%d)", c.id, code)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(h.cfg.DataDir, "sandboxes")); len(ents) > 0 {
		t.Errorf("failed clones left sandboxes: %v", ents)
	}

	code, o, b := h.provisionGit("git-main", map[string]any{"gitRepo": "alice/app"})
	if code != http.StatusCreated || o.GitBranch == nil || *o.GitBranch != "main" {
		t.Fatalf("provision with the default branch: %d %s\n%s", code, b, h.logsText("git-main"))
	}
	if r := h.sh("git-main", "cat /workspace/app/README && git -C /workspace/app rev-parse --abbrev-ref HEAD"); r.ExitCode != 0 || !strings.Contains(r.Stdout, "branch main of alice/app\nmain") {
		t.Fatalf("clone: %+v", r)
	}
	if code, o, b := h.provisionGit("git-feature", map[string]any{"gitRepo": "alice/app", "gitBranch": "feature"}); code != http.StatusCreated || *o.GitBranch != "feature" {
		t.Fatalf("provision of a branch: %d %s", code, b)
	}
	if r := h.sh("git-feature", "cat /workspace/app/README"); !strings.Contains(r.Stdout, "branch feature of alice/app") {
		t.Fatalf("branch clone: %+v", r)
	}

	// The credential is nowhere the sandbox can look.
	look := `env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n'; ps auxww;
git -C /workspace/app config -l --show-origin; cat ~/.git-credentials ~/.gitconfig 2>/dev/null;
grep -rIl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -F "` + h.token + `" / 2>/dev/null; echo done`
	// The grep reads the whole image: minutes on a loaded machine.
	if r := h.exec("git-main", map[string]any{"command": look, "timeoutMs": 600000}); !strings.Contains(r.Stdout, "done") || strings.Contains(r.Stdout+r.Stderr, h.token) {
		t.Fatalf("the credential is visible in the sandbox: %+v", r)
	}
	// ... nor in anything the sandbox wrote (read from the host, unscrubbed).
	id := h.get2("git-main").ContainerID
	filepath.WalkDir(filepath.Join(h.cfg.DataDir, "sandboxes", id, "disk"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(h.token)) {
				t.Errorf("the credential is in the sandbox's file %s", p)
			}
		}
		return nil
	})

	// Pushes elsewhere than the paired branch are refused by the proxy.
	mainHead := h.gs.Head(t, "alice/app", "main")
	featHead := h.gs.Head(t, "alice/app", "feature")
	for _, refspec := range []string{"feature:main", "feature:refs/heads/other", "feature:refs/tags/v1", "--delete feature"} {
		if r := h.sh("git-feature", "cd /workspace/app && git push -q origin "+refspec); r.ExitCode == 0 {
			t.Errorf("push %s passed: %+v", refspec, r)
		}
	}
	if r := h.sh("git-feature", "cd /workspace/app && git push -q "+h.gs.URL()+"/bob/private.git feature:main"); r.ExitCode == 0 {
		t.Errorf("a push to another repository passed: %+v", r)
	}
	if h.gs.Head(t, "alice/app", "main") != mainHead || h.gs.Head(t, "alice/app", "feature") != featHead {
		t.Fatal("a refused push moved a branch")
	}

	// Planted configuration: each would touch a marker if some git on the
	// host read it; in the sandbox its /tmp is the sandbox's own.
	b = make([]byte, 6)
	rand.Read(b)
	marker := "/tmp/sbx-planted-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		m, _ := filepath.Glob(marker + "*")
		for _, f := range m {
			os.Remove(f)
		}
	})
	plant := `set -e; cd /workspace/app
printf '#!/bin/sh\ntouch ` + marker + `-hook-$(basename $0)\n' > .git/hooks/pre-push
cp .git/hooks/pre-push .git/hooks/post-commit; cp .git/hooks/pre-push .git/hooks/pre-commit; chmod +x .git/hooks/*
printf '#!/bin/sh\ntouch ` + marker + `-fsmonitor\n' > /workspace/fsmon; chmod +x /workspace/fsmon
git config core.fsmonitor /workspace/fsmon
git config core.sshCommand 'touch ` + marker + `-ssh; false'
git config filter.evil.clean 'touch ` + marker + `-clean; cat'
git config filter.evil.smudge 'touch ` + marker + `-smudge; cat'
echo '* filter=evil' > .gitattributes
echo work > work.txt
git add -A && git -c user.name=u -c user.email=u@example.com commit -q -m 'work in the sandbox'
git rev-parse HEAD`
	r := h.sh("git-main", plant)
	if r.ExitCode != 0 {
		t.Fatalf("plant and commit: %+v", r)
	}
	commit := strings.TrimSpace(r.Stdout)
	td := h.teardownGit("git-main")
	if !td.GitPushed || td.GitError != nil || len(td.GitCommits) != 1 || td.GitCommits[0] != commit {
		t.Fatalf("teardown push: %+v %v (want %s)", td, *td.GitError, commit)
	}
	if got := h.gs.Head(t, "alice/app", "main"); got != commit {
		t.Fatalf("the Git host's main is %s, want %s", got, commit)
	}
	if m, _ := filepath.Glob(marker + "*"); len(m) > 0 {
		t.Fatalf("planted git configuration ran on the host: %v", m)
	}

	// A branch that moved on the host: the push is rejected, the work stays.
	if code, b := h.call(h.harness.token, "POST", "/v1/sandbox/git-main/resume", nil); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, b)
	}
	r = h.sh("git-main", "cd /workspace/app && echo more > more.txt && git add more.txt && git -c core.hooksPath=/dev/null -c user.name=u -c user.email=u@example.com commit -q -m more && git rev-parse HEAD")
	if r.ExitCode != 0 {
		t.Fatalf("second commit: %+v", r)
	}
	local := strings.TrimSpace(r.Stdout)
	other := t.TempDir()
	gittest.Git(t, other, "clone", "-q", filepath.Join(h.gs.Root, "alice/app.git"), "c")
	os.WriteFile(filepath.Join(other, "c", "theirs.txt"), []byte("theirs\n"), 0o644)
	gittest.Git(t, filepath.Join(other, "c"), "add", "theirs.txt")
	gittest.Git(t, filepath.Join(other, "c"), "commit", "-q", "-m", "theirs")
	gittest.Git(t, filepath.Join(other, "c"), "push", "-q", "origin", "main")
	theirs := h.gs.Head(t, "alice/app", "main")
	td = h.teardownGit("git-main")
	if td.GitPushed || td.GitError == nil || *td.GitError != "rejected_non_fast_forward" || len(td.GitCommits) != 1 || td.GitCommits[0] != local {
		t.Fatalf("rejected push: %+v (gitError %v)", td, derefOr(td.GitError))
	}
	if h.gs.Head(t, "alice/app", "main") != theirs {
		t.Fatal("the rejected push changed the host's branch")
	}
	if code, b := h.call(h.harness.token, "POST", "/v1/sandbox/git-main/resume", nil); code != http.StatusOK {
		t.Fatalf("resume after a rejected push: %d %s", code, b)
	}
	if r := h.sh("git-main", "cd /workspace/app && git rev-parse HEAD && cat more.txt"); !strings.Contains(r.Stdout, local+"\nmore") {
		t.Fatalf("the workspace after a rejected push: %+v", r)
	}

	// Nothing new: nothing to push.
	if td := h.teardownGit("git-feature"); td.GitPushed || td.GitError == nil || *td.GitError != "nothing_to_push" || len(td.GitCommits) != 0 {
		t.Fatalf("nothing to push: %+v", td)
	}
	for _, id := range []string{"git-main", "git-feature"} {
		if code, b := h.call(h.harness.token, "DELETE", "/v1/sandbox/"+id, nil); code != http.StatusNoContent {
			t.Errorf("delete %s: %d %s", id, code, b)
		}
	}
}

// derefOr prints a *string for a failure message.
func derefOr(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
