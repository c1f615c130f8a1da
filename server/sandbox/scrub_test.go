package sandbox

import (
	"strings"
	"sync"
	"testing"

	"sandboxd/configs"
	"sandboxd/streams/scrub"
)

func TestRedact(t *testing.T) {
	secrets := map[string]string{"TOKEN": "s3cr3t-value", "SHORT": "abc", "API": "key-123456"}
	cases := []struct{ in, want string }{
		{"", ""},
		{"nothing here", "nothing here"},
		{"token=s3cr3t-value;", "token=[REDACTED:TOKEN];"},
		{"s3cr3t-values3cr3t-value", "[REDACTED:TOKEN][REDACTED:TOKEN]"},
		{"a key-123456 and s3cr3t-value", "a [REDACTED:API] and [REDACTED:TOKEN]"},
		// Values under scrub.MinValueLen are never replaced (they would redact ordinary text).
		{"abc abc", "abc abc"},
		// Fewer than k (scrub.KnownRun: 8 for a 12-byte value) characters of
		// a value are not redacted; k or more are.
		{"s3cr3t-", "s3cr3t-"},
		{"s3cr3t-valu", "[REDACTED:TOKEN]"},
	}
	for _, c := range cases {
		if got := redact(c.in, secrets); got != c.want {
			t.Errorf("redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := redact("s3cr3t-value", nil); got != "s3cr3t-value" {
		t.Errorf("redact with no secrets = %q", got)
	}
}

// TestRedactOverlapping: when one secret value contains another, the
// longer one wins whatever the map's order (a shorter one replaced first
// would leak the rest of the longer: "[REDACTED:SHORT]gh").
func TestRedactOverlapping(t *testing.T) {
	secrets := map[string]string{"LONG": "abcdefgh", "SHORT": "abcdef"}
	for range 20 { // map order varies: a wrong order shows within a few
		if got := redact("x abcdefgh y", secrets); got != "x [REDACTED:LONG] y" {
			t.Fatalf("overlapping secrets give %q", got)
		}
	}
}

// redact runs text through a session scrubber with these secrets and the
// built-in rules, as command output does.
func redact(in string, secrets map[string]string) string {
	return (&scrubbers{base: builtinRules()}).forSession("test", secrets).RedactString(in)
}

// builtinRules compiles configs/scrubber.yaml once.
var builtinRules = sync.OnceValue(func() *scrub.Set {
	b, err := configs.FS.ReadFile("scrubber.yaml")
	if err != nil {
		panic(err)
	}
	rules, err := scrub.LoadRules(b)
	if err != nil {
		panic(err)
	}
	base, err := scrub.NewSet(rules)
	if err != nil {
		panic(err)
	}
	return base
})

// redactAll runs every cached session's scrubber: each session's secrets
// are redacted, a value inside another session's longer value does not cut
// the longer one into pieces too short to redact, and a forgotten
// session's secrets are no longer known.
func TestRedactAllSessions(t *testing.T) {
	s := &scrubbers{base: builtinRules()}
	long := "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ" // 46 bytes
	s.forSession("a", map[string]string{"LONG": long})
	s.forSession("b", map[string]string{"MID": long[17:29]}) // 12 bytes inside it
	s.forSession("c", map[string]string{"OTHER": "c-secret-4711-zz"})
	s.forSession("d", nil)
	for range 20 { // map order varies
		got := string(s.redactAll([]byte("x " + long + " y c-secret-4711-zz z " + long[17:29] + " | token ghp_" + strings.Repeat("a", 36))))
		// MID alone is 12 bytes of LONG too: the longer goes first.
		want := "x [REDACTED:LONG] y [REDACTED:OTHER] z [REDACTED:LONG] | token [REDACTED:github-token]"
		if got != want {
			t.Fatalf("redactAll = %q, want %q", got, want)
		}
	}
	s.forget("c")
	if got := string(s.redactAll([]byte("c-secret-4711-zz"))); got != "c-secret-4711-zz" {
		t.Errorf("a forgotten session's secret is still redacted: %q", got)
	}
	s.forget("a")
	s.forget("b")
	if got := string(s.redactAll([]byte("ghp_" + strings.Repeat("a", 36)))); got != "[REDACTED:github-token]" {
		t.Errorf("with no secrets left, the rules still apply: %q", got)
	}
}
