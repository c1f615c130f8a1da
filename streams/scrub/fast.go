package scrub

import (
	"regexp/syntax"
	"unicode/utf8"
)

// fastRule matches, without Go's regexp, a rule whose regexp (leading
// assertion stripped) is a concatenation of simple items:
//
//	literal alternatives (finite sets of ASCII strings, optionally
//	ASCII-case-folded), character classes with a repeat, \b, \B and
//	capture groups around such items.
//
// It is a backtracking matcher with Perl priorities (alternatives in
// order, greedy repeats longest first, lazy shortest first), so it
// returns the same match and groups as the regexp on the same window; it
// counts runes like the regexp (invalid bytes are one U+FFFD each).
// TestFastMatcherAgrees checks this against regexp for every such rule.
//
// (?i) literals fold ASCII only; the regexp also folds k to U+212A and s
// to U+017F. Rules are anchored at ASCII keywords, so this only matters for
// such runes later in a match.
type fastRule struct {
	items []item
	ncap  int
}

type itemKind uint8

const (
	itLits itemKind = iota
	itRep
	itAssert
	itCapOpen
	itCapClose
)

type item struct {
	kind     itemKind
	lits     [][]byte // itLits: alternatives in priority order
	fold     bool     // itLits: ASCII case-insensitive
	class    byteSet  // itRep: ASCII members
	nonASCII bool     // itRep: every rune >= 0x80 is a member
	min, max int      // itRep: max < 0 unbounded
	lazy     bool
	op       syntax.EmptyOp // itAssert
	cap      int            // itCapOpen/itCapClose: group number
}

// compileFast returns nil when ast does not have the simple shape.
func compileFast(ast *syntax.Regexp) *fastRule {
	f := &fastRule{ncap: ast.MaxCap()}
	if !f.add(ast) {
		return nil
	}
	return f
}

func (f *fastRule) add(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpConcat:
		for _, s := range re.Sub {
			if !f.add(s) {
				return false
			}
		}
		return true
	case syntax.OpCapture:
		f.items = append(f.items, item{kind: itCapOpen, cap: re.Cap})
		if !f.add(re.Sub[0]) {
			return false
		}
		f.items = append(f.items, item{kind: itCapClose, cap: re.Cap})
		return true
	case syntax.OpWordBoundary:
		f.items = append(f.items, item{kind: itAssert, op: syntax.EmptyWordBoundary})
		return true
	case syntax.OpNoWordBoundary:
		f.items = append(f.items, item{kind: itAssert, op: syntax.EmptyNoWordBoundary})
		return true
	case syntax.OpCharClass:
		it, ok := classItem(re)
		if !ok {
			return false
		}
		it.min, it.max = 1, 1
		f.items = append(f.items, it)
		return true
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		sub := re.Sub[0]
		var it item
		var ok bool
		switch sub.Op {
		case syntax.OpCharClass:
			it, ok = classItem(sub)
		case syntax.OpAnyChar:
			it, ok = item{kind: itRep, nonASCII: true}, true
			for c := 0; c < 0x80; c++ {
				it.class.add(byte(c))
			}
		case syntax.OpLiteral:
			if len(sub.Rune) == 1 && sub.Rune[0] < 0x80 && sub.Flags&syntax.FoldCase == 0 {
				it, ok = item{kind: itRep}, true
				it.class.add(byte(sub.Rune[0]))
			}
		}
		if !ok {
			if re.Op == syntax.OpQuest {
				return f.addLits(re)
			}
			return false
		}
		switch re.Op {
		case syntax.OpStar:
			it.min, it.max = 0, -1
		case syntax.OpPlus:
			it.min, it.max = 1, -1
		case syntax.OpQuest:
			it.min, it.max = 0, 1
		default:
			it.min, it.max = re.Min, re.Max
		}
		it.lazy = re.Flags&syntax.NonGreedy != 0
		f.items = append(f.items, it)
		return true
	case syntax.OpLiteral, syntax.OpAlternate:
		return f.addLits(re)
	}
	return false
}

func (f *fastRule) addLits(re *syntax.Regexp) bool {
	lits, fold, ok := literals(re)
	if !ok {
		return false
	}
	it := item{kind: itLits, fold: fold}
	for _, l := range lits {
		it.lits = append(it.lits, []byte(l))
	}
	f.items = append(f.items, it)
	return true
}

