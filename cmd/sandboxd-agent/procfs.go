package main

import (
	"bytes"
	"os"
	"strconv"
)

// liveProcesses lists the pids under /proc that are not zombies and for
// which keep(pid, ppid) is true.
func liveProcesses(keep func(pid, ppid int) bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) S ppid ...": comm may contain anything, so split
		// after its last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 2 || f[0][0] == 'Z' || f[0][0] == 'X' {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		if keep(pid, ppid) {
			pids = append(pids, pid)
		}
	}
	return pids
}
