package scrub

import (
	"encoding/binary"
	"math"
	"regexp/syntax"
	"slices"
	"unicode/utf8"
)

// Keyword floods (issue 15). A rule is evaluated at each of its keywords,
// and an evaluation costs what it reads. Most die a few bytes after the
// keyword, and deadEnd makes a repeated death a compare. But a value class
// that runs long before the rule fails ("token>" or "eyJ" repeated up to a
// newline: no "</", no '.') was read again from every keyword in it,
// quadratic in the run. So when a failed evaluation read past floodHits
// more keywords of its rule, floodCover proves at once, in one pass, that
// the evaluations at those keywords fail too, up to the first one that
// might not; that one and the rest are evaluated as usual. Nothing is
// redacted or kept on the proof's account: the output is that of
// evaluating every keyword (TestFloodsAgainstReference), and each byte is
// read by a bounded number of evaluations of a rule.

// floodHits is how many more keywords of its rule a failed evaluation may
// read past before floodCover takes them.
const floodHits = 8

// floodScratch is floodCover's working memory (per scratch).
type floodScratch struct {
	cur, next sparseSet
	th, nth   []floodThread // per pc in cur (next)
	stack     []floodItem
	pend      []floodPend // threads to merge after an escape sequence
	inj       []floodInj  // starts to add after their keyword
}

// floodInj: a start at t.j, added at at (after its keyword) with the live
// program's cached state there.
type floodInj struct {
	at int
	t  floodThread
}

// floodPend: threads that go on at at, past an escape sequence.
type floodPend struct {
	at  int
	pcs []uint32
	th  []floodThread
}

// ruleAt: one of rule ri's keywords is at data[j:].
func (s *Set) ruleAt(data []byte, j int, ri int32) bool {
	found := false
	s.anchorsAt(data, j, func(a *anchor) { found = found || slices.Contains(a.rules, ri) })
	return found
}

// anchorsAt calls f with each anchor whose keyword is at data[j:].
func (s *Set) anchorsAt(data []byte, j int, f func(*anchor)) {
	n := len(data)
	if j+4 <= n {
		key := binary.LittleEndian.Uint32(data[j:j+4]) | fold4
		for _, ai := range s.pf.m4.get(key) {
			if a := &s.anchors[ai]; litAt(data, j, a.lit) {
				f(a)
			}
		}
	}
	if j+3 <= n {
		key := uint32(foldByte(data[j])) | uint32(foldByte(data[j+1]))<<8 | uint32(foldByte(data[j+2]))<<16
		for _, sa := range s.pf.short {
			if a := &s.anchors[sa.ai]; sa.key == key && litAt(data, j, a.lit) {
				f(a)
			}
		}
	}
}

func litAt(data []byte, j int, lit []byte) bool {
	if len(data)-j < len(lit) {
		return false
	}
	for k, c := range lit {
		if lowerByte(data[j+k]) != c {
			return false
		}
	}
	return true
}

// nextRuleHit returns the first keyword of rule ri in sc.hits[*k:] at a
// position after after and before lim (advancing *k), or -1.
func (s *Set) nextRuleHit(sc *scratch, k *int, ri int32, after, lim int) int {
	for ; *k < len(sc.hits); *k++ {
		j := sc.hits[*k]
		if j <= after {
			continue
		}
		if j >= lim {
			return -1
		}
		if s.ruleAt(sc.data, j, ri) {
			return j
		}
	}
	return -1
}

// failed is called after rule ri's evaluation at keyword i found no match
// and no reason to wait: the live program died reading w[:died] (-1:
// unknown), and the evaluation read the raw data up to reach. It
// remembers where the program died and hands a flood to floodCover.
func (s *Set) failed(sc *scratch, ri int, w []byte, pb, i, died, reach int) {
	if sc.exhaustive {
		return
	}
	sc.lastFail[ri] = i
	if d := died; d > 0 && d <= maxDeadKey {
		sc.dead[ri].add(w[:d], pb)
	}
	if reach-i < floodHits*3 { // keywords are 3 bytes or more
		return
	}
	k, n, j := sc.hitIdx+1, 0, i
	for n < floodHits {
		if j = s.nextRuleHit(sc, &k, int32(ri), j, reach); j < 0 {
			return
		}
		n++
	}
	s.floodCover(sc, ri, i, reach)
}

