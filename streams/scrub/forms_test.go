package scrub

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

// The known-value forms of issue 14 as programs print them, each with its
// own leak check: after normalising the output as a terminal shows it
// (bytes < 0x21 and CSI sequences dropped, ASCII lower case), is there a
// run of k = KnownRun(len(v)) consecutive value bytes in that form? The
// checks decode or rebuild the form here, independently of kvforms.go.

// kvSeps are the single separators programs and attackers put between
// characters.
var kvSeps = []string{" ", "\t", "\x00", "\r", "\n", "\x1b[31m"}

// printedForm prints a value in one form (ok false: the form does not
// apply to the value, e.g. UTF-16 of invalid UTF-8) and checks an output
// for a run of k value bytes in that form.
type printedForm struct {
	name  string
	print func(rnd *rand.Rand, v string) (string, bool)
	leak  func(out []byte, v string) bool
}

var printedForms = []printedForm{
	{"plain", func(_ *rand.Rand, v string) (string, bool) { return v, true }, plainLeak},
	{"reversed", func(_ *rand.Rand, v string) (string, bool) { return reverseUnits(v), true }, reversedLeak},
	{"hex-sep", printHexSep, hexLeak},
	{"base64-wrapped", printBase64Wrapped, base64Leak},
	{"sep-each", printSepEach, plainLeak},
	{"utf16", printUTF16, utf16Leak},
	{"percent", printPercent, percentLeak},
	{"split-line", printSplitLine, plainLeak},
	{"substring", printSubstring, plainLeak},
	{"py-list", printPyList, pyListLeak},
}

func formByName(name string) printedForm {
	for _, f := range printedForms {
		if f.name == name {
			return f
		}
	}
	panic("no form " + name)
}

// leakView is out as the checks read it: separator bytes (< 0x21) and CSI
// sequences (ESC '[' 0x20-0x3f* 0x40-0x7e, at most 32 bytes; the engine's
// limit) dropped, ASCII lowered if lower. Like the engine, a run of more
// than 32 dropped bytes breaks a run (0x01 stands for it).
func leakView(out []byte, lower bool) []byte {
	var b []byte
	gap := 0
	for i := 0; i < len(out); {
		c := out[i]
		if c == 0x1b && i+1 < len(out) && out[i+1] == '[' {
			j := i + 2
			for j < len(out) && j < i+32 && out[j] >= 0x20 && out[j] <= 0x3f {
				j++
			}
			if j < len(out) && j < i+32 && out[j] >= 0x40 && out[j] <= 0x7e {
				gap += j + 1 - i
				i = j + 1
				continue
			}
		}
		if c < 0x21 {
			gap++
			i++
			continue
		}
		if gap > 32 && len(b) > 0 {
			b = append(b, 0x01)
		}
		gap = 0
		if lower && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
		i++
	}
	return b
}

// piecesLeak: view holds k consecutive pieces (pieces[i] is value byte i
// in the form) joined by sep, normalised.
func piecesLeak(view []byte, pieces []string, sep string, k int) bool {
	for i := 0; i+k <= len(pieces); i++ {
		run := leakView([]byte(strings.Join(pieces[i:i+k], sep)), true)
		if len(run) > 0 && bytes.Contains(view, run) {
			return true
		}
	}
	return false
}

func perByteOf(v string, enc func(c byte) string) []string {
	p := make([]string, len(v))
	for i := range len(v) {
		p[i] = enc(v[i])
	}
	return p
}

// perRuneOf gives a character's encoding to its first byte ("" to the
// others; an invalid byte is a character of its own).
func perRuneOf(v string, enc func(r rune, b string) string) []string {
	var p []string
	for i := 0; i < len(v); {
		r, n := utf8.DecodeRuneInString(v[i:])
		p = append(p, enc(r, v[i:i+n]))
		for range n - 1 {
			p = append(p, "")
		}
		i += n
	}
	return p
}

func plainLeak(out []byte, v string) bool {
	return piecesLeak(leakView(out, true), perByteOf(v, func(c byte) string { return string(c) }), "", KnownRun(len(v)))
}

