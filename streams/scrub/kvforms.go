package scrub

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// KnownRun returns k for a known value of n bytes: no run of k or more
// consecutive bytes of the value reaches a client, in any registered form.
// 12 for values of 24 bytes or more; half the value (rounded up) for 16..23;
// 8 for 8..15 (so a split of a short value into two halves may show both);
// the whole value below 8. Shorter runs would redact ordinary text.
func KnownRun(n int) int {
	switch {
	case n >= 24:
		return 12
	case n >= 16:
		return (n + 1) / 2
	case n >= 8:
		return 8
	}
	return n
}

// formSpec is a form of a value before normalisation: the encoding of each
// value byte (a multi-byte character's encoding is given to its first byte,
// its other bytes encode to ""), so any k consecutive value bytes map to a
// known piece of the form.
type formSpec struct {
	name   string
	pieces []string
}

// b64Form is a base64 form: the characters whose 6 bits all come from the
// value, for one alignment (bytes before the value mod 3) and alphabet, and
// the fewest of them k consecutive value bytes produce.
type b64Form struct {
	core string
	m    int
}

// valueForms lists the forms of v (see doc.go): the value, reversed,
// escapes and per-byte encodings. Pieces are not yet normalised.
func valueForms(v []byte) []formSpec {
	type unit struct {
		b []byte // the value's bytes of one character (one byte if invalid UTF-8)
		r rune   // utf8.RuneError for an invalid byte
	}
	units := make([]unit, 0, len(v))
	for i := 0; i < len(v); {
		r, size := utf8.DecodeRune(v[i:])
		units = append(units, unit{v[i : i+size], r})
		i += size
	}
	perUnit := func(name string, enc func(u unit) string) formSpec {
		f := formSpec{name: name, pieces: make([]string, 0, len(v))}
		for _, u := range units {
			f.pieces = append(f.pieces, enc(u))
			for range len(u.b) - 1 {
				f.pieces = append(f.pieces, "")
			}
		}
		return f
	}
	// joined: bytes with sep between them, given to the byte after it, so
	// that k bytes printed on their own (no sep before the first) are a
	// window too and m counts no separator at the end.
	joined := func(name, sep string, enc func(c byte) string) formSpec {
		f := formSpec{name: name}
		for i, c := range v {
			if i == 0 {
				f.pieces = append(f.pieces, enc(c))
			} else {
				f.pieces = append(f.pieces, sep+enc(c))
			}
		}
		return f
	}
	perByte := func(name string, enc func(c byte) string) formSpec {
		f := formSpec{name: name, pieces: make([]string, 0, len(v))}
		for _, c := range v {
			f.pieces = append(f.pieces, enc(c))
		}
		return f
	}
	// jsonEsc: a string's body as Go's encoding/json writes it (html:
	// <, > and & as \u003c...); slash: '/' as \/ as well (PHP's
	// json_encode, Ruby's script_safe).
	jsonEsc := func(html, slash bool) func(u unit) string {
		return func(u unit) string {
			if slash && string(u.b) == "/" {
				return `\/`
			}
			var sb strings.Builder
			e := json.NewEncoder(&sb)
			e.SetEscapeHTML(html)
			s := string(u.b)
			if e.Encode(s) != nil {
				return s
			}
			j := strings.TrimSpace(sb.String())
			return j[1 : len(j)-1]
		}
	}
	out := []formSpec{
		perByte("value", func(c byte) string { return string([]byte{c}) }),
		perByte("hex", func(c byte) string { return fmt.Sprintf("%02x", c) }),
		perByte("hex-colon", func(c byte) string { return fmt.Sprintf("%02x:", c) }),
		perByte("percent", func(c byte) string { return fmt.Sprintf("%%%02x", c) }),
		perByte("backslash-x", func(c byte) string { return fmt.Sprintf(`\x%02x`, c) }),
		perByte("0x-list", func(c byte) string { return fmt.Sprintf("0x%02x,", c) }),
		perByte("decimal-list", func(c byte) string { return fmt.Sprintf("%d,", c) }),
		perByte("url-query", func(c byte) string { return url.QueryEscape(string([]byte{c})) }),
		perByte("url-path", func(c byte) string { return url.PathEscape(string([]byte{c})) }),
		perByte("url-js", func(c byte) string { // encodeURIComponent
			if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.!~*'()", c) >= 0 {
				return string([]byte{c})
			}
			return fmt.Sprintf("%%%02X", c)
		}),
		// Python's urllib.parse.quote with its default safe='/' (quote_plus
		// is url-query, and so is quote(safe='') but for spaces); url-js itself
		// for a value without '/!*'()'
		perByte("url-python", func(c byte) string {
			if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-_.~/", c) >= 0 {
				return string([]byte{c})
			}
			return fmt.Sprintf("%%%02X", c)
		}),
		perShell(v),
		perByte("shell-single", func(c byte) string {
			if c == '\'' {
				return `'\''`
			}
			return string([]byte{c})
		}),
		perUnit("json", jsonEsc(true, false)),
		perUnit("json-nohtml", jsonEsc(false, false)),
		// json-nohtml itself for a value without '/' (a form's string is
		// indexed once: newKVIndex)
		perUnit("json-slash", jsonEsc(false, true)),
		perUnit("go-quote", func(u unit) string { q := strconv.Quote(string(u.b)); return q[1 : len(q)-1] }),
		perUnit("utf16", func(u unit) string {
			if u.r == utf8.RuneError && len(u.b) == 1 {
				return string(u.b)
			}
			var b []byte
			for _, w := range utf16.Encode([]rune{u.r}) {
				b = append(b, byte(w), byte(w>>8))
			}
			return string(b)
		}),
		perUnit("py-list", func(u unit) string {
			if string(u.b) == "'" {
				return `"'",`
			}
			return "'" + escapeLiteral(string(u.b), "'") + "',"
		}),
		perByte("json-u", func(c byte) string { return fmt.Sprintf(`\u%04x`, c) }),
		// JavaScript's and Swift's code point escape, Rust's
		// escape_unicode (lowered: \u{1F600} as \u{1f600})
		perUnit("u-brace", func(u unit) string {
			if u.r == utf8.RuneError && len(u.b) == 1 {
				return string(u.b)
			}
			return fmt.Sprintf(`\u{%x}`, u.r)
		}),
		// other separators between hex bytes (.NET's BitConverter, hex('.'))
		// and 0xNN without commas. (Decimal bytes without commas, as od -td1
		// prints them, are all digits: their grams are in every number, and
		// looking them up cost half the scrubber's speed on ordinary text.)
		joined("hex-dash", "-", func(c byte) string { return fmt.Sprintf("%02x", c) }),
		joined("hex-dot", ".", func(c byte) string { return fmt.Sprintf("%02x", c) }),
		perByte("0x", func(c byte) string { return fmt.Sprintf("0x%02x", c) }),
		// dotted decimal bytes (Perl's printf '%vd'): digits and dots
		// are in version numbers and addresses, but looking their grams
		// up cost nothing measurable on the corpus
		joined("dotted", ".", func(c byte) string { return strconv.Itoa(int(c)) }),
	}
	// UTF-16 shown as text: Python's bytes repr, od -c and cat -v, little
	// and big endian. (Not as JSON's \u0000: those grams, "0000" among
	// them, are in every number and made the scrubber ten times slower on
	// real tool output.)
	for _, be := range []bool{false, true} {
		for _, r := range utf16Renderers {
			out = append(out, perUnit(r.name+map[bool]string{false: "-le", true: "-be"}[be], func(u unit) string {
				if u.r == utf8.RuneError && len(u.b) == 1 {
					return string(u.b)
				}
				var sb strings.Builder
				for _, w := range utf16.Encode([]rune{u.r}) {
					lo, hi := byte(w), byte(w>>8)
					if be {
						lo, hi = hi, lo
					}
					sb.WriteString(r.byte(lo))
					sb.WriteString(r.byte(hi))
				}
				return sb.String()
			}))
		}
	}
	// String literals as Python's repr and JavaScript's util.inspect print
	// them: backslashes and controls escaped, and no quote, one kind or
	// both escaped (each picks its quotes by the content).
	for _, q := range []string{"", "'", `"`, `'"`} {
		out = append(out, perByte("literal"+q, func(c byte) string { return escapeLiteral(string([]byte{c}), q) }))
	}
	if strings.ContainsFunc(string(v), func(r rune) bool { return r >= 0x80 }) {
		// Non-ASCII letters (and invalid UTF-8, which becomes U+FFFD) change
		// in Unicode case mapping (a proxy lowering a host name).
		out = append(out, perUnit("lower", func(u unit) string { return strings.ToLower(string(u.b)) }),
			perUnit("upper", func(u unit) string { return strings.ToUpper(string(u.b)) }))
	}
	// Reversed as rev(1) reverses: by character.
	rev := formSpec{name: "reversed"}
	for i := len(units) - 1; i >= 0; i-- {
		rev.pieces = append(rev.pieces, string(units[i].b))
		for range len(units[i].b) - 1 {
			rev.pieces = append(rev.pieces, "")
		}
	}
	out = append(out, rev)
	for i := range out {
		out[i] = foldSpecial(out[i])
	}
	return out
}

