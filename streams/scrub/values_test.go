package scrub

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	mrand "math/rand/v2"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// leaks reports whether out reveals k = KnownRun(len(v)) consecutive
// bytes of v: as they are (in any ASCII case), or in a base64 decoding of
// a base64 run of out at any offset.
func leaks(out []byte, v string) bool {
	k := KnownRun(len(v))
	lo := lowerASCII(out)
	for i := 0; i+k <= len(v); i++ {
		if bytes.Contains(lo, lowerASCII([]byte(v[i:i+k]))) {
			return true
		}
	}
	for _, run := range regexp.MustCompile(`[A-Za-z0-9+/_-]{4,}`).FindAll(out, -1) {
		for off := 0; off < 4; off++ {
			r := run[min(off, len(run)):]
			r = r[:len(r)/4*4]
			for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
				// decode what decodes; alphabets mix in runs
				d := make([]byte, enc.DecodedLen(len(r)))
				n, _ := enc.Decode(d, r)
				for i := 0; i+k <= len(v); i++ {
					if bytes.Contains(d[:n], []byte(v[i:i+k])) {
						return true
					}
				}
			}
		}
	}
	return false
}

func lowerASCII(b []byte) []byte {
	o := make([]byte, len(b))
	for i, c := range b {
		o[i] = lowerByte(c)
	}
	return o
}

func TestKnownValuePlainAndCounts(t *testing.T) {
	base := ruleSet(t)
	s := withValues(t, base, map[string]string{"db": "Zq9vX2pLmN4t", "api": "h7Gk2mPq8sLw"})
	in := []byte("connect with Zq9vX2pLmN4t then h7Gk2mPq8sLw and Zq9vX2pLmN4t again\n")
	out := string(s.Redact(in))
	want := "connect with [REDACTED:db] then [REDACTED:api] and [REDACTED:db] again\n"
	if out != want {
		t.Fatalf("got %q want %q", out, want)
	}
	var buf bytes.Buffer
	w := s.NewWriter(&buf)
	w.Write(in)
	w.Close()
	if buf.String() != want {
		t.Fatalf("writer: %q", buf.String())
	}
	if c := w.Counts(); c["value:db"] != 2 || c["value:api"] != 1 {
		t.Fatalf("writer counts %v", c)
	}
	if c := base.Counts(); c["value:db"] != 4 || c["value:api"] != 2 {
		t.Fatalf("shared counts %v", c)
	}
	for k, v := range s.Counts() {
		if strings.Contains(k, "Zq9v") || v < 0 {
			t.Fatalf("counter key %q", k)
		}
	}
}

func TestShortValueRejected(t *testing.T) {
	s, err := ruleSet(t).WithValues(map[string]string{"pin": "12345", "ok": "abcdef", "": "zzzzzzzz"})
	if err == nil {
		t.Fatal("short value accepted")
	}
	var ve *ValueError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), `"pin"`) || strings.Contains(err.Error(), "12345") {
		t.Fatalf("error %v", err)
	}
	if s == nil || string(s.Redact([]byte("x abcdef 12345"))) != "x [REDACTED:ok] 12345" {
		t.Fatal("valid values not registered next to a rejected one")
	}
}

// TestValueEncodings: base64 in all alignments (std/url, padded or not,
// inside longer runs as in `echo -n "user:$V" | base64`), hex, URL,
// JSON and shell escaping; whole and streamed with random splits.
func TestValueEncodings(t *testing.T) {
	rnd := mrand.New(mrand.NewPCG(3, 4))
	values := []string{
		"Zq9vX2pLmN4t",
		"s3cr3t",
		"p@ss w/rd&x=1?é\"'\\<tag>",
		randString(rnd, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", 40),
		string([]byte{0xfb, 0xff, 0xbf, 0x3e, 0x3f, 0xfe, 0x00, 0x80, 0xff}),
	}
	for vi, v := range values {
		s := withValues(t, ruleSet(t), map[string]string{"v": v})
		var cases []string
		for pre := 0; pre < 6; pre++ {
			for post := 0; post < 4; post++ {
				raw := []byte(strings.Repeat("u", pre) + v + strings.Repeat("z", post))
				for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
					cases = append(cases, "data: "+enc.EncodeToString(raw)+"\n", enc.EncodeToString(raw))
				}
			}
		}
		cases = append(cases,
			base64.StdEncoding.EncodeToString([]byte("user:"+v))+"\n", // echo -n "user:$V" | base64
			base64.StdEncoding.EncodeToString([]byte(`{"auth":"`+v+`","x":1}`)),
			"hex "+hex.EncodeToString([]byte(v))+" HEX "+strings.ToUpper(hex.EncodeToString([]byte(v))),
			"GET /login?pw="+url.QueryEscape(v)+"&next="+url.PathEscape(v),
			"shell: "+shellBackslash(v)+" and '"+strings.ReplaceAll(v, "'", `'\''`)+"'",
			"go: "+strconv.Quote(v),
			"host "+strings.ToLower(v)+".example.com", // a host name, lowercased by a proxy
			"UPPER "+strings.ToUpper(v),
			"swapped "+swapCase(v), // python's str.swapcase
			"title "+strings.ToUpper(v[:1])+strings.ToLower(v[1:]),
			"hex mixed "+swapCase(hex.EncodeToString([]byte(v))),
		)
		j, _ := json.Marshal(map[string]string{"token": v})
		cases = append(cases, string(j))
		for ci, c := range cases {
			out := s.Redact([]byte(c))
			if leaks(out, v) {
				t.Fatalf("value %d case %d: %q leaks in %q", vi, ci, c, out)
			}
			if !bytes.Contains(out, []byte("[REDACTED:v]")) {
				t.Fatalf("value %d case %d: %q not redacted: %q", vi, ci, c, out)
			}
			// Flushed or not, nothing of a value is released early.
			if got := stream(t, s, []byte(c), randomSizes(rnd, len(c)), ci%3 == 0); !bytes.Equal(got, out) {
				if err := flushEquivalent(s, []byte(c), got); err != nil || leaks(got, v) {
					t.Fatalf("streamed %q != whole %q: %v", got, out, err)
				}
			}
		}
	}
}

