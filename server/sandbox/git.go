package sandbox

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strings"
	"time"

	"sandboxd/egress"
	"sandboxd/runsc"
	"sandboxd/server/errdefs"
	"sandboxd/store"
)

// GitHost is the Git server paired repositories live on (config git.*).
// Git runs inside the sandbox only; the egress proxy adds the session
// creator's credential to the paired repository's requests (see
// egress.GitPairing), so no git process ever runs on the host and the
// credential never enters the sandbox.
type GitHost struct {
	WebURL       string // https://host[:port][/prefix], no trailing slash
	Host         string
	Port         int
	Prefix       string
	User         string // the HTTP Basic user name sent with a credential
	CloneTimeout time.Duration
	PushTimeout  time.Duration
}

// GitResult is what a teardown's push did.
type GitResult struct {
	Pushed  bool
	Commits []string // the commits pushed (newest first), or that would have been
	Error   string   // a GitPush* class; "" when pushed or nothing to push
}

// Classes of a clone's failure (in git_clone_failed's message) and of a
// push's (the teardown's gitError).
const (
	GitNoAccess     = "no_access"      // the credential cannot read (or write) the repository, or it does not exist
	GitNoBranch     = "no_such_branch" // the branch is not in the repository
	GitNetwork      = "network"        // the Git host could not be reached
	GitTimeout      = "timeout"
	GitRejected     = "rejected_non_fast_forward" // the branch moved on the host; pull and push again
	GitNothing      = "nothing_to_push"
	GitNoPermission = "no_permission" // the credential may not push there (or the push was to another branch)
	GitNoRepository = "no_repository" // the clone is gone from the workspace, or its branch is
	GitNotRunning   = "sandbox_not_running"
	GitOther        = "failed"
)

// pairing is the egress proxy's view of a session's pairing, with the
// credential of the user who provisioned it (nil: none, or not paired).
func (m *Manager) pairing(ses *store.Session) *egress.GitPairing {
	if ses.GitRepo == "" || m.git.Host == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tok, err := m.db.GitToken(ctx, ses.CreatedBy)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			m.log.Error("read Git credential", "session", ses.SessionID, "err", err)
		}
		return nil
	}
	return &egress.GitPairing{Host: m.git.Host, Port: m.git.Port, Prefix: m.git.Prefix, Repo: ses.GitRepo,
		Branch: ses.GitBranch, User: m.git.User, Token: tok}
}

var (
	objectID = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)
	// branchRe is the provision API's character set for branches (a
	// default branch read in the sandbox is held to it).
	branchRe = regexp.MustCompile(`^[A-Za-z0-9._/-]+$`)
)

// GitCredentialChanged gives the user's running paired sessions the
// credential as it is now (connected, replaced or removed), so a removed
// one is used for nothing from then on.
func (m *Manager) GitCredentialChanged(ctx context.Context, userID string) {
	live, err := m.db.ListLiveSessions(ctx)
	if err != nil {
		m.log.Error("refresh Git credentials", "err", err)
		return
	}
	for i := range live {
		if ses := &live[i]; ses.CreatedBy == userID && ses.GitRepo != "" {
			m.egress.UpdateGit(ses.ID, m.pairing(ses))
		}
	}
}

// RepoDir is where a session's paired repository is cloned.
func RepoDir(repo string) string {
	_, name, _ := strings.Cut(repo, "/")
	return runsc.Workspace + "/" + name
}

// gitEnv: git in the sandbox never prompts and speaks English (its
// messages are classified).
func (m *Manager) gitEnv(ses *store.Session) []string {
	return CommandEnv(ses.Env, nil, map[string]string{"GIT_TERMINAL_PROMPT": "0", "LANG": "C", "LC_ALL": "C", "GIT_ASKPASS": "", "SSH_ASKPASS": ""})
}

// gitRun runs git in the sandbox as its user and returns stdout, stderr.
func (m *Manager) gitRun(ctx context.Context, ses *store.Session, timeout time.Duration, args ...string) (string, string, runsc.ExecResult, error) {
	var out, errb capped
	out.max, errb.max = 64<<10, 64<<10
	res, err := m.rt.Exec(ctx, ses.ContainerID, runsc.ExecRequest{
		Args: append([]string{"git"}, args...), Env: m.gitEnv(ses), Cwd: runsc.Workspace,
		Stdout: &out, Stderr: &errb, Timeout: timeout,
	})
	return out.String(), errb.String(), res, err
}

// cloneLocked clones the paired repository into the new sandbox's
// workspace before it is running. A failure is git_clone_failed with the
// class only: git's own words may quote URLs or the server's answers.
func (m *Manager) cloneLocked(ctx context.Context, ses *store.Session) error {
	url := m.git.WebURL + "/" + ses.GitRepo + ".git"
	args := []string{"-c", "credential.helper=", "clone", "--quiet"}
	if ses.GitBranch != "" {
		args = append(args, "--branch", ses.GitBranch)
	}
	args = append(args, "--", url, RepoDir(ses.GitRepo))
	start := time.Now()
	_, stderr, res, err := m.gitRun(ctx, ses, m.git.CloneTimeout, args...)
	class := ""
	switch {
	case err != nil:
		m.log.Error("git clone", "session", ses.SessionID, "err", err)
		class = GitOther
	case res.TimedOut:
		class = GitTimeout
	case res.ExitCode != 0:
		class = classifyGit(stderr)
		// Operators may read git's words (the server's log is scrubbed).
		m.log.Info("git clone failed", "session", ses.SessionID, "class", class, "stderr", firstLine(stderr))
	}
	if class != "" {
		m.events.Event(ses.ID, "git_clone_failed", map[string]any{"class": class})
		return errdefs.New(errdefs.ErrUnprocessable, "cloning %s failed (%s): %s; nothing was provisioned", ses.GitRepo, class, gitAdvice(class)).WithCode("git_clone_failed")
	}
	if ses.GitBranch == "" {
		// The default branch is the paired one: pushes go there.
		out, _, res, err := m.gitRun(ctx, ses, time.Minute, "-C", RepoDir(ses.GitRepo), "symbolic-ref", "--short", "HEAD")
		if b := strings.TrimSpace(out); err == nil && res.ExitCode == 0 && branchRe.MatchString(b) && len(b) <= 255 {
			ses.GitBranch = b
			if err := m.db.UpdateSession(ctx, ses); err != nil {
				return err
			}
			// The proxy's pairing learns the branch pushes may update.
			m.egress.UpdateGit(ses.ID, m.pairing(ses))
		}
	}
	m.events.Event(ses.ID, "git_cloned", map[string]any{"repo": ses.GitRepo, "branch": ses.GitBranch, "ms": time.Since(start).Milliseconds()})
	return nil
}

