package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/store"
)

// ticketTTL is how long a ticket lasts: a browser gets one and opens its
// WebSocket at once.
const ticketTTL = 60 * time.Second

// tickets are short-lived, single-use credentials for one session's
// WebSockets, for browsers that cannot set an Authorization header.
type tickets struct {
	mu sync.Mutex
	m  map[string]ticket
}

type ticket struct {
	p         store.Principal
	sessionID string
	expires   time.Time
}

func newTickets() *tickets { return &tickets{m: map[string]ticket{}} }

func (t *tickets) issue(p store.Principal, sessionID string, now time.Time) (string, time.Time) {
	var b [24]byte
	rand.Read(b[:])
	id := "tkt_" + base64.RawURLEncoding.EncodeToString(b[:])
	exp := now.Add(ticketTTL)
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, v := range t.m { // drop expired ones
		if now.After(v.expires) {
			delete(t.m, k)
		}
	}
	t.m[id] = ticket{p: p, sessionID: sessionID, expires: exp}
	return id, exp
}

// peek reads a ticket without using it up (to send a browser on to the
// portal origin, where it is redeemed).
func (t *tickets) peek(id string, now time.Time) (ticket, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tk, ok := t.m[id]
	if !ok || now.After(tk.expires) {
		return ticket{}, false
	}
	return tk, true
}

// redeem consumes a ticket: it works once, before it expires.
func (t *tickets) redeem(id string, now time.Time) (ticket, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tk, ok := t.m[id]
	delete(t.m, id)
	if !ok || now.After(tk.expires) {
		return ticket{}, false
	}
	return tk, true
}

// redeemTicket consumes a ticket (tickets.redeem) and checks that its
// token still has access: a ticket outlives neither a revoked token nor a
// member's removal, and carries the role the member has now, not the one it
// was issued with. ok is false for a ticket that does not authenticate.
func (s *Server) redeemTicket(ctx context.Context, id string) (t ticket, ok bool, err error) {
	t, ok = s.tix.redeem(id, time.Now())
	if !ok {
		return ticket{}, false, nil
	}
	role, err := s.db.TokenRole(ctx, t.p.TokenID)
	if errors.Is(err, store.ErrNotFound) {
		return ticket{}, false, nil
	}
	if err != nil {
		return ticket{}, false, err
	}
	t.p.Role = role
	return t, true, nil
}

// createTicket: POST /v1/sandbox/:sessionId/tickets.
func (s *Server) createTicket(c *gin.Context) {
	if err := noFields(c); err != nil {
		s.writeError(c, err)
		return
	}
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	id, exp := s.tix.issue(principal(c), ses.SessionID, time.Now())
	c.JSON(http.StatusCreated, gin.H{"ticket": id, "expiresAt": exp.UTC()})
}
