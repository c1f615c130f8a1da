// Package sandbox is sandboxd's domain: the Manager owns every session's
// lifecycle state machine (lifecycle.go), the per-session locks, the
// server's capacity, provisioning, resuming, teardown, delete and the
// marking of dead sandboxes with one undo stack, reconciliation at start,
// the monitor (dead sandboxes, idle timeouts, egress usage, running time
// and exhausted credits, memory pressure (pressure.go), and the data dir's
// free space (diskpressure.go)), plans and credits (credits.go), admission of
// commands and the idle activity they count as, the sessions' egress
// listeners and scrubbers, and usage credits as pure functions of time.
//
// It talks to the gVisor driver, the store and the egress proxy through the
// small interfaces below, and to the parts that react to a sandbox starting
// or stopping (processes, the session log) through Hooks. It knows nothing
// of HTTP: errors are errdefs classes with public messages, mapped to
// statuses by the edge (server.statusOf).
//
// Sessions: sessionId is the client's name of a session, unique in its
// organization; pk is the store's primary key (store.Session.ID); the
// container id is the driver's name of its sandbox.
//
// Concurrency: a Manager is safe for concurrent use. Each session has a
// lock that every method taking an org and a sessionId holds for the whole
// operation (never the caller's duty); methods and functions named
// ...Locked need it held. m.mu guards the lock table, capacity and activity
// and is never held while waiting for a session's lock or for I/O. The
// monitor is two goroutines (the sweep every 5 s, the disk watcher every
// second), started by StartMonitor and stopped by Close; the actions they
// start on sessions run in goroutines of their own (actIn), also waited
// for by Close.
package sandbox

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/egress"
	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/server/credits"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

// Runtime is what the Manager needs from the gVisor driver (runsc.Runtime).
type Runtime interface {
	ContainerID(orgID, sessionID string) string
	Create(ctx context.Context, sb runsc.Sandbox) error
	Destroy(ctx context.Context, id string, o runsc.DestroyOpts) error
	Inspect(ctx context.Context, id string) (runsc.State, error)
	Collect(ctx context.Context, keep map[string]bool) []string
	MoveDir(from, to string) error
	CleanExecFiles()
	OpenWorkspace(id string, readOnly bool) (dir *os.File, release func() error, err error)
	ListenProxy(id string) (net.Listener, error)
	Exec(ctx context.Context, id string, req runsc.ExecRequest) (runsc.ExecResult, error)
	KillAll(ctx context.Context, id string) (runsc.KillResult, error)
	CheckpointDir(id string) string
	Checkpoint(ctx context.Context, id, imageDir string, commit func(context.Context) error) error
	Restore(ctx context.Context, sb runsc.Sandbox, imageDir string) error
	AbandonParked(id string)
	Wake(id string) error
	Thaw(ctx context.Context, id string) error
	Usage(id string) (runsc.Usage, error)
	DiskUse(id string) runsc.DiskUse
}

// Store is what the Manager needs from the database (store.DB).
type Store interface {
	InsertSession(ctx context.Context, s *store.Session) error
	GetSession(ctx context.Context, orgID, sessionID string) (store.Session, error)
	GetSessionByID(ctx context.Context, pk string) (store.Session, error)
	GetSessionsByID(ctx context.Context, pks []string) (map[string]store.Session, error)
	ListSessions(ctx context.Context, orgID, status string) ([]store.Session, error)
	ListLiveSessions(ctx context.Context) ([]store.Session, error)
	ListSessionContainers(ctx context.Context) ([]store.SessionContainer, error)
	UpdateSession(ctx context.Context, s *store.Session) error
	DeleteSessionRow(ctx context.Context, pk string) error
	SetSecrets(ctx context.Context, pk string, secrets map[string]string) error
	Secrets(ctx context.Context, pk string) (map[string]string, error)
	SetEgressUsed(ctx context.Context, pk string, used int64) error
	SetSaved(ctx context.Context, pk string, sv store.Saved) error
	GetProject(ctx context.Context, orgID, projectID string) (store.Project, error)
	GitToken(ctx context.Context, userID string) (string, error)
	Audit(rec store.AuditRecord)
	// Plans and running time (credits.go).
	GetOrg(ctx context.Context, orgID string) (store.Org, store.OrgPlan, error)
	CreditsGranted(ctx context.Context, orgID string, from, to time.Time) (int64, error)
	Runs(ctx context.Context, orgID string, from, to time.Time) ([]store.Run, error)
	SessionRuns(ctx context.Context, orgID, sessionPK string) ([]store.Run, error)
	OpenRun(ctx context.Context, s *store.Session, t time.Time) error
	CloseRun(ctx context.Context, sessionPK string, end *time.Time) error
	CloseAllRuns(ctx context.Context) (int64, error)
	SeeRuns(ctx context.Context, sessionPKs []string, t time.Time) error
	OrgsWithOpenRuns(ctx context.Context) ([]string, error)
}