func reversedLeak(out []byte, v string) bool {
	p := perRuneOf(v, func(_ rune, b string) string { return b })
	for i, j := 0, len(p)-1; i < j; i, j = i+1, j-1 {
		p[i], p[j] = p[j], p[i]
	}
	return piecesLeak(leakView(out, true), p, "", KnownRun(len(v)))
}

func hexLeak(out []byte, v string) bool {
	return piecesLeak(leakView(out, true), perByteOf(v, func(c byte) string { return fmt.Sprintf("%02x", c) }), "", KnownRun(len(v)))
}

func percentLeak(out []byte, v string) bool {
	return piecesLeak(leakView(out, true), perByteOf(v, func(c byte) string { return fmt.Sprintf("%%%02x", c) }), "", KnownRun(len(v)))
}

func utf16Leak(out []byte, v string) bool {
	view := leakView(out, true)
	for _, be := range []bool{false, true} {
		p := perRuneOf(v, func(r rune, _ string) string { return string(utf16Bytes([]rune{r}, be)) })
		if piecesLeak(view, p, "", KnownRun(len(v))) {
			return true
		}
	}
	return false
}

func pyListLeak(out []byte, v string) bool {
	view := leakView(out, true)
	k := KnownRun(len(v))
	if !utf8.ValidString(v) {
		return piecesLeak(view, perByteOf(v, func(c byte) string { return fmt.Sprint(c) }), ", ", k)
	}
	return piecesLeak(view, perRuneOf(v, func(r rune, _ string) string { return pyCharRepr(r) }), ", ", k)
}

// base64Leak decodes every base64 run of the view (case kept), in each
// alphabet and at each of the four offsets, and looks for k consecutive
// value bytes in what it decodes to.
func base64Leak(out []byte, v string) bool {
	view := leakView(out, false)
	k := KnownRun(len(v))
	for _, a := range []struct {
		enc   *base64.Encoding
		extra string
	}{{base64.RawStdEncoding, "+/"}, {base64.RawURLEncoding, "-_"}} {
		in := func(c byte) bool {
			return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.IndexByte(a.extra, c) >= 0
		}
		for i := 0; i < len(view); {
			if !in(view[i]) {
				i++
				continue
			}
			j := i
			for j < len(view) && in(view[j]) {
				j++
			}
			for off := 0; off < 4 && i+off < j; off++ {
				r := view[i+off : j]
				if len(r)%4 == 1 {
					r = r[:len(r)-1]
				}
				d := make([]byte, a.enc.DecodedLen(len(r)))
				n, _ := a.enc.Decode(d, r)
				for x := 0; x+k <= len(v); x++ {
					if bytes.Contains(d[:n], []byte(v[x:x+k])) {
						return true
					}
				}
			}
			i = j
		}
	}
	return false
}

// reverseUnits reverses v by character as rev(1) does (an invalid byte is
// a character).
func reverseUnits(v string) string {
	p := perRuneOf(v, func(_ rune, b string) string { return b })
	var b strings.Builder
	for i := len(p) - 1; i >= 0; i-- {
		b.WriteString(p[i])
	}
	return b.String()
}

func pickSep(rnd *rand.Rand) string { return kvSeps[rnd.IntN(len(kvSeps))] }

// printHexSep: hex per byte in one case, a random separator (or none)
// after each byte, as od -tx1, xxd or hexdump print.
func printHexSep(rnd *rand.Rand, v string) (string, bool) {
	f := "%02x"
	if rnd.IntN(2) == 0 {
		f = "%02X"
	}
	var b strings.Builder
	for i := range len(v) {
		if i > 0 && rnd.IntN(4) != 0 {
			b.WriteString(pickSep(rnd))
		}
		fmt.Fprintf(&b, f, v[i])
	}
	return b.String(), true
}

// printBase64Wrapped: base64 (either alphabet, padded or not) of the value
// after 0..5 other bytes and before 0..3, wrapped every 1..76 characters (a
// quarter of the time not at all).
func printBase64Wrapped(rnd *rand.Rand, v string) (string, bool) {
	pre := "user:"[:rnd.IntN(6)]
	post := "\n\x00z"[:rnd.IntN(4)]
	encs := []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding}
	s := encs[rnd.IntN(4)].EncodeToString([]byte(pre + v + post))
	if rnd.IntN(4) == 0 {
		return s, true
	}
	return wrap(s, 1+rnd.IntN(76), "\n"), true
}

