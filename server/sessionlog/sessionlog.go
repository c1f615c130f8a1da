// Package sessionlog owns each session's log: its gVisor kernel log (the
// sandbox kernel's own warnings and unsupported-syscall reports, read from
// runsc's boot log) and the server's events about it (process start/exit,
// oom, exit, lifecycle, egress denials), each a JSON object whose strings
// are scrubbed before it is encoded (so every entry parses, whatever the
// secrets), kept in a bounded ring and streamed to subscribers. Sessions
// are keyed by their store primary key (pk).
//
// Events are also persisted (EventStore.AppendEvent: asynchronous, batched,
// drained when the store closes, at most store.EventsKept per session); the
// first use of a session's log in a process loads them into the ring before
// any other entry, so a restart keeps them too. Kernel lines are re-read
// from the file after a restart, after the persisted events.
//
// Concurrency: a Logs is safe for concurrent use. A session's mutex guards
// its ring and subscribers, and adding never blocks on a subscriber (a slow
// one loses entries) nor on the database (persisting is an enqueue that
// waits only while the store's buffer is full). Service alone may wait
// before adding: for the session's scrubbing budget (its caller reads a
// service's output). Each kernel-log tailer is a
// goroutine owned by Logs: StopTail, Forget and Close end it, and Close
// waits for all of them.
package sessionlog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"sandboxd/store"
	"sandboxd/streams/scrub"
)

const (
	// Retain is how many entries a session keeps in memory.
	Retain        = 2000
	subQueue      = 512
	kernelPoll    = 250 * time.Millisecond
	maxKernelLine = 2048
	// Egress denials: at most deniedRate a second after a burst of
	// deniedBurst per session.
	deniedRate  = 5
	deniedBurst = 20
)

// EventStore persists events (store.DB).
type EventStore interface {
	LastEvents(ctx context.Context, pk string, n int) ([]store.Event, error)
	AppendEvent(pk string, entry []byte)
}

// Logs holds the logs of all sessions of a server.
type Logs struct {
	db       EventStore
	scrubber func(pk string) (*scrub.Set, error)
	dataDir  string // replaced by <data-dir> in kernel lines
	log      *slog.Logger
	now      func() time.Time

	mu     sync.Mutex
	m      map[string]*session
	closed bool
	tails  sync.WaitGroup
}

type session struct {
	load    sync.Once // persisted events into entries, before any add
	mu      sync.Mutex
	entries [][]byte // JSON
	subs    map[chan []byte]struct{}
	tail    context.CancelFunc // the kernel-log tailer, if one runs
	denied  *rate.Limiter
	// suppressed counts denials dropped by the limiter since the last one
	// logged.
	suppressed int
}

// New returns the logs of a server: db persists events, scrubber gives a
// session's scrubber, dataDir is hidden from kernel lines.
func New(db EventStore, scrubber func(pk string) (*scrub.Set, error), dataDir string, log *slog.Logger) *Logs {
	return &Logs{db: db, scrubber: scrubber, dataDir: dataDir, log: log, now: time.Now, m: map[string]*session{}}
}

// get returns a session's log, having loaded its persisted events on first
// use. Everything that reads or adds entries goes through it.
func (l *Logs) get(pk string) *session {
	l.mu.Lock()
	sl := l.m[pk]
	if sl == nil {
		sl = &session{subs: map[chan []byte]struct{}{}}
		l.m[pk] = sl
	}
	l.mu.Unlock()
	sl.load.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		evs, err := l.db.LastEvents(ctx, pk, Retain)
		if err != nil {
			l.log.Warn("load session events", "session", pk, "err", err)
			return
		}
		old := make([][]byte, 0, len(evs))
		for _, e := range evs {
			old = append(old, e.Entry)
		}
		sl.mu.Lock()
		sl.entries = append(old, sl.entries...) // empty: nothing adds before the load
		if n := len(sl.entries); n > Retain {
			sl.entries = sl.entries[n-Retain:]
		}
		sl.mu.Unlock()
	})
	return sl
}

func (sl *session) add(b []byte) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if len(sl.entries) >= Retain {
		sl.entries = append(sl.entries[:0], sl.entries[len(sl.entries)-Retain+1:]...)
	}
	sl.entries = append(sl.entries, b)
	for ch := range sl.subs {
		select {
		case ch <- b:
		default: // a slow subscriber loses entries, never blocks the log
		}
	}
}

