package main

import (
	"os"
	"syscall"
	"time"

	"sandboxd/runsc/agent"
)

// killEveryone is killall as PID 1, or as root beside it (the killall
// command): kill(-1) spares PID 1 and the caller. Each round stops every
// process before killing it, so a fork bomb cannot fork faster than it
// dies (a stopped process does not fork; SIGSTOP cannot be caught), and
// rounds repeat until no other live process is left or the deadline
// passes. The result is what a last look at /proc found.
func killEveryone(deadline time.Time) agent.KillResult {
	self := os.Getpid()
	others := func() ([]int, error) {
		return liveProcesses(func(pid, ppid int) bool { return pid != self && pid != 1 })
	}
	// The first round needs no list: under a fork bomb reading /proc
	// takes seconds (measured: 5.6 s in a 1-vCPU sandbox) until the bomb
	// is stopped.
	stopAndKillAll()
	return killRounds(deadline, others, func([]int) { stopAndKillAll() })
}

func stopAndKillAll() {
	syscall.Kill(-1, syscall.SIGSTOP)
	syscall.Kill(-1, syscall.SIGKILL)
}

// killDescendants is killall in serve mode: every live descendant of the
// agent (orphans are re-parented to it as child subreaper).
func killDescendants(deadline time.Time) agent.KillResult {
	self := os.Getpid()
	descendants := func() ([]int, error) {
		parent := map[int]int{}
		live, err := liveProcesses(func(pid, ppid int) bool { parent[pid] = ppid; return true })
		var victims []int
		for _, pid := range live {
			for p, n := parent[pid], 0; p > 1 && n < 64; p, n = parent[p], n+1 {
				if p == self {
					victims = append(victims, pid)
					break
				}
			}
		}
		return victims, err
	}
	return killRounds(deadline, descendants, func(victims []int) {
		for _, pid := range victims {
			syscall.Kill(pid, syscall.SIGSTOP)
		}
		for _, pid := range victims {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// killRounds signals the processes list finds until it finds none or the
// deadline passes. A /proc that cannot be read is reported as unknown, never
// as "nothing left".
func killRounds(deadline time.Time, list func() ([]int, error), kill func([]int)) agent.KillResult {
	pause := time.Millisecond
	for {
		live, err := list()
		if err == nil && len(live) == 0 {
			return agent.KillResult{}
		}
		if !time.Now().Before(deadline) {
			if err != nil {
				return agent.KillResult{Survivors: len(live), Unknown: true}
			}
			return agent.KillResult{Survivors: len(live)}
		}
		kill(live)
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}
