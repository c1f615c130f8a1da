package server

import (
	"strings"
	"testing"
	"time"
)

// Under memory pressure the monitor pauses an idle sandbox with its memory;
// the next command resumes it transparently, processes and files kept.
func TestRealPressurePause(t *testing.T) {
	cfg := realConfig(t)
	// Always "under pressure": every sandbox idle for a second is paused.
	cfg.Limits.PressureFreeMemoryMiB = 1 << 30
	cfg.Limits.PressureMinIdleSeconds = 1
	h := startServer(t, cfg)
	h.provision("mp", "test-tiny")
	h.sh("mp", "echo kept > /tmp/state; (sleep 4321 &)")
	deadline := time.Now().Add(40 * time.Second)
	for {
		o := h.get("mp")
		if o.Status == "paused" {
			if o.StatusReason == nil || *o.StatusReason != "memory_pressure" {
				t.Fatalf("paused with reason %v", o.StatusReason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not paused under pressure: %+v", o)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t0 := time.Now()
	r := h.sh("mp", "cat /tmp/state; pgrep -c -f 'sleep 4321'")
	if r.ExitCode != 0 || r.Stdout != "kept\n1\n" {
		t.Fatalf("command on the pressure-paused session: %+v", r)
	}
	t.Logf("paused for pressure; the next command resumed it and ran in %v", time.Since(t0))
	// Audited as the system's doing.
	code, b := h.call(h.token, "GET", "/v1/audit?sessionId=mp", nil)
	if code != 200 || !strings.Contains(string(b), "sandbox.pressure_pause") || !strings.Contains(string(b), "sandbox.pressure_resume") {
		t.Fatalf("audit: %d %s", code, b)
	}
}
