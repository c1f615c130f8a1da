package scrub

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// The forms of issue 15's review: a value as a terminal shows it though
// its bytes differ (a junk character and a backspace before each
// character, invisible characters between them, fullwidth letters), and
// JavaScript's \u{NN}. (base32 and base64 of UTF-16LE, also found, are out
// of reach: docs/SECURITY.md.) As in forms_test.go, each check rebuilds or decodes the form
// itself; termView renders output as a terminal would, independently of
// units.go.

// invisibles are the characters the tests put between a value's
// characters; a terminal shows none of them (U+0336, a combining
// strike-through, goes after a character and overlays it).
var invisibles = []string{"\u200b", "\u200c", "\u200d", "\u2060", "\u00a0", "\u00ad", "\ufeff", "\u200e", "\u2063", "\u0336", "\u034f", "\u3000"}

// termView renders out as a terminal shows it, one line per line: a
// backspace moves the cursor one character left, a character overwrites
// the one under the cursor, CR returns to the line's start; CSI sequences,
// the invisibles and other controls but tab show nothing; fullwidth ASCII
// reads as ASCII. Cells hold the bytes of one character (an invalid byte
// is one).
func termView(out []byte) []byte {
	var b []byte
	var line []string
	cur := 0
	put := func(cell string) {
		if cur < len(line) {
			line[cur] = cell
		} else {
			line = append(line, cell)
		}
		cur++
	}
	flush := func() {
		for _, c := range line {
			b = append(b, c...)
		}
		line, cur = line[:0], 0
	}
	for i := 0; i < len(out); {
		c := out[i]
		switch {
		case c == 0x1b && i+1 < len(out) && out[i+1] == '[':
			j := i + 2
			for j < len(out) && out[j] >= 0x20 && out[j] <= 0x3f {
				j++
			}
			i = min(j+1, len(out))
			continue
		case c == '\b':
			cur = max(0, cur-1)
		case c == '\r':
			cur = 0
		case c == '\n':
			flush()
			b = append(b, '\n')
		case c == '\t':
			put(" ")
		case c < 0x20 || c == 0x7f:
		case c < 0x80:
			put(string(c))
		default:
			r, n := utf8.DecodeRune(out[i:])
			s := string(out[i : i+n])
			switch {
			case r >= 0xff01 && r <= 0xff5e:
				put(string(rune(r - 0xfee0)))
			case isInvisible(s):
			default:
				put(s)
			}
			i += n
			continue
		}
		i++
	}
	flush()
	return b
}

func isInvisible(s string) bool {
	for _, x := range invisibles {
		if s == x {
			return true
		}
	}
	return false
}

// termLeak: the output as a terminal shows it has k consecutive value
// bytes (in any ASCII case, single separators between).
func termLeak(out []byte, v string) bool { return plainLeak(termView(out), v) }

// printErased: each character of v after junk a terminal erases: "X\b",
// "_\b" (underline, as nroff prints it), the character itself and "\b"
// (overstrike, bold), a multi-byte or fullwidth character and "\b"; one
// kind for all or a random one each (sometimes none). (Two characters and
// two backspaces are out of reach: units.go.)
func printErased(rnd *rand.Rand, v string) (string, bool) {
	if !utf8.ValidString(v) {
		return "", false
	}
	kinds := []func(r rune) string{
		func(rune) string { return "X\b" },
		func(rune) string { return "_\b" },
		func(r rune) string { return string(r) + "\b" },
		func(rune) string { return "é\b" },
		func(rune) string { return "ｗ\b" },
		func(rune) string { return "" },
	}
	one := -1
	if rnd.IntN(2) == 0 {
		one = rnd.IntN(len(kinds) - 1)
	}
	var b strings.Builder
	for _, r := range v {
		k := one
		if k < 0 {
			k = rnd.IntN(len(kinds))
		}
		b.WriteString(kinds[k](r))
		b.WriteRune(r)
	}
	return b.String(), true
}

// printInvisible: an invisible character between every two characters
// (U+0336 after each), one kind for all or a random one each.
func printInvisible(rnd *rand.Rand, v string) (string, bool) {
	if !utf8.ValidString(v) {
		return "", false
	}
	one := ""
	if rnd.IntN(2) == 0 {
		one = invisibles[rnd.IntN(len(invisibles))]
	}
	var b strings.Builder
	for i, r := range []rune(v) {
		x := one
		if x == "" {
			x = invisibles[rnd.IntN(len(invisibles))]
		}
		if i > 0 && x != "\u0336" {
			b.WriteString(x)
		}
		b.WriteRune(r)
		if x == "\u0336" {
			b.WriteString(x)
		}
	}
	return b.String(), true
}

// fullwidth writes the ASCII characters of v (but space) as fullwidth
// ones, each with probability p.
func fullwidth(rnd *rand.Rand, v string, p float64) string {
	var b strings.Builder
	for _, r := range v {
		if r > 0x20 && r < 0x7f && rnd.Float64() < p {
			r += 0xfee0
		}
		b.WriteRune(r)
	}
	return b.String()
}

