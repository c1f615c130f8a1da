package egress

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// maxRawHost bounds the input the normalizer looks at (IDNA work is linear,
// but nothing legitimate is longer).
const maxRawHost = 1024

var errInvalidHost = errors.New("invalid host")

// idnaProfile maps like a browser's lookup (UTS #46: case folding, full-width
// forms, ideographic full stop) and keeps STD3 rules, so the ASCII result is
// letters, digits, hyphens and dots only.
var idnaProfile = idna.New(
	idna.MapForLookup(),
	idna.BidiRule(),
	idna.Transitional(false),
	idna.StrictDomainName(true),
)

// normalizeHost returns the one canonical spelling of a host the policy
// decides on: IP literals (brackets, IPv4-mapped IPv6, and the numeric IPv4
// forms inet_aton and browsers accept: 2130706433, 0x7f000001, 0177.0.0.1,
// 127.1) become their canonical address and ip is set; names become
// lowercase ASCII (IDNA), without a trailing dot. Anything else is an error.
// The result normalizes to itself.
func normalizeHost(h string) (host string, ip netip.Addr, err error) {
	if h == "" || len(h) > maxRawHost || !utf8.ValidString(h) {
		return "", netip.Addr{}, errInvalidHost
	}
	if h[0] == '[' {
		if h[len(h)-1] != ']' {
			return "", netip.Addr{}, errInvalidHost
		}
		return parseIPv6Literal(h[1 : len(h)-1])
	}
	if strings.IndexByte(h, ':') >= 0 {
		return parseIPv6Literal(h)
	}
	a, err := idnaProfile.ToASCII(h)
	if err != nil {
		return "", netip.Addr{}, errInvalidHost
	}
	// A single trailing dot (fully qualified form) names the same host;
	// IDNA mapping may have produced it from U+3002 and friends.
	a = strings.TrimSuffix(a, ".")
	if a == "" {
		return "", netip.Addr{}, errInvalidHost
	}
	if endsInNumber(a) {
		v4, ok := parseIPv4Loose(a)
		if !ok {
			return "", netip.Addr{}, errInvalidHost
		}
		return v4.String(), v4, nil
	}
	// The result must be its own normal form (punycode labels decode to
	// what encodes back to them), so deciding twice gives one answer.
	if !validDomain(a) {
		return "", netip.Addr{}, errInvalidHost
	}
	if b, err := idnaProfile.ToASCII(a); err != nil || b != a {
		return "", netip.Addr{}, errInvalidHost
	}
	return a, netip.Addr{}, nil
}

func parseIPv6Literal(s string) (string, netip.Addr, error) {
	if !strings.Contains(s, ":") || strings.Contains(s, "%") {
		return "", netip.Addr{}, errInvalidHost // zones name local interfaces
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() {
		return "", netip.Addr{}, errInvalidHost
	}
	a = a.Unmap()
	return a.String(), a, nil
}

// endsInNumber reports whether the last label is numeric (decimal or 0x
// hex), which is how the URL standard decides a host is an IPv4 address: a
// name like "foo.123" is then invalid rather than a domain.
func endsInNumber(a string) bool {
	last := a[strings.LastIndexByte(a, '.')+1:]
	if last == "" {
		return false
	}
	if allDigits(last, 10) {
		return true
	}
	return strings.HasPrefix(last, "0x") && allDigits(last[2:], 16)
}

func allDigits(s string, base int) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
		case base == 16 && c >= 'a' && c <= 'f':
		default:
			return false
		}
	}
	return true
}

// parseIPv4Loose parses the inet_aton forms: one to four parts, each
// decimal, octal (leading 0) or hex (0x); the last part fills the remaining
// bytes.
func parseIPv4Loose(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var vals [4]uint64
	for i, p := range parts {
		base := 10
		switch {
		case strings.HasPrefix(p, "0x"):
			base, p = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, p = 8, p[1:]
		}
		if p == "" || !allDigits(p, base) || (base == 8 && strings.ContainsAny(p, "89")) {
			return netip.Addr{}, false
		}
		v, err := strconv.ParseUint(p, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	n := len(parts)
	var ip uint64
	for i := 0; i < n-1; i++ {
		if vals[i] > 255 {
			return netip.Addr{}, false
		}
		ip |= vals[i] << (8 * (3 - i))
	}
	if vals[n-1] >= 1<<(8*(5-n)) {
		return netip.Addr{}, false
	}
	ip |= vals[n-1]
	return netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), true
}

// validDomain checks the ASCII form: at most 253 bytes, labels of 1-63
// letters, digits and inner hyphens.
func validDomain(a string) bool {
	if len(a) > 253 {
		return false
	}
	for _, l := range strings.Split(a, ".") {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// splitHostPort splits an authority ("host", "host:port", "[v6]:port") and
// fills in def when the port is missing. Ports are 1-65535 in plain decimal.
// An unbracketed IPv6 literal is ambiguous and refused.
func splitHostPort(auth string, def int) (string, int, error) {
	host, portStr, hasPort := auth, "", false
	if strings.HasPrefix(auth, "[") {
		end := strings.IndexByte(auth, ']')
		if end < 0 {
			return "", 0, errInvalidHost
		}
		host = auth[:end+1]
		switch rest := auth[end+1:]; {
		case rest == "":
		case rest[0] == ':':
			portStr, hasPort = rest[1:], true
		default:
			return "", 0, errInvalidHost
		}
	} else if i := strings.IndexByte(auth, ':'); i >= 0 {
		if strings.IndexByte(auth[i+1:], ':') >= 0 {
			return "", 0, errInvalidHost
		}
		host, portStr, hasPort = auth[:i], auth[i+1:], true
	}
	if host == "" {
		return "", 0, errInvalidHost
	}
	if !hasPort {
		return host, def, nil
	}
	p, err := parsePort(portStr)
	if err != nil {
		return "", 0, err
	}
	return host, p, nil
}

var errInvalidPort = errors.New("invalid port")

func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || !allDigits(s, 10) {
		return 0, errInvalidPort
	}
	p, _ := strconv.Atoi(s)
	if p < 1 || p > 65535 {
		return 0, errInvalidPort
	}
	return p, nil
}

// hostPort joins a normalized host and port for dialing and URLs.
func hostPort(host string, port int) string {
	if strings.IndexByte(host, ':') >= 0 {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}

// authority is hostPort without the port when it is the scheme's default.
func authority(host string, port, def int) string {
	if port != def {
		return hostPort(host, port)
	}
	if strings.IndexByte(host, ':') >= 0 {
		return "[" + host + "]"
	}
	return host
}

// shownHost is cleanHost of a host splitHostPort returned, without the
// brackets of an IP literal, as events and denyText show hosts (which
// bracket it themselves with a port): "[fe80::1%eth0]" is "fe80::1%eth0".
func shownHost(raw string) string {
	if len(raw) >= 2 && raw[0] == '[' && raw[len(raw)-1] == ']' {
		raw = raw[1 : len(raw)-1]
	}
	return cleanHost(raw)
}

// cleanHost makes an untrusted host string safe to put in events and logs:
// at most 255 bytes, control and invalid bytes replaced.
func cleanHost(s string) string {
	if len(s) > 255 {
		s = s[:255]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
}
