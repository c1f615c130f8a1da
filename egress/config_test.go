package egress

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The built-in allowlist (configs/egress.yaml, which server/config hands
// to LoadConfig).
func TestDefaultConfig(t *testing.T) {
	b, err := os.ReadFile("../configs/egress.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if c.DialTimeout != 10*time.Second || c.IdleTimeout != 5*time.Minute || c.HeaderTimeout != 10*time.Second {
		t.Errorf("timeouts: %v %v %v", c.DialTimeout, c.IdleTimeout, c.HeaderTimeout)
	}
	if len(c.AllowNetworks) != 0 {
		t.Errorf("default allowNetworks must be empty, got %v", c.AllowNetworks)
	}
	pol, err := NewPolicy(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{
		"github.com", "codeload.github.com", "objects.githubusercontent.com", "raw.githubusercontent.com",
		"pkg-containers.githubusercontent.com", "registry.npmjs.org", "registry.yarnpkg.com", "pypi.org",
		"files.pythonhosted.org", "proxy.golang.org", "sum.golang.org", "registry-1.docker.io", "auth.docker.io",
		"production.cloudflare.docker.com", "ghcr.io", "quay.io", "cdn01.quay.io", "gcr.io", "registry.k8s.io",
		"us-docker.pkg.dev", "deb.debian.org", "security.debian.org", "archive.ubuntu.com",
		"security.ubuntu.com", "dl-cdn.alpinelinux.org",
	} {
		for _, port := range []int{443, 80} {
			if _, ok, reason := pol.Decide(h, port); !ok {
				t.Errorf("default policy refuses %s:%d (%s)", h, port, reason)
			}
		}
	}
	for _, h := range []string{"example.com", "githubusercontent.com", "evil-github.com", "github.com.evil.test", "169.254.169.254", "pkg.dev"} {
		if _, ok, _ := pol.Decide(h, 443); ok {
			t.Errorf("default policy allows %s", h)
		}
	}
	if _, ok, _ := pol.Decide("github.com", 22); ok {
		t.Error("default policy allows github.com:22")
	}
}

func TestLoadConfig(t *testing.T) {
	c, err := LoadConfig([]byte(`
allowlist:
  - host: Example.COM.
    ports: [8443, 443, 8443]
  - host: "*.Example.org"
allowNetworks: ["127.0.0.1/8"]
dialTimeout: 3s
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.DialTimeout != 3*time.Second || c.IdleTimeout != defaultIdleTimeout || c.HeaderTimeout != defaultHeaderTimeout {
		t.Errorf("durations: %+v", c)
	}
	pol, _ := NewPolicy(c)
	want := []Rule{{Host: "example.com", Ports: []int{443, 8443}}, {Host: "*.example.org", Ports: []int{80, 443}}}
	if got := pol.Rules(); !reflect.DeepEqual(got, want) {
		t.Errorf("Rules() = %+v, want %+v", got, want)
	}

	empty, err := LoadConfig([]byte("allowlist: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	pol, _ = NewPolicy(empty)
	if _, ok, _ := pol.Decide("github.com", 443); ok {
		t.Error("allowlist: [] must allow nothing")
	}

	bad := map[string]string{
		"unknown key":        "allowlist: []\nallowlst: []\n",
		"unknown rule key":   "allowlist:\n  - host: a.test\n    port: 443\n",
		"empty":              "",
		"two documents":      "allowlist: []\n---\nallowlist: []\n",
		"bad host":           "allowlist:\n  - host: a_b.test\n",
		"empty host":         "allowlist:\n  - host: ''\n",
		"inner wildcard":     "allowlist:\n  - host: a.*.test\n",
		"bare wildcard":      "allowlist:\n  - host: '*'\n",
		"wildcard ip":        "allowlist:\n  - host: '*.127.0.0.1'\n",
		"port zero":          "allowlist:\n  - host: a.test\n    ports: [0]\n",
		"port too big":       "allowlist:\n  - host: a.test\n    ports: [65536]\n",
		"port string":        "allowlist:\n  - host: a.test\n    ports: [https]\n",
		"bad cidr":           "allowNetworks: [127.0.0.1]\n",
		"duration int":       "dialTimeout: 10\n",
		"negative duration":  "idleTimeout: -1s\n",
		"not a mapping":      "- a\n",
		"host with spaces":   "allowlist:\n  - host: ' a.test'\n",
		"bracketed non-ipv6": "allowlist:\n  - host: '[a.test]'\n",
	}
	for name, y := range bad {
		if _, err := LoadConfig([]byte(y)); err == nil {
			t.Errorf("%s: LoadConfig accepted %q", name, y)
		} else if !strings.HasPrefix(err.Error(), "egress config") {
			t.Errorf("%s: error %q lacks context", name, err)
		}
	}
	if _, err := LoadConfig([]byte("allowlist:\n  - host: a.test\n  - host: b_c.test\n")); err == nil || !strings.Contains(err.Error(), "allowlist[1]") {
		t.Errorf("error should name the rule: %v", err)
	}
	if _, err := NewPolicy(nil); err == nil {
		t.Error("NewPolicy(nil) accepted")
	}
}

func TestConnLimits(t *testing.T) {
	per, total, fits := ConnLimits(64)
	if !fits || per*64 > total || per > 256 || per < 16 {
		t.Errorf("ConnLimits(64) = %d, %d, %v", per, total, fits)
	}
	if per, total, _ := ConnLimits(1); per != max(16, min(256, total)) {
		t.Errorf("ConnLimits(1) = %d of %d", per, total)
	}
	if per, _, fits := ConnLimits(1 << 30); per != 16 || fits {
		t.Errorf("ConnLimits(huge) = %d, %v", per, fits)
	}
}
