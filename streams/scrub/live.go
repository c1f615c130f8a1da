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
	prog *syntax.Prog
}

// nfaScratch is reused between runs (one per scratch, not shared).
type nfaScratch struct {
	cur, next sparseSet
	stack     []uint32
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
	add(&sc.cur, uint32(prog.Start), syntax.EmptyOpContext(r1, r), atEnd)
	for {
		if len(sc.cur.dense) == 0 {
			return alive, matched
		}
		if pos == len(in) {
			if !final {
				for _, pc := range sc.cur.dense {
					if isRuneInst(prog.Inst[pc].Op) {
						return true, matched
					}
				}
			}
			return alive, matched
		}
		if !final && !utf8.FullRune(in[pos:]) {
			return true, matched // a rune may still be completing
		}
		npos := pos + w
		nr, nw := decode(in, npos)
		ctx := syntax.EmptyOpContext(r, nr)
		nAtEnd := npos == len(in) && !final
		sc.next.dense = sc.next.dense[:0]
		for _, pc := range sc.cur.dense {
			inst := &prog.Inst[pc]
			ok := false
			switch inst.Op {
			case syntax.InstRune, syntax.InstRune1:
				ok = inst.MatchRune(r)
			case syntax.InstRuneAny:
				ok = true
			case syntax.InstRuneAnyNotNL:
				ok = r != '\n'
			}
			if ok {
				add(&sc.next, inst.Out, ctx, nAtEnd)
			}
		}
		sc.cur, sc.next = sc.next, sc.cur
		pos, r, w = npos, nr, nw
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
