package server

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"sandboxd/runsc"
)

// BenchmarkTerminalEcho: one keystroke through the WebSocket, the PTY and
// bash's line editor, until its echo arrives back.
func BenchmarkTerminalEcho(b *testing.B) {
	h := startServer(b, realConfig(b))
	h.provision("bench-tty", "")
	w := h.terminalWS(b, "bench-tty", "cols=120&rows=40")
	if !w.readUntil("$ ", 10*time.Second) {
		b.Fatal("no prompt")
	}
	var rtt samples
	n := max(b.N, 200)
	b.ResetTimer()
	for i := 0; i < n; i++ {
		mark := fmt.Sprint(i % 10)
		before := w.out.Len()
		t0 := time.Now()
		w.send(mark)
		for w.out.Len() == before || !strings.Contains(w.out.String()[before:], mark) {
			w.c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, data, err := w.c.ReadMessage()
			if err != nil {
				b.Fatal(err)
			}
			w.out.Write(data)
		}
		rtt = append(rtt, time.Since(t0))
		if i%50 == 49 {
			w.send("\x15") // Ctrl-U: clear the line
			time.Sleep(20 * time.Millisecond)
		}
	}
	b.StopTimer()
	b.ReportMetric(ms(rtt.pct(0.5)), "p50-ms")
	b.ReportMetric(ms(rtt.pct(0.99)), "p99-ms")
	fmt.Printf("terminal keystroke echo (n=%d): p50 %.2f ms p99 %.2f ms\n", len(rtt), ms(rtt.pct(0.5)), ms(rtt.pct(0.99)))
}

const streamCmd = "head -c 200000000 /dev/zero | base64"

// ttyStreamCmd is smaller: gVisor's own PTY moves about 2-3 MB/s (measured
// inside a sandbox with `script`), so 200 MB would take minutes.
const ttyStreamCmd = "head -c 15000000 /dev/zero | base64"

