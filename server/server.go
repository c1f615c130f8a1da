// Package server is sandboxd's HTTP edge and composition root: the Gin
// routes and middleware (request id -> client address limits -> body
// limit -> auth -> token limits -> audit -> permission -> handler), one
// handler file per resource, the WebSocket upgrades, openapi.json, and the
// one map from error classes to HTTP (statusOf). New wires the domain (server/sandbox), the processes
// (server/procs), workspaces, session logs, the egress proxy, the store and
// the runsc driver; Close stops them in a named order.
//
// Concurrency: handlers run concurrently; the Server's fields are set in
// New and read-only afterwards (fileIO and stdLogClock are test knobs). All
// session state and its locking live in the packages it wires.
package server

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/sys/unix"

	"sandboxd/egress"
	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/runsc/image"
	"sandboxd/server/config"
	"sandboxd/server/credits"
	"sandboxd/server/errdefs"
	"sandboxd/server/portal"
	"sandboxd/server/procs"
	"sandboxd/server/sandbox"
	"sandboxd/server/sessionlog"
	"sandboxd/server/workspace"
	"sandboxd/store"
	"sandboxd/store/objects"
	"sandboxd/streams/scrub"
	"sandboxd/web"
)

// Runtime is the gVisor driver as the server wires it: the Manager's part
// (lifecycle, commands) and what the edge starts processes and opens
// workspaces with.
type Runtime interface {
	sandbox.Runtime
	procs.Starter
	StartDirect(ctx context.Context, id string, s agent.Spec) (runsc.Process, error)
	portal.Dialer
	KernelLog(id string) string
	ReleaseIdle()
	CheckpointDir(id string) string // where a pause's image lives
}

var _ Runtime = (*runsc.Runtime)(nil)

// Server is one sandboxd instance: the HTTP edge and what it is wired to.
type Server struct {
	cfg      *config.Config
	db       *store.DB
	rt       Runtime
	log      *slog.Logger
	gitRoots *x509.CertPool // what the Git host's API must chain to
	engine   *gin.Engine
	sessions *sandbox.Manager
	met      *metrics
	terms    *procs.Terminals
	contexts procs.Contexts // code contexts (Python, Node.js)
	tix      *tickets
	console  *web.Console // the browser console (web/)
	logs     *sessionlog.Logs
	files    *workspace.Files
	egress   *egress.Proxy
	portal   *portal.Portal
	keys     *portal.Keyring // signs portal cookies
	roles    roleCache       // tokens' roles, for portal requests
	opens    proxyOpens      // API clients' portal opens, for the audit log
	mcp      *mcpEdge        // the MCP endpoint (mcp.go)
	fair     *fairness       // per-client request limits (fair.go)
	// fileIO bounds a file transfer (ns; defaultFileIO, tests shorten it).
	fileIO atomic.Int64
	// stdLogClock is the clock of the standard library log's rate limit.
	stdLogClock func() time.Time
	// wsGuard is how often an open WebSocket's access is checked (ns;
	// guardEvery, tests shorten it).
	wsGuard atomic.Int64
	// bodyIO and writeIdle bound slow clients (ns; bodyTimeout and
	// writeStall, slowclients.go; tests shorten them).
	bodyIO, writeIdle atomic.Int64

	// closers run in order on Close.
	closers   []closer
	closeOnce sync.Once
	closeErr  error
}

// closer is one named step of Close.
type closer struct {
	name string
	fn   func() error
}

func (s *Server) onClose(name string, fn func() error) {
	s.closers = append(s.closers, closer{name, fn})
}

// BinDir is the directory of the running executable (runsc and the agent
// are looked up next to it).
func BinDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "."
	}
	return filepath.Dir(exe)
}

// Binaries are the runsc and agent binaries cfg names; by default they are
// next to the running executable.
func Binaries(cfg *config.Config) (runscBin, agent string) {
	runscBin, agent = cfg.Runsc.Binary, cfg.Runsc.Agent
	if runscBin == "" {
		runscBin = filepath.Join(BinDir(), "runsc")
	}
	if agent == "" {
		agent = filepath.Join(BinDir(), "sandboxd-agent")
	}
	return runscBin, agent
}

