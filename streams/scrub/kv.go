package scrub

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"slices"
)

// Known values are matched on the normalised stream (see doc.go): bytes
// below 0x21 (space, tab, NUL, CR, LF, other controls), terminal escape
// sequences and invisible characters (units.go) are separators and left
// out, ASCII letters are lowered, fullwidth ASCII is ASCII; characters a
// backspace erases and escape sequences' final bytes are optional. A
// match is a substring of the normalised stream, at least m_f characters
// long, that is also a substring of a form f of a value; m_f is what k
// consecutive value bytes take in f. A run of separators longer than
// kvGapMax bytes breaks a match. The redaction covers the match's first to
// last character, separators between them included.
//
// Finding them: every 4-character substring ("gram") of every form is in
// a hash table and a bitmap. The raw data is sampled every kv.stride bytes;
// at a sample the next kvQ characters of the normalised stream are
// gathered (directly from the 8 bytes there when none of them is a
// separator, the common case) and looked up. A stride of at most
// min(m_f)-kvQ+1 puts a sample in every match; a hit is verified and
// extended both ways on a locally normalised window.
const (
	kvQ         = 4
	kvGapMax    = 32 // longest run of separator bytes inside a match
	kvBitsLog   = 22 // the largest bitmaps
	kvMaxStride = 8  // a sample reads 8 bytes: every ESC is seen before a later sample lands in its sequence
	csiMax      = 32
	kvMinM      = 6
	kvLongM     = 20 // forms whose shortest match is this long are sampled less often
	gatherMax   = 4 * (kvGapMax + csiMax)
	kvStates    = 16 // extension states: the ways through an escape sequence of up to 15 optional characters
	kvSkipMax   = 32 // what a match skips in a row at most: 32 escape sequences' final bytes, 8 erased characters
	optESC      = 1  // skipping an escape sequence's final (or parameter) byte
	optErased   = 4  // skipping a character a backspace erased
)

type kvForm struct {
	s   []byte // normalised, lower case
	m   int    // shortest match
	lab *label
	rep bool // some gram occurs twice in s
}

type kvOcc struct{ form, off int32 }

// kvIndex is the compiled known values of a Set (immutable).
type kvIndex struct {
	forms  []kvForm
	bits   []uint64 // 2^log bits: folded grams of forms with short matches
	bitsL  []uint64 // 2^logL bits: the same for forms with long matches (hex and per-byte encodings)
	every  int      // long forms are looked up at every every-th sample
	log    int      // log2 of bits' size in bits
	logL   int
	tab    gramTable
	one    byteSet  // lower-case characters of the forms
	two    []uint64 // 2^16 bits: 2-character substrings
	three  []uint64 // 2^log3 bits (hashed): 3-character substrings
	log3   int
	stride int
}

// sepClass: 0 a character, 1 a separator byte, 2 ESC, 3 a backspace, 4
// the lead byte of a special character (units.go) or of an ordinary one.
var sepClass = func() (t [256]byte) {
	for c := 0; c < 0x21; c++ {
		t[c] = 1
	}
	t[0x1b] = 2
	t[bs] = 3
	for c := range 256 {
		if specialLead[c] {
			t[c] = 4
		}
	}
	return
}()

// normForm lowers ASCII letters and drops separator bytes.
func normForm(s string) []byte { return appendNorm(nil, s) }

// appendNorm appends normForm(s) to b.
func appendNorm(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x21 {
			b = append(b, lowerByte(c))
		}
	}
	return b
}

func newKVIndex(values []namedValue, labs map[string]*label) *kvIndex {
	kv := &kvIndex{two: make([]uint64, 1<<10)}
	seen := map[string]int{} // form string -> index in kv.forms
	add := func(s []byte, m int, lab *label) {
		m = max(m, min(kvMinM, len(s)))
		if len(s) < kvQ || m > len(s) || m < kvQ {
			return
		}
		if i, ok := seen[string(s)]; ok {
			if f := &kv.forms[i]; f.lab == lab {
				f.m = min(f.m, m)
				return
			}
		}
		seen[string(s)] = len(kv.forms)
		kv.forms = append(kv.forms, kvForm{s: s, m: m, lab: lab})
	}
	for _, v := range values {
		lab := labs[v.name]
		k := KnownRun(len(v.value))
		for _, f := range valueForms([]byte(v.value)) {
			size := 0
			for _, p := range f.pieces {
				size += len(p)
			}
			s := make([]byte, 0, size)
			ends := make([]int, 0, len(f.pieces)+1) // ends[i]: len(s) before piece i
			for _, p := range f.pieces {
				ends = append(ends, len(s))
				s = appendNorm(s, p)
			}
			ends = append(ends, len(s))
			m := -1
			for i := 0; i+k < len(ends); i++ {
				l := ends[i+k] - ends[i]
				if e := ends[i+k]; e > ends[i] && (s[e-1] == ',' || s[e-1] == ':') {
					l-- // a list's last element has no separator after it
				}
				if m < 0 || l < m {
					m = l
				}
			}
			add(s, m, lab)
		}
		for _, f := range b64Forms([]byte(v.value), k) {
			add(normForm(f.core), f.m, lab)
		}
	}
	if len(kv.forms) == 0 {
		return nil
	}
	// Forms whose shortest match is long (hex, %XX, lists: two to six
	// characters a byte) are sampled at a multiple of the stride: fewer
	// lookups, and a smaller bitmap for the rest.
	minM, minL := kvMaxStride+kvQ-1, 1<<30
	for _, f := range kv.forms {
		if f.m >= kvLongM {
			minL = min(minL, f.m)
		} else {
			minM = min(minM, f.m)
		}
	}
	kv.stride = max(1, min(kvMaxStride, minM-kvQ+1))
	kv.every = max(1, (minL-kvQ+1)/kv.stride)
	// Bitmaps sized to the forms (about 3% full): a session with a few
	// secrets takes tens of KiB and stays in cache; 100 values take 512 KiB.
	// Each sized to its own forms: the short forms' bitmap, tested at
	// every sample, stays small (in cache) however many long forms there are.
	n, nL := 0, 0
	for _, f := range kv.forms {
		if f.m >= kvLongM {
			nL += len(f.s)
		} else {
			n += len(f.s)
		}
	}
	kv.log = min(kvBitsLog, max(12, bits.Len(uint(128*n)))) // tested at every sample: sparser
	kv.logL = min(kvBitsLog, max(12, bits.Len(uint(32*nL))))
	kv.log3 = min(20, max(10, bits.Len(uint(16*(n+nL))))) // only read at a write's end
	kv.three = make([]uint64, 1<<(kv.log3-6))
	kv.bits = make([]uint64, 1<<(kv.log-6))
	kv.bitsL = make([]uint64, 1<<(kv.logL-6))
	// Every gram of every form as key<<32 | its index in occ (forms and
	// offsets in order), sorted: flat lists of 16 bytes a gram rather than
	// a map of slices, so building costs about what the table keeps.
	total := 0
	for _, f := range kv.forms {
		total += max(0, len(f.s)-kvQ+1)
	}
	occ := make([]kvOcc, 0, total)
	keys := make([]uint64, 0, total)
	for fi := range kv.forms {
		f := &kv.forms[fi]
		bm, lg := kv.bits, kv.log
		if f.m >= kvLongM {
			bm, lg = kv.bitsL, kv.logL
		}
		for j := 0; j+kvQ <= len(f.s); j++ {
			key := binary.LittleEndian.Uint32(f.s[j:]) | fold4
			keys = append(keys, uint64(key)<<32|uint64(len(occ)))
			occ = append(occ, kvOcc{int32(fi), int32(j)})
			h := gramHash(key, lg)
			bm[h>>6] |= 1 << (h & 63)
		}
		for j, c := range f.s {
			kv.one.add(c)
			if j+1 < len(f.s) {
				x := uint32(c) | uint32(f.s[j+1])<<8
				kv.two[x>>6] |= 1 << (x & 63)
			}
			if j+2 < len(f.s) {
				x := hash3(uint32(c)|uint32(f.s[j+1])<<8|uint32(f.s[j+2])<<16, kv.log3)
				kv.three[x>>6] |= 1 << (x & 63)
			}
		}
	}
	slices.Sort(keys) // by key, then form and offset (occ's order)
	for i := 1; i < len(keys); i++ {
		if keys[i]>>32 == keys[i-1]>>32 {
			if o := occ[uint32(keys[i])]; o.form == occ[uint32(keys[i-1])].form {
				kv.forms[o.form].rep = true
			}
		}
	}
	kv.tab.build(keys, occ)
	return kv
}

