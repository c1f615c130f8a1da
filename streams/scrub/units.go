package scrub

import "unicode/utf8"

// Characters a terminal shows as nothing or as ASCII, for the known-value
// matcher's normalised stream (kv.go):
//
//   - invisible and space characters between a value's characters are
//     separators like the bytes below 0x21: U+00A0 (no-break space), U+00AD
//     (soft hyphen), combining marks U+0300-U+036F and U+20D0-U+20FF (a
//     strike-through of each letter), U+180E, U+2000-U+200F (spaces, zero
//     widths, direction marks), U+2028-U+202F, U+205F-U+206F (word joiner,
//     invisible operators, direction isolates), U+3000, U+3164, U+FE00-U+FE0F
//     (variation selectors), U+FEFF, U+FFA0;
//   - fullwidth ASCII U+FF01-U+FF5E reads as the ASCII character;
//   - a backspace (0x08) erases the character before it: a run of r
//     backspaces makes the last min(r, kvBSMax) characters (UTF-8
//     characters, with no other byte between them and the run) optional,
//     as an escape sequence's final byte is: a match may take them (a raw
//     reader sees them) or skip them (a terminal shows the next character
//     in their place). "X\bs" reads as s or xs, "s\bs" (overstrike) as s,
//     "_\bs" (underline) as s. kvBSMax is 1: the character directly before
//     a backspace. (The code takes any kvBSMax up to kvQ, but each one
//     costs a pass of kvTail at the end of every write that ends with a
//     character: "XY\b\b" and the erase echo "\b \b" of several
//     characters are left out.)
//
// All of these are outside ASCII but for the backspace, so ordinary ASCII
// output takes the same path as before.
const kvBSMax = 1 // at most kvQ: a run after a sampled gram reaches back into it only

const bs = 0x08

// specialLead marks the lead bytes of the sequences specialAt knows.
var specialLead = func() (t [256]bool) {
	for _, c := range []byte{0xc2, 0xcc, 0xcd, 0xe1, 0xe2, 0xe3, 0xef} {
		t[c] = true
	}
	return
}()

// specialAt returns the length n of the special character at data[i] (0:
// none, or data ends inside it) and the ASCII character it reads as (0: a
// separator).
func specialAt(data []byte, i int) (n int, c byte) {
	if !specialLead[data[i]] || i+1 >= len(data) {
		return 0, 0
	}
	b1 := data[i+1]
	switch data[i] {
	case 0xc2:
		if b1 == 0xa0 || b1 == 0xad {
			return 2, 0
		}
		return 0, 0
	case 0xcc:
		if b1 >= 0x80 && b1 <= 0xbf {
			return 2, 0
		}
		return 0, 0
	case 0xcd:
		if b1 >= 0x80 && b1 <= 0xaf {
			return 2, 0
		}
		return 0, 0
	}
	if i+2 >= len(data) {
		return 0, 0
	}
	b2 := data[i+2]
	switch data[i] {
	case 0xe1:
		if b1 == 0xa0 && b2 == 0x8e {
			return 3, 0
		}
	case 0xe2:
		switch {
		case b1 == 0x80 && (b2 >= 0x80 && b2 <= 0x8f || b2 >= 0xa8 && b2 <= 0xaf),
			b1 == 0x81 && b2 >= 0x9f && b2 <= 0xaf,
			b1 == 0x83 && b2 >= 0x90 && b2 <= 0xbf:
			return 3, 0
		}
	case 0xe3:
		if b1 == 0x80 && b2 == 0x80 || b1 == 0x85 && b2 == 0xa4 {
			return 3, 0
		}
	case 0xef:
		switch {
		case b1 == 0xbc && b2 >= 0x81 && b2 <= 0xbf:
			return 3, b2 - 0x60 // U+FF01.. is '!'..
		case b1 == 0xbd && b2 >= 0x80 && b2 <= 0x9e:
			return 3, b2 - 0x20 // U+FF40.. is '`'..
		case b1 == 0xb8 && b2 >= 0x80 && b2 <= 0x8f,
			b1 == 0xbb && b2 == 0xbf,
			b1 == 0xbe && b2 == 0xa0:
			return 3, 0
		}
	}
	return 0, 0
}

