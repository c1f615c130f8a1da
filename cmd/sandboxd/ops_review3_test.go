package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"sandboxd/server/config"
	"sandboxd/store"
)

// Review 3: with the server stopped (or killed), a session's open run ends
// where the server last saw it alive, and the server's next start closes
// it there: the time it was down is never charged (README, "Credits and
// plans"). `sandboxd org list` (and `credits grant`'s "remaining") run on
// the data dir with the server stopped, yet count every open run up to
// now, the downtime included: an operator who checks an organization while
// the server is down sees more used than will ever be charged (here twice
// as much), and the number drops when the server starts again.
func TestReview3OrgListServerStoppedChargesDowntime(t *testing.T) {
	dir := t.TempDir()
	tok := mustRun(t, dir, "org", "create", "acme")
	db, err := store.Open(config.DBPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, err := db.Authenticate(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if now.Add(-3*time.Minute).Day() != now.Day() {
		t.Skip("too close to midnight UTC")
	}
	// A session at 10 credits a minute started 2 minutes ago; the server
	// last saw it alive a minute ago, then stopped: 10 credits are owed.
	ses := &store.Session{ID: "ses_review3", OrgID: p.Org.ID, SessionID: "down-1", Size: "standard-5", CreditRate: 600_000}
	if err := db.OpenRun(ctx, ses, now.Add(-2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := db.SeeRuns(ctx, []string{ses.ID}, now.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	db.Close()

	list := mustRun(t, dir, "org", "list")
	var used string
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) == 6 && f[1] == "acme" {
			used = f[4]
		}
	}
	if used != "10" {
		t.Fatalf("org list with the server stopped: USED %q, want 10 (up to the last sighting)\n%s", used, list)
	}
}
