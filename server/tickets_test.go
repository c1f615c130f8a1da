package server

import (
	"encoding/json"
	"net/http"
	"testing"
)

// Tickets and subprotocol tokens authenticate WebSocket routes only.
func TestTicketOnlyForWebSockets(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "t1"})
	rec := e.do("POST", "/v1/sandbox/t1/tickets", e.token, nil)
	if rec.Code != http.StatusCreated {
		t.Fatal(rec.Code)
	}
	var tk struct{ Ticket string }
	json.Unmarshal(rec.Body.Bytes(), &tk)
	upgrade := func(r *http.Request) {
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Protocol", "bearer."+e.token)
	}
	apiError(t, e.do("DELETE", "/v1/sandbox/t1?ticket="+tk.Ticket, "", nil, upgrade), http.StatusUnauthorized, "unauthenticated")
	apiError(t, e.do("POST", "/v1/sandbox/t1/tickets?ticket="+tk.Ticket, "", nil, upgrade), http.StatusUnauthorized, "unauthenticated")
	if rec := e.get(e.token, "t1"); rec.Code != http.StatusOK {
		t.Fatalf("session gone: %d", rec.Code)
	}
}

// A ticket offered from a foreign Origin is refused without being used up:
// the page it came from cannot spend the user's ticket.
func TestTicketNotSpentCrossOrigin(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "t2"})
	var tk struct{ Ticket string }
	json.Unmarshal(e.do("POST", "/v1/sandbox/t2/tickets", e.token, nil).Body.Bytes(), &tk)
	upgrade := func(origin string) reqOpt {
		return func(r *http.Request) {
			r.Header.Set("Connection", "Upgrade")
			r.Header.Set("Upgrade", "websocket")
			r.Header.Set("Sec-WebSocket-Version", "13")
			r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
			if origin != "" {
				r.Header.Set("Origin", origin)
			}
		}
	}
	apiError(t, e.do("GET", "/v1/sandbox/t2/logs/ws?ticket="+tk.Ticket, "", nil, upgrade("https://evil.example")), http.StatusForbidden, "forbidden")
	// Still valid for the server's own page (the recorder cannot upgrade:
	// anything but 401 shows the ticket authenticated).
	if rec := e.do("GET", "/v1/sandbox/t2/logs/ws?ticket="+tk.Ticket, "", nil, upgrade("")); rec.Code == http.StatusUnauthorized {
		t.Fatalf("the ticket was used up by the refused attempt: %d %s", rec.Code, rec.Body)
	}
}

// The route takes no fields: an empty body or {} makes a ticket; anything
// else is refused as on other routes.
func TestTicketBody(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "t3"})
	for _, body := range []any{nil, "", "{}", " {} "} {
		if rec := e.do("POST", "/v1/sandbox/t3/tickets", e.token, body); rec.Code != http.StatusCreated {
			t.Errorf("body %q: %d %s", body, rec.Code, rec.Body)
		}
	}
	for _, body := range []string{`{"bogus":1}`, `{`, `[]`} {
		apiError(t, e.do("POST", "/v1/sandbox/t3/tickets", e.token, body), http.StatusBadRequest, "invalid_request")
	}
}