// RaiseFileLimit raises the process's open-file limit as far as the
// kernel allows (fs.nr_open, at most 1<<20), as the systemd unit's
// LimitNOFILE does: each sandbox takes descriptors in the server (agent
// and proxy connections, logs, disks), and the egress proxy's budget is a
// share of this limit (egress.ConnLimits). Raising a hard limit needs
// root; otherwise the soft one goes up to the hard one (as Go does).
func RaiseFileLimit() {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) != nil {
		return
	}
	want := uint64(1 << 20)
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			want = min(want, n)
		}
	}
	if rl.Cur >= want {
		return
	}
	if unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: want, Max: max(want, rl.Max)}) != nil {
		unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: rl.Max, Max: rl.Max})
	}
}

// RuntimeConfig is the driver's configuration for cfg: runsc and the
// agent from the config or next to the running binary, the data dir as its
// state dir and the data dir's resource prefix (config.ResourcePrefix).
func RuntimeConfig(cfg *config.Config, log *slog.Logger) runsc.Config {
	bin, agent := Binaries(cfg)
	return runsc.Config{
		Binary:            bin,
		StateDir:          cfg.DataDir,
		Agent:             agent,
		Prefix:            config.ResourcePrefix(cfg.DataDir),
		Platform:          cfg.Runsc.Platform,
		Debug:             cfg.Runsc.Debug,
		RestoreBackground: cfg.Runsc.RestoreBackground,
		// Written by newServer before any sandbox starts.
		TrustBundle: config.TrustBundlePath(cfg.DataDir),
		Logger:      log,
	}
}

// New opens the store, makes sure the image exists and prepares the runtime.
// out receives what an operator must see (first start's owner token, image
// build progress).
func New(ctx context.Context, cfg *config.Config, out io.Writer) (*Server, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("server", cfg.Listen)
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if st, err := os.Stat(cfg.DataDir); err == nil && st.Mode().Perm()&0o002 != 0 {
		// Any user could swap its directories, sockets or key.
		return nil, fmt.Errorf("data dir %s is writable by every user (mode %o): chmod 700 it (sandboxd doctor checks it)", cfg.DataDir, st.Mode().Perm())
	}
	// One server per data dir: a second one would reconcile (and undo)
	// the first one's sandboxes.
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	db, err := store.Open(config.DBPath(cfg.DataDir))
	if err != nil {
		lock.Close()
		return nil, err
	}
	db.OnError = func(err error) { log.Error("store", "err", err) }
	ok := false
	defer func() {
		if !ok {
			db.Close()
			lock.Close()
		}
	}()
	if cfg.Clock != nil {
		db.Now = cfg.Clock
	}
	// The secrets key must open before the first start makes its owner
	// (newServer loads it for use).
	if _, err := store.LoadKeyring(cfg.DataDir, os.Getenv("SANDBOXD_SECRETS_KEY")); err != nil {
		return nil, err
	}
	if err := bootstrap(ctx, db, cfg.DataDir, cfg.Plans.FirstOrg, out); err != nil {
		return nil, err
	}
	recipe, err := cfg.ImageRecipe()
	if err != nil {
		return nil, err
	}
	if cfg.Image.AutoBuild {
		fmt.Fprintf(out, "image: %s (building if missing; the first build takes a few minutes)\n", recipe.Key())
	}
	img, err := image.Ensure(ctx, cfg.Image.CacheDir, recipe, cfg.Image.AutoBuild, out)
	var imageErr error
	switch {
	case errors.Is(err, image.ErrMissing):
		return nil, fmt.Errorf("default image %s is missing: run `make image` (or start without --no-image-build)", recipe.Key())
	case err != nil && ctx.Err() != nil:
		return nil, err
	case err != nil:
		// The build failed (a bad package, an unreachable mirror): the
		// server still serves what needs no new sandbox (sessions that
		// run, files, logs, audit, accounts); starts answer 503 until an
		// operator fixes the recipe and restarts it.
		log.Error("image build failed: sandboxes cannot start until it is fixed and the server restarted", "image", recipe.Key(), "err", err)
		fmt.Fprintf(out, "image: the build of %s failed (%v); serving without it: sandboxes cannot start\n", recipe.Key(), err)
		imageErr = errdefs.Unavailable("this server has no sandbox image: its build failed (the server's log says why), so no sandbox can start until an operator fixes it and restarts the server; nothing was changed")
	}
	rt, err := runsc.New(RuntimeConfig(cfg, log))
	if err != nil {
		return nil, err
	}
	s, err := newServer(cfg, db, rt, img, imageErr, log)
	if err != nil {
		return nil, err
	}
	s.onClose("data dir lock", lock.Close)
	ok = true
	return s, nil
}

