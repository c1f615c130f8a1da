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