// Entry is one log entry before it is encoded.
type Entry map[string]any

// Event records a server event for a session (kind: process_start,
// process_exit, oom, exit, ...). Fields are scrubbed with the session's
// scrubber.
func (l *Logs) Event(pk, kind string, fields map[string]any) {
	e := Entry{"type": "event", "time": l.now().UTC().Format(time.RFC3339Nano), "kind": kind}
	for k, v := range fields {
		e[k] = v
	}
	l.add(pk, e)
}

// Service records a line a portal service (editor, notebook, ...) printed.
// Lines are scrubbed and kept in the ring, not persisted: a service's
// chatter would push the session's events out of the store. The caller
// reads the service's output a line at a time: Service first waits while
// the session's scrubbing is over its CPU budget (scrub.Budget), so that
// a service printing rule keywords waits in its pipe.
func (l *Logs) Service(pk, name, line string) {
	if set, err := l.scrubber(pk); err == nil {
		set.WaitBudget()
	}
	l.add(pk, Entry{"type": "service", "time": l.now().UTC().Format(time.RFC3339Nano), "service": name, "line": line})
}

// Add records an entry as it is (tests and the kernel-log tailer), its
// strings scrubbed before it is encoded: scrubbing the encoded line would
// also redact a secret that matches JSON syntax (`"time":"`) and leave the
// line unparsable.
func (l *Logs) add(pk string, e Entry) {
	set, err := l.scrubber(pk)
	if err != nil { // fail closed: an entry is never kept unredacted
		l.log.Warn("session log entry dropped: the session's secrets cannot be read to redact it", "session", pk, "err", err)
		return
	}
	b, err := json.Marshal(redactValue(set, map[string]any(e)))
	if err != nil {
		return
	}
	l.get(pk).add(b)
	if e["type"] == "event" {
		l.db.AppendEvent(pk, b)
	}
}

// redactValue returns v with every string in it (map keys too, nested
// maps and slices included) scrubbed. A value of another type is
// scrubbed as its JSON decodes (a struct's fields, a Stringer's text).
func redactValue(set *scrub.Set, v any) any {
	switch v := v.(type) {
	case nil, bool, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64, json.Number:
		return v
	case string:
		return set.RedactString(v)
	case []string:
		out := make([]string, len(v))
		for i, s := range v {
			out[i] = set.RedactString(s)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = redactValue(set, x)
		}
		return out
	case map[string]string:
		out := make(map[string]string, len(v))
		for k, s := range v {
			out[set.RedactString(k)] = set.RedactString(s)
		}
		return out
	case Entry:
		return redactValue(set, map[string]any(v))
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[set.RedactString(k)] = redactValue(set, x)
		}
		return out
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var g any
	if d.Decode(&g) != nil {
		return nil
	}
	return redactValue(set, g)
}

// Denied records that the egress proxy refused a connection of a session
// (an egress_denied event), at most deniedRate a second after a burst: a
// loop of refused requests must not flood the log. The number suppressed
// is reported with the next one that passes.
func (l *Logs) Denied(pk, host string, port int, reason string) {
	sl := l.get(pk)
	sl.mu.Lock()
	if sl.denied == nil {
		sl.denied = rate.NewLimiter(deniedRate, deniedBurst)
	}
	if !sl.denied.AllowN(l.now(), 1) {
		sl.suppressed++
		sl.mu.Unlock()
		return
	}
	suppressed := sl.suppressed
	sl.suppressed = 0
	sl.mu.Unlock()
	fields := map[string]any{"host": host, "port": port, "reason": reason}
	if suppressed > 0 {
		fields["suppressedBefore"] = suppressed
	}
	l.Event(pk, "egress_denied", fields)
}

// Entries returns a copy of a session's retained entries.
func (l *Logs) Entries(pk string) [][]byte {
	sl := l.get(pk)
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return append([][]byte(nil), sl.entries...)
}

