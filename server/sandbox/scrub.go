package sandbox

import (
	"context"
	"sync"
	"time"

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

// AllSessionsScrubber is one scrubber with the rules and the secrets of
// every session whose scrubber is cached (among them every session whose
// egress listener runs), for text no session can be told from, such as the
// standard library's log lines.
func (m *Manager) AllSessionsScrubber() *scrub.Set { return m.scrub.allSessions() }

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
	mu      sync.Mutex
	m       map[string]*scrub.Set        // by pk
	budget  map[string]*scrub.Budget     // by pk, sessions in m with a budget
	secrets map[string]map[string]string // by pk, sessions with secrets in m
	all     *scrub.Set                   // see allSessions; nil after secrets changed
}

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
	s.mu.Lock()
	defer s.mu.Unlock()
	if set, ok := s.m[pk]; ok {
		return set
	}
	set := s.withSecrets(secrets)
	if b := s.budgets.New(pk); b != nil {
		set = set.WithBudget(b)
		if s.budget == nil {
			s.budget = map[string]*scrub.Budget{}
		}
		s.budget[pk] = b
	}
	if len(secrets) > 0 {
		if s.secrets == nil {
			s.secrets = map[string]map[string]string{}
		}
		s.secrets[pk] = secrets
		s.all = nil
	}
	if s.m == nil {
		s.m = map[string]*scrub.Set{}
	}
	s.m[pk] = set
	return set
}

func (s *scrubbers) allSessions() *scrub.Set {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.all == nil {
		set := s.base
		for _, sec := range s.secrets {
			set, _ = set.WithValues(sec)
		}
		s.all = set
	}
	return s.all
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
	if b := s.budget[pk]; b != nil {
		b.Close() // its streams' waits end
		delete(s.budget, pk)
	}
	if _, ok := s.secrets[pk]; ok {
		delete(s.secrets, pk)
		s.all = nil
	}
	s.mu.Unlock()
}
