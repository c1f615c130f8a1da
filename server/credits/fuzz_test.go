package credits

import (
	"math/big"
	"strings"
	"testing"
)

// FuzzParseMilli: an amount ParseMilli accepts is a decimal number (an
// optional '-', digits, at most three after the point) whose value times
// 1000 is the result exactly (big.Rat as the oracle), and its String
// parses back to it; ParseGrant accepts exactly the nonzero ones within
// MaxGrant either way. (An operator's credit grant arrives as a JSON
// number: server's grantCredits.)
func FuzzParseMilli(f *testing.F) {
	for _, s := range []string{
		"1", "0.5", "12.125", "-0.001", ".5", "-.5", "5.", "1.2345", "1e3", "+1", "--1", " 7 ", "0x10", "-",
		"", "9223372036854775", "9223372036854774", "1000000", "1000000.001", "-1000000", "0", "-0", "0.000", "١",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMilli(s)
		g, gerr := ParseGrant(s)
		if err != nil {
			if gerr == nil {
				t.Fatalf("ParseGrant(%q) = %v, ParseMilli refused it", s, g)
			}
			return
		}
		num := strings.TrimSpace(s)
		body := strings.TrimPrefix(num, "-")
		whole, frac, _ := strings.Cut(body, ".")
		if whole+frac == "" || strings.Trim(whole+frac, "0123456789") != "" || len(frac) > 3 {
			t.Fatalf("ParseMilli accepted %q", s)
		}
		r, ok := new(big.Rat).SetString(num)
		if !ok {
			t.Fatalf("%q is no number", num)
		}
		if want := r.Mul(r, big.NewRat(1000, 1)); !want.IsInt() || want.Num().Int64() != int64(m) || !want.Num().IsInt64() {
			t.Fatalf("ParseMilli(%q) = %d, want %s", s, m, want)
		}
		if again, err := ParseMilli(m.String()); err != nil || again != m {
			t.Fatalf("%d formats as %q, which parses to %d, %v", m, m.String(), again, err)
		}
		if wantGrant := m != 0 && m <= MaxGrant && m >= -MaxGrant; (gerr == nil) != wantGrant || gerr == nil && g != m {
			t.Fatalf("ParseGrant(%q) = %d, %v", s, g, gerr)
		}
	})
}
