package sandbox

import (
	"context"
	"sort"
	"time"

	"sandboxd/store"
)

// Disk pressure: a sandbox's disk is a sparse image on the data dir's file
// system, so sandboxes that each stay within their size can together fill
// it, and with it the database, saves and every other sandbox. The disk
// watcher (a goroutine of the monitor) reads the data dir's free space
// every second. Below limits.pressureFreeDiskMiB, counting as used what
// sandboxes wrote that is still in the host's page cache on its way to
// their images (runsc.DiskUse.Pending: a writer has a GiB or more on its
// way, and it lands whatever is stopped), it stops the running sandbox
// whose disk grew the most since the space fell below the floor (host
// bytes and pending; at least diskMinGrowth), one a second, or below
// limits.minFreeDiskMiB every sandbox that grew that much.
//
// Growth, not size: stopping a sandbox frees nothing (its disk is kept), it
// only ends its writes, so the one to stop is the one writing; a big disk
// that does not grow costs nothing more. A session whose disk shrinks
// (files deleted: the disks are mounted with discard) is never picked.
//
// The stop is a teardown without a save and without a push, the sandbox
// frozen first so its writes end at once: a save would copy the disk into
// storage, on this same file system in the default layout, using the
// space that is short; the disk kept on the node is the newest state and
// a resume starts from it, as after any stop without a save (the next
// teardown saves, and pushes a paired branch's commits). The session is
// stopped with reason ReasonDiskPressure, a "disk_pressure" event and a
// sandbox.disk_pressure_stop audit record. A resume is refused only below
// limits.minFreeDiskMiB, so a user can resume to delete files.

// ReasonDiskPressure is the status reason of a session the disk watcher
// stopped.
const ReasonDiskPressure = "disk_pressure"

const (
	// diskWatchEvery is how often the disk watcher reads the free space.
	diskWatchEvery = time.Second
	// diskMinGrowth is the least a disk must have grown below the floor
	// to be stopped: logs and shell history are not what fills a host.
	diskMinGrowth = 64 << 20
	// maxDiskStops bounds the disk pressure stops running at once.
	maxDiskStops = 4
)

// diskWatch is the disk watcher's state; only its goroutine uses it.
type diskWatch struct {
	// base holds, by pk, what each running session's disk took (host and
	// pending bytes) when the watcher first saw it below the floor; nil
	// while the space is above it.
	base map[string]int64
}

// diskSample is a running session's disk as the watcher sees it.
type diskSample struct {
	pk    string
	bytes int64 // host bytes and pending
	grew  int64 // since its base
}

// diskVictims picks the sessions to stop among samples: the one whose
// disk grew the most (at least diskMinGrowth; of equals, the biggest),
// or in an emergency every one that grew that much, most first.
func diskVictims(samples []diskSample, emergency bool) []diskSample {
	var out []diskSample
	for _, s := range samples {
		if s.grew >= diskMinGrowth {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].grew != out[j].grew {
			return out[i].grew > out[j].grew
		}
		return out[i].bytes > out[j].bytes
	})
	if !emergency && len(out) > 1 {
		out = out[:1]
	}
	return out
}

// startDiskWatch runs the disk watcher until Close.
func (m *Manager) startDiskWatch() {
	if m.lim.PressureFreeDiskMiB <= 0 {
		return
	}
	m.every(diskWatchEvery, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		m.watchDisk(ctx)
	})
}