// newServer builds the server; imageErr (img empty) says why there is no
// image to start sandboxes from.
func newServer(cfg *config.Config, db *store.DB, rt Runtime, img string, imageErr error, log *slog.Logger) (*Server, error) {
	pol, err := egress.NewPolicy(cfg.Egress)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	// Secrets at rest are sealed with a key kept outside the database;
	// rows from before that are sealed now.
	keys, err := store.LoadKeyring(cfg.DataDir, os.Getenv("SANDBOXD_SECRETS_KEY"))
	if err != nil {
		return nil, err
	}
	db.SetKeyring(keys)
	if n, err := db.Reseal(context.Background()); err != nil {
		return nil, err
	} else if n > 0 {
		log.Info("sealed secrets stored in plaintext before", "values", n)
	}
	rules := loadScrubber()
	s := &Server{cfg: cfg, db: db, rt: rt, met: newMetrics(db, cfg.DataDir), log: slog.New(scrubHandler{log.Handler(), rules})}
	s.met.reg.MustRegister(redactions{rules})
	s.fileIO.Store(int64(defaultFileIO))
	s.stdLogClock = time.Now
	s.wsGuard.Store(int64(guardEvery))
	s.bodyIO.Store(int64(bodyTimeout))
	s.writeIdle.Store(int64(writeStall))
	s.tix = newTickets()
	s.console = web.New()
	s.files = workspace.New(runsc.UserUID, runsc.UserGID)
	s.terms = procs.NewTerminals(time.Duration(cfg.Limits.TerminalIdleSeconds)*time.Second, s.log.With("component", "terminals"))
	// The session log scrubs with the sessions' scrubbers, which the
	// Manager (made below, before any entry) owns.
	// A closure: s.sessions is made after the logs.
	s.logs = sessionlog.New(db, func(pk string) (*scrub.Set, error) { return s.sessions.Scrubber(pk) }, cfg.DataDir, s.log.With("component", "sessionlog"))
	// Every session's connection cap fits in the proxy's budget, so no
	// organization can take the connections another's sandboxes are due.
	perSession, total, fits := egress.ConnLimits(cfg.Limits.MaxSandboxes)
	if !fits {
		s.log.Warn("open-file limit too low for limits.maxSandboxes: the egress proxy's connections cannot give every sandbox its own 16 (each still has a cap, but all of them at once could use up the proxy's); raise it (ulimit -n 1048576, as the systemd unit's LimitNOFILE) or lower limits.maxSandboxes",
			"maxSandboxes", cfg.Limits.MaxSandboxes, "proxyConnections", total)
	}
	ca, roots, gitHost, err := gitSetup(cfg, img)
	if err != nil {
		return nil, err
	}
	s.gitRoots = roots
	s.egress = egress.New(pol, egress.Options{Events: sandbox.EgressEvents(s.logs, db, s.log), Registerer: s.met.reg,
		Resolver: cfg.EgressResolver, Logger: s.log.With("component", "egress"), MaxConnsPerSession: perSession,
		MaxConns: total, OnUsage: db.NoteEgressUsed, CA: ca, GitRoots: roots})
	// Teardown saves sessions to their organization's storage when the
	// driver can pack disks (the real one; API tests' fake cannot).
	opts := sandbox.Options{
		Limits: cfg.Limits, DataDir: cfg.DataDir, Image: img, ImageErr: imageErr, Runtime: rt, Store: db, Egress: s.egress,
		Policy: pol, Events: s.logs, Hooks: sessionHooks{s}, Rules: rules, Git: gitHost, Log: s.log,
		Plans: cfg.Plans, Sizes: cfg.Sizes, Now: cfg.Clock,
		OnDrawn:    func(c credits.Milli) { s.met.credits.Add(c.Credits()) },
		OnSweep:    func(d time.Duration) { s.met.monitorRound.Observe(d.Seconds()) },
		OnDiskStop: s.met.diskStops.Inc,
	}
	if disks, ok := rt.(sandbox.Disks); ok {
		if opts.Storage, err = objects.NewDir(config.StorageDir(cfg.DataDir)); err != nil {
			return nil, err
		}
		opts.Disks, opts.StorageQuota = disks, cfg.Storage.OrgQuotaMiB<<20
	}
	s.sessions = sandbox.New(opts)
	s.met.registerScrubBudget(s.sessions.ScrubStats)
	s.met.registerSecretsMemory(s.sessions.ScrubMemory)
	if s.keys, err = portal.LoadKey(filepath.Join(cfg.DataDir, "portal.key")); err != nil {
		return nil, err
	}
	s.roles.m, s.opens.last = map[string]roleEntry{}, map[string]time.Time{}
	if cfg.Portal.Scheme == "http" && cfg.Portal.Domain != "localhost" {
		s.log.Warn("portal.scheme is http on a real domain: browsers send no Fetch Metadata to insecure origins, " +
			"so a page of one sandbox can make blind GET requests with another session's portal cookie; serve the portal over https (docs/SECURITY.md)")
	}
	s.portal = portal.New(portal.Options{
		Dialer: rt, Starter: rt, Log: s.logs,
		FrameAncestors: cfg.Portal.FrameAncestors,
		ServiceIdle:    time.Duration(cfg.Portal.ServiceIdleSeconds) * time.Second,
	})
	s.newMCP()
	s.newFairness()
	s.engine = s.routes()
	// Close in this order: no new lifecycle work, then what runs in
	// sessions, then the proxy (ending every tunnel, so bytes in flight
	// are counted before the counts are saved), then the store (draining
	// its writers: audit, events, usage).
	s.onClose("mcp sessions", func() error { s.mcp.closeAll(5 * time.Second); return nil })
	s.onClose("monitor", func() error { s.sessions.Close(); return nil })
	s.onClose("terminals", func() error { s.terms.Close(); return nil })
	s.onClose("portal", func() error { s.portal.Close(); return nil })
	s.onClose("code contexts", func() error { s.contexts.CloseSession(""); return nil })
	s.onClose("session logs", func() error { s.logs.Close(); return nil })
	s.onClose("egress proxy", func() error { s.egress.Shutdown(); return nil })
	s.onClose("egress usage", func() error { s.sessions.SaveEgress(); return nil })
	s.onClose("store", db.Close)
	s.onClose("runtime", func() error { rt.ReleaseIdle(); return nil })
	return s, nil
}

