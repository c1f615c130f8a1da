package runsc

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestPickCPUs(t *testing.T) {
	cases := []struct {
		name     string
		usable   []int
		assigned [][]int
		n        int
		want     []int
	}{
		{"empty host picks lowest", []int{0, 1}, nil, 1, []int{0}},
		{"second goes elsewhere", []int{0, 1}, [][]int{{0}}, 1, []int{1}},
		{"third back to lowest on a tie", []int{0, 1}, [][]int{{0}, {1}}, 1, []int{0}},
		{"least assigned first", []int{0, 1, 2, 3}, [][]int{{0}, {1}, {0}, {3}}, 1, []int{2}},
		{"two of four, then the other two", []int{0, 1, 2, 3}, [][]int{{0, 1}}, 2, []int{2, 3}},
		{"multi-CPU mixes loads", []int{0, 1, 2, 3}, [][]int{{0, 1}, {0}, {3}}, 2, []int{1, 2}},
		{"full-host cpusets weigh every CPU alike", []int{0, 1}, [][]int{{0, 1}, {0, 1}, {1}}, 1, []int{0}},
		{"unusable CPUs ignored", []int{2, 5}, [][]int{{0}, {1}, {2}, {7}}, 1, []int{5}},
		{"sparse usable set", []int{1, 3, 8}, [][]int{{1}, {3}}, 2, []int{1, 8}},
		{"result is sorted", []int{0, 1, 2}, [][]int{{0}, {0}}, 2, []int{1, 2}},
		{"n beyond usable gives all", []int{0, 1}, nil, 3, []int{0, 1}},
		{"unsorted usable", []int{3, 1, 2}, [][]int{{1}}, 1, []int{2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := slices.Clone(c.usable)
			got := pickCPUs(c.usable, c.assigned, c.n)
			if !slices.Equal(got, c.want) {
				t.Errorf("pickCPUs(%v, %v, %d) = %v, want %v", c.usable, c.assigned, c.n, got, c.want)
			}
			if !slices.Equal(in, c.usable) {
				t.Errorf("pickCPUs changed its input: %v", c.usable)
			}
		})
	}
}

// TestPickCPUsSpreads places many 1-vCPU and 2-vCPU sandboxes one after
// another and checks that no CPU ever carries more than one more than any
// other.
func TestPickCPUsSpreads(t *testing.T) {
	usable := []int{0, 1, 2, 3, 4, 5}
	var assigned [][]int
	for i := range 60 {
		n := 1 + i%2
		got := pickCPUs(usable, assigned, n)
		if len(got) != n {
			t.Fatalf("step %d: %v", i, got)
		}
		assigned = append(assigned, got)
		load := map[int]int{}
		for _, set := range assigned {
			for _, c := range set {
				load[c]++
			}
		}
		lo, hi := load[usable[0]], load[usable[0]]
		for _, c := range usable {
			lo, hi = min(lo, load[c]), max(hi, load[c])
		}
		if hi-lo > 1 {
			t.Fatalf("step %d: uneven loads %v", i, load)
		}
	}
}

func TestCPUList(t *testing.T) {
	for _, c := range []struct {
		in   string
		cpus []int
		out  string
	}{
		{"", nil, ""},
		{"\n", nil, ""},
		{"0", []int{0}, "0"},
		{"0-1\n", []int{0, 1}, "0,1"},
		{"0-2,7,12-14", []int{0, 1, 2, 7, 12, 13, 14}, "0-2,7,12-14"},
		{"3,1,2,1", []int{1, 2, 3}, "1-3"},
		{"5-5", []int{5}, "5"},
		{"0,2,4-6,8,9", []int{0, 2, 4, 5, 6, 8, 9}, "0,2,4-6,8,9"},
	} {
		got, err := parseCPUList(c.in)
		if err != nil || !slices.Equal(got, c.cpus) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", c.in, got, err, c.cpus)
		}
		if s := formatCPUList(c.cpus); s != c.out {
			t.Errorf("formatCPUList(%v) = %q, want %q", c.cpus, s, c.out)
		}
	}
	for _, bad := range []string{"a", "1-", "-1", "2-1", "1,,2", "1 ,2", "+1", "0-70000", "1-2-3", ",", "1,"} {
		if got, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) = %v, want an error", bad, got)
		}
	}
}

func FuzzCPUList(f *testing.F) {
	for _, s := range []string{"0", "0-3", "0-2,7,12-14", "1,3", "", "9-8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cpus, err := parseCPUList(s)
		if err != nil {
			return
		}
		if !slices.IsSorted(cpus) || len(slices.Compact(slices.Clone(cpus))) != len(cpus) {
			t.Fatalf("parseCPUList(%q) = %v: not sorted and distinct", s, cpus)
		}
		again, err := parseCPUList(formatCPUList(cpus))
		if err != nil || !slices.Equal(again, cpus) {
			t.Fatalf("round trip of %q: %v -> %q -> %v, %v", s, cpus, formatCPUList(cpus), again, err)
		}
	})
}

