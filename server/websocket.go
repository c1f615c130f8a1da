package server

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/streams"
)

const (
	wsReadLimit    = 1 << 20
	wsSubprotocol  = "sandboxd"
	bearerProtoPfx = "bearer."
)

// originAllowed says whether a WebSocket may be opened from r's Origin: no
// Origin (not a browser) is fine, it authenticates with a header; a
// browser's Origin must be this server's own or a configured one.
func (s *Server) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) && (u.Scheme == "http" || u.Scheme == "https") {
		return true
	}
	for _, o := range s.cfg.AllowedOrigins {
		if strings.EqualFold(strings.TrimSuffix(o, "/"), origin) {
			return true
		}
	}
	return false
}

// wsToken finds a bearer token in a WebSocket upgrade's subprotocols.
func wsToken(r *http.Request) string {
	for _, p := range websocket.Subprotocols(r) {
		if t, ok := strings.CutPrefix(p, bearerProtoPfx); ok {
			return t
		}
	}
	return ""
}

func (s *Server) upgrader() *websocket.Upgrader {
	return &websocket.Upgrader{
		ReadBufferSize: 32 << 10, WriteBufferSize: 32 << 10,
		CheckOrigin: s.originAllowed,
		// Answer with "sandboxd" when offered, never echo a bearer token.
		Subprotocols: []string{wsSubprotocol},
	}
}

// wsSession checks a WebSocket request (the session, an upgrade, the
// Origin) before anything is started.
func (s *Server) wsSession(c *gin.Context) (*store.Session, bool) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return nil, false
	}
	if !websocket.IsWebSocketUpgrade(c.Request) {
		s.writeError(c, badRequest("this endpoint needs a WebSocket upgrade"))
		return nil, false
	}
	if !s.originAllowed(c.Request) {
		s.writeError(c, errdefs.Forbidden("cross-origin WebSocket refused"))
		return nil, false
	}
	return ses, true
}

// guardEvery is how often an open WebSocket's access is checked again.
const guardEvery = 10 * time.Second

// guard ends a WebSocket when its principal loses the right to keep it
// open: the token was revoked, the user left the organization, or the role
// no longer grants perm. A socket outlives the request that authenticated
// it, so access is checked again every s.wsGuard while it is open. It
// returns when the socket ends; the handler that upgraded starts it.
func (s *Server) guard(w *streams.WSConn, p store.Principal, perm string) {
	if s.watchAccess(w.Done(), p, perm) {
		w.SendJSON(map[string]any{"type": "error", "code": "forbidden", "message": "access revoked: the token was revoked or the role changed"})
		w.CloseWith(streams.ClosePolicy, "access revoked")
	}
}

// whileAllowed is ctx until p's token no longer grants perm (checked as
// for a WebSocket): a request that outlives its token (a long command, a
// code run, a proxied stream, an MCP stream) is stopped, and lost says so.
// stop ends the watch; call it when the request is done.
func (s *Server) whileAllowed(ctx context.Context, p store.Principal, perm string) (_ context.Context, lost func() bool, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var gone atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		if s.watchAccess(ctx.Done(), p, perm) {
			gone.Store(true)
			cancel()
		}
	}()
	return ctx, gone.Load, func() { cancel(); <-done }
}

// errAccessLost answers a request whose token stopped granting it while it ran.
var errAccessLost = errdefs.New(errdefs.ErrUnauthenticated, "access revoked while the request ran (the token was revoked or the role changed); what it ran was stopped")

// watchAccess checks every s.wsGuard whether p's token still grants perm.
// It returns true once it does not, false when done is closed first.
func (s *Server) watchAccess(done <-chan struct{}, p store.Principal, perm string) bool {
	t := time.NewTicker(time.Duration(s.wsGuard.Load()))
	defer t.Stop()
	for {
		select {
		case <-done:
			return false
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		role, err := s.db.TokenRole(ctx, p.TokenID)
		cancel()
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("access check", "err", err)
			continue // the store's trouble is no reason to cut a user off
		}
		if err != nil || !Can(role, perm) {
			return true
		}
	}
}
