package sandbox

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"sandboxd/server/errdefs"
	"sandboxd/streams/scrub"
)

// Scrubber is a session's scrubber: the rules plus the session's secrets
// (and their encodings), compiled once and cached until the session is
// deleted or its start fails. What it scrubs is charged to the session's
// budget (limits.scrubCpuCores): its Writers and Pairs wait while the
// session is over it, and deleting the session ends their waits.
func (m *Manager) Scrubber(pk string) *scrub.Set {
	if set, ok := m.scrub.cached(pk); ok {
		return set
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	secrets, err := m.db.Secrets(ctx, pk)
	if err != nil {
		// Nothing is cached, so the next use reads the secrets again; this
		// one has the rules only.
		m.log.Error("read secrets for the scrubber", "session", pk, "err", err)
		return m.scrub.withSecrets(nil)
	}
	return m.scrub.forSession(pk, secrets)
}

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
// (limits.scrubCpuCores) that the scrubber charges: one per session until
// it is forgotten.
type scrubbers struct {
	base    *scrub.Set
	budgets *scrub.Budgets
	// memBudget: the most memory (bytes) the cached sessions' secrets may
	// take, checked at provision (admit); 0 = no limit.
	memBudget int
	mu        sync.Mutex
	m         map[string]*scrub.Set    // by pk
	budget    map[string]*scrub.Budget // by pk, sessions in m with a budget
	// info: the cached sessions that have secrets (redactAll's order and
	// memBudget).
	info map[string]secretsInfo
	used int // bytes: the sum of info's
}

type secretsInfo struct{ longest, bytes int }

// withSecrets compiles the rules with a session's secrets. Values were
// validated at provision; WithValues keeps every valid one.
func (s *scrubbers) withSecrets(secrets map[string]string) *scrub.Set {
	if len(secrets) == 0 {
		return s.base
	}
	set, _ := s.base.WithValues(secrets)
	return set
}

func (s *scrubbers) forSession(pk string, secrets map[string]string) *scrub.Set {
	set, _ := s.add(pk, secrets, false)
	return set
}

// admit compiles and caches a new session's scrubber, unless its secrets
// would take the cached sessions' secrets over the budget.
func (s *scrubbers) admit(pk string, secrets map[string]string) error {
	_, err := s.add(pk, secrets, true)
	return err
}

func (s *scrubbers) add(pk string, secrets map[string]string, checkBudget bool) (*scrub.Set, error) {
	if set, ok := s.cached(pk); ok {
		return set, nil
	}
	// Compiled outside the lock: the largest secrets take about a second.
	set := s.withSecrets(secrets)
	size := set.MemoryBytes()
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.m[pk]; ok {
		return old, nil
	}
	if checkBudget && s.memBudget > 0 && size > 0 && s.used+size > s.memBudget {
		return nil, errdefs.Unavailable("the secrets of this server's sessions take %d MiB of the %d MiB it keeps for redacting them (these take %d MiB); retry later, or with fewer or shorter secrets",
			s.used>>20, s.memBudget>>20, (size+1<<20-1)>>20)
	}
	if b := s.budgets.New(pk); b != nil {
		set = set.WithBudget(b)
		if s.budget == nil {
			s.budget = map[string]*scrub.Budget{}
		}
		s.budget[pk] = b
	}
	if len(secrets) > 0 {
		if s.info == nil {
			s.info = map[string]secretsInfo{}
		}
		longest := 0
		for _, v := range secrets {
			longest = max(longest, len(v))
		}
		s.info[pk] = secretsInfo{longest, size}
		s.used += size
	}
	if s.m == nil {
		s.m = map[string]*scrub.Set{}
	}
	s.m[pk] = set
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
	sets := make([]entry, 0, len(s.info))
	for pk, in := range s.info {
		sets = append(sets, entry{s.m[pk], in.longest})
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
	set, ok := s.m[pk]
	return set, ok
}

func (s *scrubbers) forget(pk string) {
	s.mu.Lock()
	delete(s.m, pk)
	s.used -= s.info[pk].bytes
	delete(s.info, pk)
	if b := s.budget[pk]; b != nil {
		b.Close() // its streams' waits end
		delete(s.budget, pk)
	}
	s.mu.Unlock()
}