// specialPending: data[i:] (data's last one or two bytes) could still
// become a special character with more input.
func specialPending(data []byte, i int) bool {
	switch len(data) - i {
	case 1:
		return specialLead[data[i]]
	case 2:
		// the second byte's range for some special character of this lead
		b1 := data[i+1]
		switch data[i] {
		case 0xe1:
			return b1 == 0xa0
		case 0xe2:
			return b1 == 0x80 || b1 == 0x81 || b1 == 0x83
		case 0xe3:
			return b1 == 0x80 || b1 == 0x85
		case 0xef:
			return b1 == 0xb8 || b1 >= 0xbb && b1 <= 0xbe
		}
	}
	return false
}

// specialStart returns the start of the special character that data[i] is
// a continuation byte of, or i.
func specialStart(data []byte, i int) int {
	if data[i] < 0x80 || data[i] > 0xbf {
		return i
	}
	for j := i - 1; j >= max(0, i-2); j-- {
		if specialLead[data[j]] {
			if n, _ := specialAt(data, j); j+n > i {
				return j
			}
			return i
		}
		if data[j] < 0x80 || data[j] > 0xbf {
			return i
		}
	}
	return i
}

// charEnd returns the end of the character whose (first) byte is at i in
// the normalised stream: a fullwidth character's three bytes, else one.
func charEnd(data []byte, i int) int {
	if data[i] == 0xef {
		if n, c := specialAt(data, i); c != 0 {
			return i + n
		}
	}
	return i + 1
}

// unitLen is the length of the character data[i:] begins for a
// backspace (a complete UTF-8 character, else one byte).
func unitLen(data []byte, i int) int {
	if data[i] < 0x80 {
		return 1
	}
	_, n := utf8.DecodeRune(data[i:])
	return n
}

// bsErased reports whether a backspace run erases the character at data[i]
// (see kvBSMax): it is one of the last kvBSMax characters, with nothing
// but characters between, before a run of as many backspaces or more.
// maybe: data ends before that is decided (a run could still come).
func bsErased(data []byte, i int) (erased, maybe bool) {
	c := 0
	for j := i; ; {
		if j == len(data) {
			return false, c <= kvBSMax
		}
		if data[j] == bs {
			r := 0
			for j < len(data) && data[j] == bs && r < c {
				r++
				j++
			}
			return r >= c, r < c && j == len(data)
		}
		if c == kvBSMax {
			return false, false
		}
		n, ch := kvChar(data, j)
		if n == 0 {
			return false, false
		}
		c++
		j += n
		_ = ch
	}
}

// kvChar returns the length of the character of the normalised stream at
// data[i] and its byte (lowered; a fullwidth character's ASCII), or n 0
// if data[i] begins no character (a separator, an escape sequence, a
// special separator). A multi-byte character other than fullwidth takes
// its whole UTF-8 length here (each of its bytes is a character of the
// normalised stream; c is its first).
func kvChar(data []byte, i int) (n int, c byte) {
	c = data[i]
	switch {
	case c < 0x21 || c == 0x1b:
		return 0, 0
	case c < 0x80:
		return 1, lowerByte(c)
	case specialLead[c]:
		if sn, sc := specialAt(data, i); sn > 0 {
			if sc == 0 {
				return 0, 0
			}
			return sn, lowerByte(sc)
		}
	}
	return unitLen(data, i), c
}

// Shown is how many bytes of v the known-value matcher can compare: v as a
// terminal shows it, without separators (bytes below 0x21), the invisible
// characters above, escape sequences, and characters a backspace erases.
// A value with fewer than MinValueLen of them cannot be redacted (six
// spaces, or a colour code around three letters, read as nothing or as a
// common word) and is refused.
func Shown(v string) int {
	data := []byte(v)
	n, last := 0, 0 // last: the length of the last character counted
	for i := 0; i < len(data); {
		switch c := data[i]; {
		case c == 0x1b:
			e, _ := seqEnd(data, i)
			i, last = e, 0
			continue
		case c == bs:
			n -= last
			i, last = i+1, 0
			continue
		}
		if sn, sc := specialAt(data, i); sn > 0 { // a separator, or fullwidth ASCII: one character
			i, last = i+sn, min(int(sc), 1)
			n += last
			continue
		}
		l, _ := kvChar(data, i)
		n, last = n+l, l
		i += max(l, 1)
	}
	return n
}
