package sandbox

import (
	"context"
	"log/slog"
	"sort"
	"time"

	"sandboxd/egress"
	"sandboxd/store"
)

// startEgress opens the session's proxy listener (inside its sandbox's
// proxy namespace) and serves it with the project's allowlist. Called when
// a sandbox starts and, after a restart, for each sandbox still running.
func (m *Manager) startEgress(ses *store.Session) error {
	l, err := m.rt.ListenProxy(ses.ContainerID)
	if err != nil {
		return err
	}
	o := egress.SessionOptions{Policy: m.policy.ForProject(ses.ProjectID), Used: ses.EgressBytesUsed,
		Limit: ses.EgressBytesLimit, Git: m.pairing(ses)}
	// Registered before Start returns (so an undo's Close finds it); the
	// proxy owns the goroutine serving it until Close(pk).
	return m.egress.Start(l, ses.ID, o)
}

// stopEgress cuts the session's connections, closes its listener, takes
// its final byte count into ses (the caller saves ses) and records where
// the session's traffic went in the audit log.
func (m *Manager) stopEgress(ses *store.Session) {
	m.liveEgress(ses)
	if dests := m.egress.Destinations(ses.ID); len(dests) > 0 {
		// Host names are the sandbox's choice: one may carry a secret.
		list := destinationList(dests)
		set, err := m.Scrubber(ses.ID)
		for i := range list {
			if err != nil {
				list[i].Host = "[withheld]"
			} else {
				list[i].Host = set.RedactString(list[i].Host)
			}
		}
		m.auditSystem("egress.summary", ses, map[string]any{"destinations": list})
	}
	m.egress.Close(ses.ID)
	m.scrub.unpin(ses.ID) // it stops running: its scrubber may be evicted
}

// liveEgress refreshes ses's byte count from the proxy (the store lags by
// up to the monitor's period, see persistEgress).
func (m *Manager) liveEgress(ses *store.Session) {
	if used, _, ok := m.egress.Usage(ses.ID); ok && used > ses.EgressBytesUsed {
		ses.EgressBytesUsed = used
	}
}

// persistEgress writes a running session's byte count if it grew (from the
// monitor's sweep and at shutdown; teardown saves it with the row).
func (m *Manager) persistEgress(ctx context.Context, ses *store.Session) {
	used, _, ok := m.egress.Usage(ses.ID)
	if !ok || used <= ses.EgressBytesUsed {
		return
	}
	if err := m.db.SetEgressUsed(ctx, ses.ID, used); err != nil {
		m.log.Error("persist egress usage", "session", ses.SessionID, "err", err)
		return
	}
	ses.EgressBytesUsed = used
}

// SaveEgress persists every running session's byte count (at shutdown,
// after the proxy has ended its tunnels, so bytes in flight are counted).
func (m *Manager) SaveEgress() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sessions, err := m.db.ListLiveSessions(ctx)
	if err != nil {
		m.log.Error("save egress usage", "err", err)
		return
	}
	for i := range sessions {
		m.persistEgress(ctx, &sessions[i])
	}
}

// destination is one host a session reached, for the audit view.
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

// EgressLog is what the proxy's events go to (sessionlog.Logs).
type EgressLog interface {
	Events
	// Denied records a refused connection (rate limited by the log).
	Denied(pk, host string, port int, reason string)
}

// EgressEvents turns the proxy's denials and quota cuts (egress.Events)
// into session events, and saves the byte count of a session that reached
// its quota at once.
func EgressEvents(log EgressLog, db Store, l *slog.Logger) egress.Events {
	return egressEvents{log, db, l}
}

type egressEvents struct {
	log EgressLog
	db  Store
	l   *slog.Logger
}

func (e egressEvents) Denied(pk, host string, port int, reason string) {
	e.log.Denied(pk, host, port, reason)
}

func (e egressEvents) QuotaExceeded(pk string, used, limit int64) {
	e.log.Event(pk, "quota_exceeded", map[string]any{"bytesUsed": used, "bytesLimit": limit})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.db.SetEgressUsed(ctx, pk, used); err != nil {
		e.l.Error("persist egress usage", "err", err)
	}
}