func gramHash(key uint32, log int) uint32 { return (key * hashMul) >> (32 - log) }

func hash3(x uint32, log int) uint32 { return (x * 0x85EBCA77) >> (32 - log) }

// test: key may be a gram of a short-match form, or (long) of any form.
func (kv *kvIndex) test(key uint32, long bool) bool {
	if h := gramHash(key, kv.log); kv.bits[h>>6]&(1<<(h&63)) != 0 {
		return true
	}
	h := gramHash(key, kv.logL)
	return long && kv.bitsL[h>>6]&(1<<(h&63)) != 0
}

// gramTable maps a folded gram to its occurrences in the forms.
type gramTable struct {
	slots []gramSlot // power of two; n == 0: empty
	mask  uint32
	occ   []kvOcc
}

type gramSlot struct {
	key    uint32
	off, n int32
}

// build fills the table from sorted grams (key<<32 | index in occ).
func (t *gramTable) build(sorted []uint64, occ []kvOcc) {
	keys := 0
	for i := range sorted {
		if i == 0 || sorted[i]>>32 != sorted[i-1]>>32 {
			keys++
		}
	}
	n := 16
	for n < 2*keys {
		n *= 2
	}
	t.slots = make([]gramSlot, n)
	t.mask = uint32(n - 1)
	t.occ = make([]kvOcc, len(sorted))
	for i := 0; i < len(sorted); {
		k, e := uint32(sorted[i]>>32), i
		for e < len(sorted) && uint32(sorted[e]>>32) == k {
			t.occ[e] = occ[uint32(sorted[e])]
			e++
		}
		h := winHash(k) & t.mask
		for t.slots[h].n != 0 {
			h = (h + 1) & t.mask
		}
		t.slots[h] = gramSlot{k, int32(i), int32(e - i)}
		i = e
	}
}

func (t *gramTable) get(key uint32) []kvOcc {
	for h := winHash(key) & t.mask; ; h = (h + 1) & t.mask {
		sl := &t.slots[h]
		if sl.n == 0 {
			return nil
		}
		if sl.key == key {
			return t.occ[sl.off : sl.off+sl.n]
		}
	}
}

// seqEnd returns the end of the escape sequence starting with ESC at
// data[i]: a CSI (ESC '[', parameter and intermediate bytes 0x20-0x3f,
// one final byte 0x40-0x7e, at most csiMax bytes) or ESC and one byte
// 0x20-0x7e; ESC alone otherwise. (OSC and other string sequences are ESC
// and one byte here: their bodies read as characters.) pending: the end of data came before the
// sequence's end was decided. (An nF escape, "ESC ( B", is ESC and one
// byte here: its final byte reads as a character; see nfEnd.)
func seqEnd(data []byte, i int) (end int, pending bool) {
	n := len(data)
	if i+1 >= n {
		return i + 1, true
	}
	c := data[i+1]
	if c != '[' {
		if c >= 0x20 && c <= 0x7e {
			return i + 2, false
		}
		return i + 1, false
	}
	for j := i + 2; j < i+csiMax && j <= n; j++ {
		if j == n {
			return i + 1, true
		}
		switch c := data[j]; {
		case c >= 0x20 && c <= 0x3f:
		case c >= 0x40 && c <= 0x7e:
			return j + 1, false
		default:
			return i + 1, false
		}
	}
	return i + 1, false
}

// nfEnd: data[j:e] is an nF escape sequence (ESC, intermediate bytes
// 0x20-0x2f, a final byte 0x30-0x7e: "ESC ( B" of tput sgr0) ending at e.
func nfEnd(data []byte, j, e int) bool {
	if e-j < 3 || data[j] != 0x1b || e-j > csiMax {
		return false
	}
	for k := j + 1; k < e-1; k++ {
		if data[k] < 0x20 || data[k] > 0x2f {
			return false
		}
	}
	return data[e-1] >= 0x30 && data[e-1] <= 0x7e
}

