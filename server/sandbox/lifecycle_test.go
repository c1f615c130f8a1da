package sandbox

import (
	"testing"

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

func TestSizeLimits(t *testing.T) {
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	z, _ := cfg.Sizes.Resolve("small")
	want := runsc.Limits{VCPUs: 2, MemoryMiB: 2048, DiskMiB: 16384, Pids: runsc.HostTasks(1024), Processes: runsc.DefaultProcesses(1024)}
	if l := Limits(z); l != want {
		t.Errorf("Limits = %+v, want %+v", l, want)
	}
}
