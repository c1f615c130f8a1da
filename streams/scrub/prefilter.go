package scrub

import (
	"encoding/binary"
	"slices"
)

// The prefilter finds candidate anchor starts. It samples every third
// position p: the 4-byte window there, folded with |0x20 (a cheap, lossy
// ASCII case fold applied the same way to anchors), is hashed into a
// 2^21-bit bitmap. An anchor occurrence at s is sampled at exactly one of
// any three consecutive offsets, so the bitmap holds, for each anchor, its
// windows at three consecutive offsets j0..j0+2 from its start. Anchors of
// at least 6 bytes use offsets 0..2 (windows inside the anchor). Shorter
// ones (keywords) use the three offsets in -1..len-2 whose windows have the
// fewest completions: a window reaching before the anchor is entered with
// every byte there, one reaching past its end with every byte its rules
// accept right after the keyword (a keyword followed by another byte
// triggers nothing) and then every byte a match can contain. A bitmap hit
// at p is checked against a second, small bitmap (another hash) and then
// looked up in a hash table of the entered windows, which gives the offsets
// j it was entered at: p-j are the candidate starts. Only those are
// verified exactly, via a hash table from the folded first 4 bytes to
// anchors (a list for 3-byte keywords). The last 6 starts are always
// candidates, and a proper prefix of an anchor in the last 3 bytes is found
// by prefix sets.
const (
	stride       = 3 // probe is unrolled for 3 (four samples per 12 bytes)
	bitmapBits   = 21
	bitmapWords  = 1 << (bitmapBits - 6)
	hashMul      = 0x9E3779B1
	bitmap2Bits  = 18
	bitmap2Words = 1 << (bitmap2Bits - 6)
	hash2Mul     = 0x85EBCA77
	fold4        = 0x20202020
	fold8        = 0x2020202020202020
	minOff       = -1         // lowest window offset relative to an anchor start
	maxOff       = stride - 1 // highest
	tailStarts   = stride + 3 // last starts that are always candidates
)

type prefilter struct {
	bits   *[bitmapWords]uint64
	bits2  *[bitmap2Words]uint64 // the same windows under another hash
	win    winTable              // folded window -> offsets it is entered at
	m4     table4                // folded first 4 bytes -> anchors of length >= 4
	short  []shortAnchor         // anchors of length 3
	lowPre map[string]struct{}   // proper prefixes (1..3 bytes, lower case) of keyword anchors
}

type shortAnchor struct {
	key uint32 // folded 3 bytes
	ai  int32
}

func hash4(x uint32) uint32 { return (x * hashMul) >> (32 - bitmapBits) }

func hash2(x uint32) uint32 { return (x * hash2Mul) >> (32 - bitmap2Bits) }

func foldByte(c byte) byte { return c | 0x20 }