// Egress is what the Manager needs from the egress proxy (egress.Proxy):
// one listener per running session, inside that sandbox's proxy namespace.
type Egress interface {
	Start(l net.Listener, pk string, o egress.SessionOptions) error
	UpdateGit(pk string, g *egress.GitPairing)
	Close(pk string)
	Usage(pk string) (used, limit int64, ok bool)
	Destinations(pk string) map[string]egress.Dest
}

// Events receives a session's events (sessionlog.Logs).
type Events interface {
	Event(pk, kind string, fields map[string]any)
}

// Hooks are the parts that react to a session's sandbox starting and
// stopping: its processes, its log. Called with the session's lock held;
// they must not call back into the Manager.
type Hooks interface {
	// Started: the sandbox runs (after a provision, a resume, or found
	// running at start).
	Started(ses *store.Session)
	// Stopped: the sandbox is going away (teardown, death, delete); its
	// processes end.
	Stopped(pk string)
	// Deleted: the session is gone for good; per-session state is dropped.
	Deleted(pk string)
	// Paused: the sandbox is about to be checkpointed; its processes stay
	// (terminals and contexts survive), but viewers and connections into
	// it let go. Resumed follows a pause that failed, too.
	Paused(pk string)
	// Resumed: the sandbox runs again with the processes it had.
	Resumed(ses *store.Session)
}

// Options configure a Manager.
type Options struct {
	Limits  config.Limits
	DataDir string // its file system holds the sandboxes' disks
	Image   string // the root filesystem sandboxes start from
	// ImageErr (Image empty): there is no image, and every start answers
	// it (the build failed).
	ImageErr error
	Runtime  Runtime
	Store    Store
	Egress   Egress
	Policy   *egress.Policy // the allowlist (per project)
	Events   Events
	Hooks    Hooks
	// Rules is the scrubber's pattern set; each session's adds its secrets.
	Rules *scrub.Set
	// Git is the host paired repositories live on (zero: none).
	Git GitHost
	Log *slog.Logger
	// Now is the clock (tests set it); nil means time.Now().UTC().
	Now func() time.Time
	// Storage and Disks (both set) make teardown save sessions to their
	// organization's storage (storage.go); StorageQuota caps an
	// organization's saves in bytes (0: no cap).
	Storage      Storage
	Disks        Disks
	StorageQuota int64
	// Plans and Sizes enforce plans and credits (credits.go); an empty
	// plan table enforces nothing.
	Plans config.Plans
	Sizes config.Sizes
	// OnDrawn receives credits as running sessions draw them (metrics).
	OnDrawn func(credits.Milli)
	// OnSweep receives how long each monitor round took (metrics).
	OnSweep func(time.Duration)
	// MemAvailable reads the host's available memory in MiB (tests set
	// it); nil reads MemAvailable from /proc/meminfo.
	MemAvailable func() int
	// PidsFree reads how many process ids the host has free (tests set
	// it); nil reads HostPids.
	PidsFree func() int
	// DataFree reads the free bytes of the data dir's file system, -1 if
	// unknown (tests set it); nil: FreeBytes(DataDir).
	DataFree func() int64
	// HostDirty reads the bytes the host's page cache holds to write back
	// (tests set it); nil: HostDirtyBytes.
	HostDirty func() int64
	// OnDiskStop is called for each sandbox the disk watcher stops
	// (metrics).
	OnDiskStop func()
}