// printFullwidth: all of v fullwidth, or a random part, in upper case,
// lower case or as it is.
func printFullwidth(rnd *rand.Rand, v string) (string, bool) {
	if !utf8.ValidString(v) {
		return "", false
	}
	p := 1.0
	if rnd.IntN(3) == 0 {
		p = 0.5
	}
	s := fullwidth(rnd, v, p)
	switch rnd.IntN(4) {
	case 0:
		s = strings.ToUpper(s)
	case 1:
		s = strings.ToLower(s)
	}
	return s, true
}

func uBrace(r rune) string { return fmt.Sprintf(`\u{%x}`, r) }

// printUBrace: each character as \u{NN} (JavaScript's code point escape,
// Rust's escape_unicode), hex digits in either case.
func printUBrace(rnd *rand.Rand, v string) (string, bool) {
	if !utf8.ValidString(v) {
		return "", false
	}
	var b strings.Builder
	for _, r := range v {
		b.WriteString(uBrace(r))
	}
	if rnd.IntN(2) == 0 {
		return strings.ToUpper(b.String()), true
	}
	return b.String(), true
}

func uBraceLeak(out []byte, v string) bool {
	if !utf8.ValidString(v) {
		return false
	}
	return piecesLeak(leakView(out, true), perRuneOf(v, func(r rune, _ string) string { return uBrace(r) }), "", KnownRun(len(v)))
}

// terminalFormCases lists each new form of v in the layouts that matter.
func terminalFormCases(rnd *rand.Rand, v string) []struct{ form, text string } {
	var cs []struct{ form, text string }
	add := func(form, text string) { cs = append(cs, struct{ form, text string }{form, text}) }
	each := func(f func(r rune) string) string {
		var b strings.Builder
		for _, r := range v {
			b.WriteString(f(r))
		}
		return b.String()
	}
	for _, junk := range []string{"X\b", "_\b", "é\b", "ｗ\b", "\x1b[1mX\b"} {
		add("erased", each(func(r rune) string { return junk + string(r) }))
	}
	add("erased", each(func(r rune) string { return string(r) + "\b" + string(r) }))
	for _, x := range invisibles {
		if x == "\u0336" {
			add("invisible", each(func(r rune) string { return string(r) + x }))
			continue
		}
		add("invisible", strings.Join(strings.Split(v, ""), x))
	}
	add("fullwidth", fullwidth(rnd, v, 1))
	add("fullwidth", strings.ToUpper(fullwidth(rnd, v, 1)))
	add("fullwidth", fullwidth(rnd, v, 0.5))
	add("dotted", dotted(v))
	add("u-brace", each(uBrace))
	add("u-brace", strings.ToUpper(each(uBrace)))
	for range 3 {
		for _, f := range printedForms[len(printedForms)-len(terminalForms):] {
			if s, ok := f.print(rnd, v); ok {
				add(f.name, s)
			}
		}
	}
	return cs
}

// terminalForms are appended to printedForms (forms_test.go), so the
// tables, the leak checks' test and the fuzz target take them too.
var terminalForms = []printedForm{
	{"erased", printErased, termLeak},
	{"invisible", printInvisible, termLeak},
	{"fullwidth", printFullwidth, termLeak},
	{"u-brace", printUBrace, uBraceLeak},
	{"dotted", func(_ *rand.Rand, v string) (string, bool) { return dotted(v), true }, dottedLeak},
}

func init() { printedForms = append(printedForms, terminalForms...) }

// TestTerminalFormsEverySplit: each new form of the test values, amid
// other output, is redacted with the value's label and shows no run of k
// value bytes as a terminal shows it or in the form; written in two
// writes split at every point, the output equals Redact of the whole, and
// flushed after each write it differs only as Flush may and leaks
// nothing.
func TestTerminalFormsEverySplit(t *testing.T) {
	rnd := rand.New(rand.NewPCG(15, 1))
	s, values := formsSet(t)
	for _, name := range []string{"short", "punct", "six"} {
		v := values[name]
		label := []byte("[REDACTED:" + name + "]")
		for _, c := range terminalFormCases(rnd, v) {
			f := formByName(c.form)
			if !f.leak([]byte(c.text), v) {
				t.Fatalf("%s %s: the check misses the form itself: %q", name, c.form, c.text)
			}
			in := []byte("$ ./show\n" + c.text + "\n$ ")
			whole := s.Redact(in)
			if !bytes.Contains(whole, label) || f.leak(whole, v) || termLeak(whole, v) || plainLeak(whole, v) {
				t.Errorf("%s %s: %q -> %q", name, c.form, in, whole)
				continue
			}
			for i := 1; i < len(in); i++ {
				if got := stream(t, s, in, []int{i, len(in) - i}, false); !bytes.Equal(got, whole) {
					t.Errorf("%s %s split at %d: %q, whole %q", name, c.form, i, got, whole)
					break
				}
				got := stream(t, s, in, []int{i, len(in) - i}, true)
				if err := flushEquivalent(s, in, got); err != nil {
					t.Errorf("%s %s split at %d, flushed: %q: %v", name, c.form, i, got, err)
					break
				}
				if f.leak(got, v) || termLeak(got, v) || plainLeak(got, v) {
					t.Errorf("%s %s split at %d, flushed: leaks %q", name, c.form, i, got)
					break
				}
			}
		}
	}
}

