package scrub

import (
	"encoding/binary"
	"slices"
)

// The prefilter finds candidate anchor starts. It samples every second
// position: the 4-byte window there, folded with |0x20 (a cheap, lossy ASCII
// case fold applied the same way to anchors), is hashed into a 2^21-bit
// bitmap. An anchor occurrence at s contains the sampled window at s (s
// even) or s+1 (s odd), so the bitmap holds each anchor's 4-grams at
// offsets 0 and 1; anchors shorter than 5 bytes are entered with every
// continuation byte their rules can match (bytes a match can contain). A
// bitmap hit at i makes i and i-1 candidate starts; only those are verified
// exactly, via a map from the folded first 4 bytes to anchors (a list for
// 3-byte keywords). The last 5 starts are always candidates, and a proper
// prefix of an anchor in the last 3 bytes is found by prefix sets.
const (
	bitmapBits  = 21
	bitmapWords = 1 << (bitmapBits - 6)
	hashMul     = 0x9E3779B1
	fold4       = 0x20202020
	fold8       = 0x2020202020202020
)

type prefilter struct {
	bits   *[bitmapWords]uint64
	m4     table4              // folded first 4 bytes -> anchors of length >= 4
	short  []shortAnchor       // anchors of length 3
	exPre  map[string]struct{} // proper prefixes (1..3 bytes) of literal anchors
	lowPre map[string]struct{} // proper prefixes (1..3 bytes, lower case) of keyword anchors
}

type shortAnchor struct {
	key uint32 // folded 3 bytes
	ai  int32
}

func hash4(x uint32) uint32 { return (x * hashMul) >> (32 - bitmapBits) }

func foldByte(c byte) byte { return c | 0x20 }

func lowerByte(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// newPrefilter indexes anchors; follow[i] is the set of bytes that may
// follow a short (< 5 byte) keyword anchor i.
func newPrefilter(anchors []anchor, follow func(i int) byteSet) *prefilter {
	pf := &prefilter{
		bits:   new([bitmapWords]uint64),
		exPre:  make(map[string]struct{}),
		lowPre: make(map[string]struct{}),
	}
	set := func(g []byte) {
		h := hash4(binary.LittleEndian.Uint32(g) | fold4)
		pf.bits[h>>6] |= 1 << (h & 63)
	}
	for i := range anchors {
		a := &anchors[i]
		l := a.lit
		if len(l) == 3 {
			key := uint32(foldByte(l[0])) | uint32(foldByte(l[1]))<<8 | uint32(foldByte(l[2]))<<16
			pf.short = append(pf.short, shortAnchor{key, int32(i)})
		} else {
			pf.m4.add(binary.LittleEndian.Uint32(l)|fold4, int32(i))
		}
		// 4-grams at offsets 0 and 1, continued by follow bytes if short.
		var fb []byte
		if len(l) < 5 {
			f := follow(i)
			for c := 0; c < 256; c++ {
				if f.has(byte(c)) {
					fb = append(fb, foldByte(byte(c)))
				}
			}
			slices.Sort(fb)
			fb = slices.Compact(fb)
		}
		for off := 0; off < 2; off++ {
			g := make([]byte, 4)
			switch need := off + 4 - len(l); {
			case need <= 0:
				set(l[off : off+4])
			case need == 1:
				copy(g, l[off:])
				for _, c := range fb {
					g[3] = c
					set(g)
				}
			default: // need == 2
				copy(g, l[off:])
				for _, c := range fb {
					for _, d := range fb {
						g[2], g[3] = c, d
						set(g)
					}
				}
			}
		}
		pre := pf.exPre
		if a.fold {
			pre = pf.lowPre
		}
		for n := 1; n <= 3 && n < len(l); n++ {
			pre[string(l[:n])] = struct{}{}
		}
	}
	pf.m4.build()
	return pf
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
// i-1 and i for every sampled bitmap hit at i, and the last 5 positions.
func (pf *prefilter) scan(data []byte, hits []int) []int {
	bits := pf.bits
	n := len(data)
	i := 0
	for ; i+14 <= n; i += 12 {
		d := data[i : i+14]
		v := binary.LittleEndian.Uint64(d[0:8]) | fold8
		u := binary.LittleEndian.Uint64(d[6:14]) | fold8
		h0 := hash4(uint32(v))
		h1 := hash4(uint32(v >> 16))
		h2 := hash4(uint32(v >> 32))
		h3 := hash4(uint32(u))
		h4 := hash4(uint32(u >> 16))
		h5 := hash4(uint32(u >> 32))
		b0 := bits[h0>>6] >> (h0 & 63)
		b1 := bits[h1>>6] >> (h1 & 63)
		b2 := bits[h2>>6] >> (h2 & 63)
		b3 := bits[h3>>6] >> (h3 & 63)
		b4 := bits[h4>>6] >> (h4 & 63)
		b5 := bits[h5>>6] >> (h5 & 63)
		if (b0|b1|b2|b3|b4|b5)&1 != 0 {
			for j, b := range [6]uint64{b0, b1, b2, b3, b4, b5} {
				if b&1 != 0 {
					hits = append(hits, i+2*j-1, i+2*j)
				}
			}
		}
	}
	for ; i+4 <= n; i += 2 {
		h := hash4(binary.LittleEndian.Uint32(data[i:i+4]) | fold4)
		if bits[h>>6]>>(h&63)&1 != 0 {
			hits = append(hits, i-1, i)
		}
	}
	for p := max(0, n-5); p < n; p++ {
		hits = append(hits, p)
	}
	return hits
}

// partial reports whether t (1..3 bytes) is a proper prefix of an anchor.
func (pf *prefilter) partial(t []byte) bool {
	if _, ok := pf.exPre[string(t)]; ok {
		return true
	}
	var lb [3]byte
	for j, c := range t {
		lb[j] = lowerByte(c)
	}
	_, ok := pf.lowPre[string(lb[:len(t)])]
	return ok
}
