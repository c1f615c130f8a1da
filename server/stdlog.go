package server

import (
	"bytes"
	"log"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Standard library log lines: at most stdLogBurst at once and stdLogRate
// a second after that; longer lines are cut to stdLogMaxLine bytes (after
// scrubbing, so no secret is cut in half).
const (
	stdLogRate    = 2
	stdLogBurst   = 10
	stdLogMaxLine = 1024
	// stdLogMaxScrub: longer lines are cut before scrubbing (a redaction
	// can be much shorter than the secret it replaces).
	stdLogMaxScrub = 64 << 10
)

// stdLog receives what the standard library's log package prints:
// net/http's own complaints, such as a Transport's "Unsolicited response
// received on idle HTTP channel starting with ...", which quotes upstream
// bytes that a sandbox chooses and can trigger at will. Each line is
// scrubbed with the rules and every known session's secrets, then logged
// through the server's (scrubbing) logger; lines over the rate limit are
// dropped and counted, and the next line logged says how many.
type stdLog struct {
	s          *Server
	lim        *rate.Limiter
	now        func() time.Time // the limiter's clock
	suppressed atomic.Int64
}

func newStdLog(s *Server) *stdLog {
	return &stdLog{s: s, lim: rate.NewLimiter(stdLogRate, stdLogBurst), now: s.stdLogClock}
}

// Write takes one line (log.Logger writes each message in one call).
func (w *stdLog) Write(p []byte) (int, error) {
	if !w.lim.AllowN(w.now(), 1) {
		w.suppressed.Add(1)
		w.s.met.stdLogSuppressed.Inc()
		return len(p), nil
	}
	// Each session's scrubber reads the line (RedactAllSessions): cut what
	// could never be shown before that. A cut secret's part of 12 or more
	// characters is still redacted.
	p = bytes.TrimRight(p, "\n")
	if len(p) > stdLogMaxScrub {
		p = p[:stdLogMaxScrub]
	}
	line := w.s.sessions.RedactAllSessions(p)
	if len(line) > stdLogMaxLine {
		line = append(line[:stdLogMaxLine:stdLogMaxLine], "..."...)
	}
	args := []any{"line", string(line)}
	if n := w.suppressed.Swap(0); n > 0 {
		args = append(args, "suppressedBefore", n)
	}
	w.s.log.Warn("go log", args...)
	return len(p), nil
}

// captureStdLog sends the log package's output to s (see stdLog) and
// returns the function that puts the previous output back.
func (s *Server) captureStdLog() (restore func()) {
	prevOut, prevFlags, prevPrefix := log.Writer(), log.Flags(), log.Prefix()
	log.SetOutput(newStdLog(s))
	log.SetFlags(0) // s.log adds the time
	log.SetPrefix("")
	return func() {
		log.SetOutput(prevOut)
		log.SetFlags(prevFlags)
		log.SetPrefix(prevPrefix)
	}
}
