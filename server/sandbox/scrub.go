package sandbox

import (
	"cmp"
	"context"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"sandboxd/server/errdefs"
	"sandboxd/streams/scrub"
)

// Scrubber is a session's scrubber: the rules plus the session's secrets
// (and their encodings), compiled once and cached while the session runs
// (a stopped session's may be evicted and compiled again: scrubbers),
// until the session is deleted or its start fails. What it scrubs is charged to the session's
// budget (limits.scrubCpuCores): its Writers and Pairs wait while the
// session is over it, and deleting the session ends their waits.
// ErrScrubberUnavailable: the session's secrets could not be read, so
// nothing of it may be shown (fail closed, never with the rules only).
func (m *Manager) Scrubber(pk string) (*scrub.Set, error) {
	if set, ok := m.scrub.cached(pk); ok {
		return set, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	secrets, err := m.db.Secrets(ctx, pk)
	if err != nil {
		// Nothing is cached, so the next use reads the secrets again.
		m.log.Error("read secrets for the scrubber", "session", pk, "err", err)
		return nil, ErrScrubberUnavailable
	}
	return m.scrub.forSession(pk, secrets), nil
}

// ErrScrubberUnavailable is Scrubber's answer when a session's secrets
// cannot be read (the database is busy or failing).
var ErrScrubberUnavailable = errdefs.Unavailable("the session's secrets cannot be read now, so nothing of it can be shown safely; retry")

// pinScrubber pins a session's scrubber as it starts running (scrubbers
// says why); check refuses it (503) when the running sessions' secrets
// would take more than limits.maxSecretsMemoryMiB.
func (m *Manager) pinScrubber(ctx context.Context, pk string, check bool) error {
	return m.scrub.pin(ctx, pk, func() (map[string]string, error) { return m.db.Secrets(ctx, pk) }, check)
}

// ScrubMemory is the memory the sessions' secrets take in their scrubbers
// (bytes): the running sessions' (what limits.maxSecretsMemoryMiB bounds)
// and all cached ones'.
func (m *Manager) ScrubMemory() (running, cached int) { return m.scrub.memory() }

// RedactAllSessions redacts text no session can be told from, such as the
// standard library's log lines, with the rules and the secrets of every
// session whose scrubber is cached (among them every session whose egress
// listener runs). It runs each such session's scrubber in turn rather than
// keeping one more index of everybody's secrets: such lines are few
// (rate-limited), and the index would double the secrets' memory.
func (m *Manager) RedactAllSessions(b []byte) []byte { return m.scrub.redactAll(b) }

// ScrubStats are the totals of the sessions' scrubbing budgets (metrics).
func (m *Manager) ScrubStats() scrub.BudgetStats { return m.scrub.budgets.Stats() }

// throttled records that a session's output waited for its scrubbing
// budget (limits.scrubCpuCores): an event in its log, a line in ours.
func (m *Manager) throttled(r scrub.Throttle) {
	m.log.Info("session output held back: scrubbing over its CPU budget", "session", r.Key,
		"heldMs", r.Held.Milliseconds(), "scrubCpuMs", r.CPU.Milliseconds())
	if m.events != nil {
		m.events.Event(r.Key, "scrub_throttled", map[string]any{"heldMs": r.Held.Milliseconds(), "waits": r.Waits,
			"scrubCpuMs": r.CPU.Milliseconds(), "budgetCores": m.lim.ScrubCPUCores, "burstMs": m.lim.ScrubCPUBurstMs})
	}
}

// scrubbers caches each session's compiled scrubber, and its budget
// (limits.scrubCpuCores) that the scrubber charges.
//
// Memory (limits.maxSecretsMemoryMiB): a running session's scrubber is
// pinned (admit at provision, pin at every start, unpin when it stops):
// those are what the budget is for, and an admit that would take them over
// it is refused. A scrubber loaded for a session that does not run (a read
// of its files or log) is cached unpinned and evicted, least recently used
// first, when the budget needs the room; it is compiled again if needed.
// The budget is checked, and the room reserved, before a set is compiled,
// with an estimate from the secrets' lengths (estimateBytes), then settled
// to what the set takes; at most GOMAXPROCS sets compile at once (each
// allocates about 4 KB a secret byte while it does).
type scrubbers struct {
	base    *scrub.Set
	budgets *scrub.Budgets
	// memBudget: the most memory (bytes) the pinned sessions' secrets may
	// take; 0 = no limit.
	memBudget int
	mu        sync.Mutex
	m         map[string]*scrubEntry   // by pk
	budget    map[string]*scrub.Budget // by pk, until forget (an eviction keeps it)
	// Bytes of the cached sets' secrets: all, pinned ones, and the
	// estimates of admitted sets being compiled.
	used, pinned, reserved int
	tick                   uint64 // for the entries' lastUse
	sem                    chan struct{}
	compiles               atomic.Int64 // (tests)
}

type scrubEntry struct {
	set            *scrub.Set
	longest, bytes int // of its secrets; 0 without
	pinned         bool
	lastUse        uint64
}

// estimateBytes is about the most a Set's index of these secrets takes:
// per value the lesser of 4,600 bytes a byte plus 32 KiB and 1,600 bytes
// a byte plus 2.5 MiB (measured: 31 KB for 6 bytes, 220 KB for 64, 2.5 MB
// for 1 KiB, 16.4 MB for 16 KiB of random base64; up to 4.3 KB a byte
// for short values and 15 MB for 8.5 KiB, 23 MB for 16 KiB, of random
// punctuation, control characters and non-ASCII text: at most 0.94 of
// the estimate).
func estimateBytes(secrets map[string]string) int {
	n := 0
	for _, v := range secrets {
		if len(v) >= scrub.MinValueLen {
			n += min(4600*len(v)+32<<10, 1600*len(v)+5<<19)
		}
	}
	return n
}

// compile compiles the rules with a session's secrets, one of at most
// GOMAXPROCS at once; a done ctx ends the wait for a turn. Values were
// validated at provision; WithValues keeps every valid one.
func (s *scrubbers) compile(ctx context.Context, secrets map[string]string) (*scrub.Set, error) {
	if len(secrets) == 0 {
		return s.base, nil
	}
	s.mu.Lock()
	if s.sem == nil {
		s.sem = make(chan struct{}, runtime.GOMAXPROCS(0))
	}
	sem := s.sem
	s.mu.Unlock()
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return nil, errdefs.Unavailable("the server is busy compiling other sessions' secrets; retry").WithCause(ctx.Err())
	}
	defer func() { <-sem }()
	s.compiles.Add(1)
	set, _ := s.base.WithValues(secrets)
	return set, nil
}

