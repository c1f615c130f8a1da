package scrub

import (
	"bytes"
	"testing"
)

// TestNotAfterStreamed: a not_after word released in earlier writes (one byte
// at a time) still keeps its keyword from matching.
func TestNotAfterStreamed(t *testing.T) {
	s := ruleSet(t)
	in := []byte("x io.jsonwebtoken:jjwt-api:jar:0.12.6:compile\n\"jsonwebtoken\": \"^9.0.3\"\n")
	for i := 1; i < len(in); i++ {
		var out bytes.Buffer
		w := s.NewWriter(&out)
		for _, c := range in[:i] {
			w.Write([]byte{c})
		}
		w.Write(in[i:])
		w.Close()
		if !bytes.Equal(out.Bytes(), in) {
			t.Fatalf("split %d: %q", i, out.String())
		}
	}
}
