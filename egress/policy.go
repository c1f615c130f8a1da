package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Reasons a destination is refused: the reason argument of Events.Denied,
// the "reason" label of the denial counter and part of the 403 text.
const (
	ReasonInvalidHost      = "invalid_host"            // not a valid name or IP literal
	ReasonInvalidPort      = "invalid_port"            // port missing, 0, >65535 or not numeric
	ReasonNotAllowlisted   = "not_allowlisted"         // host matches no rule
	ReasonPortNotAllowed   = "port_not_allowed"        // host matches, port does not
	ReasonIPLiteral        = "ip_literal"              // an IP literal that no rule names
	ReasonForbiddenAddress = "forbidden_address"       // resolves to a loopback/private/metadata/... address
	ReasonSNIMismatch      = "sni_mismatch"            // TLS SNI differs from the CONNECT host
	ReasonSNIMissing       = "sni_missing"             // TLS without SNI to a named host
	ReasonNotTLS           = "not_tls"                 // non-TLS bytes in a tunnel to port 443
	ReasonHTTPInTunnel     = "http_in_tls_tunnel"      // an HTTP request in a tunnel to port 443
	ReasonNotHTTP          = "not_http"                // non-HTTP bytes in a tunnel to port 80
	ReasonHostMismatch     = "host_mismatch"           // HTTP Host in a tunnel differs from the CONNECT host
	ReasonAbsoluteForm     = "absolute_form_in_tunnel" // a proxy request (http://...) inside a tunnel
	ReasonHTTPFraming      = "ambiguous_http_framing"  // a request in a tunnel whose body length or folded header lines servers could read differently
	ReasonBadHello         = "bad_client_hello"        // malformed, oversized or too slow first message
	ReasonScheme           = "unsupported_scheme"      // plain request for other than http:// (use CONNECT)
	ReasonNotProxyRequest  = "not_proxy_request"       // origin-form request to the proxy itself
	ReasonQuota            = "quota_exceeded"          // the session's byte quota is used up
	ReasonTooManyConns     = "too_many_connections"    // the session (or the proxy) has its maximum open
)

// Policy decides which destinations are allowed. It is immutable and safe
// for concurrent use.
type Policy struct {
	exact    map[string]portSet // normalized host or IP -> ports
	wild     map[string]portSet // suffix of "*.suffix" -> ports
	rules    []normRule
	allowNet []netip.Prefix
	cfg      Config // timeouts; Allowlist/AllowNetworks as given
	projects map[string]*Policy
}

// ForProject is the policy of a session of project id: the project's own
// allowlist from Config.Projects if it has one, else p itself.
func (p *Policy) ForProject(id string) *Policy {
	if pp, ok := p.projects[id]; ok {
		return pp
	}
	return p
}

// NewPolicy validates c (as LoadConfig does; zero durations take defaults)
// and builds a policy from it.
func NewPolicy(c *Config) (*Policy, error) {
	if c == nil {
		return nil, errors.New("egress config: nil")
	}
	cc := *c
	cc.applyDefaults()
	return compile(&cc)
}

func compile(c *Config) (*Policy, error) {
	if c.DialTimeout < 0 || c.IdleTimeout < 0 || c.HeaderTimeout < 0 {
		return nil, errors.New("egress config: timeouts must not be negative")
	}
	p := &Policy{exact: map[string]portSet{}, wild: map[string]portSet{}, cfg: *c}
	for i, r := range c.Allowlist {
		nr, err := normalizeRule(r)
		if err != nil {
			return nil, fmt.Errorf("egress config: allowlist[%d]: %w", i, err)
		}
		p.add(nr)
	}
	nets, err := parseNetworks(c.AllowNetworks)
	if err != nil {
		return nil, err
	}
	p.allowNet = nets
	if len(c.Optional) > 0 || len(c.Projects) > 0 {
		// What a project may ask for: Allowlist plus Optional.
		ceil := *c
		ceil.Allowlist = append(append([]Rule(nil), c.Allowlist...), c.Optional...)
		ceil.Optional, ceil.Projects = nil, nil
		cp, err := compile(&ceil)
		if err != nil {
			return nil, fmt.Errorf("egress config: optional: %w", err)
		}
		p.projects = map[string]*Policy{}
		for id, rules := range c.Projects {
			if id == "" {
				return nil, errors.New("egress config: projects: empty project id")
			}
			np, err := cp.Narrow(rules)
			if err != nil {
				return nil, fmt.Errorf("egress config: projects[%s]: %w", id, err)
			}
			np.cfg.Optional, np.cfg.Projects = nil, nil
			p.projects[id] = np
		}
	}
	return p, nil
}

// add merges a rule (same host twice: union of ports).
func (p *Policy) add(nr normRule) {
	m := p.exact
	if nr.wildcard {
		m = p.wild
	}
	if ps, ok := m[nr.host]; ok {
		for port := range nr.ports {
			ps[port] = struct{}{}
		}
		return
	}
	ps := make(portSet, len(nr.ports))
	for port := range nr.ports {
		ps[port] = struct{}{}
	}
	m[nr.host] = ps
	nr.ports = ps
	p.rules = append(p.rules, nr)
}