// BenchmarkStreamThroughput: the output of `head -c 200M /dev/zero | base64`
// (about 270 MB) read by a WebSocket client through an exec stream and
// through a terminal, against the same command's output read straight from
// `runsc exec` into /dev/null, in the same run.
func BenchmarkStreamThroughput(b *testing.B) {
	cfg := realConfig(b)
	h := startServer(b, cfg)
	o := h.provision("bench-stream", "standard-2")
	id := h.s.rt.(*runsc.Runtime).ContainerID(o.OrgID, "bench-stream")
	const total = 270175440   // base64 of 200e6 bytes (266666668 chars) plus a newline every 76
	const ttyTotal = 20263158 // base64 of 15e6 bytes with newlines
	var direct, ttyDirect, stream, tty, piped, ttyScript time.Duration
	// One round whatever b.N is: each round moves about 600 MB.
	for i := 0; i < 1; i++ {
		// Direct: runsc exec writes into /dev/null.
		devnull, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		cmd := osexec.Command(cfg.Runsc.Binary, "--root", filepath.Join(cfg.DataDir, "runsc"), "exec", "--user", "1000:1000", id, "/bin/bash", "-c", streamCmd)
		cmd.Stdout = devnull
		t0 := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		direct += time.Since(t0)
		devnull.Close()

		// Ceiling for any reader outside the sandbox: runsc exec into a
		// pipe drained by this process (no scrubber, no WebSocket).
		cmd = osexec.Command(cfg.Runsc.Binary, "--root", filepath.Join(cfg.DataDir, "runsc"), "exec", "--user", "1000:1000", id, "/bin/bash", "-c", streamCmd)
		pr, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		if n, _ := io.CopyBuffer(io.Discard, pr, make([]byte, 256<<10)); n != total {
			b.Fatalf("pipe read %d bytes, want %d", n, total)
		}
		cmd.Wait()
		piped += time.Since(t0)

		// Exec stream through the API.
		hdr := http.Header{"Authorization": {"Bearer " + h.token}}
		c, _, err := h.dialWS("/v1/sandbox/terminal/bench-stream/ws?tty=false&command="+url.QueryEscape(streamCmd), hdr)
		if err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		got := 0
		for {
			typ, data, err := c.ReadMessage()
			if err != nil {
				b.Fatal(err)
			}
			if typ == websocket.BinaryMessage {
				got += len(data) - 1
				continue
			}
			if strings.Contains(string(data), `"exit"`) {
				break
			}
		}
		stream += time.Since(t0)
		c.Close()
		if got != total {
			b.Fatalf("exec stream got %d bytes, want %d", got, total)
		}

		// Terminal: a smaller output through a PTY (CRLF adds bytes),
		// against its own direct baseline.
		devnull, _ = os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		cmd = osexec.Command(cfg.Runsc.Binary, "--root", filepath.Join(cfg.DataDir, "runsc"), "exec", "--user", "1000:1000", id, "/bin/bash", "-c", ttyStreamCmd)
		cmd.Stdout = devnull
		t0 = time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		ttyDirect += time.Since(t0)
		devnull.Close()
		// gVisor's own PTY with nothing of sandboxd in the path: script(1)
		// inside the sandbox, its output into /dev/null.
		cmd = osexec.Command(cfg.Runsc.Binary, "--root", filepath.Join(cfg.DataDir, "runsc"), "exec", "--user", "1000:1000", id, "script", "-qc", ttyStreamCmd, "/dev/null")
		t0 = time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("script: %v %s", err, out)
		}
		ttyScript += time.Since(t0)
		w := h.terminalWS(b, "bench-stream", "command="+url.QueryEscape(ttyStreamCmd))
		t0 = time.Now()
		n := 0
		for {
			typ, data, err := w.c.ReadMessage()
			if err != nil {
				break
			}
			if typ == websocket.BinaryMessage {
				n += len(data)
				continue
			}
			if strings.Contains(string(data), `"exit"`) {
				break
			}
		}
		tty += time.Since(t0)
		w.c.Close()
		if n < ttyTotal {
			b.Fatalf("terminal got %d bytes, want >= %d", n, ttyTotal)
		}
	}
	// Clean output is never held back for the session's scrubbing budget
	// (limits.scrubCpuCores): this base64 scrubs at 600+ MB per CPU-second.
	held := scrapeMetric(b, h, "sandboxd_scrub_throttled_seconds_total")
	scrubbed := scrapeMetric(b, h, "sandboxd_scrub_cpu_seconds_total")
	b.ReportMetric(held, "held-s")
	fmt.Printf("scrubbing %.0f MB took %.2f s of CPU (%.0f MB per CPU-second); held back for the budget: %.1f s\n",
		float64(total+ttyTotal)/1e6, scrubbed, float64(total+ttyTotal)/1e6/scrubbed, held)
	mbps := func(bytes int, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(total, direct), "direct-MB/s")
	b.ReportMetric(mbps(total, stream), "stream-MB/s")
	b.ReportMetric(mbps(ttyTotal, tty), "tty-MB/s")
	fmt.Printf("stream throughput of %q: direct runsc exec into /dev/null %.0f MB/s | into a pipe read here %.0f MB/s | exec stream %.0f MB/s (%.2fx /dev/null, %.2fx pipe)\n",
		streamCmd, mbps(total, direct), mbps(total, piped), mbps(total, stream), mbps(total, stream)/mbps(total, direct), mbps(total, stream)/mbps(total, piped))
	fmt.Printf("terminal throughput of %q: direct runsc exec %.0f MB/s | script(1) PTY inside the sandbox %.1f MB/s | terminal %.1f MB/s (%.3fx direct, %.2fx script)\n",
		ttyStreamCmd, mbps(ttyTotal, ttyDirect), mbps(ttyTotal, ttyScript), mbps(ttyTotal, tty), mbps(ttyTotal, tty)/mbps(ttyTotal, ttyDirect), mbps(ttyTotal, tty)/mbps(ttyTotal, ttyScript))
}
