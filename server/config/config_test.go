package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// clearConfigEnv makes the test independent of the caller's environment.
func clearConfigEnv(t *testing.T) {
	t.Helper()
	for _, k := range EnvVars {
		t.Setenv(k, "")
	}
}

func writeTempFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfigDefaults(t *testing.T) {
	clearConfigEnv(t)
	c, err := Load(Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:8080" {
		t.Errorf("listen = %q", c.Listen)
	}
	if c.DataDir != "/var/lib/sandboxd" {
		t.Errorf("dataDir = %q", c.DataDir)
	}
	if len(c.TrustedProxies) != 0 {
		t.Errorf("trustedProxies = %v, want none", c.TrustedProxies)
	}
	if c.Runsc.Platform != "systrap" || c.Runsc.Binary != "" || c.Runsc.Debug {
		t.Errorf("runsc = %+v", c.Runsc)
	}
	if !c.Image.AutoBuild || c.Image.Suite != "bookworm" || c.Image.CacheDir != "/var/cache/sandboxd/images" {
		t.Errorf("image = %+v", c.Image)
	}
	l := c.Limits
	if l.MaxBodyBytes != 1<<20 || l.ExecOutputBytes != 1<<20 || l.ExecDefaultTimeoutMs != 60000 ||
		l.ExecMaxTimeoutMs != 3600000 || l.MaxSandboxes != 1000 || l.MemoryOvercommit != 50 || l.PressureFreeMemoryMiB != 2048 ||
		l.MinFreeDiskMiB != 2048 || l.PressureFreeDiskMiB != 4096 {
		t.Errorf("limits = %+v", l)
	}
	if l.MaxConnsPerClient != 0 || l.RequestsPerSecond != 200 || l.RequestBurst != 1000 || l.MaxRequestsInFlight != 128 {
		t.Errorf("per-client limits = %+v", l)
	}
	if l.ScrubCPUCores != 0.25 || l.ScrubCPUBurstMs != 1000 {
		t.Errorf("scrub budget = %v cores, %d ms", l.ScrubCPUCores, l.ScrubCPUBurstMs)
	}
	if c.Sizes.Default != "standard-1" || len(c.Sizes.List) != 5 {
		t.Errorf("sizes = %+v", c.Sizes)
	}
	if c.Image.NPMRegistry != "https://registry.npmjs.org/" {
		t.Errorf("image.npmRegistry = %q", c.Image.NPMRegistry)
	}
	r, err := c.ImageRecipe()
	if err != nil {
		t.Fatalf("ImageRecipe: %v", err)
	}
	if r.NPMRegistry != c.Image.NPMRegistry || len(r.Build) == 0 || len(r.Setup) == 0 || len(r.Packages) == 0 {
		t.Errorf("recipe = %+v", r)
	}
	// Every launcher and the editor step are part of the recipe (and so of its key).
	for _, f := range []string{"editor.sh", "services/service-editor", "services/service-notebook",
		"services/service-display", "services/service-browser"} {
		if len(r.Files[f]) == 0 {
			t.Errorf("recipe file %s missing", f)
		}
	}
	for _, f := range []string{"build.sh", "setup.sh", "packages.txt"} {
		if _, ok := r.Files[f]; ok {
			t.Errorf("%s is both a main recipe part and a file", f)
		}
	}
}

