package scrub

import (
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestRuleSamples expands every rule's sample templates many times: each
// positive is redacted under the rule's own label with the secret part
// (SecretGroup of the rule's regexp on the sample) gone; each negative
// passes unchanged. Whole-buffer and streamed (random splits) agree.
func TestRuleSamples(t *testing.T) {
	rules := loadRules(t)
	set := ruleSet(t)
	contexts := []struct{ pre, post string }{
		{"", ""},
		{"log: ", "\n"},
		{"\x1b[1;32m> ", "\x1b[0m\r\n"},
		{"{\"k\":\"v\"}\n", " \xff\xfe trailing"},
	}
	for _, r := range rules {
		t.Run(r.ID, func(t *testing.T) {
			re := regexp.MustCompile(r.Regex)
			rnd := rand.New(rand.NewPCG(uint64(len(r.ID)), 42))
			for rep := 0; rep < 25; rep++ {
				for _, tmpl := range r.Positive {
					s, err := ExpandSample(tmpl, rnd)
					if err != nil {
						t.Fatal(err)
					}
					for _, c := range contexts {
						in := c.pre + s + c.post
						m := re.FindStringSubmatch(in)
						if m == nil {
							t.Fatalf("positive sample %q does not match its own regexp", s)
						}
						secret := m[r.SecretGroup]
						out := string(set.Redact([]byte(in)))
						if strings.Contains(out, secret) {
							t.Fatalf("secret part of %q left in output %q", s, out)
						}
						if !strings.Contains(out, "[REDACTED:"+r.ID+"]") {
							t.Fatalf("%q: output %q lacks [REDACTED:%s]", s, out, r.ID)
						}
						if r.SecretGroup > 0 && !strings.Contains(out, c.pre) {
							t.Fatalf("%q: context lost: %q", s, out)
						}
						flushed := rep%2 == 0
						got := stream(t, set, []byte(in), randomSizes(rnd, len(in)), flushed)
						if !flushed && string(got) != out {
							t.Fatalf("streamed %q != whole %q", got, out)
						}
						if err := flushEquivalent(set, []byte(in), got); err != nil {
							t.Fatalf("streamed %q (whole %q): %v", got, out, err)
						}
						if strings.Contains(string(got), secretPastKeyword(r, m[0], secret)) {
							t.Fatalf("secret part of %q left in streamed output %q", s, got)
						}
					}
				}
				for _, tmpl := range r.Negative {
					s, err := ExpandSample(tmpl, rnd)
					if err != nil {
						t.Fatal(err)
					}
					for _, c := range contexts {
						in := c.pre + s + c.post
						if out := string(set.Redact([]byte(in))); out != in {
							t.Fatalf("negative sample changed: %q -> %q", in, out)
						}
						if got := string(stream(t, set, []byte(in), randomSizes(rnd, len(in)), false)); got != in {
							t.Fatalf("negative sample changed when streamed: %q -> %q", in, got)
						}
					}
				}
			}
		})
	}
}

func TestRuleFamiliesCovered(t *testing.T) {
	ids := map[string]bool{}
	for _, r := range loadRules(t) {
		ids[r.ID] = true
	}
	for _, id := range []string{"aws-access-key-id", "aws-secret-access-key", "github-token", "github-fine-grained-pat",
		"gitlab-token", "slack-token", "slack-webhook", "stripe-key", "npm-token", "pypi-token", "openai-anthropic-key",
		"google-api-key", "jwt", "private-key", "url-password", "generic-password"} {
		if !ids[id] {
			t.Errorf("rule %s missing", id)
		}
	}
}

// TestRuleFamilyCount: the rule file recognises at least 110 distinct token
// families (by shape, or for providers without one by their variable
// names; generic context rules, "context-*", do not count), and no rule
// claims more families than it has positive samples.
func TestRuleFamilyCount(t *testing.T) {
	const want = 110
	seen := map[string]bool{}
	shape, context := 0, 0
	for _, r := range loadRules(t) {
		if len(r.Positive) < len(r.Families) {
			t.Errorf("rule %s: %d families but %d positive samples", r.ID, len(r.Families), len(r.Positive))
		}
		for _, f := range r.Families {
			if seen[f] {
				t.Errorf("family %s listed twice", f)
			}
			seen[f] = true
			if strings.HasPrefix(f, "context-") {
				context++
			} else {
				shape++
			}
		}
	}
	t.Logf("%d token families (and %d generic context families)", shape, context)
	if shape < want {
		t.Fatalf("%d token families, want at least %d", shape, want)
	}
}

func TestLoadRulesStrict(t *testing.T) {
	ok := `rules:
  - id: x-token
    families: [x-token]
    keywords: [xtk_]
    regex: 'xtk_[a-z]{8}'
    max_len: 12
    positive: ['xtk_{lower:8}']
    negative: ['xtk_']
`
	if _, err := LoadRules([]byte(ok)); err != nil {
		t.Fatalf("valid file rejected: %v", err)
	}
	bad := map[string]string{
		"unknown key":     strings.Replace(ok, "max_len: 12", "max_len: 12\n    maxlen: 3", 1),
		"bad regexp":      strings.Replace(ok, "xtk_[a-z]{8}", "xtk_[a-z", 1),
		"short keyword":   strings.Replace(ok, "[xtk_]", "[xt]", 1),
		"no max_len":      strings.Replace(ok, "max_len: 12", "", 1),
		"group":           strings.Replace(ok, "max_len: 12", "max_len: 12\n    secret_group: 2", 1),
		"no negatives":    strings.Replace(ok, "negative: ['xtk_']", "", 1),
		"bad template":    strings.Replace(ok, "{lower:8}", "{nope:8}", 1),
		"bad id":          strings.Replace(ok, "x-token", "X Token", 1),
		"empty match":     strings.Replace(ok, "xtk_[a-z]{8}", "[a-z]*", 1),
		"duplicate id":    ok + strings.TrimPrefix(ok, "rules:\n"),
		"two documents":   ok + "---\nrules: []\n",
		"no rules at all": "rules: []\n",
		"no families":     strings.Replace(ok, "    families: [x-token]\n", "", 1),
		"empty families":  strings.Replace(ok, "[x-token]", "[]", 1),
		"bad family":      strings.Replace(ok, "families: [x-token]", "families: [X Token]", 1),
		"same family":     ok + strings.Replace(strings.TrimPrefix(ok, "rules:\n"), "id: x-token", "id: y-token", 1),
	}
	for name, y := range bad {
		if _, err := LoadRules([]byte(y)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestFastMatcherAgrees: rules on the fast path give exactly the regexp's
// submatches on many random windows built from their samples.
func TestFastMatcherAgrees(t *testing.T) {
	rnd := rand.New(rand.NewPCG(21, 22))
	var fast []string
	var st fastState
	for _, r := range loadRules(t) {
		cr, err := compileRule(r)
		if err != nil {
			t.Fatal(err)
		}
		if cr.fast == nil {
			continue
		}
		fast = append(fast, r.ID)
		chars := "aZ09_-./+:=@\"' \n\txX\xff\xc3\xa9" + strings.Join(r.Keywords, "")
		samples := append(append([]string(nil), r.Positive...), r.Negative...)
		for range 5000 {
			s, _ := ExpandSample(samples[rnd.IntN(len(samples))], rnd)
			for _, k := range r.Keywords {
				if i := strings.Index(strings.ToLower(s), strings.ToLower(k)); i >= 0 {
					s = s[i:]
					break
				}
			}
			b := []byte(s)
			for range rnd.IntN(4) { // mutate
				if len(b) > 0 {
					b[rnd.IntN(len(b))] = chars[rnd.IntN(len(chars))]
				}
			}
			if rnd.IntN(3) == 0 {
				b = b[:rnd.IntN(len(b)+1)]
			}
			b = append(b, randString(rnd, chars, rnd.IntN(6))...)
			if rnd.IntN(4) == 0 {
				b = []byte(strings.ToUpper(string(b)))
			}
			want := cr.re.FindSubmatchIndex(b)
			got, ok := cr.fast.match(&st, b, -1, nil)
			if !ok {
				continue
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s on %q: fast %v, regexp %v", r.ID, b, got, want)
			}
		}
	}
	t.Logf("fast path: %v", fast)
	if len(fast) < 12 {
		t.Fatalf("only %d rules on the fast path: %v", len(fast), fast)
	}
}

// secretPastKeyword is what must never be written out of a match of r:
// the secret group, or for group 0 the match past its keyword (Flush may
// have released a prefix of the keyword before the rest arrived).
func secretPastKeyword(r Rule, match, secret string) string {
	if r.SecretGroup > 0 {
		return secret
	}
	own := ""
	for _, k := range r.Keywords {
		if len(k) > len(own) && len(k) <= len(match) && strings.EqualFold(match[:len(k)], k) {
			own = k
		}
	}
	return match[len(own):]
}
