package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// Resolver looks up a name's addresses; *net.Resolver implements it.
// network is "ip". Tests inject one that maps names to loopback.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// forbiddenNets are never dialed unless Config.AllowNetworks covers the
// address. Besides these, anything that is not global unicast (loopback,
// multicast, unspecified, link-local, broadcast) is refused.
var forbiddenNets = mustPrefixes(
	// IPv4
	"0.0.0.0/8",       // "this network"
	"10.0.0.0/8",      // RFC 1918
	"100.64.0.0/10",   // CGNAT
	"127.0.0.0/8",     // loopback
	"169.254.0.0/16",  // link-local, cloud metadata 169.254.169.254
	"172.16.0.0/12",   // RFC 1918
	"192.0.0.0/24",    // IETF protocol assignments
	"192.0.2.0/24",    // TEST-NET-1
	"192.88.99.0/24",  // 6to4 relay anycast
	"192.168.0.0/16",  // RFC 1918
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // TEST-NET-2
	"203.0.113.0/24",  // TEST-NET-3
	"224.0.0.0/4",     // multicast
	"240.0.0.0/4",     // reserved, broadcast
	// IPv6
	"::/96",          // unspecified, loopback, IPv4-compatible
	"::ffff:0:0/96",  // IPv4-mapped (unmapped before the check anyway)
	"64:ff9b:1::/48", // local-use NAT64
	"100::/64",       // discard
	"2001::/23",      // IETF protocol assignments, Teredo
	"2001:db8::/32",  // documentation
	"2002::/16",      // 6to4 (embeds any IPv4 address)
	"3fff::/20",      // documentation
	"fc00::/7",       // unique local, incl. fd00:ec2::254 (metadata)
	"fe80::/10",      // link-local
	"fec0::/10",      // site-local (deprecated)
	"ff00::/8",       // multicast
)

// nat64 is the well-known NAT64 prefix: its last 32 bits are an IPv4
// address, judged as such.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// forbiddenAddr reports whether a is an address a sandbox must not reach.
func forbiddenAddr(a netip.Addr) bool {
	if !a.IsValid() || a.Zone() != "" {
		return true
	}
	a = a.Unmap()
	if !a.IsGlobalUnicast() {
		return true
	}
	for _, p := range forbiddenNets {
		if p.Contains(a) {
			return true
		}
	}
	if nat64.Contains(a) {
		b := a.As16()
		return forbiddenAddr(netip.AddrFrom4([4]byte(b[12:16])))
	}
	return false
}

// guard decides addresses: forbidden ones only where allowNet covers them.
type guard struct{ allowNet []netip.Prefix }

func (g guard) permitted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range g.allowNet {
		if p.Contains(a) {
			return true
		}
	}
	return !forbiddenAddr(a)
}

// denyError is a refusal by policy (not a network failure); the proxy
// answers 403 and reports reason.
type denyError struct {
	reason string
	detail string
}

func (e *denyError) Error() string { return "egress denied: " + e.reason + ": " + e.detail }

// dialer resolves names itself and dials only addresses the guard permits:
// every resolved address is checked, the checked IP (not the name) is
// dialed, and the socket's connect address is checked again in Control.
// It never consults proxy environment variables.
type dialer struct {
	resolver Resolver
	guard    guard
	timeout  time.Duration
}

// dial connects to host:port. ip is set when host is an IP literal. A name
// with any forbidden address is refused as a whole (a name pointing into
// private space is treated as hostile, which also defeats DNS rebinding).
func (d *dialer) dial(ctx context.Context, host string, ip netip.Addr, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	addrs := []netip.Addr{ip}
	if !ip.IsValid() {
		var err error
		addrs, err = d.resolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", host, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("resolve %s: no addresses", host)
		}
	}
	for _, a := range addrs {
		if !d.guard.permitted(a) {
			return nil, &denyError{reason: ReasonForbiddenAddress, detail: host + " resolves to a forbidden address"}
		}
	}
	nd := net.Dialer{KeepAlive: 30 * time.Second, Control: d.control}
	var firstErr error
	for _, a := range addrs {
		c, err := nd.DialContext(ctx, "tcp", netip.AddrPortFrom(a.Unmap(), uint16(port)).String())
		if err == nil {
			return c, nil
		}
		var de *denyError
		if errors.As(err, &de) {
			return nil, de
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, firstErr
}

// control is the second guard: it sees the address the kernel is about to
// connect to.
func (d *dialer) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &denyError{reason: ReasonForbiddenAddress, detail: "unparsable connect address"}
	}
	if !d.guard.permitted(ap.Addr()) {
		return &denyError{reason: ReasonForbiddenAddress, detail: "connect address is forbidden"}
	}
	return nil
}

// upstreamError turns a dial failure into a short message for the client
// (no addresses or internal details).
func upstreamError(err error) string {
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return "the name does not resolve"
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return "timed out"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return "unreachable"
	default:
		return "could not connect"
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
