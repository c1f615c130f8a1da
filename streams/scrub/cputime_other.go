//go:build !linux

package scrub

import "time"

// threadCPU is not available: budgets use the wall clock.
func threadCPU() (time.Duration, bool) { return 0, false }
