package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/streams"
	"sandboxd/streams/scrub"
)

// Process is a process started in a sandbox (runsc.Process).
type Process = runsc.Process

const (
	terminalReplayBytes = 256 << 10
	viewerQueueChunks   = 256
	// scrubIdleFlush: a terminal quiet this long releases what the scrubber
	// held back that cannot be a secret (so prompts and echoes show).
	scrubIdleFlush = 30 * time.Millisecond
)

// terminal is one PTY in a sandbox. It outlives its WebSocket viewers:
// output is scrubbed once, kept in a replay ring and fanned out by a Hub.
type terminal struct {
	id, sessionPK, sessionID string
	proc                     Process
	hub                      *streams.Hub
	created                  time.Time
	stdinMu                  sync.Mutex
	done                     chan struct{} // closed when the process ended and output drained
	exit                     agent.Exit
	closeOnce                sync.Once
}

// terminals owns a server's PTYs.
type terminals struct {
	mu   sync.Mutex
	m    map[string]*terminal
	idle time.Duration // a terminal without viewers this long is closed
	stop chan struct{}
	wg   sync.WaitGroup
}

func newTerminals(idle time.Duration) *terminals {
	t := &terminals{m: map[string]*terminal{}, idle: idle, stop: make(chan struct{})}
	t.wg.Add(1)
	go t.reap()
	return t
}

func newTerminalID() string {
	var b [12]byte
	rand.Read(b[:])
	return "term_" + hex.EncodeToString(b[:])
}

// start wraps a started PTY process into a terminal and begins pumping its
// output through set into the hub.
func (ts *terminals) start(sessionPK, sessionID string, p Process, set *scrub.Set) *terminal {
	t := &terminal{id: newTerminalID(), sessionPK: sessionPK, sessionID: sessionID, proc: p,
		hub: streams.NewHub(terminalReplayBytes, viewerQueueChunks), created: time.Now(), done: make(chan struct{})}
	ts.mu.Lock()
	ts.m[t.id] = t
	ts.mu.Unlock()
	go t.pump(set)
	return t
}

// pump reads the PTY, scrubs and publishes. One goroutine writes the
// scrubber; a reader goroutine feeds it so that idle flushes need no lock.
func (t *terminal) pump(set *scrub.Set) {
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

func (t *terminal) writeStdin(p []byte) error {
	t.stdinMu.Lock()
	defer t.stdinMu.Unlock()
	in := t.proc.Stdin()
	if in == nil {
		return errors.New("no stdin")
	}
	_, err := in.Write(p)
	return err
}

// close kills the terminal's process group (closing the agent connection)
// and ends its viewers.
func (t *terminal) close() {
	t.closeOnce.Do(func() { t.proc.Close() })
}

func (ts *terminals) get(id string) *terminal {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.m[id]
}

// list returns a session's terminals.
func (ts *terminals) list(sessionPK string) []*terminal {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var out []*terminal
	for _, t := range ts.m {
		if t.sessionPK == sessionPK {
			out = append(out, t)
		}
	}
	return out
}

func (ts *terminals) count(sessionPK string) int { return len(ts.list(sessionPK)) }

func (ts *terminals) remove(t *terminal) {
	t.close()
	ts.mu.Lock()
	delete(ts.m, t.id)
	ts.mu.Unlock()
}

// closeSession ends every terminal of a session (teardown, delete, death).
func (ts *terminals) closeSession(sessionPK string) {
	for _, t := range ts.list(sessionPK) {
		ts.remove(t)
	}
}

// reap closes terminals that ended, and terminals nobody watched for idle.
func (ts *terminals) reap() {
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
		var drop []*terminal
		for _, t := range ts.m {
			n, since := t.hub.Viewers()
			select {
			case <-t.done:
				if n == 0 {
					drop = append(drop, t)
				}
				continue
			default:
			}
			if n == 0 && !since.IsZero() && time.Since(since) > ts.idle {
				drop = append(drop, t)
			}
		}
		ts.mu.Unlock()
		for _, t := range drop {
			ts.remove(t)
		}
	}
}

func (ts *terminals) shutdown() {
	close(ts.stop)
	ts.wg.Wait()
	ts.mu.Lock()
	all := make([]*terminal, 0, len(ts.m))
	for _, t := range ts.m {
		all = append(all, t)
	}
	ts.mu.Unlock()
	for _, t := range all {
		ts.remove(t)
	}
}

// startCtx bounds how long starting a process may take.
func startCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}