// nfExtend returns the end of the nF escape (ESC ( B) that the sequence
// data[j:e] (ESC and one byte, as seqEnd reads it) begins, or e.
func nfExtend(data []byte, j, e int) int {
	if e != j+2 || data[j+1] < 0x20 || data[j+1] > 0x2f {
		return e
	}
	k := e
	for k < len(data) && k < j+csiMax && data[k] >= 0x20 && data[k] <= 0x2f {
		k++
	}
	if k < len(data) && k < j+csiMax && data[k] >= 0x30 && data[k] <= 0x7e {
		return k + 1
	}
	return e
}

// safeStart returns a position <= p from which classifying data forward
// gives the same result as from the start: p itself unless an ESC in the
// csiMax bytes before p begins a sequence that reaches past p; then that
// ESC (a sequence ends at the next ESC, so the last one decides); or the
// start of the special character p is inside (units.go).
func safeStart(data []byte, p int) int {
	if p < len(data) {
		if q := specialStart(data, p); q != p {
			return q
		}
	}
	lo := max(0, p-csiMax)
	for j := p - 1; j >= lo; j-- {
		if data[j] == 0x1b {
			if e, _ := seqEnd(data, j); e > p {
				return j
			}
			return p
		}
	}
	return p
}

// kvScratch is a scan's known-value state.
type kvScratch struct {
	// The normalised window data[ws:we]: characters (lower case, 0 for a
	// break), their positions, and whether each is optional (the final
	// byte of an escape sequence: a terminal hides it, a raw reader sees
	// it, so a match may take it or skip it).
	ws, we  int
	nb      []byte
	np      []int32
	opt     []uint8 // 0 plain; else optional, what skipping it costs (optESC, optErased)
	found   []kvFound
	st, nx  []int32  // extension state sets
	sk, nsk []uint8  // their optional characters skipped in a row
	reach   int      // see extend
	mark    []uint32 // extend's state set membership, by generation
	pos     []int32  // and where in the set
	gen     uint32
	hasOpt  bool    // some character of the window is optional
	bsTail  int     // normalize: the last bsTail characters read as erased (kvTail)
	bsGot   int     // how many of them there were
	tailBS  bsTrack // the backspace state at the end of data (normalize)
}

type kvFound struct {
	form       int32
	start, end int // raw
}

// normalize fills the window with data[from:to]; from must be a safe start.
// A break (0 in nb) marks a separator run longer than kvGapMax before a
// character; a run cut by the window's start is not marked. Characters a
// backspace run erases are optional (units.go), also when the run begins
// at to; with st.bsTail, so are the last bsTail characters of data (a
// run may still come).
func (st *kvScratch) normalize(data []byte, from, to int) {
	st.ws, st.we = from, to
	st.nb, st.np, st.opt = st.nb[:0], st.np[:0], st.opt[:0]
	gap, gapStart := 0, from
	var bt bsTrack
	// Backspaces are followed only where there are some (or at the end of
	// data: kvTail reads what a run still to come would erase).
	track := to == len(data) || bytes.IndexByte(data[from:to+1], bs) >= 0
	st.hasOpt = false
	for i := from; i < to; {
		c := data[i]
		if !track { // ASCII characters and separators (the common case)
			if c-0x21 < 0x7f-0x21 {
				if gap > kvGapMax && gapStart > from {
					st.push(0, gapStart, 0)
				}
				gap = 0
				st.push(lowerByte(c), i, 0)
				i++
				continue
			}
			if sepClass[c] == 1 {
				if gap == 0 {
					gapStart = i
				}
				gap++
				i++
				continue
			}
		}
		cl := sepClass[c]
		n, fc := 1, c // a character's length and byte (fullwidth: its ASCII)
		if cl == 4 {
			if sn, sc := specialAt(data, i); sn > 0 {
				n, fc = sn, sc
				if sc == 0 {
					cl = 1 // an invisible character: a separator
				} else {
					cl = 0
				}
			} else {
				cl, n = 0, unitLen(data, i)
			}
		} else if cl == 0 && c >= 0x80 {
			n = unitLen(data, i)
		}
		switch cl {
		case 0:
			if gap > kvGapMax && gapStart > from {
				st.push(0, gapStart, 0)
			}
			gap = 0
			bt.char(len(st.nb))
			if fc != c || n == 1 {
				st.push(lowerByte(fc), i, 0)
			} else {
				// a multi-byte character: each byte a character
				for k := i; k < i+n && k < to; k++ {
					st.push(data[k], k, 0)
				}
			}
			i += n
		case 1, 3:
			if gap == 0 {
				gapStart = i
			}
			gap += n
			i += n
			if cl == 3 {
				bt.back(st.opt)
			} else {
				bt.sep()
			}
		default:
			bt.sep()
			if gap == 0 {
				gapStart = i
			}
			e, _ := seqEnd(data, i)
			if b := bodyStart(data, i, e); b < e && e <= to {
				// Optional characters end a separator run like plain ones
				// (a break goes before them): a raw reader sees them.
				if gap+b-i > kvGapMax && gapStart > from {
					st.push(0, gapStart, 0)
				}
				for ; b < e; b++ {
					st.push(lowerByte(data[b]), b, optESC)
				}
				st.hasOpt = true
				gap = 0
			} else {
				gap += e - i
			}
			i = e
		}
	}
	for i := to; i < len(data) && i < to+kvBSMax && data[i] == bs; i++ {
		bt.back(st.opt)
	}
	st.hasOpt = st.hasOpt || bt.erased
	if to == len(data) {
		st.tailBS = bt
		if st.bsTail > 0 {
			if st.bsGot = bt.pending(st.opt, st.bsTail); st.bsGot > 0 {
				st.hasOpt = true
			}
		}
	}
}

// bsTrack follows the characters a backspace run may erase (units.go).
type bsTrack struct {
	u      [kvBSMax]int32 // ring: window index where each of the last characters begins
	top    int            // u[(top-1)%kvBSMax] is the last
	n      int            // how many: the current run of characters, at most kvBSMax
	inRun  bool           // the last byte was a backspace
	end    int            // window index of the last character the run erased
	erased bool           // a character was
}

func (b *bsTrack) char(at int) {
	if b.inRun {
		b.n, b.inRun = 0, false
	}
	b.u[b.top%kvBSMax] = int32(at)
	b.top++
	b.n = min(b.n+1, kvBSMax)
}

func (b *bsTrack) sep() { b.n, b.inRun = 0, false }

// back: a backspace erases the last character not yet erased.
func (b *bsTrack) back(opt []uint8) {
	if !b.inRun {
		b.inRun, b.end = true, len(opt)
	}
	if b.n > 0 {
		b.n--
		b.top--
		s := int(b.u[b.top%kvBSMax])
		for x := s; x < b.end; x++ {
			opt[x] = optErased
		}
		b.end = s
		b.erased = true
	}
}

