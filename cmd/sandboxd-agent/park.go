package main

import (
	"errors"
	"net"
	"sync"
	"time"

	"sandboxd/runsc/agent"
)

// Suspend and re-attach (pause with memory). gVisor cannot checkpoint a
// sandbox while a socket is bound to a host file, so before a checkpoint
// the server sends the suspend op: the agent closes its listener and every
// client connection. The processes started by the closed connections are
// not killed: their sessions are parked, keeping the output they produce
// (bounded) until a client attaches again (op attach with the pid). After
// a restore, or after a checkpoint that failed, SIGUSR1 makes the agent
// listen again; sessions still parked parkTimeout later are killed, as
// their client is gone for good.

// parkTimeout is how long a parked session waits for its client after
// the agent listens again.
const parkTimeout = 60 * time.Second

// maxPending bounds the frames a parked session keeps; its output pumps
// then block, and so does the process once its pipe or PTY is full.
const maxPending = 1 << 20

var errSessionGone = errors.New("session gone")

// session is a started process and its current client connection, which
// suspend can take away and attach give back. mu guards every field.
type session struct {
	s     *server
	child *child
	mu    sync.Mutex
	cond  sync.Cond
	c     *conn  // nil while parked
	pend  []byte // frames written while parked
	// released is closed when the session lets go of the connection an
	// attach gave it, so that attach's handler may close it.
	released chan struct{}
	finished bool // the exit status was delivered (or could not be)
	expired  bool // parked too long: output dropped, process killed
}

func (s *server) newSession(c *conn, ch *child) *session {
	ss := &session{s: s, child: ch, c: c}
	ss.cond.L = &ss.mu
	s.smu.Lock()
	s.sessions[ch.pid] = ss
	s.smu.Unlock()
	return ss
}

func (s *server) dropSession(ss *session) {
	s.smu.Lock()
	if s.sessions[ss.child.pid] == ss {
		delete(s.sessions, ss.child.pid)
	}
	s.smu.Unlock()
}

// write sends one frame to the current client. While parked, or when the
// connection broke because of a suspend, the frame is kept for the next
// client. Any other failure is returned (the caller drops the output).
func (ss *session) write(frame []byte) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for {
		switch {
		case ss.expired || ss.finished:
			return errSessionGone
		case ss.c == nil:
			if len(ss.pend) > 0 && len(ss.pend)+len(frame) > maxPending {
				ss.cond.Wait()
				continue
			}
			ss.pend = append(ss.pend, frame...)
			return nil
		}
		c := ss.c
		err := c.writeRaw(frame)
		if err == nil {
			return nil
		}
		if !c.cut.Load() {
			return err
		}
		ss.parkLocked(c) // a partial frame on a dead connection is resent whole
	}
}

func (ss *session) writeJSON(typ byte, v any) error {
	b, err := jsonFrame(typ, v)
	if err != nil {
		return err
	}
	return ss.write(b)
}

// parkLocked forgets c (broken by a suspend) as the session's client.
func (ss *session) parkLocked(c *conn) {
	if ss.c != c {
		return
	}
	ss.c = nil
	c.nc.Close()
	if ss.released != nil {
		close(ss.released)
		ss.released = nil
	}
	ss.cond.Broadcast()
}

// park is parkLocked for the input goroutine, after its read failed. It
// reports whether the session waits for a new client (a suspend cut the
// connection) rather than ending (the client left). A cut is marked on the
// connection, so it is recognised however late the failure is seen (even
// after a restore).
func (ss *session) park(c *conn) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.finished || ss.expired || !c.cut.Load() {
		return false
	}
	ss.parkLocked(c)
	return true
}

// client waits while the session is parked and returns its connection,
// or nil once it finished or expired.
func (ss *session) client() *conn {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for ss.c == nil && !ss.finished && !ss.expired {
		ss.cond.Wait()
	}
	if ss.finished || ss.expired {
		return nil
	}
	return ss.c
}

