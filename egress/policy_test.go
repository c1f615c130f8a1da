package egress

import (
	"reflect"
	"testing"
)

func mustPolicy(t *testing.T, rules ...Rule) *Policy {
	t.Helper()
	p, err := NewPolicy(&Config{Allowlist: rules})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecide(t *testing.T) {
	pol := mustPolicy(t,
		Rule{Host: "pypi.org"},
		Rule{Host: "*.example.com", Ports: []int{443}},
		Rule{Host: "*.deep.example.com", Ports: []int{8443}},
		Rule{Host: "bücher.test"},
		Rule{Host: "203.0.113.7", Ports: []int{443}},
		Rule{Host: "2001:db8::7", Ports: []int{443}},
	)
	cases := []struct {
		host   string
		port   int
		norm   string
		reason string
	}{
		{"pypi.org", 443, "pypi.org", ""},
		{"PyPI.org.", 80, "pypi.org", ""},
		{"pypi.org", 22, "pypi.org", ReasonPortNotAllowed},
		{"a.example.com", 443, "a.example.com", ""},
		{"a.b.example.com", 443, "a.b.example.com", ""},
		{"example.com", 443, "example.com", ReasonNotAllowlisted},
		{"a.example.com", 80, "a.example.com", ReasonPortNotAllowed},
		{"x.deep.example.com", 8443, "x.deep.example.com", ""},
		{"x.deep.example.com", 443, "x.deep.example.com", ""}, // via *.example.com
		{"evilexample.com", 443, "evilexample.com", ReasonNotAllowlisted},
		{"BÜCHER.test", 443, "xn--bcher-kva.test", ""},
		{"xn--bcher-kva.test", 443, "xn--bcher-kva.test", ""},
		{"203.0.113.7", 443, "203.0.113.7", ""},
		{"3405803783", 443, "203.0.113.7", ""},
		{"[2001:db8::7]", 443, "2001:db8::7", ""},
		{"[::ffff:203.0.113.7]", 443, "203.0.113.7", ""},
		{"127.0.0.1", 443, "127.0.0.1", ReasonIPLiteral},
		{"127.1", 443, "127.0.0.1", ReasonIPLiteral},
		{"0x7f000001", 443, "127.0.0.1", ReasonIPLiteral},
		{"2130706433", 443, "127.0.0.1", ReasonIPLiteral},
		{"[::1]", 443, "::1", ReasonIPLiteral},
		{"[pypi.org]", 443, "", ReasonInvalidHost},
		{"pypi.org", 0, "pypi.org", ReasonInvalidPort},
		{"pypi.org", 65536, "pypi.org", ReasonInvalidPort},
		{"", 443, "", ReasonInvalidHost},
	}
	for _, c := range cases {
		norm, ok, reason := pol.Decide(c.host, c.port)
		if norm != c.norm || reason != c.reason || ok != (c.reason == "") {
			t.Errorf("Decide(%q, %d) = %q, %v, %q; want %q, %q", c.host, c.port, norm, ok, reason, c.norm, c.reason)
		}
	}
}

func TestNarrow(t *testing.T) {
	op := mustPolicy(t,
		Rule{Host: "github.com"},
		Rule{Host: "codeload.github.com", Ports: []int{443}},
		Rule{Host: "*.githubusercontent.com"},
		Rule{Host: "*.quay.io", Ports: []int{443}},
		Rule{Host: "pypi.org"},
		Rule{Host: "203.0.113.7", Ports: []int{443}},
	)
	np, err := op.Narrow([]Rule{
		{Host: "GitHub.com", Ports: []int{443, 22}},  // 22 not allowed: dropped port
		{Host: "raw.githubusercontent.com"},          // under an operator wildcard
		{Host: "*.objects.githubusercontent.com"},    // narrower wildcard: kept
		{Host: "*.github.com"},                       // wider than exact rules: becomes them
		{Host: "evil.test"},                          // not allowed: dropped
		{Host: "*.io"},                               // wider than *.quay.io: becomes it
		{Host: "203.0.113.7", Ports: []int{443, 80}}, // IP: port 80 dropped
		{Host: "198.51.100.1"},                       // IP not allowed
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{Host: "github.com", Ports: []int{443}},
		{Host: "raw.githubusercontent.com", Ports: []int{80, 443}},
		{Host: "*.objects.githubusercontent.com", Ports: []int{80, 443}},
		{Host: "codeload.github.com", Ports: []int{443}},
		{Host: "*.quay.io", Ports: []int{443}},
		{Host: "203.0.113.7", Ports: []int{443}},
	}
	if got := np.Rules(); !reflect.DeepEqual(got, want) {
		t.Errorf("Narrow rules:\n got %+v\nwant %+v", got, want)
	}
	for _, c := range []struct {
		host string
		port int
		ok   bool
	}{
		{"github.com", 443, true}, {"github.com", 80, false}, {"github.com", 22, false},
		{"raw.githubusercontent.com", 443, true}, {"objects.githubusercontent.com", 443, false},
		{"a.objects.githubusercontent.com", 443, true}, {"codeload.github.com", 443, true},
		{"cdn01.quay.io", 443, true}, {"quay.io", 443, false}, {"evil.test", 443, false}, {"pypi.org", 443, false},
	} {
		if _, ok, _ := np.Decide(c.host, c.port); ok != c.ok {
			t.Errorf("narrowed Decide(%s, %d) = %v, want %v", c.host, c.port, ok, c.ok)
		}
	}
	// Every narrowed decision is also an operator decision.
	for _, r := range np.Rules() {
		h := r.Host
		if h[0] == '*' {
			h = "x" + h[1:]
		}
		for _, port := range r.Ports {
			if _, ok, _ := op.Decide(h, port); !ok {
				t.Errorf("Narrow widened: %s:%d", h, port)
			}
		}
	}

	none, err := op.Narrow([]Rule{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := none.Decide("github.com", 443); ok {
		t.Error("an empty project allowlist must allow nothing")
	}
	if _, err := op.Narrow([]Rule{{Host: "a b"}}); err == nil {
		t.Error("invalid project rule accepted")
	}
}

func TestProjectPolicies(t *testing.T) {
	c := &Config{
		Allowlist: []Rule{{Host: "pypi.org"}, {Host: "*.npmjs.org", Ports: []int{443}}},
		Optional:  []Rule{{Host: "api.example.com", Ports: []int{443}}},
		Projects: map[string][]Rule{
			"narrow": {{Host: "pypi.org", Ports: []int{443}}},
			"extend": {{Host: "pypi.org"}, {Host: "api.example.com"}, {Host: "evil.example"}},
			"none":   {},
		},
	}
	p, err := NewPolicy(c)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		project, host string
		port          int
		want          bool
	}{
		{"other", "pypi.org", 80, true},
		{"other", "registry.npmjs.org", 443, true},
		{"other", "api.example.com", 443, false}, // optional: only for projects asking
		{"narrow", "pypi.org", 443, true},
		{"narrow", "pypi.org", 80, false},
		{"narrow", "registry.npmjs.org", 443, false},
		{"extend", "api.example.com", 443, true},
		{"extend", "api.example.com", 80, false}, // the operator allows 443 only
		{"extend", "evil.example", 443, false},   // beyond allowlist+optional
		{"extend", "pypi.org", 443, true},
		{"none", "pypi.org", 443, false},
	}
	for _, tc := range cases {
		if _, ok, _ := p.ForProject(tc.project).Decide(tc.host, tc.port); ok != tc.want {
			t.Errorf("project %s: %s:%d allowed=%v, want %v", tc.project, tc.host, tc.port, ok, tc.want)
		}
	}
	if _, err := NewPolicy(&Config{Projects: map[string][]Rule{"p": {{Host: "bad host"}}}}); err == nil {
		t.Error("an invalid project rule was accepted")
	}
}
