package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sandboxd/configs"
)

func embeddedSizes(t *testing.T) Sizes {
	t.Helper()
	b, err := configs.FS.ReadFile("sizes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseSizes(b)
	if err != nil {
		t.Fatalf("ParseSizes(configs/sizes.yaml): %v", err)
	}
	return s
}

func TestSizesEmbedded(t *testing.T) {
	s := embeddedSizes(t)
	if s.Default != "standard-1" {
		t.Errorf("default = %q, want standard-1", s.Default)
	}
	cases := []struct {
		req, want string
	}{
		{"", "standard-1"},
		{"standard-1", "standard-1"},
		{"small", "standard-2"},
		{"standard", "standard-3"},
		{"large", "standard-4"},
		{"standard-5", "standard-5"},
	}
	for _, c := range cases {
		z, ok := s.Resolve(c.req)
		if !ok || z.Name != c.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q, true", c.req, z.Name, ok, c.want)
		}
	}
	for _, bad := range []string{"huge", "Standard-1", "standard-6", " small", "legacy"} {
		if z, ok := s.Resolve(bad); ok {
			t.Errorf("Resolve(%q) = %+v, true; want not ok", bad, z)
		}
	}
	z, _ := s.Resolve("small")
	if z.VCPUs != 2 || z.MemoryMiB != 2048 || z.DiskMiB != 16384 || z.Pids != 1024 || z.CreditsPerHour != 2000 {
		t.Errorf("standard-2 = %+v", z)
	}
	names := s.Names()
	wantNames := []string{"standard-1", "standard-2", "standard-3", "standard-4", "standard-5", "large", "small", "standard"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Errorf("Names() = %v, want %v", names, wantNames)
	}
}

func TestParseSizesErrors(t *testing.T) {
	const base = `default: a
sizes:
  - {name: a, vcpus: 1, memoryMiB: 512, diskMiB: 512, pids: 128, creditsPerHour: 1}
`
	if _, err := ParseSizes([]byte(base)); err != nil {
		t.Fatalf("base table: %v", err)
	}
	cases := map[string]struct {
		yaml, want string
	}{
		"duplicate name": {base + `  - {name: a, vcpus: 2, memoryMiB: 512, diskMiB: 512, pids: 128}` + "\n", "repeated"},
		"empty name":     {base + `  - {vcpus: 2, memoryMiB: 512, diskMiB: 512, pids: 128}` + "\n", "repeated"},
		"legacy unknown": {base + "legacy:\n  old: nope\n", "unknown size"},
		"legacy shadows": {base + "legacy:\n  a: a\n", "shadows"},
		"unknown key":    {base + "extra: 1\n", "extra"},
		"unknown size key": {`default: a
sizes:
  - {name: a, vcpus: 1, memoryMiB: 512, diskMiB: 512, pids: 128, gpus: 1}
`, "gpus"},
		"default undefined": {strings.Replace(base, "default: a", "default: b", 1), "default size"},
		"zero vcpus":        {strings.Replace(base, "vcpus: 1", "vcpus: 0", 1), "out of range"},
		"low memory":        {strings.Replace(base, "memoryMiB: 512", "memoryMiB: 255", 1), "out of range"},
		"low pids":          {strings.Replace(base, "pids: 128", "pids: 127", 1), "out of range"},
		"negative credits":  {strings.Replace(base, "creditsPerHour: 1", "creditsPerHour: -1", 1), "out of range"},
		"bad type":          {strings.Replace(base, "vcpus: 1", "vcpus: many", 1), "many"},
	}
	for name, c := range cases {
		_, err := ParseSizes([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: ParseSizes = %v, want error containing %q", name, err, c.want)
		}
	}
}

// A bad sizes file stops the start with an error that names the file and
// the problem.
func TestSizesConfigFileErrors(t *testing.T) {
	clearConfigEnv(t)
	customSizes := readTestdata(t, "custom-sizes.yaml")
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
		"nan credits":       {strings.Replace(customSizes, "creditsPerHour: 0.5", "creditsPerHour: .nan", 1), `want a number of credits`},
		"4 decimals":        {strings.Replace(customSizes, "creditsPerHour: 0.5", "creditsPerHour: 0.0001", 1), `at most 3 decimals`},
		"repeated name":     {strings.Replace(customSizes, "name: big", "name: basic", 1), "repeated name"},
		"empty file":        {"", "no sizes defined"},
		"not yaml":          {"sizes: [\n", "yaml"},
	}
	for name, c := range cases {
		sizes := writeTempFile(t, "sizes.yaml", c.sizes)
		conf := writeTempFile(t, "sandboxd.yaml", "sizes:\n  configFile: "+sizes+"\n")
		_, err := Load(Overrides{ConfigFile: conf})
		if err == nil || !strings.Contains(err.Error(), "sizes config "+sizes+": ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: LoadConfig = %v, want an error naming %s and containing %q", name, err, sizes, c.want)
		}
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	conf := writeTempFile(t, "sandboxd.yaml", fmt.Sprintf("sizes:\n  configFile: %s\n", missing))
	if _, err := Load(Overrides{ConfigFile: conf}); err == nil || !strings.Contains(err.Error(), "sizes config") || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: LoadConfig = %v", err)
	}
	// The key itself is checked like every other.
	conf = writeTempFile(t, "sandboxd.yaml", "sizes:\n  file: x.yaml\n")
	if _, err := Load(Overrides{ConfigFile: conf}); err == nil || !strings.Contains(err.Error(), "field file not found") {
		t.Errorf("unknown sizes key: LoadConfig = %v", err)
	}
}

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
