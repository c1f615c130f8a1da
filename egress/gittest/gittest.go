// Package gittest runs a real Git server for tests: git's own smart-HTTP
// backend (git http-backend) behind an HTTPS server on loopback that, like
// GitHub, wants a token for every private repository and answers 404 to a
// token without access. It also serves GET /api/v3/user for the tokens it
// knows. It records which requests carried which credential.
//
// Concurrency: a Server is safe for concurrent use.
package gittest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is a Git host on 127.0.0.1 with a certificate for Host.
type Server struct {
	Host  string
	Port  int
	CAPEM []byte // the root its certificate chains to
	Root  string // GIT_PROJECT_ROOT: <owner>/<name>.git bare repositories

	srv     *httptest.Server
	backend string

	mu     sync.Mutex
	grants map[string]map[string]bool // token -> repositories
	log    []Request
}

// Request is one request the server saw.
type Request struct {
	Method, Path, Query string
	Token               string // the Basic password or Bearer token; "" when none
}

// New starts a server for host (its certificate also names localhost);
// it stops when the test ends.
func New(t testing.TB, host string) *Server {
	t.Helper()
	exe, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git: %v", err)
	}
	s := &Server{Host: host, Root: t.TempDir(), grants: map[string]map[string]bool{},
		backend: filepath.Join(strings.TrimSpace(string(exe)), "git-http-backend")}
	cert, caPEM := CertFor(t, host)
	s.CAPEM = caPEM
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	s.Port = s.srv.Listener.Addr().(*net.TCPAddr).Port
	return s
}

// URL is the server's base URL by name: https://host:port.
func (s *Server) URL() string { return "https://" + net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// Grant lets token read and write repo ("owner/name").
func (s *Server) Grant(token, repo string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grants[token] == nil {
		s.grants[token] = map[string]bool{}
	}
	s.grants[token][repo] = true
}

// Requests returns what the server saw so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// Git runs git with a fixed identity in dir and returns its output.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t",
		"GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// AddRepo creates the bare repository repo ("owner/name") with a commit of
// file README on each branch (the first is the default) and returns its
// path.
func (s *Server) AddRepo(t testing.TB, repo string, branches ...string) string {
	t.Helper()
	work := t.TempDir()
	Git(t, work, "init", "-q", "-b", branches[0])
	for i, b := range branches {
		if i > 0 {
			Git(t, work, "checkout", "-q", "-b", b, branches[0])
		}
		os.WriteFile(filepath.Join(work, "README"), []byte("branch "+b+" of "+repo+"\n"), 0o644)
		Git(t, work, "add", "README")
		Git(t, work, "commit", "-q", "-m", "on "+b)
	}
	Git(t, work, "checkout", "-q", branches[0]) // the default branch
	bare := filepath.Join(s.Root, repo+".git")
	os.MkdirAll(filepath.Dir(bare), 0o755)
	Git(t, s.Root, "clone", "-q", "--bare", work, bare)
	Git(t, bare, "config", "http.receivepack", "true")
	return bare
}

// Head returns the commit a branch of repo points to.
func (s *Server) Head(t testing.TB, repo, branch string) string {
	t.Helper()
	return Git(t, filepath.Join(s.Root, repo+".git"), "rev-parse", "refs/heads/"+branch)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	token := ""
	if _, p, ok := r.BasicAuth(); ok {
		token = p
	} else if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		token = b
	}
	s.mu.Lock()
	s.log = append(s.log, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Token: token})
	known := s.grants[token] != nil
	s.mu.Unlock()
	if r.URL.Path == "/api/v3/user" {
		if !known {
			http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"login": "user-" + token[:min(4, len(token))]})
		return
	}
	repo := repoOf(r.URL.Path)
	if repo == "" {
		http.NotFound(w, r)
		return
	}
	if token == "" {
		w.Header().Set("WWW-Authenticate", `Basic realm="gittest"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return
	}
	s.mu.Lock()
	ok := s.grants[token][repo]
	s.mu.Unlock()
	if !ok {
		http.Error(w, "Repository not found.", http.StatusNotFound)
		return
	}
	if r.ContentLength < 0 {
		// Go's CGI host refuses chunked bodies; git sends large pushes so.
		b, err := io.ReadAll(io.LimitReader(r.Body, 1<<30))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
	}
	(&cgi.Handler{Path: s.backend, Env: []string{"GIT_PROJECT_ROOT=" + s.Root, "GIT_HTTP_EXPORT_ALL=1"}}).ServeHTTP(w, r)
}

// repoOf returns "owner/name" of a smart-HTTP path, "" for others.
func repoOf(p string) string {
	for _, end := range []string{"/info/refs", "/git-upload-pack", "/git-receive-pack"} {
		if rest, ok := strings.CutSuffix(p, end); ok {
			parts := strings.Split(strings.TrimSuffix(strings.TrimPrefix(rest, "/"), ".git"), "/")
			if len(parts) == 2 && parts[0] != "" && parts[1] != "" {
				return parts[0] + "/" + parts[1]
			}
		}
	}
	return ""
}

// CertFor makes a CA and a leaf certificate for host (and localhost)
// signed by it; it returns the leaf and the CA's PEM.
func CertFor(t testing.TB, host string) (tls.Certificate, []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gittest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host, "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}
