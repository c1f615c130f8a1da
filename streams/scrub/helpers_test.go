package scrub

import (
	"bytes"
	"math/rand/v2"
	"os"
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