// fakeCpuset lays out a server cpuset cgroup (v1 files) in a temp dir.
func fakeCpuset(t *testing.T, cpus string, children map[string]string) cgroupLayout {
	t.Helper()
	d := t.TempDir()
	write := func(p, s string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(d, "cpuset.cpus"), cpus)
	write(filepath.Join(d, "cpuset.effective_cpus"), cpus)
	for name, c := range children {
		write(filepath.Join(d, name, "cpuset.cpus"), c)
	}
	return cgroupLayout{cpuset: d}
}

func TestChooseCPUs(t *testing.T) {
	const pre = "sbxabc-"
	id := func(s string) string { return pre + s }
	newRT := func(cg cgroupLayout) *Runtime {
		return &Runtime{cfg: Config{Prefix: "sbxabc"}, cg: cg, log: slog.New(slog.DiscardHandler)}
	}

	t.Run("counts live cgroups under the prefix only", func(t *testing.T) {
		// Live sandboxes on 0 and 1 (and one with the full set); another
		// server's (other prefix) and foreign cgroups do not count.
		r := newRT(fakeCpuset(t, "0-3", map[string]string{
			id("a"): "0", id("b"): "1", id("c"): "0-3",
			"sbxdef-x": "2", "other": "2",
		}))
		got, release := r.chooseCPUs(id("new"), 1)
		defer release()
		if !slices.Equal(got, []int{2}) {
			t.Errorf("chose %v, want [2]", got)
		}
	})

	t.Run("pending choices count until released", func(t *testing.T) {
		r := newRT(fakeCpuset(t, "0-1", nil))
		a, releaseA := r.chooseCPUs(id("a"), 1)
		b, releaseB := r.chooseCPUs(id("b"), 1)
		if !slices.Equal(a, []int{0}) || !slices.Equal(b, []int{1}) {
			t.Fatalf("concurrent creates chose %v and %v, want [0] and [1]", a, b)
		}
		releaseA() // a's create failed: its CPU is free again
		c, releaseC := r.chooseCPUs(id("c"), 1)
		if !slices.Equal(c, []int{0}) {
			t.Errorf("after release chose %v, want [0]", c)
		}
		releaseB()
		releaseC()
		if len(r.cpus.pending) != 0 {
			t.Errorf("pending left: %v", r.cpus.pending)
		}
	})

	t.Run("a made cgroup is not counted twice", func(t *testing.T) {
		cg := fakeCpuset(t, "0-2", nil)
		r := newRT(cg)
		a, releaseA := r.chooseCPUs(id("a"), 1)
		// runsc made a's cgroup with the chosen cpuset; it is both pending
		// and live.
		os.MkdirAll(filepath.Join(cg.cpuset, id("a")), 0o755)
		os.WriteFile(filepath.Join(cg.cpuset, id("a"), "cpuset.cpus"), []byte(formatCPUList(a)+"\n"), 0o644)
		b, releaseB := r.chooseCPUs(id("b"), 2)
		defer releaseB()
		releaseA()
		if !slices.Equal(a, []int{0}) || !slices.Equal(b, []int{1, 2}) {
			t.Errorf("chose %v then %v, want [0] then [1 2]", a, b)
		}
	})

	t.Run("a resumed id does not count its own old cgroup", func(t *testing.T) {
		r := newRT(fakeCpuset(t, "0-1", map[string]string{id("a"): "0", id("b"): "0"}))
		got, release := r.chooseCPUs(id("a"), 1)
		defer release()
		if !slices.Equal(got, []int{1}) {
			t.Errorf("chose %v, want [1]", got)
		}
	})

	t.Run("no cpuset when the size has all usable CPUs", func(t *testing.T) {
		r := newRT(fakeCpuset(t, "0-1", nil))
		for _, n := range []int{2, 3} {
			got, release := r.chooseCPUs(id("a"), n)
			release()
			if got != nil {
				t.Errorf("%d vCPUs on 2 CPUs: cpuset %v, want none", n, got)
			}
		}
		if len(r.cpus.pending) != 0 {
			t.Errorf("pending: %v", r.cpus.pending)
		}
	})

	t.Run("restricted server cpuset", func(t *testing.T) {
		cg := fakeCpuset(t, "0-7", nil)
		os.WriteFile(filepath.Join(cg.cpuset, "cpuset.effective_cpus"), []byte("4-5\n"), 0o644)
		r := newRT(cg)
		got, release := r.chooseCPUs(id("a"), 1)
		release()
		if !slices.Equal(got, []int{4}) {
			t.Errorf("chose %v, want [4] (only 4-5 are usable)", got)
		}
	})

	t.Run("unknown server cpuset gives none", func(t *testing.T) {
		for _, cg := range []cgroupLayout{{}, {cpuset: t.TempDir()}} {
			r := newRT(cg)
			got, release := r.chooseCPUs(id("a"), 1)
			release()
			if got != nil {
				t.Errorf("cpuset %v without a known server cpuset", got)
			}
		}
	})
}