// watchDisk is one look of the disk watcher: while the data dir's free
// space, less what is on its way there, is below the floor, the session
// whose disk grew the most is stopped (off the watcher, like the
// monitor's other actions).
func (m *Manager) watchDisk(ctx context.Context) {
	floor := int64(m.lim.PressureFreeDiskMiB) << 20
	free := m.dataFree()
	if floor <= 0 || free < 0 {
		return
	}
	// What the page cache holds for every file system bounds what the
	// sandboxes have on its way: above the floor even with all of it,
	// nothing more is read.
	if dirty := m.hostDirty(); dirty >= 0 && free-dirty >= floor {
		m.diskCalm(free)
		return
	}
	sessions, err := m.db.ListLiveSessions(ctx)
	if err != nil {
		m.log.Warn("disk watcher: list sessions", "err", err)
		return
	}
	m.mu.Lock()
	busy := make(map[string]bool, len(m.diskBusy))
	for pk := range m.diskBusy {
		busy[pk] = true
	}
	m.mu.Unlock()
	var pending int64
	samples := make([]diskSample, 0, len(sessions))
	for i := range sessions {
		ses := &sessions[i]
		// A stopping sandbox's pending writes land too (as its disk is
		// unmounted); only running ones are stopped.
		u := m.rt.DiskUse(ses.ContainerID)
		pending += u.Pending
		if ses.Status == store.StatusRunning && !busy[ses.ID] {
			samples = append(samples, diskSample{pk: ses.ID, bytes: u.Host + u.Pending})
		}
	}
	left := free - pending
	if left >= floor {
		m.diskCalm(left)
		return
	}
	if m.disk.base == nil {
		m.disk.base = map[string]int64{}
		m.log.Warn("disk pressure: the data dir's file system is below limits.pressureFreeDiskMiB; sandboxes whose disks grow are stopped",
			"freeMiB", free>>20, "pendingMiB", pending>>20, "pressureFreeDiskMiB", m.lim.PressureFreeDiskMiB)
	}
	seen := make(map[string]bool, len(samples))
	for i := range samples {
		s := &samples[i]
		seen[s.pk] = true
		b, ok := m.disk.base[s.pk]
		if !ok {
			m.disk.base[s.pk] = s.bytes // growth counts from now
			continue
		}
		s.grew = s.bytes - b
	}
	for pk := range m.disk.base {
		if !seen[pk] && !busy[pk] {
			delete(m.disk.base, pk) // stopped: a resume starts afresh
		}
	}
	for _, v := range diskVictims(samples, left>>20 < int64(m.lim.MinFreeDiskMiB)) {
		m.actIn(&m.diskBusy, maxDiskStops, v.pk, func(ctx context.Context, pk string) {
			m.diskStopLocked(ctx, pk, v, left)
		})
	}
}

// diskCalm records that the data dir is above the floor again.
func (m *Manager) diskCalm(free int64) {
	if m.disk.base != nil {
		m.disk.base = nil
		m.log.Info("disk pressure: over", "freeMiB", free>>20, "pressureFreeDiskMiB", m.lim.PressureFreeDiskMiB)
	}
}

// diskStopLocked stops a running session for disk pressure: frozen at
// once, then torn down without a save or a push, its disk kept. left is
// the free space the watcher saw, less what was on its way.
func (m *Manager) diskStopLocked(ctx context.Context, pk string, s diskSample, left int64) {
	cur, err := m.db.GetSessionByID(ctx, pk)
	if err != nil || cur.Status != store.StatusRunning {
		return
	}
	m.log.Warn("disk pressure: stopping the sandbox whose disk grew the most", "session", cur.SessionID,
		"grewMiB", s.grew>>20, "diskMiB", s.bytes>>20, "freeMiB", left>>20)
	t0 := time.Now()
	if m.disks != nil {
		if err := m.disks.Freeze(ctx, cur.ContainerID); err != nil {
			m.log.Warn("disk pressure: freeze", "session", cur.SessionID, "err", err)
		}
	}
	cur.StatusReason = ReasonDiskPressure // what the stopped session says until it runs again
	_, err = m.stopSessionLocked(ctx, &cur, false, false)
	// ms: what the pending writes took to land is most of it.
	fields := map[string]any{"diskBytes": s.bytes, "grewBytes": s.grew, "freeBytes": max(left, 0), "ms": time.Since(t0).Milliseconds(),
		"pressureFreeDiskMiB": m.lim.PressureFreeDiskMiB, "saved": false, "stopped": err == nil && cur.Status == store.StatusStopped}
	outcome := "ok"
	if err != nil {
		m.log.Error("disk pressure stop", "session", cur.SessionID, "err", err)
		outcome = "error"
		// Still running as far as the database knows (the stop failed
		// before it began): it runs on, and the next look tries again.
		if now, gerr := m.db.GetSessionByID(ctx, pk); (gerr != nil || now.Status == store.StatusRunning) && m.disks != nil {
			if err := m.disks.Thaw(ctx, cur.ContainerID); err != nil {
				m.log.Warn("disk pressure: thaw", "session", cur.SessionID, "err", err)
			}
		}
	} else {
		m.onDiskStop()
	}
	m.events.Event(cur.ID, "disk_pressure", fields)
	m.auditSystemOutcome("sandbox.disk_pressure_stop", &cur, outcome, fields)
}