// Subscribe returns a session's retained entries and a channel of the
// entries added after them; cancel ends the subscription.
func (l *Logs) Subscribe(pk string) (history [][]byte, live <-chan []byte, cancel func()) {
	sl := l.get(pk)
	sl.mu.Lock()
	defer sl.mu.Unlock()
	ch := make(chan []byte, subQueue)
	sl.subs[ch] = struct{}{}
	return append([][]byte(nil), sl.entries...), ch, func() {
		sl.mu.Lock()
		delete(sl.subs, ch)
		sl.mu.Unlock()
	}
}

// StartTail follows a running session's kernel log at path (replacing a
// tailer already running for it).
func (l *Logs) StartTail(pk, path string) {
	sl := l.get(pk) // persisted events before the re-read kernel lines
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	sl.mu.Lock()
	if sl.tail != nil {
		sl.tail()
	}
	ctx, cancel := context.WithCancel(context.Background())
	sl.tail = cancel
	sl.mu.Unlock()
	l.tails.Add(1)
	go func() {
		defer l.tails.Done()
		l.tailKernel(ctx, pk, path)
	}()
}

// StopTail stops following a session's kernel log (the entries stay).
func (l *Logs) StopTail(pk string) {
	l.mu.Lock()
	sl := l.m[pk]
	l.mu.Unlock()
	if sl == nil {
		return
	}
	sl.mu.Lock()
	if sl.tail != nil {
		sl.tail()
		sl.tail = nil
	}
	sl.mu.Unlock()
}

// Forget stops a session's tailer and drops its entries from memory (the
// session was deleted; its persisted events stay with the store).
func (l *Logs) Forget(pk string) {
	l.StopTail(pk)
	l.mu.Lock()
	delete(l.m, pk)
	l.mu.Unlock()
}

// Close stops every tailer and waits for them to end.
func (l *Logs) Close() {
	l.mu.Lock()
	l.closed = true
	var tails []context.CancelFunc
	for _, sl := range l.m {
		sl.mu.Lock()
		if sl.tail != nil {
			tails = append(tails, sl.tail)
			sl.tail = nil
		}
		sl.mu.Unlock()
	}
	l.mu.Unlock()
	for _, cancel := range tails {
		cancel()
	}
	l.tails.Wait()
}

// glog line: "W1129 10:43:41.552138       1 vfs.go:1209] message"
var glogRe = regexp.MustCompile(`^([IWEF])\d{4} [\d:.]+\s+\d+ ([\w.]+):\d+\] (.*)$`)

// kernelLine decides whether a runsc boot log line is shown, and how.
// Shown: warnings and errors, and unsupported-syscall reports, after boot;
// host paths are replaced.
func (l *Logs) kernelLine(line string, booted *bool) (string, bool) {
	m := glogRe.FindStringSubmatch(line)
	if m == nil {
		return "", false
	}
	level, file, msg := m[1], m[2], m[3]
	if !*booted {
		if strings.Contains(msg, "Process should have started") {
			*booted = true
		}
		return "", false
	}
	if level == "I" && file != "compat.go" {
		return "", false
	}
	msg = strings.ReplaceAll(msg, l.dataDir, "<data-dir>")
	if len(msg) > maxKernelLine {
		msg = msg[:maxKernelLine]
	}
	return level + " " + msg, true
}

// tailKernel follows a session's kernel log until ctx ends.
func (l *Logs) tailKernel(ctx context.Context, pk, path string) {
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	booted := false
	var partial []byte
	buf := make([]byte, 64<<10)
	t := time.NewTicker(kernelPoll)
	defer t.Stop()
	drain := func() {
		if f == nil {
			f, _ = os.Open(path)
		}
		if f == nil {
			return
		}
		for {
			n, err := f.Read(buf)
			if n > 0 {
				data := append(partial, buf[:n]...)
				lines := bytes.Split(data, []byte("\n"))
				partial = append([]byte(nil), lines[len(lines)-1]...)
				if len(partial) > 64<<10 {
					partial = nil
				}
				for _, ln := range lines[:len(lines)-1] {
					if msg, ok := l.kernelLine(string(ln), &booted); ok {
						l.add(pk, Entry{"type": "kernel", "time": l.now().UTC().Format(time.RFC3339Nano), "line": msg})
					}
				}
			}
			if err != nil || n == 0 {
				return
			}
		}
	}
	for {
		drain()
		select {
		case <-ctx.Done():
			drain() // what the sandbox wrote since the last poll
			return
		case <-t.C:
		}
	}
}
