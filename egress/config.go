package egress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Rule allows one host on some ports. Host is an exact name ("pypi.org"), an
// IP literal ("203.0.113.7", "2001:db8::7"), or "*.suffix", which matches
// every name under suffix at any depth but not suffix itself. Ports empty
// means 443 and 80.
type Rule struct {
	Host  string `yaml:"host"`
	Ports []int  `yaml:"ports,omitempty"`
}

// defaultPorts are the ports of a Rule that lists none.
var defaultPorts = []int{443, 80}

// Config is the egress section of the configuration (configs/egress.yaml).
// Durations are YAML strings in Go syntax ("10s", "5m"); zero means the
// default.
type Config struct {
	// Allowlist is every destination a sandbox may reach; empty means none.
	Allowlist []Rule `yaml:"allowlist"`
	// Optional are destinations the operator allows only for projects that
	// ask for them in Projects; no session reaches them otherwise.
	Optional []Rule `yaml:"optional"`
	// Projects gives a project (by id) its own allowlist in place of
	// Allowlist: it may narrow Allowlist or extend it within Optional,
	// never beyond the two (the intersection with their union is kept).
	Projects map[string][]Rule `yaml:"projects"`
	// AllowNetworks are CIDRs the dialer may reach although they are
	// loopback, private, link-local or otherwise reserved. Empty in
	// production; tests use 127.0.0.0/8 for upstreams on loopback.
	AllowNetworks []string `yaml:"allowNetworks"`
	// DialTimeout bounds name resolution plus TCP connect (default 10s).
	DialTimeout time.Duration `yaml:"dialTimeout"`
	// IdleTimeout closes a tunnel or a keep-alive client connection with no
	// bytes either way for this long (default 5m).
	IdleTimeout time.Duration `yaml:"idleTimeout"`
	// HeaderTimeout bounds how long a client takes to send a request's
	// headers, or the first message (TLS ClientHello, HTTP request) in a
	// tunnel to port 443 or 80 (default 10s).
	HeaderTimeout time.Duration `yaml:"headerTimeout"`
}

const (
	defaultDialTimeout   = 10 * time.Second
	defaultIdleTimeout   = 5 * time.Minute
	defaultHeaderTimeout = 10 * time.Second
)

// LoadConfig decodes one YAML document strictly (unknown keys are errors),
// fills zero durations with defaults and validates it. Errors name the
// offending rule or field.
func LoadConfig(data []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("egress config: empty document")
		}
		return nil, fmt.Errorf("egress config: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("egress config: more than one YAML document")
	}
	c.applyDefaults()
	if _, err := compile(&c); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) applyDefaults() {
	if c.DialTimeout == 0 {
		c.DialTimeout = defaultDialTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = defaultIdleTimeout
	}
	if c.HeaderTimeout == 0 {
		c.HeaderTimeout = defaultHeaderTimeout
	}
}

// normRule is a validated rule: host normalized (wildcards keep "*."),
// ports deduplicated.
type normRule struct {
	host     string // exact host, or the suffix of a wildcard
	wildcard bool
	ip       bool
	ports    portSet
}

type portSet map[int]struct{}

func (s portSet) sorted() []int {
	out := make([]int, 0, len(s))
	for p := range s {
		out = append(out, p)
	}
	for i := 1; i < len(out); i++ { // tiny sets: insertion sort
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// normalizeRule validates one rule. The error says what is wrong; the
// caller adds which rule.
func normalizeRule(r Rule) (normRule, error) {
	var nr normRule
	h := strings.TrimSpace(r.Host)
	if h != r.Host || h == "" {
		return nr, errors.New("host is empty or has surrounding spaces")
	}
	if strings.HasPrefix(h, "*.") {
		nr.wildcard = true
		h = h[2:]
	}
	if strings.Contains(h, "*") {
		return nr, errors.New(`a wildcard must be the whole first label ("*.example.com")`)
	}
	norm, ip, err := normalizeHost(h)
	if err != nil {
		return nr, fmt.Errorf("host %q is not a valid name or IP address", r.Host)
	}
	if nr.wildcard && ip.IsValid() {
		return nr, fmt.Errorf("wildcard %q names an IP address", r.Host)
	}
	nr.host, nr.ip = norm, ip.IsValid()
	ports := r.Ports
	if len(ports) == 0 {
		ports = defaultPorts
	}
	nr.ports = make(portSet, len(ports))
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return nr, fmt.Errorf("port %d is outside 1-65535", p)
		}
		nr.ports[p] = struct{}{}
	}
	return nr, nil
}

func (r normRule) rule() Rule {
	h := r.host
	if r.wildcard {
		h = "*." + h
	}
	return Rule{Host: h, Ports: r.ports.sorted()}
}

func parseNetworks(nets []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(nets))
	for i, s := range nets {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("egress config: allowNetworks[%d] %q is not a CIDR", i, s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
