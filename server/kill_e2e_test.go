package server

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// "kill" is verified: after a fork bomb, killed:true means nothing of the
// bomb is left, and it stays gone (issue 15: one try in eight answered
// killed:true while the bomb grew back from 7 to 42 processes).
func TestRealKillVerified(t *testing.T) {
	h := startServer(t, realConfig(t))
	h.provision("kb", "test-tiny")
	// The bomb's processes are all "bash /tmp/bomb.sh" (subshells keep
	// their parent's arguments).
	// Each bomb process keeps forking for as long as it lives, so the
	// bomb stays at the sandbox's process limit until killed.
	h.sh("kb", `printf 'f(){ while :; do f & done; }; f\n' > /tmp/bomb.sh`)
	// The classic one: each process starts two and ends; it churns at
	// the limit (the report used it).
	h.sh("kb", `printf 'f(){ f | f & }; f; sleep 30\n' > /tmp/classic.sh`)
	// Counted from outside (runsc ps): at the process limit nothing of
	// the user's can start, ps included. Besides the agent (PID 1), only
	// its warm shells (2, a third may be starting) are expected.
	cid := h.get2("kb").ContainerID
	bombs := func() int {
		out, err := exec.Command(h.cfg.Runsc.Binary, "--root", filepath.Join(h.cfg.DataDir, "runsc"), "ps", "--format", "json", cid).Output()
		var ps []int
		if err != nil || json.Unmarshal(out, &ps) != nil {
			t.Fatalf("runsc ps: %v %s", err, out)
		}
		return max(0, len(ps)-1-3)
	}
	for i := range 14 {
		if i >= 12 {
			// The server's fallback when the agent does not answer: the
			// agent's killall command, as root beside it.
			h.exec("kb", map[string]any{"command": "bash /tmp/classic.sh >/dev/null 2>&1 & bash /tmp/bomb.sh >/dev/null 2>&1 & sleep 2", "timeoutMs": 30000})
			before := bombs()
			t0 := time.Now()
			out, err := exec.Command(h.cfg.Runsc.Binary, "--root", filepath.Join(h.cfg.DataDir, "runsc"), "exec", "--user", "0:0", cid, "/.sandboxd/agent", "killall").Output()
			var res struct{ Survivors *int }
			if err != nil || json.Unmarshal(out, &res) != nil || res.Survivors == nil || *res.Survivors != 0 {
				t.Fatalf("try %d: agent killall: %v %q", i, err, out)
			}
			for range 3 {
				if n := bombs(); n != 0 {
					t.Fatalf("try %d: killall said none left but %d processes more than the agent's after %v", i, n, time.Since(t0))
				}
				time.Sleep(700 * time.Millisecond)
			}
			t.Logf("try %d (killall command): %d processes killed in %v", i, before, time.Since(t0))
			continue
		}
		done := make(chan execResponse, 1)
		if i%3 == 2 {
			h.exec("kb", map[string]any{"command": "bash /tmp/classic.sh >/dev/null 2>&1 & sleep 2", "timeoutMs": 30000})
			close(done)
		} else if i%3 == 0 {
			// The bomb's command returned; its processes go on.
			h.exec("kb", map[string]any{"command": "bash /tmp/bomb.sh >/dev/null 2>&1 & sleep 2", "timeoutMs": 30000})
			close(done)
		} else {
			// The bomb's command is still running while it is killed.
			go func() {
				done <- h.exec("kb", map[string]any{"command": "bash /tmp/bomb.sh 2>/dev/null", "timeoutMs": 90000})
			}()
			time.Sleep(2 * time.Second)
		}
		before := bombs()
		if before < 20 && i%3 != 2 {
			t.Fatalf("try %d: the bomb did not run: %d processes", i, before)
		}
		t0 := time.Now()
		code, b := h.call(h.token, "POST", "/v1/sandbox/terminal/kb", map[string]any{"action": "kill"})
		took := time.Since(t0)
		var ans struct {
			Action    string
			Killed    *bool
			Survivors *int
		}
		if err := json.Unmarshal(b, &ans); code != 200 || err != nil || ans.Killed == nil || ans.Survivors == nil {
			t.Fatalf("try %d: kill: %d %s", i, code, b)
		}
		if !*ans.Killed || *ans.Survivors != 0 {
			t.Fatalf("try %d: kill answered %s after %v", i, b, took)
		}
		<-done
		// Nothing grows back: three looks over two seconds.
		for range 3 {
			if n := bombs(); n != 0 {
				t.Fatalf("try %d: killed:true (kill took %v) but %d processes more than the agent's after %v", i, took, n, time.Since(t0))
			}
			time.Sleep(700 * time.Millisecond)
		}
		t.Logf("try %d: %d processes killed in %v", i, before, took)
	}
}
