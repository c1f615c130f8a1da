package scrub

import (
	"bytes"
	"encoding/binary"
	"math"
	"regexp/syntax"
	"slices"
)

// region is one redaction: data[start:end] becomes lab.repl. mstart/mend
// is the extent of the whole match (keyword to match end) that produced it:
// a writer never releases a prefix that cuts through such an extent, so a
// later scan finds the same match again.
type region struct {
	start, end   int
	mstart, mend int
	lab          *label
}

// scratch is the per-scan working memory (per Writer, pooled for Redact).
type scratch struct {
	hits    []int
	regs    []region
	lastEnd []int // per rule: end of its last match (hits inside are skipped)
	lastHit []int // per rule: last hit position evaluated
	// per rule: the last keyword it failed at (a dead end is looked for
	// only in failures close together)
	lastFail []int
	runs     []byteRun    // per byte class (crule.class): the last run measured
	strips   []stripCache // per byte class: the last stripped window built
	dead     []deadEnd    // per rule: the last window prefix its program died on
	flood    floodScratch
	data     []byte // the scan's data and whether it ends the stream (during scan)
	final    bool
	hitIdx   int // index in hits of the keyword being evaluated
	// A Writer's scans: data[0] is at stream offset base, and live runs
	// on open windows resume where the last scan's stopped (per rule).
	stream bool
	base   int64
	resume []liveResume
	// The last scan's prefilter candidates (stream offsets) and the end of
	// its data (prefilterScan).
	pfOK   bool
	pfEnd  int64
	pfHits []int64
	// Per rule: the live program's state after the last keyword it ran
	// from (liveFrom).
	kwState []liveResume
	// exhaustive (tests): evaluate every keyword in full, the reference
	// for deadEnd, floodCover and resume.
	exhaustive bool
	escFrom    int // data[escFrom:escAt] holds no ESC (escAt: the first, or len(data))
	escAt      int
	nfa        nfaScratch
	loc        []int
	fast       fastState
	kvs        kvScratch
	before     []byte // up to lookBehind input bytes before data (a Writer's)
	seqBuf     []byte // afterSeq's joined view
	// The current scan's results: data[hold:] must be kept; in flush mode
	// data[hold:rel] is only a keyword prefix (see scan).
	hold, rel int
	flush     bool
}

// holdAt records that data[i:] could be (part of) a secret and must be
// kept. lim is how far Flush may still release: data[i:lim] is at most a
// prefix of (or equal to) a rule keyword; lim == i for anything else (a
// prefix of a known value or encoding, a pending match, secret bytes).
func (sc *scratch) holdAt(i, lim int) {
	sc.hold = min(sc.hold, i)
	sc.rel = min(sc.rel, lim)
}

func (s *Set) getScratch() *scratch {
	if sc, ok := s.scratchPool().Get().(*scratch); ok {
		return sc
	}
	return &scratch{}
}

// scan examines data: the held bytes of a stream followed by new bytes;
// prev is the byte before data (-1 at stream start) and final says data
// ends the stream. It returns hold: data[:hold] is decided and
// sc.regs (sorted, non-overlapping) are the redactions within it; data[hold:]
// could still be (part of) a secret and must be kept for the next scan.
//
// data[hold:] starts at the earliest of: a proper prefix of an anchor
// reaching the end of data; a keyword whose rule could still match or
// extend with more input (and whose MaxLen window is not yet complete); a
// base64 value match whose extension is not decided; the start of any match
// that reaches past one of these.
//
// flush (Writer.Flush) also computes rel >= hold (else rel == hold):
// data[hold:rel] is held only because it is a prefix of (or equal to) a rule
// keyword, so it may be written out while still kept as context for the
// next scan. rel stops at the first byte past such a keyword prefix that a
// rule could still take as its secret part, at a prefix of a known value
// or encoding, at a pending base64 match and at any match start after hold.
// Candidates after hold are evaluated up to rel to find these.
func (s *Set) scan(sc *scratch, data []byte, prev int, final, flush bool) (hold, rel int) {
	n := len(data)
	sc.hold, sc.rel, sc.flush = n, n, flush
	sc.regs = sc.regs[:0]
	sc.data, sc.final = data, final
	defer func() { sc.data = nil }()
	sc.hits = sc.hits[:0]
	if s.pf != nil { // nil in a known-values-only Set (Pair)
		s.prefilterScan(sc, data)
	}
	if !final && s.pf != nil {
		for p := max(0, n-3); p < n; p++ {
			if s.pf.partial(data[p:]) {
				sc.holdAt(p, n)
				break
			}
		}
	}
	if len(sc.hits) > 0 {
		s.scanHits(sc, data, prev, final)
	}
	if s.kv != nil {
		s.scanKV(sc, data, final)
	}
	// A scan restarts at hold: never inside an escape sequence, which the
	// known-value matcher would then read as characters.
	for {
		if len(sc.regs) > 0 {
			s.settle(sc)
		}
		h := sc.hold
		if h < n {
			h = safeStart(data, h)
		}
		if h == sc.hold {
			break
		}
		sc.hold = h
	}
	if s.pf != nil {
		sc.keepHits(n, sc.hold)
	}
	if !flush {
		return sc.hold, sc.hold
	}
	return sc.hold, max(sc.hold, sc.rel)
}

