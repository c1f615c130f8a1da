package server

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"sandboxd/server/errdefs"
	"sandboxd/store"
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