// pushLocked pushes the paired branch's new commits from the running
// sandbox (teardown, before anything stops). It never fails the teardown:
// what happened is in the result.
func (m *Manager) pushLocked(ctx context.Context, ses *store.Session, live bool) *GitResult {
	if ses.GitRepo == "" {
		return nil
	}
	res := &GitResult{}
	if !live {
		res.Error = GitNotRunning
		return res
	}
	dir, branch := RepoDir(ses.GitRepo), ses.GitBranch
	local, remote := "refs/heads/"+branch, "refs/remotes/origin/"+branch
	out, stderr, er, err := m.gitRun(ctx, ses, time.Minute, "-C", dir, "rev-list", "--max-count=1000", remote+".."+local, "--")
	if err != nil || er.ExitCode != 0 || branch == "" {
		m.log.Info("git push: no branch to push", "session", ses.SessionID, "err", err, "stderr", firstLine(stderr))
		res.Error = GitNoRepository
		return res
	}
	// What the sandbox printed: only object ids are taken from it.
	for _, c := range strings.Fields(out) {
		if objectID.MatchString(c) {
			res.Commits = append(res.Commits, c)
		}
	}
	if len(res.Commits) == 0 {
		res.Error = GitNothing
		return res
	}
	// To the paired repository by URL (whatever origin now says), hooks
	// off: a teardown runs no code the sandbox left for it.
	url := m.git.WebURL + "/" + ses.GitRepo + ".git"
	_, stderr, er, err = m.gitRun(ctx, ses, m.git.PushTimeout, "-C", dir, "-c", "core.hooksPath=/dev/null", "-c", "credential.helper=",
		"push", "--porcelain", "--", url, local+":"+local)
	switch {
	case err != nil:
		res.Error = GitOther
	case er.TimedOut:
		res.Error = GitTimeout
	case er.ExitCode != 0:
		if res.Error = classifyGit(stderr); res.Error == GitNoAccess {
			res.Error = GitNoPermission
		}
	default:
		res.Pushed = true
		// The tracking ref says what the host has now, so the next
		// teardown counts only newer commits.
		_, _, _, _ = m.gitRun(ctx, ses, time.Minute, "-C", dir, "update-ref", remote, local)
	}
	if !res.Pushed {
		m.log.Info("git push failed", "session", ses.SessionID, "class", res.Error, "err", err, "timedOut", er.TimedOut, "stderr", firstLine(stderr))
	}
	m.events.Event(ses.ID, "git_pushed", map[string]any{"pushed": res.Pushed, "commits": len(res.Commits), "error": res.Error})
	return res
}

// urlInMessage is a URL as git quotes it in a message.
var urlInMessage = regexp.MustCompile(`[a-z][a-z0-9+.-]*://[^\s'"]+`)

// classifyGit names the class of a failed clone or push from git's
// messages (LANG=C).
func classifyGit(stderr string) string {
	// URLs go first: a host's port (":40381") or a repository's name
	// ("ssl-tools") must not read as a status or a TLS failure.
	s := urlInMessage.ReplaceAllString(strings.ToLower(stderr), "<url>")
	has := func(subs ...string) bool {
		for _, sub := range subs {
			if strings.Contains(s, sub) {
				return true
			}
		}
		return false
	}
	switch {
	case has("remote branch", "couldn't find remote ref") && has("not found"):
		return GitNoBranch
	case has("[rejected]", "non-fast-forward", "fetch first", "failed to push some refs") && !has("error: 403", "error: 401", "http 403", "http 401", "sandboxd:"):
		return GitRejected
	case has("could not resolve", "failed to connect", "connection refused", "connection timed out", "timed out",
		"proxy connect aborted", "connect tunnel failed", "returned error: 502", "returned error: 503", "returned error: 504",
		"ssl", "tls", "gnutls", "certificate", "connection reset", "early eof", "unexpected disconnect"):
		return GitNetwork
	case has("authentication failed", "could not read username", "could not read password", "repository not found",
		"returned error: 401", "returned error: 403", "returned error: 404", "not found", "permission", "denied", "http 403", "http 401"):
		return GitNoAccess
	}
	return GitOther
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:] // git's last line is its verdict
	}
	return s[:min(len(s), 300)]
}

// gitAdvice says what a client can do about a class.
func gitAdvice(class string) string {
	switch class {
	case GitNoAccess:
		return "the repository does not exist or the connected credential cannot read it"
	case GitNoBranch:
		return "the branch does not exist in the repository"
	case GitNetwork:
		return "the Git host could not be reached; retry later"
	case GitTimeout:
		return "it took longer than the server's limit"
	}
	return "git failed; retry, or provision without gitRepo and clone yourself"
}

// capped keeps the first max bytes written to it.
type capped struct {
	bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
