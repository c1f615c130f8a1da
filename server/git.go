package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"sandboxd/egress"
	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/server/sandbox"
)

// gitSetup loads what git pairing needs: the installation's CA for the Git
// host (made on first start, in <data-dir>/git-ca), the roots that host
// must chain to, and the sandboxes' trust bundle (the image's roots plus
// the CA), written where the driver mounts it from.
func gitSetup(cfg *config.Config, img string) (*egress.CA, *x509.CertPool, sandbox.GitHost, error) {
	g := cfg.Git
	host, port, prefix := g.WebHost()
	ca, err := egress.LoadCA(filepath.Join(cfg.DataDir, "git-ca"), host)
	if err != nil {
		return nil, nil, sandbox.GitHost{}, err
	}
	var extra []byte
	if g.CAFile != "" {
		if extra, err = os.ReadFile(g.CAFile); err != nil {
			return nil, nil, sandbox.GitHost{}, fmt.Errorf("git.caFile: %w", err)
		}
	}
	roots, err := egress.GitRoots(extra)
	if err != nil {
		return nil, nil, sandbox.GitHost{}, fmt.Errorf("git.caFile: %w", err)
	}
	system, _ := os.ReadFile(filepath.Join(img, runsc.TrustStore)) // a fake image in tests has none
	if err := writeFileAtomic(config.TrustBundlePath(cfg.DataDir), ca.Bundle(system), 0o644); err != nil {
		return nil, nil, sandbox.GitHost{}, fmt.Errorf("trust bundle: %w", err)
	}
	return ca, roots, sandbox.GitHost{
		WebURL: g.WebURL, Host: host, Port: port, Prefix: prefix, User: g.Username,
		CloneTimeout: time.Duration(g.CloneTimeoutSeconds) * time.Second,
		PushTimeout:  time.Duration(g.PushTimeoutSeconds) * time.Second,
	}, nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// checkGitToken asks the Git host's API whose credential this is
// (GET <apiURL>/user), so a mistyped or expired one is refused when it is
// connected rather than at the first clone. No API configured: not checked.
func (s *Server) checkGitToken(ctx context.Context, token string) error {
	if s.cfg.Git.APIURL == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.Git.APIURL+"/user", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	c := &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: s.gitRoots, MinVersion: tls.VersionTLS12}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		s.log.Warn("check Git credential", "err", errors.Unwrap(err))
		return errdefs.Unavailable("the Git host's API could not be reached to check the credential; retry later")
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return badRequest("token: the Git host refused this credential (HTTP %d); nothing was stored", resp.StatusCode)
	}
	return errdefs.Unavailable("the Git host's API answered HTTP %d when checking the credential; retry later", resp.StatusCode)
}
