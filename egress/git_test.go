package egress

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/egress/gittest"
)

// gitEnv is a proxy with a CA for git.test and a real Git server behind it.
type gitEnv struct {
	*env
	gs     *gittest.Server
	caFile string
}

func newGitEnv(t *testing.T) *gitEnv {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	gs := gittest.New(t, "git.test")
	dir := t.TempDir()
	ca, err := LoadCA(dir, "git.test")
	if err != nil {
		t.Fatal(err)
	}
	roots, err := GitRoots(gs.CAPEM)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := NewPolicy(testConfig()) // git.test is on no allowlist: only the pairing lets it through
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, res: newResolver(), events: &recEvents{}}
	e.res.set("git.test", "127.0.0.1")
	e.p = New(pol, Options{Events: e.events, Resolver: e.res, CA: ca, GitRoots: roots})
	t.Cleanup(e.p.Shutdown)
	caFile := filepath.Join(dir, "trust.pem")
	os.WriteFile(caFile, ca.PEM(), 0o644)
	return &gitEnv{env: e, gs: gs, caFile: caFile}
}

func (g *gitEnv) servePaired(id string, pair *GitPairing) string {
	g.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- g.p.Serve(l, id, SessionOptions{Limit: 1 << 30, Git: pair}) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, _, ok := g.p.Usage(id); ok {
			break
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("session %s not registered", id)
		}
	}
	g.t.Cleanup(func() { g.p.Close(id); <-done })
	return l.Addr().String()
}

// git runs the host's git as a sandbox would: through the proxy, trusting
// only the installation's CA, with no credential of its own.
func (g *gitEnv) git(proxy, dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + dir, "PATH=" + os.Getenv("PATH"), "HTTPS_PROXY=http://" + proxy,
		"GIT_SSL_CAINFO=" + g.caFile, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LANG=C",
		"GIT_AUTHOR_NAME=s", "GIT_AUTHOR_EMAIL=s@s", "GIT_COMMITTER_NAME=s", "GIT_COMMITTER_EMAIL=s@s"}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestGitPairing(t *testing.T) {
	g := newGitEnv(t)
	const token = "ghp_pairedTOKEN0123456789"
	g.gs.AddRepo(t, "alice/private", "main", "dev")
	g.gs.AddRepo(t, "bob/secret", "main")
	g.gs.Grant(token, "alice/private")
	g.gs.Grant(token, "bob/secret") // the token could, the pairing must not
	base := g.gs.URL()
	proxy := g.servePaired("s1", &GitPairing{Host: "git.test", Port: g.gs.Port, Repo: "alice/private", Branch: "main", User: "x-access-token", Token: token})
	work := t.TempDir()

	if out, err := g.git(proxy, work, "clone", "-q", base+"/alice/private.git", "repo"); err != nil {
		t.Fatalf("clone of the paired repository: %v\n%s", err, out)
	}
	repo := filepath.Join(work, "repo")
	if b, _ := os.ReadFile(filepath.Join(repo, "README")); !strings.Contains(string(b), "branch main of alice/private") {
		t.Fatalf("README = %q", b)
	}
	if out, err := g.git(proxy, work, "clone", "-q", "--branch", "dev", "https://GIT.test:"+strings.Split(base, ":")[2]+"/alice/private", "dev"); err != nil {
		t.Fatalf("clone of a branch (host in capitals, no .git): %v\n%s", err, out)
	}
	if out, err := g.git(proxy, work, "clone", "-q", base+"/bob/secret.git", "other"); err == nil {
		t.Fatalf("a repository other than the paired one was cloned with the credential:\n%s", out)
	}

	// A push to the paired branch passes; anything else is refused before
	// the Git host sees it.
	os.WriteFile(filepath.Join(repo, "new.txt"), []byte("work\n"), 0o644)
	gittest.Git(t, repo, "add", "new.txt")
	gittest.Git(t, repo, "commit", "-q", "-m", "work")
	head := gittest.Git(t, repo, "rev-parse", "HEAD")
	if out, err := g.git(proxy, repo, "push", "-q", "origin", "main"); err != nil {
		t.Fatalf("push to the paired branch: %v\n%s", err, out)
	}
	if got := g.gs.Head(t, "alice/private", "main"); got != head {
		t.Fatalf("server main = %s, want %s", got, head)
	}
	devBefore := g.gs.Head(t, "alice/private", "dev")
	for _, refspec := range [][]string{{"main:dev"}, {"main:refs/heads/new"}, {"--delete", "main"}, {"main:refs/tags/v1"}, {"main", "main:dev"}} {
		args := append([]string{"push", "-q", "origin"}, refspec...)
		if out, err := g.git(proxy, repo, args...); err == nil {
			t.Errorf("push %v passed:\n%s", refspec, out)
		}
	}
	if g.gs.Head(t, "alice/private", "dev") != devBefore || g.gs.Head(t, "alice/private", "main") != head {
		t.Fatal("a refused push changed the server's branches")
	}
	g.events.waitDenied(t, ReasonGitPush)

	// The credential went with the paired repository's requests only.
	for _, r := range g.gs.Requests() {
		paired := strings.HasPrefix(strings.ToLower(r.Path), "/alice/private")
		if !paired && r.Token != "" {
			t.Errorf("credential sent with %s %s", r.Method, r.Path)
		}
		if paired && r.Token != token {
			t.Errorf("%s %s without the credential", r.Method, r.Path)
		}
	}

	// A session without a pairing reaches no Git host (not allowlisted) and
	// gets no credential.
	bare := g.serve("s2", 0, 1<<30)
	if out, err := g.git(bare, work, "clone", "-q", base+"/alice/private.git", "x"); err == nil {
		t.Fatalf("an unpaired session cloned:\n%s", out)
	}
	g.events.waitDenied(t, ReasonNotAllowlisted)
}

