package server

// Issue 15: scrubbing a sandbox's output is the server's CPU. A keyword
// flood through an attached terminal kept about 2/3 of a server core busy,
// through an exec stream a whole one, for as long as the sandbox printed:
// nothing bounded it. Each session's scrubbing now has a CPU budget
// (limits.scrubCpuCores); past it the session's output waits in its pipe.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// procCPU is this process's CPU time (user and system, /proc/self/stat):
// the in-process server's, not the sandboxes'.
func procCPU(t testing.TB) time.Duration {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64) // fields 14 and 15 of the line
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ 100
}

// scrapeMetric reads one unlabelled metric from /metrics.
func scrapeMetric(t testing.TB, h *harness, name string) float64 {
	resp, err := http.Get(h.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("metric %s missing", name)
	return 0
}

// readWSAll collects a socket's binary output (an exec stream's frames carry
// a stream tag) until its exit event.
func readWSAll(c *websocket.Conn, tagged bool, d time.Duration) (stdout []byte, exit int, err error) {
	var out bytes.Buffer
	deadline := time.Now().Add(d)
	for {
		c.SetReadDeadline(deadline)
		typ, data, err := c.ReadMessage()
		if err != nil {
			return out.Bytes(), -1, fmt.Errorf("read after %d bytes: %v", out.Len(), err)
		}
		if typ == websocket.BinaryMessage {
			if tagged {
				if len(data) == 0 || data[0] != 1 {
					return out.Bytes(), -1, fmt.Errorf("a frame not of stdout: %.40q", data)
				}
				data = data[1:]
			}
			out.Write(data)
			continue
		}
		if bytes.Contains(data, []byte(`"exit"`)) {
			var code int
			fmt.Sscanf(string(data[bytes.Index(data, []byte(`"exitCode":`))+11:]), "%d", &code)
			return out.Bytes(), code, nil
		}
	}
}

// threadCPUTime is the calling thread's CPU time (lock the goroutine to
// its thread around a measurement).
func threadCPUTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(1, &ru) // RUSAGE_THREAD
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// floodLine is one line of the flood: `eyJ` repeated (the costliest shape
// to scrub, 5-9 MB per CPU-second; a JWT's start that never becomes one).
var floodLine = strings.Repeat("eyJ", 2667)

// floodLines sizes the flood so that scrubbing it takes about cpu (the
// race detector and a loaded machine scrub slower), measured here with the
// server's rules.
func floodLines(t *testing.T, h *harness, cpu time.Duration) int {
	sample := []byte(strings.Repeat(floodLine+"\n", 40))
	set := loadScrubber() // the shipped rules, no budget
	runtime.LockOSThread()
	c0 := threadCPUTime()
	w := set.NewWriter(io.Discard)
	w.Write(sample)
	w.Close()
	d := threadCPUTime() - c0
	runtime.UnlockOSThread()
	perLine := d / 40
	n := min(max(int(cpu/max(perLine, time.Microsecond)), 20), 1000)
	t.Logf("scrubbing a line of the flood takes %v: %d lines for %v", perLine, n, cpu)
	return n
}

func TestRealScrubBudget(t *testing.T) {
	cfg := realConfig(t)
	// A tenth of a core (the shipped budget is a quarter) and a small
	// burst: the budget bites on a loaded machine too, and soon.
	const cores, burst = 0.1, 100 * time.Millisecond
	cfg.Limits.ScrubCPUCores, cfg.Limits.ScrubCPUBurstMs = cores, int(burst/time.Millisecond)
	h := startServer(t, cfg)
	const secret = "Budg3tS3cretValue7q"
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "bf", "size": "test-tiny",
		"secrets": map[string]string{"BUDGET_SECRET": secret}})
	if code != http.StatusCreated {
		t.Fatalf("provision: %d %s", code, b)
	}
	t.Cleanup(func() { h.call(h.token, "DELETE", "/v1/sandbox/bf", nil) })
	// The bystander: another organization's session.
	pB, tokB, err := h.s.db.CreateOrg(context.Background(), "bystanders", "bystander")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.s.db.SetPlan(context.Background(), pB.Org.ID, "team"); err != nil {
		t.Fatal(err)
	}
	if code, b := h.call(tokB, "POST", "/v1/sandbox", map[string]any{"sessionId": "bb", "size": "test-tiny"}); code != http.StatusCreated {
		t.Fatalf("bystander: %d %s", code, b)
	}
	t.Cleanup(func() { h.call(tokB, "DELETE", "/v1/sandbox/bb", nil) })
	echo := func() (time.Duration, error) {
		st := time.Now()
		code, b := h.call(tokB, "POST", "/v1/sandbox/terminal/bb", map[string]any{"action": "exec", "command": "echo ok"})
		if code != http.StatusOK || !strings.Contains(string(b), `"stdout":"ok\n"`) {
			return 0, fmt.Errorf("bystander echo: %d %.200s", code, b)
		}
		return time.Since(st), nil
	}

	// The flood, a secret in its middle, written to a file once so that
	// both streams carry the same bytes: about 12 s of scrubbing at the
	// budget for both.
	lines := floodLines(t, h, time.Duration(float64(6*time.Second)*cores))
	half := lines / 2
	r := h.exec("bf", map[string]any{"command": fmt.Sprintf(`python3 -c '
import os, sys
w = open("/tmp/flood.txt", "wb")
for i in range(%d):
    w.write(b"eyJ" * 2667 + b"\n")
    if i == %d:
        w.write(b"password=" + os.environ["BUDGET_SECRET"].encode() + b"\n")
' && stat -c %%s /tmp/flood.txt`, lines, half-1)})
	if r.ExitCode != 0 {
		t.Fatalf("flood file: %+v", r)
	}
	size, _ := strconv.Atoi(strings.TrimSpace(r.Stdout))
	check := func(name string, out []byte) {
		t.Helper()
		got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(got) != lines+1 {
			t.Errorf("%s: %d lines, want %d (%d bytes)", name, len(got), lines+1, len(out))
			return
		}
		for i, l := range got {
			switch {
			case i == half:
				if l != "password=[REDACTED:BUDGET_SECRET]" && l != "password=[REDACTED:password-assignment]" {
					t.Errorf("%s: the secret's line is %.80q", name, l)
				}
			case l != floodLine:
				t.Errorf("%s: line %d differs (%d bytes: %.40q ... %q)", name, i, len(l), l, l[max(0, len(l)-80):])
				return
			}
		}
		if bytes.Contains(out, []byte(secret[4:])) {
			t.Errorf("%s: the secret shows", name)
		}
	}
	// Before: the bystander's echo and the server's CPU at rest.
	var base []time.Duration
	for i := 0; i < 5; i++ {
		d, err := echo()
		if err != nil {
			t.Fatal(err)
		}
		base = append(base, d)
	}
	sort.Slice(base, func(i, j int) bool { return base[i] < base[j] })
	throttles0 := scrapeMetric(t, h, "sandboxd_scrub_throttles_total")
	held0 := scrapeMetric(t, h, "sandboxd_scrub_throttled_seconds_total")
	scrub0 := scrapeMetric(t, h, "sandboxd_scrub_cpu_seconds_total")

	// The bystander's commands while the flood runs.
	stop := make(chan struct{})
	var (
		mu   sync.Mutex
		lats []time.Duration
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			d, err := echo()
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			lats = append(lats, d)
			mu.Unlock()
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	// The flood through an attached terminal and an exec stream at once:
	// one session, one budget.
	cpu0, t0 := procCPU(t), time.Now()
	hdr := http.Header{"Authorization": {"Bearer " + h.token}}
	var tty, stream []byte
	var ttyErr, streamErr error
	var ttyExit, streamExit int
	var ttyTook, streamTook time.Duration
	var fw sync.WaitGroup
	fw.Add(2)
	go func() {
		defer fw.Done()
		c, _, err := h.dialWS("/v1/sandbox/terminal/bf/ws?command="+url.QueryEscape("cat /tmp/flood.txt"), hdr)
		if err != nil {
			ttyErr = err
			return
		}
		defer c.Close()
		tty, ttyExit, ttyErr = readWSAll(c, false, 2*time.Minute)
		ttyTook = time.Since(t0)
	}()
	go func() {
		defer fw.Done()
		c, _, err := h.dialWS("/v1/sandbox/terminal/bf/ws?tty=false&command="+url.QueryEscape("cat /tmp/flood.txt"), hdr)
		if err != nil {
			streamErr = err
			return
		}
		defer c.Close()
		stream, streamExit, streamErr = readWSAll(c, true, 2*time.Minute)
		streamTook = time.Since(t0)
	}()
	fw.Wait()
	took, cpu := time.Since(t0), procCPU(t)-cpu0
	if ttyErr != nil || streamErr != nil || ttyExit != 0 || streamExit != 0 {
		t.Fatalf("terminal: %v exit %d; exec stream: %v exit %d", ttyErr, ttyExit, streamErr, streamExit)
	}
	check("exec stream", stream)
	check("terminal", bytes.ReplaceAll(tty, []byte("\r\n"), []byte("\n")))

	throttles := scrapeMetric(t, h, "sandboxd_scrub_throttles_total") - throttles0
	held := scrapeMetric(t, h, "sandboxd_scrub_throttled_seconds_total") - held0
	scrubbed := scrapeMetric(t, h, "sandboxd_scrub_cpu_seconds_total") - scrub0
	mb := float64(2*size) / 1e6
	t.Logf("%.1f MB through a terminal (%v) and an exec stream (%v) at once: %v, %.1f MB/s; the server's CPU %v (%.2f cores, %.2f s a MB), scrubbing %.2f s (%.2f cores); held back %.1f s in %.0f waits",
		mb, ttyTook.Round(time.Millisecond), streamTook.Round(time.Millisecond), took.Round(time.Millisecond), mb/took.Seconds(),
		cpu, cpu.Seconds()/took.Seconds(), cpu.Seconds()/mb, scrubbed, scrubbed/took.Seconds(), held, throttles)
	mu.Lock()
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	if len(lats) > 0 {
		t.Logf("bystander echo: before %v median; during the flood %d runs, median %v, max %v", base[len(base)/2].Round(time.Millisecond),
			len(lats), lats[len(lats)/2].Round(time.Millisecond), lats[len(lats)-1].Round(time.Millisecond))
		if lats[len(lats)/2] > 2*time.Second || lats[len(lats)-1] > 10*time.Second {
			t.Errorf("bystander slowed: median %v, max %v", lats[len(lats)/2], lats[len(lats)-1])
		}
	}
	mu.Unlock()

	// Throttled, and it shows: the metric, the session's log.
	if throttles < 1 || held <= 0 {
		t.Errorf("not throttled: %.0f waits, %.2f s held", throttles, held)
	}
	if logs := h.logsText("bf"); !strings.Contains(logs, `"kind":"scrub_throttled"`) {
		t.Errorf("no scrub_throttled event in the session's log")
	}
	// The server's CPU stays near the budget: scrubbing at most the
	// budget past its burst (its own measure), and the whole process (what
	// moving the bytes costs, the bystander's commands) within three times
	// the budget. Without one the flood took 0.3 cores on this machine at
	// load 13 (the sandbox could not print faster), a core or more at rest.
	if c := (scrubbed - burst.Seconds()) / took.Seconds(); c > 1.3*cores {
		t.Errorf("scrubbing used %.2f cores past its burst (budget %v)", c, cores)
	}
	if c := cpu.Seconds() / took.Seconds(); c > 3*cores {
		t.Errorf("the server used %.2f cores during the flood (budget %v)", c, cores)
	}
}