// Manager owns the lifecycle of sessions.
type Manager struct {
	lim    config.Limits
	data   string
	image  string
	noImg  error // Options.ImageErr
	rt     Runtime
	db     Store
	egress Egress
	policy *egress.Policy
	events Events
	hooks  Hooks
	scrub  *scrubbers
	git    GitHost
	log    *slog.Logger
	now    func() time.Time
	// memAvailable is the host's available memory (MiB), -1 if unknown.
	memAvailable func() int
	pidsFree     func() int // -1 if unknown
	dataFree     func() int64
	hostDirty    func() int64
	onDiskStop   func()

	storage Storage
	disks   Disks
	quota   int64

	plans   config.Plans
	sizes   config.Sizes
	onDrawn func(credits.Milli)
	onSweep func(time.Duration)

	mu    sync.Mutex
	locks map[string]*sessionLock // by pk; dropped when unused
	// live counts sandboxes provisioning or running; perOrg and memUsed
	// (MiB) are what they hold; memMax caps memUsed.
	live     int
	perOrg   map[string]int
	memUsed  int
	memMax   int
	activity map[string]*activity   // by pk: commands running, last use
	idleBusy map[string]bool        // by pk: a monitor's action in progress (actAsync)
	orgSaves map[string]*sync.Mutex // by org: held while one of its sessions saves
	seen     map[string]sighting    // by pk: when the monitor last saw a running session (credits.go)
	diskBusy map[string]bool        // by pk: a disk pressure stop in progress (diskpressure.go)

	// disk is the disk watcher's state, used by its goroutine only.
	disk diskWatch

	done chan struct{}
	wg   sync.WaitGroup
	// idleWG counts actAsync's actions (tests wait for them).
	idleWG sync.WaitGroup
}

// New returns a Manager; call Reconcile, then StartMonitor.
func New(o Options) *Manager {
	m := &Manager{lim: o.Limits, data: o.DataDir, image: o.Image, noImg: o.ImageErr, rt: o.Runtime, db: o.Store, egress: o.Egress,
		policy: o.Policy, events: o.Events, hooks: o.Hooks, log: o.Log, now: o.Now, git: o.Git,
		scrub: &scrubbers{base: o.Rules}, locks: map[string]*sessionLock{}, perOrg: map[string]int{},
		activity: map[string]*activity{}, done: make(chan struct{}),
		storage: o.Storage, disks: o.Disks, quota: o.StorageQuota, orgSaves: map[string]*sync.Mutex{},
		plans: o.Plans, sizes: o.Sizes, onDrawn: o.OnDrawn, onSweep: o.OnSweep, seen: map[string]sighting{}}
	if m.now == nil {
		m.now = func() time.Time { return time.Now().UTC() }
	}
	m.scrub.budgets = scrub.NewBudgets(scrub.BudgetConfig{Cores: o.Limits.ScrubCPUCores,
		Burst: time.Duration(o.Limits.ScrubCPUBurstMs) * time.Millisecond}, m.throttled)
	m.memAvailable = o.MemAvailable
	m.pidsFree = o.PidsFree
	m.dataFree, m.hostDirty, m.onDiskStop = o.DataFree, o.HostDirty, o.OnDiskStop
	if m.dataFree == nil {
		m.dataFree = func() int64 { return FreeBytes(m.data) }
	}
	if m.hostDirty == nil {
		m.hostDirty = HostDirtyBytes
	}
	if m.onDiskStop == nil {
		m.onDiskStop = func() {}
	}
	if m.pidsFree == nil {
		m.pidsFree = func() int {
			used, limit := HostPids()
			if used < 0 || limit < 0 {
				return -1
			}
			return limit - used
		}
	}
	if m.memAvailable == nil {
		m.memAvailable = MemAvailableMiB
	}
	m.scrub.memBudget = o.Limits.MaxSecretsMemoryMiB << 20
	if m.scrub.memBudget == 0 {
		m.scrub.memBudget = max(0, meminfoMiB("MemTotal:")/8) << 20
	}
	m.memMax = o.Limits.MaxMemoryMiB
	if m.memMax == 0 {
		m.memMax = meminfoMiB("MemTotal:") - 2048
	}
	return m
}

// HostPids reads the host's threads (each takes a process id:
// /proc/loadavg's running/total) and the most it allows (the smaller of
// kernel.pid_max and kernel.threads-max); -1 for what it cannot read.
func HostPids() (used, limit int) {
	used, limit = -1, -1
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 4 {
			if _, total, ok := strings.Cut(f[3], "/"); ok {
				if n, err := strconv.Atoi(total); err == nil {
					used = n
				}
			}
		}
	}
	for _, p := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && (limit < 0 || n < limit) {
			limit = n
		}
	}
	return used, limit
}

// MemAvailableMiB is the host's available memory (MemAvailable) in MiB;
// -1 if unreadable.
func MemAvailableMiB() int { return meminfoMiB("MemAvailable:") }

