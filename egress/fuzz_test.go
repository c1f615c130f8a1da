package egress

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// Fuzz targets of the proxy's parsers: allowlist rules, CONNECT targets,
// the HTTP framing of tunnels that carry HTTP, and the Git push filter.
// (FuzzNormalizeHost and FuzzClientHello are with their tests.) The seeds
// run with the unit tests; make fuzz runs each at random for a bounded
// count.

// FuzzAllowlistRule: a rule is accepted by normalizeRule exactly when a
// policy with it builds; the accepted rule's normal form (Rules) is a
// name, an IP address or "*." and a name, and normalizes to itself; its own
// host (for a wildcard, a name under it but not the suffix itself) is
// allowed on its ports; and any host the policy allows is the rule's host,
// or under it for a wildcard, on one of its ports, with the same decision
// for the normalized host as for the raw one.
func FuzzAllowlistRule(f *testing.F) {
	for _, s := range []struct {
		host      string
		port      uint16
		probe     string
		probePort uint16
	}{
		{"pypi.org", 443, "PYPI.org.", 443},
		{"pypi.org", 0, "pypi.org", 80},
		{"*.example.com", 0, "a.b.example.com", 443},
		{"*.example.com", 0, "example.com", 443},
		{"*.example.com", 0, "a.example.com.evil.test", 443},
		{"203.0.113.7", 22, "0xcb.0.113.7", 22},
		{"203.0.113.7", 22, "3405803783", 22},
		{"2001:db8::7", 0, "[2001:db8:0::7]", 443},
		{"::ffff:203.0.113.7", 0, "203.0.113.7", 443},
		{"Bücher.test", 0, "xn--bcher-kva.test", 443},
		{"*.127.0.0.1", 0, "x.127.0.0.1", 443},
		{"*.*.a", 0, "", 0},
		{" a.b", 0, "a.b", 443},
		{"*.xn--", 0, "", 0},
		{"*.com", 80, "evil.com", 80},
		{"a.b", 80, "a.b", 443},
		{"ex*ample.com", 0, "", 0},
		{"[2001:db8::7]", 0, "2001:db8::7", 443},
		{"fe80::1%eth0", 0, "", 0},
	} {
		f.Add(s.host, s.port, s.probe, s.probePort)
	}
	f.Fuzz(func(t *testing.T, host string, port uint16, probe string, probePort uint16) {
		var ports []int
		if port != 0 {
			ports = []int{int(port)}
		}
		r := Rule{Host: host, Ports: ports}
		nr, err := normalizeRule(r)
		p, perr := NewPolicy(&Config{Allowlist: []Rule{r}})
		if (err == nil) != (perr == nil) {
			t.Fatalf("normalizeRule: %v, NewPolicy: %v", err, perr)
		}
		if err != nil {
			return
		}
		rules := p.Rules()
		if len(rules) != 1 {
			t.Fatalf("one rule became %v", rules)
		}
		want := []int{443, 80}
		if port != 0 {
			want = []int{int(port)}
		}
		slices.Sort(want)
		got := rules[0]
		if !slices.Equal(got.Ports, want) {
			t.Fatalf("ports %v became %v", want, got.Ports)
		}
		// The normal form: a wildcard over a valid name, a canonical IP
		// address, or a valid name.
		switch name, wild := strings.CutPrefix(got.Host, "*."); {
		case wild:
			if !validDomain(name) || name != nr.host || !nr.wildcard {
				t.Fatalf("%q became the wildcard %q", host, got.Host)
			}
		case nr.ip:
			a, err := netip.ParseAddr(name)
			if err != nil || a.String() != name || a.Is4In6() || a.Zone() != "" {
				t.Fatalf("%q became the address %q", host, got.Host)
			}
		default:
			if !validDomain(name) || name != nr.host {
				t.Fatalf("%q became the name %q", host, got.Host)
			}
		}
		p2, err := NewPolicy(&Config{Allowlist: rules})
		if err != nil || !slices.EqualFunc(p2.Rules(), rules, func(a, b Rule) bool { return a.Host == b.Host && slices.Equal(a.Ports, b.Ports) }) {
			t.Fatalf("the normal form %v does not normalize to itself: %v %v", rules, p2.Rules(), err)
		}
		for _, port := range want {
			if !nr.wildcard {
				if _, ok, reason := p.Decide(nr.host, port); !ok {
					t.Fatalf("the rule's own host %q:%d refused: %s", nr.host, port, reason)
				}
				continue
			}
			if sub := "x." + nr.host; len(sub) <= 253 {
				if _, ok, reason := p.Decide(sub, port); !ok {
					t.Fatalf("%q:%d under %q refused: %s", sub, port, got.Host, reason)
				}
			}
			if _, ok, _ := p.Decide(nr.host, port); ok {
				t.Fatalf("the wildcard %q allows its suffix itself", got.Host)
			}
		}
		norm, ok, reason := p.Decide(probe, int(probePort))
		if ok {
			under := nr.wildcard && strings.HasSuffix(norm, "."+nr.host)
			if !slices.Contains(want, int(probePort)) || !(under || !nr.wildcard && norm == nr.host) {
				t.Fatalf("%q:%d (%q) allowed by %v", probe, probePort, norm, got)
			}
		}
		if norm != "" {
			norm2, ok2, reason2 := p.Decide(norm, int(probePort))
			if norm2 != norm || ok2 != ok || reason2 != reason {
				t.Fatalf("%q: %q %v %s, but its normal form %q: %q %v %s", probe, norm, ok, reason, norm, norm2, ok2, reason2)
			}
		}
	})
}

