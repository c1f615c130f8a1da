package scrub

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU is the calling thread's CPU time (user and system).
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
