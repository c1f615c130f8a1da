package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Server events of a REST exec survive server restarts on the same data
// dir: GET logs and logs/ws show them once each, before newer entries.
func TestRealLogEventsSurviveRestart(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("ev1", "test-tiny")
	if r := h.sh("ev1", "echo before-restart"); r.Stdout != "before-restart\n" {
		t.Fatalf("exec: %+v", r)
	}
	h.close()

	h2 := startServer(t, cfg)
	events := func(h *harness) []map[string]any {
		t.Helper()
		code, b := h.call(h.token, "GET", "/v1/sandbox/ev1/logs", nil)
		if code != http.StatusOK {
			t.Fatalf("GET logs: %d %s", code, b)
		}
		var out []map[string]any
		for _, ln := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var e map[string]any
			if err := json.Unmarshal([]byte(ln), &e); err != nil {
				t.Fatalf("log line %q: %v", ln, err)
			}
			if e["type"] == "event" {
				out = append(out, e)
			}
		}
		return out
	}
	// kinds renders events as "kind" or "kind:command".
	kinds := func(evs []map[string]any) string {
		var s []string
		for _, e := range evs {
			k := e["kind"].(string)
			if c, ok := e["command"].(string); ok {
				k += ":" + c
			}
			s = append(s, k)
		}
		return strings.Join(s, " ")
	}
	want := "started process_start:echo before-restart process_exit"
	if got := kinds(events(h2)); got != want {
		t.Fatalf("after restart, events: %s\nwant: %s", got, want)
	}
	h2.sh("ev1", "echo after-restart")
	h2.close()

	h3 := startServer(t, cfg)
	want += " process_start:echo after-restart process_exit"
	if got := kinds(events(h3)); got != want {
		t.Fatalf("after second restart, events: %s\nwant: %s", got, want)
	}
	// The WebSocket's history has them too.
	ws, _, err := h3.dialWS("/v1/sandbox/ev1/logs/ws", http.Header{"Authorization": {"Bearer " + h3.token}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(strings.Join(got, "\n"), "after-restart") {
		ws.SetReadDeadline(deadline)
		_, data, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("logs/ws: %v; got:\n%s", err, strings.Join(got, "\n"))
		}
		got = append(got, string(data))
	}
	if all := strings.Join(got, "\n"); !strings.Contains(all, "before-restart") {
		t.Fatalf("logs/ws history lacks the first exec:\n%s", all)
	}
}