func wrap(s string, w int, nl string) string {
	var b strings.Builder
	for len(s) > w {
		b.WriteString(s[:w])
		b.WriteString(nl)
		s = s[w:]
	}
	b.WriteString(s)
	return b.String()
}

// printSepEach: a separator between every two bytes, one kind for all or a
// random one each time.
func printSepEach(rnd *rand.Rand, v string) (string, bool) {
	one := ""
	if rnd.IntN(2) == 0 {
		one = pickSep(rnd)
	}
	var b strings.Builder
	for i := range len(v) {
		if i > 0 {
			if one != "" {
				b.WriteString(one)
			} else {
				b.WriteString(pickSep(rnd))
			}
		}
		b.WriteByte(v[i])
	}
	return b.String(), true
}

func utf16Bytes(rs []rune, be bool) []byte {
	var b []byte
	for _, w := range utf16.Encode(rs) {
		if be {
			b = append(b, byte(w>>8), byte(w))
		} else {
			b = append(b, byte(w), byte(w>>8))
		}
	}
	return b
}

// printUTF16: iconv -t UTF-16LE/BE, or UTF-16 with a byte order mark.
func printUTF16(rnd *rand.Rand, v string) (string, bool) {
	if !utf8.ValidString(v) {
		return "", false
	}
	be := rnd.IntN(2) == 0
	rs := []rune(v)
	if rnd.IntN(3) == 0 {
		rs = append([]rune{0xfeff}, rs...)
	}
	return string(utf16Bytes(rs, be)), true
}

func printPercent(rnd *rand.Rand, v string) (string, bool) {
	f := "%%%02x"
	if rnd.IntN(2) == 0 {
		f = "%%%02X"
	}
	var b strings.Builder
	for i := range len(v) {
		fmt.Fprintf(&b, f, v[i])
	}
	return b.String(), true
}

// printSplitLine: the value broken by a newline (LF, CRLF or a bare CR) at
// a random inner position.
func printSplitLine(rnd *rand.Rand, v string) (string, bool) {
	j := 1 + rnd.IntN(len(v)-1)
	return v[:j] + []string{"\n", "\r\n", "\r"}[rnd.IntN(3)] + v[j:], true
}

// printSubstring: k or more consecutive bytes of the value (k[3:] and the
// like).
func printSubstring(rnd *rand.Rand, v string) (string, bool) {
	k := KnownRun(len(v))
	l := k + rnd.IntN(len(v)-k+1)
	i := rnd.IntN(len(v) - l + 1)
	return v[i : i+l], true
}

// printPyList: Python's print(list(v)); for bytes that are not UTF-8,
// print(list(v.encode())) (a list of numbers).
func printPyList(_ *rand.Rand, v string) (string, bool) {
	var el []string
	if utf8.ValidString(v) {
		for _, r := range v {
			el = append(el, pyCharRepr(r))
		}
	} else {
		for i := range len(v) {
			el = append(el, fmt.Sprint(v[i]))
		}
	}
	return "[" + strings.Join(el, ", ") + "]", true
}

// pyCharRepr is Python's repr of a one-character string.
func pyCharRepr(r rune) string {
	switch {
	case r == '\'':
		return `"'"`
	case r == '\\':
		return `'\\'`
	case r == '\n':
		return `'\n'`
	case r == '\r':
		return `'\r'`
	case r == '\t':
		return `'\t'`
	case r < 0x20 || r == 0x7f:
		return fmt.Sprintf(`'\x%02x'`, r)
	}
	return "'" + string(r) + "'"
}

var (
	formsOnce   sync.Once
	formsSetV   *Set
	formsValues map[string]string
)

