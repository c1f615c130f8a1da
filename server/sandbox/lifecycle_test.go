package sandbox

import (
	"reflect"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/store"
)

func TestCanTransitionTable(t *testing.T) {
	all := []string{
		store.StatusProvisioning, store.StatusRunning, store.StatusPaused, store.StatusStopping,
		store.StatusStopped, store.StatusFailed, store.StatusDeleted,
	}
	allowed := map[[2]string]bool{
		{store.StatusProvisioning, store.StatusRunning}: true,
		{store.StatusProvisioning, store.StatusFailed}:  true,
		{store.StatusProvisioning, store.StatusStopped}: true, // a failed resume
		{store.StatusStopped, store.StatusProvisioning}: true, // resume
		{store.StatusRunning, store.StatusStopping}:     true,
		{store.StatusRunning, store.StatusFailed}:       true,
		{store.StatusRunning, store.StatusDeleted}:      true,
		{store.StatusStopping, store.StatusStopped}:     true,
		{store.StatusStopping, store.StatusFailed}:      true,
		{store.StatusStopping, store.StatusRunning}:     true, // a save refused: the sandbox runs on
		{store.StatusFailed, store.StatusStopping}:      true,
		{store.StatusFailed, store.StatusDeleted}:       true,
		{store.StatusStopped, store.StatusDeleted}:      true,
		{store.StatusRunning, store.StatusPaused}:       true, // pause
		{store.StatusPaused, store.StatusProvisioning}:  true, // resume (restore)
		{store.StatusPaused, store.StatusStopping}:      true, // teardown
		{store.StatusPaused, store.StatusDeleted}:       true,
		{store.StatusProvisioning, store.StatusPaused}:  true, // an interrupted restore, at reconcile
	}
	for _, from := range all {
		for _, to := range all {
			want := allowed[[2]string{from, to}]
			if got := CanTransition(from, to); got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
		if CanTransition(from, "bogus") || CanTransition("bogus", from) {
			t.Errorf("unknown status accepted with %s", from)
		}
	}
	// deleted is terminal.
	for _, to := range all {
		if CanTransition(store.StatusDeleted, to) {
			t.Errorf("deleted -> %s allowed", to)
		}
	}
}

func TestCredits(t *testing.T) {
	start := time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC)
	ses := &store.Session{CreditsPerHour: 4, StartedAt: &start}
	cases := []struct {
		end  time.Time
		want float64
	}{
		{start, 0},
		{start.Add(time.Hour), 4},
		{start.Add(90 * time.Minute), 6},
		{start.Add(45 * time.Second), 0.05},
		{start.Add(-time.Minute), 0}, // clock went backwards
	}
	for _, c := range cases {
		if got := Credits(ses, c.end); absDiff(got-c.want) > 1e-9 {
			t.Errorf("Credits(end=%v) = %v, want %v", c.end.Sub(start), got, c.want)
		}
	}
	if got := Credits(&store.Session{CreditsPerHour: 4}, start); got != 0 {
		t.Errorf("never started: %v", got)
	}
	if got := Credits(&store.Session{StartedAt: &start}, start.Add(time.Hour)); got != 0 {
		t.Errorf("free size: %v", got)
	}
	// Pure: same inputs, same output; the session is not modified.
	before := *ses
	a, b := Credits(ses, start.Add(time.Hour)), Credits(ses, start.Add(time.Hour))
	if a != b || !reflect.DeepEqual(before, *ses) {
		t.Error("Credits is not a pure function of its inputs")
	}
}

func absDiff(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func TestSizeLimits(t *testing.T) {
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	z, _ := cfg.Sizes.Resolve("small")
	want := runsc.Limits{VCPUs: 2, MemoryMiB: 2048, DiskMiB: 16384, Pids: 1024, Processes: runsc.DefaultProcesses(1024)}
	if l := Limits(z); l != want {
		t.Errorf("Limits = %+v, want %+v", l, want)
	}
}
