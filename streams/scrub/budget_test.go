package scrub

import (
	"bytes"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is a bucket clock that moves only when told to or when a
// wait sleeps (it records the sleeps).
type fakeClock struct {
	mu     sync.Mutex
	t      time.Time
	sleeps []time.Duration
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) sleep(d time.Duration, stop <-chan struct{}) {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) slept() (n int, total time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.sleeps {
		total += d
	}
	return len(c.sleeps), total
}

func fakeBudgets(cfg BudgetConfig, onThrottle func(Throttle)) (*Budgets, *fakeClock) {
	c := &fakeClock{t: time.Unix(1e9, 0)}
	bs := NewBudgets(cfg, onThrottle)
	bs.now, bs.sleep = c.now, c.sleep
	return bs, c
}

func near(a, b, tol time.Duration) bool { return a-b <= tol && b-a <= tol }

var (
	budgetSetOnce sync.Once
	budgetSetV    *Set
)

// budgetSet is the rule set, compiled once for these tests (the race
// detector makes compiling slow).
func budgetSet(tb testing.TB) *Set {
	budgetSetOnce.Do(func() { budgetSetV = ruleSet(tb) })
	return budgetSetV
}

// floodSize scales the floods down under the race detector.
func floodSize(n int) int {
	if raceEnabled {
		return n / 8
	}
	return n
}

func TestBudgetBucket(t *testing.T) {
	bs, c := fakeBudgets(BudgetConfig{Cores: 0.25, Burst: time.Second}, nil)
	b := bs.New("s1")
	// A full bucket: a burst's worth of CPU is free.
	b.charge(time.Second)
	b.Wait()
	if n, _ := c.slept(); n != 0 {
		t.Fatalf("waited within the burst: %v", c.sleeps)
	}
	// 100 ms over: 400 ms at a quarter of a core.
	b.charge(100 * time.Millisecond)
	b.Wait()
	if n, d := c.slept(); n != 1 || d != 400*time.Millisecond {
		t.Fatalf("over by 100 ms: slept %v", c.sleeps)
	}
	// The wait paid the debt.
	b.Wait()
	if n, _ := c.slept(); n != 1 {
		t.Fatalf("waited twice for one debt: %v", c.sleeps)
	}
	// Time refills the bucket, up to the burst only.
	c.advance(time.Hour)
	b.charge(time.Second)
	b.Wait()
	if n, _ := c.slept(); n != 1 {
		t.Fatalf("waited after an hour's refill: %v", c.sleeps)
	}
	b.charge(time.Millisecond)
	b.Wait()
	if n, d := c.slept(); n != 2 || d != 404*time.Millisecond {
		t.Fatalf("the bucket outgrew its burst: %v", c.sleeps)
	}
	// Half a second idle earns 125 ms.
	c.advance(500 * time.Millisecond)
	b.charge(125 * time.Millisecond)
	b.Wait()
	if n, _ := c.slept(); n != 2 {
		t.Fatalf("refill: %v", c.sleeps)
	}
	st := bs.Stats()
	if st.CPU != 2*time.Second+226*time.Millisecond || st.Held != 404*time.Millisecond || st.Waits != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// A writer that scrubs without pause averages Cores once its burst is
// spent, whatever each write costs.
func TestBudgetSustained(t *testing.T) {
	for _, cores := range []float64{0.1, 0.25, 1, 2} {
		bs, c := fakeBudgets(BudgetConfig{Cores: cores, Burst: 500 * time.Millisecond}, nil)
		b := bs.New("s")
		rnd := rand.New(rand.NewPCG(1, uint64(cores*100)))
		start := c.now()
		var used time.Duration
		for i := 0; i < 20000; i++ {
			b.Wait()
			d := time.Duration(rnd.IntN(20000)) * time.Microsecond // up to 20 ms a write
			c.advance(d)                                           // scrubbing takes time too
			b.charge(d)
			used += d
		}
		el := c.now().Sub(start)
		got := float64(used-500*time.Millisecond) / float64(el)
		if math.Abs(got-cores)/cores > 0.02 && cores < 1 {
			t.Errorf("cores %v: used %v in %v: %.3f cores", cores, used, el, got)
		}
		if cores >= 1 {
			// A single writer cannot use more than one core: never held.
			if n, _ := c.slept(); n != 0 {
				t.Errorf("cores %v: a single writer was held %d times", cores, n)
			}
		}
	}
}

func TestBudgetReports(t *testing.T) {
	var reps []Throttle
	bs, c := fakeBudgets(BudgetConfig{Cores: 0.5, Burst: 100 * time.Millisecond, ReportEvery: 10 * time.Second}, func(r Throttle) { reps = append(reps, r) })
	b := bs.New("pk1")
	b.charge(150 * time.Millisecond)
	b.Wait() // 100 ms held, reported at once
	if len(reps) != 1 || reps[0].Key != "pk1" || reps[0].Held != 100*time.Millisecond || reps[0].Waits != 1 || reps[0].CPU != 150*time.Millisecond {
		t.Fatalf("first report: %+v", reps)
	}
	// More throttling within 10 s: counted, not reported.
	for i := 0; i < 5; i++ {
		b.charge(time.Second)
		b.Wait() // 2 s each
	}
	if len(reps) != 1 {
		t.Fatalf("reported more than once in 10 s: %+v", reps)
	}
	// The first wait 10 s after the last report reports everything since.
	b.charge(time.Second)
	b.Wait()
	if len(reps) != 2 || reps[1].Held != 12*time.Second || reps[1].Waits != 6 || reps[1].CPU != 6*time.Second {
		t.Fatalf("second report: %+v", reps)
	}
	// No report without a wait.
	c.advance(time.Minute)
	b.charge(10 * time.Millisecond)
	b.Wait()
	if len(reps) != 2 {
		t.Fatalf("reported without throttling: %+v", reps)
	}
}

func TestBudgetCloseEndsWaits(t *testing.T) {
	bs := NewBudgets(BudgetConfig{Cores: 0.001, Burst: time.Millisecond}, nil)
	b := bs.New("s")
	b.charge(time.Hour) // a wait of 1000 hours
	done := make(chan struct{})
	go func() {
		b.Wait()
		close(done)
	}()
	time.Sleep(20 * time.Millisecond)
	b.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a wait")
	}
	st := time.Now()
	b.Wait() // closed: no wait, whatever is owed
	b.Close()
	if time.Since(st) > time.Second {
		t.Fatal("a closed budget waited")
	}
}

func TestBudgetNone(t *testing.T) {
	if b := NewBudgets(BudgetConfig{}, nil).New("s"); b != nil {
		t.Fatal("a budget without cores")
	}
	var bs *Budgets
	if bs.New("s") != nil || bs.Stats() != (BudgetStats{}) {
		t.Fatal("nil Budgets")
	}
	var b *Budget
	b.Wait()
	b.charge(time.Second)
	b.Close()
	s := budgetSet(t)
	if s.WithBudget(nil) != s {
		t.Fatal("WithBudget(nil) is a new Set")
	}
	s.WaitBudget()
}

// floodInput is a costly shape (eyJ runs up to a newline) with a secret
// in its middle.
func floodInput(n int) []byte {
	var b bytes.Buffer
	line := append(bytes.Repeat([]byte("eyJ"), 2000), '\n')
	for b.Len() < n/2 {
		b.Write(line)
	}
	b.WriteString("password=Hunter2Hunter2Hunter2\n")
	for b.Len() < n {
		b.Write(line)
	}
	return b.Bytes()
}

// Through a Writer and a Pair with a budget: the output is the same as
// without one, the scrubbing is charged, and past the burst each write
// waits what the budget owes, so that the waits times Cores add up to the
// CPU charged less the burst (within the last write's cost).
func TestBudgetWriterAndPair(t *testing.T) {
	base := budgetSet(t)
	valued, _ := base.WithValues(map[string]string{"MY_TOKEN": "abcdefghijklmnop1234"})
	data := floodInput(floodSize(2 << 20))
	want := valued.Redact(data)
	if !bytes.Contains(want, []byte("[REDACTED:")) {
		t.Fatal("the secret in the flood is not redacted")
	}
	step := len(data) / 64
	for _, pair := range []bool{false, true} {
		bs, c := fakeBudgets(BudgetConfig{Cores: 0.1, Burst: 20 * time.Millisecond}, nil)
		b := bs.New("s")
		set := valued.WithBudget(b)
		var out, errOut bytes.Buffer
		writes := 0
		if pair {
			p := set.NewPair(&out, &errOut)
			for off := 0; off < len(data); off += step {
				p.Stdout().Write(data[off:min(off+step, len(data))])
				writes++
			}
			p.Close()
		} else {
			w := set.NewWriter(&out)
			for off := 0; off < len(data); off += step {
				w.Write(data[off:min(off+step, len(data))])
				writes++
			}
			w.Close()
		}
		if !bytes.Equal(out.Bytes(), want) || errOut.Len() != 0 {
			t.Fatalf("pair %v: output differs from Redact (%d bytes, want %d)", pair, out.Len(), len(want))
		}
		st := bs.Stats()
		n, slept := c.slept()
		if n == 0 || n > writes || st.Waits != int64(n) || st.Held != slept {
			t.Fatalf("pair %v: %d waits in %d writes (stats %+v, slept %v)", pair, n, writes, st, slept)
		}
		// Each write's cost is at most its share of the whole (the flood
		// is uniform) times 4, for a loaded machine.
		perWrite := 4 * st.CPU / time.Duration(writes)
		paid := time.Duration(float64(slept)*0.1) + 20*time.Millisecond
		if !near(paid, st.CPU, perWrite+st.CPU/10) {
			t.Errorf("pair %v: charged %v, paid %v by waiting (one write %v)", pair, st.CPU, paid, perWrite)
		}
		t.Logf("pair %v: %d writes, %v charged, %d waits, %v held", pair, writes, st.CPU, n, slept)
	}
}

// Redact is charged but never waits (events and paths are scrubbed with
// it by the server's own goroutines).
func TestBudgetRedactCharges(t *testing.T) {
	bs, c := fakeBudgets(BudgetConfig{Cores: 0.1, Burst: time.Millisecond}, nil)
	set := budgetSet(t).WithBudget(bs.New("s"))
	data := floodInput(floodSize(1 << 20))
	for i := 0; i < 3; i++ {
		set.Redact(data)
	}
	set.RedactString("a path")
	if st := bs.Stats(); st.CPU <= 0 || st.Waits != 0 {
		t.Fatalf("stats %+v", st)
	}
	if n, _ := c.slept(); n != 0 {
		t.Fatal("Redact waited")
	}
	// A caller that scrubs line by line waits for it itself.
	set.WaitBudget()
	if n, _ := c.slept(); n != 1 {
		t.Fatal("WaitBudget did not wait")
	}
}

// Many streams of one session (and of others) at once: -race checks the
// locking, and the session's waits cover what it was charged.
func TestBudgetConcurrent(t *testing.T) {
	bs := NewBudgets(BudgetConfig{Cores: 2, Burst: 5 * time.Millisecond}, nil)
	set := budgetSet(t)
	data := floodInput(floodSize(512 << 10))
	var wg sync.WaitGroup
	for s := 0; s < 3; s++ {
		b := bs.New("s")
		ss := set.WithBudget(b)
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := ss.NewWriter(io.Discard)
				for off := 0; off < len(data); off += 8 << 10 {
					w.Write(data[off:min(off+8<<10, len(data))])
				}
				w.Close()
				ss.Redact(data[:1000])
			}()
		}
		defer b.Close()
	}
	wg.Wait()
	if st := bs.Stats(); st.CPU <= 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A Pair's two streams keep the order their writes came in while the
