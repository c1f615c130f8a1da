// Package procs owns the processes that outlive a request: terminals (PTYs
// whose output is scrubbed once into a replay Hub that WebSocket viewers
// attach to, closed by a reaper when nobody watches), exec streams (one
// command without a PTY, streamed to one WebSocket with backpressure) and
// code contexts (long-lived Python/Node interpreters that keep state between
// runs). It starts nothing itself: processes come from the driver
// (runsc.Runtime's Start/StartDirect) as runsc.Process values, so fakes can
// stand in for them in tests.
//
// Sessions are keyed by their store primary key (pk).
//
// A session's scrubber may hold a pump or a run back while the session's
// scrubbing is over its CPU budget (scrub.Budget, in the scrubber's Write):
// the pump stops reading, so the output waits in the sandbox's pipe and
// nothing is dropped.
//
// Concurrency: Terminals and Contexts are safe for concurrent use. Every
// goroutine here has an owner that stops it: a terminal's pump ends with
// its process (Close kills it), the reaper with Terminals.Close, a socket's
// reader with its WSConn, and a context's frame readers with its process or
// its kill.
package procs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/streams"
	"sandboxd/streams/scrub"
)

const (
	terminalReplayBytes = 256 << 10
	viewerQueueChunks   = 256
	// scrubIdleFlush: a terminal quiet this long releases what the scrubber
	// held back that cannot be a secret (so prompts and echoes show).
	scrubIdleFlush = 30 * time.Millisecond
	// MaxTerminalsPerSession bounds a session's open terminals.
	MaxTerminalsPerSession = 16
)

// Terminal is one PTY in a sandbox. It outlives its WebSocket viewers:
// output is scrubbed once, kept in a replay ring and fanned out by a Hub.
type Terminal struct {
	ID        string
	PK        string // the session's
	Created   time.Time
	proc      runsc.Process
	hub       *streams.Hub
	stdinMu   sync.Mutex
	done      chan struct{} // closed when the process ended and output drained
	exit      agent.Exit
	closeOnce sync.Once
	// paused: its session is paused (the reaper leaves it alone); idle
	// time counts from resumed. Guarded by Terminals.mu.
	paused  bool
	resumed time.Time
}

// ErrPaused ends a terminal's viewers when its session is paused.
var ErrPaused = errors.New("session paused")

// Terminals owns a server's PTYs.
type Terminals struct {
	log  *slog.Logger
	mu   sync.Mutex
	m    map[string]*Terminal
	idle time.Duration // a terminal without viewers this long is closed
	stop chan struct{}
	wg   sync.WaitGroup
}

// NewTerminals starts the reaper, which closes terminals that ended and
// terminals nobody watched for idle.
func NewTerminals(idle time.Duration, log *slog.Logger) *Terminals {
	t := &Terminals{log: log, m: map[string]*Terminal{}, idle: idle, stop: make(chan struct{})}
	t.wg.Add(1)
	go t.reap()
	return t
}

func newTerminalID() string {
	var b [12]byte
	rand.Read(b[:])
	return "term_" + hex.EncodeToString(b[:])
}

// Start wraps a started PTY process into a terminal and begins pumping its
// output through set into the hub.
func (ts *Terminals) Start(pk string, p runsc.Process, set *scrub.Set) *Terminal {
	t := &Terminal{ID: newTerminalID(), PK: pk, proc: p,
		hub: streams.NewHub(terminalReplayBytes, viewerQueueChunks), Created: time.Now(), done: make(chan struct{})}
	ts.mu.Lock()
	ts.m[t.ID] = t
	ts.mu.Unlock()
	go t.pump(set)
	return t
}

