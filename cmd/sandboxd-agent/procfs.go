package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"syscall"
)

// liveProcesses lists the pids under /proc that are not zombies and for
// which keep(pid, ppid) is true. A process whose stat cannot be read for a
// reason other than having gone is listed (keep is not asked): it may be
// alive (keep sees ppid -1). The error is /proc's own: the list is then
// unknown.
func liveProcesses(keep func(pid, ppid int) bool) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err != nil {
			if keep(pid, -1) {
				pids = append(pids, pid)
			}
			continue
		}
		// "pid (comm) S ppid ...": comm may contain anything, so split
		// after its last ')'.
		i := bytes.LastIndexByte(b, ')')
		f := bytes.Fields(b[i+1:])
		if i < 0 || len(f) < 2 {
			if keep(pid, -1) {
				pids = append(pids, pid)
			}
			continue
		}
		if f[0][0] == 'Z' || f[0][0] == 'X' {
			continue
		}
		ppid, _ := strconv.Atoi(string(f[1]))
		if keep(pid, ppid) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