func TestCANameConstrained(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadCA(dir, "git.test")
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadCA(dir, "git.test")
	if err != nil || !bytes.Equal(again.PEM(), ca.PEM()) {
		t.Fatalf("the CA was not kept: %v", err)
	}
	if st, err := os.Stat(filepath.Join(dir, caKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", st.Mode(), err)
	}
	blk, _ := pem.Decode(ca.PEM())
	root, _ := x509.ParseCertificate(blk.Bytes)
	pool := x509.NewCertPool()
	pool.AddCert(root)
	leaf, err := ca.leaf("git.test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "git.test"}); err != nil {
		t.Fatalf("leaf for the Git host: %v", err)
	}
	// Even a certificate the key signs for another name does not verify.
	other, err := ca.leaf("bank.example")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "bank.example"}); err == nil {
		t.Fatal("the CA's certificate for another host verified: it must be name-constrained")
	}
	moved, err := LoadCA(dir, "git.example.com")
	if err != nil || bytes.Equal(moved.PEM(), ca.PEM()) {
		t.Fatalf("a new Git host kept the old CA: %v", err)
	}
}

func TestCheckPush(t *testing.T) {
	pkt := func(s string) string { return strings.ToLower(hex4(len(s)+4)) + s }
	z, a, b := strings.Repeat("0", 40), strings.Repeat("a", 40), strings.Repeat("b", 40)
	ok := pkt(a+" "+b+" refs/heads/main\x00report-status side-band-64k quiet object-format=sha1 agent=git/2.39.5\n") + "0000PACK..."
	r, err := checkPush(strings.NewReader(ok), "refs/heads/main")
	if err != nil {
		t.Fatal(err)
	}
	if all, _ := io.ReadAll(r); string(all) != ok {
		t.Fatal("the body was not passed on whole")
	}
	for name, body := range map[string]string{
		"other branch": pkt(a+" "+b+" refs/heads/dev\x00caps\n") + "0000",
		"second ref":   pkt(a+" "+b+" refs/heads/main\x00caps\n") + pkt(a+" "+b+" refs/heads/dev\n") + "0000",
		"delete":       pkt(a+" "+z+" refs/heads/main\x00caps\n") + "0000",
		"tag":          pkt(z+" "+b+" refs/tags/main\x00caps\n") + "0000",
		"no commands":  "0000PACK",
		"truncated":    pkt(a + " " + b + " refs/heads/main\n")[:20],
		"bad length":   "zzzz",
		"push cert":    pkt("push-cert\x00caps\n") + "0000",
	} {
		if _, err := checkPush(strings.NewReader(body), "refs/heads/main"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := checkPush(strings.NewReader(pkt("shallow "+a+"\n")+pkt(z+" "+b+" refs/heads/main\x00report-status agent=git/2.39\n")+"0000"), "refs/heads/main"); err != nil {
		t.Errorf("a creation after a shallow line: %v", err)
	}
	if _, err := checkPush(strings.NewReader("0000"), "refs/heads/main"); err != nil {
		t.Errorf("git's probe before a large push: %v", err)
	}
	for name, body := range map[string]string{
		"push options": pkt(a+" "+b+" refs/heads/main\x00report-status push-options\n") + "0000",
		"push cert":    pkt(a+" "+b+" refs/heads/main\x00push-cert=1\n") + "0000",
		"nbsp in ref":  pkt(a+" "+b+" refs/heads/main\u00a0\x00report-status\n") + "0000",
	} {
		if _, err := checkPush(strings.NewReader(body), "refs/heads/main"); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func hex4(n int) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[n>>12&15], digits[n>>8&15], digits[n>>4&15], digits[n&15]})
}