// pump reads the PTY, scrubs and publishes until the process's output
// ends. One goroutine writes the scrubber; a reader goroutine (ending with
// the output) feeds it so that idle flushes need no lock.
func (t *Terminal) pump(set *scrub.Set) {
	w := set.NewWriter(t.hub)
	chunks := make(chan []byte, 16)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := t.proc.Stdout().Read(buf)
			if n > 0 {
				chunks <- buf[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	for {
		select {
		case c, ok := <-chunks:
			if !ok {
				w.Close()
				t.exit = killedExit(t.proc.Wait())
				t.hub.Close()
				close(t.done)
				return
			}
			w.Write(c)
			idle.Reset(scrubIdleFlush)
		case <-idle.C:
			w.Flush()
		}
	}
}

func (t *Terminal) writeStdin(p []byte) error {
	t.stdinMu.Lock()
	defer t.stdinMu.Unlock()
	in := t.proc.Stdin()
	if in == nil {
		return errors.New("no stdin")
	}
	_, err := in.Write(p)
	return err
}

// close kills the terminal's process group (closing its connection) and
// so ends its viewers.
func (t *Terminal) close() {
	t.closeOnce.Do(func() { t.proc.Close() })
}

// Running reports whether the terminal's process still runs.
func (t *Terminal) Running() bool {
	select {
	case <-t.done:
		return false
	default:
		return true
	}
}

// Viewers is the number of attached sockets.
func (t *Terminal) Viewers() int {
	n, _ := t.hub.Viewers()
	return n
}

// killedExit reports a process whose connection was closed before its
// exit status arrived (terminal closed, teardown) as killed.
func killedExit(e agent.Exit, err error) agent.Exit {
	if err != nil && e.Code == 0 && e.Signal == "" {
		return agent.Exit{Code: 137, Signal: "SIGKILL"}
	}
	return e
}

// Get returns a session's terminal by id (nil if there is none).
func (ts *Terminals) Get(pk, id string) *Terminal {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t := ts.m[id]; t != nil && t.PK == pk {
		return t
	}
	return nil
}

// List returns a session's terminals.
func (ts *Terminals) List(pk string) []*Terminal {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var out []*Terminal
	for _, t := range ts.m {
		if t.PK == pk {
			out = append(out, t)
		}
	}
	return out
}

// Remove closes a terminal and forgets it.
func (ts *Terminals) Remove(t *Terminal) {
	t.close()
	ts.mu.Lock()
	delete(ts.m, t.ID)
	ts.mu.Unlock()
}

// CloseSession ends every terminal of a session (teardown, delete, death).
func (ts *Terminals) CloseSession(pk string) {
	for _, t := range ts.List(pk) {
		ts.Remove(t)
	}
}

// Pause ends the viewers of a session's terminals (their sockets close with
// "paused") and keeps the terminals, whose processes the pause keeps, until
// Resume.
func (ts *Terminals) Pause(pk string) {
	for _, t := range ts.List(pk) {
		ts.mu.Lock()
		t.paused = true
		ts.mu.Unlock()
		t.hub.DropViewers(ErrPaused)
	}
}

// Resume lets a resumed session's terminals be reattached; their idle time
// starts again now.
func (ts *Terminals) Resume(pk string) {
	now := time.Now()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, t := range ts.m {
		if t.PK == pk {
			t.paused, t.resumed = false, now
		}
	}
}

// reap closes terminals that ended, and terminals nobody watched for idle.
func (ts *Terminals) reap() {
	defer ts.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ts.stop:
			return
		case <-tick.C:
		}
		ts.mu.Lock()
		var drop []*Terminal
		for _, t := range ts.m {
			n, since := t.hub.Viewers()
			if t.paused {
				continue
			}
			if since.Before(t.resumed) {
				since = t.resumed
			}
			if !t.Running() {
				if n == 0 {
					drop = append(drop, t)
				}
				continue
			}
			if n == 0 && !since.IsZero() && time.Since(since) > ts.idle {
				drop = append(drop, t)
			}
		}
		ts.mu.Unlock()
		for _, t := range drop {
			ts.Remove(t)
		}
	}
}

// Close stops the reaper and closes every terminal.
func (ts *Terminals) Close() {
	close(ts.stop)
	ts.wg.Wait()
	ts.mu.Lock()
	all := make([]*Terminal, 0, len(ts.m))
	for _, t := range ts.m {
		all = append(all, t)
	}
	ts.mu.Unlock()
	for _, t := range all {
		ts.Remove(t)
	}
}
