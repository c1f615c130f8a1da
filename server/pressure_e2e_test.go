package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"sandboxd/store"
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
	// A viewer's look does not resume it (nor draw credits): 409 saying why.
	p, err := h.s.db.Authenticate(context.Background(), h.token)
	if err != nil {
		t.Fatal(err)
	}
	_, _, viewer, err := h.s.db.AddMember(context.Background(), p.Org.ID, "mp-viewer", store.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/sandbox/mp/files?path=/workspace", "/v1/sandbox/mp/artifacts"} {
		if code, b := h.call(viewer, "GET", path, nil); code != 409 || !strings.Contains(string(b), "paused for memory pressure") {
			t.Errorf("viewer's %s: %d %s", path, code, b)
		}
	}
	if o := h.get("mp"); o.Status != "paused" {
		t.Fatalf("a viewer's read resumed it: %+v", o)
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
