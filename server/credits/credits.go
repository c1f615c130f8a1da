// Package credits owns the arithmetic of usage credits: amounts in exact
// milli-credits, charges for running time, billing periods anchored on a
// day of the month, and the summaries of a period's usage. Everything here
// is a pure function of its inputs (time included), so tests need no
// sleeps and a restart recomputes the same numbers.
//
// Concurrency: no state; safe for concurrent use.
package credits

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Milli is an amount of credits in thousandths of a credit (1 credit =
// 1000). Rates are milli-credits per hour of running time.
type Milli int64

// MaxRate bounds a rate (milli-credits per hour) so that a day of charges
// stays far from overflowing int64: 1e9 * 86_400_000 ms < 9.2e18.
const MaxRate Milli = 1_000_000_000

// ParseMilli reads a decimal amount of credits with at most three digits
// after the point ("1", "0.5", "12.125") exactly, never through a float.
func ParseMilli(s string) (Milli, error) {
	s = strings.TrimSpace(s)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	whole, frac, hasFrac := strings.Cut(s, ".")
	if whole == "" && !hasFrac || hasFrac && (frac == "" || len(frac) > 3) {
		return 0, fmt.Errorf("%q: want a number of credits with at most 3 decimals", s)
	}
	if whole == "" {
		whole = "0"
	}
	for _, r := range whole + frac {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("%q: want a number of credits with at most 3 decimals", s)
		}
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > math.MaxInt64/1000-1 {
		return 0, fmt.Errorf("%q: too large", s)
	}
	f := int64(0)
	if frac != "" {
		f, _ = strconv.ParseInt((frac + "00")[:3], 10, 64)
	}
	v := Milli(w*1000 + f)
	if neg {
		v = -v
	}
	return v, nil
}

// MaxGrant bounds one credit grant either way (a typo's damage): a
// million credits.
const MaxGrant Milli = 1_000_000_000

// ParseGrant reads an operator's credit grant: a nonzero amount with at
// most three decimals, at most MaxGrant either way (negative takes back).
func ParseGrant(s string) (Milli, error) {
	amt, err := ParseMilli(s)
	if err != nil || amt == 0 || amt > MaxGrant || amt < -MaxGrant {
		return 0, fmt.Errorf("credits: a nonzero number of credits with at most 3 decimals, at most %s either way (negative takes back)", MaxGrant)
	}
	return amt, nil
}

// String formats an amount as decimal credits ("1.5", "-0.001", "3").
func (m Milli) String() string {
	sign := ""
	v := int64(m)
	if v < 0 {
		sign, v = "-", -v
	}
	s := fmt.Sprintf("%s%d.%03d", sign, v/1000, v%1000)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

// Credits is the amount as a float of credits, for display only.
func (m Milli) Credits() float64 { return float64(m) / 1000 }

// UnmarshalYAML reads a decimal number of credits exactly.
func (m *Milli) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a number of credits", n.Line)
	}
	v, err := ParseMilli(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*m = v
	return nil
}

// msPerHour converts a rate per hour to a charge per millisecond.
const msPerHour = 3_600_000

// Charge is what d of running time costs at rate (milli-credits per hour),
// rounded down to a whole milli-credit. d must be at most a day (see
// Pieces), so the product cannot overflow.
func Charge(rate Milli, d time.Duration) Milli {
	if d <= 0 || rate <= 0 {
		return 0
	}
	return rate * Milli(d.Milliseconds()) / msPerHour
}

// MinSlice is the least a start must be able to pay for: seconds of
// running time at rate, rounded up so that a nonzero rate always asks for
// something.
func MinSlice(rate Milli, seconds int) Milli {
	if rate <= 0 || seconds <= 0 {
		return 0
	}
	return (rate*Milli(seconds) + 3599) / 3600
}

// Period is the billing period holding t for an organization whose periods
// start on anchorDay (1..31) of each month at 00:00 UTC; a month shorter
// than anchorDay starts its period on its last day. The period is [Start,
// End).
type Period struct {
	Start, End time.Time
}

// PeriodAt returns the period holding t.
func PeriodAt(anchorDay int, t time.Time) Period {
	t = t.UTC()
	anchorDay = min(max(anchorDay, 1), 31)
	start := anchorIn(t.Year(), t.Month(), anchorDay)
	if t.Before(start) {
		start = anchorIn(t.Year(), t.Month()-1, anchorDay)
	}
	return Period{Start: start, End: anchorIn(start.Year(), start.Month()+1, anchorDay)}
}

// anchorIn is the period start of a month (normalized, so month 0 is last
// year's December).
func anchorIn(year int, month time.Month, day int) time.Time {
	first := time.Date(year, month, 1, 0, 0, 0, 0, time.UTC)
	last := first.AddDate(0, 1, -1).Day()
	return first.AddDate(0, 0, min(day, last)-1)
}

// Previous is the period before p.
func (p Period) Previous(anchorDay int) Period {
	return PeriodAt(anchorDay, p.Start.Add(-time.Nanosecond))
}

// Contains reports whether t is in [Start, End).
func (p Period) Contains(t time.Time) bool { return !t.Before(p.Start) && t.Before(p.End) }

// Run is one stretch of a session's running time at one rate.
type Run struct {
	SessionPK string
	SessionID string
	Size      string
	Rate      Milli // per hour
	Start     time.Time
	End       time.Time
}

// Piece is the part of a run within one UTC day and a window: the unit
// every total is a sum of, so sessions, days and the period agree exactly.
type Piece struct {
	Day     time.Time // 00:00 UTC
	Running time.Duration
	Credits Milli
}

// Pieces splits a run's part within [from, to) at UTC midnights and
// charges each piece.
func Pieces(r Run, from, to time.Time) []Piece {
	s, e := r.Start.UTC(), r.End.UTC()
	if s.Before(from) {
		s = from.UTC()
	}
	if e.After(to) {
		e = to.UTC()
	}
	var out []Piece
	for s.Before(e) {
		day := time.Date(s.Year(), s.Month(), s.Day(), 0, 0, 0, 0, time.UTC)
		next := day.AddDate(0, 0, 1)
		pe := e
		if next.Before(pe) {
			pe = next
		}
		d := pe.Sub(s)
		out = append(out, Piece{Day: day, Running: d, Credits: Charge(r.Rate, d)})
		s = pe
	}
	return out
}

// SessionUsage is one session's usage in a window.
type SessionUsage struct {
	SessionPK string
	SessionID string
	Size      string
	Running   time.Duration
	Credits   Milli
}

// DayUsage is a day's usage in a window.
type DayUsage struct {
	Day     time.Time
	Running time.Duration
	Credits Milli
}

// Summary is the usage of a window: totals, per session (in order of
// first appearance in runs) and per day (in time order).
type Summary struct {
	Credits  Milli
	Running  time.Duration
	Sessions []SessionUsage
	Days     []DayUsage
}

// Summarize charges runs within [from, to).
func Summarize(runs []Run, from, to time.Time) Summary {
	var sum Summary
	bySession := map[string]int{}
	byDay := map[time.Time]*DayUsage{}
	for _, r := range runs {
		for _, p := range Pieces(r, from, to) {
			sum.Credits += p.Credits
			sum.Running += p.Running
			i, ok := bySession[r.SessionPK]
			if !ok {
				i = len(sum.Sessions)
				bySession[r.SessionPK] = i
				sum.Sessions = append(sum.Sessions, SessionUsage{SessionPK: r.SessionPK, SessionID: r.SessionID, Size: r.Size})
			}
			su := &sum.Sessions[i]
			su.Running += p.Running
			su.Credits += p.Credits
			su.Size = r.Size
			d := byDay[p.Day]
			if d == nil {
				d = &DayUsage{Day: p.Day}
				byDay[p.Day] = d
			}
			d.Running += p.Running
			d.Credits += p.Credits
		}
	}
	for _, d := range byDay {
		sum.Days = append(sum.Days, *d)
	}
	sort.Slice(sum.Days, func(i, j int) bool { return sum.Days[i].Day.Before(sum.Days[j].Day) })
	return sum
}
