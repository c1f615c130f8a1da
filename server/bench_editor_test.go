package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"sandboxd/runsc"
)

// BenchmarkPortalEditor: the time from a browser's first /editor/ request
// (ticket, login, the starting page, code-server's start) to VS Code's
// workbench with the Explorer listing /workspace; and the sandbox's memory
// before the editor was opened, with it open in a tab, and after the tab
// was closed and the idle service stopped. Memory is the host's view (the
// sandbox's memory cgroup, gVisor included) and gVisor's own (the sum of
// the processes' RSS inside).
func BenchmarkPortalEditor(b *testing.B) {
	cfg := realConfig(b)
	cfg.Portal.ServiceIdleSeconds = 5
	h := startServer(b, cfg)
	const id = "bench-editor"
	h.provision(id, "standard-3")
	cid := h.s.rt.(*runsc.Runtime).ContainerID(h.get(id).OrgID, id)
	h.sh(id, "echo hello > /workspace/hello.txt") // for the Explorer to list
	mem := func() string {
		time.Sleep(3 * time.Second)
		cg := -1.0
		for _, d := range prefixedCgroups(cid) {
			if strings.Contains(d, "/memory/") {
				v, err := os.ReadFile(filepath.Join(d, "memory.usage_in_bytes"))
				if err == nil {
					n, _ := strconv.ParseFloat(strings.TrimSpace(string(v)), 64)
					cg = n / (1 << 20)
				}
			}
		}
		r := h.sh(id, "ps -eo rss= | awk '{s+=$1} END {print s}'")
		kb, _ := strconv.ParseFloat(strings.TrimSpace(r.Stdout), 64)
		return fmt.Sprintf("cgroup %.0f MiB, processes' RSS %.0f MiB", cg, kb/1024)
	}
	before := mem()
	ctx := newBrowser(b)
	t0 := time.Now()
	h.signIn(b, ctx, id, "/editor/")
	waitFor(b, ctx, "workbench", `document.querySelector(".monaco-workbench .explorer-folders-view .monaco-list-row")`, 3*time.Minute)
	took := time.Since(t0)
	open := mem()
	if err := do(ctx, 10*time.Second, chromedp.Navigate("about:blank")); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for len(h.s.portal.Running(h.get2(id).ID)) > 0 && time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond)
	}
	after := mem()
	b.ReportMetric(took.Seconds(), "editor-load-s")
	fmt.Printf("editor: first /editor/ request to the workbench with the Explorer: %v (code-server's cold start in the sandbox included)\n", took.Round(10*time.Millisecond))
	fmt.Printf("  sandbox memory: before %s | editor open in a tab %s | tab closed, editor stopped when idle %s\n", before, open, after)
}
