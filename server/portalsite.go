package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"sandboxd/server/errdefs"
	"sandboxd/server/portal"
	"sandboxd/store"
)

// A session's portal origin, for browsers: the ticket login, the cookie
// check, the index page and the proxy. Nothing of the API is served here,
// and the cookie is accepted nowhere else.

// tokenCheckTTL is how long a token's role is trusted before the store is
// asked again (a portal page loads hundreds of assets).
const tokenCheckTTL = 5 * time.Second

type roleCache struct {
	mu sync.Mutex
	m  map[string]roleEntry
}

type roleEntry struct {
	role string
	err  error
	at   time.Time
}

func (s *Server) tokenRole(ctx context.Context, tokenID string) (string, error) {
	now := time.Now()
	s.roles.mu.Lock()
	e, ok := s.roles.m[tokenID]
	s.roles.mu.Unlock()
	if ok && now.Sub(e.at) < tokenCheckTTL {
		return e.role, e.err
	}
	role, err := s.db.TokenRole(ctx, tokenID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return "", err // not cached: the store's trouble passes
	}
	s.roles.mu.Lock()
	if len(s.roles.m) > 10000 {
		clear(s.roles.m)
	}
	s.roles.m[tokenID] = roleEntry{role, err, now}
	s.roles.mu.Unlock()
	return role, err
}

// servePortal serves every request addressed to a portal origin.
func (s *Server) servePortal(w http.ResponseWriter, r *http.Request, key string) {
	rid := newRequestID()
	w.Header().Set("X-Request-Id", rid)
	sw := &statusWriter{ResponseWriter: w}
	w = sw
	defer func() {
		st := sw.status
		if st == 0 { // hijacked: the proxy wrote 101 on the connection itself
			st = http.StatusSwitchingProtocols
		}
		s.met.requests.WithLabelValues("portal", strconv.Itoa(st)).Inc()
	}()
	origin := s.cfg.Portal.Scheme + "://" + r.Host
	// The client's and then the token's request limits (fair.go), as on
	// the API's routes.
	release, err := s.admit(w.Header(), scopeAddress, s.clientKey(r))
	if err != nil {
		s.portalError(w, r, rid, "", err)
		return
	}
	defer release()
	w = &releaser{ResponseWriter: w, release: release}
	if r.URL.Path == loginPath {
		s.portalLogin(w, r, key, rid)
		return
	}
	pk := "" // the session's, once known: its secrets are redacted from the log
	fail := func(err error) { s.portalError(w, r, rid, pk, err) }
	var g portal.Grant
	var p store.Principal
	found, demoted := false, false
	for _, cand := range s.keys.Grants(r, key, time.Now()) {
		role, err := s.tokenRole(r.Context(), cand.Token)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			fail(err)
			return
		}
		demoted = demoted || err == nil
		if err == nil && Can(role, PermProjectUpdate) {
			g, found = cand, true
			p = store.Principal{Org: store.Org{ID: cand.Org}, User: store.User{ID: cand.User}, TokenID: cand.Token, Role: role}
			break
		}
	}
	if !found {
		if demoted {
			fail(forbidden(PermProjectUpdate))
			return
		}
		fail(errPortalSignedOut)
		return
	}
	release, err = s.admit(w.Header(), scopeToken, p.TokenID)
	if err != nil {
		fail(err)
		return
	}
	defer release()
	w = &releaser{ResponseWriter: w, release: release}
	if why := portal.CrossOrigin(r, origin); why != "" {
		if r.Method == http.MethodGet && r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Header.Get("Sec-Fetch-Dest") == "document" {
			// A person who followed a link from elsewhere: one click on
			// this origin's own page goes on (it cannot be framed).
			portal.WritePage(w, http.StatusForbidden, portal.Page{Title: "Open this sandbox?",
				Message: "This page of a sandbox was opened from another site. Continue only if you meant to open it.",
				Links:   []portal.Link{{Href: continueHref(r.URL), Text: "Continue to " + r.URL.Path}}})
			return
		}
		fail(errCrossOrigin)
		return
	}
	ses, err := s.sessions.Get(r.Context(), g.Org, g.Session)
	if err != nil {
		fail(err)
		return
	}
	pk = ses.ID
	if r.URL.Path == "/" {
		s.portalIndex(w, &ses)
		return
	}
	t, err := portal.Parse(r.URL.EscapedPath())
	if err != nil {
		fail(errdefs.NotFound("%s", err.Error()))
		return
	}
	wait := serviceWaitAPI
	if portal.Navigation(r) {
		wait = serviceWaitPage
	}
	s.proxy(w, r, p, &ses, portal.Call{Target: t, Origin: origin, Wait: wait}, fail)
}

