package server

// Pause with memory against a cold start (make bench): each iteration
// provisions a standard-1 session cold and runs its first Python cell (the
// application's start-up), then pauses and resumes it idle, then with
// 500 MB of touched memory, and runs a cell after each resume.

import (
	"fmt"
	"testing"
	"time"
)

func BenchmarkPauseResume(b *testing.B) {
	cfg := realConfig(b)
	h := startServer(b, cfg)
	var cold, pauseIdle, resumeIdle, pauseBig, resumeBig samples
	py := func(id, code string) {
		b.Helper()
		if c, r, raw := h.runCode("python", id, map[string]any{"code": code, "timeoutMs": 120000}); c != 200 || r.Error != nil {
			b.Fatalf("python: %d %s", c, raw)
		}
	}
	timed := func(f func()) time.Duration {
		t0 := time.Now()
		f()
		return time.Since(t0)
	}
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("bp%d", i)
		cold = append(cold, timed(func() {
			h.provision(id, "standard-1")
			py(id, "1 + 1")
		}))
		h.sh(id, "true") // the agent and its warm shells are up
		pauseIdle = append(pauseIdle, timed(func() { h.pause(id, 200) }))
		resumeIdle = append(resumeIdle, timed(func() {
			h.resumeOK(id)
			py(id, "1 + 1")
		}))
		py(id, "b = bytearray(500 << 20)\nfor j in range(0, len(b), 4096): b[j] = 1")
		pauseBig = append(pauseBig, timed(func() { h.pause(id, 200) }))
		resumeBig = append(resumeBig, timed(func() {
			h.resumeOK(id)
			py(id, "len(b)")
		}))
		if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 {
			b.Fatal("delete")
		}
	}
	p := func(name string, s samples) {
		fmt.Printf("%s (n=%d): p50 %.1f ms p95 %.1f ms\n", name, len(s), ms(s.pct(0.5)), ms(s.pct(0.95)))
	}
	p("cold provision + first Python run", cold)
	p("pause, idle standard-1", pauseIdle)
	p("resume + Python run, idle standard-1", resumeIdle)
	p("pause, 500 MB touched", pauseBig)
	p("resume + Python run, 500 MB touched", resumeBig)
	b.ReportMetric(ms(cold.pct(0.5)), "cold-p50-ms")
	b.ReportMetric(ms(resumeIdle.pct(0.5)), "resume-idle-p50-ms")
	b.ReportMetric(ms(resumeBig.pct(0.5)), "resume-500MB-p50-ms")
	b.ReportMetric(ms(pauseBig.pct(0.5)), "pause-500MB-p50-ms")
}
