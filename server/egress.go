package server

import (
	"context"
	"net"
	"sort"
	"time"

	"sandboxd/egress"
	"sandboxd/store"
)

// Egress is what the server needs from the egress proxy (egress.Proxy): one
// listener per running session, inside that sandbox's proxy namespace.
type Egress interface {
	ServeWithPolicy(l net.Listener, sessionID string, pol *egress.Policy, used, limit int64) error
	Close(sessionID string)
	Usage(sessionID string) (used, limit int64, ok bool)
	Destinations(sessionID string) map[string]egress.Dest
	Shutdown()
}

// startEgress opens the session's proxy listener and serves it. Called when
// a sandbox starts and, after a restart, for each sandbox still running.
func (s *Server) startEgress(ses *store.Session) error {
	l, err := s.rt.ListenProxy(ses.ContainerID)
	if err != nil {
		return err
	}
	go func() {
		// The project's own allowlist, if the operator gave it one.
		pol := s.egressPolicy.ForProject(ses.ProjectID)
		if err := s.egress.ServeWithPolicy(l, ses.ID, pol, ses.EgressBytesUsed, ses.EgressBytesLimit); err != nil {
			s.log.Debug("egress listener ended", "session", ses.SessionID, "err", err)
		}
	}()
	return nil
}

// stopEgress cuts the session's connections, closes its listener and takes
// its final byte count into ses (the caller saves ses), and records where
// the session's traffic went in the audit log.
func (s *Server) stopEgress(ses *store.Session) {
	s.liveEgress(ses)
	if dests := s.egress.Destinations(ses.ID); len(dests) > 0 {
		// Host names are the sandbox's choice: one may carry a secret.
		list := destinationList(dests)
		set := s.sessionScrubber(ses.ID)
		for i := range list {
			list[i].Host = string(set.Redact([]byte(list[i].Host)))
		}
		s.sb.auditSystem("egress.summary", ses, map[string]any{"destinations": list})
	}
	s.egress.Close(ses.ID)
}

// liveEgress refreshes ses's byte count from the proxy (the store lags by
// up to the monitor's period, 5 s, see persistEgress).
func (s *Server) liveEgress(ses *store.Session) {
	if used, _, ok := s.egress.Usage(ses.ID); ok && used > ses.EgressBytesUsed {
		ses.EgressBytesUsed = used
	}
}

// persistEgress writes a running session's byte count if it grew (from the
// monitor's sweep, at shutdown, and at teardown through the session row).
func (s *Server) persistEgress(ctx context.Context, ses *store.Session) {
	used, _, ok := s.egress.Usage(ses.ID)
	if !ok || used <= ses.EgressBytesUsed {
		return
	}
	if err := s.db.SetEgressUsed(ctx, ses.ID, used); err != nil {
		s.log.Error("persist egress usage", "session", ses.SessionID, "err", err)
		return
	}
	ses.EgressBytesUsed = used
}

// destination is one host a session reached, for usage and the audit view.
type destination struct {
	Host        string `json:"host"`
	Connections int64  `json:"connections"`
	BytesOut    int64  `json:"bytesOut"`
	BytesIn     int64  `json:"bytesIn"`
}

func destinationList(m map[string]egress.Dest) []destination {
	out := make([]destination, 0, len(m))
	for h, d := range m {
		out = append(out, destination{Host: h, Connections: d.Connections, BytesOut: d.BytesOut, BytesIn: d.BytesIn})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out
}

// egressEvents turns the proxy's denials and quota cuts into session
// events (denials are rate limited by the session log) and saves the byte
// count of a session that reached its quota.
type egressEvents struct{ s *Server }

func (e egressEvents) Denied(pk, host string, port int, reason string) {
	e.s.logs.Denied(pk, host, port, reason)
}

func (e egressEvents) QuotaExceeded(pk string, used, limit int64) {
	e.s.logs.Event(pk, "quota_exceeded", map[string]any{"bytesUsed": used, "bytesLimit": limit})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.s.db.SetEgressUsed(ctx, pk, used); err != nil {
		e.s.log.Error("persist egress usage", "err", err)
	}
}

// saveEgress persists every running session's byte count (at shutdown).
func (s *Server) saveEgress() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sessions, err := s.db.ListLiveSessions(ctx)
	if err != nil {
		return
	}
	for i := range sessions {
		s.persistEgress(ctx, &sessions[i])
	}
}
