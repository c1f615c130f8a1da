package server

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"
)

// BenchmarkScrubBudget: what a keyword flood costs the server process
// (its CPU, /proc/self/stat) through a terminal and through an exec
// stream, and what clean text costs, without a scrubbing budget and with
// the shipped one (limits.scrubCpuCores), one round each.
func BenchmarkScrubBudget(b *testing.B) {
	const floodMB, cleanMB = 48, 96
	for _, budget := range []float64{0, 0.25} {
		cfg := realConfig(b)
		cfg.Limits.ScrubCPUCores = budget // burst: the shipped 1 s
		h := startServer(b, cfg)
		h.provision("bench-budget", "standard-2")
		// The flood: `eyJ` lines (5-9 MB per CPU-second); clean text:
		// lines of words (150-200).
		r := h.exec("bench-budget", map[string]any{"command": fmt.Sprintf(`python3 -c '
import random
random.seed(1)
with open("/tmp/flood.txt", "wb") as w:
    for i in range(%d):
        w.write(b"eyJ" * 2667 + b"\n")
words = [b"alpha", b"bravo", b"charlie", b"delta", b"echo", b"output", b"build", b"passed", b"file", b"line", b"the", b"of", b"and", b"ok", b"12345", b"src/main.go:42"]
with open("/tmp/clean.txt", "wb") as w:
    n = 0
    while n < %d:
        l = b" ".join(random.choice(words) for _ in range(12)) + b"\n"
        w.write(l)
        n += len(l)
'`, floodMB*1000000/8002, cleanMB*1000000)})
		if r.ExitCode != 0 {
			b.Fatalf("files: %+v", r)
		}
		hdr := http.Header{"Authorization": {"Bearer " + h.token}}
		run := func(what, query string, tagged bool, mb float64) {
			held0 := scrapeMetric(b, h, "sandboxd_scrub_throttled_seconds_total")
			scrub0 := scrapeMetric(b, h, "sandboxd_scrub_cpu_seconds_total")
			cpu0, t0 := procCPU(b), time.Now()
			c, _, err := h.dialWS("/v1/sandbox/terminal/bench-budget/ws?"+query, hdr)
			if err != nil {
				b.Fatal(err)
			}
			out, exit, err := readWSAll(c, tagged, 10*time.Minute)
			c.Close()
			took, cpu := time.Since(t0), procCPU(b)-cpu0
			if err != nil || exit != 0 {
				b.Fatalf("%s: %v exit %d", what, err, exit)
			}
			held := scrapeMetric(b, h, "sandboxd_scrub_throttled_seconds_total") - held0
			scrubbed := scrapeMetric(b, h, "sandboxd_scrub_cpu_seconds_total") - scrub0 // 0 without a budget
			fmt.Printf("budget %-4s %-19s %5.1f MB in %5.1f s: %5.1f MB/s; server CPU %5.2f s (%.2f cores, %.3f s a MB), scrubbing %5.2f s (%.2f cores); held back %.1f s\n",
				strconv.FormatFloat(budget, 'g', -1, 64), what, float64(len(out))/1e6, took.Seconds(), float64(len(out))/1e6/took.Seconds(),
				cpu.Seconds(), cpu.Seconds()/took.Seconds(), cpu.Seconds()/mb, scrubbed, scrubbed/took.Seconds(), held)
		}
		run("terminal: flood", "command="+url.QueryEscape("cat /tmp/flood.txt"), false, floodMB)
		run("exec stream: flood", "tty=false&command="+url.QueryEscape("cat /tmp/flood.txt"), true, floodMB)
		run("exec stream: clean", "tty=false&command="+url.QueryEscape("cat /tmp/clean.txt"), true, cleanMB)
		h.call(h.token, "DELETE", "/v1/sandbox/bench-budget", nil)
		h.close()
	}
}
