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
	for _, bg := range []bool{false, true} {
		b.Run(fmt.Sprintf("background=%v", bg), func(b *testing.B) { benchPauseResume(b, bg) })
	}
}

func benchPauseResume(b *testing.B, background bool) {
	cfg := realConfig(b)
	cfg.Runsc.RestoreBackground = background
	h := startServer(b, cfg)
	var cold, pauseIdle, resumeIdle, pauseBig, resumeBig, readBig samples
	py := func(id, code, want string) {
		b.Helper()
		if c, r, raw := h.runCode("python", id, map[string]any{"code": code, "timeoutMs": 120000}); c != 200 || r.Error != nil || (want != "" && (r.Result == nil || *r.Result != want)) {
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
			py(id, "1 + 1", "2")
		}))
		h.sh(id, "true") // the agent and its warm shells are up
		pauseIdle = append(pauseIdle, timed(func() { h.pause(id, 200) }))
		resumeIdle = append(resumeIdle, timed(func() {
			h.resumeOK(id)
			py(id, "1 + 1", "2")
		}))
		py(id, "b = bytearray(500 << 20)\nfor j in range(0, len(b), 4096): b[j] = j // 4096 % 251", "")
		pauseBig = append(pauseBig, timed(func() { h.pause(id, 200) }))
		resumeBig = append(resumeBig, timed(func() {
			h.resumeOK(id)
			py(id, "len(b)", "524288000")
		}))
		// Every page is read back with its own value: the memory is all there.
		readBig = append(readBig, timed(func() {
			py(id, "all(b[j] == j // 4096 % 251 for j in range(0, len(b), 4096))", "True")
		}))
		if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 {
			b.Fatal("delete")
		}
	}
	p := func(name string, s samples) {
		fmt.Printf("background=%v %s (n=%d): p50 %.1f ms p95 %.1f ms\n", background, name, len(s), ms(s.pct(0.5)), ms(s.pct(0.95)))
	}
	p("cold provision + first Python run", cold)
	p("pause, idle standard-1", pauseIdle)
	p("resume + Python run, idle standard-1", resumeIdle)
	p("pause, 500 MB touched", pauseBig)
	p("resume + Python run, 500 MB touched", resumeBig)
	p("then a run reading every page of the 500 MB", readBig)
	b.ReportMetric(ms(cold.pct(0.5)), "cold-p50-ms")
	b.ReportMetric(ms(resumeIdle.pct(0.5)), "resume-idle-p50-ms")
	b.ReportMetric(ms(resumeBig.pct(0.5)), "resume-500MB-p50-ms")
	b.ReportMetric(ms(readBig.pct(0.5)), "read-500MB-p50-ms")
	b.ReportMetric(ms(pauseBig.pct(0.5)), "pause-500MB-p50-ms")
}
