package sandbox

import (
	"fmt"
	"testing"

	"sandboxd/server/config"
)

// BenchmarkSweep1000 times one monitor round over a thousand running
// sessions (a fake runtime, a real SQLite file): the server's own share
// of a round at the density goal.
func BenchmarkSweep1000(b *testing.B) {
	e := newEnv(b, func(c *config.Config) {
		c.Limits.MaxSandboxesPerOrg, c.Limits.MaxSandboxes, c.Limits.MemoryOvercommit = 2000, 2000, 1000
	})
	e.m.memAvailable = func() int { return 1 << 20 }
	for i := 0; i < 1000; i++ {
		e.provision(fmt.Sprintf("s%d", i), 0)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.m.sweep()
	}
}
