package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/runsc/agent"
)

// server owns the listener, the reaper and the warm pool. Each connection
// is served by its own goroutine (see handle); the goroutines a start
// request adds are owned by that handler and end before it returns.
type server struct {
	log    *slog.Logger
	reaper *reaper
	pool   *pool
	// pid1: killall uses kill(-1); otherwise (serve mode) it kills the
	// agent's descendants only.
	pid1 bool
	// killMu makes killall exclusive with starting processes, so nothing
	// started during a killall escapes it.
	killMu sync.RWMutex

	socket string
	// lnMu guards the listener and the suspend state (park.go).
	lnMu      sync.Mutex
	ln        *net.UnixListener // nil while suspended
	suspended bool
	epoch     int // times the agent listened again
	conns     map[*conn]struct{}
	acceptWG  sync.WaitGroup

	smu      sync.Mutex
	sessions map[int]*session // started processes by pid
}

// runServer serves the agent protocol on socket until SIGTERM or SIGINT.
// It returns the process exit code.
func runServer(socket string, serveMode bool) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).
		With("component", "agent")
	s := &server{log: log, reaper: newReaper(), pid1: !serveMode && os.Getpid() == 1,
		socket: socket, conns: map[*conn]struct{}{}, sessions: map[int]*session{}}
	s.pool = newPool(s)
	if !s.pid1 {
		// Orphans of the processes started here are re-parented to the
		// agent, as they would be to PID 1, so killall finds them.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			log.Warn("set child subreaper", "err", err)
		}
	}
	// User commands run with no_new_privs like runsc exec's processes; the
	// agent itself never needs to gain privileges.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		log.Warn("set no_new_privs", "err", err)
	}
	go s.reaper.run()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	ln, err := listen(socket)
	if err != nil {
		log.Error("listen", "err", err)
		if serveMode {
			return 1
		}
		// As init, keep the sandbox usable without the socket (runsc
		// exec still works): go on reaping until SIGTERM.
		for sig := range sigs {
			if sig != syscall.SIGUSR1 {
				return 0
			}
		}
	}
	s.ln = ln
	s.acceptWG.Add(1)
	go s.accept(ln)
	// SIGUSR1: listen again after a suspend (a restore, or a checkpoint
	// that failed); see park.go.
	for sig := range sigs {
		if sig != syscall.SIGUSR1 {
			break
		}
		s.relisten()
	}
	s.lnMu.Lock()
	if s.ln != nil {
		s.ln.Close()
		s.ln = nil
	}
	s.lnMu.Unlock()
	s.acceptWG.Wait()
	// Shutting down: as PID 1 the sandbox ends with us; in serve mode do
	// not leave the warm shells and commands behind.
	s.pool.configure(nil)
	if !s.pid1 {
		killDescendants(time.Now().Add(agent.DefaultKillWait))
	}
	return 0
}

// listen creates the socket with mode 0600 from the start.
func listen(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// conn is one client connection: handle's goroutine or the start
// request's input goroutine reads it; writes are serialized by wmu.
type conn struct {
	nc  *net.UnixConn
	br  *bufio.Reader
	wmu sync.Mutex
	// werr is set after the first failed write: later output is dropped.
	werr error
	// cut: closed by a suspend (its session parks instead of ending).
	cut atomic.Bool
}

func (c *conn) writeRaw(frame []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	_, err := c.nc.Write(frame)
	if err != nil {
		c.werr = err
	}
	return err
}

func (c *conn) writeJSON(typ byte, v any) error {
	b, err := jsonFrame(typ, v)
	if err != nil {
		return err
	}
	return c.writeRaw(b)
}

// jsonFrame encodes one frame with a JSON payload.
func jsonFrame(typ byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	frame := agent.AppendHeader(make([]byte, 0, 5+len(b)), typ, len(b))
	return append(frame, b...), nil
}

func (c *conn) writeError(msg string) {
	c.writeJSON(agent.FrameError, agent.ErrorMsg{Message: msg})
}

func (c *conn) writeOK() {
	c.writeJSON(agent.FrameExit, agent.ExitStatus{})
}

// startError is a failure reported to the client as an 'E' frame; msg is a
// fixed string safe to show (no argv, paths or env values).
type startError struct {
	msg string
	err error
}

func (e *startError) Error() string { return fmt.Sprintf("%s: %v", e.msg, e.err) }

func (s *server) handle(nc *net.UnixConn) {
	defer nc.Close()
	c := &conn{nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	s.lnMu.Lock()
	if s.suspended { // accepted just before a suspend
		s.lnMu.Unlock()
		return
	}
	s.conns[c] = struct{}{}
	s.lnMu.Unlock()
	defer func() {
		s.lnMu.Lock()
		delete(s.conns, c)
		s.lnMu.Unlock()
	}()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := agent.ReadRequestLine(c.br, agent.MaxRequest)
	if err != nil {
		return
	}
	nc.SetReadDeadline(time.Time{})
	var req agent.Request
	if err := json.Unmarshal(line, &req); err != nil {
		c.writeError("bad request")
		return
	}
	switch req.Op {
	case agent.OpPing:
		c.writeOK()
	case agent.OpStart:
		s.serveStart(c, &req)
	case agent.OpKillAll:
		c.writeJSON(agent.FrameExit, s.killAll(agent.KillWait(req.WaitMs)))
	case agent.OpWarm:
		s.serveWarm(c, &req)
	case agent.OpDial:
		serveDial(c, &req)
	case agent.OpSuspend:
		s.suspend(c)
		c.writeOK()
	case agent.OpAttach:
		s.serveAttach(c, &req)
	case agent.OpExpire:
		s.expireParkedNow()
		c.writeOK()
	case agent.OpStats:
		ws := s.pool.stats()
		c.writeJSON(agent.FrameExit, agent.Stats{
			Goroutines: runtime.NumGoroutine(), FDs: countFDs(), Warm: ws.ready,
			WarmFails: ws.fails, WarmRetryMs: ws.retryIn.Milliseconds(),
		})
	default:
		c.writeError("unknown op")
	}
}

func (s *server) serveWarm(c *conn, req *agent.Request) {
	if req.Count == nil || *req.Count < 0 || *req.Count > 16 {
		c.writeError("bad warm count")
		return
	}
	cfg := &warmConfig{
		env: req.Env, uid: uidOr(req.UID), gid: uidOr(req.GID), cwd: req.Cwd, count: *req.Count,
	}
	if cfg.cwd == "" {
		cfg.cwd = "/"
	}
	if err := s.pool.configureAndWait(cfg, 10*time.Second); err != nil {
		c.writeError(err.Error())
		return
	}
	c.writeOK()
}

// uidOr returns the requested id or the sandbox user's (1000).
func uidOr(id *uint32) uint32 {
	if id == nil {
		return 1000
	}
	return *id
}

// killAll SIGKILLs every other process until none is left or wait has
// passed, then restarts the warm shells. The survivors are counted before
// the warm shells come back.
func (s *server) killAll(wait time.Duration) agent.KillResult {
	s.killMu.Lock()
	defer s.killMu.Unlock()
	deadline := time.Now().Add(wait)
	if s.pid1 {
		// Before anything else: a fork bomb slows every step down
		// (discarding the warm shells took 0.9 s) until it is stopped.
		stopAndKillAll()
	}
	s.pool.pause()
	var res agent.KillResult
	if s.pid1 {
		res = killEveryone(deadline)
	} else {
		res = killDescendants(deadline)
	}
	s.pool.resume()
	return res
}

func countFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}