// sessionHooks connect what runs in a session to its lifecycle.
type sessionHooks struct{ s *Server }

func (h sessionHooks) Started(ses *store.Session) {
	h.s.logs.StartTail(ses.ID, h.s.rt.KernelLog(ses.ContainerID))
}

func (h sessionHooks) Stopped(pk string) {
	h.s.terms.CloseSession(pk)
	h.s.contexts.CloseSession(pk)
	h.s.portal.StopSession(pk)
	h.s.logs.StopTail(pk)
}

// Paused: terminals and code contexts keep their processes (the driver
// parks and re-attaches them), code runs in flight are interrupted and
// answered; sockets into the sandbox (viewers, the
// portal's services and pooled connections) and the log tail let go.
func (h sessionHooks) Paused(pk string) {
	h.s.contexts.Pause(pk) // runs in flight answer (SessionPaused) first
	h.s.terms.Pause(pk)
	h.s.portal.StopSession(pk)
	h.s.logs.StopTail(pk)
}

func (h sessionHooks) Resumed(ses *store.Session) {
	h.s.terms.Resume(ses.ID)
	h.s.logs.StartTail(ses.ID, h.s.rt.KernelLog(ses.ContainerID))
}

func (h sessionHooks) Deleted(pk string) {
	h.s.logs.Forget(pk)
	h.s.files.Forget(pk)
}

