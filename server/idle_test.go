package server

import (
	"net/http"
	"testing"
	"time"
)

// Idle timeout: a session with idleTimeoutSeconds is torn down by the
// monitor once no command has run for that long; time is an input.
func TestIdleTimeoutTearsDown(t *testing.T) {
	e := newAPIEnv(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e.s.sb.now = func() time.Time { return now }
	e.provision(e.token, map[string]any{"sessionId": "idle1", "idleTimeoutSeconds": 60})
	e.provision(e.token, map[string]any{"sessionId": "busy1", "idleTimeoutSeconds": 60})
	e.provision(e.token, map[string]any{"sessionId": "forever"})
	e.s.sb.sweep() // first sight of the sessions

	now = now.Add(50 * time.Second)
	if rec := e.exec(e.token, "busy1", map[string]any{"action": "exec", "command": "true"}); rec.Code != http.StatusOK {
		t.Fatalf("exec: %d %s", rec.Code, rec.Body)
	}
	now = now.Add(20 * time.Second) // idle1: 70 s idle; busy1: 20 s
	// A session whose lock is held (a long download) does not hold up the
	// monitor for the others.
	held := decodeBody[sandboxObject](t, e.get(e.token, "forever"), http.StatusOK)
	ses, _ := e.s.db.GetSession(t.Context(), held.OrgID, "forever")
	unlock := e.s.sb.lock(ses.ID)
	swept := make(chan struct{})
	go func() { e.s.sb.sweep(); close(swept) }()
	select {
	case <-swept:
	case <-time.After(5 * time.Second):
		t.Fatal("the monitor waited for a locked session")
	}
	unlock()
	for id, want := range map[string]string{"idle1": "stopped", "busy1": "running", "forever": "running"} {
		o := decodeBody[sandboxObject](t, e.get(e.token, id), http.StatusOK)
		if o.Status != want {
			t.Errorf("%s: status %s, want %s", id, o.Status, want)
		}
	}
	now = now.Add(time.Hour)
	e.s.sb.sweep()
	if o := decodeBody[sandboxObject](t, e.get(e.token, "forever"), http.StatusOK); o.Status != "running" {
		t.Errorf("no idle timeout: status %s", o.Status)
	}
}
