package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestForbiddenAddr(t *testing.T) {
	forbidden := []string{
		"127.0.0.1", "127.255.0.9", "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",
		"169.254.169.254", "169.254.0.1", "100.64.0.1", "100.127.255.255", "0.0.0.0", "0.1.2.3",
		"224.0.0.1", "239.255.255.250", "255.255.255.255", "240.0.0.1", "192.0.2.1", "198.51.100.1",
		"203.0.113.1", "198.18.0.1", "192.0.0.8", "::", "::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
		"::127.0.0.1", "fe80::1", "fc00::1", "fd00:ec2::254", "ff02::1", "2001:db8::1", "2002:7f00:1::1",
		"2001::1", "64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b:1::1", "fec0::1", "100::1", "3fff::1",
	}
	for _, s := range forbidden {
		if !forbiddenAddr(netip.MustParseAddr(s)) {
			t.Errorf("%s should be forbidden", s)
		}
	}
	allowed := []string{"1.1.1.1", "140.82.112.3", "151.101.0.223", "100.128.0.1", "172.32.0.1", "2606:4700::1111", "64:ff9b::101:101"}
	for _, s := range allowed {
		if forbiddenAddr(netip.MustParseAddr(s)) {
			t.Errorf("%s should be allowed", s)
		}
	}
	g := guard{allowNet: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if !g.permitted(netip.MustParseAddr("127.0.0.1")) || !g.permitted(netip.MustParseAddr("::ffff:127.0.0.1")) {
		t.Error("allowNetworks 127.0.0.0/8 must permit loopback")
	}
	if g.permitted(netip.MustParseAddr("10.0.0.1")) || g.permitted(netip.MustParseAddr("::1")) {
		t.Error("allowNetworks must not permit more than it says")
	}
}

// TestDialerRefusesBeforeConnecting: names that resolve into forbidden
// space are refused before any packet leaves (these tests never send to
// a non-loopback address).
func TestDialerRefusesBeforeConnecting(t *testing.T) {
	res := newResolver()
	res.set("rebind.test", "127.0.0.1")
	res.set("meta.test", "169.254.169.254")
	res.set("meta6.test", "fd00:ec2::254")
	res.set("mixed.test", "1.1.1.1", "10.0.0.1")
	d := &dialer{resolver: res, timeout: time.Second}
	for _, name := range []string{"rebind.test", "meta.test", "meta6.test", "mixed.test"} {
		_, err := d.dial(context.Background(), name, netip.Addr{}, 443)
		var de *denyError
		if !errors.As(err, &de) || de.reason != ReasonForbiddenAddress {
			t.Errorf("dial %s: %v, want forbidden_address", name, err)
		}
	}
	if _, err := d.dial(context.Background(), "nx.test", netip.Addr{}, 443); err == nil || upstreamError(err) != "the name does not resolve" {
		t.Errorf("dial nx.test: %v", err)
	}
	// The Control hook refuses on its own too (second guard).
	if err := d.control("tcp4", "10.0.0.1:443", nil); err == nil {
		t.Error("control allowed 10.0.0.1")
	}
	if err := d.control("tcp6", "[::1]:443", nil); err == nil {
		t.Error("control allowed ::1")
	}
	if err := d.control("tcp4", "1.1.1.1:443", nil); err != nil {
		t.Errorf("control refused 1.1.1.1: %v", err)
	}
	// A real connect to loopback is stopped by Control when the guard says no.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	nd := net.Dialer{Control: d.control}
	if c, err := nd.Dial("tcp", l.Addr().String()); err == nil {
		c.Close()
		t.Error("Control let a loopback connect through")
	}
}