// classItem converts a character class whose non-ASCII part is empty or
// everything from 0x80 up.
func classItem(re *syntax.Regexp) (item, bool) {
	it := item{kind: itRep}
	r := re.Rune
	for j := 0; j+1 < len(r); j += 2 {
		lo, hi := r[j], r[j+1]
		if lo >= 0x80 {
			if lo != 0x80 || hi != utf8.MaxRune {
				return it, false
			}
			it.nonASCII = true
			continue
		}
		if hi >= 0x80 {
			if hi != utf8.MaxRune {
				return it, false
			}
			it.nonASCII = true
			hi = 0x7f
		}
		for c := lo; c <= hi; c++ {
			it.class.add(byte(c))
		}
	}
	return it, true
}

// literals expands re into the finite set of ASCII strings it matches,
// in priority order. fold: the strings are lower case and match ASCII
// case-insensitively (all of re's letters fold, or none do).
func literals(re *syntax.Regexp) (out []string, fold, ok bool) {
	const limit = 256
	switch re.Op {
	case syntax.OpLiteral:
		fold = re.Flags&syntax.FoldCase != 0
		b := make([]byte, 0, len(re.Rune))
		for _, r := range re.Rune {
			if r >= 0x80 {
				return nil, false, false
			}
			c := byte(r)
			if fold {
				c = lowerByte(c)
			}
			b = append(b, c)
		}
		return []string{string(b)}, fold, true
	case syntax.OpCharClass:
		for j := 0; j+1 < len(re.Rune); j += 2 {
			if re.Rune[j+1] >= 0x80 || len(out)+int(re.Rune[j+1]-re.Rune[j]) >= limit {
				return nil, false, false
			}
			for c := re.Rune[j]; c <= re.Rune[j+1]; c++ {
				out = append(out, string(rune(c)))
			}
		}
		return out, false, true
	case syntax.OpEmptyMatch:
		return []string{""}, false, true
	case syntax.OpQuest:
		l, f, ok := literals(re.Sub[0])
		if !ok {
			return nil, false, false
		}
		if re.Flags&syntax.NonGreedy != 0 {
			return append([]string{""}, l...), f, true
		}
		return append(l, ""), f, true
	case syntax.OpConcat, syntax.OpAlternate:
		if re.Op == syntax.OpConcat {
			out = []string{""}
		}
		known := false // fold is decided by the first part with letters
		for _, s := range re.Sub {
			l, f, ok := literals(s)
			if !ok || len(out)*len(l)+len(out) > limit {
				return nil, false, false
			}
			if hasLetter(l) {
				if known && f != fold {
					return nil, false, false
				}
				fold, known = f, true
			}
			if re.Op == syntax.OpAlternate {
				out = append(out, l...)
				continue
			}
			var next []string
			for _, a := range out {
				for _, b := range l {
					next = append(next, a+b)
				}
			}
			out = next
		}
		return out, fold, true
	}
	return nil, false, false
}

func hasLetter(l []string) bool {
	for _, s := range l {
		for i := 0; i < len(s); i++ {
			if lowerByte(s[i]) != s[i] || 'a' <= s[i] && s[i] <= 'z' {
				return true
			}
		}
	}
	return false
}

// fastState is the matcher's working memory.
type fastState struct {
	w     []byte
	prev  int
	caps  []int
	steps int
	stack []int // backtrack positions of greedy repeats
	far   int   // how many bytes of w the match read (or looked at)
}

func (st *fastState) pushStart() int { return len(st.stack) }
func (st *fastState) push(p int)     { st.stack = append(st.stack, p) }
func (st *fastState) len() int       { return len(st.stack) }
func (st *fastState) popTo(n int)    { st.stack = st.stack[:n] }
func (st *fastState) pop() int {
	p := st.stack[len(st.stack)-1]
	st.stack = st.stack[:len(st.stack)-1]
	return p
}

