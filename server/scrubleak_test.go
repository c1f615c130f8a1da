package server

// The leak checker of the known-value acceptance test (scrub_forms_e2e_test.go):
// pure code, unit-tested below against output built here in Go, so the e2e
// test can only pass on output that really carries no run of a secret.

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"math/big"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// leakSecret is a registered secret of the test session.
type leakSecret struct{ name, value string }

// leakThreshold is k for a value of n bytes: no run of k consecutive bytes
// of the value may reach a client, in any form.
func leakThreshold(n int) int {
	switch {
	case n >= 24:
		return 12
	case n >= 16:
		return (n + 1) / 2
	case n >= 8:
		return 8
	default:
		return n
	}
}

var csiRE = regexp.MustCompile("\x1b\\[[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]")

// leakNormalise is what the checker compares: ANSI CSI sequences, spaces,
// tabs, NUL, CR and LF removed, ASCII lower case. It turns UTF-16 (NULs),
// single separators, SGR codes between characters and a value split over
// lines, by \r or over the two streams (concatenated) into the value itself.
func leakNormalise(s string) string {
	s = csiRE.ReplaceAllString(s, "")
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == 0 || c == '\r' || c == '\n':
			continue
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return string(b)
}

// termRender is out as a person reads it on a terminal: a backspace
// erases the character before it (the next one takes its place), the
// invisible characters the e2e forms print show nothing, fullwidth ASCII
// reads as ASCII. (leakNormalise then does the rest.)
func termRender(out string) string {
	var b []string
	for i := 0; i < len(out); {
		r, n := utf8.DecodeRuneInString(out[i:])
		c := out[i : i+n]
		switch {
		case r == '\b':
			if len(b) > 0 {
				b = b[:len(b)-1]
			}
		case r == 0x200b || r == 0x200c || r == 0x200d || r == 0x2060 || r == 0xfeff || r == 0xa0 || r == 0xad:
		case r >= 0xff01 && r <= 0xff5e:
			b = append(b, string(r-0xfee0))
		default:
			b = append(b, c)
		}
		i += n
	}
	return strings.Join(b, "")
}

// A pieceForm writes a value byte by byte: pieces[i] is how byte i looks in
// the form, sep goes between pieces. k consecutive bytes of the value in
// this form are k consecutive pieces.
type pieceForm struct {
	name   string
	pieces func(v string) []string
	sep    string
}