func TestBase64KeepsNeighbours(t *testing.T) {
	v := "Zq9vX2pLmN4t"
	s := withValues(t, ruleSet(t), map[string]string{"v": v})
	in := base64.StdEncoding.EncodeToString([]byte("user:" + v))
	out := string(s.Redact([]byte(in)))
	// "dXNlcjo" encodes "user:" plus 2 bits of v: at most its last character goes.
	if !strings.HasPrefix(out, "dXNlcj") || !strings.Contains(out, "[REDACTED:v]") {
		t.Fatalf("got %q", out)
	}
}

func genPEM(t *testing.T) string {
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

func TestPEMWholeAndLineByLine(t *testing.T) {
	key := genPEM(t)
	s := withValues(t, ruleSet(t), map[string]string{"deploy_key": key})
	lines := strings.Split(strings.TrimSpace(key), "\n")
	body := lines[1 : len(lines)-1]
	check := func(name, in string, wantLabel string) {
		t.Helper()
		out := string(s.Redact([]byte(in)))
		for _, l := range body {
			if strings.Contains(out, l) {
				t.Fatalf("%s: line %q left in %q", name, l, out)
			}
		}
		if !strings.Contains(out, wantLabel) {
			t.Fatalf("%s: %q lacks %s", name, out, wantLabel)
		}
		got := stream(t, s, []byte(in), []int{1, 7, 64, 3}, true)
		if err := flushEquivalent(s, []byte(in), got); err != nil {
			t.Fatalf("%s: streamed %q (whole %q): %v", name, got, out, err)
		}
	}
	check("whole", "$ cat key.pem\n"+key+"$ ", "[REDACTED:deploy_key]")
	check("crlf", strings.ReplaceAll(key, "\n", "\r\n"), "[REDACTED:deploy_key]")
	check("one line", "line 2: "+body[1]+"\n", "[REDACTED:deploy_key]")
	check("shuffled lines", body[2]+"\n"+body[0]+"\n", "[REDACTED:deploy_key]")
	j, _ := json.Marshal(key)
	check("json", `{"key":`+string(j)+`}`, "[REDACTED:deploy_key]")
	// an unregistered key is caught by the private-key rule
	other := genPEM(t)
	out := string(ruleSet(t).Redact([]byte("x\n" + other + "y\n")))
	if out != "x\n[REDACTED:private-key]\ny\n" {
		t.Fatalf("rule: %q", out)
	}
}

// swapCase swaps the case of ASCII letters.
func swapCase(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		case 'A' <= c && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
	}
	return string(b)
}

// TestStringLiteralForms covers values printed as Python's repr and
// JavaScript's util.inspect print strings (as they were seen to leak).
func TestStringLiteralForms(t *testing.T) {
	for _, c := range []struct{ v, printed string }{
		{`k"9\Tq2!Lw7Zp`, `'k"9\\Tq2!Lw7Zp'`},        // Python repr and Node inspect
		{`m'4"Rv8Hx3Jq`, `'m\'4"Rv8Hx3Jq'`},          // Python repr: both quotes
		{`m'4"Rv8Hx3Jq`, "`m'4\"Rv8Hx3Jq`"},          // Node inspect: backticks
		{"ab'cd\"ef\\gh\tij", `'ab\'cd"ef\\gh\tij'`}, // Python repr with a tab
		{"line-one-abc\nline-two-def'", `"line-one-abc\nline-two-def'"`},
	} {
		s := withValues(t, ruleSet(t), map[string]string{"v": c.v})
		out := s.Redact([]byte("x = " + c.printed + "\n"))
		if !bytes.Contains(out, []byte("[REDACTED:v]")) || leaks(out, c.v) {
			t.Errorf("%q printed as %s: %q", c.v, c.printed, out)
		}
	}
}
