package scrub

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// Rule is one pattern rule from configs/scrubber.yaml.
//
// The regexp is run anchored at an occurrence of one of the keywords, so the
// match must begin with a keyword (matched ASCII-case-insensitively by the
// prefilter; the regexp decides case). A leading \b is checked against the
// byte before the keyword. MaxLen bounds the match length: the regexp sees at
// most MaxLen+1 bytes from the keyword (one byte of lookahead for a trailing
// \b), and a writer holds a candidate back at most that long.
// SecretGroup selects the part to redact (0 = whole match). Families names
// the token families the rule recognises (a rule may cover several, such as
// GitLab's job, runner and deploy tokens); names are unique across a file,
// and generic context rules use names beginning "context-".
// Positive and Negative are sample templates: literal text with {class:n}
// placeholders expanded to n random characters of class (see sampleClasses).
type Rule struct {
	ID          string   `yaml:"id"`
	Description string   `yaml:"description"`
	Families    []string `yaml:"families"`
	Keywords    []string `yaml:"keywords"`
	Regex       string   `yaml:"regex"`
	SecretGroup int      `yaml:"secret_group"`
	MaxLen      int      `yaml:"max_len"`
	Positive    []string `yaml:"positive"`
	Negative    []string `yaml:"negative"`
	// NotAfter: the keyword is skipped when the bytes before it end with
	// one of these (ASCII case-insensitive): words that merely contain it
	// ("jsonweb" of io.jsonwebtoken:jjwt-api).
	NotAfter []string `yaml:"not_after"`
}

type ruleFile struct {
	Rules []Rule `yaml:"rules"`
}

// maxRuleLen bounds Rule.MaxLen and so the hold-back of a writer.
const maxRuleLen = 64 << 10

// LoadRules decodes a rule file strictly (unknown keys are errors), validates
// every rule (id, families, keywords, regexp, group, bound, sample templates;
// every rule needs positive and negative samples) and compiles the regexps.
func LoadRules(yamlBytes []byte) ([]Rule, error) {
	dec := yaml.NewDecoder(bytes.NewReader(yamlBytes))
	dec.KnownFields(true)
	var f ruleFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("decode scrubber rules: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("decode scrubber rules: more than one YAML document")
	}
	if len(f.Rules) == 0 {
		return nil, errors.New("scrubber rules: no rules")
	}
	seen := make(map[string]bool, len(f.Rules))
	family := make(map[string]string)
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, r := range f.Rules {
		if _, err := compileRule(r); err != nil {
			return nil, err
		}
		if seen[r.ID] {
			return nil, fmt.Errorf("scrubber rule %q: duplicate id", r.ID)
		}
		seen[r.ID] = true
		if len(r.Families) == 0 {
			return nil, fmt.Errorf("scrubber rule %q: no families", r.ID)
		}
		for _, fam := range r.Families {
			if !ruleIDRe.MatchString(fam) {
				return nil, fmt.Errorf("scrubber rule %q: family %q must match %s", r.ID, fam, ruleIDRe)
			}
			if other, dup := family[fam]; dup {
				return nil, fmt.Errorf("scrubber rule %q: family %q already listed by rule %q", r.ID, fam, other)
			}
			family[fam] = r.ID
		}
		if len(r.Positive) == 0 || len(r.Negative) == 0 {
			return nil, fmt.Errorf("scrubber rule %q: needs positive and negative samples", r.ID)
		}
		for _, t := range append(append([]string(nil), r.Positive...), r.Negative...) {
			if _, err := ExpandSample(t, rnd); err != nil {
				return nil, fmt.Errorf("scrubber rule %q: %w", r.ID, err)
			}
		}
	}
	return f.Rules, nil
}

// crule is a compiled rule.
type crule struct {
	src    Rule
	lb     syntax.EmptyOp // leading \b or \B, checked by hand (0 = none)
	re     *regexp.Regexp // \A-anchored, leading assertion stripped
	live   *liveProg      // same program, for "can more input still match?"
	window int            // MaxLen + 1
	bytes  byteSet        // every byte a match can contain
	class  int            // index of bytes among the Set's distinct byte sets
	fast   *fastRule      // non-nil: matched without regexp
	lab    *label
}

// byteSet is a set of bytes.
type byteSet [4]uint64

func (b *byteSet) has(c byte) bool { return b[c>>6]&(1<<(c&63)) != 0 }
func (b *byteSet) add(c byte)      { b[c>>6] |= 1 << (c & 63) }

// progBytes returns the bytes any rune instruction of prog can consume
// (all bytes >= 0x80 if it can consume any non-ASCII rune).
func progBytes(prog *syntax.Prog) byteSet {
	var set byteSet
	for i := range prog.Inst {
		inst := &prog.Inst[i]
		switch inst.Op {
		case syntax.InstRuneAny, syntax.InstRuneAnyNotNL:
			for c := 0; c < 256; c++ {
				set.add(byte(c))
			}
		case syntax.InstRune, syntax.InstRune1:
			for c := 0; c < 0x80; c++ {
				if inst.MatchRune(rune(c)) {
					set.add(byte(c))
				}
			}
			// Case folding reaches non-ASCII runes (k -> U+212A).
			nonASCII := syntax.Flags(inst.Arg)&syntax.FoldCase != 0 || inst.MatchRune(utf8.RuneError)
			for _, r := range inst.Rune {
				nonASCII = nonASCII || r >= 0x80
			}
			if nonASCII {
				for c := 0x80; c < 256; c++ {
					set.add(byte(c))
				}
			}
		}
	}
	return set
}

var ruleIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

func compileRule(r Rule) (*crule, error) {
	if !ruleIDRe.MatchString(r.ID) {
		return nil, fmt.Errorf("scrubber rule %q: id must match %s", r.ID, ruleIDRe)
	}
	errf := func(format string, a ...any) error {
		return fmt.Errorf("scrubber rule %q: "+format, append([]any{r.ID}, a...)...)
	}
	if len(r.Keywords) == 0 {
		return nil, errf("no keywords")
	}
	for _, k := range r.Keywords {
		if len(k) < 3 || len(k) > 64 {
			return nil, errf("keyword %q: length must be 3..64 bytes", k)
		}
		for i := 0; i < len(k); i++ {
			// a space may follow the first byte ("-u "): a keyword of
			// three bytes that a blank ends
			if (k[i] < 0x21 || k[i] > 0x7e) && (i == 0 || k[i] != ' ') {
				return nil, errf("keyword %q: printable ASCII only (a space after the first byte)", k)
			}
		}
	}
	if r.MaxLen <= 0 || r.MaxLen > maxRuleLen {
		return nil, errf("max_len must be 1..%d", maxRuleLen)
	}
	ast, err := syntax.Parse(r.Regex, syntax.Perl)
	if err != nil {
		return nil, errf("regex: %w", err)
	}
	var lb syntax.EmptyOp
	if ast.Op == syntax.OpConcat && len(ast.Sub) > 1 {
		switch ast.Sub[0].Op {
		case syntax.OpWordBoundary:
			lb = syntax.EmptyWordBoundary
		case syntax.OpNoWordBoundary:
			lb = syntax.EmptyNoWordBoundary
		}
		if lb != 0 {
			ast.Sub = ast.Sub[1:]
		}
	}
	if r.SecretGroup < 0 || r.SecretGroup > ast.MaxCap() {
		return nil, errf("secret_group %d: regex has %d groups", r.SecretGroup, ast.MaxCap())
	}
	re, err := regexp.Compile(`\A(?:` + ast.String() + `)`)
	if err != nil {
		return nil, errf("regex: %w", err)
	}
	if re.MatchString("") {
		return nil, errf("regex matches the empty string")
	}
	prog, err := syntax.Compile(ast.Simplify())
	if err != nil {
		return nil, errf("regex: %w", err)
	}
	return &crule{src: r, lb: lb, re: re, live: newLiveProg(prog), window: r.MaxLen + 1,
		bytes: progBytes(prog), fast: compileFast(ast)}, nil
}

// sampleClasses are the character classes of sample templates.
var sampleClasses = map[string]string{
	"alnum":   "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
	"alpha":   "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
	"upper":   "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
	"lower":   "abcdefghijklmnopqrstuvwxyz",
	"digits":  "0123456789",
	"hex":     "0123456789abcdef",
	"hexup":   "0123456789ABCDEF",
	"upalnum": "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
	"word":    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_",
	"b64":     "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
	"b64url":  "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
}

var placeholderRe = regexp.MustCompile(`\{([A-Za-z0-9]+):([0-9]+)\}`)

// ExpandSample expands a sample template: each {class:n} becomes n random
// characters of class (alnum, alpha, upper, lower, digits, hex, hexup,
// upalnum, word, b64, b64url); other text is kept as is. Samples in the
// rule file are templates so that no real-looking secret is checked in.
func ExpandSample(tmpl string, rnd *rand.Rand) (string, error) {
	var b strings.Builder
	last := 0
	for _, m := range placeholderRe.FindAllStringSubmatchIndex(tmpl, -1) {
		class, ok := sampleClasses[tmpl[m[2]:m[3]]]
		if !ok {
			return "", fmt.Errorf("sample %q: unknown class %q", tmpl, tmpl[m[2]:m[3]])
		}
		n, err := strconv.Atoi(tmpl[m[4]:m[5]])
		if err != nil || n > maxRuleLen {
			return "", fmt.Errorf("sample %q: bad count", tmpl)
		}
		b.WriteString(tmpl[last:m[0]])
		for range n {
			b.WriteByte(class[rnd.IntN(len(class))])
		}
		last = m[1]
	}
	b.WriteString(tmpl[last:])
	return b.String(), nil
}

// followBytes returns the bytes that may follow keyword kw (as spelled in
// the rule, and in lower and upper case) in a match or a match still open.
func (r *crule) followBytes(kw string) byteSet {
	var f byteSet
	var sc nfaScratch
	for _, k := range []string{kw, strings.ToLower(kw), strings.ToUpper(kw)} {
		in := []byte(k + "x")
		for c := 0; c < 256; c++ {
			in[len(k)] = byte(c)
			if alive, matched := r.live.run(&sc, in, -1, false); alive || matched {
				f.add(byte(c))
			}
		}
	}
	f.add(0x1b) // a colour code between the keyword and the rest (evalStripped)
	return f
}
