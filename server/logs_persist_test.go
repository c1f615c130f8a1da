package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"sandboxd/server/config"
	"sandboxd/store"
)

// logKinds decodes a log (one JSON object per entry) into its entries'
// "kind" (events) or "kernel".
func logKinds(t *testing.T, entries [][]byte) []string {
	t.Helper()
	var out []string
	for _, b := range entries {
		var e map[string]any
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("log entry %q: %v", b, err)
		}
		if e["type"] == "event" {
			out = append(out, e["kind"].(string))
		} else {
			out = append(out, e["type"].(string))
		}
	}
	return out
}

// logsServer is just enough of a Server for its session logs, on a real
// SQLite file.
func logsServer(db *store.DB) *Server {
	return &Server{db: db, logs: newLogs(), scrub: &scrubbers{base: loadScrubber()},
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// Events (scrubbed) are persisted and, after a restart on the same file,
// loaded into the ring ahead of new entries; kernel lines are not persisted
// (they are re-read from runsc's file), nor are loaded events persisted again.
func TestLogEventsPersisted(t *testing.T) {
	ctx := context.Background()
	path := config.DBPath(t.TempDir())
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	p, _, _, err := db.Bootstrap(ctx, "default", "owner")
	if err != nil {
		t.Fatal(err)
	}
	ses := store.Session{OrgID: p.Org.ID, ProjectID: p.ProjectID, SessionID: "lg", CreatedBy: p.User.ID}
	if err := db.InsertSession(ctx, &ses); err != nil {
		t.Fatal(err)
	}
	if err := db.SetSecrets(ctx, ses.ID, map[string]string{"TOPSECRET": "hunter2-very-secret"}); err != nil {
		t.Fatal(err)
	}
	s1 := logsServer(db)
	s1.event(&ses, "process_start", map[string]any{"command": "echo hunter2-very-secret"})
	s1.addLog(&ses, logEntry{"type": "kernel", "line": "W something"})
	s1.event(&ses, "process_exit", map[string]any{"exitCode": 0})
	if err := db.Close(); err != nil { // drains the event writer
		t.Fatal(err)
	}

	for restart := range 2 {
		db, err := store.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		s := logsServer(db)
		// A subscriber that never reads does not hold up the log.
		_, stuck := s.sessionLog(ses.ID).subscribe()
		for range logSubQueue + 10 {
			s.addLog(&ses, logEntry{"type": "kernel", "line": "W noise"})
		}
		s.sessionLog(ses.ID).unsubscribe(stuck)
		s.event(&ses, "exit", map[string]any{"restart": restart})
		entries, ch := s.sessionLog(ses.ID).subscribe()
		s.sessionLog(ses.ID).unsubscribe(ch)
		kinds := logKinds(t, entries)
		want := []string{"process_start", "process_exit"}
		for range restart + 1 {
			want = append(want, "exit")
		}
		var events []string
		for _, k := range kinds {
			if k != "kernel" {
				events = append(events, k)
			}
		}
		if strings.Join(events, ",") != strings.Join(want, ",") || kinds[0] != "process_start" {
			t.Fatalf("restart %d: events %v, want %v first", restart, events, want)
		}
		all := string(joinEntries(entries))
		if strings.Contains(all, "hunter2") || !strings.Contains(all, "[REDACTED:TOPSECRET]") {
			t.Fatalf("restart %d: not scrubbed: %s", restart, all)
		}
		if err := db.FlushEvents(ctx); err != nil {
			t.Fatal(err)
		}
		evs, err := db.LastEvents(ctx, ses.ID, 0)
		if err != nil || len(evs) != len(want) {
			t.Fatalf("restart %d: %d persisted events, want %d (%v)", restart, len(evs), len(want), err)
		}
		db.Close()
	}
}

func joinEntries(entries [][]byte) []byte {
	var b []byte
	for _, e := range entries {
		b = append(append(b, e...), '\n')
	}
	return b
}

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
