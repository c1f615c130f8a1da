//go:build race

package scrub

// raceEnabled: the race detector slows scanning several times over; the
// corpus test scans a deterministic sample then.
const raceEnabled = true
