package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"sandboxd/runsc"
)

// TestRealCPUs checks on real gVisor that a sandbox sees exactly its size's
// vCPUs (nproc, os.cpu_count() and the affinity mask), and that 1-vCPU
// sandboxes are spread over the host's CPUs: each one's cpuset is read from
// its cgroup on the host side (this test process is the server, so its own
// cpuset cgroup is the server's).
func TestRealCPUs(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	rt := h.s.rt.(*runsc.Runtime)
	serverDir := ownCpusetDir(t)
	serverCPUs := readCPUList(t, serverDir, "cpuset.effective_cpus", "cpuset.cpus.effective", "cpuset.cpus")
	usable := countCPUs(t, serverCPUs)
	t.Logf("server cpuset %s: %s (%d CPUs)", serverDir, serverCPUs, usable)

	// sees asserts what a sandbox reports and returns its cgroup's cpuset.
	sees := func(session string, want int) string {
		t.Helper()
		r := h.sh(session, "nproc")
		if r.ExitCode != 0 || r.Stdout != fmt.Sprintf("%d\n", want) {
			t.Errorf("%s: nproc = %+v, want %d", session, r, want)
		}
		py := h.sh(session, `python3 -c 'import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))'`)
		if py.ExitCode != 0 || py.Stdout != fmt.Sprintf("%d %d\n", want, want) {
			t.Errorf("%s: cpu_count, affinity = %+v, want %d %d", session, py, want, want)
		}
		t.Logf("%s: nproc %q, python cpu_count/affinity %q", session, r.Stdout, py.Stdout)
		o := h.get(session)
		return readCPUList(t, filepath.Join(serverDir, rt.ContainerID(o.OrgID, session)), "cpuset.cpus")
	}

	h.provision("cpu1", "standard-1")
	cs1 := sees("cpu1", 1)
	h.provision("cpu2", "standard-2")
	cs2 := sees("cpu2", min(2, usable))
	h.provision("cpu3", "standard-1")
	cs3 := sees("cpu3", 1)
	t.Logf("cpusets: cpu1 %s, cpu2 %s, cpu3 %s", cs1, cs2, cs3)

	for name, cs := range map[string]string{"cpu1": cs1, "cpu3": cs3} {
		if countCPUs(t, cs) != 1 {
			t.Errorf("%s (standard-1): cgroup cpuset %q, want one CPU", name, cs)
		}
	}
	if usable >= 2 && cs1 == cs3 {
		t.Errorf("two standard-1 sandboxes share CPU %s on a host with %d", cs1, usable)
	}
	if usable <= 2 && cs2 != serverCPUs {
		t.Errorf("standard-2 on %d CPUs: cgroup cpuset %q, want the server's %q (no cpuset of its own)", usable, cs2, serverCPUs)
	}

	// The sandbox's host tasks (sentry, gofer, stubs) are pinned too.
	id1 := rt.ContainerID(h.get("cpu1").OrgID, "cpu1")
	procs, err := os.ReadFile(filepath.Join(serverDir, id1, "cgroup.procs"))
	if err != nil || len(strings.Fields(string(procs))) == 0 {
		t.Fatalf("cpu1 cgroup.procs: %q %v", procs, err)
	}
	for _, pid := range strings.Fields(string(procs)) {
		st, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			continue // exited meanwhile
		}
		for line := range strings.Lines(string(st)) {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) != cs1 {
				t.Errorf("cpu1 host task %s may run on %s, want %s", pid, strings.TrimSpace(v), cs1)
			}
		}
	}

	// Deleting a sandbox removes its cgroup and frees its CPU: the next
	// 1-vCPU sandbox avoids cpu3's CPU (on 2 CPUs it gets cpu1's).
	if code, b := h.call(h.token, "DELETE", "/v1/sandbox/cpu1", nil); code != 204 {
		t.Fatalf("delete cpu1: %d %s", code, b)
	}
	if _, err := os.Stat(filepath.Join(serverDir, id1)); !os.IsNotExist(err) {
		t.Errorf("cpu1's cpuset cgroup after delete: %v", err)
	}
	h.provision("cpu4", "standard-1")
	cs4 := sees("cpu4", 1)
	if usable >= 2 && cs4 == cs3 {
		t.Errorf("cpu4 got cpu3's CPU %s", cs4)
	}
	if usable == 2 && cs4 != cs1 {
		t.Errorf("cpu4 got %s, want the freed %s", cs4, cs1)
	}

	// After a restart the placement comes from the live sandboxes'
	// cgroups, not from memory: with cpu3 gone, the next one avoids cpu4's
	// CPU (on 2 CPUs the lowest one, which a forgetful server would pick).
	h.close()
	h = startServer(t, cfg)
	if code, b := h.call(h.token, "DELETE", "/v1/sandbox/cpu3", nil); code != 204 {
		t.Fatalf("delete cpu3: %d %s", code, b)
	}
	h.provision("cpu5", "standard-1")
	if cs5 := sees("cpu5", 1); usable >= 2 && cs5 == cs4 {
		t.Errorf("after restart cpu5 got cpu4's CPU %s", cs5)
	}
}

// ownCpusetDir returns this process's cpuset cgroup directory: the v1
// cpuset hierarchy's if there is one, else the v2 one's.
func ownCpusetDir(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	v2 := ""
	for line := range strings.Lines(string(b)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			v2 = filepath.Join("/sys/fs/cgroup", parts[2])
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpuset" {
				return filepath.Join("/sys/fs/cgroup/cpuset", parts[2])
			}
		}
	}
	if v2 == "" {
		t.Fatal("no cpuset cgroup in /proc/self/cgroup")
	}
	return v2
}

// readCPUList returns the first of files that dir holds, trimmed.
func readCPUList(t *testing.T, dir string, files ...string) string {
	t.Helper()
	for _, f := range files {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("none of %v in %s", files, dir)
	return ""
}

// countCPUs counts the CPUs of a kernel CPU list ("0-2,7").
func countCPUs(t *testing.T, list string) int {
	t.Helper()
	n := 0
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || b < a {
			t.Fatalf("bad CPU list %q", list)
		}
		n += b - a + 1
	}
	return n
}
