package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"sandboxd/store"
)

// An open WebSocket ends once its token is revoked or its user leaves the
// organization (it outlives the request that authenticated it); the
// owner's stays open.
func TestWebSocketAccessRevoked(t *testing.T) {
	e := newAPIEnv(t)
	e.s.wsGuard.Store(int64(20 * time.Millisecond))
	addr, _ := serveAPI(t, e)
	e.provision(e.token, map[string]any{"sessionId": "g1"})
	dial := func(token string) *websocket.Conn {
		t.Helper()
		ws, _, err := websocket.DefaultDialer.Dial("ws://"+addr+"/v1/sandbox/g1/logs/ws", http.Header{"Authorization": {"Bearer " + token}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.Close() })
		return ws
	}
	// ended reads until the socket closes; it returns the last text read.
	ended := func(ws *websocket.Conn) (string, error) {
		var last string
		ws.SetReadDeadline(time.Now().Add(5 * time.Second))
		for {
			_, b, err := ws.ReadMessage()
			if err != nil {
				return last, err
			}
			last = string(b)
		}
	}
	_, devTok := e.addMember(store.RoleDeveloper)
	viewer, viewerTok := e.addMember(store.RoleViewer)
	devWS, viewerWS, ownerWS := dial(devTok), dial(viewerTok), dial(e.token)

	p, err := e.db.Authenticate(context.Background(), devTok)
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.do("DELETE", "/v1/tokens/"+p.TokenID, e.token, nil); rec.Code != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	last, err := ended(devWS)
	if !websocket.IsCloseError(err, websocket.ClosePolicyViolation) || !strings.Contains(last, "access revoked") {
		t.Fatalf("revoked token's socket: %q %v", last, err)
	}
	if rec := e.do("DELETE", "/v1/orgs/"+e.owner.Org.ID+"/members/"+viewer.ID, e.token, nil); rec.Code != http.StatusNoContent {
		t.Fatalf("remove member: %d %s", rec.Code, rec.Body)
	}
	if _, err := ended(viewerWS); !websocket.IsCloseError(err, websocket.ClosePolicyViolation) {
		t.Fatalf("removed member's socket: %v", err)
	}
	// The owner's socket lives through many checks.
	ownerWS.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	for {
		if _, _, err := ownerWS.ReadMessage(); err != nil {
			if ne, ok := err.(interface{ Timeout() bool }); !ok || !ne.Timeout() {
				t.Fatalf("owner's socket ended: %v", err)
			}
			break
		}
	}
}