// fuzzAllowed is the allowlist of FuzzConnectTarget, written out normalized
// by hand: the oracle.
var fuzzAllowed = map[string][]int{"allowed.test": {443, 80}, "203.0.113.7": {22}, "2001:db8::7": {443}, "*.example.org": {443}}

// FuzzConnectTarget: a CONNECT target (or a plain request's authority) is
// split into a host and a port of 1-65535; a target the policy allows
// names a host of the allowlist, or one under its wildcard, on an allowed
// port; the normalized target, joined again (hostPort, authority), splits
// and decides the same way; and what is logged of any target (cleanHost) is
// at most 255 bytes of valid UTF-8 without control characters.
func FuzzConnectTarget(f *testing.F) {
	pol, err := NewPolicy(&Config{Allowlist: []Rule{{Host: "allowed.test"}, {Host: "203.0.113.7", Ports: []int{22}},
		{Host: "2001:db8::7", Ports: []int{443}}, {Host: "*.example.org", Ports: []int{443}}}})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"allowed.test:443", "ALLOWED.test.:443", "allowed.test", "allowed.test:80", "[2001:db8::7]:443",
		"2001:db8::7:443", "[2001:db8::7]", "203.0.113.7:22", "0xcb007107:22", "0313.0.0161.07:22", "a.example.org:443",
		"example.org:443", "allowed.test:0443", "allowed.test:65536", "allowed.test:+80", "allowed.test: 443",
		"[::1]:443", "evil.test:443", "allowed.test@evil.test:443", "allowed.test\x00:443", "allowed。test:443",
		"ａｌｌｏｗｅｄ.test:443", "[::ffff:203.0.113.7]:22", "allowed.test:443:443", "[2001:db8::7]x", ":443",
		"allowed.test\r\nX: y:443", strings.Repeat("a.", 200) + "example.org:443",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, auth string) {
		if c := cleanHost(auth); len(c) > 255 || !utf8.ValidString(c) || strings.ContainsFunc(c, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("cleanHost(%q) = %q", auth, c)
		}
		raw, port, err := splitHostPort(auth, 443)
		if err != nil {
			return
		}
		if port < 1 || port > 65535 || raw == "" {
			t.Fatalf("%q split into %q, %d", auth, raw, port)
		}
		norm, ok, reason := pol.Decide(raw, port)
		if ok {
			allowed := func(h string) bool { return slices.Contains(fuzzAllowed[h], port) }
			wild := false
			for i := strings.IndexByte(norm, '.'); i >= 0 && !wild; {
				wild = allowed("*" + norm[i:])
				j := strings.IndexByte(norm[i+1:], '.')
				if j < 0 {
					break
				}
				i += j + 1
			}
			if !allowed(norm) && !wild {
				t.Fatalf("%q allowed as %q:%d", auth, norm, port)
			}
		}
		if norm == "" {
			return
		}
		for _, joined := range []string{hostPort(norm, port), authority(norm, port, 443)} {
			h2, p2, err := splitHostPort(joined, 443)
			if err != nil || p2 != port {
				t.Fatalf("%q: %q splits into %q, %d, %v", auth, joined, h2, p2, err)
			}
			if n2, ok2, r2 := pol.Decide(h2, p2); n2 != norm || ok2 != ok || r2 != reason {
				t.Fatalf("%q: %q %v %s, but %q: %q %v %s", auth, norm, ok, reason, joined, n2, ok2, r2)
			}
		}
	})
}

