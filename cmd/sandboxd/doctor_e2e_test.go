package main

// Real tests of `sandboxd doctor`: the binary of $SANDBOXD_BIN (make build)
// against temp data dirs and configs pointing at the real runsc and agent,
// on this machine, then with one problem planted at a time. They need root
// and skip in -short mode or without SANDBOXD_BIN.

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/image"
	"sandboxd/server/config"
)

// doctorBinDir is $SANDBOXD_BIN, with the binaries doctor checks.
func doctorBinDir(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the real sandboxd binary (not in -short)")
	}
	bin := os.Getenv("SANDBOXD_BIN")
	if bin == "" {
		t.Skip("SANDBOXD_BIN is not set: run `make build` and set SANDBOXD_BIN=<repo>/bin")
	}
	if os.Geteuid() != 0 {
		t.Skip("doctor's real tests need root")
	}
	bin, _ = filepath.Abs(bin)
	for _, f := range []string{"sandboxd", "runsc", "sandboxd-agent"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			t.Fatalf("%s missing in %s: run `make build`", f, bin)
		}
	}
	return bin
}

// doctorConf is what a test's config file sets.
type doctorConf struct {
	DataDir, Listen, Runsc, Agent, CacheDir string
	Platform                                string
	MinFreeDiskMiB                          int
	Extra                                   string // more YAML
}

