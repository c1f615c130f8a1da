package runsc

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// goldenSandbox is the fixed input of the golden spec test: standard-1
// (configs/sizes.yaml) with the paths a Runtime with StateDir /var/lib/sandboxd
// and prefix sbxabc123 would use, placed on CPU 1 of a larger host.
func goldenSandbox() (Sandbox, sandboxPaths, string, []int) {
	const id = "sbxabc123-0123456789abcdef"
	d := "/var/lib/sandboxd/sandboxes/" + id
	sb := Sandbox{
		ID:    id,
		Image: "/var/cache/sandboxd/images/0123abcd/rootfs",
		Limits: Limits{
			VCPUs:     1,
			MemoryMiB: 1024,
			DiskMiB:   8192,
			Pids:      HostTasks(512),
			Processes: DefaultProcesses(512),
		},
	}
	p := sandboxPaths{
		Rootfs:    d + "/rootfs",
		Workspace: d + "/disk/workspace",
		Tmp:       d + "/disk/tmp",
		Agent:     "/usr/local/lib/sandboxd/sandboxd-agent",
		Run:       d + "/run",
		Netns:     netnsPath(id),
	}
	return sb, p, id, []int{1}
}

func TestBuildSpecGolden(t *testing.T) {
	sb, p, cg, cpus := goldenSandbox()
	got, err := json.MarshalIndent(BuildSpec(sb, p, cg, cpus), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden := filepath.Join("testdata", "spec-standard-1.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", golden)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run `go test ./runsc -run TestBuildSpecGolden -update` to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("BuildSpec differs from %s (rerun with -update if the change is intended):\n%s",
			golden, lineDiff(string(want), string(got)))
	}
}

// lineDiff shows the first differing lines (enough to find a change).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 20; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + strconv.Itoa(i+1) + ":\n- " + wl + "\n+ " + gl + "\n")
			shown++
		}
	}
	return b.String()
}

// TestBuildSpecSemantics checks the properties the golden file encodes, so a
// careless -update cannot silently accept a broken spec.
func TestBuildSpecSemantics(t *testing.T) {
	for _, c := range []struct {
		l        Limits
		cpus     []int
		wantCpus string
	}{
		{Limits{VCPUs: 1, MemoryMiB: 1024, DiskMiB: 8192, Pids: 512, Processes: DefaultProcesses(512)}, []int{1}, "1"},
		{Limits{VCPUs: 4, MemoryMiB: 8192, DiskMiB: 65536, Pids: 4096, Processes: DefaultProcesses(4096)}, []int{2, 3, 4, 9}, "2-4,9"},
		{Limits{VCPUs: 8, MemoryMiB: 16384, DiskMiB: 131072, Pids: 8192, Processes: DefaultProcesses(8192)}, nil, ""},
	} {
		l := c.l
		sb, p, cg, _ := goldenSandbox()
		sb.Limits = l
		s := BuildSpec(sb, p, cg, c.cpus)

		r := s.Linux.Resources
		if got, want := *r.Memory.Limit, l.MemoryMiB*1024*1024; got != want {
			t.Errorf("memory limit = %d, want %d", got, want)
		}
		if got, want := *r.CPU.Quota, int64(l.VCPUs)*100000; got != want {
			t.Errorf("cpu quota = %d, want %d", got, want)
		}
		if *r.CPU.Period != 100000 {
			t.Errorf("cpu period = %d", *r.CPU.Period)
		}
		// The cpuset is what gVisor counts (the quota never gives fewer
		// than 2 CPUs); mems are left to runsc (copied from the parent).
		if r.CPU.Cpus != c.wantCpus || r.CPU.Mems != "" {
			t.Errorf("cpuset = %q mems %q, want %q and no mems", r.CPU.Cpus, r.CPU.Mems, c.wantCpus)
		}
		if r.Pids.Limit != l.Pids {
			t.Errorf("pids = %d, want %d", r.Pids.Limit, l.Pids)
		}
		var nproc *specs.POSIXRlimit
		for i := range s.Process.Rlimits {
			if s.Process.Rlimits[i].Type == "RLIMIT_NPROC" {
				nproc = &s.Process.Rlimits[i]
			}
		}
		if nproc == nil || nproc.Hard != uint64(l.Processes) || nproc.Soft != uint64(l.Processes) {
			t.Errorf("RLIMIT_NPROC = %+v, want %d", nproc, l.Processes)
		}
		if s.Linux.CgroupsPath != cg || filepath.IsAbs(s.Linux.CgroupsPath) {
			t.Errorf("cgroupsPath = %q, want relative %q", s.Linux.CgroupsPath, cg)
		}
		mounts := map[string]specs.Mount{}
		for _, m := range s.Mounts {
			if _, dup := mounts[m.Destination]; dup {
				t.Errorf("mount %s twice", m.Destination)
			}
			mounts[m.Destination] = m
		}
		for dst, src := range map[string]string{"/workspace": p.Workspace, "/tmp": p.Tmp, agentPath: p.Agent} {
			m, ok := mounts[dst]
			if !ok || m.Type != "bind" || m.Source != src {
				t.Errorf("mount %s = %+v, want bind of %s", dst, m, src)
			}
		}
		if !hasOpt(mounts[agentPath].Options, "ro") || hasOpt(mounts[agentPath].Options, "rw") {
			t.Errorf("agent mount not read-only: %v", mounts[agentPath].Options)
		}
		for _, dst := range []string{"/workspace", "/tmp"} {
			o := mounts[dst].Options
			if !hasOpt(o, "nosuid") || !hasOpt(o, "nodev") {
				t.Errorf("%s options = %v, want nosuid,nodev", dst, o)
			}
		}
		var netns string
		for _, ns := range s.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				netns = ns.Path
			}
		}
		if netns != "/var/run/netns/"+sb.ID {
			t.Errorf("netns path = %q", netns)
		}
		if s.Root.Path != p.Rootfs || !s.Process.NoNewPrivileges {
			t.Errorf("root/noNewPrivileges: %+v %v", s.Root, s.Process.NoNewPrivileges)
		}
		if strings.Join(s.Process.Args, " ") != agentPath+" init --socket "+agentSocket {
			t.Errorf("init args = %q", s.Process.Args)
		}
		if s.Process.Env[0] != "PATH="+BasePath {
			t.Errorf("env = %q", s.Process.Env)
		}
	}
}