// TestTerminalFormsOtherValuePass: the new forms of other values, and
// ordinary output that uses the same characters (man pages' overstrike
// and underline, a spinner, text with no-break and zero-width spaces,
// fullwidth and CJK text, \u{NN} of other text), pass unchanged.
func TestTerminalFormsOtherValuePass(t *testing.T) {
	rnd := rand.New(rand.NewPCG(15, 2))
	s, _ := formsSet(t)
	for _, w := range []string{randString(rnd, alnum, 40), randString(rnd, alnum+`#'"\&()+;/=`, 30), randString(rnd, alnum, 10)} {
		for _, c := range terminalFormCases(rnd, w) {
			passes(t, s, rnd, c.form, []byte("$ ./show\n"+c.text+"\n$ "))
		}
	}
	var man, spin strings.Builder
	for _, word := range strings.Fields("NAME grep print lines that match patterns SYNOPSIS OPTIONS --color=auto") {
		for _, r := range word {
			fmt.Fprintf(&man, "%c\b%c", r, r)
		}
		man.WriteString(" ")
		for _, r := range word {
			fmt.Fprintf(&man, "_\b%c", r)
		}
		man.WriteString("\n")
	}
	for i := range 400 {
		spin.WriteString(string(`|/-\`[i%4]) + "\b")
	}
	for what, in := range map[string]string{
		"man page":  man.String(),
		"spinner":   spin.String(),
		"spaces":    "Price:\u00a0100\u00a0EUR, total\u202f1\u00a0234,50\u00a0€; zero\u200bwidth\u200bjoin \ufeffBOM \u2060word\u2060joiner",
		"fullwidth": "ＡＢＣ全角テキスト１２３ｘｙｚ、日本語のテキスト。ｈｅｌｌｏ　ｗｏｒｌｄ！",
		"u-brace":   `console.log("\u{1F600} \u{48}\u{69}"); let s = '\u{61}\u{62}';`,
	} {
		passes(t, s, rnd, what, []byte(in))
	}
}

// TestTermView: the renderer the checks use shows what a terminal shows.
func TestTermView(t *testing.T) {
	for in, want := range map[string]string{
		"X\bs_\be":                 "se",
		"ab\b\bcd":                 "cd",
		"s\u200be\u00a0c":          "sec",
		"ｓｅＣ":                      "seC",
		"abc\rX\n\x1b[31md\x1b[0m": "Xbc\nd",
		"s\u0336e\u0336":           "se",
	} {
		if got := string(termView([]byte(in))); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// noSprinkle: forms TestLeakChecks does not put separators into (a
// separator between a junk character and its backspace keeps it, and
// multi-byte characters would be cut).
var noSprinkle = map[string]bool{"erased": true, "invisible": true, "fullwidth": true}

// dottedLeak: k+1 consecutive bytes of v in dotted decimal (k of them are
// caught only where their digits are as many as the shortest match's; all
// of a value of k bytes).
func dottedLeak(out []byte, v string) bool {
	return piecesLeak(leakView(out, true), perByteOf(v, func(c byte) string { return fmt.Sprint(c) }), ".", min(KnownRun(len(v))+1, len(v)))
}

// dotted is v's bytes in decimal joined by dots (Perl's printf '%vd').
func dotted(v string) string {
	p := make([]string, len(v))
	for i := range len(v) {
		p[i] = fmt.Sprint(v[i])
	}
	return strings.Join(p, ".")
}

// TestJoinedFormsOfExactlyK: hex bytes joined by '-' or '.' (Python's
// bytes.hex('-'), .NET's BitConverter) of exactly k bytes printed on their
// own, at every offset, are redacted (the separator after the last byte
// counted in the shortest match let them pass before issue 15), and so is
// dotted decimal of k+1 bytes (of k bytes when the shortest match starts
// at the value's first byte: a window further in counts the dot before
// it).
func TestJoinedFormsOfExactlyK(t *testing.T) {
	s, values := formsSet(t)
	for _, name := range []string{"long", "punct", "short"} {
		v := values[name]
		k := KnownRun(len(v))
		for i := 0; i+k <= len(v); i++ {
			h := fmt.Sprintf("%x", v[i:i+k])
			var pairs []string
			for j := 0; j < len(h); j += 2 {
				pairs = append(pairs, h[j:j+2])
			}
			ins := []string{strings.Join(pairs, "-"), strings.Join(pairs, ".")}
			if i+k < len(v) {
				ins = append(ins, dotted(v[i:i+k+1]))
			}
			for _, in := range ins {
				out := s.RedactString("x = " + in + "\n")
				if !strings.Contains(out, "[REDACTED:"+name+"]") {
					t.Errorf("%s[%d:]: %q passes", name, i, out)
				}
			}
		}
	}
}
