package scrub

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// MinValueLen is the shortest known value that is registered.
const MinValueLen = 6

// MaxValueLen is the longest known value that is registered, and
// MaxValuesLen the most bytes of values one WithValues call takes: every
// encoding of a value is indexed (about 80 bytes of forms and 1,000 bytes
// of memory per value byte, up to 1,400 for punctuation and control
// characters; MemoryBytes), so these bound one Set's index to about 32 MB
// (45 MB at most) and its build to about a second.
const (
	MaxValueLen  = 16 << 10
	MaxValuesLen = 32 << 10
)

// Set is an immutable compiled scrubber: rules plus known values. It is
// safe for concurrent use; its counters are shared with every Set derived
// from it by WithValues.
type Set struct {
	rules   []*crule
	values  []namedValue // registered values, sorted by name then value
	anchors []anchor
	pf      *prefilter
	kv      *kvIndex // nil without known values
	reg     *registry
	classes int       // distinct crule.bytes (crule.class)
	pool    sync.Pool // *scratch
	budget  *Budget   // charged for everything scrubbed; nil: none
	// poolOf: the Set whose pool Redact uses (a budgeted copy shares its
	// parent's: the same rules and values); nil: this one.
	poolOf *Set
}

func (s *Set) scratchPool() *sync.Pool {
	if s.poolOf != nil {
		return &s.poolOf.pool
	}
	return &s.pool
}

type namedValue struct{ name, value string }

// label is what a redaction is replaced with and counted under.
type label struct {
	repl []byte // "[REDACTED:<name>]"
	key  string // rule id or "value:<name>"
	prio int    // overlap tie-break: values 0, then rules in file order
	ctr  *atomic.Int64
}

// anchor is a rule keyword the prefilter looks for (stored in lower case,
// matched ASCII-case-insensitively; rules lists the rules it triggers).
type anchor struct {
	lit    []byte
	rules  []int32
	follow []byteSet // per rule: bytes that may follow the keyword in a match
}

// registry holds the counters, shared by a Set and its WithValues children.
type registry struct {
	mu sync.Mutex
	m  map[string]*atomic.Int64
}

func (r *registry) counter(key string) *atomic.Int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.m[key]
	if !ok {
		c = new(atomic.Int64)
		r.m[key] = c
	}
	return c
}

// NewSet compiles rules into a Set without known values.
func NewSet(rules []Rule) (*Set, error) {
	s := &Set{reg: &registry{m: make(map[string]*atomic.Int64)}}
	seen := make(map[string]bool, len(rules))
	for _, r := range rules {
		cr, err := compileRule(r)
		if err != nil {
			return nil, err
		}
		if seen[r.ID] {
			return nil, fmt.Errorf("scrubber rule %q: duplicate id", r.ID)
		}
		seen[r.ID] = true
		cr.lab = &label{repl: []byte("[REDACTED:" + r.ID + "]"), key: r.ID, prio: 1 + len(s.rules), ctr: s.reg.counter(r.ID)}
		s.rules = append(s.rules, cr)
	}
	s.build()
	return s, nil
}

// ValueError says why a known value was not registered. It names the
// secret, never its value.
type ValueError struct {
	Name   string
	Reason string
}

func (e *ValueError) Error() string {
	return fmt.Sprintf("secret %q not registered: %s", e.Name, e.Reason)
}

// WithValues returns a new Set that also redacts these known values
// (name -> value) and their encodings. It always returns a usable Set
// holding every acceptable value; the error (a join of *ValueError) lists
// the values that were rejected: shorter than MinValueLen, or a name that
// is empty or has characters unfit for "[REDACTED:<name>]".
func (s *Set) WithValues(values map[string]string) (*Set, error) {
	var errs []error
	vals := slices.Clone(s.values)
	total := 0
	// In name order, so which values are over MaxValuesLen does not depend
	// on the map's order.
	for _, name := range slices.Sorted(maps.Keys(values)) {
		v := values[name]
		switch {
		case !validName(name):
			errs = append(errs, &ValueError{Name: name, Reason: "name must be 1..128 printable characters without ']'"})
		case len(v) < MinValueLen:
			errs = append(errs, &ValueError{Name: name, Reason: fmt.Sprintf("value shorter than %d bytes", MinValueLen)})
		case Shown(v) < MinValueLen:
			errs = append(errs, &ValueError{Name: name, Reason: fmt.Sprintf("value shows fewer than %d characters (separators, invisible characters and escape sequences left out)", MinValueLen)})
		case len(v) > MaxValueLen:
			errs = append(errs, &ValueError{Name: name, Reason: fmt.Sprintf("value longer than %d bytes", MaxValueLen)})
		case total+len(v) > MaxValuesLen:
			errs = append(errs, &ValueError{Name: name, Reason: fmt.Sprintf("values over %d bytes in all", MaxValuesLen)})
		default:
			total += len(v)
			vals = append(vals, namedValue{name, v})
		}
	}
	slices.SortFunc(vals, func(a, b namedValue) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return strings.Compare(a.value, b.value)
	})
	vals = slices.Compact(vals)
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	// The rules' anchors and prefilter are the parent's (immutable); only
	// the known values are compiled again.
	n := &Set{rules: s.rules, values: vals, reg: s.reg, anchors: s.anchors, pf: s.pf, classes: s.classes, budget: s.budget}
	n.buildValues()
	return n, errors.Join(errs...)
}

