package scrub

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// regionsOf scans in whole (final) and returns the redacted byte ranges
// as a bitmap; exhaustive: evaluate every keyword in full (the reference
// without deadEnd, floodCover and resume).
func regionsOf(s *Set, in []byte, exhaustive bool) []bool {
	sc := scratch{exhaustive: exhaustive}
	s.scan(&sc, in, -1, true, false)
	red := make([]bool, len(in))
	for _, r := range sc.regs {
		for k := r.start; k < r.end; k++ {
			red[k] = true
		}
	}
	return red
}

// checkAgainstReference: the scrubber redacts exactly what evaluating
// every keyword in full redacts (or, if conservative, at least that).
func checkAgainstReference(t *testing.T, s *Set, in []byte, exact bool) {
	t.Helper()
	ref, got := regionsOf(s, in, true), regionsOf(s, in, false)
	for k := range in {
		if ref[k] && !got[k] {
			t.Fatalf("byte %d (%q) redacted by the reference but not by the scrubber\nin: %s", k, in[max(0, k-20):min(len(in), k+20)], brief(in))
		}
		if exact && got[k] && !ref[k] {
			t.Fatalf("byte %d (%q) redacted by the scrubber, not by the reference\nin: %s", k, in[max(0, k-20):min(len(in), k+20)], brief(in))
		}
	}
}

// floodUnits are the repeated units of keyword floods: every keyword with
// nothing, separators or a value after it.
func floodUnits(rules []Rule) []string {
	seen := map[string]bool{}
	var units []string
	for _, r := range rules {
		for _, k := range r.Keywords {
			for _, suf := range []string{"", " ", "\n", ":", "=", ": ", "=v4lue ", "abc123XYZabc123XYZ", ": Bearer ", ">", "\x1b[0m", "\x1b[1m "} {
				if u := k + suf; !seen[u] {
					seen[u] = true
					units = append(units, u)
				}
			}
		}
	}
	return units
}

// TestKeywordFloodsLinear (issue 15): a sandbox user can print floods of a
// rule's keywords; the scrubber's time must stay linear in them. Before
// the fix `token:` repeated took about 7 s of CPU per MiB, and a keyword
// repeated up to a newline ("eyJ" x 2666, "token>" x 1333) about as much.
// Each shape: 256 KiB (32 KiB with the race detector) in one write and in
// 4 KiB writes, the same output.
func TestKeywordFloodsLinear(t *testing.T) {
	s, _, _ := fuzzSetup(t)
	limit, size := 1500*time.Millisecond, 256<<10
	if raceEnabled {
		limit, size = 10*limit, 32<<10
	}
	shapes := []string{"token:", "token: \n", "password=", "Authorization: Bearer ", "Cookie: ", "secret ",
		"auth-key ", "MISTRAL_API_KEY:", "token: abc123XYZ ", "eyJ", "-----BEGIN ", "token>\x1b[0m", "eyJ\x1b[1m"}
	for _, run := range []struct {
		kw  string
		n   int
		end string
	}{{"eyJ", 2666, "\n"}, {"token>", 1333, "\n"}, {"ATATT3", 160, "\n"}, {"ops_eyJ", 1000, "\n"},
		{"password>", 900, "\n"}, {"eyJ", 2666, "\x1b[0m\n"}, {"token>\x1b[0m", 300, "\n"}} {
		shapes = append(shapes, strings.Repeat(run.kw, run.n)+run.end)
	}
	// PEM-like blocks that never end: the private-key rules read each to
	// the next BEGIN (a counted repeat in a star made that 1,000 threads
	// per byte).
	b64 := strings.Repeat("QUJDRA", 300)
	shapes = append(shapes, "-----BEGIN RSA PRIVATE KEY-----\n"+b64+"\n", `-----BEGIN RSA PRIVATE KEY-----\n`+b64+`\n`,
		"-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"+b64+"\n")
	for _, p := range shapes {
		in := bytes.Repeat([]byte(p), size/len(p)+1)[:size]
		st := time.Now()
		whole := s.Redact(in)
		d1 := time.Since(st)
		st = time.Now()
		got := stream(t, s, in, []int{4096}, false)
		d2 := time.Since(st)
		if d1 > limit || d2 > limit {
			t.Errorf("%.40q...: whole %v, in 4 KiB writes %v (limit %v)", p, d1, d2, limit)
		}
		if !bytes.Equal(got, whole) {
			t.Errorf("%.40q...: streamed != whole", p)
		}
	}
}