// match runs the items anchored at the start of w (prev: byte before w,
// for assertions; -1 none). It returns the regexp-style submatch index
// slice in loc (reused), or nil if there is no match. ok=false: the work
// bound was hit and the caller must use the regexp.
func (f *fastRule) match(st *fastState, w []byte, prev int, loc []int) ([]int, bool) {
	st.w, st.prev, st.steps, st.stack, st.far = w, prev, 0, st.stack[:0], 0
	n := 2 * (f.ncap + 1)
	if cap(st.caps) < n {
		st.caps = make([]int, n)
	}
	st.caps = st.caps[:n]
	for i := range st.caps {
		st.caps[i] = -1
	}
	end := f.try(st, 0, 0)
	if end == -2 {
		return nil, false
	}
	if end < 0 {
		return nil, true
	}
	loc = append(loc[:0], st.caps...)
	loc[0], loc[1] = 0, end
	return loc, true
}

const fastStepLimit = 1 << 14

// try matches items[k:] at pos; returns the match end, -1 for no match,
// -2 when the step bound is exceeded.
func (f *fastRule) try(st *fastState, k, pos int) int {
	st.steps++
	if st.steps > fastStepLimit {
		return -2
	}
	w := st.w
	for k < len(f.items) {
		it := &f.items[k]
		switch it.kind {
		case itCapOpen, itCapClose:
			slot := 2 * it.cap
			if it.kind == itCapClose {
				slot++
			}
			old := st.caps[slot]
			st.caps[slot] = pos
			if e := f.try(st, k+1, pos); e != -1 {
				return e
			}
			st.caps[slot] = old
			return -1
		case itAssert:
			before := st.prev
			if pos > 0 {
				before = int(w[pos-1])
			}
			after := -1
			if pos < len(w) {
				after = int(w[pos])
				st.far = max(st.far, pos+1)
			}
			wb := isWordByte(before) != isWordByte(after)
			if wb != (it.op == syntax.EmptyWordBoundary) {
				return -1
			}
			k++
		case itLits:
			if len(it.lits) == 1 {
				st.far = max(st.far, min(len(w), pos+len(it.lits[0])))
				if !hasLit(w[pos:], it.lits[0], it.fold) {
					return -1
				}
				pos += len(it.lits[0])
				k++
				continue
			}
			for _, l := range it.lits {
				st.far = max(st.far, min(len(w), pos+len(l)))
				if hasLit(w[pos:], l, it.fold) {
					if e := f.try(st, k+1, pos+len(l)); e != -1 {
						return e
					}
				}
			}
			return -1
		case itRep:
			p := pos
			count := 0
			limit := it.max
			// advance min times
			for count < it.min {
				q, ok := it.step(w, p)
				st.far = max(st.far, min(len(w), max(q, p+1)))
				if !ok {
					return -1
				}
				p, count = q, count+1
			}
			if it.min == it.max {
				pos = p
				k++
				continue
			}
			if it.lazy {
				for {
					if e := f.try(st, k+1, p); e != -1 {
						return e
					}
					if limit >= 0 && count >= limit {
						return -1
					}
					q, ok := it.step(w, p)
					st.far = max(st.far, min(len(w), max(q, p+1)))
					if !ok {
						return -1
					}
					p, count = q, count+1
				}
			}
			// greedy: go as far as possible, then back off one rune at a time
			stack := st.pushStart()
			for limit < 0 || count < limit {
				q, ok := it.step(w, p)
				if !ok {
					break
				}
				st.push(p)
				p, count = q, count+1
			}
			st.far = max(st.far, min(len(w), p+utf8.UTFMax)) // (the rune that stopped it)
			if k+1 == len(f.items) {
				st.popTo(stack)
				return p // nothing follows: the longest wins
			}
			for {
				if e := f.try(st, k+1, p); e != -1 {
					st.popTo(stack)
					return e
				}
				if st.len() == stack {
					return -1
				}
				p = st.pop()
			}
		}
	}
	return pos
}

func (it *item) step(w []byte, p int) (int, bool) {
	if p >= len(w) {
		return p, false
	}
	c := w[p]
	if c < utf8.RuneSelf {
		return p + 1, it.class.has(c)
	}
	if !it.nonASCII {
		return p, false
	}
	_, size := utf8.DecodeRune(w[p:])
	return p + size, true
}

func hasLit(t, l []byte, fold bool) bool {
	if len(t) < len(l) {
		return false
	}
	if !fold {
		return string(t[:len(l)]) == string(l)
	}
	for i, c := range l {
		if lowerByte(t[i]) != c {
			return false
		}
	}
	return true
}