// prefilterScan puts the prefilter's candidate starts for data in sc.hits.
// A Writer's scan reuses the last scan's for the bytes it had already
// seen (all but the last few, whose candidates depend on bytes after
// them): a Writer rescans a held candidate as it grows, and the prefilter
// is most of a rescan of a keyword flood.
func (s *Set) prefilterScan(sc *scratch, data []byte) {
	reuse := 0
	if sc.stream && !sc.exhaustive && sc.pfOK {
		if keep := sc.pfEnd - pfOverlap - sc.base; keep > 0 && keep <= int64(len(data)) {
			reuse = int(keep)
			for _, h := range sc.pfHits {
				if h -= sc.base; h >= 0 && h < keep {
					sc.hits = append(sc.hits, int(h))
				}
			}
		}
	}
	if reuse == 0 {
		sc.hits = s.pf.scan(data, sc.hits)
	} else {
		from := len(sc.hits)
		sc.hits = s.pf.scan(data[reuse:], sc.hits)
		out := sc.hits[:from]
		for _, h := range sc.hits[from:] {
			if h >= 0 { // (a start before data[reuse:] is among the reused)
				out = append(out, h+reuse)
			}
		}
		sc.hits = out
	}
	sc.pfOK = false // until keepHits
}

// keepHits remembers, after a Writer's scan, the prefilter's candidates in
// data[hold:], the bytes the Writer keeps for its next scan.
func (sc *scratch) keepHits(n, hold int) {
	if sc.pfOK = sc.stream; !sc.pfOK {
		return
	}
	sc.pfEnd = sc.base + int64(n)
	sc.pfHits = sc.pfHits[:0]
	for _, h := range sc.hits { // (ascending but for the tail starts)
		if h >= hold {
			sc.pfHits = append(sc.pfHits, sc.base+int64(h))
		}
	}
}

// pfOverlap: the prefilter's candidates for the last bytes of data depend
// on bytes after them (tailStarts, windows from minOff to maxOff+4).
const pfOverlap = 8

// scanHits evaluates the prefilter's candidate starts before sc.hold (in
// flush mode: before sc.rel).
func (s *Set) scanHits(sc *scratch, data []byte, prev int, final bool) {
	n := len(data)
	if cap(sc.lastEnd) < len(s.rules) {
		sc.lastEnd = make([]int, len(s.rules))
		sc.lastHit = make([]int, len(s.rules))
	}
	sc.lastEnd = sc.lastEnd[:len(s.rules)]
	sc.lastHit = sc.lastHit[:len(s.rules)]
	if len(sc.lastFail) != len(s.rules) {
		sc.lastFail = make([]int, len(s.rules))
	}
	for i := range sc.lastEnd {
		sc.lastEnd[i] = 0
		sc.lastHit[i] = -1
		sc.lastFail[i] = math.MinInt / 2
	}
	if len(sc.runs) != s.classes {
		sc.runs = make([]byteRun, s.classes)
	}
	clear(sc.runs)
	if len(sc.strips) < s.classes {
		sc.strips = make([]stripCache, s.classes)
	}
	for k := range sc.strips {
		sc.strips[k].ok = false
	}
	if len(sc.dead) != len(s.rules) {
		sc.dead = make([]deadEnd, len(s.rules))
		sc.resume = make([]liveResume, len(s.rules))
		sc.kwState = make([]liveResume, len(s.rules))
	}
	sc.escFrom, sc.escAt = 0, -1
	last := -2
	for k, i := range sc.hits {
		if i <= last || i < 0 {
			continue // repeated candidate (hits are ascending)
		}
		last = i
		sc.hitIdx = k
		if i >= sc.hold && (!sc.flush || i >= sc.rel) {
			break
		}
		if i+4 <= n {
			key := binary.LittleEndian.Uint32(data[i:i+4]) | fold4
			for _, ai := range s.pf.m4.get(key) {
				s.evalAnchor(sc, &s.anchors[ai], data, i, prev, final)
			}
		}
		if i+3 <= n && len(s.pf.short) > 0 {
			key := uint32(foldByte(data[i])) | uint32(foldByte(data[i+1]))<<8 | uint32(foldByte(data[i+2]))<<16
			for _, sa := range s.pf.short {
				if sa.key == key {
					s.evalAnchor(sc, &s.anchors[sa.ai], data, i, prev, final)
				}
			}
		}
	}
}

