package portal

import (
	"bufio"
	"context"
	"io"
	"sync"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
)

// Restart back-off of a crashed service.
const (
	restartMin = 500 * time.Millisecond
	restartMax = 30 * time.Second
	// stableAfter: a service that ran this long before it exited restarts
	// at once (back-off reset).
	stableAfter = time.Minute
	maxLogLine  = 2048
	// maxFailedStarts: a supervisor whose launcher could not be started
	// this many times in a row gives up.
	maxFailedStarts = 5
)

// Starter starts a process in a sandbox through its agent.
type Starter interface {
	Start(ctx context.Context, id string, s agent.Spec) (runsc.Process, error)
}

// Log receives what services print and what happens to them.
type Log interface {
	Event(pk, kind string, fields map[string]any)
	Service(pk, name, line string)
}

// Sandbox is the session a request was authorized for, as the portal
// needs it.
type Sandbox struct {
	PK          string // store key: logs and service state
	ContainerID string // runsc container
	// Env reads the environment commands get (services too: secrets
	// included); called only when a service starts, not per request.
	Env       func(context.Context) ([]string, error)
	MemoryMiB int // its size's memory limit
}

// running is one service of one session, supervised by its own goroutine.
type running struct {
	svc     *Service
	started time.Time
	stop    context.CancelFunc
	done    chan struct{}

	mu       sync.Mutex
	up       bool // the process is running (not necessarily listening yet)
	ready    bool // it accepted a connection since it last started
	active   int  // requests (WebSockets included) being proxied to it
	restarts int
	exitErr  string // how the last run ended, for the starting page
	lastUse  time.Time
}

func (r *running) status() (up bool, restarts int, last string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.up, r.restarts, r.exitErr
}

// ensure returns the session's service, starting its supervisor if it is
// not running.
func (p *Portal) ensure(sb Sandbox, svc *Service) *running {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.running[sb.PK]
	if m == nil {
		m = map[string]*running{}
		p.running[sb.PK] = m
	}
	if r := m[svc.Name]; r != nil {
		return r
	}
	ctx, cancel := context.WithCancel(p.ctx)
	r := &running{svc: svc, started: p.now(), stop: cancel, done: make(chan struct{}), lastUse: p.now()}
	m[svc.Name] = r
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(r.done)
		p.supervise(ctx, sb, r)
	}()
	return r
}

// supervise runs a service until ctx ends, restarting it with back-off
// when it exits.
func (p *Portal) supervise(ctx context.Context, sb Sandbox, r *running) {
	backoff := restartMin
	failed := 0 // starts in a row that failed
	for ctx.Err() == nil {
		p.log.Event(sb.PK, "service_start", map[string]any{"service": r.svc.Name})
		t0 := p.now()
		code, err := p.runOnce(ctx, sb, r)
		if ctx.Err() != nil {
			return
		}
		msg := "exited"
		fields := map[string]any{"service": r.svc.Name}
		if err != nil {
			msg = "could not start"
			fields["error"] = err.Error()
		} else {
			fields["exitCode"] = code
		}
		r.mu.Lock()
		r.up, r.ready, r.exitErr = false, false, msg
		r.restarts++
		r.mu.Unlock()
		p.log.Event(sb.PK, "service_exit", fields)
		if failed++; err == nil {
			failed = 0
		}
		if failed >= maxFailedStarts {
			// The sandbox is likely gone; a later request starts afresh.
			p.forget(sb.PK, r)
			return
		}
		if p.now().Sub(t0) > stableAfter {
			backoff = restartMin
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, restartMax)
	}
}

// runOnce starts the service's launcher as the sandbox user and copies its
// output to the session log until it exits or ctx ends.
func (p *Portal) runOnce(ctx context.Context, sb Sandbox, r *running) (int, error) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var env []string
	if sb.Env != nil {
		var err error
		if env, err = sb.Env(sctx); err != nil {
			return 0, err
		}
	}
	proc, err := p.starter.Start(sctx, sb.ContainerID, agent.Spec{
		Args: []string{r.svc.Command}, Env: env, Cwd: "/workspace",
		UID: runsc.UserUID, GID: runsc.UserGID,
	})
	if err != nil {
		return 0, err
	}
	defer proc.Close()
	r.mu.Lock()
	r.up = true
	r.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { proc.Close() })
	defer stop()
	var wg sync.WaitGroup
	for _, out := range []io.Reader{proc.Stdout(), proc.Stderr()} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.copyLines(sb.PK, r.svc.Name, out)
		}()
	}
	wg.Wait()
	exit, err := proc.Wait()
	if err != nil {
		return -1, nil
	}
	return exit.Code, nil
}

func (p *Portal) copyLines(pk, name string, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		if len(line) > maxLogLine {
			line = line[:maxLogLine]
		}
		p.log.Service(pk, name, line)
	}
	// A line longer than the buffer ends the scan: drain the rest so the
	// service never blocks on its output.
	io.Copy(io.Discard, r)
}

// forget removes r from the running services if it is still there.
func (p *Portal) forget(pk string, r *running) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running[pk][r.svc.Name] == r {
		delete(p.running[pk], r.svc.Name)
	}
}

// StopSession stops a session's services and waits for them; the sandbox
// stopped or is stopping.
func (p *Portal) StopSession(pk string) {
	p.mu.Lock()
	m := p.running[pk]
	delete(p.running, pk)
	p.mu.Unlock()
	for _, r := range m {
		r.stop()
	}
	for _, r := range m {
		<-r.done
	}
	p.transport.CloseIdleConnections()
}

// StopService stops one service of a session (idle, or asked to).
func (p *Portal) StopService(pk, name string) bool {
	p.mu.Lock()
	r := p.running[pk][name]
	if r != nil {
		delete(p.running[pk], name)
	}
	p.mu.Unlock()
	if r == nil {
		return false
	}
	r.stop()
	<-r.done
	p.log.Event(pk, "service_stop", map[string]any{"service": name})
	return true
}

// Running lists the services of a session that are started.
func (p *Portal) Running(pk string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, n := range ServiceNames {
		if p.running[pk][n] != nil {
			out = append(out, n)
		}
	}
	return out
}
