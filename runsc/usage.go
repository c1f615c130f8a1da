package runsc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Usage is what a running sandbox takes now, read from its cgroups and
// its disk. A figure the host does not expose is -1.
type Usage struct {
	MemoryBytes int64 // resident use, page cache that can be dropped left out
	MemoryLimit int64
	CPU         time.Duration // CPU time used since it started
	Pids        int64         // host tasks (gVisor's threads included)
	PidsLimit   int64
	DiskUsed    int64 // of the sandbox's disk (root layer and /workspace)
	DiskTotal   int64
}

// Usage reads a sandbox's current use. It takes no lock and runs no
// runsc command: cheap enough to poll.
func (r *Runtime) Usage(id string) (Usage, error) {
	if !r.Owns(id) {
		return Usage{}, fmt.Errorf("container id %q not made by this runtime", id)
	}
	u := r.cg.usage(id)
	u.DiskUsed, u.DiskTotal = -1, -1
	var st unix.Statfs_t
	disk := filepath.Join(r.dir(id), "disk")
	if err := unix.Statfs(disk, &st); err == nil && devDiffers(disk) {
		u.DiskTotal = int64(st.Blocks) * st.Bsize
		u.DiskUsed = u.DiskTotal - int64(st.Bfree)*st.Bsize
	}
	return u, nil
}

// devDiffers reports whether dir is mounted on (its device differs from
// its parent's): an unmounted disk dir must not report the host's disk.
func devDiffers(dir string) bool {
	var a, b unix.Stat_t
	if unix.Stat(dir, &a) != nil || unix.Stat(filepath.Dir(dir), &b) != nil {
		return false
	}
	return a.Dev != b.Dev
}

func (l cgroupLayout) usage(name string) Usage {
	u := Usage{MemoryBytes: -1, MemoryLimit: -1, CPU: -1, Pids: -1, PidsLimit: -1}
	dir := func(ctrl string) string {
		if l.v2 {
			return filepath.Join(l.memory, name)
		}
		if d, ok := l.ctrls[ctrl]; ok {
			return filepath.Join(d, name)
		}
		return ""
	}
	if l.v2 {
		u.MemoryBytes = readInt(dir("memory"), "memory.current")
		if u.MemoryBytes >= 0 {
			if f := statField(dir("memory"), "memory.stat", "inactive_file"); f > 0 && f < u.MemoryBytes {
				u.MemoryBytes -= f
			}
		}
		u.MemoryLimit = readInt(dir("memory"), "memory.max")
		if us := statField(dir("cpu"), "cpu.stat", "usage_usec"); us >= 0 {
			u.CPU = time.Duration(us) * time.Microsecond
		}
	} else {
		u.MemoryBytes = readInt(dir("memory"), "memory.usage_in_bytes")
		if u.MemoryBytes >= 0 {
			if f := statField(dir("memory"), "memory.stat", "total_inactive_file"); f > 0 && f < u.MemoryBytes {
				u.MemoryBytes -= f
			}
		}
		u.MemoryLimit = readInt(dir("memory"), "memory.limit_in_bytes")
		if ns := readInt(dir("cpuacct"), "cpuacct.usage"); ns >= 0 {
			u.CPU = time.Duration(ns)
		}
	}
	u.Pids = readInt(dir("pids"), "pids.current")
	u.PidsLimit = readInt(dir("pids"), "pids.max")
	return u
}

// readInt reads a cgroup file holding one number; -1 if it is missing or
// says "max".
func readInt(dir, file string) int64 {
	if dir == "" {
		return -1
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// statField reads "key value" from a cgroup stat file; -1 if absent.
func statField(dir, file, key string) int64 {
	if dir == "" {
		return -1
	}
	f, err := os.Open(filepath.Join(dir, file))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