// formsSet is the Set of the form tests (built once: compiling the rules
// takes seconds under the race detector): the rules and, as known values,
// the three values of the table tests (40 letters and digits, 30
// characters with punctuation, quotes and a backslash but no separator,
// and 10 characters) and four more for the tests of known engine bugs.
func formsSet(t *testing.T) (*Set, map[string]string) {
	t.Helper()
	formsOnce.Do(func() {
		rnd := rand.New(rand.NewPCG(14, 0))
		formsValues = map[string]string{
			"long":  randString(rnd, alnum, 40),
			"punct": `Qx7#p'L9"m\z2&Kd(4)Rw;8+Tf/v=J`,
			"short": randString(rnd, alnum, 10),
			"db":    "Zq9vX2pLmN4t",
			"six":   "s3cr3t",
			"seven": "h7Gk2mP",
			"bin":   "\xfb\xff\xbf\x3e\x3f\xfe\x00\x80",
		}
		s, err := NewSet(loadRules(t))
		if err == nil {
			s, err = s.WithValues(formsValues)
		}
		if err != nil {
			panic(err)
		}
		formsSetV = s
	})
	return formsSetV, formsValues
}

// tableValues are the three values every form is tried with.
var tableValues = []string{"long", "punct", "short"}

// formCases prints v in every form, deterministically enumerating the
// layouts that matter (every separator, wrap widths and alignments, split
// positions) plus a few random ones.
func formCases(rnd *rand.Rand, v string) []struct{ form, text string } {
	var cs []struct{ form, text string }
	add := func(form, text string) { cs = append(cs, struct{ form, text string }{form, text}) }
	add("plain", v)
	add("reversed", reverseUnits(v))
	for _, sep := range append([]string{""}, kvSeps...) {
		var b strings.Builder
		for i := range len(v) {
			if i > 0 {
				b.WriteString(sep)
			}
			fmt.Fprintf(&b, "%02x", v[i])
		}
		add("hex-sep", b.String())
		add("hex-sep", strings.ToUpper(b.String()))
		if sep != "" {
			add("sep-each", strings.Join(strings.Split(v, ""), sep))
		}
	}
	for range 3 {
		s, _ := printHexSep(rnd, v)
		add("hex-sep", s)
		s, _ = printSepEach(rnd, v)
		add("sep-each", s)
	}
	for _, w := range []int{1, 2, 3, 4, 5, 7, 8, 16, 60, 64, 76} {
		for pre := range 3 {
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawURLEncoding} {
				add("base64-wrapped", wrap(enc.EncodeToString([]byte("abc"[:pre]+v)), w, "\n"))
			}
		}
	}
	for _, be := range []bool{false, true} {
		add("utf16", string(utf16Bytes([]rune(v), be)))
		add("utf16", string(utf16Bytes(append([]rune{0xfeff}, []rune(v)...), be)))
	}
	add("percent", strings.ToLower(mustPrint(printPercent, rnd, v)))
	add("percent", strings.ToUpper(mustPrint(printPercent, rnd, v)))
	for j := 1; j < len(v); j++ {
		add("split-line", v[:j]+[]string{"\n", "\r\n", "\r"}[j%3]+v[j:])
	}
	k := KnownRun(len(v))
	for i := 0; i+k <= len(v); i++ {
		add("substring", v[i:i+k])
	}
	for range 4 {
		add("substring", mustPrint(printSubstring, rnd, v))
	}
	add("py-list", mustPrint(printPyList, rnd, v))
	return cs
}

func mustPrint(p func(*rand.Rand, string) (string, bool), rnd *rand.Rand, v string) string {
	s, ok := p(rnd, v)
	if !ok {
		panic("form does not apply")
	}
	return s
}

// TestFormsRedacted: every form of each value, amid other output, is
// redacted with the value's label and shows no run of k value bytes in
// that form or plainly; streamed in random splits the output equals Redact
// of the whole, and flushed after every write it differs only as Flush
// may (flushEquivalent) and still shows no run.
func TestFormsRedacted(t *testing.T) {
	rnd := rand.New(rand.NewPCG(14, 1))
	s, values := formsSet(t)
	for _, name := range tableValues {
		v := values[name]
		label := []byte("[REDACTED:" + name + "]")
		for _, c := range formCases(rnd, v) {
			f := formByName(c.form)
			if !f.leak([]byte(c.text), v) {
				t.Fatalf("%s %s: the check misses the form itself: %q", name, c.form, c.text)
			}
			in := []byte("$ ./show\n" + c.text + "\n$ ")
			whole := s.Redact(in)
			if !bytes.Contains(whole, label) || f.leak(whole, v) || plainLeak(whole, v) {
				t.Fatalf("%s %s: %q -> %q", name, c.form, in, whole)
			}
			if got := stream(t, s, in, randomSizes(rnd, len(in)), false); !bytes.Equal(got, whole) {
				t.Fatalf("%s %s: streamed %q != whole %q", name, c.form, got, whole)
			}
			got := stream(t, s, in, randomSizes(rnd, len(in)), true)
			if err := flushEquivalent(s, in, got); err != nil {
				t.Fatalf("%s %s: flushed %q (whole %q): %v", name, c.form, got, whole, err)
			}
			if f.leak(got, v) || plainLeak(got, v) {
				t.Fatalf("%s %s: flushed output leaks: %q", name, c.form, got)
			}
		}
	}
}