// waitDelivered waits until the frames written so far reached a client,
// or the session expired.
func (ss *session) waitDelivered() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for ss.c == nil && !ss.expired {
		ss.cond.Wait()
	}
}

// finish ends the session: the current connection is closed (which ends
// the input goroutine) and a waiting attach handler returns.
func (ss *session) finish() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.finished = true
	if ss.c != nil {
		ss.c.nc.Close()
	}
	if ss.released != nil {
		close(ss.released)
		ss.released = nil
	}
	ss.cond.Broadcast()
}

// expire kills a session that stayed parked since the agent listened again.
func (ss *session) expire() {
	ss.mu.Lock()
	if ss.c != nil || ss.finished {
		ss.mu.Unlock()
		return
	}
	ss.expired = true
	ss.pend = nil
	ss.cond.Broadcast()
	ss.mu.Unlock()
	ss.s.reaper.killRunning(ss.child)
}

// serveAttach gives a session (by pid) the connection c: 'p' with the
// pid, the frames kept meanwhile, then the session goes on as if nothing
// happened. It returns when the session lets go of c.
func (s *server) serveAttach(c *conn, req *agent.Request) {
	s.smu.Lock()
	ss := s.sessions[req.Pid]
	s.smu.Unlock()
	if ss == nil {
		c.writeError("no such process")
		return
	}
	ss.mu.Lock()
	if ss.finished || ss.expired {
		ss.mu.Unlock()
		c.writeError("no such process")
		return
	}
	if old := ss.c; old != nil {
		// Still connected (the suspend never came): the new client takes
		// over; the old connection is cut as a suspend would.
		old.cut.Store(true)
		ss.parkLocked(old)
	}
	b, _ := jsonFrame(agent.FrameStarted, agent.Started{Pid: ss.child.pid})
	if err := c.writeRaw(append(b, ss.pend...)); err != nil {
		ss.mu.Unlock()
		return
	}
	ss.pend = nil
	ss.c = c
	released := make(chan struct{})
	ss.released = released
	ss.cond.Broadcast()
	ss.mu.Unlock()
	<-released
}

// suspend closes the listener and every connection but own. The socket
// file stays (gVisor saves it as a plain host file).
func (s *server) suspend(own *conn) {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	s.suspended = true
	if s.ln != nil {
		s.ln.Close()
		s.ln = nil
	}
	for c := range s.conns {
		if c != own {
			c.cut.Store(true)
			c.nc.Close()
		}
	}
}

// relisten listens again after a suspend (SIGUSR1; a no-op while
// listening) and schedules the expiry of sessions left parked.
func (s *server) relisten() {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	if s.ln != nil {
		return
	}
	ln, err := listen(s.socket)
	if err != nil {
		s.log.Error("listen again", "err", err)
		return
	}
	s.ln = ln
	s.suspended = false
	s.acceptWG.Add(1)
	go s.accept(ln)
	s.epoch++
	epoch := s.epoch
	time.AfterFunc(parkTimeout, func() { s.expireParked(epoch) })
}

// expireParked kills the sessions still parked, unless the agent was
// suspended again since (the next relisten schedules its own expiry).
func (s *server) expireParked(epoch int) {
	s.lnMu.Lock()
	stale := s.suspended || s.epoch != epoch
	s.lnMu.Unlock()
	if stale {
		return
	}
	s.expireParkedNow()
}

// expireParkedNow kills every session that is parked right now (op
// expire): the server re-attached those it knows, so the rest have no
// client any more (the server restarted while its sandbox was paused).
func (s *server) expireParkedNow() {
	s.smu.Lock()
	list := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		list = append(list, ss)
	}
	s.smu.Unlock()
	for _, ss := range list {
		ss.expire() // a no-op on a connected or finished session
	}
}

// accept serves one listener until it is closed (by suspend or shutdown).
func (s *server) accept(ln *net.UnixListener) {
	defer s.acceptWG.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.handle(c.(*net.UnixConn))
	}
}
