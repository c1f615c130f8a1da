package main

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// reaper is the agent's only waiter: it reaps every child with
// Wait4(-1) (orphans included, as PID 1 or child subreaper) and hands the
// status of the children the agent started to their child value. Nothing
// else in the agent may wait for a process (no os/exec Wait).
//
// A child can exit and be reaped between fork and registration; while a
// fork is in flight, statuses of unknown pids are kept in unclaimed for
// register to find. Wait4 and register run under mu, so a registered pid
// that is not yet reaped still exists (kill(pid, 0) succeeds): an unclaimed
// status for it then belongs to an earlier process with the same pid.
type reaper struct {
	mu        sync.Mutex
	waiters   map[int]*child
	unclaimed map[int]syscall.WaitStatus
	forking   int
}

// child is one process the agent started. done is closed once it exited;
// status is valid then.
type child struct {
	pid    int
	done   chan struct{}
	status syscall.WaitStatus
	exited bool // guarded by reaper.mu
}

func newReaper() *reaper {
	return &reaper{waiters: map[int]*child{}, unclaimed: map[int]syscall.WaitStatus{}}
}

// run reaps on every SIGCHLD until the process exits.
func (r *reaper) run() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	r.reapAll() // children that exited before Notify
	for range sigs {
		r.reapAll()
	}
}

func (r *reaper) reapAll() {
	for {
		r.mu.Lock()
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			r.mu.Unlock()
			continue
		}
		if pid <= 0 || err != nil {
			r.mu.Unlock()
			return
		}
		if c := r.waiters[pid]; c != nil {
			delete(r.waiters, pid)
			c.finish(ws)
		} else if r.forking > 0 {
			r.unclaimed[pid] = ws
		}
		r.mu.Unlock()
	}
}

// spawn runs fork (which must fork and exec one child and return its pid)
// and registers the child.
func (r *reaper) spawn(fork func() (int, error)) (*child, error) {
	r.mu.Lock()
	r.forking++
	r.mu.Unlock()
	pid, err := fork()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forking--
	if r.forking == 0 {
		defer clear(r.unclaimed)
	}
	if err != nil {
		return nil, err
	}
	c := &child{pid: pid, done: make(chan struct{})}
	if ws, ok := r.unclaimed[pid]; ok {
		delete(r.unclaimed, pid)
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			c.finish(ws)
			return c, nil
		}
	}
	r.waiters[pid] = c
	return c, nil
}

// finish records the status; called with reaper.mu held.
func (c *child) finish(ws syscall.WaitStatus) {
	c.status = ws
	c.exited = true
	close(c.done)
}

// kill signals the child (group: its process group, whose id is its pid)
// unless it was already reaped, so a recycled pid is never signalled.
func (r *reaper) kill(c *child, sig syscall.Signal, group bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.exited {
		if group {
			// The group may outlive its leader; its id cannot be
			// reused while it has members.
			return syscall.Kill(-c.pid, sig)
		}
		return syscall.ESRCH
	}
	if group {
		return syscall.Kill(-c.pid, sig)
	}
	return syscall.Kill(c.pid, sig)
}

// killRunning ends a child whose client went away before it exited: the
// other process groups of its session (the jobs of an interactive shell)
// get SIGHUP and SIGCONT, as the kernel gives a terminal's foreground job
// when the terminal goes away (gVisor gives nothing), so they end unless
// they ignore hangups (nohup); then its own process group is SIGKILLed.
// Nothing happens once the child has exited.
func (r *reaper) killRunning(c *child) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.exited {
		return
	}
	// The leader is not reaped (mu is held), so its pid is still its
	// session's id.
	groups := map[int]bool{}
	liveProcesses(func(pid, _ int) bool {
		if sid, err := unix.Getsid(pid); err == nil && sid == c.pid {
			if pg, err := unix.Getpgid(pid); err == nil && pg != c.pid {
				groups[pg] = true
			}
		}
		return false
	})
	for pg := range groups {
		syscall.Kill(-pg, syscall.SIGHUP)
		syscall.Kill(-pg, syscall.SIGCONT)
	}
	syscall.Kill(-c.pid, syscall.SIGKILL)
}