// passes checks that in comes out unchanged, whole and streamed (flushed
// after every write or not).
func passes(t *testing.T, s *Set, rnd *rand.Rand, what string, in []byte) {
	t.Helper()
	if out := s.Redact(in); !bytes.Equal(out, in) {
		t.Fatalf("%s changed: %q -> %q", what, in, out)
	}
	for _, flush := range []bool{false, true} {
		if out := stream(t, s, in, randomSizes(rnd, len(in)), flush); !bytes.Equal(out, in) {
			t.Fatalf("%s changed streamed (flush %v): %q -> %q", what, flush, in, out)
		}
	}
}

// TestFormsOtherValuePasses: every form of a different random value of
// the same kind passes unchanged.
func TestFormsOtherValuePasses(t *testing.T) {
	rnd := rand.New(rand.NewPCG(14, 2))
	s, _ := formsSet(t)
	others := map[string]string{
		"long":  randString(rnd, alnum, 40),
		"punct": randString(rnd, alnum+`#'"\&()+;/=`, 30),
		"short": randString(rnd, alnum, 10),
	}
	for name, w := range others {
		for _, c := range formCases(rnd, w) {
			passes(t, s, rnd, name+" "+c.form, []byte("$ ./show\n"+c.text+"\n$ "))
		}
	}
}

// TestFormsShortRunPasses: k-1 consecutive characters of a value, at
// every offset, amid text, pass unchanged.
func TestFormsShortRunPasses(t *testing.T) {
	rnd := rand.New(rand.NewPCG(14, 3))
	s, values := formsSet(t)
	for _, name := range tableValues {
		v := values[name]
		k := KnownRun(len(v))
		for i := 0; i+k-1 <= len(v); i++ {
			// neighbours that do not continue the run
			pre, post := "<", ">"
			if i > 0 && v[i-1] == '<' {
				pre = "|"
			}
			if i+k-1 < len(v) && v[i+k-1] == '>' {
				post = "|"
			}
			in := "part " + pre + v[i:i+k-1] + post + " of it\n"
			passes(t, s, rnd, fmt.Sprintf("%s[%d:%d]", name, i, i+k-1), []byte(in))
		}
	}
}

