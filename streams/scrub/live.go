package scrub

import (
	"regexp/syntax"
	"unicode/utf8"
)

// liveProg answers the streaming question Go's regexp cannot: given the
// bytes seen so far from a keyword, can more input still produce or extend
// a match? It simulates the rule's program (a Thompson NFA over a set of
// pcs, no captures) anchored at the keyword.
type liveProg struct {
	prog  *syntax.Prog
	ascii []byteSet // per instruction: the ASCII bytes a rune instruction takes
	// nonASCII per instruction: it takes some rune >= 0x80 (or U+FFFD).
	nonASCII []bool
	// eps per instruction: the instructions reached from it without input
	// (itself first), nil if an assertion is on the way; epsMatch: a match
	// is among them.
	eps      [][]uint32
	epsMatch []bool
	// assertions: the program has one (else no context is computed).
	assertions bool
}

func newLiveProg(prog *syntax.Prog) *liveProg {
	p := &liveProg{prog: prog, ascii: make([]byteSet, len(prog.Inst)), nonASCII: make([]bool, len(prog.Inst))}
	for pc := range prog.Inst {
		inst := &prog.Inst[pc]
		if !isRuneInst(inst.Op) {
			continue
		}
		for c := 0; c < utf8.RuneSelf; c++ {
			if runeInstMatches(inst, rune(c)) {
				p.ascii[pc].add(byte(c))
			}
		}
		switch inst.Op {
		case syntax.InstRuneAny, syntax.InstRuneAnyNotNL:
			p.nonASCII[pc] = true
		default:
			// A range above 0x7f, or folding that reaches one (k: U+212A).
			p.nonASCII[pc] = syntax.Flags(inst.Arg)&syntax.FoldCase != 0 || inst.MatchRune(utf8.RuneError)
			for _, r := range inst.Rune {
				p.nonASCII[pc] = p.nonASCII[pc] || r >= utf8.RuneSelf
			}
		}
	}
	p.eps, p.epsMatch = make([][]uint32, len(prog.Inst)), make([]bool, len(prog.Inst))
	for pc := range prog.Inst {
		p.assertions = p.assertions || prog.Inst[pc].Op == syntax.InstEmptyWidth
		seen := map[uint32]bool{}
		var list []uint32
		stack := []uint32{uint32(pc)}
		plain := true
		for len(stack) > 0 && plain {
			q := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[q] {
				continue
			}
			seen[q] = true
			list = append(list, q)
			switch inst := &prog.Inst[q]; inst.Op {
			case syntax.InstAlt, syntax.InstAltMatch:
				stack = append(stack, inst.Arg, inst.Out)
			case syntax.InstCapture, syntax.InstNop:
				stack = append(stack, inst.Out)
			case syntax.InstEmptyWidth:
				plain = false
			case syntax.InstMatch:
				p.epsMatch[pc] = true
			}
		}
		if plain {
			p.eps[pc] = list
		}
	}
	return p
}

func runeInstMatches(inst *syntax.Inst, r rune) bool {
	switch inst.Op {
	case syntax.InstRuneAny:
		return true
	case syntax.InstRuneAnyNotNL:
		return r != '\n'
	}
	return inst.MatchRune(r)
}

// liveResume is where a run on an open window stopped: the threads at pos
// (the start of the window's last rune, whose closure saw that rune), so
// that the next run on the same window, grown, goes on from there instead
// of reading it all again (a Writer rescans a held candidate as it grows).
type liveResume struct {
	ok      bool
	start   int64 // stream offset of the window
	pb      int
	pos     int
	matched bool
	pcs     []uint32
	key     []byte // a keyword cache's: the window's first pos+1 bytes
}

// liveFrom says where a run may begin other than at the start: res, a
// state of an earlier run on the same window (stream offset start), or
// kc, the state after the keyword (its first kw bytes) and the byte after
// it, cached from the last run of the program that began with the same
// bytes (a flood repeats its keyword: its closure costs more than the
// rest of a short run).
type liveFrom struct {
	res   *liveResume
	start int64
	kc    *liveResume
	kw    int
}

// nfaScratch is reused between runs (one per scratch, not shared).
type nfaScratch struct {
	cur, next sparseSet
	stack     []uint32
	// After a run that returned neither alive nor matched: died is how
	// many bytes of in decided that whatever follows them (the threads all
	// died reading in[:died]), -1 if the end of a final in decided it;
	// reach is how far the threads got (died, or len(in)). Both are -1
	// after any other run.
	died, reach int
}

type sparseSet struct {
	dense  []uint32
	sparse []uint32
}

func (s *sparseSet) init(n int) {
	if cap(s.sparse) < n {
		s.sparse = make([]uint32, n)
		s.dense = make([]uint32, 0, n)
	}
	s.sparse = s.sparse[:n]
	s.dense = s.dense[:0]
}

func (s *sparseSet) has(pc uint32) bool {
	i := s.sparse[pc]
	return int(i) < len(s.dense) && s.dense[i] == pc
}

func (s *sparseSet) add(pc uint32) {
	s.sparse[pc] = uint32(len(s.dense))
	s.dense = append(s.dense, pc)
}

// run simulates the program over in, which starts at the keyword; prev is
// the byte before it (-1 at stream start). If final, in ends the text.
// alive reports that more input could still change the result: a thread
// waits for input at the end, or an assertion there depends on the next
// byte. matched reports that a match ends somewhere within in.
func (p *liveProg) run(sc *nfaScratch, in []byte, prev int, final bool) (alive, matched bool) {
	return p.resume(sc, in, prev, final, liveFrom{})
}

