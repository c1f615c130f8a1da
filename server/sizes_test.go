package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/runsc"
)

const customSizes = `# An operator's table: smaller default, a new size, its own legacy name.
default: basic
sizes:
  - name: basic
    vcpus: 1
    memoryMiB: 768
    diskMiB: 4096
    pids: 256
    creditsPerHour: 0.5
    egressMiB: 64
  - name: big
    vcpus: 4
    memoryMiB: 4096
    diskMiB: 20480
    pids: 2048
    creditsPerHour: 3
    egressMiB: 0
legacy:
  standard: basic
`

// sizes.configFile replaces the built-in table: provisioning uses its
// limits and egress quota, and only its names are accepted.
func TestSizesConfigFile(t *testing.T) {
	clearConfigEnv(t)
	sizes := writeTempFile(t, "sizes.yaml", customSizes)
	conf := writeTempFile(t, "sandboxd.yaml", "sizes:\n  configFile: "+sizes+"\n")
	cfg, err := LoadConfig(Overrides{ConfigFile: conf, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Sizes.Default != "basic" || len(cfg.Sizes.List) != 2 || cfg.SizesOptions.ConfigFile != sizes {
		t.Fatalf("sizes = %+v", cfg.Sizes)
	}
	e := newAPIEnvWith(t, cfg, slog.New(slog.DiscardHandler))

	o := e.provision(e.token, map[string]any{"sessionId": "dflt"})
	if o.Size != "basic" || o.Resources != (resources{VCPUs: 1, MemoryMiB: 768, DiskMiB: 4096}) || o.Egress.BytesLimit != 64<<20 {
		t.Fatalf("default size: %+v", o)
	}
	o = e.provision(e.token, map[string]any{"sessionId": "legacy", "size": "standard"})
	if o.Size != "basic" || o.RequestedSize != "standard" || o.Egress.BytesLimit != 64<<20 {
		t.Fatalf("legacy name: %+v", o)
	}
	o = e.provision(e.token, map[string]any{"sessionId": "big", "size": "big"})
	if o.Resources != (resources{VCPUs: 4, MemoryMiB: 4096, DiskMiB: 20480}) || o.Egress.BytesLimit != 0 {
		t.Fatalf("big: %+v", o)
	}
	e.rt.mu.Lock()
	got := e.rt.created[len(e.rt.created)-1].Limits
	e.rt.mu.Unlock()
	if want := (runsc.Limits{VCPUs: 4, MemoryMiB: 4096, DiskMiB: 20480, Pids: 2048, Processes: runsc.DefaultProcesses(2048)}); got != want {
		t.Errorf("runtime limits = %+v, want %+v", got, want)
	}
	// The built-in names are gone, and the error lists the file's.
	msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "old", "size": "standard-1"}), http.StatusBadRequest, "invalid_size")
	if !strings.Contains(msg, "basic, big, standard") {
		t.Errorf("invalid size message = %q", msg)
	}
}

// A bad sizes file stops the start with an error that names the file and
// the problem.
func TestSizesConfigFileErrors(t *testing.T) {
	clearConfigEnv(t)
	cases := map[string]struct {
		sizes, want string
	}{
		"unknown key":       {customSizes + "extra: 1\n", "field extra not found"},
		"unknown size key":  {strings.Replace(customSizes, "egressMiB: 64", "egressMiB: 64\n    gpus: 1", 1), "field gpus not found"},
		"default undefined": {strings.Replace(customSizes, "default: basic", "default: huge", 1), `default size "huge" is not defined`},
		"no default":        {strings.Replace(customSizes, "default: basic\n", "", 1), "default: required"},
		"legacy unknown":    {customSizes + "  small: medium\n", `legacy size "small" maps to unknown size "medium"`},
		"legacy shadows":    {customSizes + "  big: basic\n", `legacy size "big" shadows`},
		"negative egress":   {strings.Replace(customSizes, "egressMiB: 64", "egressMiB: -1", 1), `size "basic": limits out of range`},
		"huge egress":       {strings.Replace(customSizes, "egressMiB: 64", "egressMiB: 9223372036854775807", 1), `size "basic": limits out of range`},
		"nan credits":       {strings.Replace(customSizes, "creditsPerHour: 0.5", "creditsPerHour: .nan", 1), `size "basic": limits out of range`},
		"repeated name":     {strings.Replace(customSizes, "name: big", "name: basic", 1), "repeated name"},
		"empty file":        {"", "no sizes defined"},
		"not yaml":          {"sizes: [\n", "yaml"},
	}
	for name, c := range cases {
		sizes := writeTempFile(t, "sizes.yaml", c.sizes)
		conf := writeTempFile(t, "sandboxd.yaml", "sizes:\n  configFile: "+sizes+"\n")
		_, err := LoadConfig(Overrides{ConfigFile: conf})
		if err == nil || !strings.Contains(err.Error(), "sizes config "+sizes+": ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: LoadConfig = %v, want an error naming %s and containing %q", name, err, sizes, c.want)
		}
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	conf := writeTempFile(t, "sandboxd.yaml", fmt.Sprintf("sizes:\n  configFile: %s\n", missing))
	if _, err := LoadConfig(Overrides{ConfigFile: conf}); err == nil || !strings.Contains(err.Error(), "sizes config") || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: LoadConfig = %v", err)
	}
	// The key itself is checked like every other.
	conf = writeTempFile(t, "sandboxd.yaml", "sizes:\n  file: x.yaml\n")
	if _, err := LoadConfig(Overrides{ConfigFile: conf}); err == nil || !strings.Contains(err.Error(), "field file not found") {
		t.Errorf("unknown sizes key: LoadConfig = %v", err)
	}
}