// evalAnchor verifies anchor a at data[i:] and evaluates what it triggers.
func (s *Set) evalAnchor(sc *scratch, a *anchor, data []byte, i, prev int, final bool) {
	t := data[i:]
	m := min(len(a.lit), len(t))
	for j := 0; j < m; j++ {
		if lowerByte(t[j]) != a.lit[j] {
			return
		}
	}
	if m < len(a.lit) { // a proper prefix reaches the end of data
		if !final {
			sc.holdAt(i, len(data)) // a keyword's prefix is harmless
		}
		return
	}
	next := i + len(a.lit)
	for j, ri := range a.rules {
		if sc.lastHit[ri] == i || i < sc.lastEnd[ri] {
			continue
		}
		if next < len(data) && !a.follow[j].has(data[next]) {
			continue // e.g. "tokenizer": no match can continue so
		}
		sc.lastHit[ri] = i
		s.evalRule(sc, int(ri), data, i, len(a.lit), prev, final)
	}
}

// evalRule runs rule ri anchored at keyword position i (kw: the keyword's
// length).
func (s *Set) evalRule(sc *scratch, ri int, data []byte, i, kw, prev int, final bool) {
	r := s.rules[ri]
	pb := prev
	if i > 0 {
		pb = int(data[i-1])
	}
	for _, w := range r.src.NotAfter {
		if endsWithFold(sc.before, data[:i], w) {
			return
		}
	}
	if r.lb != 0 {
		if pb >= 0 && afterSeq(sc, data, i) {
			pb = ' ' // a colour code before a token (grep --color): a terminal shows a boundary
		}
		wb := isWordByte(pb) != isWordByte(int(data[i]))
		if wb != (r.lb == syntax.EmptyWordBoundary) {
			return
		}
	}
	// The window: up to MaxLen+1 bytes, cut after the first byte no match
	// can contain (kept as lookahead for trailing assertions).
	end := min(i+r.window, len(data))
	cut := false
	if j := sc.runs[r.class].upTo(&r.bytes, data, i, end); j < end {
		end, cut = j+1, true
	}
	if sc.escBefore(data, i, end) {
		s.evalStripped(sc, ri, data, i, kw, pb, final)
		return
	}
	byLen := !cut && i+r.window <= len(data)
	short := !(cut || byLen) // the window ends with data
	s.matchWindow(sc, ri, data[i:end], nil, i, kw, pb, short && !final, byLen, short && final)
}

// liveRun is r.live.run on rule ri's window w at raw i (kw: the keyword's
// length), resumed where the last scan's run on the same open window
// stopped, or after the keyword if the last run began with the same bytes.
func (s *Set) liveRun(sc *scratch, ri int, w []byte, i, kw, pb int, final bool) (alive, matched bool) {
	r := s.rules[ri]
	if sc.exhaustive {
		return r.live.run(&sc.nfa, w, pb, final)
	}
	f := liveFrom{kc: &sc.kwState[ri], kw: kw}
	if sc.stream && !final {
		f.res, f.start = &sc.resume[ri], sc.base+int64(i)
	}
	return r.live.resume(&sc.nfa, w, pb, final, f)
}

// byteRun remembers, for one byte class, that data[from:to] holds only
// bytes of the class (and, if cut, that data[to] does not). Hits are
// evaluated in ascending order and many rules share a class, so a keyword
// flood ("token:token:...") measures each run once instead of once per
// hit and rule (which cost up to max_len per hit).
type byteRun struct {
	from, to int
	cut, ok  bool
}

