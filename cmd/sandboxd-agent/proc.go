package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/runsc/agent"
)

// defaultPath is used to find args[0] when the request's env has no PATH.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// proc is a started process and the agent's ends of its stdio.
type proc struct {
	child *child
	warm  bool
	stdin *os.File   // pipe write end, or the PTY master; nil: none
	outs  []*os.File // stdout and stderr read ends, or [PTY master]
	ptmx  *os.File   // PTY master, nil without tty
}

func (p *proc) closeFiles() {
	if p.stdin != nil {
		p.stdin.Close()
	}
	for _, f := range p.outs {
		f.Close()
	}
}

// spawn forks one child, excluded with killall.
func (s *server) spawn(fork func() (int, error)) (*child, error) {
	s.killMu.RLock()
	defer s.killMu.RUnlock()
	return s.reaper.spawn(fork)
}

func userAttr(uid, gid uint32) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Setsid:     true,
		Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{gid}},
	}
}

// serveStart runs a start request to its end: 'p', output, 'x'. The
// process's session survives a suspend (park.go): its frames then wait for
// the client to attach again.
func (s *server) serveStart(c *conn, req *agent.Request) {
	p, err := s.start(req)
	if err != nil {
		msg := "cannot start process"
		var se *startError
		if errors.As(err, &se) {
			msg = se.msg
		}
		c.writeError(msg)
		return
	}
	defer p.closeFiles()
	ss := s.newSession(c, p.child)
	defer s.dropSession(ss)
	ss.writeJSON(agent.FrameStarted, agent.Started{Pid: p.child.pid, Warm: p.warm})

	var pumps sync.WaitGroup
	types := []byte{agent.FrameStdout, agent.FrameStderr}
	for i, f := range p.outs {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			pump(ss, f, types[i])
		}()
	}
	inputDone := make(chan struct{})
	go func() {
		defer close(inputDone)
		s.input(ss, p)
	}()

	<-p.child.done
	deadline := time.Now().Add(agent.DrainGrace)
	for _, f := range p.outs {
		f.SetReadDeadline(deadline)
	}
	pumps.Wait()
	ss.writeJSON(agent.FrameExit, exitStatus(p.child.status))
	ss.waitDelivered()
	// End the input goroutine: it may be blocked on the connection or on
	// a stdin that a background child holds but does not read.
	ss.finish()
	if p.stdin != nil {
		p.stdin.Close()
	}
	<-inputDone
}

func exitStatus(ws syscall.WaitStatus) agent.ExitStatus {
	if ws.Signaled() {
		return agent.ExitStatus{ExitCode: 128 + int(ws.Signal()), Signal: unix.SignalName(ws.Signal())}
	}
	return agent.ExitStatus{ExitCode: ws.ExitStatus()}
}

// start starts the request's process: a warm shell if one fits, else cold.
func (s *server) start(req *agent.Request) (*proc, error) {
	if len(req.Args) == 0 || req.Args[0] == "" {
		return nil, &startError{msg: "no command"}
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if !filepath.IsAbs(cwd) {
		return nil, &startError{msg: "working directory is not absolute"}
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, &startError{msg: "working directory does not exist", err: err}
	}
	uid, gid := uidOr(req.UID), uidOr(req.GID)
	if !req.TTY {
		if cmd, ok := warmCommand(req.Args, req.Env); ok {
			if w := s.pool.take(uid, gid, req.Env, cwd); w != nil {
				p, err := w.run(req.Env, cwd, cmd, req.Stdin)
				if err == nil {
					return p, nil
				}
				s.pool.discard(w)
			}
		}
	}
	return s.startCold(req, uid, gid, cwd)
}

func (s *server) startCold(req *agent.Request, uid, gid uint32, cwd string) (_ *proc, err error) {
	path, err := lookPath(req.Args[0], req.Env, cwd)
	if err != nil {
		return nil, &startError{msg: "executable not found", err: err}
	}
	p := &proc{}
	var childFiles []*os.File
	defer func() {
		for _, f := range childFiles {
			f.Close()
		}
		if err != nil {
			p.closeFiles()
		}
	}()
	sys := userAttr(uid, gid)
	var fds []uintptr
	if req.TTY {
		ptmx, tty, err := openPTY(req.Cols, req.Rows)
		if err != nil {
			return nil, &startError{msg: "cannot allocate a terminal", err: err}
		}
		p.ptmx, p.stdin, p.outs = ptmx, ptmx, []*os.File{ptmx}
		childFiles = append(childFiles, tty)
		unix.Fchown(int(tty.Fd()), int(uid), int(gid))
		unix.Fchmod(int(tty.Fd()), 0o620)
		fds = []uintptr{tty.Fd(), tty.Fd(), tty.Fd()}
		sys.Setctty, sys.Ctty = true, 0
	} else {
		var in *os.File
		if req.Stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, &startError{msg: "cannot create pipes", err: err}
			}
			in, p.stdin = r, w
		} else if in, err = os.Open(os.DevNull); err != nil {
			return nil, &startError{msg: "cannot open /dev/null", err: err}
		}
		childFiles = append(childFiles, in)
		fds = append(fds, in.Fd())
		for range 2 {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, &startError{msg: "cannot create pipes", err: err}
			}
			p.outs = append(p.outs, r)
			childFiles = append(childFiles, w)
			fds = append(fds, w.Fd())
		}
	}
	attr := &syscall.ProcAttr{Dir: cwd, Env: req.Env, Files: fds, Sys: sys}
	if attr.Env == nil {
		attr.Env = []string{}
	}
	p.child, err = s.spawn(func() (int, error) { return syscall.ForkExec(path, req.Args, attr) })
	if err != nil {
		return nil, forkError(err)
	}
	return p, nil
}

