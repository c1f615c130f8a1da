package scrub

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	rulesOnce sync.Once
	rulesYAML []byte
	rulesErr  error
)

func loadRules(tb testing.TB) []Rule {
	tb.Helper()
	rulesOnce.Do(func() { rulesYAML, rulesErr = os.ReadFile("../../configs/scrubber.yaml") })
	if rulesErr != nil {
		tb.Fatal(rulesErr)
	}
	rules, err := LoadRules(rulesYAML)
	if err != nil {
		tb.Fatal(err)
	}
	return rules
}

func ruleSet(tb testing.TB) *Set {
	tb.Helper()
	s, err := NewSet(loadRules(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func withValues(tb testing.TB, s *Set, v map[string]string) *Set {
	tb.Helper()
	n, err := s.WithValues(v)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// stream writes in through a Writer in the given chunk sizes (cycled),
// optionally flushing after each write, and returns the output.
func stream(tb testing.TB, s *Set, in []byte, sizes []int, flush bool) []byte {
	tb.Helper()
	var out bytes.Buffer
	w := s.NewWriter(&out)
	for i := 0; len(in) > 0; i++ {
		n := len(in)
		if len(sizes) > 0 {
			n = min(n, max(sizes[i%len(sizes)], 0))
		}
		if n, err := w.Write(in[:n]); err != nil || n != min(len(in), n) {
			tb.Fatalf("Write: %d, %v", n, err)
		}
		if flush {
			if err := w.Flush(); err != nil {
				tb.Fatal(err)
			}
		}
		in = in[n:]
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return out.Bytes()
}

// randomSizes returns write sizes summing to n, mostly tiny.
func randomSizes(rnd *rand.Rand, n int) []int {
	var sizes []int
	for n > 0 {
		var k int
		switch rnd.IntN(4) {
		case 0:
			k = 1
		case 1:
			k = 1 + rnd.IntN(8)
		case 2:
			k = 1 + rnd.IntN(64)
		default:
			k = 1 + rnd.IntN(4096)
		}
		k = min(k, n)
		sizes = append(sizes, k)
		n -= k
	}
	return sizes
}

func randString(rnd *rand.Rand, class string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = class[rnd.IntN(len(class))]
	}
	return string(b)
}

// flushEquivalent checks the output of a stream that may have been flushed
// against Redact of the whole input: the same, except that a redaction of
// a rule match may be preceded by a keyword prefix Flush released before
// the rest of the match arrived ("AK[REDACTED:aws-access-key-id]" for
// "[REDACTED:aws-access-key-id]"), or by a known-value candidate shorter
// than k characters (kvReleasable). Nothing else may differ.
func flushEquivalent(s *Set, in, got []byte) error {
	var sc scratch
	s.scan(&sc, in, -1, true, false)
	g, p := got, 0
	for _, r := range sc.regs {
		if !bytes.HasPrefix(g, in[p:r.start]) {
			return fmt.Errorf("differs before input offset %d: got ...%q", r.start, head(g))
		}
		g = g[r.start-p:]
		k := 0
		for ; !bytes.HasPrefix(g[k:], r.lab.repl); k++ {
			if k >= len(g) || r.start+k >= r.end || g[k] != in[r.start+k] {
				return fmt.Errorf("redaction %s at input offset %d missing: got ...%q", r.lab.repl, r.start, head(g))
			}
		}
		if k > 0 {
			if r.lab.prio == 0 {
				// also from the escape sequence r.start may lie in
				if !kvReleasable(s, r.lab, in[r.start:r.start+k]) || !kvReleasable(s, r.lab, in[safeStart(in, r.start):r.start+k]) {
					return fmt.Errorf("%q of known value %s released before its redaction", in[r.start:r.start+k], r.lab.repl)
				}
				g = g[k+len(r.lab.repl):]
				p = r.end
				continue
			}
			if !isKeywordPrefix(s, in[r.start:r.start+k]) {
				return fmt.Errorf("%q released before %s is not a keyword prefix", in[r.start:r.start+k], r.lab.repl)
			}
		}
		g = g[k+len(r.lab.repl):]
		p = r.end
	}
	if !bytes.Equal(g, in[p:]) {
		return fmt.Errorf("differs after input offset %d: got %q, want %q", p, head(g), head(in[p:]))
	}
	return nil
}

// kvReleasable: b, released by Flush before a known value's redaction,
// shows no match of that value on its own: no form of it has m_f (k value
// bytes' worth) consecutive characters in b. b is read with its escape
// sequences left out (as a terminal shows it), with only the bytes below
// 0x21 left out (a sequence's bytes may be taken as characters), and with
// every sequence left out whole.
func kvReleasable(s *Set, lab *label, b []byte) bool {
	for _, nb := range [][]byte{leakView(b, true), normForm(string(b)), normForm(string(dropEscapes(b)))} {
		for _, f := range s.kv.forms {
			if f.lab != lab {
				continue
			}
			for i := 0; i+f.m <= len(f.s); i++ {
				if bytes.Contains(nb, f.s[i:i+f.m]) {
					return false
				}
			}
		}
	}
	return true
}

// dropEscapes: b without its escape sequences (as seqEnd reads them).
func dropEscapes(b []byte) []byte {
	var o []byte
	for i := 0; i < len(b); i++ {
		if b[i] != 0x1b {
			o = append(o, b[i])
			continue
		}
		if e, _ := seqEnd(b, i); e > i+1 {
			i = e - 1
		}
	}
	return o
}

// isKeywordPrefix: b is a prefix of (or equal to) a rule keyword, ASCII
// case-insensitively.
func isKeywordPrefix(s *Set, b []byte) bool {
	for _, r := range s.rules {
		for _, k := range r.src.Keywords {
			if len(b) <= len(k) && strings.EqualFold(string(b), k[:len(b)]) {
				return true
			}
		}
	}
	return false
}

func head(b []byte) []byte { return b[:min(len(b), 80)] }

// brief shows b for a failure message with runs of more than 8 equal
// bytes collapsed ("<1b x498>") and at most 2000 bytes.
func brief(b []byte) string {
	var o strings.Builder
	for i := 0; i < len(b) && o.Len() < 2000; {
		j := i
		for j < len(b) && b[j] == b[i] {
			j++
		}
		if j-i > 8 {
			fmt.Fprintf(&o, "<%02x x%d>", b[i], j-i)
		} else {
			o.WriteString(strings.Trim(strconv.Quote(string(b[i:j])), `"`))
		}
		i = j
	}
	return o.String()
}
