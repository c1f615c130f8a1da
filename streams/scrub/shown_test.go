package scrub

import (
	"strings"
	"testing"
)

// Values that show fewer than MinValueLen characters are refused; those
// that show enough are redacted when printed as they are.
func TestShownValues(t *testing.T) {
	for _, c := range []struct {
		v     string
		shown int
	}{
		{"      ", 0},
		{"\t \r\n \t", 0},
		{"\x1b[31mred\x1b[0m", 3},
		{"\x1b[31mredgreen\x1b[0m", 8},
		{"ab\u200bcd\u00a0ef", 6},
		{"abcdeX\bf", 6},
		{"ａｂｃｄｅｆ", 6}, // fullwidth: read as ASCII
		{"ｂｃ", 2},
		{"pässwörd", 10}, // other UTF-8: each byte
		{"hunter2!", 8},
		{"\x00\x01\x02\x03\x04\x05\x06", 0},
	} {
		if got := Shown(c.v); got != c.shown {
			t.Errorf("Shown(%q) = %d, want %d", c.v, got, c.shown)
		}
		set, err := budgetSet(t).WithValues(map[string]string{"V": c.v})
		switch {
		case c.shown < MinValueLen && err == nil:
			t.Errorf("%q (shows %d) accepted", c.v, c.shown)
		case c.shown >= MinValueLen && err != nil:
			t.Errorf("%q refused: %v", c.v, err)
		case c.shown >= MinValueLen && !strings.Contains(set.RedactString("x "+c.v+" y"), "[REDACTED:V]"):
			t.Errorf("%q printed as it is is not redacted: %q", c.v, set.RedactString("x "+c.v+" y"))
		}
	}
}
