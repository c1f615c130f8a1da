package runsc

// CPU placement: how many CPUs a sandbox sees.
//
// runsc tells the sentry it has as many CPUs as the container cgroup's
// cpuset holds (boot --cpu-num). With --cpu-num-from-quota (the default) it
// lowers that to ceil(quota/period), but never below 2 (minCPUs in the pinned
// gVisor's runsc/sandbox/sandbox.go), so a 1-vCPU size with only a CFS quota
// reports nproc = 2 on a 2-CPU host and thread pools oversubscribe. A sandbox
// whose size has fewer vCPUs than the server may use therefore also gets a
// cpuset of exactly that many CPUs (linux.resources.cpu.cpus); the quota stays.
//
// Which CPUs: the least-assigned ones among live sandboxes of this Runtime.
// The counts are derived at create time from the cpusets of the cgroups under
// the prefix (runsc makes them, Destroy removes them) instead of being kept in
// memory: nothing to rebuild after a restart, nothing to forget on the many
// ways a sandbox ends (teardown, OOM, Collect). The only state is the short
// window between a choice and runsc creating the cgroup, covered by pending.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// maxCPU bounds CPU numbers read from cgroup files (Linux's NR_CPUS is at
// most 8192), so a bad list cannot make a huge slice.
const maxCPU = 1 << 16

// cpuPlacer remembers the CPUs chosen for sandboxes whose cgroups runsc has
// not created yet, so concurrent Creates do not all pick the same CPU.
type cpuPlacer struct {
	mu      sync.Mutex
	pending map[string][]int // container id -> chosen CPUs
}

// chooseCPUs returns the cpuset for a new sandbox with vcpus vCPUs (nil: no
// cpuset, the sandbox may use every CPU the server may) and a release to call
// once runsc has created its cgroup or Create has failed.
func (r *Runtime) chooseCPUs(id string, vcpus int) ([]int, func()) {
	usable, err := r.cg.usableCPUs()
	if err != nil {
		// Without a known cpuset the sandbox still gets its quota; it
		// reports more CPUs than its size, as before.
		r.log.Warn("no cpuset for sandbox: server's cpuset unknown", "id", id, "err", err)
		return nil, func() {}
	}
	if vcpus >= len(usable) {
		return nil, func() {}
	}
	p := &r.cpus
	p.mu.Lock()
	defer p.mu.Unlock()
	live := r.cg.cpusets(r.cfg.Prefix + "-")
	var assigned [][]int
	for other, cpus := range live {
		if other != id {
			assigned = append(assigned, cpus)
		}
	}
	for other, cpus := range p.pending {
		if _, made := live[other]; !made && other != id {
			assigned = append(assigned, cpus)
		}
	}
	chosen := pickCPUs(usable, assigned, vcpus)
	if p.pending == nil {
		p.pending = map[string][]int{}
	}
	p.pending[id] = chosen
	return chosen, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if slices.Equal(p.pending[id], chosen) {
			delete(p.pending, id)
		}
	}
}

// pickCPUs returns the n CPUs of usable (sorted) that the fewest of the
// assigned cpusets hold, lower numbers first among equals; CPUs of assigned
// that are not usable are ignored. n >= len(usable) returns all of usable.
// It is a pure function of its inputs.
func pickCPUs(usable []int, assigned [][]int, n int) []int {
	load := map[int]int{}
	for _, c := range usable {
		load[c] = 0
	}
	for _, set := range assigned {
		for _, c := range set {
			if _, ok := load[c]; ok {
				load[c]++
			}
		}
	}
	order := make([]int, 0, len(load))
	for c := range load {
		order = append(order, c)
	}
	slices.SortFunc(order, func(a, b int) int {
		if load[a] != load[b] {
			return load[a] - load[b]
		}
		return a - b
	})
	if n < len(order) {
		order = order[:max(n, 0)]
	}
	slices.Sort(order)
	return order
}

// parseCPUList parses a kernel CPU list ("0-2,7,12-14"; see cpuset(7)) into
// sorted, distinct CPU numbers. Blank input is an empty list.
func parseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	seen := map[int]bool{}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := cpuNumber(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = cpuNumber(hi); err != nil {
				return nil, err
			}
			if b < a {
				return nil, fmt.Errorf("cpu list: bad range %q", part)
			}
		}
		for c := a; c <= b; c++ {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

func cpuNumber(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= maxCPU || strings.TrimSpace(s) != s || s[0] == '+' {
		return 0, fmt.Errorf("cpu list: bad cpu %q", s)
	}
	return n, nil
}

// formatCPUList writes sorted, distinct CPU numbers as a kernel CPU list,
// with ranges for runs of three or more ("0-2,5,7-9").
func formatCPUList(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		switch {
		case j == i:
			b.WriteString(strconv.Itoa(cpus[i]))
		case j == i+1:
			b.WriteString(strconv.Itoa(cpus[i]) + "," + strconv.Itoa(cpus[j]))
		default:
			b.WriteString(strconv.Itoa(cpus[i]) + "-" + strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// usableCPUs returns the CPUs of the server's own cpuset: the only ones a
// nested cgroup may be given.
func (l cgroupLayout) usableCPUs() ([]int, error) {
	if l.cpuset == "" {
		return nil, errors.New("no cpuset cgroup")
	}
	files := []string{"cpuset.effective_cpus", "cpuset.cpus"} // v1
	if l.v2 {
		files = []string{"cpuset.cpus.effective"}
	}
	var errs []error
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(l.cpuset, f))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cpus, err := parseCPUList(string(b))
		if err != nil {
			return nil, err
		}
		if len(cpus) == 0 {
			return nil, fmt.Errorf("%s is empty", f)
		}
		return cpus, nil
	}
	return nil, errors.Join(errs...)
}

// cpusets returns the configured cpuset of every child cgroup whose name
// starts with prefix (those with no readable or an empty one are left out).
func (l cgroupLayout) cpusets(prefix string) map[string][]int {
	out := map[string][]int{}
	if l.cpuset == "" {
		return out
	}
	ents, _ := os.ReadDir(l.cpuset)
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(l.cpuset, e.Name(), "cpuset.cpus"))
		if err != nil {
			continue
		}
		if cpus, err := parseCPUList(string(b)); err == nil && len(cpus) > 0 {
			out[e.Name()] = cpus
		}
	}
	return out
}
