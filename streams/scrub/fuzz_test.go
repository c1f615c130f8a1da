package scrub

import (
	"bytes"
	"encoding/base64"
	"math/rand/v2"
	"regexp"
	"slices"
	"testing"
)

type fuzzSecret struct {
	text   string // inserted text
	secret string // must not appear in the output
	inner  string // for base64 forms: the value, checked with leaks()
}

func fuzzSetup(tb testing.TB) (*Set, map[string]string, []Rule) {
	values := map[string]string{
		"db":     "Zq9vX2pLmN4t",
		"short6": "s3cr3t",
		"gh":     "ghp_" + "Xy7", // filled below to 40 chars
		"sym":    "p@ss w/rd&x=1?\"'\\<",
		"bin":    "\xfb\xff\xbf\x3e\x3f\xfe\x00\x80",
	}
	values["gh"] = "ghp_Xy7Qk2LmN9pR4sT6vW8zA1bC3dE5fG7hJ0kM"
	rules := loadRules(tb)
	s, err := NewSet(rules)
	if err != nil {
		tb.Fatal(err)
	}
	return withValues(tb, s, values), values, rules
}

// FuzzScrub: random clean bytes with known values (plain, base64 at any
// alignment, hex) and rule samples inserted at random offsets, written in
// random splits, with Flush called at random points in half the runs. The
// output never contains a secret (a value, or a pattern's secret part past
// its keyword), and clean input with nothing to redact passes
// byte-identical. Without Flush the output equals Redact of the whole
// input; with Flush it may differ from it only by keyword prefixes
// released before the rest of their match arrived (flushEquivalent).
func FuzzScrub(f *testing.F) {
	s, values, rules := fuzzSetup(f)
	names := make([]string, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	regs := make([]*regexp.Regexp, len(rules))
	for i, r := range rules {
		regs[i] = regexp.MustCompile(r.Regex)
	}
	f.Add([]byte("hello world\n"), uint64(1))
	f.Add([]byte("\x1b[32mok\x1b[0m\r50%\r100%\n\xff\xfe"), uint64(2))
	f.Add([]byte("password=\npostgres://u:@h sk- AKIA eyJ.eyJ. -----BEGIN"), uint64(3))
	f.Add(bytes.Repeat([]byte("Zq9vX2pLmN"), 30), uint64(4))
	f.Fuzz(func(t *testing.T, clean []byte, seed uint64) {
		if len(clean) > 1<<16 {
			return
		}
		rnd := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		// 1. clean text alone
		whole := s.Redact(clean)
		got, flushed := fuzzStream(t, s, clean, rnd)
		if !flushed && !bytes.Equal(got, whole) {
			t.Fatalf("clean: streamed %q != whole %q", got, whole)
		}
		if err := flushEquivalent(s, clean, got); err != nil {
			t.Fatalf("clean: streamed %q (whole %q): %v", got, whole, err)
		}
		if !bytes.Contains(whole, []byte("[REDACTED:")) && !bytes.Equal(whole, clean) {
			t.Fatalf("clean text changed: %q -> %q", clean, whole)
		}
		// 2. secrets at random offsets
		var secrets []fuzzSecret
		for range 1 + rnd.IntN(4) {
			var sec fuzzSecret
			switch rnd.IntN(4) {
			case 0, 1:
				v := values[names[rnd.IntN(len(names))]]
				sec = fuzzSecret{text: v, secret: v}
			case 2:
				v := values[names[rnd.IntN(len(names))]]
				pre := []byte("user:")[:rnd.IntN(6)]
				raw := append(append([]byte(nil), pre...), v...)
				encs := []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding}
				sec = fuzzSecret{text: encs[rnd.IntN(4)].EncodeToString(raw), inner: v}
			default:
				ri := rnd.IntN(len(rules))
				r := rules[ri]
				sample, err := ExpandSample(r.Positive[rnd.IntN(len(r.Positive))], rnd)
				if err != nil {
					t.Fatal(err)
				}
				m := regs[ri].FindStringSubmatch(sample)
				// newlines keep the sample's own boundaries
				sec = fuzzSecret{text: "\n" + sample + "\n", secret: secretPastKeyword(r, m[0], m[r.SecretGroup])}
			}
			secrets = append(secrets, sec)
		}
		// interleave: clean[..o1] sec1 clean[o1..o2] sec2 ...
		offs := make([]int, len(secrets))
		for i := range offs {
			offs[i] = rnd.IntN(len(clean) + 1)
		}
		slices.Sort(offs)
		var in []byte
		last := 0
		for i, sec := range secrets {
			in = append(in, clean[last:offs[i]]...)
			in = append(in, sec.text...)
			last = offs[i]
		}
		in = append(in, clean[last:]...)
		whole = s.Redact(in)
		got, flushed = fuzzStream(t, s, in, rnd)
		if !flushed && !bytes.Equal(got, whole) {
			t.Fatalf("streamed != whole\nin:     %q\nstream: %q\nwhole:  %q", in, got, whole)
		}
		if err := flushEquivalent(s, in, got); err != nil {
			t.Fatalf("%v\nin:     %q\nstream: %q\nwhole:  %q", err, in, got, whole)
		}
		for _, sec := range secrets {
			if sec.secret != "" && bytes.Contains(got, []byte(sec.secret)) {
				t.Fatalf("secret %q in output %q", sec.secret, got)
			}
			if sec.inner != "" && leaks(got, sec.inner) {
				t.Fatalf("base64 of %q leaks in %q", sec.inner, got)
			}
		}
	})
}

// fuzzStream writes in through a Writer in random splits; in half the runs
// it calls Flush after a random subset of the writes (flushed: it did).
func fuzzStream(t *testing.T, s *Set, in []byte, rnd *rand.Rand) (out []byte, flushed bool) {
	var b bytes.Buffer
	w := s.NewWriter(&b)
	p := 0
	if rnd.IntN(2) == 0 {
		p = 1 + rnd.IntN(4) // flush after a write with probability p/4
	}
	for _, n := range randomSizes(rnd, len(in)) {
		w.Write(in[:n])
		in = in[n:]
		if p > 0 && rnd.IntN(4) < p {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			flushed = true
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), flushed
}
