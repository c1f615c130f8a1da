package scrub

import (
	"bytes"
	"math/rand/v2"
	"regexp"
	"slices"
	"testing"
)

type fuzzSecret struct {
	text   string       // inserted text
	secret string       // must not appear in the output
	value  string       // a known value printed in form
	form   *printedForm // its form (forms_test.go)
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

// FuzzScrub: random clean bytes with known values and rule samples
// inserted at random offsets, written in random splits, with Flush called
// at random points in half the runs. A value comes in one of the forms of
// printedForms (plain, reversed, hex with separators, base64 wrapped at
// any width and alignment, a separator between every two bytes, UTF-16,
// %XX, split by a newline, a run of k or more of its bytes, Python's
// list); neither the streamed output nor Redact of the whole shows k
// consecutive bytes of it in that form or plainly, nor a rule sample's
// secret part past its keyword. Clean input with nothing to redact passes
// byte-identical. Without Flush the output equals Redact of the whole
// input; with Flush it may differ from it only by keyword prefixes or
// known-value candidates shorter than a match released before the rest
// arrived (flushEquivalent).
func FuzzScrub(f *testing.F) {
	s, values, rules := fuzzSetup(f)
	names := make([]string, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	slices.Sort(names) // a failing input reproduces
	regs := make([]*regexp.Regexp, len(rules))
	for i, r := range rules {
		regs[i] = regexp.MustCompile(r.Regex)
	}
	f.Add([]byte("hello world\n"), uint64(1))
	f.Add([]byte("\x1b[32mok\x1b[0m\r50%\r100%\n\xff\xfe"), uint64(2))
	f.Add([]byte("password=\npostgres://u:@h sk- AKIA eyJ.eyJ. -----BEGIN"), uint64(3))
	f.Add(bytes.Repeat([]byte("Zq9vX2pLmN"), 30), uint64(4))
	f.Add([]byte("\x1b(B\x1b[m$ \x1b]0;title\x07\x1b)0\x1b(\x1b[01;31m\x1b[K"), uint64(5))
	f.Fuzz(func(t *testing.T, clean []byte, seed uint64) {
		if len(clean) > 1<<16 {
			return
		}
		rnd := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		// 1. clean text alone
		whole := s.Redact(clean)
		got, flushed := fuzzStream(t, s, clean, rnd)
		if !flushed && !bytes.Equal(got, whole) {
			t.Fatalf("clean: streamed %s != whole %s", brief(got), brief(whole))
		}
		if err := flushEquivalent(s, clean, got); err != nil {
			t.Fatalf("clean: streamed %s (whole %s): %v", brief(got), brief(whole), err)
		}
		if !bytes.Contains(whole, []byte("[REDACTED:")) && !bytes.Equal(whole, clean) {
			t.Fatalf("clean text changed: %s -> %s", brief(clean), brief(whole))
		}
		// 2. secrets at random offsets
		var secrets []fuzzSecret
		for range 1 + rnd.IntN(4) {
			var sec fuzzSecret
			switch rnd.IntN(3) {
			case 0, 1:
				v := values[names[rnd.IntN(len(names))]]
				f := &printedForms[rnd.IntN(len(printedForms))]
				text, ok := f.print(rnd, v)
				if !ok {
					f, text = &printedForms[0], v
				}
				sec = fuzzSecret{text: text, value: v, form: f}
				if f.name == "plain" {
					sec.secret = v
				}
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
			t.Fatalf("streamed != whole\nin:     %s\nstream: %s\nwhole:  %s", brief(in), brief(got), brief(whole))
		}
		if err := flushEquivalent(s, in, got); err != nil {
			t.Fatalf("%v\nin:     %s\nstream: %s\nwhole:  %s", err, brief(in), brief(got), brief(whole))
		}
		for _, sec := range secrets {
			if sec.secret != "" && bytes.Contains(got, []byte(sec.secret)) {
				t.Fatalf("secret %q in output %s", sec.secret, brief(got))
			}
			for _, out := range [][]byte{got, whole} {
				if sec.form != nil && (sec.form.leak(out, sec.value) || plainLeak(out, sec.value)) {
					t.Fatalf("%s of %q (%s) leaks\nin:     %s\nstream: %s\nwhole:  %s", sec.form.name, sec.value, brief([]byte(sec.text)), brief(in), brief(got), brief(whole))
				}
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
