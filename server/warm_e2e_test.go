package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
)

// A login profile too slow for warm shells (they give up after 10 s) sends
// every command down the cold path; the agent then backs off instead of
// retrying, keeps doing so across a server restart, and is warm again soon
// after the profile is fixed.
func TestRealWarmPoolRecovers(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	org := h.provision("wp1", "test-tiny").OrgID
	stats := func(h *harness) agent.Stats {
		t.Helper()
		rt := h.s.rt.(*runsc.Runtime)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := rt.Agent(rt.ContainerID(org, "wp1")).Stats(ctx)
		if err != nil {
			t.Fatalf("agent stats: %v", err)
		}
		return st
	}
	// probe runs a command that says whether a warm shell ran it (its
	// argv is `bash -l -c BOOTSTRAP`, a cold one's `bash -lc CMD`). With
	// FAST set, the profile below does not sleep, so cold runs are quick;
	// warm shells start with the session's environment, without FAST.
	probe := func(h *harness) (warm bool, d time.Duration) {
		t.Helper()
		t0 := time.Now()
		r := h.exec("wp1", map[string]any{"env": map[string]string{"FAST": "1"},
			"command": `[ "$(tr '\0' '\n' </proc/$$/cmdline | sed -n 2p)" = -l ] && echo warm || echo cold`})
		if r.ExitCode != 0 || (r.Stdout != "warm\n" && r.Stdout != "cold\n") {
			t.Fatalf("probe: %+v", r)
		}
		return r.Stdout == "warm\n", time.Since(t0)
	}
	waitWarm := func(h *harness, within time.Duration) time.Duration {
		t.Helper()
		t0 := time.Now()
		for {
			if warm, _ := probe(h); warm {
				return time.Since(t0)
			}
			if time.Since(t0) > within {
				t.Fatalf("no warm shell within %v (agent %+v)", within, stats(h))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitWarm(h, 20*time.Second)

	// Break the profile: warm starts sleep past their 10 s limit.
	if r := h.exec("wp1", map[string]any{"env": map[string]string{"FAST": "1"},
		"command": `echo '[ -n "$FAST" ] || sleep 30' >> ~/.profile`}); r.ExitCode != 0 {
		t.Fatalf("break the profile: %+v", r)
	}
	broken := time.Now()
	var st agent.Stats
	for {
		// Meanwhile commands run cold, without waiting for the pool.
		if warm, d := probe(h); warm || d > 8*time.Second {
			t.Fatalf("with a slow profile: warm=%v in %v", warm, d)
		}
		if st = stats(h); st.WarmFails >= 3 {
			break
		}
		if time.Since(broken) > 60*time.Second {
			t.Fatalf("warm starts did not fail: %+v", st)
		}
		time.Sleep(time.Second)
	}
	t.Logf("%d failed warm starts after %v; back-off left %d ms", st.WarmFails, time.Since(broken).Round(time.Millisecond), st.WarmRetryMs)
	// Backing off: commands start no more warm shells. (The shells of a
	// round fail together: let the round end first.)
	time.Sleep(time.Second)
	st = stats(h)
	for range 5 {
		probe(h)
	}
	if st2 := stats(h); st2.WarmFails != st.WarmFails || st2.Warm != 0 {
		t.Fatalf("more warm starts while backing off: %+v, then %+v", st, st2)
	}

	// The agent outlives a server restart, its pool's state too.
	h.close()
	h = startServer(t, cfg)
	if warm, d := probe(h); warm || d > 8*time.Second {
		t.Fatalf("after a restart: warm=%v in %v", warm, d)
	}

	// Fixed: warm again soon, without waiting for the back-off.
	if r := h.exec("wp1", map[string]any{"env": map[string]string{"FAST": "1"},
		"command": `sed -i '/FAST/d' ~/.profile`}); r.ExitCode != 0 {
		t.Fatalf("fix the profile: %+v", r)
	}
	took := waitWarm(h, 10*time.Second)
	if st = stats(h); st.WarmFails != 0 || st.WarmRetryMs != 0 {
		t.Fatalf("after the fix: %+v", st)
	}
	t.Logf("warm again %v after the fix (agent %+v)", took.Round(time.Millisecond), st)
	// And the command still sees the fixed profile's environment exactly.
	r := h.sh("wp1", `echo "fast=${FAST-unset}"`)
	if !strings.HasPrefix(r.Stdout, "fast=unset") {
		t.Fatalf("after recovery: %+v", r)
	}
}