// pending: a run of j more backspaces at the end (it may still come);
// it returns how many characters it erased.
func (b *bsTrack) pending(opt []uint8, j int) int {
	k := 0
	for ; k < j && b.n > 0; k++ {
		b.back(opt)
	}
	return k
}

func (st *kvScratch) push(c byte, p int, opt uint8) {
	st.nb = append(st.nb, c)
	st.np = append(st.np, int32(p))
	st.opt = append(st.opt, opt)
}

// trailing reports whether more input could continue a match whose last
// character ends at p: only separators, escape sequences and erased
// characters follow to the end of data, no more than kvGapMax bytes of
// them and kvSkipMax optional characters, or a sequence still undecided
// (escAt: its ESC), or characters a backspace run could still erase.
func trailing(data []byte, p int, final bool) (open bool, escAt int) {
	if final {
		return false, -1
	}
	gap, skipped := 0, 0
	for i := p; i < len(data); {
		switch sepClass[data[i]] {
		case 1, 3:
			gap++
			i++
		case 2:
			e, pend := seqEnd(data, i)
			if pend {
				return gap <= kvGapMax, i // as kvTail sees it
			}
			if b := bodyStart(data, i, e); b < e {
				// optional characters: a break before them ends the
				// match; past them a new separator run begins (normalize)
				if skipped += e - b; gap+b-i > kvGapMax || skipped > kvSkipMax {
					return false, -1
				}
				gap = 0
			} else {
				gap += e - i
			}
			i = e
		default:
			if sn, sc := specialAt(data, i); sn > 0 && sc == 0 {
				gap += sn
				i += sn
				continue
			}
			if specialPending(data, i) {
				return gap <= kvGapMax, -1 // as kvTail sees it
			}
			erased, maybe := bsErased(data, i)
			if maybe {
				return gap <= kvGapMax, -1
			}
			// an erased character is optional, like an escape
			// sequence's final byte (its bytes are characters, but a
			// fullwidth one's)
			n, c := kvChar(data, i)
			if c != data[i] {
				skipped += optErased
			} else {
				skipped += n * optErased
			}
			if !erased || gap > kvGapMax || skipped > kvSkipMax {
				return false, -1
			}
			gap = 0
			i += n
		}
	}
	return gap <= kvGapMax, -1
}

// index returns the window index of the first character at or after raw p.
func (st *kvScratch) index(p int) int {
	i, _ := slices.BinarySearch(st.np, int32(p))
	return i
}

// window makes sure the window covers raw [lo, hi) (clipped to data).
func (st *kvScratch) window(data []byte, lo, hi int) {
	lo, hi = max(0, lo), min(len(data), hi)
	if st.we >= 0 && st.ws <= lo && hi <= st.we {
		return
	}
	st.normalize(data, safeStart(data, lo), hi)
}

// grow doubles the window to one side (an extension reached its edge).
func (st *kvScratch) grow(data []byte, left bool) {
	d := 2*(st.we-st.ws) + 64
	if left {
		st.window(data, st.ws-d, st.we)
	} else {
		st.window(data, st.ws, st.we+d)
	}
}

// scanKV finds the known-value matches of data (appending regions to
// sc.regs) and, unless final, holds what could still become one.
func (s *Set) scanKV(sc *scratch, data []byte, final bool) {
	kv := s.kv
	st := &sc.kvs
	st.found = st.found[:0]
	st.ws, st.we = 0, -1
	n := len(data)
	stride := kv.stride
	var esc escSpan
	p, cnt := 0, 0
	// Backspaces are rare: without one the samples' test is as it was.
	bsIn := bytes.IndexByte(data, bs) >= 0
	for ; p+8 <= n; p += stride {
		long := cnt == 0
		if cnt++; cnt == kv.every {
			cnt = 0
		}
		w := binary.LittleEndian.Uint64(data[p:])
		if _, e := esc.inside(p); e < 0 && (w&0x8080808080808080 == 0 || !specialNear(data, p, w&0x8080808080808080)) {
			sm := sepMask(w)
			if sm == 0 {
				// (a backspace run after these 8 characters erases at
				// most the last kvBSMax of them)
				if key := uint32(w) | fold4; kv.test(key, long) {
					s.kvHit(sc, data, p, key, final)
				}
				continue
			}
			// Separators but no ESC or backspace, and four characters
			// among the 8 bytes (not the last if a backspace follows
			// it: with four separators it is the gram's fourth): gather
			// them here.
			if ns := bits.OnesCount64(sm); ns <= 4 && !hasESC(w) && (!bsIn || !hasBS(w) && (ns < 4 || sm>>63 != 0 || !bsAfter(data, p+8))) {
				off, key := compact4(w)
				if kv.test(key, long) {
					s.kvHit(sc, data, p+off, key, final)
				}
				continue
			}
		}
		s.kvSample(sc, data, p, &esc, long, final)
	}
	for ; p < n; p += stride {
		long := cnt == 0
		if cnt++; cnt == kv.every {
			cnt = 0
		}
		s.kvSample(sc, data, p, &esc, long, final)
	}
	if !final {
		s.kvTail(sc, data)
	}
}

// escSpan remembers the last escape sequences the samples saw (a sample
// reads 8 bytes, so a later sample may land inside one of them).
type escSpan struct {
	s   [4][2]int // [start, end)
	n   int
	end int // the end of the last one
}

// inside returns the sequence p is inside (past its ESC), or end -1.
func (e *escSpan) inside(p int) (start, end int) {
	if p >= e.end {
		return -1, -1
	}
	for _, sp := range e.s {
		if sp[0] < p && p < sp[1] {
			return sp[0], sp[1]
		}
	}
	return -1, -1
}

// bodyStart returns where the bytes a terminal swallows but a raw reader
// sees begin in the sequence data[i:e]: after "ESC [" for a CSI, after ESC
// otherwise (e itself for ESC alone).
func bodyStart(data []byte, i, e int) int {
	if e > i+2 && data[i+1] == '[' {
		return i + 2
	}
	return i + 1
}

func (e *escSpan) see(data []byte, i int) int {
	end, _ := seqEnd(data, i)
	if end > e.end {
		e.s[e.n&3] = [2]int{i, end}
		e.n++
		e.end = end
	}
	return end
}

