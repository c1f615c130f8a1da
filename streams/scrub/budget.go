package scrub

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// BudgetConfig is the scrubbing CPU one session may use.
type BudgetConfig struct {
	// Cores is the CPU a session's scrubbing may use sustained, in cores
	// (0.25: a quarter of one core). 0 or less: no budget.
	Cores float64
	// Burst is how much CPU time a session may spend at once above that
	// (the bucket's size); at least a millisecond.
	Burst time.Duration
	// ReportEvery: at most one Throttle report a session this often
	// (0: 10 s).
	ReportEvery time.Duration
}

// Throttle reports that a session's output was held back.
type Throttle struct {
	Key string // the session's (Budgets.New)
	// Held is how long its streams were held back since the last report
	// (this wait included; two streams held at once count twice), Waits in
	// how many waits; CPU is the scrubbing CPU charged since then.
	Held  time.Duration
	Waits int
	CPU   time.Duration
}

// BudgetStats are totals over every Budget of a Budgets.
type BudgetStats struct {
	CPU   time.Duration // scrubbing charged
	Held  time.Duration // streams held back
	Waits int64
}

// Budgets makes the Budgets of one server's sessions and keeps totals.
type Budgets struct {
	cfg        BudgetConfig
	onThrottle func(Throttle)
	cpu, held  atomic.Int64 // nanoseconds
	waits      atomic.Int64
	// The bucket's clock and the wait (tests replace them).
	now   func() time.Time
	sleep func(d time.Duration, stop <-chan struct{})
}

// NewBudgets returns the budgets of cfg; onThrottle (may be nil) receives
// the reports.
func NewBudgets(cfg BudgetConfig, onThrottle func(Throttle)) *Budgets {
	if cfg.ReportEvery <= 0 {
		cfg.ReportEvery = 10 * time.Second
	}
	cfg.Burst = max(cfg.Burst, time.Millisecond)
	return &Budgets{cfg: cfg, onThrottle: onThrottle, now: time.Now, sleep: sleepOrStop}
}

func sleepOrStop(d time.Duration, stop <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

// Stats returns the totals (zero for nil).
func (bs *Budgets) Stats() BudgetStats {
	if bs == nil {
		return BudgetStats{}
	}
	return BudgetStats{CPU: time.Duration(bs.cpu.Load()), Held: time.Duration(bs.held.Load()), Waits: bs.waits.Load()}
}

// New returns a session's Budget, full; nil (no budget) when bs is nil or
// has no Cores.
func (bs *Budgets) New(key string) *Budget {
	if bs == nil || bs.cfg.Cores <= 0 {
		return nil
	}
	return &Budget{bs: bs, key: key, stop: make(chan struct{}), tokens: bs.cfg.Burst, last: bs.now()}
}

// Budget is one session's allowance of scrubbing CPU: a token bucket of
// CPU time, filled at Cores seconds a second up to Burst, that scrubbing
// drains (it may go below zero: a debt). A stream's writer waits, before
// it takes more of the session's output, until the debt is paid. A nil
// *Budget is no budget.
type Budget struct {
	bs   *Budgets
	key  string
	stop chan struct{} // closed by Close

	mu     sync.Mutex
	tokens time.Duration // CPU time left; below zero, owed
	last   time.Time     // tokens were refilled up to here
	closed bool
	// Since the last report.
	reported   bool
	lastReport time.Time
	rep        Throttle
}

// refill adds what the time since the last refill earned; b.mu is held.
func (b *Budget) refill(now time.Time) {
	if el := now.Sub(b.last); el > 0 {
		b.tokens = min(b.bs.cfg.Burst, b.tokens+time.Duration(float64(el)*b.bs.cfg.Cores))
		b.last = now
	}
}

// charge takes d of CPU from the bucket.
func (b *Budget) charge(d time.Duration) {
	if b == nil || d <= 0 {
		return
	}
	b.bs.cpu.Add(int64(d))
	b.mu.Lock()
	b.refill(b.bs.now())
	b.tokens -= d
	b.rep.CPU += d
	b.mu.Unlock()
}

// Wait blocks while the session owes CPU: for the debt divided by Cores,
// so that its scrubbing averages Cores at most. It returns at once for a
// nil or closed Budget. Writers and Pairs call it before each write; a
// caller that scrubs a session's output with Redact (one line at a time)
// calls it (Set.WaitBudget) before it reads more.
func (b *Budget) Wait() {
	if b == nil {
		return
	}
	b.mu.Lock()
	now := b.bs.now()
	b.refill(now)
	if b.closed || b.tokens >= 0 {
		b.mu.Unlock()
		return
	}
	d := time.Duration(float64(-b.tokens) / b.bs.cfg.Cores)
	b.bs.held.Add(int64(d))
	b.bs.waits.Add(1)
	b.rep.Held += d
	b.rep.Waits++
	var rep *Throttle
	if !b.reported || now.Sub(b.lastReport) >= b.bs.cfg.ReportEvery {
		r := b.rep
		r.Key = b.key
		rep = &r
		b.rep = Throttle{}
		b.reported, b.lastReport = true, now
	}
	b.mu.Unlock()
	if rep != nil && b.bs.onThrottle != nil {
		b.bs.onThrottle(*rep)
	}
	b.bs.sleep(d, b.stop)
}

// Close ends the budget (the session is gone): waits end at once and later
// ones do not wait. Safe to call more than once.
func (b *Budget) Close() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		close(b.stop)
	}
}

// cpuClockMin: Redact of less than this is timed by the wall clock (its
// thread CPU clock costs a system call, a few microseconds on a VM, more
// than scrubbing a path or an event); Writers always use the CPU clock,
// which a write blocked on its destination does not advance.
const cpuClockMin = 4 << 10

// costMark is where a measured call began.
type costMark struct {
	cpu    bool
	thread time.Duration
	wall   time.Time
}

// begin starts measuring a call on the calling goroutine: by the thread's
// CPU clock (the goroutine locked to its thread until end), or by the
// wall clock. Nil-safe.
func (b *Budget) begin(cpu bool) costMark {
	if b == nil {
		return costMark{}
	}
	if cpu {
		runtime.LockOSThread()
		if t, ok := threadCPU(); ok {
			return costMark{cpu: true, thread: t}
		}
		runtime.UnlockOSThread()
	}
	return costMark{wall: time.Now()}
}

// end charges what the call begun at m cost.
func (b *Budget) end(m costMark) {
	if b == nil {
		return
	}
	var d time.Duration
	if m.cpu {
		t, _ := threadCPU()
		runtime.UnlockOSThread()
		d = t - m.thread
	} else {
		d = time.Since(m.wall)
	}
	b.charge(d)
}

// WithBudget returns a Set like s whose scrubbing is charged to b (a
// session's): its Writers and Pairs wait for b before each write, and
// everything it scrubs (Redact too) is charged. Sets derived from it by
// WithValues share b. A nil b gives s.
func (s *Set) WithBudget(b *Budget) *Set {
	if b == nil {
		return s
	}
	owner := s
	if s.poolOf != nil {
		owner = s.poolOf
	}
	return &Set{rules: s.rules, values: s.values, anchors: s.anchors, pf: s.pf, kv: s.kv, reg: s.reg, classes: s.classes, budget: b, poolOf: owner}
}

// WaitBudget is Budget.Wait for the Set's budget (none: it returns at
// once): for a caller that scrubs a session's output with Redact, before
// it takes more of it.
func (s *Set) WaitBudget() { s.budget.Wait() }
