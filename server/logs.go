package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/store"
	"sandboxd/streams"
)

// A session's log is its gVisor kernel's own output (warnings, unsupported
// syscalls) and the server's events about it (process start/exit, oom,
// exit, lifecycle), each a JSON object, scrubbed, kept in a bounded ring
// and streamed to subscribers. Kernel lines come from runsc's boot log of
// the sandbox and are re-read from that file after a restart. Events are
// also persisted (store.AppendEvent: asynchronous, batched, drained when the
// store closes, at most store.EventsKept per session); the first use of a
// session's log in a process (sessionLog) loads them into the ring before
// any other entry, so a restart keeps them too. Across a restart, the
// persisted events come first, then the re-read kernel lines.
//
// Concurrency: a sessionLog's mutex guards its ring and subscribers, and
// adding never blocks on a subscriber (a slow one loses entries). Adding
// does not wait for the database either: persisting is an enqueue (which
// waits only while the store's buffer is full), and the load runs once per
// session, outside the mutex, before its first entry.

const (
	logRetain     = 2000 // entries kept per session
	logSubQueue   = 512
	kernelPoll    = 250 * time.Millisecond
	maxKernelLine = 2048
)

type logEntry map[string]any

type sessionLog struct {
	load    sync.Once // persisted events into entries, before any add
	mu      sync.Mutex
	entries [][]byte // JSON
	subs    map[chan []byte]struct{}
	cancel  context.CancelFunc
}

type logs struct {
	mu sync.Mutex
	m  map[string]*sessionLog // by session pk
}

func newLogs() *logs { return &logs{m: map[string]*sessionLog{}} }

func (l *logs) get(pk string) *sessionLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.m[pk]
	if sl == nil {
		sl = &sessionLog{subs: map[chan []byte]struct{}{}}
		l.m[pk] = sl
	}
	return sl
}

// sessionLog returns a session's log, having loaded its persisted events on
// first use. Everything that reads or adds entries goes through it.
func (s *Server) sessionLog(pk string) *sessionLog {
	sl := s.logs.get(pk)
	sl.load.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		evs, err := s.db.LastEvents(ctx, pk, logRetain)
		if err != nil {
			s.log.Warn("load session events", "session", pk, "err", err)
			return
		}
		old := make([][]byte, 0, len(evs))
		for _, e := range evs {
			old = append(old, e.Entry)
		}
		sl.mu.Lock()
		sl.entries = append(old, sl.entries...) // empty: nothing adds before the load
		if n := len(sl.entries); n > logRetain {
			sl.entries = sl.entries[n-logRetain:]
		}
		sl.mu.Unlock()
	})
	return sl
}

func (sl *sessionLog) add(b []byte) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if len(sl.entries) >= logRetain {
		sl.entries = append(sl.entries[:0], sl.entries[len(sl.entries)-logRetain+1:]...)
	}
	sl.entries = append(sl.entries, b)
	for ch := range sl.subs {
		select {
		case ch <- b:
		default: // a slow subscriber loses entries, never blocks the log
		}
	}
}

func (sl *sessionLog) subscribe() ([][]byte, chan []byte) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	ch := make(chan []byte, logSubQueue)
	sl.subs[ch] = struct{}{}
	return append([][]byte(nil), sl.entries...), ch
}

func (sl *sessionLog) unsubscribe(ch chan []byte) {
	sl.mu.Lock()
	delete(sl.subs, ch)
	sl.mu.Unlock()
}

// event records a server event for a session (kind: process_start,
// process_exit, oom, exit, ...). Fields are scrubbed with the session's
// scrubber.
func (s *Server) event(ses *store.Session, kind string, fields map[string]any) {
	e := logEntry{"type": "event", "time": time.Now().UTC().Format(time.RFC3339Nano), "kind": kind}
	for k, v := range fields {
		e[k] = v
	}
	s.addLog(ses, e)
}

func (s *Server) addLog(ses *store.Session, e logEntry) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	b = s.sessionScrubber(ses.ID).Redact(b)
	s.sessionLog(ses.ID).add(b)
	if e["type"] == "event" {
		s.db.AppendEvent(ses.ID, b)
	}
}

// glog line: "W1129 10:43:41.552138       1 vfs.go:1209] message"
var glogRe = regexp.MustCompile(`^([IWEF])\d{4} [\d:.]+\s+\d+ ([\w.]+):\d+\] (.*)$`)

// kernelLine decides whether a runsc boot log line is shown, and how.
// Shown: warnings and errors, and unsupported-syscall reports, after boot;
// host paths are replaced.
func (s *Server) kernelLine(line string, booted *bool) (string, bool) {
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
	msg = strings.ReplaceAll(msg, s.cfg.DataDir, "<data-dir>")
	if len(msg) > maxKernelLine {
		msg = msg[:maxKernelLine]
	}
	return level + " " + msg, true
}

// tailKernel follows a session's kernel log until ctx ends.
func (s *Server) tailKernel(ctx context.Context, ses store.Session, path string) {
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
					if msg, ok := s.kernelLine(string(ln), &booted); ok {
						s.addLog(&ses, logEntry{"type": "kernel", "time": time.Now().UTC().Format(time.RFC3339Nano), "line": msg})
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

// startKernelLog starts following a running session's kernel output.
func (s *Server) startKernelLog(ses *store.Session) {
	sl := s.sessionLog(ses.ID) // persisted events before the re-read kernel lines
	sl.mu.Lock()
	if sl.cancel != nil {
		sl.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	sl.cancel = cancel
	sl.mu.Unlock()
	go s.tailKernel(ctx, *ses, s.rt.KernelLog(ses.ContainerID))
}

// stopKernelLog stops following (the entries stay readable).
func (s *Server) stopKernelLog(pk string) {
	sl := s.logs.get(pk)
	sl.mu.Lock()
	if sl.cancel != nil {
		sl.cancel()
		sl.cancel = nil
	}
	sl.mu.Unlock()
}

// getLogs: GET /v1/sandbox/:sessionId/logs — the retained history, JSON lines.
func (s *Server) getLogs(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	sl := s.sessionLog(ses.ID)
	entries, ch := sl.subscribe()
	sl.unsubscribe(ch)
	c.Header("Content-Type", "application/x-ndjson")
	c.Status(http.StatusOK)
	w := bufio.NewWriter(c.Writer)
	for _, e := range entries {
		w.Write(e)
		w.WriteByte('\n')
	}
	w.Flush()
}

// logsWS: GET /v1/sandbox/:sessionId/logs/ws — history, then live entries.
func (s *Server) logsWS(c *gin.Context) {
	ses, ok := s.wsSession(c)
	if !ok {
		return
	}
	conn, err := s.upgrader().Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		return
	}
	s.met.wsConns.Inc()
	defer s.met.wsConns.Dec()
	w := streams.NewWSConn(conn, 4096)
	go w.Run()
	go func() { // the one reader: pongs and close
		defer w.Close()
		for {
			if _, _, err := w.Read(); err != nil {
				return
			}
		}
	}()
	sl := s.sessionLog(ses.ID)
	history, ch := sl.subscribe()
	defer sl.unsubscribe(ch)
	for _, e := range history {
		if !w.SendText(e) {
			return
		}
	}
	for {
		select {
		case e := <-ch:
			if !w.SendText(e) {
				return
			}
		case <-w.Done():
			return
		}
	}
}