func (s *Set) kvSample(sc *scratch, data []byte, p int, esc *escSpan, long, final bool) {
	g, key, g2, key2, ok, ok2, bsNear := gather(data, p, esc)
	if ok && s.kv.test(key, long) {
		s.kvHit(sc, data, g, key, final)
	}
	if ok2 && s.kv.test(key2, long) {
		s.kvHit(sc, data, g2, key2, final)
	}
	if bsNear {
		if g3, key3, ok3 := gatherErased(data, p, esc); ok3 && (key3 != key || g3 != g || !ok) && s.kv.test(key3, long) {
			s.kvHit(sc, data, g3, key3, final)
		}
	}
}

// hasESC: some byte of w is ESC.
func hasESC(w uint64) bool {
	x := w ^ 0x1b1b1b1b1b1b1b1b
	return (x-0x0101010101010101)&^x&0x8080808080808080 != 0
}

// hasBS: some byte of w is a backspace.
func hasBS(w uint64) bool {
	x := w ^ 0x0808080808080808
	return (x-0x0101010101010101)&^x&0x8080808080808080 != 0
}

// bsAfter: the character before i may be erased by a backspace: one is at
// i (kvBSMax is 1), or data ends there.
func bsAfter(data []byte, i int) bool {
	return i >= len(data) || data[i] == bs
}

// specialNear: a special character (units.go) overlaps the 8 bytes at p
// (hi: their bytes with the high bit set).
func specialNear(data []byte, p int, hi uint64) bool {
	if hi&0x80 != 0 && specialStart(data, p) != p {
		return true
	}
	for b := 0; hi != 0; b++ {
		if hi&0x80 != 0 && specialLead[data[p+b]] {
			if n, _ := specialAt(data, p+b); n > 0 || specialPending(data, p+b) {
				return true
			}
		}
		hi >>= 8
	}
	return false
}

// compact4 returns the first four bytes of w that are not separators
// (there are at least four), folded, and the offset of the first.
func compact4(w uint64) (off int, key uint32) {
	got := 0
	off = -1
	for b := 0; got < kvQ; b++ {
		if c := byte(w >> (8 * b)); c >= 0x21 {
			if off < 0 {
				off = b
			}
			key |= uint32(c|0x20) << (8 * got)
			got++
		}
	}
	return off, key
}

// sepMask has the high bit of each byte of w below 0x21 set.
func sepMask(w uint64) uint64 {
	const lo7 = 0x7f7f7f7f7f7f7f7f
	t := (w & lo7) + 0x5f5f5f5f5f5f5f5f // high bit set iff low 7 bits >= 0x21
	return ^(t | w) & 0x8080808080808080
}

// gather returns the next kvQ characters of the normalised stream from
// raw p (folded with |0x20) and the position of the first, skipping escape
// sequences whole; when it passed one, also the gram that takes their final
// bytes as characters (key2; from inside a sequence, its final byte comes
// first). It records the sequences it sees in esc. ok is false when the
// data ends first. A break restarts a gram after it. Backspaces are
// separators here (the characters they erase are taken); bsNear: one was
// passed or follows closely (then gatherErased has the gram without them).
func gather(data []byte, p int, esc *escSpan) (first int, key uint32, first2 int, key2 uint32, ok, ok2, bsNear bool) {
	n := len(data)
	got, got2, gap := 0, 0, 0
	seq := false
	i := p
	if s, e := esc.inside(p); e >= 0 { // a sequence seen before
		i = e
		for b := max(p, bodyStart(data, s, e)); b < e && got2 < kvQ; b++ {
			if got2 == 0 {
				first2 = b
			}
			seq = true
			key2 |= uint32(data[b]|0x20) << (8 * got2)
			got2++
		}
	} else if q := specialStart(data, p); q != p { // inside a special character
		sn, _ := specialAt(data, q)
		i = q + sn
	}
	// A gram spread over more than gatherMax bytes (optional characters
	// between its characters, each ending a separator run) is not looked
	// for: bounded work a sample.
	lim := min(n, p+gatherMax)
	for ; i < lim && (got < kvQ || seq && got2 < kvQ); i++ {
		c := data[i]
		cl := sepClass[c]
		if cl == 4 {
			sn, sc := specialAt(data, i)
			switch {
			case sn == 0:
				cl = 0
			case sc == 0:
				gap += sn
				i += sn - 1
				cl = 5
			default:
				c = lowerByte(sc)
				cl = 0
				if got == 0 {
					first = i
				}
				if got2 == 0 {
					first2 = i
				}
				i += sn - 1
				if got < kvQ {
					key |= uint32(c|0x20) << (8 * got)
					got++
				}
				if got2 < kvQ {
					key2 |= uint32(c|0x20) << (8 * got2)
					got2++
				}
				gap = 0
				cl = 5
			}
		}
		switch cl {
		case 0:
			if got == 0 {
				first = i
			}
			if got2 == 0 {
				first2 = i
			}
			if got < kvQ {
				key |= uint32(c|0x20) << (8 * got)
				got++
			}
			if got2 < kvQ {
				key2 |= uint32(c|0x20) << (8 * got2)
				got2++
			}
			gap = 0
		case 1:
			gap++
		case 3:
			gap++
			bsNear = true
		case 5: // done above
		default:
			e := esc.see(data, i)
			b := bodyStart(data, i, e)
			if b == e {
				gap += e - i
				i = e - 1
				break
			}
			// optional characters end a separator run (see normalize)
			if gap+b-i > kvGapMax {
				if got > 0 && got < kvQ {
					got, key = 0, 0
				}
				if got2 > 0 && got2 < kvQ {
					got2, key2 = 0, 0
				}
			}
			for ; b < e && got2 < kvQ; b++ {
				seq = true
				if got2 == 0 {
					first2 = b
				}
				key2 |= uint32(data[b]|0x20) << (8 * got2)
				got2++
			}
			gap = 0
			i = e - 1
		}
		if gap > kvGapMax {
			if got > 0 && got < kvQ {
				got, key = 0, 0
			}
			if got2 > 0 && got2 < kvQ {
				got2, key2 = 0, 0
			}
			if got == 0 && got2 == 0 {
				// A break with nothing gathered: a later sample, within a
				// stride of its end, gathers what follows (scanning on
				// through a long run from every sample is quadratic).
				break
			}
		}
	}
	// Sequences later in the 8 bytes this sample covers.
	for j := max(i, esc.end); j < min(p+8, n); j++ {
		if data[j] == 0x1b {
			j = esc.see(data, j) - 1
		}
	}
	if !bsNear && i < n {
		// a run right after may erase the last characters gathered
		bsNear = bytes.IndexByte(data[i:min(n, i+4*kvBSMax+1)], bs) >= 0
	}
	return first, key, first2, key2, got == kvQ, seq && got2 == kvQ, bsNear
}