func lowerByte(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// foldedBytes lists the distinct folded bytes of f.
func foldedBytes(f *byteSet) []byte {
	var fb []byte
	for c := 0; c < 256; c++ {
		if f.has(byte(c)) {
			fb = append(fb, foldByte(byte(c)))
		}
	}
	slices.Sort(fb)
	return slices.Compact(fb)
}

// newPrefilter indexes anchors; follow[i] is the set of bytes a match of
// keyword anchor i's rules can contain.
func newPrefilter(anchors []anchor, follow func(i int) byteSet) *prefilter {
	pf := &prefilter{
		bits:   new([bitmapWords]uint64),
		bits2:  new([bitmap2Words]uint64),
		lowPre: make(map[string]struct{}),
	}
	var all byteSet
	for w := range all {
		all[w] = ^uint64(0)
	}
	anyByte := foldedBytes(&all)
	var g [4]byte
	wins := make(map[uint32]uint8)
	for i := range anchors {
		a := &anchors[i]
		l := a.lit
		if len(l) == 3 {
			key := uint32(foldByte(l[0])) | uint32(foldByte(l[1]))<<8 | uint32(foldByte(l[2]))<<16
			pf.short = append(pf.short, shortAnchor{key, int32(i)})
		} else {
			pf.m4.add(binary.LittleEndian.Uint32(l)|fold4, int32(i))
		}
		for n := 1; n <= 3 && n < len(l); n++ {
			pf.lowPre[string(l[:n])] = struct{}{}
		}
		// The choices for each byte of a window at offset j: before the
		// anchor any byte, then the anchor, then its continuations.
		next, cont := anyByte, anyByte
		if len(l) < stride+3 {
			var f byteSet
			for _, fj := range a.follow {
				for w := range f {
					f[w] |= fj[w]
				}
			}
			next = foldedBytes(&f)
			f = follow(i)
			cont = foldedBytes(&f)
		}
		choices := func(k int) []byte {
			switch {
			case k < 0:
				return anyByte
			case k < len(l):
				return nil // the anchor's byte
			case k == len(l):
				return next
			}
			return cont
		}
		count := func(j int) int {
			c := 1
			for t := range 4 {
				if ch := choices(j + t); ch != nil {
					c *= len(ch)
				}
			}
			return c
		}
		j0, best := 0, -1
		if len(l) < stride+3 {
			for j := minOff; j <= max(0, len(l)-4); j++ {
				if j+stride-1 > maxOff || j+stride-1+4-len(l) > 2 {
					break // past maxOff, or a window needing 3 continuations
				}
				c := 0
				for t := range stride {
					c += count(j + t)
				}
				if best < 0 || c < best {
					j0, best = j, c
				}
			}
		}
		var fill func(j, t int)
		fill = func(j, t int) {
			if t == 4 {
				key := binary.LittleEndian.Uint32(g[:]) | fold4
				h := hash4(key)
				pf.bits[h>>6] |= 1 << (h & 63)
				h = hash2(key)
				pf.bits2[h>>6] |= 1 << (h & 63)
				wins[key] |= 1 << (j - minOff)
				return
			}
			ch := choices(j + t)
			if ch == nil {
				g[t] = foldByte(l[j+t])
				fill(j, t+1)
				return
			}
			for _, c := range ch {
				g[t] = c
				fill(j, t+1)
			}
		}
		for j := j0; j < j0+stride; j++ {
			fill(j, 0)
		}
	}
	pf.m4.build()
	pf.win.build(wins)
	return pf
}

// winTable is an open-addressing hash set of the folded windows entered in
// the bitmap, each with the offsets (bit j-minOff) it was entered at. A
// bitmap hit is checked here before it yields candidate starts.
type winTable struct {
	slots []winSlot // power of two; offs == 0: empty
	mask  uint32
}

type winSlot struct {
	key  uint32
	offs uint32
}

func (t *winTable) build(m map[uint32]uint8) {
	n := 16
	for n < 2*len(m) {
		n *= 2
	}
	t.slots = make([]winSlot, n)
	t.mask = uint32(n - 1)
	for k, o := range m {
		h := winHash(k) & t.mask
		for t.slots[h].offs != 0 {
			h = (h + 1) & t.mask
		}
		t.slots[h] = winSlot{k, uint32(o)}
	}
}

func winHash(k uint32) uint32 { return (k * 0x85EBCA6B) >> 7 }

// get returns the offsets key was entered at (0: none).
func (t *winTable) get(key uint32) uint32 {
	for h := winHash(key) & t.mask; ; h = (h + 1) & t.mask {
		sl := &t.slots[h]
		if sl.key == key || sl.offs == 0 {
			return sl.offs
		}
	}
}

// table4 maps a folded 4-byte key to anchor indexes: an open-addressing
// hash table (faster than a Go map on this path) over runs of a sorted list.
type table4 struct {
	pending []keyAnchor
	slots   []slot4 // power of two; first == 0: empty
	mask    uint32
	anchors []int32
}

type keyAnchor struct {
	key uint32
	ai  int32
}

type slot4 struct {
	key         uint32
	first, last int32 // anchors[first-1 : last]
}

func (t *table4) add(key uint32, ai int32) { t.pending = append(t.pending, keyAnchor{key, ai}) }

func (t *table4) build() {
	slices.SortStableFunc(t.pending, func(a, b keyAnchor) int { return cmpU32(a.key, b.key) })
	n := 16
	for n < 2*len(t.pending) {
		n *= 2
	}
	t.slots = make([]slot4, n)
	t.mask = uint32(n - 1)
	for j := 0; j < len(t.pending); {
		k := t.pending[j].key
		first := len(t.anchors)
		for ; j < len(t.pending) && t.pending[j].key == k; j++ {
			t.anchors = append(t.anchors, t.pending[j].ai)
		}
		h := hash4(k) & t.mask
		for t.slots[h].first != 0 {
			h = (h + 1) & t.mask
		}
		t.slots[h] = slot4{key: k, first: int32(first + 1), last: int32(len(t.anchors))}
	}
	t.pending = nil
}

func (t *table4) get(key uint32) []int32 {
	for h := hash4(key) & t.mask; ; h = (h + 1) & t.mask {
		sl := &t.slots[h]
		if sl.first == 0 {
			return nil
		}
		if sl.key == key {
			return t.anchors[sl.first-1 : sl.last]
		}
	}
}

func cmpU32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// scan appends candidate starts (ascending, possibly repeated) for data:
// those of every sampled bitmap hit (see verify) and the last tailStarts
// positions.
func (pf *prefilter) scan(data []byte, hits []int) []int {
	n := len(data)
	i := 0
	for {
		var m uint
		i, m = probe(pf.bits, data, i)
		if m == 0 {
			break
		}
		for j := 0; m != 0; j, m = j+1, m>>1 {
			if m&1 != 0 {
				hits = pf.verify(data, i+stride*j, hits)
			}
		}
		i += 4 * stride
	}
	for ; i+4 <= n; i += stride {
		if pf.test(binary.LittleEndian.Uint32(data[i:i+4]) | fold4) {
			hits = pf.verify(data, i, hits)
		}
	}
	for p := max(0, n-tailStarts); p < n; p++ {
		hits = append(hits, p)
	}
	return hits
}

// verify appends the candidate starts of a bitmap hit at p: p-j for each
// offset j its window was entered at, ascending.
func (pf *prefilter) verify(data []byte, p int, hits []int) []int {
	key := binary.LittleEndian.Uint32(data[p:p+4]) | fold4
	if h := hash2(key); pf.bits2[h>>6]&(1<<(h&63)) == 0 {
		return hits
	}
	offs := pf.win.get(key)
	for j := maxOff; j >= minOff; j-- {
		if offs&(1<<(j-minOff)) != 0 {
			hits = append(hits, p-j)
		}
	}
	return hits
}

func (pf *prefilter) test(g uint32) bool {
	h := hash4(g)
	return pf.bits[h>>6]&(1<<(h&63)) != 0
}

// probe samples data at i, i+3, ... in blocks of four samples (14 bytes
// read, 12 advanced) and stops at the first block with a bitmap hit: it
// returns the block start and the hit samples (bit j: sample i+3j), or
// the first unprobed position and 0.
func probe(bits *[bitmapWords]uint64, data []byte, i int) (int, uint) {
	if i >= len(data) {
		return i, 0
	}
	for d := data[i:]; len(d) >= 14; d = d[4*stride:] {
		v := binary.LittleEndian.Uint64(d) | fold8
		u := binary.LittleEndian.Uint64(d[6:]) | fold8
		h0 := hash4(uint32(v))
		h1 := hash4(uint32(v >> 24))
		h2 := hash4(uint32(u))
		h3 := hash4(uint32(u >> 24))
		if bits[h0>>6]&(1<<(h0&63)) != 0 || bits[h1>>6]&(1<<(h1&63)) != 0 ||
			bits[h2>>6]&(1<<(h2&63)) != 0 || bits[h3>>6]&(1<<(h3&63)) != 0 {
			b0 := bits[h0>>6] >> (h0 & 63)
			b1 := bits[h1>>6] >> (h1 & 63)
			b2 := bits[h2>>6] >> (h2 & 63)
			b3 := bits[h3>>6] >> (h3 & 63)
			return i, uint(b0&1 | b1&1<<1 | b2&1<<2 | b3&1<<3)
		}
		i += 4 * stride
	}
	return i, 0
}

// partial reports whether t (1..3 bytes) is a proper prefix of a keyword.
func (pf *prefilter) partial(t []byte) bool {
	var lb [3]byte
	for j, c := range t {
		lb[j] = lowerByte(c)
	}
	_, ok := pf.lowPre[string(lb[:len(t)])]
	return ok
}
