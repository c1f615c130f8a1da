package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"sandboxd/server/errdefs"
	"sandboxd/server/portal"
	"sandboxd/server/sandbox"
	"sandboxd/store"
)

// The portal's edge: the API route for API clients (bearer token), and a
// session's own portal origin for browsers (cookie from a ticket). Package
// portal proxies; this file decides who may.

const (
	proxyRoute = "/v1/sandbox/proxy/:sessionId/*rest"
	// loginPath is on the portal origin: it turns a ticket into a cookie.
	loginPath = "/.sandboxd/login"
	// How long a request waits for a starting service: an API client
	// gets the answer when the service is up; a person gets a page that
	// says it is starting and reloads.
	serviceWaitAPI  = 60 * time.Second
	serviceWaitPage = 2 * time.Second
	// proxyAuditEvery: an API client's proxied requests to one target are
	// audited once per this period (WebSockets always): one record per
	// open, not one per asset.
	proxyAuditEvery = 10 * time.Minute
)

var (
	errPortalSignedOut = errdefs.New(errdefs.ErrUnauthenticated, "open this sandbox's portal with a link from the API (a ticket): this browser is not signed in to it")
	errPortalTicket    = errdefs.New(errdefs.ErrUnauthenticated, "the link has expired or was used already; ask the API for a new one")
	errCrossOrigin     = errdefs.Forbidden("a page of another origin may not use this sandbox's portal")
)

// portalHost returns the session key of a request addressed to a portal
// origin ("<key>.<domain>", any port).
func (s *Server) portalHost(host string) (string, bool) {
	if h, port, err := net.SplitHostPort(host); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", false
		}
		host = h
	}
	// A fully qualified name (trailing dot) is the same host.
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	key, ok := strings.CutSuffix(host, "."+s.cfg.Portal.Domain)
	if !ok || len(key) != 21 || key[0] != 's' {
		return "", false
	}
	for _, c := range key[1:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", false
		}
	}
	return key, true
}

// portalOrigin is the origin of a session's portal, with the port the
// client reached the API on unless portal.port says otherwise.
func (s *Server) portalOrigin(orgID, sessionID, apiHost string) string {
	port := ""
	if s.cfg.Portal.Port != 0 {
		port = strconv.Itoa(s.cfg.Portal.Port)
	} else if _, p, err := net.SplitHostPort(apiHost); err == nil {
		port = p
	}
	if (s.cfg.Portal.Scheme == "http" && port == "80") || (s.cfg.Portal.Scheme == "https" && port == "443") {
		port = ""
	}
	host := portal.SessionKey(orgID, sessionID) + "." + s.cfg.Portal.Domain
	if port != "" {
		host = net.JoinHostPort(host, port)
	}
	return s.cfg.Portal.Scheme + "://" + host
}