// upTo returns the first j in [i, end) with data[j] not in set, or end.
func (b *byteRun) upTo(set *byteSet, data []byte, i, end int) int {
	if !b.ok || i < b.from || i > b.to {
		*b = byteRun{from: i, to: i, ok: true}
	}
	for !b.cut && b.to < end {
		if !set.has(data[b.to]) {
			b.cut = true
			break
		}
		b.to++
	}
	return min(b.to, end)
}

// deadEnd remembers where a rule's program died: run at a keyword with
// byte pb before it, it neither matched nor could match after reading
// only key. A window that begins with key after the same pb fails the same
// way whatever follows, so a keyword flood ("auth-key auth-key ...")
// costs a compare per hit instead of a run of the matchers. A few are
// kept per rule: floods alternate keywords ("awssecretaccesskey=" holds
// "secretaccesskey" too).
type deadEnd struct {
	ends [deadEnds]deadKey
	next int
}

type deadKey struct {
	pb  int
	key []byte
}

const deadEnds = 4

// deadNear: a failure within this many bytes of the rule's last one looks
// for its dead end (a live run) to remember.
const deadNear = 256

// maxDeadKey bounds a remembered prefix (most die within a few bytes of
// the keyword; a periodic flood's windows repeat too).
const maxDeadKey = 1024

func (d *deadEnd) hit(w []byte, pb int) bool {
	hit, _ := d.match(w, pb)
	return hit
}

// match: hit, or w (a window still being built) may yet begin with a key.
func (d *deadEnd) match(w []byte, pb int) (hit, maybe bool) {
	for k := range d.ends {
		e := &d.ends[k]
		if len(e.key) == 0 || e.pb != pb {
			continue
		}
		if m := min(len(w), len(e.key)); string(w[:m]) == string(e.key[:m]) {
			if m == len(e.key) {
				return true, false
			}
			maybe = true
		}
	}
	return false, maybe
}

func (d *deadEnd) add(key []byte, pb int) {
	e := &d.ends[d.next]
	d.next = (d.next + 1) % deadEnds
	e.pb, e.key = pb, append(e.key[:0], key...)
}

// escBefore: data[i:end] holds an ESC. Like byteRun, the answer is
// cached for the next hit.
func (sc *scratch) escBefore(data []byte, i, end int) bool {
	if sc.escAt < 0 || i < sc.escFrom || i > sc.escAt {
		sc.escFrom, sc.escAt = i, len(data)
		if k := bytes.IndexByte(data[i:], 0x1b); k >= 0 {
			sc.escAt = i + k
		}
	}
	return sc.escAt < end
}

// evalStripped is evalRule for a window that holds an ESC: a colour code
// inside a match (grep --color highlighting "TOKEN" of TOKEN=value,
// or the ghp_ of a token). The rule runs on the window with its escape
// sequences left out; the match maps back to the raw bytes, and the
// redaction takes the sequences inside it. The raw window is bounded
// (sequences without characters between cannot hold a stream forever).
func (s *Set) evalStripped(sc *scratch, ri int, data []byte, i, kw, pb int, final bool) {
	r := s.rules[ri]
	// The stripped text from i is that from an earlier keyword, less its
	// head, if i is one of its characters (sequences are read from their
	// ESC on): per byte class, one build serves the keywords that follow.
	c := &sc.strips[r.class]
	k := -1
	if c.ok && i >= c.from && i < c.j {
		if x, found := slices.BinarySearch(c.sp, int32(i)); found {
			k = x
		}
	}
	if k < 0 {
		*c = stripCache{ok: true, from: i, j: i, sw: c.sw[:0], sp: c.sp[:0]}
		k = 0
	} else if k >= 1024 && 2*k >= len(c.sw) {
		c.sw, c.sp = c.sw[:copy(c.sw, c.sw[k:])], c.sp[:copy(c.sp, c.sp[k:])]
		c.from, k = i, 0
	}
	limit := min(len(data), i+2*r.window+4*csiMax)
	// The window is built in doubling steps, each followed by a check
	// whether the rule is already decided: a keyword flood then costs what
	// the rule reads, not the window (up to 2*max_len) per keyword.
	goal := 64
	if rs := &sc.resume[ri]; sc.stream && !sc.exhaustive && rs.ok && rs.start == sc.base+int64(i) && rs.pb == pb {
		goal = max(goal, 2*(rs.pos+1)) // an earlier scan's run got that far alive
	}
	var sw []byte
	var sp []int32
	var cut, pending bool
	j := 0 // raw end of sw's bytes as read (escape sequences after them included)
	for {
		for !c.cut && !c.pending && c.j < limit && len(c.sw)-k < min(goal, r.window) {
			b := data[c.j]
			if b == 0x1b {
				e, pend := seqEnd(data, c.j)
				if pend && !final {
					c.pending = true
					break
				}
				if !pend && e > c.j+1 {
					c.j = nfExtend(data, c.j, e)
					continue
				}
			}
			c.sw, c.sp = append(c.sw, b), append(c.sp, int32(c.j))
			c.j++
			if !r.bytes.has(b) {
				c.cut = true
			}
		}
		end := min(len(c.sw), k+r.window)
		sw, sp = c.sw[k:end], c.sp[k:end]
		all := end == len(c.sw)
		cut, pending, j = c.cut && all, c.pending && all, c.j
		if !all {
			j = int(sp[len(sp)-1]) + 1
		}
		if cut || pending || len(sw) >= r.window || j >= limit {
			break
		}
		if !sc.exhaustive {
			if hit, maybe := sc.dead[ri].match(sw, pb); hit {
				return // as matchWindow would
			} else if maybe {
				goal *= 2
				continue
			}
		}
		if alive, _ := s.liveRun(sc, ri, sw, i, kw, pb, false); !alive {
			s.matchWindow(sc, ri, sw, sp, i, kw, pb, false, false, false) // decided within sw
			return
		}
		goal *= 2
	}
	// Full: max_len+1 characters, or as many as 2*max_len+128 bytes hold
	// (a match still possible there fails closed like one at max_len).
	full := !cut && !pending && (len(sw) >= r.window || j >= i+2*r.window+4*csiMax)
	complete := cut || full
	s.matchWindow(sc, ri, sw, sp, i, kw, pb, pending || !complete && !final, full, !pending && !complete && final)
}

