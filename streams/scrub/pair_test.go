package scrub

import (
	"bytes"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
)

type pairWrite struct {
	tag  int // 0 stdout, 1 stderr
	text string
}

func runPair(s *Set, writes []pairWrite, flush bool) (out, errOut string) {
	var o, e bytes.Buffer
	p := s.NewPair(&o, &e)
	ws := []interface{ Write([]byte) (int, error) }{p.Stdout(), p.Stderr()}
	for _, w := range writes {
		ws[w.tag].Write([]byte(w.text))
		if flush {
			p.Flush()
		}
	}
	p.Close()
	return o.String(), e.String()
}

// TestPairCrossStream: a value whose pieces go to stdout and stderr in
// turn (each piece shorter than k) is redacted in the stream where it
// begins and none of it shows in the other.
func TestPairCrossStream(t *testing.T) {
	const v = "Zq9vX2pLmN4t" // 12 bytes: k = 8
	s := withValues(t, ruleSet(t), map[string]string{"db": v})
	for _, flush := range []bool{false, true} {
		for _, tc := range []struct {
			name   string
			writes []pairWrite
		}{
			{"halves", []pairWrite{{0, "run: " + v[:6]}, {1, v[6:] + "\n"}}},
			{"halves, stderr first", []pairWrite{{1, v[:6]}, {0, v[6:] + " done\n"}}},
			{"four pieces", []pairWrite{{0, v[:3]}, {1, v[3:6]}, {0, v[6:9]}, {1, v[9:] + "\n"}}},
			{"one byte each", func() []pairWrite {
				var w []pairWrite
				for i := range len(v) {
					w = append(w, pairWrite{i % 2, v[i : i+1]})
				}
				return w
			}()},
		} {
			out, errOut := runPair(s, tc.writes, flush)
			first := tc.writes[0].tag
			if shown := [2]string{out, errOut}; !flush && !strings.Contains(shown[first], "[REDACTED:db]") {
				t.Errorf("%s: no redaction where it begins: stdout %q stderr %q", tc.name, out, errOut)
			}
			// Flush may release a candidate shorter than k first; what is
			// left of the value in both streams together is less than k.
			left := strings.NewReplacer("[REDACTED:db]", "", "run: ", "", " done", "", "\n", "").Replace(out + errOut)
			if len(left) >= KnownRun(len(v)) {
				t.Errorf("%s (flush %v): %q of the value shows: stdout %q stderr %q", tc.name, flush, left, out, errOut)
			}
		}
	}
}

// TestPairOwnStream: output on the other stream between two pieces of a
// value on one stream does not hide it (each stream is also scrubbed on
// its own).
func TestPairOwnStream(t *testing.T) {
	const v = "Zq9vX2pLmN4t"
	s := withValues(t, ruleSet(t), map[string]string{"db": v})
	out, errOut := runPair(s, []pairWrite{{0, v[:6]}, {1, "progress 50%\n"}, {0, v[6:] + "\n"}}, false)
	if leaks([]byte(out), v) || strings.Contains(out, v[:6]) || errOut != "progress 50%\n" {
		t.Errorf("stdout %q stderr %q", out, errOut)
	}
	out, errOut = runPair(s, []pairWrite{{0, "export TOKEN=ghp_"}, {1, "warning: x\n"}, {0, "Xy7Qk2LmN9pR4sT6vW8zA1bC3dE5fG7hJ0kM\n"}}, true)
	if strings.Contains(out, "Xy7Qk2LmN9pR4sT6") || !strings.Contains(errOut, "warning: x") {
		t.Errorf("stdout %q stderr %q", out, errOut)
	}
}

// TestPairClean: text with nothing to redact comes out of each stream byte
// for byte, in any interleaving and split, with or without Flush; a
// redaction in one stream leaves the other's bytes in order.
func TestPairClean(t *testing.T) {
	s, _, _ := fuzzSetup(t)
	rnd := rand.New(rand.NewPCG(5, 6))
	for range 300 {
		var want [2]string
		var writes []pairWrite
		for range 1 + rnd.IntN(20) {
			tag := rnd.IntN(2)
			text := string(cleanCorpus(rnd, 1+rnd.IntN(200)))
			text = text[:1+rnd.IntN(len(text))]
			writes = append(writes, pairWrite{tag, text})
			want[tag] += text
		}
		if s.RedactString(want[0]+want[1]) != want[0]+want[1] || s.RedactString(want[1]+want[0]) != want[1]+want[0] {
			continue
		}
		flush := rnd.IntN(2) == 0
		out, errOut := runPair(s, writes, flush)
		if out != want[0] || errOut != want[1] {
			t.Fatalf("flush %v\nwrites %v\nstdout %q\nstderr %q", flush, writes, out, errOut)
		}
	}
}

// TestPairConcurrent: both streams written from their own goroutines (as
// the exec paths do) under -race; each stream keeps its bytes in order.
func TestPairConcurrent(t *testing.T) {
	s := ruleSet(t)
	var o, e bytes.Buffer
	p := s.NewPair(&o, &e)
	var wg sync.WaitGroup
	for tag, w := range []interface{ Write([]byte) (int, error) }{p.Stdout(), p.Stderr()} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				w.Write([]byte{byte('a' + tag), byte('0' + i%10), '\n'})
			}
		}()
	}
	wg.Wait()
	p.Close()
	for tag, b := range []*bytes.Buffer{&o, &e} {
		var want strings.Builder
		for i := range 2000 {
			want.Write([]byte{byte('a' + tag), byte('0' + i%10), '\n'})
		}
		if b.String() != want.String() {
			t.Errorf("stream %d out of order (%d bytes)", tag, b.Len())
		}
	}
	if _, err := p.Stdout().Write([]byte("x")); err != ErrClosed {
		t.Errorf("write after Close: %v", err)
	}
}

// TestPairRandom: a value's pieces and clean text go to stdout and stderr
// in random turns, split at random, with Flush at random: neither stream
// shows k characters of it in a row (each stream is still scrubbed on its
// own), and in the merged order of writes the value is not readable when
// nothing came between its pieces.
func TestPairRandom(t *testing.T) {
	s, values, _ := fuzzSetup(t)
	rnd := rand.New(rand.NewPCG(11, 12))
	for range 400 {
		v := values[[]string{"db", "gh", "sym"}[rnd.IntN(3)]]
		var writes []pairWrite
		junk := rnd.IntN(2) == 0
		for rest := v; rest != ""; {
			n := 1 + rnd.IntN(len(rest))
			writes = append(writes, pairWrite{rnd.IntN(2), rest[:n]})
			rest = rest[n:]
			if junk && rnd.IntN(3) == 0 {
				writes = append(writes, pairWrite{rnd.IntN(2), string(cleanCorpus(rnd, 40)[:1+rnd.IntN(30)])})
			}
		}
		writes = append(writes, pairWrite{rnd.IntN(2), "\n"})
		out, errOut := runPair(s, writes, rnd.IntN(2) == 0)
		for _, o := range []string{out, errOut} {
			if leaks([]byte(o), v) {
				t.Fatalf("writes %v\nstdout %q\nstderr %q", writes, out, errOut)
			}
		}
		if !junk {
			// Nothing came between the pieces: in write order the streams
			// held the value, so together they show fewer than k of it.
			left := regexp.MustCompile(`\[REDACTED:[^\]]*\]|\n`).ReplaceAllString(out+errOut, "")
			if len(left) >= KnownRun(len(v)) {
				t.Fatalf("%q shows\nwrites %v\nstdout %q\nstderr %q", left, writes, out, errOut)
			}
		}
	}
}