// TestFormsOrdinaryOutputPasses: output full of separators and escape
// sequences (ls --color, od and hexdump of random bytes, a progress bar)
// passes unchanged.
func TestFormsOrdinaryOutputPasses(t *testing.T) {
	rnd := rand.New(rand.NewPCG(14, 4))
	s, _ := formsSet(t)
	colors := []string{"01;34", "01;32", "01;36", "00", "40;33;01", "01;35", "30;42"}
	var ls strings.Builder
	for i := range 300 {
		fmt.Fprintf(&ls, "\x1b[0m\x1b[%sm%s\x1b[0m", colors[rnd.IntN(len(colors))], randString(rnd, "abcdefghijklmnopqrstuvwxyz0123456789_-.", 3+rnd.IntN(14)))
		if i%6 == 5 {
			ls.WriteString("\n")
		} else {
			ls.WriteString(strings.Repeat(" ", 1+rnd.IntN(4)))
		}
	}
	passes(t, s, rnd, "ls --color", []byte(ls.String()))

	raw := make([]byte, 4096)
	for i := range raw {
		raw[i] = byte(rnd.IntN(256))
	}
	var od, odc, hd strings.Builder
	for off := 0; off < len(raw); off += 16 {
		line := raw[off : off+16]
		fmt.Fprintf(&od, "%07o", off)
		for _, c := range line {
			fmt.Fprintf(&od, " %02x", c)
		}
		od.WriteString("\n")
		fmt.Fprintf(&odc, "%07o", off)
		for _, c := range line {
			switch {
			case c == 0:
				odc.WriteString("  \\0")
			case c >= 0x21 && c < 0x7f:
				fmt.Fprintf(&odc, "   %c", c)
			default:
				fmt.Fprintf(&odc, " %03o", c)
			}
		}
		odc.WriteString("\n")
		fmt.Fprintf(&hd, "%08x ", off)
		for i, c := range line {
			if i == 8 {
				hd.WriteString(" ")
			}
			fmt.Fprintf(&hd, " %02x", c)
		}
		hd.WriteString("  |")
		for _, c := range line {
			if c >= 0x20 && c < 0x7f {
				hd.WriteByte(c)
			} else {
				hd.WriteByte('.')
			}
		}
		hd.WriteString("|\n")
	}
	passes(t, s, rnd, "od -tx1", []byte(od.String()))
	passes(t, s, rnd, "od -c", []byte(odc.String()))
	passes(t, s, rnd, "hexdump -C", []byte(hd.String()))

	var bar strings.Builder
	for i := range 101 {
		fmt.Fprintf(&bar, "\r\x1b[2K\x1b[1;32m%s\x1b[0m%s %3d%% \x1b[36m%d/100\x1b[0m", strings.Repeat("#", i/4), strings.Repeat(" ", 25-i/4), i, i)
	}
	passes(t, s, rnd, "progress bar", []byte(bar.String()))
}

// TestLeakChecks: the per-form checks find a run of exactly k value bytes
// in their form through separators and escape sequences, and nothing in
// k-1 bytes, so the tests above can fail.
func TestLeakChecks(t *testing.T) {
	rnd := rand.New(rand.NewPCG(14, 5))
	v := randString(rnd, alnum, 40)
	k := KnownRun(len(v))
	for _, f := range printedForms {
		k := k
		if f.name == "dotted" {
			k++ // its check's run (forms_terminal_test.go)
		}
		for _, n := range []int{k, k - 1} {
			// the run alone, printed in the form, with separators sprinkled
			text, ok := f.print(rnd, v[5:5+n])
			if !ok {
				t.Fatalf("%s does not apply", f.name)
			}
			if f.name == "substring" {
				text = v[5 : 5+n]
			}
			var b []byte
			inSeq := false
			for i := range len(text) {
				b = append(b, text[i])
				if text[i] == 0x1b {
					inSeq = true
				} else if inSeq && text[i] >= 0x40 && text[i] != '[' {
					inSeq = false
				} else if !inSeq && f.name != "utf16" && f.name != "base64-wrapped" && !noSprinkle[f.name] && rnd.IntN(3) == 0 {
					b = append(b, pickSep(rnd)...)
				}
			}
			if got := f.leak(b, v); got != (n == k) {
				t.Errorf("%s: %d bytes %q: leak %v", f.name, n, b, got)
			}
		}
	}
	// a long separator run breaks a run, as in the engine
	if plainLeak([]byte(v[:6]+strings.Repeat(" ", 33)+v[6:12]), v) {
		t.Error("a run across 33 separators")
	}
	if !plainLeak([]byte(v[:6]+"\x1b[1;31m"+strings.Repeat(" ", 25)+v[6:12]), v) {
		t.Error("no run across 32 separator bytes")
	}
}

