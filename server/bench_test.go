package server

// Benchmarks against raw runsc in the same run (make bench). Each iteration
// measures the raw baseline and sandboxd back to back, so both see the same
// machine state; results are printed as p50/p95 and ratios.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"sandboxd/runsc/image"
	"sandboxd/server/config"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

type samples []time.Duration

func (s samples) pct(p float64) time.Duration {
	c := append(samples{}, s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	if len(c) == 0 {
		return 0
	}
	i := int(p * float64(len(c)-1))
	return c[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func report(b *testing.B, name string, raw, ours samples) {
	b.ReportMetric(ms(ours.pct(0.5)), "p50-ms")
	b.ReportMetric(ms(ours.pct(0.95)), "p95-ms")
	b.ReportMetric(ms(raw.pct(0.5)), "raw-p50-ms")
	b.ReportMetric(ms(raw.pct(0.95)), "raw-p95-ms")
	b.ReportMetric(ms(ours.pct(0.5))/ms(raw.pct(0.5)), "ratio-p50")
	fmt.Printf("%s (n=%d): sandboxd p50 %.1f ms p95 %.1f ms | raw runsc p50 %.1f ms p95 %.1f ms | ratio p50 %.2fx p95 %.2fx\n",
		name, len(ours), ms(ours.pct(0.5)), ms(ours.pct(0.95)), ms(raw.pct(0.5)), ms(raw.pct(0.95)),
		ms(ours.pct(0.5))/ms(raw.pct(0.5)), ms(ours.pct(0.95))/ms(raw.pct(0.95)))
}

// rawRunsc is a plain runsc setup with the same image: a minimal bundle
// (read-only root, runsc's default overlay), as a user of runsc would write.
type rawRunsc struct {
	bin, root, bundle string
}

func newRawRunsc(b *testing.B, cfg *config.Config, img string) *rawRunsc {
	dir := b.TempDir()
	r := &rawRunsc{bin: cfg.Runsc.Binary, root: filepath.Join(dir, "state"), bundle: filepath.Join(dir, "bundle")}
	os.MkdirAll(r.root, 0o700)
	os.MkdirAll(r.bundle, 0o700)
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: []string{"/bin/sleep", "infinity"}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"}},
		Root:    &specs.Root{Path: img, Readonly: true},
		Linux: &specs.Linux{CgroupsPath: "sbxbench-raw", Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.NetworkNamespace}}},
	}
	data, _ := json.Marshal(spec)
	os.WriteFile(filepath.Join(r.bundle, "config.json"), data, 0o600)
	b.Cleanup(func() {
		osexec.Command(r.bin, "--root", r.root, "delete", "--force", "raw").Run()
		unix.Unmount(filepath.Join(r.root, "null-netns"), unix.MNT_DETACH)
		os.Remove("/sys/fs/cgroup/memory/sbxbench-raw")
	})
	return r
}

// start creates and starts the raw container "raw".
func (r *rawRunsc) start(b *testing.B) {
	if err := r.run("create", "--bundle", r.bundle, "raw"); err != nil {
		b.Fatal(err)
	}
	if err := r.run("start", "raw"); err != nil {
		b.Fatal(err)
	}
}

func (r *rawRunsc) run(args ...string) error {
	cmd := osexec.Command(r.bin, append([]string{"--root", r.root, "--network", "none"}, args...)...)
	cmd.Dir = r.bundle
	// create hands its stdio to the sandbox: a file, not a pipe that would
	// never close.
	logf, err := os.OpenFile(filepath.Join(r.root, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %v", args[0], err)
	}
	return nil
}

func BenchmarkProvision(b *testing.B) {
	cfg := realConfig(b)
	h := startServer(b, cfg)
	raw := newRawRunsc(b, cfg, imageDir(b, cfg))
	var rs, os_ samples
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := raw.run("create", "--bundle", raw.bundle, "raw"); err != nil {
			b.Fatal(err)
		}
		if err := raw.run("start", "raw"); err != nil {
			b.Fatal(err)
		}
		rs = append(rs, time.Since(t0))
		raw.run("delete", "--force", "raw")

		id := fmt.Sprintf("bench-%d", i)
		t0 = time.Now()
		h.provision(id, "")
		os_ = append(os_, time.Since(t0))
		h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil)
	}
	b.StopTimer()
	report(b, "provision (POST until running) vs runsc create+start", rs, os_)
}

func BenchmarkExec(b *testing.B) {
	cfg := realConfig(b)
	h := startServer(b, cfg)
	raw := newRawRunsc(b, cfg, imageDir(b, cfg))
	raw.start(b)
	h.provision("bench-exec", "")
	var rs, rt, os_ samples
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := raw.run("exec", "raw", "/bin/true"); err != nil {
			b.Fatal(err)
		}
		rt = append(rt, time.Since(t0))
		// The same command sandboxd runs: a login shell running `true`.
		t0 = time.Now()
		if err := raw.run("exec", "--user", "1000:1000", "raw", "/bin/bash", "-lc", "true"); err != nil {
			b.Fatal(err)
		}
		rs = append(rs, time.Since(t0))
		t0 = time.Now()
		if r := h.sh("bench-exec", "true"); r.ExitCode != 0 {
			b.Fatalf("%+v", r)
		}
		os_ = append(os_, time.Since(t0))
	}
	b.StopTimer()
	fmt.Printf("raw runsc exec /bin/true (n=%d): p50 %.1f ms p95 %.1f ms\n", len(rt), ms(rt.pct(0.5)), ms(rt.pct(0.95)))
	report(b, "REST exec of `true` (bash -lc) vs runsc exec of bash -lc true", rs, os_)
}

// BenchmarkCodeRun times a Python run in a warm context (`1 + 1`) against
// the cold way without sandboxd: runsc exec of `python3 -c 'print(1 + 1)'`.
func BenchmarkCodeRun(b *testing.B) {
	cfg := realConfig(b)
	h := startServer(b, cfg)
	raw := newRawRunsc(b, cfg, imageDir(b, cfg))
	raw.start(b)
	h.provision("bench-code", "")
	if code, r, raw := h.runCode("python", "bench-code", map[string]any{"code": "1"}); code != 200 || r.Error != nil {
		b.Fatalf("%d %s", code, raw)
	}
	var rs, os_ samples
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := raw.run("exec", "--user", "1000:1000", "raw", "/usr/bin/python3", "-c", "print(1 + 1)"); err != nil {
			b.Fatal(err)
		}
		rs = append(rs, time.Since(t0))
		t0 = time.Now()
		if code, r, raw := h.runCode("python", "bench-code", map[string]any{"code": "1 + 1"}); code != 200 || r.Result == nil || *r.Result != "2" {
			b.Fatalf("%d %s", code, raw)
		}
		os_ = append(os_, time.Since(t0))
	}
	b.StopTimer()
	report(b, "Python run `1 + 1` in a warm context vs runsc exec python3 -c", rs, os_)
}

// imageDir is the default image's root filesystem.
func imageDir(b *testing.B, cfg *config.Config) string {
	r, err := cfg.ImageRecipe()
	if err != nil {
		b.Fatal(err)
	}
	dir, err := image.Ensure(context.Background(), cfg.Image.CacheDir, r, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	return dir
}