// withSecrets is compile without a cache or a context (tests).
func (s *scrubbers) withSecrets(secrets map[string]string) *scrub.Set {
	set, _ := s.compile(context.Background(), secrets)
	return set
}

// forSession returns the session's scrubber, loading it unpinned if it is
// not cached: other unpinned ones are evicted to make room for it, but it
// is cached even without room (its next use would compile it again;
// the next admit that needs the room evicts it).
func (s *scrubbers) forSession(pk string, secrets map[string]string) *scrub.Set {
	set, _ := s.load(context.Background(), pk, secrets, false, false)
	return set
}

// admit compiles and caches a new session's scrubber, pinned, unless its
// secrets would take the pinned sessions' secrets over the budget.
func (s *scrubbers) admit(ctx context.Context, pk string, secrets map[string]string) error {
	_, err := s.load(ctx, pk, secrets, true, true)
	return err
}

// pin pins a session's scrubber (it starts running), loading it from
// secrets if it is not cached; check refuses it if the pinned sessions'
// secrets would go over the budget (else it is pinned whatever they take:
// a sandbox found running, or restored only to be torn down).
func (s *scrubbers) pin(ctx context.Context, pk string, secrets func() (map[string]string, error), check bool) error {
	s.mu.Lock()
	e := s.m[pk]
	if e != nil {
		defer s.mu.Unlock()
		if e.pinned {
			return nil
		}
		if check {
			if err := s.roomLocked(e.bytes); err != nil {
				return err
			}
		}
		e.pinned = true
		s.pinned += e.bytes
		s.evictLocked(0)
		return nil
	}
	s.mu.Unlock()
	sec, err := secrets()
	if err != nil {
		return err
	}
	_, err = s.load(ctx, pk, sec, true, check)
	return err
}

// unpin: the session stopped running; its scrubber stays cached, evictable.
func (s *scrubbers) unpin(pk string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[pk]; e != nil && e.pinned {
		e.pinned = false
		s.pinned -= e.bytes
	}
}

// secretsRetryAfter: the Retry-After (seconds) of a start refused for the
// secrets budget; it frees as running sessions stop.
const secretsRetryAfter = 30

// roomLocked says whether n more bytes of pinned secrets fit the budget;
// s.mu is held.
func (s *scrubbers) roomLocked(n int) error {
	if s.memBudget <= 0 || n <= 0 || s.pinned+s.reserved+n <= s.memBudget {
		return nil
	}
	return errdefs.Unavailable("the secrets of this server's running sessions take %d MiB of the %d MiB it keeps for redacting them (these take about %d MiB); retry later, or with fewer or shorter secrets",
		(s.pinned+s.reserved)>>20, s.memBudget>>20, (n+1<<20-1)>>20).WithRetryAfter(secretsRetryAfter)
}