// serverReads parses what reached the upstream as a lenient HTTP/1 server
// would: request after request, blank lines before each skipped (RFC 9112
// section 2.2), each body read by its framing. It stops at the first head
// it cannot parse or at a body cut short.
func serverReads(b []byte) []*http.Request {
	var out []*http.Request
	br := bufio.NewReader(bytes.NewReader(b))
	for {
		for {
			c, err := br.Peek(1)
			if err != nil {
				return out
			}
			if c[0] != '\r' && c[0] != '\n' {
				break
			}
			br.ReadByte()
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return out
		}
		out = append(out, req)
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return out
		}
	}
}

// naiveRequest is a request as naiveReads saw it.
type naiveRequest struct{ target, host string }

// Framing choices servers have made when a head is ambiguous.
const (
	firstCL  = iota // the first Content-Length, even with Transfer-Encoding
	lastCL          // the last Content-Length; Transfer-Encoding with "chunked" anywhere wins
	lastHost        // as firstCL, and the last Host header
	numNaive
)

// naiveReads parses what reached the upstream as a lax server might: a
// line ends at LF (CR optional), blank lines before a request are
// skipped, header names are trimmed of whitespace (a folded line is a
// header of its own), and framing follows how (firstCL, lastCL,
// lastHost). It stops where it cannot go on, as a server that answers
// 400 and closes.
func naiveReads(b []byte, how int) []naiveRequest {
	var out []naiveRequest
	line := func() (string, bool) {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return "", false
		}
		l := string(bytes.TrimSuffix(b[:i], []byte("\r")))
		b = b[i+1:]
		return l, true
	}
	for {
		var first string
		for first == "" {
			l, ok := line()
			if !ok {
				return out
			}
			first = l
		}
		// HTTP/1.x, or (Python's) a version-less GET whose headers are
		// read, after which the connection closes. A method that is no
		// token is an error every server answers by closing.
		f := strings.Fields(first)
		last := len(f) == 2 && f[0] == "GET"
		if !last && (len(f) != 3 || !strings.HasPrefix(f[2], "HTTP/1.")) ||
			strings.ContainsFunc(f[0], func(r rune) bool { return r > 0x7f || !isTokenChar(byte(r)) }) {
			return out
		}
		r := naiveRequest{target: f[1]}
		length, chunked, hosts := int64(0), false, 0
		cls := 0
		for {
			l, ok := line()
			if !ok {
				return append(out, r)
			}
			if l == "" {
				break
			}
			name, value, _ := strings.Cut(l, ":")
			name, value = strings.ToLower(strings.TrimSpace(name)), strings.TrimSpace(value)
			switch name {
			case "host":
				if hosts == 0 || how == lastHost {
					r.host = value
				}
				hosts++
			case "content-length":
				if n, err := strconv.ParseInt(value, 10, 64); err == nil && (cls == 0 || how == lastCL) {
					length = n
				}
				cls++
			case "transfer-encoding":
				if strings.Contains(strings.ToLower(value), "chunked") {
					chunked = true
				}
			}
		}
		out = append(out, r)
		if last {
			return out
		}
		switch {
		case chunked && (how == lastCL || cls == 0):
			for {
				l, ok := line()
				if !ok {
					return out
				}
				sz, _, _ := strings.Cut(l, ";")
				n, err := strconv.ParseInt(strings.TrimSpace(sz), 16, 64)
				if err != nil || n < 0 {
					return out
				}
				if n == 0 {
					break
				}
				if int64(len(b)) < n {
					return out
				}
				b = b[n:]
				if _, ok := line(); !ok {
					return out
				}
			}
			for { // trailers
				l, ok := line()
				if !ok {
					return out
				}
				if l == "" {
					break
				}
			}
		case length > 0:
			if int64(len(b)) < length {
				return out
			}
			b = b[length:]
		}
	}
}