func TestBuildSpecPure(t *testing.T) {
	sb, p, cg, cpus := goldenSandbox()
	a, _ := json.Marshal(BuildSpec(sb, p, cg, cpus))
	s := BuildSpec(sb, p, cg, cpus)
	// Mutating one spec must not leak into the next.
	s.Mounts[0].Options = append(s.Mounts[0].Options, "x")
	s.Mounts[1].Options[0] = "suid"
	s.Linux.MaskedPaths[0] = "/nothing"
	s.Process.Rlimits[0].Hard = 1
	*s.Linux.Resources.Memory.Limit = 1
	b, _ := json.Marshal(BuildSpec(sb, p, cg, cpus))
	if !bytes.Equal(a, b) {
		t.Errorf("BuildSpec output changed after mutating an earlier result:\n%s\n%s", a, b)
	}
}

// TestBuildSpecCapsNotShared: each capability list of a spec is its own
// copy, so a caller that edits one list of a returned spec edits neither the
// others nor later specs (BuildSpec once put the package-level initCaps
// slice itself into all three).
func TestBuildSpecCapsNotShared(t *testing.T) {
	saved := append([]string(nil), initCaps...)
	defer copy(initCaps, saved)
	sb, p, cg, cpus := goldenSandbox()
	s := BuildSpec(sb, p, cg, cpus)
	s.Process.Capabilities.Bounding[0] = "CAP_SYS_ADMIN"
	next := BuildSpec(sb, p, cg, cpus)
	if s.Process.Capabilities.Effective[0] == "CAP_SYS_ADMIN" || next.Process.Capabilities.Bounding[0] == "CAP_SYS_ADMIN" {
		t.Fatal("BuildSpec aliases the package-level initCaps slice: each capability list must be its own copy")
	}
}

func TestUserProcess(t *testing.T) {
	pr := UserProcess([]string{"/bin/true"}, []string{"A=1"}, "/workspace")
	if pr.User.UID != UserUID || pr.User.GID != UserGID || !pr.NoNewPrivileges {
		t.Errorf("user process = %+v", pr)
	}
	c := pr.Capabilities
	if c == nil || len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable)+len(c.Ambient) != 0 {
		t.Errorf("user process has capabilities: %+v", c)
	}
}