// apiBase is the API's origin as the client addressed it.
func apiBase(r *http.Request) string {
	if r.TLS != nil {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

// sandboxURLs are the Sandbox object's urls: the terminal's WebSocket and
// the portal's routes on the API (a bearer token, or ?ticket= to be sent
// on to the portal origin), plus the portal origin itself.
func (s *Server) sandboxURLs(r *http.Request, ses *store.Session) map[string]string {
	base := apiBase(r)
	ws := "ws" + strings.TrimPrefix(base, "http")
	proxy := base + "/v1/sandbox/proxy/" + ses.SessionID
	return map[string]string{
		"terminal": ws + "/v1/sandbox/terminal/" + ses.SessionID + "/ws",
		"editor":   proxy + "/editor/",
		"notebook": proxy + "/notebook/",
		"display":  proxy + "/display/",
		"browser":  proxy + "/browser/",
		"portal":   s.portalOrigin(ses.OrgID, ses.SessionID, r.Host) + "/",
	}
}

// proxyAPI serves ALL /v1/sandbox/proxy/:sessionId/* for API clients.
func (s *Server) proxyAPI(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	esc, ok := strings.CutPrefix(c.Request.URL.EscapedPath(), "/v1/sandbox/proxy/"+ses.SessionID)
	if !ok {
		s.writeError(c, errInvalidSessionID)
		return
	}
	t, err := portal.Parse(esc)
	if err != nil {
		s.writeError(c, errdefs.NotFound("%s", err.Error()))
		return
	}
	s.auditProxyOpen(c, ses, esc)
	s.proxy(c.Writer, c.Request, principal(c), ses, portal.Call{
		Target: t, Base: "/v1/sandbox/proxy/" + ses.SessionID, Origin: apiBase(c.Request),
		APIOrigin: true, Wait: serviceWaitAPI,
	}, func(err error) { s.writeError(c, portalErr(err)) })
}

// proxy admits the call (a running session; it counts as use while it
// lasts), then hands it to the portal. A WebSocket is cut when the token
// behind it loses access.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, p store.Principal, ses *store.Session, call portal.Call, fail func(error)) {
	cmd, err := s.sessions.Command(r.Context(), *ses, sandbox.Admit{NotRunning: "resume it to use its portal", Use: true, NoSecrets: true})
	if err != nil {
		fail(err)
		return
	}
	*ses = cmd.Session // resumed if it was paused for memory pressure
	defer cmd.End()
	// Authorized: the body is the sandbox's server's to read, at its pace.
	noBodyDeadline(w)
	call.Fail = fail
	call.Sandbox = portal.Sandbox{PK: ses.ID, ContainerID: ses.ContainerID,
		MemoryMiB: ses.MemoryMiB,
		Env:       func(ctx context.Context) ([]string, error) { return s.sessions.SessionEnv(ctx, *ses) }}
	// Any proxied request may outlive its token (a WebSocket, any other
	// upgrade, a stream, a long download): each is cut once the token no
	// longer grants access.
	ctx, _, stop := s.whileAllowed(r.Context(), p, PermProjectUpdate)
	defer stop()
	s.portal.Serve(w, r.WithContext(ctx), call)
}

// portalErr gives the portal's errors their public class.
func portalErr(err error) error {
	switch {
	case errors.Is(err, portal.ErrStarting):
		return errdefs.Unavailable("%s; retry in a moment", err.Error())
	case errors.Is(err, portal.ErrTooSmall):
		return errdefs.Conflict("%s", err.Error())
	case errors.Is(err, portal.ErrTooMany):
		return errdefs.RateLimited("%s", err.Error())
	case errors.Is(err, portal.ErrUnreachable):
		return errdefs.New(errdefs.ErrBadGateway, "no HTTP answer from that port in the sandbox: nothing listens there, or it closed the connection or did not speak HTTP").WithCause(err)
	}
	return err
}

// portalRedirect sends a browser that followed a proxy URL with a ticket
// (and no bearer token) to the session's portal origin, where the ticket
// becomes a cookie. The ticket is not used up here.
func (s *Server) portalRedirect(c *gin.Context) {
	tk := c.Query("ticket")
	if tk == "" || c.GetHeader("Authorization") != "" || c.Request.Method != http.MethodGet {
		c.Next()
		return
	}
	t, ok := s.tix.peek(tk, time.Now())
	if !ok || t.sessionID != c.Param("sessionId") {
		s.writeError(c, errPortalTicket)
		return
	}
	rest, _ := strings.CutPrefix(c.Request.URL.EscapedPath(), "/v1/sandbox/proxy/"+t.sessionID)
	q := c.Request.URL.Query()
	q.Del("ticket")
	next := rest
	if len(q) > 0 {
		next += "?" + q.Encode()
	}
	loc := s.portalOrigin(t.p.Org.ID, t.sessionID, c.Request.Host) + loginPath + "?" +
		url.Values{"ticket": {tk}, "next": {next}}.Encode()
	c.Header("Referrer-Policy", "no-referrer")
	c.Header("Cache-Control", "no-store")
	c.Redirect(http.StatusSeeOther, loc)
	c.Abort()
}

// proxyOpens remembers when a token last opened a target, so API clients
// are audited per open rather than per request.
type proxyOpens struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (s *Server) auditProxyOpen(c *gin.Context, ses *store.Session, esc string) {
	target := esc
	if parts := strings.SplitN(strings.TrimPrefix(esc, "/"), "/", 3); len(parts) >= 2 && parts[0] == "port" {
		target = "port/" + parts[1]
	} else {
		target = parts[0]
	}
	if !websocket.IsWebSocketUpgrade(c.Request) {
		k := principal(c).TokenID + "\x00" + ses.ID + "\x00" + target
		now := time.Now()
		s.opens.mu.Lock()
		last, seen := s.opens.last[k]
		if !seen || now.Sub(last) > proxyAuditEvery {
			s.opens.last[k] = now
			for k, t := range s.opens.last {
				if now.Sub(t) > proxyAuditEvery {
					delete(s.opens.last, k)
				}
			}
		}
		s.opens.mu.Unlock()
		if seen && now.Sub(last) <= proxyAuditEvery {
			return
		}
	}
	p := principal(c)
	s.db.Audit(store.AuditRecord{
		Time: time.Now().UTC(), OrgID: p.Org.ID, UserID: p.User.ID, TokenID: p.TokenID,
		Action: "portal.open", SessionID: ses.SessionID, Outcome: "ok", Status: 0,
		RemoteAddr: c.ClientIP(), RequestID: requestID(c),
		Details: map[string]any{"target": target, "via": "api", "websocket": websocket.IsWebSocketUpgrade(c.Request)},
	})
}