// naiveHostOK is hostRuleOK for a naiveRequest.
func naiveHostOK(r naiveRequest, host string, port int) bool {
	req := &http.Request{RequestURI: r.target, Host: r.host}
	return hostRuleOK(req, host, port)
}

// hostRuleOK: a request a server reads in a tunnel to host:port is in
// origin form and names host (any ASCII case), with no port or port
// (leading zeros aside).
func hostRuleOK(req *http.Request, host string, port int) bool {
	if !strings.HasPrefix(req.RequestURI, "/") && req.RequestURI != "*" || strings.HasPrefix(req.RequestURI, "//") {
		return false
	}
	h, p, hasPort := strings.Cut(req.Host, ":")
	if hasPort {
		n, err := strconv.Atoi(strings.TrimLeft(p, "0"))
		if err != nil || n != port || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	return strings.EqualFold(h, host)
}

// tunnelSeeds are requests in a tunnel to allowed.test:port, good and bad.
func tunnelSeeds(port int) []string {
	hostHdr := "Host: allowed.test:" + strconv.Itoa(port) + "\r\n"
	req := func(path string, extra ...string) string {
		return "GET " + path + " HTTP/1.1\r\n" + hostHdr + strings.Join(extra, "") + "\r\n"
	}
	hidden := "GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n"
	return []string{
		req("/a") + req("/b"),
		"GET / HTTP/1.1\r\nHost: ALLOWED.test\r\n\r\n",
		req("/a") + "GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		req("/a") + "GET http://evil.test/ HTTP/1.1\r\n" + hostHdr + "\r\n",
		"GET //evil.test/ HTTP/1.1\r\n" + hostHdr + "\r\n",
		"POST /a HTTP/1.1\r\n" + hostHdr + "Content-Length: 36\r\n\r\n" + hidden + req("/c"),
		"POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n24;ext=1\r\n" + hidden + "\r\n0\r\nX-Trailer: 1\r\n\r\n" + req("/c"),
		"POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + hidden,
		"POST /b HTTP/1.1\r\n" + hostHdr + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST /b HTTP/1.1\r\n" + hostHdr + "Content-Length: 0\r\nContent-Length: 36\r\n\r\n" + hidden,
		"POST /b HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"POST /b HTTP/1.1\r\n" + hostHdr + "Content-Length: +36\r\n\r\n" + hidden,
		"POST /b HTTP/1.0\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden,
		"GET /a HTTP/1.1\r\n" + hostHdr + "Content-Length: 36\r\n\r\n" + hidden,
		"POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n" + hidden,
		req("/a") + "GET /b HTTP/1.1\n" + hostHdr + "\r\n",
		"GET /b HTTP/1.1\r\nHost: allowed.test\nHost: evil.test\r\n\r\n",
		req("/a") + "\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"GET / HTTP/1.1\r\n" + hostHdr + "X: a\r\n Host: evil.test\r\n\r\n",
		"GET / HTTP/1.1\r\n" + hostHdr + "Content-Length : 36\r\n\r\n" + hidden,
		"POST / HTTP/1.1\r\n" + hostHdr + "Content-Length: 036\r\n\r\n" + hidden,
		"POST / HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n-0\r\n\r\n",
		"POST / HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n0\r\nGET /x HTTP/1.1\r\n\r\n",
		"SSH-2.0-OpenSSH_9.6\r\n" + hidden,
		"SSH-2.0-x y\r\n" + hidden,
		"\r\n\r\n" + req("/a"),
		"GET /\r\nHost: evil.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: evil.test\r\n",
		"GET\r\n" + hidden,
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"\x16\x03\x01\x00\x05hello",
		"EHLO x\r\n",
		"G",
		"",
	}
}

// fuzzTunnel runs a tunnel's relay (mode: 80 is httpMode, else sniffMode)
// over in; out is what reached the upstream.
func fuzzTunnel(in []byte, port int) (out []byte, reason string, err error) {
	mode := httpMode
	if port != 80 {
		mode = sniffMode
	}
	pol := &Policy{exact: map[string]portSet{}, wild: map[string]portSet{}}
	br := bufio.NewReaderSize(bytes.NewReader(in), inspectBufSize)
	var next relayKind
	var eof bool
	reason, next, eof = inspect(br, func() {}, mode, pol, "allowed.test", netip.Addr{}, port)
	if reason != "" || eof || next == relayOpaque {
		return nil, reason, nil
	}
	var w bytes.Buffer
	t := &tunnel{host: "allowed.test", port: port}
	if next == relayRequests {
		reason, err = t.relayHTTP(&w, br, 0)
	} else {
		reason, err = t.relaySniffed(&w, br)
	}
	return w.Bytes(), reason, err
}

// checkServersRead: every request Go's server or a lax one reads in out
// (forwarded of in) is in origin form for allowed.test:port.
func checkServersRead(t *testing.T, in, out []byte, port int) {
	t.Helper()
	for _, req := range serverReads(out) {
		if !hostRuleOK(req, "allowed.test", port) {
			t.Fatalf("a server reads %s %s Host %q in %q (forwarded of %q)", req.Method, req.RequestURI, req.Host, out, in)
		}
	}
	for how := range numNaive {
		for _, r := range naiveReads(out, how) {
			if !naiveHostOK(r, "allowed.test", port) {
				t.Fatalf("a lax server (%d) reads %s Host %q in %q (forwarded of %q)", how, r.target, r.host, out, in)
			}
		}
	}
}

// FuzzTunnelHTTP: in a tunnel to port 80, what reaches the upstream is the
// client's bytes unchanged, all of them when the relay saw only allowed
// requests up to the client's EOF, and every request a server reads in
// them is in origin form for the tunnel's host: no request hides in a body
// or after a framing servers read differently.
func FuzzTunnelHTTP(f *testing.F) {
	for _, s := range tunnelSeeds(80) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, reason, err := fuzzTunnel(in, 80)
		if !bytes.HasPrefix(in, out) {
			t.Fatalf("forwarded %q, not a prefix of %q", out, in)
		}
		if reason == "" && err == nil && !bytes.Equal(out, in) {
			t.Fatalf("allowed to the end but forwarded %q of %q", out, in)
		}
		checkServersRead(t, in, out, 80)
	})
}

