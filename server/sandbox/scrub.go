package sandbox

import (
	"context"
	"sync"
	"time"

	"sandboxd/streams/scrub"
)

// Scrubber is a session's scrubber: the rules plus the session's secrets
// (and their encodings), compiled once and cached until the session is
// deleted or its start fails.
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

// scrubbers caches each session's compiled scrubber.
type scrubbers struct {
	base    *scrub.Set
	mu      sync.Mutex
	m       map[string]*scrub.Set        // by pk
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
	if _, ok := s.secrets[pk]; ok {
		delete(s.secrets, pk)
		s.all = nil
	}
	s.mu.Unlock()
}