// gatherErased returns the next kvQ characters from raw p as a terminal
// shows them: escape sequences skipped whole and the characters a
// backspace run erases left out (units.go), and the position of the
// first. A character is taken once no run can reach it any more (or at
// gatherMax or the end of data). ok is false when fewer than kvQ remain.
func gatherErased(data []byte, p int, esc *escSpan) (first int, key uint32, ok bool) {
	n := len(data)
	i := p
	if _, e := esc.inside(p); e >= 0 {
		i = e
	} else if q := specialStart(data, p); q != p {
		sn, _ := specialAt(data, q)
		i = q + sn
	}
	const tmax = 32
	var tc [tmax]byte
	var tp [tmax]int
	tn := 0
	var u [kvBSMax]int // where the last characters (erasable) begin in tc
	un := 0
	inRun := false
	gap := 0
	// what was erased since a character was kept for good: a match skips
	// at most kvSkipMax in a row (extend)
	erased, kept := 0, 0
	lim := min(n, p+gatherMax)
	for i < lim {
		committed := tn
		if un > 0 {
			committed = u[0]
		}
		if committed >= kvQ {
			break
		}
		if committed > kept {
			erased, kept = 0, committed
		}
		c := data[i]
		cl := sepClass[c]
		ln := 1
		if cl == 4 {
			sn, sc := specialAt(data, i)
			switch {
			case sn == 0:
				cl, ln = 0, unitLen(data, i)
			case sc == 0:
				cl, ln = 1, sn
			default:
				cl, ln, c = 0, sn, sc
			}
		} else if cl == 0 && c >= 0x80 {
			ln = unitLen(data, i)
		}
		switch cl {
		case 0:
			gap = 0
			if inRun {
				un, inRun = 0, false
			}
			if un == kvBSMax {
				copy(u[:], u[1:])
				un--
			}
			if tn+4 > tmax {
				return 0, 0, false
			}
			u[un] = tn
			un++
			if ln == 1 || c != data[i] {
				tc[tn], tp[tn] = lowerByte(c), i
				tn++
			} else {
				for k := i; k < i+ln; k++ {
					tc[tn], tp[tn] = data[k], k
					tn++
				}
			}
			i += ln
		case 1:
			gap += ln
			un, inRun = 0, false
			i += ln
		case 3:
			gap++
			if !inRun {
				inRun = true
			}
			if un > 0 {
				un--
				tn = u[un]
				if erased += optErased; erased > kvSkipMax {
					tn, un, kept = 0, 0, 0 // too many in a row: as a break
				}
				if tn == 0 && i >= p+kvMaxStride {
					// Nothing kept after a stride: the next sample, no
					// later than here, finds the same characters kept
					// (a run erases the same ones) and gathers on.
					return 0, 0, false
				}
			}
			i++
		default:
			un, inRun = 0, false
			if tn >= kvQ {
				i = lim
				break
			}
			e, _ := seqEnd(data, i)
			if b := bodyStart(data, i, e); b < e {
				// optional characters end a separator run (normalize)
				if gap+b-i > kvGapMax {
					return 0, 0, false // as a break (below)
				}
				gap = 0
			} else {
				gap += e - i
			}
			i = e
		}
		if gap > kvGapMax && tn < kvQ {
			// a break: what was gathered cannot reach past it, and a
			// later sample gathers what follows
			return 0, 0, false
		}
	}
	if tn < kvQ {
		return 0, 0, false
	}
	for k := range kvQ {
		key |= uint32(tc[k]|0x20) << (8 * k)
	}
	return tp[0], key, true
}

// kvHit verifies a sampled gram whose first character is at raw g.
func (s *Set) kvHit(sc *scratch, data []byte, g int, key uint32, final bool) {
	kv := s.kv
	occs := kv.tab.get(key)
	if len(occs) == 0 {
		return
	}
	st := &sc.kvs
	plain := g+kvQ <= len(data) && sepClass[data[g]]|sepClass[data[g+1]]|sepClass[data[g+2]]|sepClass[data[g+3]] == 0
	// The bytes around the gram, when they are plain and no escape
	// sequence is near (then neither can be a sequence's final byte): an
	// occurrence whose form differs on both sides extends to four only.
	prev, next := -1, -1
	if plain && g >= csiMax+1 && g+kvQ < len(data) && bytes.IndexByte(data[g-csiMax-1:g+kvQ+1], 0x1b) < 0 {
		// (not a special character's byte; a backspace run erases
		// no character before the gram, kvBSMax <= kvQ)
		if c := data[g-1]; sepClass[c] == 0 && c < 0x80 {
			prev = int(lowerByte(c))
		}
		if c := data[g+kvQ]; sepClass[c] == 0 && c < 0x80 && !bsAfter(data, g+kvQ+1) {
			next = int(lowerByte(c))
		}
	}
	for _, o := range occs {
		f := &kv.forms[o.form]
		if prev >= 0 && next >= 0 && f.m > kvQ {
			j := int(o.off)
			if (j == 0 || int(f.s[j-1]) != prev) && (j+kvQ == len(f.s) || int(f.s[j+kvQ]) != next) {
				continue
			}
		}
		if !f.rep && st.covered(o.form, g) {
			continue
		}
		if plain && quickReject(data, g, f, int(o.off)) {
			continue
		}
		st.window(data, g-32, g+96)
		start, end, ok := s.kvExtend(sc, data, g, f, int(o.off))
		if !ok {
			continue
		}
		st.found = append(st.found, kvFound{o.form, start, end})
		if open, _ := trailing(data, end, final); open {
			continue // may extend: kvTail holds it
		}
		sc.regs = append(sc.regs, region{start: start, end: end, mstart: start, mend: end, lab: f.lab})
	}
}