// bootstrap creates the first organization and owner on an empty data dir,
// prints the owner token once and writes it to owner.token (0600).
func bootstrap(ctx context.Context, db *store.DB, dataDir, plan string, out io.Writer) error {
	p, token, created, err := db.Bootstrap(ctx, "default", "owner", plan)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if err := db.SetFirstOrgPlan(ctx, plan); err != nil {
		return err
	}
	if !created {
		return nil
	}
	path := filepath.Join(dataDir, "owner.token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("write owner token: %w", err)
	}
	fmt.Fprintf(out, "first start: created organization %q (%s) with an owner.\n", p.Org.Name, p.Org.ID)
	fmt.Fprintf(out, "owner token (shown once, also in %s, mode 0600):\n\n    %s\n\n", path, token)
	return nil
}

// Handler is the HTTP handler of the API and of the sessions' portal
// origins, told apart by the Host header.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.Host) > portal.MaxHost {
			http.Error(w, "Host header too long", http.StatusBadRequest)
			return
		}
		defer s.limitBody(w, r)()
		if key, ok := s.portalHost(r.Host); ok {
			s.servePortal(w, r, key)
			return
		}
		s.engine.ServeHTTP(w, r)
	})
}

// Start reconciles the store with the running sandboxes and starts the
// background monitor.
func (s *Server) Start(ctx context.Context) error {
	if err := s.sessions.Reconcile(ctx); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	s.sessions.StartMonitor()
	return nil
}

// Close stops background work and flushes the store (the audit log is
// written completely), running the closers in order; it keeps going after
// a failed one. Sandboxes keep running. Safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		for _, c := range s.closers {
			if err := c.fn(); err != nil {
				s.log.Error("close", "step", c.name, "err", err)
				errs = append(errs, fmt.Errorf("close %s: %w", c.name, err))
			}
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// lockDataDir takes an exclusive lock on <dir>/sandboxd.lock, held until
// the file is closed (or the process ends).
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "sandboxd.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another sandboxd", dir)
		}
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	return f, nil
}

// Run serves until ctx is done, then shuts down gracefully.
func Run(ctx context.Context, cfg *config.Config, out io.Writer) error {
	RaiseFileLimit()
	s, err := New(ctx, cfg, out)
	if err != nil {
		return err
	}
	// The standard library's own log lines (net/http's: the egress proxy's
	// upstream transports may quote upstream bytes) pass the scrubber and a
	// rate limit from the first sandbox on.
	defer s.captureStdLog()()
	// Bind before reconciling: a busy address fails before anything is
	// touched.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		s.Close()
		return err
	}
	if err := s.Start(ctx); err != nil {
		ln.Close()
		s.Close()
		return err
	}
	hs, capped := s.apiServer(ln)
	fmt.Fprintf(out, "sandboxd listening on http://%s (data dir %s)\n", ln.Addr(), cfg.DataDir)
	fmt.Fprintf(out, "web console: http://%s/ (sign in with a token)\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(capped) }()
	select {
	case <-ctx.Done():
	case err := <-errc:
		s.Close()
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		// Connections still open after the grace time are cut.
		s.log.Warn("shutdown: API connections cut", "err", err)
	}
	fmt.Fprintln(out, "sandboxd stopped; sandboxes keep running and are picked up at the next start")
	return s.Close()
}

func newRequestID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