// HostDirtyBytes is what the host's page cache holds to write back, on
// every file system (Dirty and Writeback); -1 if unreadable.
func HostDirtyBytes() int64 {
	kb := meminfoKB("Dirty:", "Writeback:")
	if kb[0] < 0 || kb[1] < 0 {
		return -1
	}
	return (kb[0] + kb[1]) << 10
}

// FreeBytes is the space left for files on the file system of path
// (statfs's available blocks); -1 if unreadable.
func FreeBytes(path string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return -1
	}
	return int64(st.Bavail) * st.Bsize
}

// meminfoMiB reads one field of /proc/meminfo in MiB; -1 if unreadable.
func meminfoMiB(field string) int {
	kb := meminfoKB(field)[0]
	if kb < 0 {
		return -1
	}
	return int(kb / 1024)
}

// meminfoKB reads fields of /proc/meminfo in kB; -1 for each it cannot.
func meminfoKB(fields ...string) []int64 {
	out := make([]int64, len(fields))
	for i := range out {
		out[i] = -1
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		for i, field := range fields {
			if v, ok := strings.CutPrefix(line, field); ok {
				if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64); err == nil {
					out[i] = kb
				}
			}
		}
	}
	return out
}

// sessionLock is a session's lock; refs counts holders and waiters, so
// the table drops it when nobody needs it.
type sessionLock struct {
	mu   sync.Mutex
	refs int
}

func (m *Manager) lockRef(pk string) *sessionLock {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.locks[pk]
	if l == nil {
		l = &sessionLock{}
		m.locks[pk] = l
	}
	l.refs++
	return l
}

func (m *Manager) unref(pk string, l *sessionLock) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(m.locks, pk)
	}
}

// lock takes a session's lock and returns its release.
func (m *Manager) lock(pk string) func() {
	l := m.lockRef(pk)
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		m.unref(pk, l)
	}
}

// tryLock takes a session's lock only if it is free.
func (m *Manager) tryLock(pk string) (func(), bool) {
	l := m.lockRef(pk)
	if !l.mu.TryLock() {
		m.unref(pk, l)
		return nil, false
	}
	return func() {
		l.mu.Unlock()
		m.unref(pk, l)
	}, true
}

type activity struct {
	running int
	last    time.Time
}

// begin records that a command started in a session; the returned func
// records its end. ok is false (and nothing recorded) when max commands
// already run there (max 0: no limit).
func (m *Manager) begin(pk string, max int) (end func(), ok bool) {
	m.mu.Lock()
	a := m.activity[pk]
	if a == nil {
		a = &activity{}
		m.activity[pk] = a
	}
	if max > 0 && a.running >= max {
		m.mu.Unlock()
		return nil, false
	}
	a.running++
	a.last = m.now()
	m.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			a.running--
			a.last = m.now()
			m.mu.Unlock()
		})
	}, true
}

// idle reports whether a session has run nothing for longer than its idle
// timeout (0: never idle). Time without a record counts from first sight.
func (m *Manager) idle(ses *store.Session, now time.Time) bool {
	if ses.IdleTimeoutSeconds <= 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.activity[ses.ID]
	if a == nil {
		m.activity[ses.ID] = &activity{last: now}
		return false
	}
	return a.running == 0 && now.Sub(a.last) > time.Duration(ses.IdleTimeoutSeconds)*time.Second
}

// forgetActivity drops a session's idle record.
func (m *Manager) forgetActivity(pk string) {
	m.mu.Lock()
	delete(m.activity, pk)
	m.mu.Unlock()
}

// auditSystem records what the server did on its own (user "system").
func (m *Manager) auditSystem(action string, ses *store.Session, details map[string]any) {
	m.auditSystemOutcome(action, ses, "ok", details)
}

func (m *Manager) auditSystemOutcome(action string, ses *store.Session, outcome string, details map[string]any) {
	m.db.Audit(store.AuditRecord{
		Time: m.now(), OrgID: ses.OrgID, UserID: "system", Action: action,
		SessionID: ses.SessionID, Outcome: outcome, Details: details,
	})
}

// detached is a context for work that must finish once begun (a destroy, an
// undo) even if the caller's ends: it keeps ctx's values, not its
// cancellation, and is bounded by its own timeout.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
}

// undoStack runs registered undo steps in reverse order: every step of a
// start pushes its undo, and a failure runs them.
type undoStack []func()

func (u *undoStack) push(f func()) { *u = append(*u, f) }

func (u *undoStack) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
}