// quickReject decides on the raw bytes, without normalising, that the
// gram at g (four plain bytes) extends to fewer than f.m characters: both
// ways the walk stops at a plain byte that differs from the form and is
// not part of an escape sequence nor erased by a backspace (or at a break,
// or at the form's ends), passing separator bytes as the normalised stream
// leaves them out. Anything else (an escape sequence, a backspace, a
// special character, the end of data) goes the full way.
func quickReject(data []byte, g int, f *kvForm, off int) bool {
	n := len(data)
	r, x, gap := kvQ, g+kvQ, 0
right:
	for off+r < len(f.s) {
		if x == n {
			return false
		}
		c := data[x]
		switch sepClass[c] {
		case 0:
		case 1:
			if gap++; gap > kvGapMax {
				break right // a break ends the match
			}
			x++
			continue
		default:
			return false
		}
		if lowerByte(c) != f.s[off+r] {
			if e, maybe := bsErased(data, x); e || maybe {
				return false // an erased character may be skipped
			}
			break
		}
		r, x, gap = r+1, x+1, 0
	}
	l := 0
	x, gap = g-1, 0
left:
	for off-l-1 >= 0 {
		if x < 0 {
			return false
		}
		c := data[x]
		switch sepClass[c] {
		case 0:
		case 1:
			if gap++; gap > kvGapMax {
				break left
			}
			x--
			continue
		default:
			return false
		}
		if lowerByte(c) != f.s[off-l-1] {
			if safeStart(data, x) != x {
				return false // x may be a sequence's final byte
			}
			break
		}
		l, x, gap = l+1, x-1, 0
	}
	return l+r < f.m
}

// covered: a found match of form fi already contains the character at g
// and the three after it (forms without a repeated gram have one
// alignment per gram, so it is the same match).
func (st *kvScratch) covered(fi int32, g int) bool {
	for i := len(st.found) - 1; i >= 0 && i >= len(st.found)-8; i-- {
		f := &st.found[i]
		if f.form == fi && f.start <= g && g+kvQ <= f.end {
			return true
		}
	}
	return false
}

// kvExtend extends the gram at raw g, aligned with f.s[off:], both ways to
// the longest match (optional characters taken or skipped); ok if it is at
// least f.m characters of f. It returns the raw extent from the first to
// past the last character taken.
func (s *Set) kvExtend(sc *scratch, data []byte, g int, f *kvForm, off int) (start, end int, ok bool) {
	st := &sc.kvs
	for {
		i := st.index(g)
		if i >= len(st.nb) {
			if st.we == len(data) {
				return 0, 0, false
			}
			st.grow(data, false)
			continue
		}
		rj, ri, edge := st.extend(f.s, i, off, 1)
		if edge && st.we < len(data) {
			st.grow(data, false)
			continue
		}
		if rj-off < kvQ {
			return 0, 0, false // a fold collision or a break: not the gram
		}
		ri = max(ri, st.reach)
		lj, li, edge := st.extend(f.s, i-1, off-1, -1)
		if edge && st.ws > 0 {
			st.grow(data, true)
			continue
		}
		// lj: the form offset before the first taken (-1 = none), li its index.
		if rj-(lj+1) < f.m {
			return 0, 0, false
		}
		// The extent runs to the farthest character any path took: which
		// gram was sampled must not decide where a redaction begins (a
		// plain character before optional ones can begin a match too).
		li = min(li, st.reach)
		return int(st.np[li]), charEnd(data, int(st.np[ri])), true
	}
}

// extend runs the form s against the window from index i and form offset
// j in direction dir (+1 right, -1 left), optional characters taken or
// skipped (at most kvSkipMax in a row). It returns the farthest form
// offset reached by taking a character (right: the end, exclusive; left:
// the offset before the first taken) and the window index of that
// character (i - dir if none), and whether it ran into the window's edge
// with states alive. st.reach is the farthest index where any state took a
// character (a shorter path may begin before the longest one: a plain
// character before optional ones).
func (st *kvScratch) extend(s []byte, i, j, dir int) (bestJ, bestI int, edge bool) {
	bestJ, bestI = j, i-dir
	if dir < 0 {
		bestJ, bestI = j, i+1
	}
	st.reach = bestI
	cur := append(st.st[:0], int32(j))
	sk := append(st.sk[:0], 0)
	// mark[o+1] == gen: form offset o is in nx, at pos[o+1] (o runs from
	// -1 to len(s))
	if len(st.mark) < len(s)+2 {
		st.mark = make([]uint32, len(s)+2)
		st.pos = make([]int32, len(s)+2)
		st.gen = 0
	}
	if !st.hasOpt {
		return st.extendPlain(s, i, j, dir)
	}
	for ; len(cur) > 0; i += dir {
		if i < 0 || i >= len(st.nb) {
			edge = true
			break
		}
		c := st.nb[i]
		nx, nsk := st.nx[:0], st.nsk[:0]
		st.gen++
		if st.gen == 0 {
			clear(st.mark)
			st.gen = 1
		}
		for _, sj := range cur {
			if sj >= 0 && int(sj) < len(s) && s[sj] == c {
				if o := sj + int32(dir) + 1; st.mark[o] != st.gen {
					st.mark[o], st.pos[o] = st.gen, int32(len(nx))
					nx = append(nx, sj+int32(dir))
					nsk = append(nsk, 0)
					st.reach = i
				}
			}
		}
		if w := st.opt[i]; w != 0 {
			for k, sj := range cur {
				n := sk[k] + w
				if n > kvSkipMax {
					continue // too many skipped in a row: this path ends
				}
				if o := sj + 1; st.mark[o] != st.gen {
					if len(nx) < kvStates {
						st.mark[o], st.pos[o] = st.gen, int32(len(nx))
						nx = append(nx, sj)
						nsk = append(nsk, n)
					}
				} else if x := st.pos[o]; nsk[x] > n {
					nsk[x] = n
				}
			}
		}
		for _, sj := range nx {
			if dir > 0 && int(sj) > bestJ || dir < 0 && int(sj) < bestJ {
				bestJ, bestI = int(sj), i
			}
		}
		// A character taken here that reaches the best offset again (a
		// plain one before a skipped optional one) moves the extent on.
		for _, sj := range cur {
			if int(sj+int32(dir)) == bestJ && sj >= 0 && int(sj) < len(s) && s[sj] == c {
				bestI = i
			}
		}
		st.st, st.nx = nx, cur
		st.sk, st.nsk = nsk, sk
		cur, sk = nx, nsk
	}
	return bestJ, bestI, edge
}