// statusWriter remembers the status of an answer; the proxy reaches the
// connection's Flush and Hijack through Unwrap (http.ResponseController).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// portalLogin turns a single-use ticket into the portal cookie, host-only
// on this session's portal origin, and sends the browser on.
func (s *Server) portalLogin(w http.ResponseWriter, r *http.Request, key, rid string) {
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("Cache-Control", "no-store")
	fail := func(err error) { s.portalError(w, r, rid, "", err) }
	if r.Method != http.MethodGet {
		fail(errdefs.New(errdefs.ErrMethod, "method not allowed on this route"))
		return
	}
	q := r.URL.Query()
	t, ok, err := s.redeemTicket(r.Context(), q.Get("ticket"))
	if err != nil {
		fail(err)
		return
	}
	if !ok {
		fail(errPortalTicket)
		return
	}
	rec := store.AuditRecord{
		Time: time.Now().UTC(), OrgID: t.p.Org.ID, UserID: t.p.User.ID, TokenID: t.p.TokenID,
		Action: "portal.open", SessionID: t.sessionID, RemoteAddr: r.RemoteAddr, RequestID: rid,
		Details: map[string]any{"via": "browser"},
	}
	if portal.SessionKey(t.p.Org.ID, t.sessionID) != key {
		rec.Outcome, rec.Status = "denied", http.StatusForbidden
		s.db.Audit(rec)
		fail(errdefs.Forbidden("this link belongs to another sandbox"))
		return
	}
	if !Can(t.p.Role, PermProjectUpdate) {
		rec.Outcome, rec.Status = "denied", http.StatusForbidden
		s.db.Audit(rec)
		fail(forbidden(PermProjectUpdate))
		return
	}
	next := q.Get("next")
	if !safeNext(next) {
		next = "/"
	}
	http.SetCookie(w, &http.Cookie{
		Name: portal.CookieName,
		Value: s.keys.Sign(portal.Grant{Org: t.p.Org.ID, Session: t.sessionID, User: t.p.User.ID,
			Token: t.p.TokenID, Expires: time.Now().Add(portal.CookieTTL)}),
		Path: "/", MaxAge: int(portal.CookieTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: s.cfg.Portal.Scheme == "https",
	})
	rec.Outcome, rec.Status = "ok", http.StatusOK
	rec.Details["next"] = next
	s.db.Audit(rec)
	portal.EnterPage(w, next)
}

// safeNext: a path on this origin, not a way to another one.
func safeNext(next string) bool {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") ||
		strings.ContainsAny(next, "\r\n\t\\") || len(next) > 2048 {
		return false
	}
	u, err := url.Parse(next)
	return err == nil && u.Scheme == "" && u.Host == ""
}

// continueHref is the interstitial's link to the page asked for, on this
// origin only: a path such as //evil.example/login would be another site.
func continueHref(u *url.URL) string {
	if next := u.RequestURI(); safeNext(next) {
		return next
	}
	return "/"
}

// portalIndex lists the session's routes.
func (s *Server) portalIndex(w http.ResponseWriter, ses *store.Session) {
	pg := portal.Page{Title: "Sandbox " + ses.SessionID,
		Message: "This sandbox is " + ses.Status + "."}
	if ses.Status == store.StatusRunning {
		for _, n := range portal.ServiceNames {
			svc := portal.Services[n]
			href := "/" + n + "/"
			if n == "browser" {
				href = "/browser/json/version"
			}
			pg.Links = append(pg.Links, portal.Link{Href: href, Text: svc.Title})
		}
		pg.Detail = "A server you start in the sandbox on port N is at /port/N/."
	}
	portal.WritePage(w, http.StatusOK, pg)
}

// portalError answers a person with a page and a program with the
// contract's JSON error.
func (s *Server) portalError(w http.ResponseWriter, r *http.Request, rid, pk string, err error) {
	err = portalErr(err)
	status, code, msg := statusOf(err)
	s.logFailure("portal request failed", err, pk, "requestId", rid, "code", code)
	if portal.Navigation(r) {
		portal.WritePage(w, status, portal.Page{Title: http.StatusText(status), Message: msg, Detail: "Request id " + rid})
		return
	}
	var body errorBody
	body.Error.Code, body.Error.Message, body.Error.RequestID = code, msg, rid
	if pe, ok := errdefs.Public(err); ok {
		body.Error.Details = pe.Details()
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(b)
}