func hasOpt(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestDefaultProcesses(t *testing.T) {
	cases := []struct{ pids, want int64 }{
		{0, 16}, {64, 16}, {100, 16}, {112, 16}, {115, 17},
		{512, 149}, {1024, 320}, {2048, 661}, {4096, 1344}, {8192, 2709},
	}
	for _, c := range cases {
		got := DefaultProcesses(c.pids)
		if got != c.want {
			t.Errorf("DefaultProcesses(%d) = %d, want %d", c.pids, got, c.want)
		}
		// A guest process costs gVisor up to about four host tasks (seen:
		// 512 at 130 processes, when the Sentry died at its cgroup's
		// limit): the host limit leaves it half as many again.
		if c.pids >= 128 && 6*got+64 > HostTasks(c.pids) {
			t.Errorf("DefaultProcesses(%d) = %d, HostTasks %d: too few host tasks for gVisor", c.pids, got, HostTasks(c.pids))
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	ok := Limits{VCPUs: 1, MemoryMiB: 128, DiskMiB: 64, Pids: 64, Processes: 1}
	if err := ok.validate(); err != nil {
		t.Errorf("minimal limits: %v", err)
	}
	for _, l := range []Limits{
		{VCPUs: 0, MemoryMiB: 128, DiskMiB: 64, Pids: 64, Processes: 1},
		{VCPUs: 1, MemoryMiB: 127, DiskMiB: 64, Pids: 64, Processes: 1},
		{VCPUs: 1, MemoryMiB: 128, DiskMiB: 63, Pids: 64, Processes: 1},
		{VCPUs: 1, MemoryMiB: 128, DiskMiB: 64, Pids: 63, Processes: 1},
		{VCPUs: 1, MemoryMiB: 128, DiskMiB: 64, Pids: 64, Processes: 0},
	} {
		if l.validate() == nil {
			t.Errorf("validate(%+v) = nil", l)
		}
	}
}

var hexID = regexp.MustCompile(`^sbxabc-[0-9a-f]{16}$`)

func TestContainerID(t *testing.T) {
	r := &Runtime{cfg: Config{Prefix: "sbxabc"}}
	a := r.ContainerID("org_1", "session-1")
	if !hexID.MatchString(a) {
		t.Fatalf("ContainerID = %q, want prefix-16hex", a)
	}
	if a != r.ContainerID("org_1", "session-1") {
		t.Error("ContainerID is not deterministic")
	}
	if a == r.ContainerID("org_2", "session-1") {
		t.Error("ContainerID does not depend on the org")
	}
	if a == r.ContainerID("org_1", "session-2") {
		t.Error("ContainerID does not depend on the session")
	}
	// The separator keeps (org, session) pairs apart that concatenate equally.
	if r.ContainerID("org_1", "x") == r.ContainerID("org_1x", "") {
		t.Error("ContainerID collides on concatenation")
	}
	long := strings.Repeat("s", 128)
	for _, sid := range []string{"a", long, "a.b_c-d"} {
		if id := r.ContainerID("org_1", sid); len(id) != len(a) {
			t.Errorf("ContainerID(%q) has length %d, want %d", sid, len(id), len(a))
		}
	}
	other := &Runtime{cfg: Config{Prefix: "sbxdef"}}
	if b := other.ContainerID("org_1", "session-1"); !strings.HasPrefix(b, "sbxdef-") || b[7:] != a[7:] {
		t.Errorf("other prefix: %q vs %q", b, a)
	}
}

func TestOwns(t *testing.T) {
	r := &Runtime{cfg: Config{Prefix: "sbxabc"}}
	own := r.ContainerID("org", "s")
	if !r.Owns(own) {
		t.Errorf("Owns(%q) = false", own)
	}
	other := (&Runtime{cfg: Config{Prefix: "sbxdef"}}).ContainerID("org", "s")
	longer := (&Runtime{cfg: Config{Prefix: "sbxabcd"}}).ContainerID("org", "s")
	shorter := (&Runtime{cfg: Config{Prefix: "sbxab"}}).ContainerID("org", "s")
	for _, id := range []string{
		"", "sbxabc", "sbxabc-", own[:len(own)-1], own + "0", other, longer, shorter,
		"sbxabc" + own[6:7] + own[7:] + "-", "xsbxabc-0123456789abcde", "SBXABC-0123456789abcdef",
		"sbxabc_0123456789abcdef",
	} {
		if r.Owns(id) {
			t.Errorf("Owns(%q) = true", id)
		}
	}
}