// extendPlain is extend on a window without optional characters: one
// state, the form walked while it agrees.
func (st *kvScratch) extendPlain(s []byte, i, j, dir int) (bestJ, bestI int, edge bool) {
	bestJ, bestI = j, i-dir
	if dir < 0 {
		bestJ, bestI = j, i+1
	}
	for ; j >= 0 && j < len(s); i, j = i+dir, j+dir {
		if i < 0 || i >= len(st.nb) {
			edge = true
			break
		}
		if st.nb[i] != s[j] {
			break
		}
		bestJ, bestI = j+dir, i
	}
	st.reach = bestI
	return bestJ, bestI, edge
}

// kvTail holds the end of data from where a match could still begin or
// extend: the longest suffix of the normalised data (followed only by
// separators, no break) that is a substring of a form. A match (m_f or
// longer) is held whole; a shorter candidate may be released by Flush (it
// shows fewer than k characters) and stays as context. An undecided escape
// sequence at the end is held too (Flush may release it), and so are the
// first bytes of a special character (units.go). Characters at the end may
// still be erased by a backspace run: a candidate before them is held too.
func (s *Set) kvTail(sc *scratch, data []byte) {
	// The first bytes of a special character likewise (a separator or a
	// fullwidth character when complete, characters if not).
	for j := max(0, len(data)-2); j < len(data); j++ {
		if specialPending(data, j) {
			sc.holdAt(j, len(data))
			s.kvTailBoth(sc, data)
			data = data[:j]
			break
		}
	}
	// An escape sequence still undecided at the end is held (Flush may
	// release it) and is a separator for what comes before it. Its bytes
	// are characters if it turns out to be none (an ESC alone, as Redact
	// at the end reads it): a candidate they end is held as any other.
	for j := len(data) - 1; j >= max(0, len(data)-csiMax); j-- {
		if data[j] == 0x1b {
			if _, pend := seqEnd(data, j); pend {
				sc.holdAt(j, len(data))
				s.kvTailBoth(sc, data)
				data = data[:j]
			}
			break
		}
	}
	s.kvTailBoth(sc, data)
}

// kvTailBoth is kvTailChars for data as it is and, if data ends with a
// character or a backspace, with its last 1, ... kvBSMax characters erased
// (a backspace run may still come).
func (s *Set) kvTailBoth(sc *scratch, data []byte) {
	st := &sc.kvs
	n := len(data)
	st.ws, st.we = 0, -1 // the window may hold more than data now
	defer func() { st.bsTail, st.ws, st.we = 0, 0, -1 }()
	st.bsTail = 0
	st.window(data, n-4*csiMax, n)
	s.kvTailChars(sc, data, 0)
	if n == 0 || sepClass[data[n-1]] == 1 || sepClass[data[n-1]] == 2 {
		return
	}
	for j := 1; j <= kvBSMax; j++ {
		// The window ends at n: mark one more character erased on it
		// (or, if it was moved, normalise afresh with bsTail = j).
		st.bsTail = j
		if st.we == n {
			bt := st.tailBS
			if bt.pending(st.opt, j) < j {
				return
			}
			st.hasOpt = true
		} else {
			st.ws, st.we = 0, -1
			if st.window(data, n-4*csiMax, n); st.bsGot < j {
				return
			}
		}
		s.kvTailChars(sc, data, j)
	}
}

// kvTailChars is kvTail for the characters at the end of data, on the
// window normalised up to its end; with bsTail > 0, the last bsTail
// characters read as erased (optional).
func (s *Set) kvTailChars(sc *scratch, data []byte, bsTail int) {
	kv := s.kv
	st := &sc.kvs
	n := len(data)
	// the last plain character; optional ones after it may begin a match
	last := len(st.nb) - 1
	for last >= 0 && st.opt[last] != 0 {
		last--
	}
	if t := last + 1; t < len(st.nb) && bsTail == 0 {
		sc.holdAt(int(st.np[t]), n)
	}
	from := n
	if last >= 0 {
		if st.nb[last] == 0 {
			last = -1
		} else {
			from = charEnd(data, int(st.np[last]))
		}
	}
	if open, _ := trailing(data, from, false); last < 0 || !open {
		return
	}
	lastPos := int(st.np[last])
	st.window(data, lastPos-64, n)
	i := st.index(lastPos)
	// The last kvQ plain characters as a gram, extended left along each
	// of its occurrences.
	var t [kvQ]byte
	got := 0
	for x := i; x >= 0 && got < kvQ; x-- {
		if st.nb[x] == 0 {
			break
		}
		if st.opt[x] == 0 {
			got++
			t[kvQ-got] = st.nb[x]
		}
	}
	if got == kvQ {
		for _, o := range kv.tab.get(binary.LittleEndian.Uint32(t[:]) | fold4) {
			f := &kv.forms[o.form]
			off := int(o.off) + kvQ - 1 // f.s[off] is the last character
			for {
				i = st.index(lastPos)
				lj, li, edge := st.extend(f.s, i, off, -1)
				if edge && st.ws > 0 {
					st.grow(data, true)
					continue
				}
				if l := off - lj; l >= kvQ {
					p := int(st.np[min(li, st.reach)])
					if l >= f.m {
						sc.holdAt(p, p)
					} else {
						sc.holdAt(p, n)
					}
				}
				break
			}
		}
	}
	// Shorter suffixes: one to three plain characters of some form.
	i = st.index(lastPos)
	got = 0
	for x := i; x >= 0 && got < 3; x-- {
		if st.nb[x] == 0 {
			break
		}
		if st.opt[x] == 0 {
			got++
			t[3-got] = st.nb[x]
			if kv.hasShort(t[3-got : 3]) {
				// optional characters just before may belong to it too
				y := x
				for y > 0 && st.opt[y-1] != 0 {
					y--
				}
				sc.holdAt(int(st.np[y]), n)
			}
		}
	}
}

// hasShort: t (1..3 lower-case characters) is a substring of some form
// (3: possibly a hash collision, which only holds more).
func (kv *kvIndex) hasShort(t []byte) bool {
	switch len(t) {
	case 1:
		return kv.one.has(t[0])
	case 2:
		x := uint32(t[0]) | uint32(t[1])<<8
		return kv.two[x>>6]&(1<<(x&63)) != 0
	}
	x := hash3(uint32(t[0])|uint32(t[1])<<8|uint32(t[2])<<16, kv.log3)
	return kv.three[x>>6]&(1<<(x&63)) != 0
}
