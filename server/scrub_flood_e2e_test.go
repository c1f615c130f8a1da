package server

// Issue 15: output a sandbox user prints on purpose to burn the server's
// CPU in the secret scrubber, keyword floods (`yes 'token: '`), took about
// 7 s of CPU per MiB; 4 MiB of each shape must now go through the exec
// stream in seconds, a secret inside a flood still redacted, while another
// session's commands answer.

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRealScrubKeywordFlood(t *testing.T) {
	cfg := realConfig(t)
	// The scrubber's own speed: no budget holds the floods back (under the
	// race detector the costliest shapes would wait 20 s each at the
	// shipped 0.25 cores). TestRealScrubBudget tests the budget.
	cfg.Limits.ScrubCPUCores = 0
	h := startServer(t, cfg)
	const secret = "Fl00dS3cretValue9x"
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "flood1", "size": "test-tiny",
		"secrets": map[string]string{"FLOOD_SECRET": secret}})
	if code != http.StatusCreated {
		t.Fatalf("provision: %d %s", code, b)
	}
	t.Cleanup(func() { h.call(h.token, "DELETE", "/v1/sandbox/flood1", nil) })
	h.provision("flood2", "test-tiny")
	t.Cleanup(func() { h.call(h.token, "DELETE", "/v1/sandbox/flood2", nil) })

	const size = 4 << 20
	shapes := []struct{ name, cmd string }{
		{"clean text (control)", "yes 'hello world, all fine'"},
		{"yes 'token: '", "yes 'token: '"},
		{"token:token:...", "yes 'token:' | tr -d '\\n'"},
		{"password=password=...", "yes 'password=' | tr -d '\\n'"},
		{"Authorization: Bearer ...", "yes 'Authorization: Bearer ' | tr -d '\\n'"},
		{"token: value ...", "yes 'token: abc123XYZ' | tr '\\n' ' '"},
		{"eyJ runs to a newline", "yes eyJ | tr -d '\\n' | fold -w 8001"},
		{"token> runs to a newline", "yes 'token>' | tr -d '\\n' | fold -w 6000"},
		{"coloured keywords", `yes "$(printf 'token>\033[0m')" | tr -d '\n'`},
		{"PEM blocks that never end", `python3 -c 'import sys; sys.stdout.buffer.write((b"-----BEGIN RSA PRIVATE KEY-----\n" + b"QUJDRA" * 300 + b"\n") * 2300)'`},
	}
	// A bystander session's commands, timed while the floods run.
	stop := make(chan struct{})
	var (
		mu   sync.Mutex
		lats []time.Duration
		wg   sync.WaitGroup
	)
	wg.Add(1)
	t.Cleanup(func() { close(stop); wg.Wait() }) // before the sessions go
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			st := time.Now()
			if r := h.sh("flood2", "echo ok"); r.Stdout != "ok\n" {
				select {
				case <-stop:
				default:
					t.Errorf("bystander: %+v", r)
				}
				return
			}
			mu.Lock()
			lats = append(lats, time.Since(st))
			mu.Unlock()
		}
	}()
	for _, sh := range shapes {
		st := time.Now()
		r := scrubStream(h, "flood1", fmt.Sprintf("%s | head -c %d", sh.cmd, size))
		d := time.Since(st)
		// (a redaction is shorter than what it replaces: token:token:...
		// comes out as 4 KiB values redacted)
		if r.err != nil || r.exit != 0 || r.stdout == "" {
			t.Fatalf("%s: err %v exit %d, %d bytes, stderr %q", sh.name, r.err, r.exit, len(r.stdout), r.stderr)
		}
		t.Logf("%-28s %5.1f MB/s through the exec stream (%v, %d bytes out)", sh.name, size/d.Seconds()/1e6, d.Round(time.Millisecond), len(r.stdout))
		// Before: 7 s of CPU per MiB, about 28 s for the first floods.
		if d > 15*time.Second {
			t.Errorf("%s: %v for %d bytes", sh.name, d, size)
		}
	}
	// A secret in the middle of a flood is redacted.
	r := scrubStream(h, "flood1", `{ yes 'token: ' | head -c 1000000; printf 'password=%s\n' "$FLOOD_SECRET"; yes 'token:' | tr -d '\n' | head -c 1000000; echo; printf 'token: %s\n' "$FLOOD_SECRET"; }`)
	if r.err != nil || r.exit != 0 || strings.Contains(r.stdout, secret[4:]) || strings.Count(r.stdout, "[REDACTED:") < 2 {
		t.Errorf("secret in a flood: err %v exit %d, shows %v", r.err, r.exit, strings.Contains(r.stdout, secret[4:]))
	}
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	if len(lats) > 0 {
		t.Logf("bystander echo during the floods: %d runs, median %v, max %v", len(lats), lats[len(lats)/2].Round(time.Millisecond), lats[len(lats)-1].Round(time.Millisecond))
	}
}
