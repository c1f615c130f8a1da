package sandbox

import (
	"context"
	"sort"
	"time"

	"sandboxd/store"
)

// Memory pressure: sizes are overcommitted (limits.memoryOvercommit), so
// the memory actually in use is what admission and the monitor watch.
// When the host's available memory falls below
// limits.pressureFreeMemoryMiB, each monitor round pauses the coldest
// running sessions (least recently used, idle for at least
// limits.pressureMinIdleSeconds, nothing running) with their memory, at
// most maxIdleActions at a time, instead of leaving the choice to the
// kernel's OOM killer. Such a session is paused with reason
// ReasonMemoryPressure and resumes on its next request (Command, Use).

// ReasonMemoryPressure is the status reason of a session the monitor
// paused to free memory.
const ReasonMemoryPressure = "memory_pressure"

// overcommit is limits.memoryOvercommit, at least 1.
func (m *Manager) overcommit() float64 { return max(m.lim.MemoryOvercommit, 1) }

// relievePressure pauses the coldest idle sessions among running while
// the host is short of memory. Called by the monitor's sweep.
func (m *Manager) relievePressure(ctx context.Context, running []*store.Session) {
	if m.lim.PressureFreeMemoryMiB <= 0 {
		return
	}
	avail := m.memAvailable()
	if avail < 0 || avail >= m.lim.PressureFreeMemoryMiB {
		return
	}
	now := m.now()
	minIdle := time.Duration(m.lim.PressureMinIdleSeconds) * time.Second
	type cold struct {
		pk   string
		last time.Time
	}
	var cands []cold
	m.mu.Lock()
	for _, ses := range running {
		if ses.Status != store.StatusRunning {
			continue
		}
		a := m.activity[ses.ID]
		if a == nil { // never used since the server started: idle from now
			m.activity[ses.ID] = &activity{last: now}
			continue
		}
		if a.running > 0 || now.Sub(a.last) < minIdle {
			continue
		}
		cands = append(cands, cold{ses.ID, a.last})
	}
	m.mu.Unlock()
	sort.Slice(cands, func(i, j int) bool { return cands[i].last.Before(cands[j].last) })
	m.log.Warn("memory pressure: pausing the coldest idle sandboxes", "availableMiB", avail,
		"pressureFreeMemoryMiB", m.lim.PressureFreeMemoryMiB, "candidates", len(cands))
	for _, c := range cands[:min(len(cands), maxIdleActions)] {
		m.actAsync(c.pk, m.pressurePauseLocked)
	}
}

// pressurePauseLocked pauses one session for memory pressure if it is
// still running and idle; a failed pause leaves it running.
func (m *Manager) pressurePauseLocked(ctx context.Context, pk string) {
	cur, err := m.db.GetSessionByID(ctx, pk)
	if err != nil || cur.Status != store.StatusRunning {
		return
	}
	m.mu.Lock()
	a := m.activity[pk]
	busy := a == nil || a.running > 0 || m.now().Sub(a.last) < time.Duration(m.lim.PressureMinIdleSeconds)*time.Second
	m.mu.Unlock()
	if busy {
		return
	}
	m.log.Info("memory pressure: pausing", "session", cur.SessionID)
	err = m.pauseLocked(ctx, &cur, ReasonMemoryPressure)
	m.auditSystem("sandbox.pressure_pause", &cur, map[string]any{"ok": err == nil})
	if err != nil {
		m.log.Error("memory pressure pause", "session", cur.SessionID, "err", err)
	}
}

// wake resumes a session the monitor paused for memory pressure, so the
// request that finds it paused goes on as if it had kept running. Other
// sessions are left as they are.
func (m *Manager) wake(ctx context.Context, ses *store.Session) error {
	if ses.Status != store.StatusPaused || ses.StatusReason != ReasonMemoryPressure {
		return nil
	}
	resumed, err := m.Resume(ctx, ses.OrgID, ses.SessionID)
	m.auditSystem("sandbox.pressure_resume", ses, map[string]any{"ok": err == nil})
	if err != nil {
		return err
	}
	*ses = resumed
	return nil
}