// Rules returns the effective allowlist, normalized (lowercase ASCII hosts,
// sorted ports, duplicates merged).
func (p *Policy) Rules() []Rule {
	out := make([]Rule, 0, len(p.rules))
	for _, r := range p.rules {
		out = append(out, r.rule())
	}
	return out
}

// Decide normalizes host (see the package doc) and reports whether it may
// be reached on port. normHost is the normalized host ("" when host is
// invalid); reason is one of the Reason constants when ok is false.
func (p *Policy) Decide(host string, port int) (normHost string, ok bool, reason string) {
	h, _, reason := p.decide(host, port)
	return h, reason == "", reason
}

func (p *Policy) decide(host string, port int) (string, netip.Addr, string) {
	h, ip, err := normalizeHost(host)
	if err != nil {
		return "", netip.Addr{}, ReasonInvalidHost
	}
	if port < 1 || port > 65535 {
		return h, ip, ReasonInvalidPort
	}
	ports, matched := p.exact[h]
	if !matched && !ip.IsValid() {
		ports, matched = p.wildcardPorts(h)
	}
	switch {
	case matched && hasPort(ports, port):
		return h, ip, ""
	case matched:
		return h, ip, ReasonPortNotAllowed
	case ip.IsValid():
		return h, ip, ReasonIPLiteral
	default:
		return h, ip, ReasonNotAllowlisted
	}
}

// wildcardPorts unions the ports of every "*.suffix" rule matching h.
func (p *Policy) wildcardPorts(h string) (portSet, bool) {
	var out portSet
	for i := strings.IndexByte(h, '.'); i >= 0; {
		if ps, ok := p.wild[h[i+1:]]; ok {
			if out == nil {
				out = portSet{}
			}
			for port := range ps {
				out[port] = struct{}{}
			}
		}
		j := strings.IndexByte(h[i+1:], '.')
		if j < 0 {
			break
		}
		i += j + 1
	}
	return out, out != nil
}

func hasPort(ps portSet, port int) bool {
	_, ok := ps[port]
	return ok
}

// Narrow returns the policy for a project's own allowlist: the intersection
// of project with p. A project rule keeps only the hosts and ports p also
// allows: an exact host stays if p allows it; "*.s" keeps itself where a
// rule "*.t" of p covers it (s = t or s ends in ".t"), and p's own exact
// hosts and narrower wildcards under s. Rules p does not allow at all are
// dropped; an empty project list allows nothing. Allowed networks and
// timeouts stay p's. The error names an invalid project rule.
func (p *Policy) Narrow(project []Rule) (*Policy, error) {
	np := &Policy{exact: map[string]portSet{}, wild: map[string]portSet{}, allowNet: p.allowNet, cfg: p.cfg}
	np.cfg.Allowlist = nil
	for i, r := range project {
		pr, err := normalizeRule(r)
		if err != nil {
			return nil, fmt.Errorf("project allowlist[%d]: %w", i, err)
		}
		if !pr.wildcard {
			ports := p.exact[pr.host]
			if !pr.ip {
				if wp, ok := p.wildcardPorts(pr.host); ok {
					ports = union(ports, wp)
				}
			}
			np.addIntersect(pr, ports)
			continue
		}
		// The project wildcard itself, where an operator wildcard covers it.
		if wp, ok := p.wildcardPorts("x." + pr.host); ok {
			np.addIntersect(pr, wp)
		}
		// Operator rules inside the project wildcard.
		for _, or := range p.rules {
			if or.ip || !strings.HasSuffix(or.host, "."+pr.host) && !(or.wildcard && or.host == pr.host) {
				continue
			}
			np.addIntersect(normRule{host: or.host, wildcard: or.wildcard, ports: pr.ports}, or.ports)
		}
	}
	np.cfg.Allowlist = np.Rules()
	return np, nil
}

// addIntersect adds r with only the ports also in allowed (nothing if none).
func (p *Policy) addIntersect(r normRule, allowed portSet) {
	ps := portSet{}
	for port := range r.ports {
		if hasPort(allowed, port) {
			ps[port] = struct{}{}
		}
	}
	if len(ps) == 0 {
		return
	}
	r.ports = ps
	p.add(r)
}

func union(a, b portSet) portSet {
	out := make(portSet, len(a)+len(b))
	for k := range a {
		out[k] = struct{}{}
	}
	for k := range b {
		out[k] = struct{}{}
	}
	return out
}

func (p *Policy) dialTimeout() time.Duration   { return p.cfg.DialTimeout }
func (p *Policy) idleTimeout() time.Duration   { return p.cfg.IdleTimeout }
func (p *Policy) headerTimeout() time.Duration { return p.cfg.HeaderTimeout }
