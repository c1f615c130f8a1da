package credits

import (
	"testing"
	"time"
)

func TestParseMilli(t *testing.T) {
	good := map[string]Milli{"0": 0, "1": 1000, "0.5": 500, "12.125": 12125, ".25": 250, "-2.5": -2500, "3000": 3_000_000, "0.001": 1}
	for in, want := range good {
		if got, err := ParseMilli(in); err != nil || got != want {
			t.Errorf("ParseMilli(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0.0001", "1e3", "abc", "1.", "-", ".", "1.2.3", "99999999999999999999", ".nan", "+1"} {
		if _, err := ParseMilli(in); err == nil {
			t.Errorf("ParseMilli(%q): no error", in)
		}
	}
	for in, want := range map[Milli]string{0: "0", 1000: "1", 1500: "1.5", 1: "0.001", -2500: "-2.5", 12125: "12.125"} {
		if got := in.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", in, got, want)
		}
	}
}

func TestCharge(t *testing.T) {
	cases := []struct {
		rate Milli
		d    time.Duration
		want Milli
	}{
		{1000, time.Hour, 1000},
		{1000, 90 * time.Minute, 1500},
		{4000, 45 * time.Second, 50},
		{1000, 3599 * time.Millisecond, 0}, // under a milli-credit rounds down
		{1000, 3600 * time.Millisecond, 1},
		{16000, 24 * time.Hour, 384000},
		{MaxRate, 24 * time.Hour, MaxRate * 24}, // the largest rate over a day fits
		{1000, -time.Minute, 0},                 // clock went backwards
		{0, time.Hour, 0},
	}
	for _, c := range cases {
		if got := Charge(c.rate, c.d); got != c.want {
			t.Errorf("Charge(%d, %v) = %d, want %d", c.rate, c.d, got, c.want)
		}
	}
	if got := MinSlice(1000, 300); got != 84 { // 83.33 rounded up
		t.Errorf("MinSlice = %d", got)
	}
	if MinSlice(0, 300) != 0 || MinSlice(1000, 0) != 0 {
		t.Error("MinSlice of nothing")
	}
}

func date(y int, m time.Month, d, h int) time.Time { return time.Date(y, m, d, h, 0, 0, 0, time.UTC) }

func TestPeriodAt(t *testing.T) {
	cases := []struct {
		anchor     int
		at         time.Time
		start, end time.Time
	}{
		{1, date(2026, 12, 1, 0), date(2026, 12, 1, 0), date(2027, 1, 1, 0)},
		{1, date(2026, 12, 31, 23), date(2026, 12, 1, 0), date(2027, 1, 1, 0)},
		{15, date(2026, 12, 14, 23), date(2026, 11, 15, 0), date(2026, 12, 15, 0)},
		{15, date(2026, 12, 15, 0), date(2026, 12, 15, 0), date(2027, 1, 15, 0)},
		// Anchors past a month's end start on its last day.
		{31, date(2027, 2, 27, 12), date(2027, 1, 31, 0), date(2027, 2, 28, 0)},
		{31, date(2027, 2, 28, 0), date(2027, 2, 28, 0), date(2027, 3, 31, 0)},
		{30, date(2028, 2, 29, 5), date(2028, 2, 29, 0), date(2028, 3, 30, 0)}, // leap year
		{31, date(2026, 4, 30, 1), date(2026, 4, 30, 0), date(2026, 5, 31, 0)},
		// Year boundary, and the anchor clamped.
		{10, date(2027, 1, 3, 0), date(2026, 12, 10, 0), date(2027, 1, 10, 0)},
		{0, date(2027, 1, 3, 0), date(2027, 1, 1, 0), date(2027, 2, 1, 0)},
		{99, date(2027, 1, 3, 0), date(2026, 12, 31, 0), date(2027, 1, 31, 0)},
	}
	for _, c := range cases {
		p := PeriodAt(c.anchor, c.at)
		if !p.Start.Equal(c.start) || !p.End.Equal(c.end) || !p.Contains(c.at) {
			t.Errorf("PeriodAt(%d, %v) = [%v, %v), want [%v, %v)", c.anchor, c.at, p.Start, p.End, c.start, c.end)
		}
		// Consecutive periods tile time.
		if prev := p.Previous(c.anchor); !prev.End.Equal(p.Start) {
			t.Errorf("Previous of %v ends %v", p.Start, prev.End)
		}
	}
	// A nanosecond before a boundary is the earlier period.
	p := PeriodAt(15, date(2026, 12, 15, 0).Add(-time.Nanosecond))
	if !p.End.Equal(date(2026, 12, 15, 0)) {
		t.Errorf("boundary: %v", p)
	}
}

func TestSummarize(t *testing.T) {
	d0 := date(2026, 12, 14, 22)
	runs := []Run{
		// Crosses midnight and the period boundary (Dec 15).
		{SessionPK: "a", SessionID: "A", Size: "standard-1", Rate: 1000, Start: d0, End: d0.Add(4 * time.Hour)},
		// A second run of A after a pause, at its rate.
		{SessionPK: "a", SessionID: "A", Size: "standard-1", Rate: 1000, Start: d0.Add(5 * time.Hour), End: d0.Add(5*time.Hour + 30*time.Minute)},
		// Another size, a bigger rate.
		{SessionPK: "b", SessionID: "B", Size: "standard-5", Rate: 16000, Start: d0.Add(3 * time.Hour), End: d0.Add(3*time.Hour + 15*time.Minute)},
		// Outside the window.
		{SessionPK: "c", SessionID: "C", Size: "standard-1", Rate: 1000, Start: d0.Add(-48 * time.Hour), End: d0.Add(-47 * time.Hour)},
	}
	p := PeriodAt(15, d0.Add(3*time.Hour)) // from Dec 15
	s := Summarize(runs, p.Start, p.End)
	// A: 2 h + 0.5 h in the period at 1/h; B: 0.25 h at 16/h.
	if s.Credits != 2500+4000 || s.Running != 2*time.Hour+30*time.Minute+15*time.Minute {
		t.Fatalf("totals %+v", s)
	}
	if len(s.Sessions) != 2 || s.Sessions[0].SessionID != "A" || s.Sessions[0].Credits != 2500 || s.Sessions[1].Credits != 4000 {
		t.Fatalf("sessions %+v", s.Sessions)
	}
	if len(s.Days) != 1 || !s.Days[0].Day.Equal(date(2026, 12, 15, 0)) || s.Days[0].Credits != 6500 {
		t.Fatalf("days %+v", s.Days)
	}
	// The previous period holds A's first 2 hours, across no midnight.
	prev := Summarize(runs, p.Previous(15).Start, p.Start)
	if prev.Credits != 2000+1000 || len(prev.Days) != 2 {
		t.Fatalf("previous %+v", prev)
	}
	// Totals are sums of the same pieces: sessions, days and the total agree.
	var bySes, byDay Milli
	for _, x := range prev.Sessions {
		bySes += x.Credits
	}
	for _, x := range prev.Days {
		byDay += x.Credits
	}
	if bySes != prev.Credits || byDay != prev.Credits {
		t.Fatalf("disagree: %d %d %d", bySes, byDay, prev.Credits)
	}
	// Pure: same input, same output.
	if again := Summarize(runs, p.Start, p.End); again.Credits != s.Credits {
		t.Fatal("not pure")
	}
}

func TestPiecesSplitAtMidnight(t *testing.T) {
	r := Run{Rate: 3600_000, Start: date(2026, 12, 1, 23).Add(30 * time.Minute), End: date(2026, 12, 3, 1)}
	ps := Pieces(r, time.Time{}, date(2030, 1, 1, 0))
	if len(ps) != 3 || ps[0].Running != 30*time.Minute || ps[1].Running != 24*time.Hour || ps[2].Running != time.Hour {
		t.Fatalf("pieces %+v", ps)
	}
	if ps[0].Credits != 30*60*1000 {
		t.Fatalf("piece credit %d", ps[0].Credits)
	}
}