// stripCache is a build of the stripped text (escape sequences left out)
// from raw position from, for one byte class: sw and the raw position of
// each byte; j is how far the raw data was read. It stopped at a byte no
// match contains (cut: the last of sw) or at an unfinished sequence at the
// end of data (pending).
type stripCache struct {
	ok           bool
	from, j      int
	sw           []byte
	sp           []int32
	cut, pending bool
}

// matchWindow runs rule ri on its window w, which begins with the keyword
// at raw i; sp maps w's bytes to raw positions (nil: w is data[i:] itself).
// open: more input could change the answer; byLen: w is MaxLen+1 long
// (or a stripped window reached its raw limit); atEnd: w ends where the
// stream ends.
func (s *Set) matchWindow(sc *scratch, ri int, w []byte, sp []int32, i, kw, pb int, open, byLen, atEnd bool) {
	r := s.rules[ri]
	start := func(k int) int { // raw position of w[k]
		if sp == nil {
			return i + k
		}
		return int(sp[k])
	}
	end := func(k int) int { // raw end of w[:k]
		if sp == nil || k == 0 {
			return i + k
		}
		return int(sp[k-1]) + 1
	}
	if !sc.exhaustive && sc.dead[ri].hit(w, pb) {
		return // this rule died on the same bytes after the same byte before
	}
	ran := false
	if open {
		alive, matched := s.liveRun(sc, ri, w, i, kw, pb, false)
		if alive {
			// The keyword itself is harmless; what follows it may be the
			// secret.
			sc.holdAt(i, i+kw)
			return
		}
		if !matched {
			s.failed(sc, ri, w, pb, i, sc.nfa.died, end(sc.nfa.reach))
			return
		}
		ran = true
	} else if r.fast == nil {
		// Go's regexp and the live program cost about the same here: run
		// the live one first, and the regexp only if a match is possible
		// (a failing candidate, the usual case in a flood, then costs one
		// run instead of two).
		var alive, matched bool
		alive, matched = s.liveRun(sc, ri, w, i, kw, pb, atEnd)
		if !alive && !matched {
			s.failed(sc, ri, w, pb, i, sc.nfa.died, end(sc.nfa.reach))
			return
		}
		ran = true
	}
	var loc []int
	ok := false
	if r.fast != nil {
		loc, ok = r.fast.match(&sc.fast, w, pb, sc.loc)
		if loc != nil {
			sc.loc = loc
		}
	}
	if !ok {
		loc = r.re.FindSubmatchIndex(w)
	}
	if loc == nil {
		if byLen {
			// The candidate outgrew MaxLen while it could still match:
			// fail closed and redact the window.
			if alive, _ := s.liveRun(sc, ri, w, i, kw, pb, false); alive {
				e := end(min(r.src.MaxLen, len(w)))
				sc.regs = append(sc.regs, region{start: i, end: e, mstart: i, mend: e, lab: r.lab})
				sc.lastEnd[ri] = e
				return
			}
		} else if !ran {
			if ok && (sc.fast.far > maxDeadKey || i-sc.lastFail[ri] > deadNear) {
				// Too long to remember, or no flood (the rule's last
				// failure is far): the fast matcher's reach will do.
				s.failed(sc, ri, w, pb, i, -1, end(sc.fast.far))
				return
			}
			s.liveRun(sc, ri, w, i, kw, pb, atEnd) // where did it die?
		}
		reach := sc.nfa.reach
		if reach < 0 {
			reach = len(w) // still alive at the end of a complete window
		}
		s.failed(sc, ri, w, pb, i, sc.nfa.died, end(reach))
		return
	}
	sc.lastEnd[ri] = end(loc[1])
	g := r.src.SecretGroup
	gs, ge := loc[2*g], loc[2*g+1]
	if gs < 0 || gs == ge {
		return
	}
	sc.regs = append(sc.regs, region{start: start(gs), end: end(ge), mstart: i, mend: end(loc[1]), lab: r.lab})
}