// resume is run, going on from f.res if that is a state of a run on a
// prefix of in with the same start (stream offset of in[0]) and prev
// (saving where it stops there when in ends first), else from f.kc if in
// begins with its key.
func (p *liveProg) resume(sc *nfaScratch, in []byte, prev int, final bool, f liveFrom) (alive, matched bool) {
	res, start, kc := f.res, f.start, f.kc
	prog := p.prog
	sc.cur.init(len(prog.Inst))
	sc.next.init(len(prog.Inst))
	r1 := rune(prev)
	if prev < 0 {
		r1 = -1
	}
	pos := 0
	r, w := decode(in, 0)
	atEnd := len(in) == 0 && !final
	add := func(set *sparseSet, pc uint32, ctx syntax.EmptyOp, atEnd bool) {
		if e := p.eps[pc]; e != nil && !set.has(pc) {
			for _, q := range e { // no assertion on the way
				if !set.has(q) {
					set.add(q)
				}
			}
			matched = matched || p.epsMatch[pc]
			return
		}
		stack := append(sc.stack[:0], pc)
		for len(stack) > 0 {
			pc := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if set.has(pc) {
				continue
			}
			set.add(pc)
			inst := &prog.Inst[pc]
			switch inst.Op {
			case syntax.InstAlt, syntax.InstAltMatch:
				stack = append(stack, inst.Arg, inst.Out)
			case syntax.InstCapture, syntax.InstNop:
				stack = append(stack, inst.Out)
			case syntax.InstEmptyWidth:
				if atEnd {
					alive = true // depends on bytes not seen yet
				} else if syntax.EmptyOp(inst.Arg)&^ctx == 0 {
					stack = append(stack, inst.Out)
				}
			case syntax.InstMatch:
				matched = true
			}
		}
		sc.stack = stack
	}
	sc.died, sc.reach = -1, -1
	capture := -1 // where to save the state for kc
	var from *liveResume
	switch {
	case res != nil && res.ok && res.start == start && res.pb == prev && res.pos < len(in) && utf8.FullRune(in[res.pos:]):
		from = res
	case kc != nil && kc.ok && kc.pb == prev && len(in) > kc.pos && string(in[:kc.pos+1]) == string(kc.key):
		from = kc
	}
	if from != nil {
		for _, pc := range from.pcs {
			sc.cur.add(pc)
		}
		pos, matched = from.pos, from.matched
		r, w = decode(in, pos)
	} else {
		add(&sc.cur, uint32(prog.Start), syntax.EmptyOpContext(r1, r), atEnd)
		if kc != nil && f.kw > 0 && len(in) > f.kw && in[f.kw] < utf8.RuneSelf {
			capture = f.kw
		}
	}
	ppos, pmatched := -1, false // the state before the last step
	for {
		if len(sc.cur.dense) == 0 {
			if !alive && !matched {
				// The last step read the rune at pos (for the context of
				// an assertion): an invalid byte may have been judged by
				// up to UTFMax bytes.
				sc.died = pos + 1
				if r < 0 || r >= utf8.RuneSelf {
					sc.died = pos + utf8.UTFMax
				}
				sc.died = min(sc.died, len(in))
				sc.reach = sc.died
			}
			return alive, matched
		}
		if pos == len(in) {
			if !final {
				for _, pc := range sc.cur.dense {
					if isRuneInst(prog.Inst[pc].Op) {
						if res != nil && ppos >= 0 {
							// sc.next is the set at ppos
							*res = liveResume{ok: true, start: start, pb: prev, pos: ppos, matched: pmatched, pcs: append(res.pcs[:0], sc.next.dense...)}
						}
						return true, matched
					}
				}
			}
			if !alive && !matched {
				sc.reach = len(in)
				if !final {
					sc.died = len(in) // no thread can take another byte
				}
			}
			return alive, matched
		}
		if !final && in[pos] >= utf8.RuneSelf && !utf8.FullRune(in[pos:]) {
			return true, matched // a rune may still be completing
		}
		npos := pos + w
		nr, nw := decode(in, npos)
		var ctx syntax.EmptyOp
		if p.assertions {
			ctx = syntax.EmptyOpContext(r, nr)
		}
		nAtEnd := npos == len(in) && !final
		sc.next.dense = sc.next.dense[:0]
		ppos, pmatched = pos, matched
		for _, pc := range sc.cur.dense {
			inst := &prog.Inst[pc]
			ok := false
			if r >= 0 && r < utf8.RuneSelf {
				ok = p.ascii[pc].has(byte(r))
			} else {
				switch inst.Op {
				case syntax.InstRune, syntax.InstRune1:
					ok = inst.MatchRune(r)
				case syntax.InstRuneAny:
					ok = true
				case syntax.InstRuneAnyNotNL:
					ok = r != '\n'
				}
			}
			if ok {
				add(&sc.next, inst.Out, ctx, nAtEnd)
			}
		}
		sc.cur, sc.next = sc.next, sc.cur
		pos, r, w = npos, nr, nw
		if pos == capture {
			// the closure here saw the byte after the keyword
			kc.ok, kc.pb, kc.pos, kc.matched = true, prev, pos, matched
			kc.pcs = append(kc.pcs[:0], sc.cur.dense...)
			kc.key = append(kc.key[:0], in[:pos+1]...)
		}
	}
}

func isRuneInst(op syntax.InstOp) bool {
	switch op {
	case syntax.InstRune, syntax.InstRune1, syntax.InstRuneAny, syntax.InstRuneAnyNotNL:
		return true
	}
	return false
}

// decode returns the rune at in[i:] as Go's regexp sees it (invalid bytes
// are utf8.RuneError of width 1), or -1 at the end.
func decode(in []byte, i int) (rune, int) {
	if i >= len(in) {
		return -1, 0
	}
	if c := in[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRune(in[i:])
}
