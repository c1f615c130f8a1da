package scrub

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// Write must always report the whole of p: io.Copy stops at a short write.
func TestWriteReportsFullLength(t *testing.T) {
	s := ruleSet(t)
	var out bytes.Buffer
	w := s.NewWriter(&out)
	if n, err := w.Write([]byte("-----BEGIN PRIVATE KEY-----\n")); n != 28 || err != nil {
		t.Fatalf("first write: %d %v", n, err)
	}
	big := bytes.Repeat([]byte("0123456789abcde\n"), 256) // 4 KiB while a key block is open
	if n, err := w.Write(big); n != len(big) || err != nil {
		t.Fatalf("big write: %d of %d, %v", n, len(big), err)
	}
	// Through io.Copy with small reads: nothing is dropped.
	in := "-----BEGIN PRIVATE KEY-----\n" + strings.Repeat("line\n", 1000) + "-----END PRIVATE KEY-----\nafter\n"
	out.Reset()
	w = s.NewWriter(&out)
	if _, err := io.Copy(w, iotest.HalfReader(strings.NewReader(in))); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if !strings.HasSuffix(out.String(), "after\n") || strings.Contains(out.String(), "line\n") {
		t.Fatalf("io.Copy output: %q", out.String()[:min(200, out.Len())])
	}
}