// TestFormsListOfExactlyK: a list printed from exactly k bytes of a value
// has no separator after its last element, one character fewer than the
// k pieces of the form ("'c'," per byte): Python's list(v[i:i+k]) at every
// offset, list(v) of a value of k bytes (6 or 7), list(v.encode()) and a C
// array of an 8-byte value, and colon-separated hex of k bytes.
func TestFormsListOfExactlyK(t *testing.T) {
	s, values := formsSet(t)
	long, bin := values["long"], values["bin"]
	type tc struct{ name, v, in string }
	var cases []tc
	k := KnownRun(len(long))
	var passed []int
	for i := 0; i+k <= len(long); i++ {
		in := "k = " + mustPrint(printPyList, nil, long[i:i+k]) + "\n"
		if out := s.Redact([]byte(in)); pyListLeak(out, long) {
			passed = append(passed, i)
		}
	}
	if len(passed) > 0 {
		t.Errorf("list(long[i:i+%d]) passes for i in %v", k, passed)
	}
	var col []string
	for i := range k {
		col = append(col, fmt.Sprintf("%02x", long[i]))
	}
	cases = append(cases, tc{"long", long, strings.Join(col, ":")})
	cases = append(cases, tc{"six", "s3cr3t", mustPrint(printPyList, nil, "s3cr3t")},
		tc{"seven", "h7Gk2mP", mustPrint(printPyList, nil, "h7Gk2mP")},
		tc{"bin", bin, mustPrint(printPyList, nil, bin)})
	var ox []string
	for i := range len(bin) {
		ox = append(ox, fmt.Sprintf("0x%02x", bin[i]))
	}
	cases = append(cases, tc{"bin", bin, "{" + strings.Join(ox, ", ") + "}"})
	for _, c := range cases {
		out := s.Redact([]byte("k = " + c.in + "\n"))
		if !bytes.Contains(out, []byte("[REDACTED:"+c.name+"]")) {
			t.Errorf("%s: %q passes", c.name, out)
		}
	}
	// The same through Flush: a 12-byte value (k = 8) printed as a list
	// whole is redacted, but Flush after its first 8 elements releases
	// them (31 characters of the 32 that 8 elements take with their commas).
	var out bytes.Buffer
	w := s.NewWriter(&out)
	w.Write([]byte("['Z', 'q', '9', 'v', 'X', '2', 'p', 'L'"))
	w.Flush()
	w.Write([]byte(", 'm', 'N', '4', 't']\n"))
	w.Close()
	if plainLeak(out.Bytes(), "Zq9vX2pLmN4t") || pyListLeak(out.Bytes(), "Zq9vX2pLmN4t") {
		t.Errorf("flushed: %q", out.Bytes())
	}
}

// TestFormsOptionalFinalHeld: an escape sequence's final byte may be the
// first character of a match (the engine takes or skips it); a Writer
// must hold it at the end of a write as it holds a plain character, so
// that its output equals Redact of the whole.
func TestFormsOptionalFinalHeld(t *testing.T) {
	s, _ := formsSet(t)
	for _, p := range [][2]string{
		{"~ \x1b[0Z\n", "q9vX2pLmN4t"},
		{"\x1b[0Z\n", "q\n9\nv\nX\n2\np\nL\nm\nN\n4\nt"},
		{"\x1bZ ", "q9vX2pLmN4t"},
	} {
		in := []byte(p[0] + p[1])
		whole := s.Redact(in)
		if got := stream(t, s, in, []int{len(p[0]), len(p[1])}, false); !bytes.Equal(got, whole) {
			t.Errorf("%q then %q: %q, whole %q", p[0], p[1], got, whole)
		}
	}
	// Released, the final byte is missing from the next write's match: a
	// 6-byte value as %XX after ESC whose final is the first '%' passes
	// whole (17 characters left, m = 18).
	got := stream(t, s, []byte("\x1b%73%33%63%72%33%74"), []int{2, 18}, false)
	if percentLeak(got, "s3cr3t") {
		t.Errorf("ESC%% then 73%%33%%63%%72%%33%%74: %q", got)
	}
}

// TestFormsOptionalFinalTie: a plain character before an escape sequence
// whose final byte is the same character can begin the match (the final
// skipped) as well as the final itself. Redact starts the match at the
// plain one; a Writer, whatever the split, must not release it.
func TestFormsOptionalFinalTie(t *testing.T) {
	s, _ := formsSet(t)
	for _, in := range []string{
		"Z\x1b[Zq9vX2pLmN4t",
		"Z\x1b['Z', 'q', '9', 'v', 'X', '2', 'p', 'L', 'm', 'N', '4', 't']",
	} {
		whole := s.Redact([]byte(in))
		for i := 1; i < len(in); i++ {
			if got := stream(t, s, []byte(in), []int{i, len(in) - i}, false); !bytes.Equal(got, whole) {
				t.Errorf("%q then %q: %q, whole %q", in[:i], in[i:], got, whole)
				break
			}
		}
	}
}