// TestEveryKeywordFlood: every keyword of the rule file repeated (alone,
// with separators, values or colour codes) is scrubbed exactly as
// evaluating each keyword in full would, in bounded time, and streamed in
// small writes the same as whole.
func TestEveryKeywordFlood(t *testing.T) {
	s, _, rules := fuzzSetup(t)
	units := floodUnits(rules)
	size, step := 4<<10, 1
	if testing.Short() || raceEnabled {
		size, step = 2<<10, 7
	}
	st := time.Now()
	rnd := rand.New(rand.NewPCG(7, 8))
	for k := 0; k < len(units); k += step {
		u := units[k]
		in := bytes.Repeat([]byte(u), size/len(u)+1)[:size]
		checkAgainstReference(t, s, in, true)
		whole := s.Redact(in)
		if got := stream(t, s, in, randomSizes(rnd, len(in)), false); !bytes.Equal(got, whole) {
			t.Fatalf("%q: streamed != whole", u)
		}
	}
	t.Logf("%d shapes of %d bytes in %v", (len(units)+step-1)/step, size, time.Since(st))
}

// TestFloodsAgainstReference: random mixes of keywords, separators,
// values, colour codes and real secrets are scrubbed exactly as evaluating
// each keyword in full would; streamed in random writes the same as whole.
func TestFloodsAgainstReference(t *testing.T) {
	s, values, rules := fuzzSetup(t)
	names := slices.Sorted(maps.Keys(values))
	seed := uint64(9)
	if e := os.Getenv("SCRUB_FLOOD_SEED"); e != "" {
		seed, _ = strconv.ParseUint(e, 10, 64)
	}
	rnd := rand.New(rand.NewPCG(seed, 10))
	var kws []string
	for _, r := range rules {
		kws = append(kws, r.Keywords...)
	}
	seps := []string{" ", ":", "=", ": ", "\n", "\t", "<", "</", ".", "\x1b[0m", "\x1b[31m", `"`, "'", "é", "\xff", "-", "_", "/", "\r\n", "$"}
	iters := 300
	if testing.Short() || raceEnabled {
		iters = 60
	}
	for it := range iters {
		var b strings.Builder
		// a few favourite pieces per input make floods
		favs := []string{kws[rnd.IntN(len(kws))], kws[rnd.IntN(len(kws))], seps[rnd.IntN(len(seps))]}
		size := 1 << (10 + rnd.IntN(5))
		for b.Len() < size {
			switch x := rnd.IntN(20); {
			case x < 8:
				b.WriteString(favs[rnd.IntN(len(favs))])
			case x < 11:
				k := kws[rnd.IntN(len(kws))]
				if rnd.IntN(2) == 0 {
					k = strings.ToUpper(k)
				}
				b.WriteString(k)
			case x < 15:
				b.WriteString(seps[rnd.IntN(len(seps))])
			case x < 18:
				b.WriteString(randString(rnd, alnum+"+/-_.", 1+rnd.IntN(60)))
			case x < 19:
				r := rules[rnd.IntN(len(rules))]
				smp, err := ExpandSample(r.Positive[rnd.IntN(len(r.Positive))], rnd)
				if err != nil {
					t.Fatal(err)
				}
				b.WriteString(smp)
			default:
				b.WriteString(values[names[rnd.IntN(len(names))]])
			}
		}
		in := []byte(b.String())
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			checkAgainstReference(t, s, in, true)
			whole := s.Redact(in)
			if got := stream(t, s, in, randomSizes(rnd, len(in)), false); !bytes.Equal(got, whole) {
				t.Fatalf("streamed != whole\nin:     %s\nstream: %s\nwhole:  %s", brief(in), brief(got), brief(whole))
			}
		})
	}
}