// FuzzTunnelSniffed: in a tunnel to another port that does not start with
// TLS, what reaches the upstream is a prefix of the client's bytes, and
// every request a server reads in them is in origin form for the tunnel's
// host.
func FuzzTunnelSniffed(f *testing.F) {
	for _, s := range tunnelSeeds(8080) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, _, _ := fuzzTunnel(in, 8080)
		if !bytes.HasPrefix(in, out) {
			t.Fatalf("forwarded %q, not a prefix of %q", out, in)
		}
		checkServersRead(t, in, out, 8080)
	})
}

// pushCommand is one ref update of a receive-pack request as git reads it
// (receive-pack.c, read_head_info and queue_command).
type pushCommand struct{ old, new, ref string }

// gitReadsPush reads the commands of a receive-pack request the way git
// does: pkt-lines up to a flush (or any other special packet), a trailing
// LF dropped, capabilities after a NUL, "shallow" lines skipped, then
// "<old> SP <new> SP <ref>" with object ids of 40 or 64 hex digits (either
// case). ok is false where git would fail the push.
func gitReadsPush(b []byte) (cmds []pushCommand, caps []string, ok bool) {
	for {
		if len(b) < 4 {
			return nil, nil, false
		}
		n, err := strconv.ParseUint(string(b[:4]), 16, 16)
		if err != nil || strings.ContainsAny(string(b[:4]), "+-") {
			return nil, nil, false
		}
		if n < 4 { // flush, delim, response end: the commands end
			return cmds, caps, true
		}
		if int(n) > len(b) {
			return nil, nil, false
		}
		line := bytes.TrimSuffix(b[4:n], []byte("\n"))
		b = b[n:]
		if i := bytes.IndexByte(line, 0); i >= 0 {
			if caps == nil {
				caps = strings.Split(string(line[i+1:]), " ")
			}
			line = line[:i]
		}
		if len(line) > 8 && bytes.HasPrefix(line, []byte("shallow ")) {
			continue
		}
		var c pushCommand
		for _, sz := range []int{40, 64} {
			if len(line) >= 2*sz+2 && line[sz] == ' ' && line[2*sz+1] == ' ' {
				if _, err := hex.DecodeString(string(line[:sz]) + string(line[sz+1:2*sz+1])); err == nil {
					c = pushCommand{strings.ToLower(string(line[:sz])), strings.ToLower(string(line[sz+1 : 2*sz+1])), string(line[2*sz+2:])}
				}
			}
		}
		if c.ref == "" {
			return nil, nil, false
		}
		cmds = append(cmds, c)
	}
}