func TestLoadConfigPrecedence(t *testing.T) {
	clearConfigEnv(t)
	fileDir := t.TempDir()
	file := writeTempFile(t, "c.yaml", fmt.Sprintf("listen: 127.0.0.1:1111\ndataDir: %s\nlimits:\n  maxSandboxes: 3\n", fileDir))

	// file > defaults (and keys the file does not set keep their defaults)
	c, err := Load(Overrides{ConfigFile: file})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:1111" || c.DataDir != fileDir || c.Limits.MaxSandboxes != 3 {
		t.Errorf("file: %s %s %d", c.Listen, c.DataDir, c.Limits.MaxSandboxes)
	}
	if c.Limits.MaxBodyBytes != 1<<20 || c.Runsc.Platform != "systrap" {
		t.Errorf("file replaced defaults it does not set: %+v", c.Limits)
	}

	// SANDBOXD_CONFIG names the file when no flag does.
	t.Setenv("SANDBOXD_CONFIG", file)
	if c, err = Load(Overrides{}); err != nil || c.Listen != "127.0.0.1:1111" {
		t.Fatalf("SANDBOXD_CONFIG: %v %v", c, err)
	}
	// ... and the flag beats it.
	other := writeTempFile(t, "o.yaml", "listen: 127.0.0.1:4444\n")
	if c, err = Load(Overrides{ConfigFile: other}); err != nil || c.Listen != "127.0.0.1:4444" {
		t.Fatalf("--config over SANDBOXD_CONFIG: %+v %v", c, err)
	}

	// env > file
	envDir := t.TempDir()
	t.Setenv("SANDBOXD_LISTEN", "127.0.0.1:2222")
	t.Setenv("SANDBOXD_DATA_DIR", envDir)
	if c, err = Load(Overrides{}); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:2222" || c.DataDir != envDir {
		t.Errorf("env: %s %s", c.Listen, c.DataDir)
	}

	// flags > env
	flagDir := t.TempDir()
	if c, err = Load(Overrides{Listen: "127.0.0.1:3333", DataDir: flagDir}); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:3333" || c.DataDir != flagDir {
		t.Errorf("flags: %s %s", c.Listen, c.DataDir)
	}

	// A relative data dir is made absolute.
	if c, err = Load(Overrides{DataDir: "rel/dir"}); err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(c.DataDir) || !strings.HasSuffix(c.DataDir, "rel/dir") {
		t.Errorf("relative dataDir -> %q", c.DataDir)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	clearConfigEnv(t)
	cases := map[string]struct {
		yaml, want string
	}{
		"unknown top key":    {"listn: 127.0.0.1:1\n", "listn"},
		"unknown nested key": {"limits:\n  maxBody: 5\n", "maxBody"},
		"bad listen":         {"listen: nowhere\n", "listen"},
		"relative cache":     {"image:\n  cacheDir: cache\n", "cacheDir"},
		"bad mirror":         {"image:\n  mirror: ftp://x\n", "mirror"},
		"bad npm registry":   {"image:\n  npmRegistry: registry.npmjs.org\n", "npmRegistry"},
		"bad proxy":          {"trustedProxies: [not-an-ip]\n", "trustedProxies"},
		"limits":             {"limits:\n  maxBodyBytes: 10\n", "limits"},
		"timeouts":           {"limits:\n  execDefaultTimeoutMs: 10\n  execMaxTimeoutMs: 5\n", "limits"},
		"api conns":          {"limits:\n  maxAPIConns: -1\n", "limits"},
		"api idle":           {"limits:\n  apiIdleSeconds: 0\n", "limits"},
		"conns per client":   {"limits:\n  maxConnsPerClient: -1\n", "limits.maxConnsPerClient"},
		"request rate":       {"limits:\n  requestsPerSecond: -1\n", "limits.requestsPerSecond"},
		"request burst":      {"limits:\n  requestsPerSecond: 5\n  requestBurst: 0\n", "limits.requestBurst"},
		"requests in flight": {"limits:\n  maxRequestsInFlight: -2\n", "limits.maxRequestsInFlight"},
		"rate not a number":  {"limits:\n  requestsPerSecond: .nan\n", "limits.requestsPerSecond"},
		"idle action":        {"limits:\n  idleAction: sleep\n", "idleAction"},
		"disk pressure":      {"limits:\n  pressureFreeDiskMiB: -1\n", "limits.pressureFreeDiskMiB"},
		"disk pressure low":  {"limits:\n  minFreeDiskMiB: 2048\n  pressureFreeDiskMiB: 2048\n", "more than limits.minFreeDiskMiB"},
		// Named in the file at the default's value: checked, not moved.
		"disk pressure named": {"limits:\n  minFreeDiskMiB: 4096\n  pressureFreeDiskMiB: 4096\n", "more than limits.minFreeDiskMiB"},
		"scrub cores":         {"limits:\n  scrubCpuCores: -0.5\n", "limits.scrubCpuCores"},
		"scrub cores tiny":    {"limits:\n  scrubCpuCores: 0.001\n", "limits.scrubCpuCores"},
		"scrub cores nan":     {"limits:\n  scrubCpuCores: .nan\n", "limits.scrubCpuCores"},
		"scrub cores many":    {"limits:\n  scrubCpuCores: 65\n", "limits.scrubCpuCores"},
		"scrub burst":         {"limits:\n  scrubCpuBurstMs: 0\n", "limits.scrubCpuBurstMs"},
		"scrub burst long":    {"limits:\n  scrubCpuBurstMs: 60001\n", "limits.scrubCpuBurstMs"},
		"min free disk":       {"limits:\n  minFreeDiskMiB: -1\n", "limits.minFreeDiskMiB: -1 is less than 0"},
		"max timeout":         {"limits:\n  execDefaultTimeoutMs: 5000\n  execMaxTimeoutMs: 1000\n", "limits.execMaxTimeoutMs: 1000 is less than 5000"},
		"body limit":          {"limits:\n  maxBodyBytes: 10\n", "limits.maxBodyBytes"},
		"bad yaml":            {"listen: [\n", "yaml"},
	}
	for name, c := range cases {
		_, err := Load(Overrides{ConfigFile: writeTempFile(t, "c.yaml", c.yaml)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: LoadConfig = %v, want error containing %q", name, err, c.want)
		}
	}
	if _, err := Load(Overrides{ConfigFile: filepath.Join(t.TempDir(), "missing.yaml")}); err == nil {
		t.Error("missing config file: no error")
	}
	// A config from before pressureFreeDiskMiB with minFreeDiskMiB raised
	// past its default still loads: the floor follows, twice the minimum.
	if c, err := Load(Overrides{ConfigFile: writeTempFile(t, "old.yaml", "limits:\n  minFreeDiskMiB: 8192\n")}); err != nil {
		t.Errorf("old config: %v", err)
	} else if c.Limits.PressureFreeDiskMiB != 16384 {
		t.Errorf("old config: pressureFreeDiskMiB %d, want 16384", c.Limits.PressureFreeDiskMiB)
	}
	// An empty file changes nothing.
	c, err := Load(Overrides{ConfigFile: writeTempFile(t, "empty.yaml", "")})
	if err != nil || c.Listen != "127.0.0.1:8080" {
		t.Errorf("empty file: %+v %v", c, err)
	}
	// A listen override that is not host:port is rejected even from a flag.
	if _, err := Load(Overrides{Listen: "8080"}); err == nil {
		t.Error("listen 8080: no error")
	}
}

func TestResourcePrefix(t *testing.T) {
	a, b := ResourcePrefix("/var/lib/a"), ResourcePrefix("/var/lib/b")
	if a == b || len(a) != 9 || !strings.HasPrefix(a, "sbx") || a != ResourcePrefix("/var/lib/a") {
		t.Errorf("ResourcePrefix: %q %q", a, b)
	}
}

// A data dir reached through a symlink (itself, or a parent) is used by
// its real path; what does not exist yet keeps its name below the link.
func TestDataDirSymlinksResolved(t *testing.T) {
	top := t.TempDir()
	real := filepath.Join(top, "real")
	os.MkdirAll(filepath.Join(real, "d"), 0o700)
	os.Symlink(real, filepath.Join(top, "link"))
	for given, want := range map[string]string{
		filepath.Join(top, "link", "d"):        filepath.Join(real, "d"),
		filepath.Join(top, "link", "new", "x"): filepath.Join(real, "new", "x"),
		filepath.Join(top, "link"):             real,
		filepath.Join(top, "plain"):            filepath.Join(top, "plain"),
	} {
		c, err := Load(Overrides{DataDir: given})
		if err != nil || c.DataDir != want {
			t.Errorf("dataDir %s: %v %v, want %s", given, c, err, want)
		}
	}
}
