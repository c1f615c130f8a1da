package server

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/server/sandbox"
)

// densityCount is how many idle standard-1 sandboxes the density test
// provisions: SANDBOXD_DENSITY (make test-hardening sets 1000), else a
// quick 12 in make test.
func densityCount(t *testing.T) int {
	if v := os.Getenv("SANDBOXD_DENSITY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SANDBOXD_DENSITY=%q", v)
		}
		return n
	}
	return 12
}

func pctl(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(float64(len(s))*p/100))]
}

// Density and load: as many idle standard-1 sandboxes as asked (or until
// the node refuses with a clear 503), their host memory each, provision
// and exec latency, then a busy phase; every figure goes to
// test-output/density.json (docs/BENCHMARKS.md).
func TestRealDensity(t *testing.T) {
	n := densityCount(t)
	cfg := realConfig(t)
	RaiseFileLimit()
	cfg.Limits.MaxSandboxes = n + 8
	cfg.Limits.MaxSandboxesPerOrg = n + 8
	for i := range cfg.Plans.List {
		cfg.Plans.List[i].MaxConcurrent = n + 8
	}
	cfg.Limits.PressureFreeMemoryMiB = 0 // measure the idle cost, nothing paused
	if used, limit := sandbox.HostPids(); limit >= 0 && limit-used-cfg.Limits.MinFreePids < 32*n {
		t.Logf("kernel.pid_max (%d, %d in use) leaves room for about %d sandboxes (31 host tasks each, %d kept free): the server will refuse before %d; sysctl -w kernel.pid_max=4194304 to go further",
			limit, used, (limit-used-cfg.Limits.MinFreePids)/32, cfg.Limits.MinFreePids, n)
	}
	h := startServer(t, cfg)
	res := map[string]any{"asked": n}
	defer func() {
		b, _ := json.MarshalIndent(res, "", "  ")
		os.MkdirAll("test-output", 0o755)
		name := "density.json" // the hardening record, committed
		if os.Getenv("SANDBOXD_DENSITY") == "" {
			name = "density.quick.json"
		}
		os.WriteFile(filepath.Join("test-output", name), b, 0o644)
		t.Logf("density: %s", b)
	}()

	// Warm the image's page cache and the server with one sandbox.
	h.provision("d-warm", "standard-1")
	h.sh("d-warm", "true")
	time.Sleep(2 * time.Second)
	before := sandbox.MemAvailableMiB()
	threadsBefore, pidMax := sandbox.HostPids()
	var ids []string
	var prov []time.Duration
	t0 := time.Now()
	for i := range n {
		id := fmt.Sprintf("d%04d", i)
		ts := time.Now()
		code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": id, "size": "standard-1"})
		if code != 201 {
			// The node's refusal must be a clear 503 and leave nothing.
			var e struct {
				Error struct{ Code, Message string }
			}
			json.Unmarshal(b, &e)
			res["refusedAt"], res["refusal"] = i, fmt.Sprintf("%d %s: %s", code, e.Error.Code, e.Error.Message)
			if code != 503 || e.Error.Message == "" {
				t.Fatalf("provision %d refused unclearly: %d %s", i, code, b)
			}
			if c2, _ := h.call(h.token, "GET", "/v1/sandbox/"+id, nil); c2 != 404 {
				t.Fatalf("refused provision left session %s: %d", id, c2)
			}
			break
		}
		prov = append(prov, time.Since(ts))
		ids = append(ids, id)
		if (i+1)%100 == 0 {
			t.Logf("%d sandboxes, %d MiB available, provision p50 of the last 100 %v", i+1, sandbox.MemAvailableMiB(), pctl(prov[len(prov)-100:], 50))
		}
	}
	res["provisioned"] = len(ids)
	res["provisionSeconds"] = time.Since(t0).Seconds()
	res["provisionP50Ms"], res["provisionP99Ms"] = pctl(prov, 50).Milliseconds(), pctl(prov, 99).Milliseconds()
	if len(ids) == 0 {
		t.Fatal("no sandbox provisioned")
	}
	time.Sleep(10 * time.Second) // let them settle idle
	after := sandbox.MemAvailableMiB()
	// Host threads (each takes a pid: kernel.pid_max bounds them all).
	threadsAfter, _ := sandbox.HostPids()
	res["hostThreadsPerIdleSandbox"] = float64(threadsAfter-threadsBefore) / float64(len(ids))
	res["hostThreads"], res["pidMax"] = threadsAfter, pidMax
	res["memAvailableBeforeMiB"], res["memAvailableAfterMiB"] = before, after
	res["hostMiBPerIdleSandbox"] = float64(before-after) / float64(len(ids))
	// The same cost read where it is charged, unperturbed by other
	// processes on the machine: the sandbox's cgroup (gVisor's sentry,
	// gofer and the guest's memory) for a sample, plus the server's share
	// of its own resident memory (this test process hosts the server).
	var cg []float64
	for _, id := range ids[:min(50, len(ids))] {
		code, b := h.call(h.token, "GET", "/v1/sandbox/"+id+"/stats", nil)
		var st struct{ Memory struct{ UsedBytes *int64 } }
		if code == 200 && json.Unmarshal(b, &st) == nil && st.Memory.UsedBytes != nil {
			cg = append(cg, float64(*st.Memory.UsedBytes)/(1<<20))
		}
	}
	if len(cg) > 0 {
		sum := 0.0
		for _, v := range cg {
			sum += v
		}
		res["cgroupMiBPerIdleSandbox"] = sum / float64(len(cg))
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
				res["serverRSSMiB"] = kb / 1024
				res["serverMiBPerIdleSandbox"] = float64(kb) / 1024 / float64(len(ids))
			}
		}
	}
	res["serverGoroutines"] = runtime.NumGoroutine()
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		res["serverFDs"] = len(ents)
	}

	// Exec latency with every sandbox idle around.
	rounds0, sum0 := monitorRounds(t, h)
	var execs []time.Duration
	var died []string
	for range min(100, 2*len(ids)) {
		id := ids[rand.IntN(len(ids))]
		ts := time.Now()
		if r := h.sh(id, "echo ok"); r.Stdout != "ok\n" {
			// Go on measuring (the run is long); say why it died.
			t.Errorf("exec in %s: %+v; its gVisor log ends:\n%s", id, r, kernelLogTail(t, h, id))
			died = append(died, id)
			continue
		}
		execs = append(execs, time.Since(ts))
	}
	res["idleExecFailures"] = died
	res["idleExecP50Ms"], res["idleExecP99Ms"] = pctl(execs, 50).Milliseconds(), pctl(execs, 99).Milliseconds()
	// The monitor's rounds meanwhile, all sandboxes running.
	if rounds, sum := monitorRounds(t, h); rounds > rounds0 {
		res["monitorRoundMeanMs"] = int64((sum - sum0) / float64(rounds-rounds0) * 1000)
	}

	// Busy: up to 50 sandboxes each with a CPU-bound and an I/O-bound
	// command and a terminal open, while others are probed.
	busy := ids[:min(50, len(ids)/2+1)]
	var wg sync.WaitGroup
	var busyFailed atomic.Int64
	for _, id := range busy {
		h.terminalWS(t, id, "tty=true")
		for _, c := range []string{
			"timeout 20 sh -c 'while :; do :; done'",
			"timeout 20 sh -c 'while :; do dd if=/dev/zero of=/tmp/io bs=1M count=16 conv=fsync 2>/dev/null; done'",
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Not h.exec: it may not fail the test from this goroutine.
				if code, b := h.call(h.token, "POST", "/v1/sandbox/terminal/"+id, map[string]any{"action": "exec", "command": c + "; true", "timeoutMs": 60000}); code != 200 {
					if busyFailed.Add(1) <= 3 {
						t.Logf("busy command in %s: %d %.300s", id, code, b)
					}
				}
			}()
		}
	}
	time.Sleep(3 * time.Second)
	// Probes in idle sandboxes: a bounded slowdown, measured; an answer
	// that is not the command's output counts as a failure.
	var busyExecs []time.Duration
	probeFailed := 0
	for range 40 {
		id := ids[len(ids)-1-rand.IntN(max(1, len(ids)-len(busy)))]
		ts := time.Now()
		code, b := h.call(h.token, "POST", "/v1/sandbox/terminal/"+id, map[string]any{"action": "exec", "command": "echo ok"})
		var r execResponse
		if json.Unmarshal(b, &r); code != 200 || r.Stdout != "ok\n" {
			probeFailed++
			t.Logf("probe in %s under load: %d %s", id, code, b)
			continue
		}
		busyExecs = append(busyExecs, time.Since(ts))
	}
	wg.Wait()
	res["busySandboxes"] = len(busy)
	res["busyExecP50Ms"], res["busyExecP99Ms"] = pctl(busyExecs, 50).Milliseconds(), pctl(busyExecs, 99).Milliseconds()
	res["busyProbeFailures"], res["busyCommandFailures"] = probeFailed, busyFailed.Load()
	if probeFailed > 4 {
		t.Errorf("%d of 40 probes failed under load", probeFailed)
	}

	// Delete them all (cleanup also checks nothing is left).
	t1 := time.Now()
	var dwg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, id := range append(ids, "d-warm") {
		dwg.Add(1)
		sem <- struct{}{}
		go func() {
			defer dwg.Done()
			defer func() { <-sem }()
			if code, b := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 && code != 200 {
				t.Errorf("delete %s: %d %s", id, code, b)
			}
		}()
	}
	dwg.Wait()
	res["deleteSeconds"] = time.Since(t1).Seconds()
}

// monitorRounds reads the monitor's round count and their total seconds
// from the server's metrics.
func monitorRounds(t *testing.T, h *harness) (uint64, float64) {
	t.Helper()
	mfs, err := h.s.met.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sandboxd_monitor_round_seconds" {
			hist := mf.GetMetric()[0].GetHistogram()
			return hist.GetSampleCount(), hist.GetSampleSum()
		}
	}
	t.Fatal("no sandboxd_monitor_round_seconds in the metrics")
	return 0, 0
}

// kernelLogTail is the end of a session's gVisor log (kept with its disk
// when it failed), for the failure message.
func kernelLogTail(t *testing.T, h *harness, id string) string {
	code, b := h.call(h.token, "GET", "/v1/sandbox/"+id, nil)
	var ses struct{ OrgID string }
	if code != 200 || json.Unmarshal(b, &ses) != nil {
		return fmt.Sprintf("(session: %d %s)", code, b)
	}
	log, err := os.ReadFile(filepath.Join(h.cfg.DataDir, "sandboxes", cidOf(h.cfg, ses.OrgID, id), "logs", "runsc.boot.log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(log)), "\n")
	return strings.Join(lines[max(0, len(lines)-40):], "\n")
}