func perByte(f func(c byte) string) func(string) []string {
	return func(v string) []string {
		out := make([]string, len(v))
		for i := 0; i < len(v); i++ {
			out[i] = f(v[i])
		}
		return out
	}
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// bashQuotePieces is printf %q of bash 5 (sh_backslash_quote) per byte.
func bashQuotePieces(v string) []string {
	out := make([]string, len(v))
	for i := 0; i < len(v); i++ {
		c := v[i]
		esc := strings.IndexByte(" \t\n'\"\\|&;()<>!{}*[?]^$`", c) >= 0 ||
			c == '#' && i == 0 ||
			c == '~' && (i == 0 || v[i-1] == '=' || v[i-1] == ':')
		if esc {
			out[i] = `\` + string(c)
		} else {
			out[i] = string(c)
		}
	}
	return out
}

// urlPieces is percent-encoding that keeps letters, digits and safe.
func urlPieces(safe string) func(string) []string {
	return perByte(func(c byte) string {
		if isAlnum(c) || strings.IndexByte(safe, c) >= 0 {
			return string(c)
		}
		return fmt.Sprintf("%%%02x", c)
	})
}

// leakForms are the encodings looked for in every output (besides base64,
// see base64Windows). Case, UTF-16, separators, SGR codes, splits, JSON and
// repr of these values all normalise to "raw".
var leakForms = []pieceForm{
	{"raw", perByte(func(c byte) string { return string(c) }), ""},
	{"reversed", func(v string) []string {
		p := perByte(func(c byte) string { return string(c) })(v)
		for i, j := 0, len(p)-1; i < j; i, j = i+1, j-1 {
			p[i], p[j] = p[j], p[i]
		}
		return p
	}, ""},
	{"hex", perByte(func(c byte) string { return fmt.Sprintf("%02x", c) }), ""},
	{"%XX", perByte(func(c byte) string { return fmt.Sprintf("%%%02x", c) }), ""},
	{`\xNN`, perByte(func(c byte) string { return fmt.Sprintf(`\x%02x`, c) }), ""},
	{`\u00NN`, perByte(func(c byte) string { return fmt.Sprintf(`\u%04x`, c) }), ""},
	{`\u{NN}`, perByte(func(c byte) string { return fmt.Sprintf(`\u{%x}`, c) }), ""},
	{"dotted decimal", perByte(func(c byte) string { return fmt.Sprint(c) }), "."},
	// Python's quote(safe=''), Go's QueryEscape.
	{"url", urlPieces("-_.~"), ""},
	// JavaScript's encodeURIComponent.
	{"url-js", urlPieces("-_.!~*'()"), ""},
	// Python's quote with its default safe='/'.
	{"url-python", urlPieces("-_.~/"), ""},
	// JSON with '/' escaped (PHP's json_encode, Java's org.json).
	{"json-slash", perByte(func(c byte) string {
		if c == '/' {
			return `\/`
		}
		return string(c)
	}), ""},
	{"printf %q", bashQuotePieces, ""},
	{"python list", perByte(func(c byte) string { return "'" + string(c) + "'" }), ","},
}

// base64Windows are the base64 characters that carry only bits of the
// value, for the value after 0, 1 or 2 other bytes, in the standard and URL
// alphabets, normalised; a run of m = floor(4k/3) of them (16 for k = 12)
// stands for k bytes. k bytes at alignment 0 are m such characters; k-1
// bytes are never m (decoding at an unknown alignment is hard).
func base64Windows(v string, k int) (pure []string, m int) {
	m = 4 * k / 3
	for p := 0; p < 3; p++ {
		in := strings.Repeat("\x00", p) + v
		lo := (8*p + 5) / 6
		hi := 8 * len(in) / 6
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			s := enc.EncodeToString([]byte(in))
			if hi-lo >= m {
				pure = append(pure, leakNormalise(s[lo:hi]))
			}
		}
	}
	return pure, m
}

// A leak is the longest run of the value found in one form.
type leak struct {
	form string
	run  int    // value bytes (base64: base64 characters)
	at   int    // offset in the value (base64: in the encoding)
	text string // what was found, normalised
}

func (l leak) String() string {
	if strings.HasPrefix(l.form, "base64") {
		return fmt.Sprintf("%s: %d chars (~%d bytes) %q", l.form, l.run, l.run*3/4, l.text)
	}
	return fmt.Sprintf("%s: %d bytes at %d %q", l.form, l.run, l.at, l.text)
}

// findLeaks returns, per form, the longest run of at least k bytes of
// sec's value (m base64 characters) that out carries, as it is or as a
// terminal shows it (termRender).
func findLeaks(out string, sec leakSecret) []leak {
	views := []string{leakNormalise(out)}
	if t := leakNormalise(termRender(out)); t != views[0] {
		views = append(views, t)
	}
	v := sec.value
	k := leakThreshold(len(v))
	var leaks []leak
	// longest returns the longest run of k or more pieces of p (joined by
	// sep) in a view.
	longest := func(name string, p []string, sep string, k int) leak {
		best := leak{form: name}
		for _, n := range views {
			for i := 0; i+k <= len(p); i++ {
				j := i + k
				if !strings.Contains(n, strings.Join(p[i:j], sep)) {
					continue
				}
				for j < len(p) && strings.Contains(n, strings.Join(p[i:j+1], sep)) {
					j++
				}
				if j-i > best.run {
					best.run, best.at, best.text = j-i, i, strings.Join(p[i:j], sep)
				}
			}
		}
		return best
	}
	for _, f := range leakForms {
		p := f.pieces(v)
		for i := range p {
			p[i] = leakNormalise(p[i])
		}
		if best := longest(f.name, p, leakNormalise(f.sep), k); best.run > 0 {
			leaks = append(leaks, best)
		}
	}
	pure, m := base64Windows(v, k)
	best := leak{form: "base64"}
	for _, s := range pure {
		if l := longest("base64", strings.Split(s, ""), "", m); l.run > best.run {
			best = l
		}
	}
	if best.run > 0 {
		leaks = append(leaks, best)
	}
	return dropShadowed(leaks)
}

// dropShadowed drops a leak whose text another one already shows (url or
// %q of letters and digits is raw); of equal ones the first stays.
func dropShadowed(ls []leak) []leak {
	var out []leak
	for i, l := range ls {
		shadowed := false
		for j, m := range ls {
			if j != i && strings.Contains(m.text, l.text) && (len(m.text) > len(l.text) || j < i) {
				shadowed = true
				break
			}
		}
		if !shadowed {
			out = append(out, l)
		}
	}
	return out
}

// newLeakSecret draws a random value of n bytes of letters and digits;
// with punct, every punctuation byte of it once (so each escaping rule is
// exercised on every run) and letters and digits for the rest, shuffled.
func newLeakSecret(t testing.TB, name string, n int, punct string) leakSecret {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	pick := func(max int) int {
		x, err := rand.Int(rand.Reader, big.NewInt(int64(max)))
		if err != nil {
			t.Fatal(err)
		}
		return int(x.Int64())
	}
	for {
		b := []byte(punct)
		for len(b) < n {
			b = append(b, alnum[pick(len(alnum))])
		}
		for i := len(b) - 1; i > 0; i-- {
			j := pick(i + 1)
			b[i], b[j] = b[j], b[i]
		}
		// A leading '-' would read as an option to some tools.
		if b[0] != '-' {
			return leakSecret{name, string(b)}
		}
	}
}

// Go renderings of the forms the e2e test makes real tools print, to test
// the checker against (the tools' exact layouts).

func goOD(b []byte) string { // od -An -tx1
	var s strings.Builder
	for i := 0; i < len(b); i += 16 {
		for _, c := range b[i:min(i+16, len(b))] {
			fmt.Fprintf(&s, " %02x", c)
		}
		s.WriteString("\n")
	}
	return s.String()
}

func goXXD(b []byte) string { // xxd
	var s strings.Builder
	for i := 0; i < len(b); i += 16 {
		line := b[i:min(i+16, len(b))]
		fmt.Fprintf(&s, "%08x: ", i)
		for j := 0; j < 16; j++ {
			if j < len(line) {
				fmt.Fprintf(&s, "%02x", line[j])
			} else {
				s.WriteString("  ")
			}
			if j%2 == 1 {
				s.WriteString(" ")
			}
		}
		fmt.Fprintf(&s, " %s\n", line)
	}
	return s.String()
}

func goHexdumpC(b []byte) string { // hexdump -C
	var s strings.Builder
	for i := 0; i < len(b); i += 16 {
		line := b[i:min(i+16, len(b))]
		fmt.Fprintf(&s, "%08x  ", i)
		for j := 0; j < 16; j++ {
			if j < len(line) {
				fmt.Fprintf(&s, "%02x ", line[j])
			} else {
				s.WriteString("   ")
			}
			if j == 7 {
				s.WriteString(" ")
			}
		}
		fmt.Fprintf(&s, " |%s|\n", line)
	}
	return s.String()
}

func wrap(s string, w int) string {
	var b strings.Builder
	for i := 0; i < len(s); i += w {
		b.WriteString(s[i:min(i+w, len(s))])
		b.WriteString("\n")
	}
	return b.String()
}

func utf16(s string, be bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if be {
			b.WriteByte(0)
			b.WriteByte(s[i])
		} else {
			b.WriteByte(s[i])
			b.WriteByte(0)
		}
	}
	return b.String()
}

func reverse(s string) string {
	b := []byte(s)
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return string(b)
}

func joinBytes(s, sep string) string {
	p := make([]string, len(s))
	for i := range s {
		p[i] = s[i : i+1]
	}
	return strings.Join(p, sep)
}

func mapBytes(s string, f func(c byte) string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteString(f(s[i]))
	}
	return b.String()
}

// goForms renders v in every form of the e2e table.
func goForms(v string) map[string]string {
	h := len(v) / 2
	b64 := base64.StdEncoding.EncodeToString
	u64 := base64.URLEncoding.EncodeToString
	return map[string]string{
		"raw":          v + "\n",
		"upper":        strings.ToUpper(v),
		"swapcase":     mapBytes(v, swapCase),
		"reversed":     reverse(v),
		"od":           goOD([]byte(v)),
		"od upper":     strings.ToUpper(goOD([]byte(v))),
		"xxd -p":       wrap(fmt.Sprintf("%x", v), 60),
		"xxd":          goXXD([]byte(v)),
		"hexdump -C":   goHexdumpC([]byte(v)),
		"%XX":          mapBytes(v, func(c byte) string { return fmt.Sprintf("%%%02X", c) }),
		`\xNN`:         mapBytes(v, func(c byte) string { return fmt.Sprintf(`\x%02x`, c) }),
		`\u00NN`:       mapBytes(v, func(c byte) string { return fmt.Sprintf(`\u%04x`, c) }),
		"base64":       wrap(b64([]byte(v)), 76),
		"base64 -w8":   wrap(b64([]byte(v)), 8),
		"fold -w5":     wrap(b64([]byte(v)), 5),
		"base64 x":     b64([]byte("x" + v)),
		"base64 xy w8": wrap(b64([]byte("xy"+v)), 8),
		"base64url x":  u64([]byte("x" + v)),
		"base64 user:": b64([]byte("user:" + v + ":tail")),
		"url":          url.QueryEscape(v),
		"url-js":       strings.NewReplacer("%21", "!", "%2A", "*", "%27", "'", "%28", "(", "%29", ")").Replace(url.QueryEscape(v)),
		"json":         `"` + v + `"`,
		"json-slash":   `"` + strings.ReplaceAll(v, "/", `\/`) + `"`,
		"url-python":   strings.ReplaceAll(strings.ReplaceAll(url.QueryEscape(v), "%2F", "/"), "+", "%20"),
		"printf %q":    strings.Join(bashQuotePieces(v), ""),
		"python list":  "['" + joinBytes(v, "', '") + "']",
		"utf-16le":     utf16(v, false),
		"utf-16be":     "\xfe\xff" + utf16(v, true),
		"space":        joinBytes(v, " "),
		"tab":          joinBytes(v, "\t"),
		"nul":          joinBytes(v, "\x00"),
		"lf":           joinBytes(v, "\n"),
		"crlf":         joinBytes(v, "\r\n"),
		"sgr":          joinBytes(v, "\x1b[31m"),
		"sgr 2":        joinBytes(v, "\x1b[1;38;5;208m"),
		"two lines":    v[:h] + "\n" + v[h:] + "\n",
		"cr":           v[:h] + "\r" + v[h:],
		"streams":      v[:h] + v[h:], // stdout then stderr, as the e2e test joins them
		"in text":      "token=" + v + "; done",
		// issue 15's review
		"X backspace":      mapBytes(v, func(c byte) string { return "X\b" + string(c) }),
		"overstrike":       mapBytes(v, func(c byte) string { return string(c) + "\b" + string(c) }),
		"zero-width space": joinBytes(v, "\u200b"),
		"no-break space":   joinBytes(v, "\u00a0"),
		"fullwidth":        mapBytes(v, func(c byte) string { return string(rune(c) + 0xfee0) }),
		`\u{NN}`:           mapBytes(v, func(c byte) string { return fmt.Sprintf(`\u{%x}`, c) }),
		"dotted decimal":   strings.TrimSuffix(mapBytes(v, func(c byte) string { return fmt.Sprintf("%d.", c) }), "."),
	}
}

func swapCase(c byte) string {
	if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' {
		c ^= 0x20
	}
	return string(c)
}

// '/' is kept raw by Python's quote and escaped as \/ by some JSON encoders.
var testPunct = "!@#%^&*()-_=+/"

func TestLeakThreshold(t *testing.T) {
	for n, k := range map[int]int{6: 6, 7: 7, 8: 8, 10: 8, 15: 8, 16: 8, 17: 9, 23: 12, 24: 12, 40: 12, 4096: 12} {
		if got := leakThreshold(n); got != k {
			t.Errorf("n=%d: k=%d, want %d", n, got, k)
		}
	}
}

func TestLeakNormalise(t *testing.T) {
	in := "A b\tC\x00d\r\ne\x1b[31mF\x1b[1;38;5;208mg\x1b[0mH\x1b[K"
	if got := leakNormalise(in); got != "abcdefgh" {
		t.Fatalf("%q", got)
	}
	if got := leakNormalise(termRender("X\ba_\bb#Q\b\bc\u200bd\u00a0ｅＦ")); got != "abcdef" {
		t.Fatalf("%q", got)
	}
}

// The checker finds every form of the table in the layout the tool prints,
// for all three kinds of secret; and nothing when the runs are one byte
// short of k, for another value, or after redaction.
func TestLeakChecker(t *testing.T) {
	secrets := []leakSecret{
		newLeakSecret(t, "LONG", 40, ""),
		newLeakSecret(t, "PUNCT", 30, testPunct),
		newLeakSecret(t, "SHORT", 10, ""),
	}
	for _, sec := range secrets {
		v := sec.value
		k := leakThreshold(len(v))
		other := newLeakSecret(t, "X", len(v), map[bool]string{true: testPunct}[sec.name == "PUNCT"])
		for name, out := range goForms(v) {
			if ls := findLeaks(out, sec); len(ls) == 0 {
				t.Errorf("%s %s: %q not found", sec.name, name, out)
			}
			// The same form of another value of the same shape.
			if ls := findLeaks(goForms(other.value)[name], sec); len(ls) != 0 {
				t.Errorf("%s %s of another value: %v", sec.name, name, ls)
			}
		}
		// k-1 bytes in any form are allowed; k are not. Layouts with other
		// text next to the part are left out: a character of it (the last
		// hex digit before xxd's text column, "=" of "token=", a base64
		// character mixing other bytes with the part's) can equal the
		// value's next one by chance, and the normalised run is then k.
		for _, part := range []string{v[:k-1], v[len(v)-k+1:], v[3 : 3+k-1]} {
			for name, out := range goForms(part) {
				if strings.Contains(name, " x") || name == "base64 user:" || name == "xxd" || name == "hexdump -C" || name == "in text" {
					continue
				}
				if ls := findLeaks(out, sec); len(ls) != 0 {
					t.Errorf("%s %s of %d bytes: %v", sec.name, name, len(part), ls)
				}
			}
		}
		for _, part := range []string{v[:k], v[len(v)-k:], v[2 : 2+k]} {
			for name, out := range goForms(part) {
				if strings.HasPrefix(name, "base64") || name == "fold -w5" {
					continue // k bytes fill m characters only at one alignment, below
				}
				if ls := findLeaks(out, sec); len(ls) == 0 {
					t.Errorf("%s %s of %d bytes not found: %q", sec.name, name, len(part), out)
				}
			}
		}
		// Any k bytes, encoded on their own (so starting a base64 group).
		for i := 0; i+k <= len(v); i++ {
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawURLEncoding} {
				if ls := findLeaks(enc.EncodeToString([]byte(v[i:i+k])), sec); len(ls) == 0 {
					t.Errorf("%s: base64 of v[%d:%d] not found", sec.name, i, i+k)
				}
			}
		}
		// Redacted output, and runs broken by a redaction marker.
		red := "[REDACTED:" + sec.name + "]"
		for _, out := range []string{red, v[:k-1] + red + v[k:min(len(v), 2*k-1)], v[:k/2] + red + v[k/2:min(len(v), k/2+k-1)]} {
			if ls := findLeaks(out, sec); len(ls) != 0 {
				t.Errorf("%s: %q: %v", sec.name, out, ls)
			}
		}
		// The longest run is what is reported.
		r := min(k+3, len(v)-1)
		if ls := findLeaks("<"+v[1:1+r]+">", sec); len(ls) != 1 || ls[0].form != "raw" || ls[0].run != r || ls[0].at != 1 {
			t.Errorf("%s: %v", sec.name, ls)
		}
	}
}

// bashQuotePieces is what bash's printf %q prints (when bash is here).
func TestBashQuotePieces(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, v := range []string{"#a!b@c#d%e^f&g*h(i)j-k_l=m+n~o=~p", "~x", newLeakSecret(t, "P", 30, testPunct).value} {
		out, err := exec.Command("bash", "-c", `printf %q "$1"`, "_", v).Output()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(bashQuotePieces(v), ""); got != string(out) {
			t.Errorf("%q: bash %q, ours %q", v, out, got)
		}
	}
}