// TestFloodSecretRedacted: a real secret among a flood of keywords is
// redacted, in one write and split into two writes at every point (every
// third with the race detector).
func TestFloodSecretRedacted(t *testing.T) {
	const v = "Zq9vX2pLmN4t" // a known value (fuzzSetup's "db")
	s, _, _ := fuzzSetup(t)
	flood, stride := 600, 1
	if raceEnabled {
		flood, stride = 300, 3
	}
	gh := "ghp_" + strings.Repeat("aB3", 12)
	jwt := "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlX2hlcmU"
	for _, tc := range []struct {
		name, flood, secret, text string
	}{
		{"token: and password=", "token:", "hunter2hunter2", " password=hunter2hunter2 "},
		{"yes token: and a token", "token: \n", "s3cr3tT0k3nValue", "token: s3cr3tT0k3nValue\n"},
		{"password= run", "password=", "Pa55w0rdValue", "\npassword=Pa55w0rdValue\n"},
		// (without the newline, "Authorization: Bearer Authorization:" of
		// the flood may take the secret's header as its value)
		{"bearer", "Authorization: Bearer ", "dGhpc2lzYXRva2Vu", "\nAuthorization: Bearer dGhpc2lzYXRva2Vu\n"},
		{"eyJ run and a JWT", "eyJ", jwt[20:], "\n" + jwt + "\n"},
		{"eyJ run into a JWT", "eyJ", jwt[20:], jwt},
		{"token> run and an element", "token>", "el3mentS3cret", "<token>el3mentS3cret</token>"},
		{"token> run into an element end", "token>", "el3mentS3cret", "el3mentS3cret</token>"},
		{"github token among keywords", "ghp_", gh[4:], " " + gh + " "},
		{"known value among keywords", "secret ", v, v},
		{"known value in a run", "eyJ", v, v},
		{"coloured keywords", "token>\x1b[0m", "c0l0uredS3cret", "\ntoken: c0l0uredS3cret\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre := strings.Repeat(tc.flood, flood/len(tc.flood))
			in := []byte(pre + tc.text + pre)
			if out := s.Redact(in); bytes.Contains(out, []byte(tc.secret)) {
				t.Fatalf("secret shows: %s", brief(out))
			}
			checkAgainstReference(t, s, in, true)
			whole := s.Redact(in)
			for p := 0; p <= len(in); p += stride {
				got := stream(t, s, in, []int{p, len(in)}, false)
				if !bytes.Equal(got, whole) {
					t.Fatalf("split at %d: %s\nwhole: %s", p, brief(got), brief(whole))
				}
			}
		})
	}
}

// TestFloodLaterKeywordMatches: in a flood where a later keyword matches
// although the first does not (the parity of an odd-length keyword's run),
// floodCover skips only the keywords before it: the match is redacted as
// evaluating each keyword would redact it.
func TestFloodLaterKeywordMatches(t *testing.T) {
	s, err := NewSet([]Rule{{ID: "pairs", Families: []string{"pairs"}, Keywords: []string{"kwx"},
		Regex: `kwx(?:[a-z][a-z])*([A-Z])`, SecretGroup: 1, MaxLen: 4096,
		Positive: []string{"kwxabY"}, Negative: []string{"kwxaY"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{100, 101} {
		in := []byte("ok " + strings.Repeat("kwx", n) + "Y tail\n")
		checkAgainstReference(t, s, in, true)
		out := s.Redact(in)
		if bytes.Contains(out, []byte("Y tail")) || !bytes.HasPrefix(out, []byte("ok kwx")) || !bytes.HasSuffix(out, []byte(" tail\n")) {
			t.Errorf("n=%d: %s", n, out)
		}
		for p := 0; p <= len(in); p++ {
			if got := stream(t, s, in, []int{p, len(in)}, false); !bytes.Equal(got, out) {
				t.Fatalf("n=%d, split at %d: %s != %s", n, p, got, out)
			}
		}
	}
}
