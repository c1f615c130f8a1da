package scrub

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// TestRuleSamplesNoRun: after redaction no run of 12 characters of a
// positive sample's secret part is left anywhere in the output, so a rule
// whose max_len cuts a long token short (letting its tail through) fails.
// TestRuleSamples only checks that the whole secret part is gone.
func TestRuleSamplesNoRun(t *testing.T) {
	const run = 12
	set := ruleSet(t)
	for _, r := range loadRules(t) {
		re := regexp.MustCompile(r.Regex)
		rnd := rand.New(rand.NewPCG(uint64(len(r.ID)), 7))
		for rep := 0; rep < 10; rep++ {
			for _, tmpl := range r.Positive {
				s, err := ExpandSample(tmpl, rnd)
				if err != nil {
					t.Fatal(err)
				}
				m := re.FindStringSubmatch(s)
				if m == nil {
					t.Fatalf("%s: positive sample %q does not match", r.ID, s)
				}
				secret := m[r.SecretGroup]
				out := string(set.Redact([]byte(s)))
				for i := 0; i+run <= len(secret); i++ {
					if strings.Contains(out, secret[i:i+run]) {
						t.Fatalf("%s: %q left %q of its secret part in %q", r.ID, s, secret[i:i+run], out)
					}
				}
			}
		}
	}
}

// TestRulesAfterColour: every rule's positive samples with a colour code
// right before the match (as grep --color and coloured logs print tokens):
// the escape sequence reads as a boundary, so rules that begin with \b
// still match (80 samples leaked before).
func TestRulesAfterColour(t *testing.T) {
	rules := loadRules(t)
	s := ruleSet(t)
	rnd := rand.New(rand.NewPCG(7, 8))
	for _, r := range rules {
		re := regexp.MustCompile(r.Regex)
		for _, p := range r.Positive {
			sample, err := ExpandSample(p, rnd)
			if err != nil {
				t.Fatal(err)
			}
			m := re.FindStringSubmatchIndex(sample)
			sec := sample[m[2*r.SecretGroup]:m[2*r.SecretGroup+1]]
			for _, sgr := range []string{"\x1b[01;31m\x1b[K", "\x1b[32m", "\x1b(B"} {
				in := sample[:m[0]] + sgr + sample[m[0]:] + "\x1b[m"
				if out := s.RedactString(in); sec != "" && strings.Contains(out, sec) {
					t.Errorf("%s after %q: %q", r.ID, sgr, out)
				}
				if got := string(stream(t, s, []byte(in), []int{m[0] + 1, len(in) - m[0] - 1}, false)); got != s.RedactString(in) {
					t.Errorf("%s after %q: streamed %q", r.ID, sgr, got)
				}
			}
		}
	}
}

// TestRulesColourInside: grep --color highlights what was searched for:
// the keyword, or the keyword and more of the token. With the colour code
// after the highlighted part inside the match, the rule still matches (on
// the window without escape sequences) and nothing of the secret shows.
// A highlight ending inside the keyword itself splits it: out of reach.
func TestRulesColourInside(t *testing.T) {
	rules := loadRules(t)
	s := ruleSet(t)
	rnd := rand.New(rand.NewPCG(9, 10))
	for _, r := range rules {
		re := regexp.MustCompile(r.Regex)
		for _, p := range r.Positive {
			sample, err := ExpandSample(p, rnd)
			if err != nil {
				t.Fatal(err)
			}
			m := re.FindStringSubmatchIndex(sample)
			sec := sample[m[2*r.SecretGroup]:m[2*r.SecretGroup+1]]
			kw := 0
			for _, k := range r.Keywords {
				if i := strings.Index(strings.ToLower(sample[m[0]:m[1]]), strings.ToLower(k)); i >= 0 && (kw == 0 || i+len(k) < kw) {
					kw = i + len(k)
				}
			}
			if kw == 0 || len(sec) < 8 {
				continue
			}
			for _, h := range []int{kw, kw + 1, kw + 4} {
				if m[0]+h >= m[1] {
					continue
				}
				in := sample[:m[0]] + "\x1b[01;31m\x1b[K" + sample[m[0]:m[0]+h] + "\x1b[m\x1b[K" + sample[m[0]+h:]
				out := s.RedactString(in)
				if strings.Contains(string(dropEscapes([]byte(out))), sec) {
					t.Errorf("%s, highlight of %d: %q", r.ID, h, out)
				}
				k := m[0] + h + 3
				if got := string(stream(t, s, []byte(in), []int{k, len(in) - k}, false)); got != out {
					t.Errorf("%s, highlight of %d: streamed %q, whole %q", r.ID, h, got, out)
				}
			}
		}
	}
}
