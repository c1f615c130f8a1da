package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// MinValueLen is the shortest known value that is registered.
const MinValueLen = 6

// Set is an immutable compiled scrubber: rules plus known values. It is
// safe for concurrent use; its counters are shared with every Set derived
// from it by WithValues.
type Set struct {
	rules   []*crule
	values  []namedValue // registered values, sorted by name then value
	anchors []anchor
	pf      *prefilter
	reg     *registry
	pool    sync.Pool // *scratch
}

type namedValue struct{ name, value string }

// label is what a redaction is replaced with and counted under.
type label struct {
	repl []byte // "[REDACTED:<name>]"
	key  string // rule id or "value:<name>"
	prio int    // overlap tie-break: values 0, then rules in file order
	ctr  *atomic.Int64
}

// anchor is a literal the prefilter looks for: a rule keyword (fold: stored
// in lower case, matched ASCII-case-insensitively; rules lists the rules it
// triggers) or a known value or one of its encodings (lab; b64 says the
// match extends over one more base64 character and padding).
type anchor struct {
	lit    []byte
	fold   bool
	rules  []int32
	follow []byteSet // per rule: bytes that may follow the keyword in a match
	lab    *label
	b64    byte // 0, or the alphabet: 's' std, 'u' url
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
	for name, v := range values {
		switch {
		case !validName(name):
			errs = append(errs, &ValueError{Name: name, Reason: "name must be 1..128 printable characters without ']'"})
		case len(v) < MinValueLen:
			errs = append(errs, &ValueError{Name: name, Reason: fmt.Sprintf("value shorter than %d bytes", MinValueLen)})
		default:
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
	n := &Set{rules: s.rules, values: vals, reg: s.reg}
	n.build()
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
	for ri, r := range s.rules {
		for _, k := range r.src.Keywords {
			lk := strings.ToLower(k)
			ai, ok := kw[lk]
			if !ok {
				ai = len(s.anchors)
				kw[lk] = ai
				s.anchors = append(s.anchors, anchor{lit: []byte(lk), fold: true})
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
	lits := make(map[string]bool)
	labs := make(map[string]*label)
	for _, v := range s.values {
		lab := labs[v.name]
		if lab == nil {
			key := "value:" + v.name
			lab = &label{repl: []byte("[REDACTED:" + v.name + "]"), key: key, ctr: s.reg.counter(key)}
			labs[v.name] = lab
		}
		for _, e := range encodings(v.value) {
			if lits[e.s] {
				continue
			}
			lits[e.s] = true
			s.anchors = append(s.anchors, anchor{lit: []byte(e.s), lab: lab, b64: e.b64, fold: e.fold})
		}
	}
	s.pf = newPrefilter(s.anchors, func(i int) byteSet {
		var f byteSet
		for _, ri := range s.anchors[i].rules {
			for w := range f {
				f[w] |= s.rules[ri].bytes[w]
			}
		}
		return f
	})
}

type encoding struct {
	s    string
	b64  byte
	fold bool // s is lower case and matches in any ASCII case
}

// encodings lists the literals that reveal v: v itself in any ASCII case
// (hosts and many tools change case; swapped or title case reveal it as
// well); hex in any case; URL query and path escaping; JSON string escaping (with and
// without HTML escapes), Go %q, Python repr and JavaScript string literals,
// and shell escaping (backslash and single-quote styles); base64 std and URL alphabets; for multi-line
// values also the CRLF form and every line of at least MinValueLen bytes.
//
// Base64: v inside a longer encoded run sits at one of three alignments
// (bytes before it mod 3). For each, the "stable core" is the run of
// characters whose 6 bits all come from v; the character before the core
// mixes bits of the previous byte and of v's first byte, so each of its
// possible values (4 or 16) is also registered in front of the core. The
// match then extends over the character after the core (it may carry v's
// last bits) and '=' padding. Characters that encode only other bytes (e.g.
// "dXNlcjo" for "user:") stay visible.
func encodings(v string) []encoding {
	var out []encoding
	add := func(s string, b64 byte) {
		if len(s) >= 3 && !slices.ContainsFunc(out, func(e encoding) bool { return e.s == s }) {
			out = append(out, encoding{s: s, b64: b64})
		}
	}
	addFold := func(s string) { out = append(out, encoding{s: asciiLower(s), fold: true}) }
	addFold(v)
	if strings.ContainsFunc(v, func(r rune) bool { return r >= 0x80 }) { // non-ASCII letters (or invalid UTF-8) change too
		add(strings.ToLower(v), 0)
		add(strings.ToUpper(v), 0)
	}
	addFold(hex.EncodeToString([]byte(v)))
	add(url.QueryEscape(v), 0)
	add(url.PathEscape(v), 0)
	if j, err := json.Marshal(v); err == nil {
		add(string(j[1:len(j)-1]), 0)
	}
	var jb bytes.Buffer
	enc := json.NewEncoder(&jb)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) == nil {
		j := bytes.TrimSpace(jb.Bytes())
		add(string(j[1:len(j)-1]), 0)
	}
	q := strconv.Quote(v)
	add(q[1:len(q)-1], 0)
	add(shellBackslash(v), 0)
	if strings.ContainsAny(v, "\\'\"\n\r\t") {
		// String literals as Python's repr and JavaScript's util.inspect
		// print them: backslashes and controls escaped, and no quote, one
		// kind or both escaped (each picks its quotes by the content).
		for _, q := range []string{"", "'", `"`, `'"`} {
			add(escapeLiteral(v, q), 0)
		}
	}
	if strings.Contains(v, "'") {
		add("'"+strings.ReplaceAll(v, "'", `'\''`)+"'", 0)
	}
	for _, alpha := range []struct {
		enc *base64.Encoding
		tag byte
	}{{base64.RawStdEncoding, 's'}, {base64.RawURLEncoding, 'u'}} {
		for _, c := range b64Cores([]byte(v), alpha.enc) {
			add(c, alpha.tag)
		}
	}
	if strings.Contains(v, "\n") {
		if !strings.Contains(v, "\r\n") {
			add(strings.ReplaceAll(v, "\n", "\r\n"), 0)
		}
		for _, line := range strings.Split(v, "\n") {
			line = strings.TrimRight(line, "\r")
			if len(line) >= MinValueLen {
				add(line, 0)
			}
		}
	}
	return out
}

// asciiLower lowers ASCII letters only (strings.ToLower rewrites invalid
// UTF-8 and folds other letters, neither of which the matcher's fold does).
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		b[i] = lowerByte(c)
	}
	return string(b)
}

// b64Cores returns, for the three alignments, the stable core and the
// variants with each possible leading partial character.
func b64Cores(v []byte, enc *base64.Encoding) []string {
	var out []string
	buf := make([]byte, 2+len(v))
	for a := 0; a < 3; a++ {
		b := buf[:a+len(v)]
		clear(b[:a])
		copy(b[a:], v)
		s := enc.EncodeToString(b)
		lo := (8*a + 5) / 6          // first character with all bits from v
		hi := (8 * (a + len(v))) / 6 // end of the characters with all bits from v
		if hi-lo < 4 {
			continue
		}
		core := s[lo:hi]
		out = append(out, core)
		if a == 0 {
			continue
		}
		seen := map[byte]bool{}
		for p := 0; p < 256; p++ {
			b[a-1] = byte(p)
			c := enc.EncodeToString(b[:a+1])[lo-1]
			if !seen[c] {
				seen[c] = true
				out = append(out, string(c)+core)
			}
		}
	}
	return out
}

// escapeLiteral escapes v as the body of a quoted string literal: a
// backslash before '\\' and each quote in quotes, and \n, \r, \t for those
// controls.
func escapeLiteral(v, quotes string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\' || strings.IndexByte(quotes, c) >= 0:
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\r':
			b.WriteString(`\r`)
		case c == '\t':
			b.WriteString(`\t`)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// shellBackslash escapes v the way bash's printf %q does for printable
// text: a backslash before every byte outside [A-Za-z0-9_@%+=:,./-].
func shellBackslash(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_@%+=:,./-", c) >= 0) {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}

// Redact redacts a whole buffer (the end of b is the end of the stream).
// It returns b itself when nothing was redacted.
func (s *Set) Redact(b []byte) []byte {
	sc := s.getScratch()
	defer s.pool.Put(sc)
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
