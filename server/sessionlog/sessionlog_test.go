package sessionlog

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sandboxd/store"
	"sandboxd/streams/scrub"
	"strings"
	"sync"
	"testing"
	"time"
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

// newLogs is a Logs on a real SQLite file whose scrubber knows one secret.
func newLogs(t *testing.T, db *store.DB) *Logs {
	set, err := scrub.NewSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	if set, err = set.WithValues(map[string]string{"TOPSECRET": "hunter2-very-secret"}); err != nil {
		t.Fatal(err)
	}
	return New(db, func(string) (*scrub.Set, error) { return set, nil }, "/data", slog.New(slog.DiscardHandler))
}

// Events (scrubbed) are persisted and, after a restart on the same file,
// loaded into the ring ahead of new entries; kernel lines are not persisted
// (they are re-read from runsc's file), nor are loaded events persisted again.
func TestLogEventsPersisted(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sandboxd.db")
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	p, _, _, err := db.Bootstrap(ctx, "default", "owner", "")
	if err != nil {
		t.Fatal(err)
	}
	ses := store.Session{OrgID: p.Org.ID, ProjectID: p.ProjectID, SessionID: "lg", CreatedBy: p.User.ID}
	if err := db.InsertSession(ctx, &ses); err != nil {
		t.Fatal(err)
	}
	s1 := newLogs(t, db)
	s1.Event(ses.ID, "process_start", map[string]any{"command": "echo hunter2-very-secret"})
	s1.add(ses.ID, Entry{"type": "kernel", "line": "W something"})
	s1.Event(ses.ID, "process_exit", map[string]any{"exitCode": 0})
	if err := db.Close(); err != nil { // drains the event writer
		t.Fatal(err)
	}

	for restart := range 2 {
		db, err := store.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		s := newLogs(t, db)
		// A subscriber that never reads does not hold up the log.
		_, _, cancel := s.Subscribe(ses.ID)
		for range subQueue + 10 {
			s.add(ses.ID, Entry{"type": "kernel", "line": "W noise"})
		}
		cancel()
		s.Event(ses.ID, "exit", map[string]any{"restart": restart})
		entries := s.Entries(ses.ID)
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

// memStore keeps events in memory (the persistence path is tested above on
// SQLite).
type memStore struct{}

func (memStore) LastEvents(ctx context.Context, pk string, n int) ([]store.Event, error) {
	return nil, nil
}
func (memStore) AppendEvent(pk string, entry []byte) {}

func plainLogs(t *testing.T) *Logs {
	set, err := scrub.NewSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	return New(memStore{}, func(string) (*scrub.Set, error) { return set, nil }, "/var/lib/sbx", slog.New(slog.DiscardHandler))
}

// The tailer shows warnings and unsupported syscalls after boot, with the
// data dir hidden, follows the file as it grows, and stops on StopTail and
// Close.
func TestKernelTail(t *testing.T) {
	l := plainLogs(t)
	path := filepath.Join(t.TempDir(), "runsc.boot.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("W1129 10:43:41.000001       1 boot.go:1] before boot, hidden\n" +
		"I1129 10:43:41.000002       1 loader.go:2] Process should have started\n" +
		"I1129 10:43:41.000003       1 vfs.go:3] info, hidden\n" +
		"W1129 10:43:41.000004       1 vfs.go:4] open /var/lib/sbx/sandboxes/x failed\n")
	l.StartTail("pk", path)
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if all := string(joinEntries(l.Entries("pk"))); strings.Contains(all, want) {
				if strings.Contains(all, "hidden") || strings.Contains(all, "/var/lib/sbx") {
					t.Fatalf("shown what should not be: %s", all)
				}
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no %q in %s", want, joinEntries(l.Entries("pk")))
	}
	waitFor(`W open \u003cdata-dir\u003e/sandboxes/x failed`)
	f.WriteString("I1129 10:43:42.000000       1 compat.go:5] Unsupported syscall foo\n")
	waitFor("Unsupported syscall foo")
	l.StopTail("pk")
	l.StartTail("pk", path) // a restarted tailer reads the file again
	l.Close()               // and Close waits for it
	l.StartTail("pk", path) // after Close nothing starts
	l.tails.Wait()
}

// Egress denials are rate limited per session; the next one logged says
// how many were dropped.
func TestDeniedRateLimited(t *testing.T) {
	l := plainLogs(t)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for range deniedBurst + 7 {
		l.Denied("pk", "evil.example", 443, "not_allowed")
	}
	l.Denied("other", "evil.example", 443, "not_allowed") // its own budget
	if n := len(l.Entries("pk")); n != deniedBurst {
		t.Fatalf("%d denials logged, want %d", n, deniedBurst)
	}
	if n := len(l.Entries("other")); n != 1 {
		t.Fatalf("other session: %d", n)
	}
	now = now.Add(time.Second)
	l.Denied("pk", "evil.example", 443, "not_allowed")
	last := l.Entries("pk")[deniedBurst]
	if !strings.Contains(string(last), `"suppressedBefore":7`) {
		t.Fatalf("last = %s", last)
	}
	l.Forget("pk")
	if len(l.m) != 1 {
		t.Fatalf("Forget left %d sessions", len(l.m))
	}
}

// recStore records the events persisted.
type recStore struct {
	memStore
	mu      sync.Mutex
	entries [][]byte
}

func (r *recStore) AppendEvent(pk string, entry []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries = append(r.entries, entry)
}

// eachString calls f with every string of a decoded JSON value (keys too).
func eachString(v any, f func(string)) {
	switch v := v.(type) {
	case string:
		f(v)
	case []any:
		for _, x := range v {
			eachString(x, f)
		}
	case map[string]any:
		for k, x := range v {
			f(k)
			eachString(x, f)
		}
	}
}

// A secret that matches JSON syntax (`"time":"` is in every entry) is
// redacted in the entries' strings, not in their encoding: every entry,
// in the ring and persisted, stays one JSON object with its type, kind
// and time, and none of its strings holds a secret; an ordinary secret in
// a message, nested fields, a struct or a service line is still redacted.
func TestLogSecretMatchingJSONSyntax(t *testing.T) {
	secrets := map[string]string{
		"SYNTAX":    `"time":"`,
		"SYNTAX2":   `","type":"`,
		"TOPSECRET": "hunter2-very-secret",
	}
	set, err := scrub.NewSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	if set, err = set.WithValues(secrets); err != nil {
		t.Fatal(err)
	}
	db := &recStore{}
	l := New(db, func(string) (*scrub.Set, error) { return set, nil }, "/data", slog.New(slog.DiscardHandler))
	type detail struct {
		Cause string   `json:"cause"`
		Args  []string `json:"args"`
	}
	l.Event("pk", "process_start", map[string]any{"command": "echo hunter2-very-secret", "cwd": "/work"})
	l.Event("pk", "process_exit", map[string]any{"exitCode": 0, "meta": map[string]any{
		"note":  `config {"time":"now"} and hunter2-very-secret`,
		"list":  []any{"a hunter2-very-secret b", 7, map[string]string{"k": `x","type":"y`}},
		"args":  []string{"--token=hunter2-very-secret"},
		"cause": detail{Cause: "bad hunter2-very-secret", Args: []string{`"time":"`}},
	}})
	l.Service("pk", "editor", "listening; token hunter2-very-secret")
	l.add("pk", Entry{"type": "kernel", "time": "t", "line": `W read "time":"x"`})
	entries := l.Entries("pk")
	if len(entries) != 4 || len(db.entries) != 2 {
		t.Fatalf("%d entries, %d persisted", len(entries), len(db.entries))
	}
	var all []string
	for _, b := range append(entries, db.entries...) {
		var e map[string]any
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("entry %s: %v", b, err)
		}
		if _, err := time.Parse(time.RFC3339Nano, e["time"].(string)); err != nil && e["type"] != "kernel" {
			t.Errorf("entry %s: time: %v", b, err)
		}
		if e["type"] == "event" && e["kind"] == nil {
			t.Errorf("entry %s: no kind", b)
		}
		eachString(e, func(s string) {
			all = append(all, s)
			for name, v := range secrets {
				if strings.Contains(s, v) {
					t.Errorf("entry %s: %s in %q", b, name, s)
				}
			}
		})
		if strings.Contains(string(b), "hunter2") {
			t.Errorf("entry %s: not scrubbed", b)
		}
	}
	if got := logKinds(t, entries); strings.Join(got, ",") != "process_start,process_exit,service,kernel" {
		t.Errorf("kinds %v", got)
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{
		"echo [REDACTED:TOPSECRET]",
		"config {[REDACTED:SYNTAX]now\"} and [REDACTED:TOPSECRET]",
		"a [REDACTED:TOPSECRET] b",
		"x[REDACTED:SYNTAX2]y",
		"--token=[REDACTED:TOPSECRET]",
		"bad [REDACTED:TOPSECRET]",
		"listening; token [REDACTED:TOPSECRET]",
		"W read [REDACTED:SYNTAX]x\"",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("no %q in the entries' strings:\n%s", want, joined)
		}
	}
}

// A session whose secrets cannot be read logs nothing rather than an
// entry its scrubber never saw.
func TestLogFailsClosed(t *testing.T) {
	db := &recStore{}
	l := New(db, func(string) (*scrub.Set, error) { return nil, errors.New("database is locked") }, "/data", slog.New(slog.DiscardHandler))
	l.Event("s1", "exit", map[string]any{"cause": "hunter2-very-secret"})
	l.Service("s1", "editor", "hunter2-very-secret")
	if got := l.Entries("s1"); len(got) != 0 || len(db.entries) != 0 {
		t.Fatalf("entries kept unscrubbed: %q %q", got, db.entries)
	}
}
