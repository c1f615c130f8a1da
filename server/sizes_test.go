package server

import (
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/runsc"
	"sandboxd/server/config"
)

// sizes.configFile replaces the built-in table: provisioning uses its
// limits and egress quota, and only its names are accepted.
func TestSizesConfigFile(t *testing.T) {
	clearConfigEnv(t)
	sizes, _ := filepath.Abs("config/testdata/custom-sizes.yaml")
	conf := writeTempFile(t, "sandboxd.yaml", "sizes:\n  configFile: "+sizes+"\n")
	cfg, err := config.Load(config.Overrides{ConfigFile: conf, DataDir: t.TempDir()})
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
	e.rt.Mu.Lock()
	got := e.rt.Created[len(e.rt.Created)-1].Limits
	e.rt.Mu.Unlock()
	if want := (runsc.Limits{VCPUs: 4, MemoryMiB: 4096, DiskMiB: 20480, Pids: 2048, Processes: runsc.DefaultProcesses(2048)}); got != want {
		t.Errorf("runtime limits = %+v, want %+v", got, want)
	}
	// The built-in names are gone, and the error lists the file's.
	msg := apiError(t, e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "old", "size": "standard-1"}), http.StatusBadRequest, "invalid_size")
	if !strings.Contains(msg, "basic, big, standard") {
		t.Errorf("invalid size message = %q", msg)
	}
}