// floodCover: rule ri's evaluation at keyword i failed after reading to x,
// past floodHits more keywords of the rule. It runs the rule's program
// from each later keyword of the rule (those before i+window; and once no
// thread is left at or after x, no more) with the threads merged: per
// instruction, one thread carrying the earliest start it stands for and
// the least stripped position (what a window counts: escape sequences
// left out) of those starts. Assertions are evaluated on the raw bytes
// (all threads are at the same place) except where they cannot be
// (at a start, next to an escape sequence): there they hold. A thread
// goes past a complete escape sequence as evalStripped does (a start
// inside one reads it raw). A non-ASCII byte may end a rune or not.
// The union so allows all the evaluations could do. The first start whose
// thread could match or outlive its window (fail closed) is where the
// proof stops: every keyword before it would fail, and is skipped
// (lastEnd); it and later ones are evaluated as usual. The keywords'
// results are those of evaluating each: nothing is redacted here.
func (s *Set) floodCover(sc *scratch, ri, i, x int) {
	data, final := sc.data, sc.final
	r := s.rules[ri]
	lp := r.live
	prog := lp.prog
	fs := &sc.flood
	ni := len(prog.Inst)
	fs.cur.init(ni)
	fs.next.init(ni)
	if len(fs.th) < ni {
		fs.th, fs.nth = make([]floodThread, ni), make([]floodThread, ni)
	}
	fs.pend, fs.inj = fs.pend[:0], fs.inj[:0]
	injAt := 0 // fs.inj[injAt:] are to come
	kc := &sc.kwState[ri]
	useKc := kc.ok && !kc.matched && lp.eps[prog.Start] != nil
	n := len(data)
	limA := i + r.window
	rawLimit := 2*r.window + 4*csiMax
	k := sc.hitIdx + 1
	j1 := s.floodStart(sc, &k, ri, i, limA)
	if j1 < 0 {
		return
	}
	const none = int32(math.MaxInt32)
	stop := none // the first start that could match or fail closed
	ns, last := j1, j1
	skipped := 0 // bytes of escape sequences passed so far
	seqTo := 0   // the end of the last of them
	// add puts pc and what it reaches without input into set.
	// (closed: pc only, its closure is in the set already.)
	add := func(set *sparseSet, th []floodThread, pc uint32, t floodThread, ctx syntax.EmptyOp, over, closed bool) {
		if e := lp.eps[pc]; !closed && e != nil {
			// no assertion on the way: the closure is known
			for _, q := range e {
				if set.has(q) {
					o := th[q]
					th[q] = floodThread{min(t.j, o.j), min(t.t, o.t)}
				} else {
					set.add(q)
					th[q] = t
				}
			}
			if lp.epsMatch[pc] {
				stop = min(stop, t.j)
			}
			return
		}
		stack := append(fs.stack[:0], floodItem{pc, t})
		for len(stack) > 0 {
			it := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			pc, t := it.pc, it.t
			if set.has(pc) {
				o := th[pc]
				if t.j >= o.j && t.t >= o.t {
					continue
				}
				t = floodThread{min(t.j, o.j), min(t.t, o.t)}
			} else {
				set.add(pc)
			}
			th[pc] = t
			if closed {
				continue
			}
			inst := &prog.Inst[pc]
			switch inst.Op {
			case syntax.InstAlt, syntax.InstAltMatch:
				stack = append(stack, floodItem{inst.Arg, t}, floodItem{inst.Out, t})
			case syntax.InstCapture, syntax.InstNop:
				stack = append(stack, floodItem{inst.Out, t})
			case syntax.InstEmptyWidth:
				if over || syntax.EmptyOp(inst.Arg)&^ctx == 0 {
					stack = append(stack, floodItem{inst.Out, t})
				}
			case syntax.InstMatch:
				stop = min(stop, t.j)
			}
		}
		fs.stack = stack
	}
	pos := j1
	for {
		// threads that went past an escape sequence ending here (their
		// closure saw the character after it)
		for q := 0; q < len(fs.pend); {
			if p := &fs.pend[q]; p.at == pos {
				for t, pc := range p.pcs {
					if p.th[t].j < stop {
						add(&fs.cur, fs.th, pc, p.th[t], 0, false, true)
					}
				}
				fs.pend[q], fs.pend[len(fs.pend)-1] = fs.pend[len(fs.pend)-1], fs.pend[q]
				fs.pend = fs.pend[:len(fs.pend)-1]
				continue
			}
			q++
		}
		// starts whose keyword was stepped over with the state cached
		for ; injAt < len(fs.inj) && fs.inj[injAt].at == pos; injAt++ {
			if t := fs.inj[injAt].t; t.j < stop {
				for _, pc := range kc.pcs {
					add(&fs.cur, fs.th, pc, t, 0, false, true)
				}
			}
		}
		if injAt == len(fs.inj) {
			fs.inj, injAt = fs.inj[:0], 0
		}
		if len(fs.cur.dense) == 0 && len(fs.pend) == 0 && len(fs.inj) == 0 && (stop != none || pos >= x || ns < 0) {
			break // every thread of the starts before pos (or stop) has died
		}
		if ns == pos && stop == none {
			t := floodThread{int32(pos), int32(pos - skipped)}
			if e := pos + kc.pos; useKc && e < n && data[e] != 0x1b && string(data[pos:e+1]) == string(kc.key) {
				// The live program's state after this keyword and the
				// byte after it is known (liveFrom): no assertion reads
				// the byte before the keyword.
				fs.inj = append(fs.inj, floodInj{e, t})
			} else {
				add(&fs.cur, fs.th, uint32(prog.Start), t, 0, true, false)
			}
			last = pos
			ns = s.floodStart(sc, &k, ri, pos, limA)
		}
		if len(fs.cur.dense) == 0 {
			next := -1
			if stop == none {
				next = ns
			}
			for _, p := range fs.pend {
				if next < 0 || p.at < next {
					next = p.at
				}
			}
			if len(fs.inj) > 0 && (next < 0 || fs.inj[injAt].at < next) {
				next = fs.inj[injAt].at
			}
			if next < 0 {
				break
			}
			pos = next // no thread in between
			continue
		}
		if pos >= last+rawLimit {
			break // past every window: these starts read no further
		}
		if pos == n {
			if !final {
				sc.holdAt(i, j1) // decided when more arrives
				return
			}
			break
		}
		c := data[pos]
		if c == 0x1b {
			e, pending := seqEnd(data, pos)
			if pending && !final {
				sc.holdAt(i, j1)
				return
			}
			if !pending && e > pos+1 {
				// The threads go on after the sequence; a start inside it
				// reads it as it is.
				e = nfExtend(data, pos, e)
				fs.pend = append(fs.pend, floodPend{})
				p := &fs.pend[len(fs.pend)-1]
				*p = floodPend{at: e, pcs: append(p.pcs[:0], fs.cur.dense...), th: p.th[:0]}
				for _, pc := range fs.cur.dense {
					p.th = append(p.th, fs.th[pc])
				}
				fs.cur.dense = fs.cur.dense[:0]
				skipped += e - pos
				seqTo = max(seqTo, e)
				pos++
				continue
			}
		}
		// The context of the assertions after c: the next character as
		// a window shows it (past escape sequences; raw inside one, for
		// a start there), unknown at the end of data that does not end
		// the stream.
		q := pos + 1
		if q >= seqTo {
			q = strippedFrom(data, q, final)
		}
		over := q < 0 || q == n && !final
		var ctx syntax.EmptyOp
		if !over {
			nr := rune(-1)
			if q < n {
				nr = byteRune(data[q])
			}
			ctx = syntax.EmptyOpContext(byteRune(c), nr)
		}
		fs.next.dense = fs.next.dense[:0]
		oldest := floodThread{math.MaxInt32, math.MaxInt32} // of the threads going on
		for _, pc := range fs.cur.dense {
			inst := &prog.Inst[pc]
			t := fs.th[pc]
			if t.j >= stop || !isRuneInst(inst.Op) {
				continue
			}
			oldest = floodThread{min(oldest.j, t.j), min(oldest.t, t.t)}
			if c < utf8.RuneSelf {
				if lp.ascii[pc].has(c) {
					add(&fs.next, fs.nth, inst.Out, t, ctx, over, false)
				}
			} else if lp.nonASCII[pc] {
				// byte by byte: the rune may end here or go on
				add(&fs.next, fs.nth, inst.Out, t, ctx, over, false)
				add(&fs.next, fs.nth, pc, t, ctx, over, false)
			}
		}
		fs.cur, fs.next = fs.next, fs.cur
		fs.th, fs.nth = fs.nth, fs.th
		pos++
		// A start's window ends after window characters or rawLimit bytes
		// (evalStripped); the earliest start reaches both first (but for a
		// start inside an escape sequence).
		for _, pc := range fs.cur.dense {
			if pos-skipped-int(oldest.t) < r.window && pos-int(oldest.j) < rawLimit {
				break // (no thread is that old)
			}
			if t := fs.th[pc]; (pos-skipped-int(t.t) >= r.window || pos-int(t.j) >= rawLimit) && t.j < stop {
				stop = t.j // may reach the end of its window alive: fail closed
			}
		}
	}
	covered := min(pos, limA)
	if stop != none {
		covered = int(stop)
	}
	sc.lastEnd[ri] = max(sc.lastEnd[ri], covered)
}