// TestLongEscapeRuns: runs of ESC bytes (each one alone, the last one
// taking the next byte as its final) longer than a break around a value:
// the final byte before the value is taken as its first character, the run
// after the value ends the match, and a Writer agrees with Redact for any
// split (fuzz finds, issue 14).
func TestLongEscapeRuns(t *testing.T) {
	s, _, _ := fuzzSetup(t)
	E := func(n int) string { return strings.Repeat("\x1b", n) }
	utf := "\x00Z\x00q\x009\x00v\x00X\x002\x00p\x00L\x00m\x00N\x004\x00t"
	for _, in := range []string{
		"p" + E(40) + "s3cr3t" + E(40) + "0",
		"p" + E(50) + utf + E(70) + "x",
		E(60) + "Zq9vX2pLmN4t" + E(100) + "x",
		"p" + E(10) + "Zq9vX2pLmN4t" + E(100),
		"pAss00" + E(40) + "\x00p\x00@\x00s\x00s\x00 \x00w\x00/\x00r\x00d\x00&\x00x\x00=\x001\x00?\x00\"\x00'\x00\\\x00<" + E(40) + utf + E(50),
	} {
		whole := s.Redact([]byte(in))
		if n := bytes.Count(whole, []byte("[REDACTED:")); n == 0 || bytes.Contains(whole, []byte("s3cr3t")) || bytes.Contains(whole, []byte("4\x00t")) {
			t.Errorf("%s: not redacted: %s", brief([]byte(in)), brief(whole))
		}
		for i := 1; i < len(in); i++ {
			if got := stream(t, s, []byte(in), []int{i, len(in) - i}, false); !bytes.Equal(got, whole) {
				t.Errorf("%s split at %d: %s, whole %s", brief([]byte(in)), i, brief(got), brief(whole))
				break
			}
		}
	}
}

// TestFlushPendingSequence: an escape sequence left open at the end (a CSI
// whose parameter bytes are a value's digits) is not released whole by
// Flush, whatever the split: if it never ends, its bytes are characters
// (the fuzz find itself is in testdata/fuzz, bcfbdb5bb106e69a).
func TestFlushPendingSequence(t *testing.T) {
	s, _, _ := fuzzSetup(t)
	for _, form := range []string{"%73%33%63%72%33%74", "115,51,99,114,51,116"} {
		in := "ok \x1b[" + form
		for i := 1; i <= len(in); i++ {
			var b bytes.Buffer
			w := s.NewWriter(&b)
			w.Write([]byte(in[:i]))
			w.Flush()
			w.Write([]byte(in[i:]))
			w.Flush()
			w.Close()
			if bytes.Contains(b.Bytes(), []byte(form)) || !bytes.Contains(b.Bytes(), []byte("[REDACTED:short6]")) {
				t.Errorf("%q, flushed after %d: %q", form, i, b.String())
			}
		}
	}
}

// TestFormsShownAsText: UTF-16 shown as text (Python's bytes repr, od -c,
// cat -v), hex bytes joined by '-' or '.' and 0xNN without commas are
// forms too (red-team finds).
func TestFormsShownAsText(t *testing.T) {
	s, values, _ := fuzzSetup(t)
	v := values["db"]
	var le []byte
	for _, w := range utf16.Encode([]rune(v)) {
		le = append(le, byte(w), byte(w>>8))
	}
	var od, catv, py strings.Builder
	for _, c := range le {
		if c == 0 {
			od.WriteString(`  \0`)
			catv.WriteString("^@")
			py.WriteString(`\x00`)
		} else {
			fmt.Fprintf(&od, "   %c", c)
			catv.WriteByte(c)
			py.WriteByte(c)
		}
	}
	hexd := []string{}
	for _, c := range []byte(v) {
		hexd = append(hexd, fmt.Sprintf("%02x", c))
	}
	// Not covered (docs/SECURITY.md): UTF-16 as a JSON string (its \u0000
	// grams are in every number) and decimal bytes without commas.
	for _, in := range []string{"b'\\xff\\xfe" + py.String() + "'", od.String(), catv.String(), strings.Join(hexd, "-"), strings.Join(hexd, "."), "0x" + strings.Join(hexd, " 0x")} {
		out := s.RedactString(in + "\n")
		if !strings.Contains(out, "[REDACTED:db]") {
			t.Errorf("%q -> %q", in, out)
		}
	}
}