// FuzzCheckPush: a push the filter lets through is one git reads as
// updates or creations of the paired branch only, with capabilities the
// credential may ask for, and it is passed on byte for byte; a body of
// only a flush is git's probe.
func FuzzCheckPush(f *testing.F) {
	const ref = "refs/heads/main"
	zero, a, b := strings.Repeat("0", 40), strings.Repeat("a", 40), strings.Repeat("b", 40)
	pkt := func(s string) string { return strconv.FormatInt(int64(len(s)+4)|0x10000, 16)[1:] + s }
	for _, s := range []string{
		pkt(a+" "+b+" "+ref+"\x00report-status side-band-64k agent=git/2.39\n") + "0000PACK....",
		pkt(zero+" "+b+" "+ref+"\x00report-status\n") + "0000PACK",
		pkt(a+" "+zero+" "+ref+"\x00report-status\n") + "0000",
		pkt(a+" "+b+" refs/heads/other\x00report-status\n") + "0000",
		pkt(a+" "+b+" "+ref+"\x00push-options\n") + "0000",
		pkt(a+" "+b+" "+ref+"\n") + pkt(a+" "+b+" refs/heads/x\n") + "0000",
		pkt(a+" "+b+" "+ref+"\x00report-status\n") + "0001" + pkt(a+" "+b+" refs/heads/x\n") + "0000",
		pkt("shallow "+a+"\n") + pkt(a+" "+b+" "+ref+"\n") + "0000",
		pkt(strings.ToUpper(a)+" "+b+" "+ref+"\n") + "0000",
		pkt(a+" "+b+" "+ref+"\x00\n") + "0000",
		"0000", "0000x", "", "00", "zzzz", "0004",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := checkPush(bytes.NewReader(body), ref)
		if err != nil {
			return
		}
		passed, _ := io.ReadAll(r)
		if !bytes.Equal(passed, body) {
			t.Fatalf("passed %q of %q", passed, body)
		}
		cmds, caps, ok := gitReadsPush(body)
		if !ok {
			t.Fatalf("let through %q, which git refuses", body)
		}
		if len(cmds) == 0 && string(body) != "0000" {
			t.Fatalf("let through %q, which updates nothing", body)
		}
		for _, c := range cmds {
			if c.ref != ref || strings.Trim(c.new, "0") == "" {
				t.Fatalf("let through %+v in %q", c, body)
			}
		}
		for _, c := range caps {
			name, _, _ := strings.Cut(c, "=")
			switch name {
			case "", "report-status", "report-status-v2", "side-band-64k", "side-band", "quiet", "atomic", "ofs-delta",
				"delete-refs", "agent", "object-format", "session-id":
			default:
				t.Fatalf("let through the capability %q in %q", c, body)
			}
		}
	})
}
