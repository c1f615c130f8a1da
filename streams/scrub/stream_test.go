package scrub

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestSecretAtEndOfStream(t *testing.T) {
	s := withValues(t, ruleSet(t), map[string]string{"v": "Zq9vX2pLmN4t"})
	rnd := rand.New(rand.NewPCG(5, 6))
	tok := "ghp_" + randString(rnd, "abcdefghijklmnopqrstuvwxyz0123456789", 36)
	for _, in := range []string{"out: Zq9vX2pLmN4t", "out: " + tok, "password=" + "hunter22x", tok} {
		whole := string(s.Redact([]byte(in)))
		if strings.Contains(whole, "Zq9vX2pLmN4t") || strings.Contains(whole, tok) || strings.Contains(whole, "hunter22x") {
			t.Fatalf("%q -> %q", in, whole)
		}
		for _, sizes := range [][]int{{1}, {2}, {len(in) - 1}, {len(in)}} {
			if got := string(stream(t, s, []byte(in), sizes, true)); got != whole {
				t.Fatalf("%q sizes %v: %q != %q", in, sizes, got, whole)
			}
		}
	}
}

// TestStraddlingHoldBack: candidates that span many writes up to and past
// their rule's window: a 10 KB PEM block (private-key window 16 KB), a
// JWT near its bound, and a private key block that never ends (fail
// closed at MaxLen, memory bounded).
func TestStraddlingHoldBack(t *testing.T) {
	s := ruleSet(t)
	rnd := rand.New(rand.NewPCG(9, 9))
	b64 := "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	var body []string
	for range 150 {
		body = append(body, randString(rnd, b64, 64))
	}
	pemBlock := "-----BEGIN RSA PRIVATE KEY-----\n" + strings.Join(body, "\n") + "\n-----END RSA PRIVATE KEY-----"
	in := "before\n" + pemBlock + "\nafter\n"
	for _, sizes := range [][]int{{4096}, {1000, 3}, {16385}} {
		out := string(stream(t, s, []byte(in), sizes, false))
		if out != "before\n[REDACTED:private-key]\nafter\n" {
			t.Fatalf("pem sizes %v: %.200q", sizes, out)
		}
	}
	jwt := "eyJ" + randString(rnd, "abcdefghijklmnopqrstuvwxyz", 30) + ".eyJ" + randString(rnd, "abcdef", 8000) + ".sig"
	if out := string(stream(t, s, []byte("a "+jwt+" b"), []int{512}, false)); out != "a [REDACTED:jwt] b" {
		t.Fatalf("jwt: %.200q", out)
	}
	// A never-ending candidate: redacted up to MaxLen, hold-back bounded.
	var out bytes.Buffer
	w := s.NewWriter(&out)
	w.Write([]byte("-----BEGIN RSA PRIVATE KEY-----\n"))
	total := 32
	for range 400 {
		total += 65
		w.Write([]byte(randString(rnd, b64, 64) + "\n"))
		if len(w.buf) > (16384+64)*5/4+65 { // rescans every quarter of growth
			t.Fatalf("hold-back %d exceeds the rule bound", len(w.buf))
		}
	}
	w.Close()
	if !strings.HasPrefix(out.String(), "[REDACTED:private-key]") || out.Len() > total-16384+30 {
		t.Fatalf("fail-closed output: len %d %.80q", out.Len(), out.String())
	}
}