// foldSpecial reads a form's special characters as the normalised stream
// does (units.go): a fullwidth character becomes its ASCII, an invisible
// one is left out. A character spread over pieces goes to the first.
func foldSpecial(f formSpec) formSpec {
	if !slices.ContainsFunc(f.pieces, func(p string) bool {
		return strings.ContainsFunc(p, func(r rune) bool { return r >= 0x80 })
	}) {
		return f
	}
	var all []byte
	var owner []int // the piece of each byte of all
	for i, p := range f.pieces {
		all = append(all, p...)
		for range len(p) {
			owner = append(owner, i)
		}
	}
	out := make([][]byte, len(f.pieces))
	changed := false
	for j := 0; j < len(all); {
		if specialLead[all[j]] {
			if n, c := specialAt(all, j); n > 0 {
				if c != 0 {
					out[owner[j]] = append(out[owner[j]], c)
				}
				j += n
				changed = true
				continue
			}
		}
		out[owner[j]] = append(out[owner[j]], all[j])
		j++
	}
	if !changed {
		return f
	}
	g := formSpec{name: f.name, pieces: make([]string, len(out))}
	for i, b := range out {
		g.pieces[i] = string(b)
	}
	return g
}

// utf16Renderers show a byte of UTF-16 as text.
var utf16Renderers = []struct {
	name string
	byte func(c byte) string
}{
	{"utf16-pybytes", func(c byte) string {
		switch {
		case c == '\\' || c == '\'':
			return `\` + string([]byte{c})
		case c == '\t':
			return `\t`
		case c == '\n':
			return `\n`
		case c == '\r':
			return `\r`
		case c >= 0x20 && c < 0x7f:
			return string([]byte{c})
		}
		return fmt.Sprintf(`\x%02x`, c)
	}},
	{"utf16-od-c", func(c byte) string {
		if c == 0 {
			return `\0`
		}
		if c >= 0x20 && c < 0x7f {
			return string([]byte{c})
		}
		return fmt.Sprintf("%03o", c)
	}},
	{"utf16-cat-v", func(c byte) string {
		switch {
		case c >= 0x20 && c < 0x7f:
			return string([]byte{c})
		case c < 0x20:
			return "^" + string([]byte{c + 64})
		case c == 0x7f:
			return "^?"
		}
		return "M-" + string([]byte{c - 0x80})
	}},
}

// perShell is bash's printf %q of v, per byte.
func perShell(v []byte) formSpec {
	f := formSpec{name: "shell"}
	for i, c := range v {
		p := shellBackslash(string([]byte{c}))
		if i > 0 && (c == '#' || c == '~') {
			p = string([]byte{c})
		}
		f.pieces = append(f.pieces, p)
	}
	return f
}

// b64Forms returns the base64 cores of v for the three alignments and both
// alphabets with, for each, the fewest core characters k consecutive value
// bytes fully determine (wherever they sit in v).
func b64Forms(v []byte, k int) []b64Form {
	var out []b64Form
	buf := make([]byte, 2+len(v))
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for a := 0; a < 3; a++ {
			b := buf[:a+len(v)]
			clear(b[:a])
			copy(b[a:], v)
			s := enc.EncodeToString(b)
			lo := (8*a + 5) / 6
			hi := (8 * (a + len(v))) / 6
			m := -1
			for i := 0; i+k <= len(v); i++ {
				l := (8*(a+i+k))/6 - (8*(a+i)+5)/6
				if m < 0 || l < m {
					m = l
				}
			}
			if hi > lo && m > 0 {
				out = append(out, b64Form{core: s[lo:hi], m: m})
			}
		}
	}
	return out
}

// escapeLiteral escapes v as the body of a quoted string literal: a
// backslash before '\\' and each quote in quotes, and \n, \r, \t for those
// controls.
func escapeLiteral(v, quotes string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\' || strings.IndexByte(quotes, c) >= 0:
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\r':
			b.WriteString(`\r`)
		case c == '\t':
			b.WriteString(`\t`)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// shellBackslash escapes v the way bash's printf %q does for printable
// text: a backslash before the shell's special characters, and before '#'
// and '~' only at the start of a word.
func shellBackslash(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if strings.IndexByte(" \t\n'\"\\|&;()<>!{}*[?]^$`", c) >= 0 || i == 0 && (c == '#' || c == '~') {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}