func validName(name string) bool {
	if name == "" || len(name) > 128 {
		return false
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f || r == ']' {
			return false
		}
	}
	return true
}

// MemoryBytes is about how much memory the Set's known values take (their
// index; the rules are shared with the Set it was derived from).
func (s *Set) MemoryBytes() int {
	kv := s.kv
	if kv == nil {
		return 0
	}
	n := 8 * (len(kv.bits) + len(kv.bitsL) + len(kv.two) + len(kv.three))
	n += int(unsafe.Sizeof(gramSlot{}))*len(kv.tab.slots) + int(unsafe.Sizeof(kvOcc{}))*len(kv.tab.occ)
	for _, f := range kv.forms {
		n += len(f.s) + int(unsafe.Sizeof(f))
	}
	return n
}

// Counts returns the redaction counters: rule id -> count and
// "value:<name>" -> count. The counters are shared by all Writers and
// Redact calls of this Set, of the Set it was derived from and of all Sets
// derived from it by WithValues (one family per NewSet). Writer.Counts
// gives the counts of one stream.
func (s *Set) Counts() map[string]int64 {
	s.reg.mu.Lock()
	defer s.reg.mu.Unlock()
	m := make(map[string]int64, len(s.reg.m))
	for k, c := range s.reg.m {
		m[k] = c.Load()
	}
	return m
}

func (s *Set) build() {
	kw := make(map[string]int)
	classes := make(map[byteSet]int)
	for ri, r := range s.rules {
		c, ok := classes[r.bytes]
		if !ok {
			c = len(classes)
			classes[r.bytes] = c
		}
		r.class = c
		for _, k := range r.src.Keywords {
			lk := strings.ToLower(k)
			ai, ok := kw[lk]
			if !ok {
				ai = len(s.anchors)
				kw[lk] = ai
				s.anchors = append(s.anchors, anchor{lit: []byte(lk)})
			}
			a := &s.anchors[ai]
			j := slices.Index(a.rules, int32(ri))
			if j < 0 {
				j = len(a.rules)
				a.rules = append(a.rules, int32(ri))
				a.follow = append(a.follow, byteSet{})
			}
			f := r.followBytes(k)
			for w := range f {
				a.follow[j][w] |= f[w]
			}
		}
	}
	s.classes = len(classes)
	s.pf = newPrefilter(s.anchors, func(i int) byteSet {
		var f byteSet
		for _, ri := range s.anchors[i].rules {
			for w := range f {
				f[w] |= s.rules[ri].bytes[w]
			}
		}
		f.add(0x1b) // a colour code inside a match (evalStripped)
		f.add('[')
		return f
	})
	s.buildValues()
}

// buildValues compiles the known values.
func (s *Set) buildValues() {
	labs := make(map[string]*label)
	for _, v := range s.values {
		if labs[v.name] == nil {
			key := "value:" + v.name
			labs[v.name] = &label{repl: []byte("[REDACTED:" + v.name + "]"), key: key, ctr: s.reg.counter(key)}
		}
	}
	s.kv = newKVIndex(s.values, labs)
}

// Redact redacts a whole buffer (the end of b is the end of the stream).
// It returns b itself when nothing was redacted.
func (s *Set) Redact(b []byte) []byte {
	if s.budget != nil {
		m := s.budget.begin(len(b) >= cpuClockMin)
		defer s.budget.end(m)
	}
	sc := s.getScratch()
	defer s.scratchPool().Put(sc)
	sc.before = nil
	s.scan(sc, b, -1, true, false)
	if len(sc.regs) == 0 {
		return b
	}
	out := make([]byte, 0, len(b)+len(sc.regs)*16)
	return appendRedacted(out, b, 0, len(b), sc.regs, nil)
}

// RedactString is Redact for a string.
func (s *Set) RedactString(v string) string { return string(s.Redact([]byte(v))) }

// appendRedacted appends data[from:end] with the regions replaced and
// counts each region (in the shared counters and in local, if not nil).
// data[:from] was written out already (a keyword prefix released by
// Flush): a region starting there is replaced from from on.
func appendRedacted(out, data []byte, from, end int, regs []region, local map[string]int64) []byte {
	p := from
	for _, r := range regs {
		if r.end <= from {
			continue // cannot happen: Flush releases no secret bytes
		}
		out = append(out, data[p:max(r.start, from)]...)
		out = append(out, r.lab.repl...)
		r.lab.ctr.Add(1)
		if local != nil {
			local[r.lab.key]++
		}
		p = r.end
	}
	return append(out, data[p:end]...)
}