// lookBehind is how many input bytes before a scan's data a Writer keeps
// for rules' not_after words.
const lookBehind = csiMax // a whole escape sequence before a keyword (afterSeq)

// afterSeq: the bytes before data[i] (sc.before, then data) end with a
// complete escape sequence (or an nF escape: "ESC ( B").
func afterSeq(sc *scratch, data []byte, i int) bool {
	v := data[max(0, i-csiMax):i]
	if i < csiMax && len(sc.before) > 0 {
		sc.seqBuf = append(append(sc.seqBuf[:0], sc.before...), data[:i]...)
		v = sc.seqBuf
	}
	for j := len(v) - 1; j >= max(0, len(v)-csiMax); j-- {
		if v[j] == 0x1b {
			e, pend := seqEnd(v, j)
			return !pend && e == len(v) && e > j+1 || nfEnd(v, j, len(v))
		}
	}
	return false
}

// endsWithFold: before+data ends with w, ASCII case-insensitively.
func endsWithFold(before, data []byte, w string) bool {
	if len(data) >= len(w) {
		return bytes.EqualFold(data[len(data)-len(w):], []byte(w))
	}
	k := len(w) - len(data)
	return len(before) >= k && bytes.EqualFold(before[len(before)-k:], []byte(w[:k])) && bytes.EqualFold(data, []byte(w[k:]))
}

func isWordByte(c int) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
}

// settle lowers sc.hold so that it cuts through no match extent, keeps
// the regions before it, sorts and merges overlapping ones. When regions
// overlap the earliest wins the label (on a tie known values, then rules
// in file order). A dropped region (at or after hold) bounds sc.rel: Flush
// releases nothing from a match start on.
func (s *Set) settle(sc *scratch) {
	hold := sc.hold
	for changed := true; changed; {
		changed = false
		for _, r := range sc.regs {
			if r.mstart < hold && max(r.end, r.mend) > hold {
				hold = r.mstart
				changed = true
			}
		}
	}
	sc.hold = hold
	regs := sc.regs[:0]
	for _, r := range sc.regs {
		if r.mstart < hold {
			regs = append(regs, r)
		} else {
			sc.rel = min(sc.rel, r.mstart)
		}
	}
	// Two runs, each nearly sorted: the rules' (by keyword) then the known
	// values' (by sample).
	slices.SortFunc(regs, cmpRegion)
	out := regs[:0]
	for _, r := range regs {
		if k := len(out) - 1; k >= 0 && r.start < out[k].end {
			// The merged region keeps both extents: a later settle (the
			// hold moved out of an escape sequence) must see them.
			out[k].end = max(out[k].end, r.end)
			out[k].mstart = min(out[k].mstart, r.mstart)
			out[k].mend = max(out[k].mend, r.mend)
			continue
		}
		out = append(out, r)
	}
	sc.regs = out
}

func cmpRegion(a, b region) int {
	if a.start != b.start {
		return a.start - b.start
	}
	if a.lab.prio != b.lab.prio {
		return a.lab.prio - b.lab.prio
	}
	return b.end - a.end
}
