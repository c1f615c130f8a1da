package egress

import (
	"strings"
	"testing"
)

func TestNormalizeHost(t *testing.T) {
	cases := []struct {
		in, want string
		ip       bool
	}{
		{"example.com", "example.com", false},
		{"EXAMPLE.Com", "example.com", false},
		{"example.com.", "example.com", false},
		{"Bücher.test", "xn--bcher-kva.test", false},
		{"xn--bcher-kva.test", "xn--bcher-kva.test", false},
		{"ａｌｌｏｗｅｄ.test", "allowed.test", false}, // full-width letters
		{"example.com。", "example.com", false},  // ideographic full stop
		{"127.0.0.1", "127.0.0.1", true},
		{"127.1", "127.0.0.1", true},
		{"127.0.1", "127.0.0.1", true},
		{"2130706433", "127.0.0.1", true},
		{"0x7f000001", "127.0.0.1", true},
		{"0X7F000001", "127.0.0.1", true},
		{"0177.0.0.1", "127.0.0.1", true},
		{"0x7f.1", "127.0.0.1", true},
		{"127.0.0.1.", "127.0.0.1", true},
		{"１２７.０.０.１", "127.0.0.1", true}, // full-width digits are still an IP
		{"0", "0.0.0.0", true},
		{"[::1]", "::1", true},
		{"::1", "::1", true},
		{"[::ffff:127.0.0.1]", "127.0.0.1", true},
		{"[::FFFF:7f00:1]", "127.0.0.1", true},
		{"[2001:DB8::1]", "2001:db8::1", true},
		{"[fd00:ec2::254]", "fd00:ec2::254", true},
	}
	for _, c := range cases {
		got, ip, err := normalizeHost(c.in)
		if err != nil || got != c.want || ip.IsValid() != c.ip {
			t.Errorf("normalizeHost(%q) = %q, ip %v, %v; want %q, ip %v", c.in, got, ip, err, c.want, c.ip)
		}
	}
	bad := []string{
		"", ".", "..", "a..b", ".a.com", "a.com..", "-a.com", "a-.com", "a_b.com", "a b.com", "%31.com",
		"[allowed.test]", "[127.0.0.1]", "[::1", "::1]", "[fe80::1%eth0]", "fe80::1%25eth0", "1.2.3.4.5",
		"256.0.0.1", "4294967296", "0x100000000", "08.0.0.1", "0x", "1.0x", "foo.123", "foo.0x1f",
		"xn--zz.test", "exa\x00mple.com", "ex\nample.com", strings.Repeat("a", 64) + ".com",
		strings.Repeat("abcdefghi.", 26) + "com", "*.example.com", "a:b:c",
	}
	for _, b := range bad {
		if got, _, err := normalizeHost(b); err == nil {
			t.Errorf("normalizeHost(%q) = %q, want error", b, got)
		}
	}
}

func TestSplitHostPort(t *testing.T) {
	cases := []struct {
		in   string
		def  int
		host string
		port int
		ok   bool
	}{
		{"a.test", 443, "a.test", 443, true},
		{"a.test", 80, "a.test", 80, true},
		{"a.test:8080", 443, "a.test", 8080, true},
		{"[::1]:443", 80, "[::1]", 443, true},
		{"[::1]", 80, "[::1]", 80, true},
		{"a.test:65535", 80, "a.test", 65535, true},
		{"a.test:0", 80, "", 0, false},
		{"a.test:65536", 80, "", 0, false},
		{"a.test:-1", 80, "", 0, false},
		{"a.test:+1", 80, "", 0, false},
		{"a.test:http", 80, "", 0, false},
		{"a.test:", 80, "", 0, false},
		{"a.test:0443", 80, "a.test", 443, true},
		{"a.test:100000", 80, "", 0, false},
		{"::1:443", 80, "", 0, false},
		{"[::1]x", 80, "", 0, false},
		{":443", 80, "", 0, false},
		{"", 80, "", 0, false},
	}
	for _, c := range cases {
		h, p, err := splitHostPort(c.in, c.def)
		if (err == nil) != c.ok || h != c.host || p != c.port {
			t.Errorf("splitHostPort(%q, %d) = %q, %d, %v", c.in, c.def, h, p, err)
		}
	}
}

// FuzzNormalizeHost: no panics, and an accepted host is a fixed point with
// the same IP-ness.
func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{
		"example.com", "EXAMPLE.com.", "Bücher.test", "xn--bcher-kva.test", "127.1", "0x7f000001",
		"2130706433", "0177.0.0.1", "[::ffff:127.0.0.1]", "::1", "１２７.０.０.１", "a..b", "[a]",
		"example.com。", "ß.de", "0x", "1.2.3.4.5", "xn--", "ﬀ.com",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, ip, err := normalizeHost(in)
		if err != nil {
			return
		}
		again, ip2, err := normalizeHost(out)
		if err != nil || again != out || ip2 != ip {
			t.Fatalf("normalizeHost(%q) = %q (ip %v) but normalizing that gives %q (ip %v), %v", in, out, ip, again, ip2, err)
		}
		if ip.IsValid() != (ip2.IsValid()) || (!ip.IsValid() && !validDomain(out)) {
			t.Fatalf("normalizeHost(%q) = %q is neither IP nor a valid domain", in, out)
		}
	})
}

// A refusal names an IPv6 literal with its port in brackets ("[::1]:443"),
// so the address and the port can be told apart.
func TestDenyTextIPv6(t *testing.T) {
	cases := map[string]string{
		denyText(ReasonIPLiteral, "2001:db8::1", 443):    `"[2001:db8::1]:443" is an IP address`,
		denyText(ReasonIPLiteral, "10.0.0.1", 80):        `"10.0.0.1:80" is an IP address`,
		denyText(ReasonNotAllowlisted, "example.com", 0): `"example.com" is not in`,
	}
	for got, want := range cases {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}