// session owes: a stderr write that comes while a stdout write waits must
// not be scrubbed first, or a value split between the two streams is not
// seen whole. The waits' ends are released in the worst order (the later
// write's first), as two timers due at the same instant may fire.
func TestBudgetPairKeepsOrder(t *testing.T) {
	// 20 bytes: runs of 10 are redacted on their own, so the pieces are
	// shorter and only the order of the writes joins them.
	const secret = "abcdefghijklmnop1234"
	pieces := []string{secret[:7], secret[7:14], secret[14:] + "\n"} // stdout, stderr, stdout
	valued, _ := budgetSet(t).WithValues(map[string]string{"MY_TOKEN": secret})
	bs := NewBudgets(BudgetConfig{Cores: 0.1, Burst: time.Millisecond}, nil)
	sleepers := make(chan chan struct{})
	bs.sleep = func(_ time.Duration, stop <-chan struct{}) {
		ch := make(chan struct{})
		select {
		case sleepers <- ch:
			<-ch
		case <-stop:
		}
	}
	b := bs.New("s")
	defer b.Close()
	b.charge(time.Hour) // owes: every write waits
	var out, errOut bytes.Buffer
	p := valued.WithBudget(b).NewPair(&out, &errOut)
	first, second := make(chan struct{}), make(chan struct{})
	go func() { defer close(first); p.Stdout().Write([]byte(pieces[0])) }()
	firstWait := <-sleepers // the stdout write waits
	go func() { defer close(second); p.Stderr().Write([]byte(pieces[1])) }()
	select {
	case ch := <-sleepers: // the stderr write waits too: release it first
		close(ch)
		time.Sleep(50 * time.Millisecond)
	case <-time.After(200 * time.Millisecond): // it waits behind the stdout write
	}
	close(firstWait)
	done := make(chan struct{})
	go func() { // later waits end at once
		for {
			select {
			case ch := <-sleepers:
				close(ch)
			case <-done:
				return
			}
		}
	}()
	<-first
	<-second
	p.Stdout().Write([]byte(pieces[2]))
	close(done)
	p.Close()
	for _, piece := range pieces {
		if got := out.String() + errOut.String(); strings.Contains(got, strings.TrimSpace(piece)) {
			t.Fatalf("the value written in turns to stdout and stderr leaked: stdout %q stderr %q", out.String(), errOut.String())
		}
	}
}