func forkError(err error) error {
	var msg string
	switch {
	case errors.Is(err, syscall.EAGAIN):
		msg = "process limit reached"
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR):
		msg = "executable not found"
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		msg = "permission denied"
	case errors.Is(err, syscall.ENOEXEC):
		msg = "exec format error"
	case errors.Is(err, syscall.ENOMEM):
		msg = "out of memory"
	default:
		msg = "cannot start process"
	}
	return &startError{msg: msg, err: err}
}

// lookPath finds name like execvp, in the request's PATH. Names with a
// slash are left to execve (relative to cwd).
func lookPath(name string, env []string, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path, ok := lookupEnv(env, "PATH")
	if !ok {
		path = defaultPath
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", syscall.ENOENT
}

// openPTY opens a PTY pair. The master is non-blocking, so reads honour
// deadlines; the slave is for the child.
func openPTY(cols, rows uint16) (ptmx, tty *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	ptmx = os.NewFile(uintptr(fd), "/dev/ptmx")
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0)
	}
	if err == nil {
		err = setSize(fd, cols, rows)
	}
	if err != nil {
		ptmx.Close()
		return nil, nil, err
	}
	sfd, err := unix.Open("/dev/pts/"+strconv.FormatUint(uint64(n), 10), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		ptmx.Close()
		return nil, nil, err
	}
	return ptmx, os.NewFile(uintptr(sfd), "/dev/pts/"+strconv.FormatUint(uint64(n), 10)), nil
}

func setSize(fd int, cols, rows uint16) error {
	if cols == 0 {
		cols = 80
	}
	if rows == 0 {
		rows = 24
	}
	return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}

// pump forwards one output stream as frames until EOF (EIO for a PTY) or
// the drain deadline; at the deadline it takes what is already buffered
// without waiting. After a failed write it keeps reading and drops the
// data, so the process never blocks on a dead client.
func pump(ss *session, f *os.File, typ byte) {
	buf := make([]byte, 5+64<<10)
	send := func(n int) {
		agent.PutHeader(buf[:5+n], typ)
		ss.write(buf[:5+n])
	}
	rc, rcErr := f.SyscallConn()
	for {
		n, err := f.Read(buf[5:])
		// Take whatever else is already buffered (without waiting), so a
		// stream of small writes becomes fewer, larger frames.
		for n > 0 && err == nil && rcErr == nil && 5+n < len(buf) {
			m := 0
			rc.Read(func(fd uintptr) bool {
				m, _ = unix.Read(int(fd), buf[5+n:])
				return true
			})
			if m <= 0 {
				break
			}
			n += m
		}
		if n > 0 {
			send(n)
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			f.SetReadDeadline(time.Time{})
			rc, err := f.SyscallConn()
			if err != nil {
				return
			}
			for range 64 { // bounded: a background child may keep writing
				n := 0
				rc.Read(func(fd uintptr) bool {
					n, _ = unix.Read(int(fd), buf[5:])
					return true
				})
				if n <= 0 {
					break
				}
				send(n)
			}
		}
		return
	}
}

// input serves the client's frames until the connection ends. If it ends
// before the process exited, the process group is killed, unless a
// suspend broke it: then it serves the next client that attaches.
func (s *server) input(ss *session, p *proc) {
	for {
		c := ss.client()
		if c == nil {
			s.reaper.killRunning(p.child)
			return
		}
		if err := s.inputFrom(c, p); err != nil && ss.park(c) {
			continue
		}
		s.reaper.killRunning(p.child)
		return
	}
}

// inputFrom serves one connection's frames until it fails.
func (s *server) inputFrom(c *conn, p *proc) error {
	for {
		typ, payload, err := agent.ReadFrame(c.br)
		if err != nil {
			return err
		}
		switch typ {
		case agent.FrameStdin:
			if p.stdin != nil {
				p.stdin.Write(payload) // EPIPE: nobody reads it any more
			}
		case agent.FrameCloseStdin:
			if p.ptmx != nil {
				p.ptmx.Write([]byte{4}) // ^D, the terminal's end of file
			} else if p.stdin != nil {
				p.stdin.Close()
			}
		case agent.FrameResize:
			var m agent.ResizeMsg
			if json.Unmarshal(payload, &m) == nil && p.ptmx != nil {
				s.resize(p, m.Cols, m.Rows)
			}
		case agent.FrameSignal:
			var m agent.SignalMsg
			if json.Unmarshal(payload, &m) == nil {
				if sig, ok := parseSignal(m.Signal); ok {
					s.reaper.kill(p.child, sig, m.Group)
				}
			}
		}
	}
}

// resize sets the terminal size and sends SIGWINCH to the foreground
// process group itself (gVisor may not); if that group cannot be read
// (ENOTTY under gVisor), to the session's group.
func (s *server) resize(p *proc, cols, rows uint16) {
	rc, err := p.ptmx.SyscallConn()
	if err != nil {
		return
	}
	pgrp, serr := 0, error(nil)
	rc.Control(func(fd uintptr) {
		if serr = setSize(int(fd), cols, rows); serr != nil {
			return
		}
		if g, err := unix.IoctlGetInt(int(fd), unix.TIOCGPGRP); err == nil && g > 0 {
			pgrp = g
		}
	})
	if serr != nil {
		return
	}
	if pgrp > 0 {
		syscall.Kill(-pgrp, syscall.SIGWINCH)
		return
	}
	s.reaper.kill(p.child, syscall.SIGWINCH, true)
}

// parseSignal accepts "SIGINT", "INT" or a number.
func parseSignal(name string) (syscall.Signal, bool) {
	if n, err := strconv.Atoi(name); err == nil {
		return syscall.Signal(n), n > 0 && n < 65
	}
	name = strings.ToUpper(name)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	return sig, sig != 0
}