func (c doctorConf) write(t *testing.T) string {
	t.Helper()
	y := fmt.Sprintf("dataDir: %q\nlisten: %q\nrunsc:\n  binary: %q\n  agent: %q\n", c.DataDir, c.Listen, c.Runsc, c.Agent)
	if c.Platform != "" {
		y += fmt.Sprintf("  platform: %q\n", c.Platform)
	}
	// pressureFreeDiskMiB must be above it (config validation).
	y += fmt.Sprintf("limits:\n  minFreeDiskMiB: %d\n  pressureFreeDiskMiB: %d\n", c.MinFreeDiskMiB, 2*c.MinFreeDiskMiB+1)
	if c.CacheDir != "" {
		y += fmt.Sprintf("image:\n  cacheDir: %q\n", c.CacheDir)
	}
	y += c.Extra
	p := filepath.Join(t.TempDir(), "sandboxd.yaml")
	if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// baseConf is a config with nothing wrong: a fresh (short) data dir that
// does not exist yet, a free port, the real binaries and an image cache
// with the default recipe's image planted in it.
func baseConf(t *testing.T, bin string) doctorConf {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbxd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return doctorConf{DataDir: filepath.Join(dir, "data"), Listen: freeAddr(t), Runsc: filepath.Join(bin, "runsc"),
		Agent: filepath.Join(bin, "sandboxd-agent"), CacheDir: plantImage(t), MinFreeDiskMiB: 16}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// plantImage returns an image cache where the default recipe's image
// looks built (image.Find), as a finished build leaves it.
func plantImage(t *testing.T) string {
	t.Helper()
	cache := t.TempDir()
	cfg, err := config.Load(config.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := cfg.ImageRecipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(image.Path(cache, r), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cache, r.Key(), "COMPLETE"), []byte(r.Key()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return cache
}

type doctorReport struct {
	Problems int             `json:"problems"`
	Warnings int             `json:"warnings"`
	Findings []runsc.Finding `json:"findings"`
}

func (r doctorReport) find(name string) (runsc.Finding, bool) {
	i := slices.IndexFunc(r.Findings, func(f runsc.Finding) bool { return f.Name == name })
	if i < 0 {
		return runsc.Finding{}, false
	}
	return r.Findings[i], true
}

func (r doctorReport) problems() []string {
	var out []string
	for _, f := range r.Findings {
		if f.Status == runsc.CheckProblem {
			out = append(out, f.Name)
		}
	}
	return out
}

// doctorRun is one doctor run, as JSON and as text.
type doctorRun struct {
	code    int
	report  doctorReport
	text    string
	elapsed time.Duration // of the JSON run
}

// runDoctor runs `sandboxd doctor` with args, with --json and without;
// both must end with the same status.
func runDoctor(t *testing.T, bin string, args ...string) doctorRun {
	t.Helper()
	run := func(args ...string) (string, int, time.Duration) {
		cmd := exec.Command(filepath.Join(bin, "sandboxd"), append([]string{"doctor"}, args...)...)
		// The config file decides, not the environment the test runs in.
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "SANDBOXD_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		start := time.Now()
		err := cmd.Run()
		elapsed := time.Since(start)
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if errb.Len() > 0 {
			t.Errorf("doctor wrote to stderr: %s", errb.String())
		}
		return out.String(), code, elapsed
	}
	js, code, elapsed := run(append(args, "--json")...)
	var d doctorRun
	d.code, d.elapsed = code, elapsed
	if err := json.Unmarshal([]byte(js), &d.report); err != nil {
		t.Fatalf("doctor --json printed no JSON (is %s/sandboxd stale? run `make build`): %v\n%s", bin, err, js)
	}
	text, tcode, _ := run(args...)
	if tcode != code {
		t.Errorf("exit status %d as text, %d as JSON", tcode, code)
	}
	d.text = text
	if want := 0; len(d.report.problems()) > 0 {
		want = 1
		if code != want {
			t.Errorf("exit status %d with problems %v, want 1", code, d.report.problems())
		}
	} else if code != want {
		t.Errorf("exit status %d without problems", code)
	}
	if d.report.Problems != len(d.report.problems()) {
		t.Errorf("problems %d, findings say %v", d.report.Problems, d.report.problems())
	}
	return d
}

// doctorChecks are the findings every doctor run with a loadable config
// reports (and the listen address's).
var doctorChecks = []string{"root", "config", "kernel: overlayfs", "kernel: ext4", "kernel: loop", "kernel: network namespaces",
	"kernel: veth", "cgroups", "loop devices", "command: mount", "command: mkfs.ext4", "command: e2fsck", "runsc binary", "runsc runs",
	"agent binary", "socket paths", "platform", "data dir", "image", "command: debootstrap", "disk: data dir",
	"disk: image cache", "process ids", "server"}

// TestDoctorThisMachine: doctor on this machine with the real binaries and
// the shared image cache finds nothing missing but, maybe, the image (built
// by `make image`, perhaps right now), and changes nothing.
func TestDoctorThisMachine(t *testing.T) {
	bin := doctorBinDir(t)
	c := baseConf(t, bin)
	c.CacheDir = "" // the default: /var/cache/sandboxd/images, shared
	c.MinFreeDiskMiB = 2048
	d := runDoctor(t, bin, "--config", c.write(t))
	t.Logf("doctor took %v:\n%s", d.elapsed, d.text)
	names := append(slices.Clone(doctorChecks), "listen "+c.Listen)
	for _, n := range names {
		f, ok := d.report.find(n)
		switch {
		case !ok:
			t.Errorf("no finding %q", n)
		case f.Seen == "":
			t.Errorf("%s: nothing seen", n)
		case n != "image" && f.Status != runsc.CheckOK:
			t.Errorf("%s: %s on this machine: %s (fix: %s)", n, f.Status, f.Seen, f.Fix)
		}
		if !strings.Contains(d.text, n) {
			t.Errorf("text output lacks %q", n)
		}
	}
	if len(d.report.Findings) != len(names) {
		t.Errorf("%d findings, want %d", len(d.report.Findings), len(names))
	}
	cfg, err := config.Load(config.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := cfg.ImageRecipe()
	img, _ := d.report.find("image")
	if _, built := image.Find(cfg.Image.CacheDir, r); built {
		if img.Status != runsc.CheckOK || d.code != 0 {
			t.Errorf("image built, doctor says %+v (exit %d)", img, d.code)
		}
	} else {
		t.Logf("the shared image is not built (yet): doctor must say so")
		if img.Status != runsc.CheckProblem || !strings.Contains(img.Fix, "sudo make image") || d.code != 1 ||
			!slices.Equal(d.report.problems(), []string{"image"}) {
			t.Errorf("image missing, doctor says %+v (exit %d, problems %v)", img, d.code, d.report.problems())
		}
		if !strings.Contains(d.text, "fix: sudo make image") {
			t.Errorf("text output lacks the image's fix:\n%s", d.text)
		}
	}
	// Under 2 s as a rule; a loaded machine gets some slack.
	if d.elapsed > 5*time.Second {
		t.Errorf("doctor took %v", d.elapsed)
	}
	if _, err := os.Stat(c.DataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("doctor made the data dir: %v", err)
	}
}

// hostDynamic returns a dynamically linked program of the host.
func hostDynamic(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/bin/ls", "/usr/bin/env", "/bin/sh"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
		f.Close()
		if dynamic {
			return p
		}
	}
	t.Skip("no dynamically linked program on this host")
	return ""
}

// TestDoctorPlanted: with nothing wrong doctor exits 0; with one problem
// planted it exits 1, names that problem alone and prints its fix.
func TestDoctorPlanted(t *testing.T) {
	bin := doctorBinDir(t)
	t.Run("nothing wrong", func(t *testing.T) {
		c := baseConf(t, bin)
		cache := c.CacheDir
		d := runDoctor(t, bin, "--config", c.write(t))
		if d.code != 0 || d.report.Problems != 0 {
			t.Fatalf("exit %d, problems %v:\n%s", d.code, d.report.problems(), d.text)
		}
		if !strings.HasSuffix(d.text, "no problems\n") {
			t.Errorf("no summary:\n%s", d.text)
		}
		if _, err := os.Stat(c.DataDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("doctor made the data dir: %v", err)
		}
		if ents, _ := os.ReadDir(cache); len(ents) != 1 {
			t.Errorf("doctor changed the image cache: %v", ents)
		}
	})
	dynamic := hostDynamic(t)
	cases := []struct {
		name      string
		plant     func(t *testing.T, c *doctorConf)
		finding   string // the one problem; "" means the listen address's
		seen, fix string
	}{
		{"runsc dynamically linked", func(t *testing.T, c *doctorConf) { c.Runsc = dynamic },
			"runsc binary", "dynamically linked", "sudo make build"},
		{"runsc missing", func(t *testing.T, c *doctorConf) { c.Runsc = filepath.Join(t.TempDir(), "runsc") },
			"runsc binary", "no such file or directory", "sudo make build"},
		{"agent dynamically linked", func(t *testing.T, c *doctorConf) { c.Agent = dynamic },
			"agent binary", "dynamically linked", "sudo make build"},
		{"image missing", func(t *testing.T, c *doctorConf) { c.CacheDir = t.TempDir() },
			"image", "is not built in", "sudo " + filepath.Join(bin, "sandboxd") + " image --config "},
		{"listen address held", func(t *testing.T, c *doctorConf) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			c.Listen = ln.Addr().String()
		}, "", fmt.Sprintf("in use by pid %d", os.Getpid()), fmt.Sprintf("stop pid %d", os.Getpid())},
		{"free disk below the minimum", func(t *testing.T, c *doctorConf) { c.MinFreeDiskMiB = 1 << 30 },
			"disk: data dir", "below limits.minFreeDiskMiB", "lower limits.minFreeDiskMiB"},
		{"data dir too long", func(t *testing.T, c *doctorConf) { c.DataDir = filepath.Join(c.DataDir, strings.Repeat("d", 80)) },
			"socket paths", "too long", "use a data dir of at most"},
		{"data dir not a directory", func(t *testing.T, c *doctorConf) {
			f := filepath.Join(filepath.Dir(c.DataDir), "file") // short: socket paths stay fine
			os.WriteFile(f, nil, 0o600)
			c.DataDir = f
		}, "data dir", "is not a directory", "point --data-dir"},
		{"kvm without /dev/kvm", func(t *testing.T, c *doctorConf) {
			if _, err := os.Stat("/dev/kvm"); err == nil {
				t.Skip("this host has /dev/kvm")
			}
			c.Platform = "kvm"
		}, "platform", "no /dev/kvm", "runsc.platform: systrap"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConf(t, bin)
			tc.plant(t, &c)
			name := tc.finding
			if name == "" {
				name = "listen " + c.Listen
			}
			d := runDoctor(t, bin, "--config", c.write(t))
			f, ok := d.report.find(name)
			if d.code != 1 || !ok || f.Status != runsc.CheckProblem || !strings.Contains(f.Seen, tc.seen) || !strings.Contains(f.Fix, tc.fix) {
				t.Fatalf("exit %d, %s: %+v; want a problem ~%q, fix ~%q\n%s", d.code, name, f, tc.seen, tc.fix, d.text)
			}
			if !slices.Equal(d.report.problems(), []string{name}) {
				t.Errorf("problems %v, want only %s", d.report.problems(), name)
			}
			// The text comes from a second run: free space may have moved.
			if !strings.Contains(d.text, "PROBLEM") || !strings.Contains(d.text, "fix: ") || !strings.Contains(d.text, tc.fix) {
				t.Errorf("text output lacks the problem or its fix %q:\n%s", tc.fix, d.text)
			}
		})
	}
	t.Run("config broken", func(t *testing.T) {
		c := baseConf(t, bin)
		c.Extra = "nosuchkey: 1\n"
		d := runDoctor(t, bin, "--config", c.write(t))
		f, _ := d.report.find("config")
		if d.code != 1 || f.Status != runsc.CheckProblem || !strings.Contains(f.Seen, "nosuchkey") || f.Fix == "" {
			t.Fatalf("exit %d, config: %+v", d.code, f)
		}
		// The host checks still run.
		for _, n := range []string{"root", "kernel: overlayfs", "cgroups", "loop devices", "command: mkfs.ext4"} {
			if _, ok := d.report.find(n); !ok {
				t.Errorf("no finding %q with a broken config", n)
			}
		}
	})
}

// TestDoctorServerRunning: a real `sandboxd serve` on the data dir (with a
// planted image: it starts no sandbox) holds the listen address, which is
// fine; an address held by another process is not.
func TestDoctorServerRunning(t *testing.T) {
	bin := doctorBinDir(t)
	c := baseConf(t, bin)
	cfgFile := c.write(t)
	logf, err := os.CreateTemp("", "sbxd-log-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(logf.Name())
	defer logf.Close()
	srv := exec.Command(filepath.Join(bin, "sandboxd"), "serve", "--config", cfgFile, "--no-image-build")
	srv.Env = append(os.Environ(), "SANDBOXD_CONFIG=", "SANDBOXD_DATA_DIR=", "SANDBOXD_LISTEN=")
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	t.Cleanup(func() {
		srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			srv.Process.Kill()
			<-done
		}
		if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), c.DataDir) {
			t.Errorf("mounts left under %s", c.DataDir)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + c.Listen + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-done:
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("server exited: %v\n%s", err, b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("server not healthy after 60 s\n%s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	pid := srv.Process.Pid

	d := runDoctor(t, bin, "--config", cfgFile)
	t.Logf("\n%s", d.text)
	s, _ := d.report.find("server")
	l, _ := d.report.find("listen " + c.Listen)
	if d.code != 0 || !strings.Contains(s.Seen, fmt.Sprintf("pid %d (sandboxd)", pid)) ||
		l.Status != runsc.CheckOK || !strings.Contains(l.Seen, fmt.Sprintf("held by the server running on this data dir (pid %d)", pid)) {
		t.Fatalf("exit %d, server %+v, listen %+v", d.code, s, l)
	}

	// Another address, held by this test: the server is not the holder.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	other := ln.Addr().String()
	d = runDoctor(t, bin, "--config", cfgFile, "--listen", other)
	l, _ = d.report.find("listen " + other)
	if d.code != 1 || l.Status != runsc.CheckProblem || !strings.Contains(l.Seen, fmt.Sprintf("pid %d", os.Getpid())) ||
		!strings.Contains(l.Seen, fmt.Sprintf("not by the server on this data dir (pid %d)", pid)) {
		t.Fatalf("exit %d, listen %+v", d.code, l)
	}
}