// floodThread: of the starts a merged thread stands for, the earliest
// (raw position) and the least stripped position.
type floodThread struct{ j, t int32 }

type floodItem struct {
	pc uint32
	t  floodThread
}

// strippedFrom returns the position of the first byte at or after q that
// is not part of a complete escape sequence (evalStripped leaves them
// out), or -1 if that is not known yet.
func strippedFrom(data []byte, q int, final bool) int {
	for q < len(data) && data[q] == 0x1b {
		e, pending := seqEnd(data, q)
		if pending && !final {
			return -1
		}
		if pending || e <= q+1 {
			break
		}
		q = nfExtend(data, q, e)
	}
	return q
}

// byteRune is how an assertion sees byte c: a non-ASCII byte belongs to a
// rune that is neither a word character nor a newline.
func byteRune(c byte) rune {
	if c < utf8.RuneSelf {
		return rune(c)
	}
	return utf8.RuneError
}

// floodStart returns the next keyword of rule ri in sc.hits[*k:] after
// after and before lim that the rule is evaluated at (evalAnchor,
// evalRule: the byte after the keyword, the word boundary before it, the
// not_after words), or -1.
func (s *Set) floodStart(sc *scratch, k *int, ri, after, lim int) int {
	for ; *k < len(sc.hits); *k++ {
		j := sc.hits[*k]
		if j <= after {
			continue
		}
		if j >= lim {
			return -1
		}
		if s.evaluatedAt(sc, ri, sc.data, j) {
			return j
		}
		after = j
	}
	return -1
}

// evaluatedAt: evalAnchor and evalRule would run rule ri at j (a keyword
// of it is there).
func (s *Set) evaluatedAt(sc *scratch, ri int, data []byte, j int) bool {
	r := s.rules[ri]
	follows := false
	s.anchorsAt(data, j, func(a *anchor) {
		x := slices.Index(a.rules, int32(ri))
		next := j + len(a.lit)
		follows = follows || x >= 0 && (next >= len(data) || a.follow[x].has(data[next]))
	})
	if !follows {
		return false
	}
	for _, w := range r.src.NotAfter {
		if endsWithFold(sc.before, data[:j], w) {
			return false
		}
	}
	if r.lb != 0 { // (j > 0: a keyword after another)
		pb := int(data[j-1])
		if afterSeq(sc, data, j) {
			pb = ' '
		}
		if (isWordByte(pb) != isWordByte(int(data[j]))) != (r.lb == syntax.EmptyWordBoundary) {
			return false
		}
	}
	return true
}