// evictLocked drops unpinned entries with secrets, least recently used
// first, until n more bytes fit the budget or none is left; s.mu is held.
func (s *scrubbers) evictLocked(n int) {
	if s.memBudget <= 0 || s.used+s.reserved+n <= s.memBudget {
		return
	}
	var lru []string
	for pk, e := range s.m {
		if !e.pinned && e.bytes > 0 {
			lru = append(lru, pk)
		}
	}
	slices.SortFunc(lru, func(a, b string) int { return cmp.Compare(s.m[a].lastUse, s.m[b].lastUse) })
	for _, pk := range lru {
		if s.used+s.reserved+n <= s.memBudget {
			return
		}
		// Its budget stays (a reload charges the same one); a stream that
		// holds the set goes on with it.
		s.used -= s.m[pk].bytes
		delete(s.m, pk)
	}
}

func (s *scrubbers) load(ctx context.Context, pk string, secrets map[string]string, pin, check bool) (*scrub.Set, error) {
	est := estimateBytes(secrets)
	s.mu.Lock()
	if e := s.m[pk]; e != nil {
		s.mu.Unlock()
		if pin {
			// (evicted meanwhile: loaded again)
			return e.set, s.pin(ctx, pk, func() (map[string]string, error) { return secrets, nil }, check)
		}
		return e.set, nil
	}
	if pin {
		if check {
			if err := s.roomLocked(est); err != nil {
				s.mu.Unlock()
				return nil, err
			}
		}
		s.evictLocked(est)
		s.reserved += est
	}
	s.mu.Unlock()
	set, err := s.compile(ctx, secrets)
	s.mu.Lock()
	defer s.mu.Unlock()
	if pin {
		s.reserved -= est
	}
	if err != nil {
		return nil, err
	}
	if e := s.m[pk]; e != nil { // loaded meanwhile
		if pin && !e.pinned {
			e.pinned = true
			s.pinned += e.bytes
		}
		return e.set, nil
	}
	size := set.MemoryBytes()
	s.evictLocked(size)
	b := s.budget[pk]
	if b == nil {
		if b = s.budgets.New(pk); b != nil {
			if s.budget == nil {
				s.budget = map[string]*scrub.Budget{}
			}
			s.budget[pk] = b
		}
	}
	set = set.WithBudget(b)
	e := &scrubEntry{set: set, bytes: size, pinned: pin}
	for _, v := range secrets {
		e.longest = max(e.longest, len(v))
	}
	s.used += size
	if pin {
		s.pinned += size
	}
	s.tick++
	e.lastUse = s.tick
	if s.m == nil {
		s.m = map[string]*scrubEntry{}
	}
	s.m[pk] = e
	return set, nil
}

// redactAll: sessions with the longest values first, so that a value
// another session's value contains is redacted whole, not cut around the
// shorter one into pieces each too short to be redacted.
func (s *scrubbers) redactAll(b []byte) []byte {
	type entry struct {
		set     *scrub.Set
		longest int
	}
	s.mu.Lock()
	sets := make([]entry, 0, len(s.m))
	for _, e := range s.m {
		if e.longest > 0 {
			sets = append(sets, entry{e.set, e.longest})
		}
	}
	s.mu.Unlock()
	if len(sets) == 0 {
		return s.base.Redact(b)
	}
	slices.SortFunc(sets, func(a, b entry) int { return cmp.Compare(b.longest, a.longest) })
	for _, e := range sets {
		b = e.set.Redact(b)
	}
	return b
}

func (s *scrubbers) cached(pk string) (*scrub.Set, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[pk]
	if e == nil {
		return nil, false
	}
	s.tick++
	e.lastUse = s.tick
	return e.set, true
}

// memory returns the bytes of the cached sessions' secrets: pinned
// (running sessions, and admits being compiled) and all.
func (s *scrubbers) memory() (pinned, all int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pinned + s.reserved, s.used + s.reserved
}

func (s *scrubbers) forget(pk string) {
	s.mu.Lock()
	if e := s.m[pk]; e != nil {
		s.used -= e.bytes
		if e.pinned {
			s.pinned -= e.bytes
		}
		delete(s.m, pk)
	}
	if b := s.budget[pk]; b != nil {
		b.Close() // its streams' waits end
		delete(s.budget, pk)
	}
	s.mu.Unlock()
}