// TestPassThrough: invalid UTF-8, terminal escapes, \r progress bars and
// NUL bytes pass unchanged and in order, whatever the write sizes.
func TestPassThrough(t *testing.T) {
	s := withValues(t, ruleSet(t), map[string]string{"v": "Zq9vX2pLmN4t", "w": "another-secret-value"})
	var b strings.Builder
	for i := range 200 {
		b.WriteString("\x1b[2K\r[")
		b.WriteString(strings.Repeat("=", i%50))
		b.WriteString(">] \x1b[1;33m")
		b.WriteString(strings.Repeat(" ", 50-i%50))
		b.WriteString("\x1b[0m 12%\xff\xfe\xc3\x28 \xe2\x82 \x00 Zq9vX2pLmN")
		b.WriteString(" ghp_short sk- AKIA eyJ -----BEGIN PUBLIC KEY----- password: *** postgres://db/x\n")
	}
	in := b.String()
	rnd := rand.New(rand.NewPCG(1, 1))
	if out := string(s.Redact([]byte(in))); out != in {
		t.Fatal("whole: clean text changed")
	}
	for range 20 {
		if out := string(stream(t, s, []byte(in), randomSizes(rnd, len(in)), true)); out != in {
			t.Fatal("streamed: clean text changed")
		}
	}
}

// TestFlush: Flush releases ordinary text but never a prefix that could
// still complete a secret.
func TestFlush(t *testing.T) {
	s := withValues(t, ruleSet(t), map[string]string{"v": "Zq9vX2pLmN4t"})
	for _, tc := range []struct{ in, released string }{
		{"hello world\n", "hello world\n"},
		{"make: done.", "make: done."},
		{"$ ls\r\n", "$ ls\r\n"},
		{"token ghp_abc", "token "},
		{"id AKI", "id "},
		{"x Zq9vX2", "x "},
		{"pw: passw", "pw: "},
		{"password=hunter", "password=hunter"[:0]},
		{"-----BEGIN RSA PRIVATE KEY-----\nMIIE", ""},
		{"-----BEGIN CERTIFICATE-----\nMIIE\n", "-----BEGIN CERTIFICATE-----\nMIIE\n"},
	} {
		var out bytes.Buffer
		w := s.NewWriter(&out)
		w.Write([]byte(tc.in))
		w.Flush()
		if out.String() != tc.released {
			t.Errorf("%q: flushed %q, want %q", tc.in, out.String(), tc.released)
		}
		w.Close()
		if !strings.HasPrefix(out.String(), tc.released) {
			t.Errorf("%q: close lost order: %q", tc.in, out.String())
		}
	}
}

// TestFlushReleasesDeadCandidate: Write rescans a long held candidate only
// every quarter of growth; Flush decides at once.
func TestFlushReleasesDeadCandidate(t *testing.T) {
	s := ruleSet(t)
	var out bytes.Buffer
	w := s.NewWriter(&out)
	long := "eyJ" + strings.Repeat("a", 3000)
	w.Write([]byte(long))
	w.Write([]byte(" ")) // the candidate is dead now (no ".eyJ")
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if out.String() != long+" " {
		t.Fatalf("flush released %d of %d bytes", out.Len(), len(long)+1)
	}
}

// TestTinyWritesLinear: 1-byte writes through an open private key block
// stay cheap (amortized rescans).
func TestTinyWritesLinear(t *testing.T) {
	s := ruleSet(t)
	in := []byte("-----BEGIN RSA PRIVATE KEY-----\n" + strings.Repeat("abcdefgh", 8000))
	out := stream(t, s, in, []int{1}, false)
	if !bytes.HasPrefix(out, []byte("[REDACTED:private-key]")) {
		t.Fatalf("%.60q", out)
	}
}

// TestStreamEqualsWhole: over realistic mixed output with secrets, any
// split gives exactly Redact of the whole.
func TestStreamEqualsWhole(t *testing.T) {
	rnd := rand.New(rand.NewPCG(11, 12))
	s, values := benchSet(t, rnd)
	data := denseCorpus(rnd, values, 200<<10)
	whole := s.Redact(data)
	for _, v := range values[:20] {
		if bytes.Contains(whole, []byte(v)) {
			t.Fatal("value left in output")
		}
	}
	for range 5 {
		if got := stream(t, s, data, randomSizes(rnd, len(data)), false); !bytes.Equal(got, whole) {
			t.Fatal("streamed output differs from whole-buffer output")
		}
	}
}
