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
