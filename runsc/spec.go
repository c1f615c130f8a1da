package runsc

import (
	"fmt"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Limits are the resources of one sandbox (from its size).
type Limits struct {
	VCPUs     int   // CPU quota in whole CPUs, and the CPUs the sandbox sees
	MemoryMiB int64 // memory cgroup limit, gVisor's own overhead included
	DiskMiB   int64 // size of the sandbox's disk
	Pids      int64 // host tasks (gVisor threads and stub processes): HostTasks of the size's
	Processes int64 // RLIMIT_NPROC inside the sandbox (guest processes of the user)
}

// Sandbox describes one sandbox to create.
type Sandbox struct {
	ID     string // from ContainerID
	Image  string // absolute path of the read-only image root filesystem
	Limits Limits
	// Existing: the disk must already be there (a resume or restore);
	// Create and Restore fail with ErrDiskMissing rather than make an
	// empty one in place of the session's files.
	Existing bool
}

// User is the unprivileged account commands run as.
const (
	UserUID  = 1000
	UserGID  = 1000
	UserHome = "/home/user"
	// Workspace is the default working directory inside a sandbox.
	Workspace = "/workspace"
	agentPath = "/.sandboxd/agent"
	// runDir holds the agent's socket; it is a root-only (0700) host
	// directory, so sandbox users cannot reach the agent themselves.
	runDir      = "/.sandboxd/run"
	agentSocket = runDir + "/agent.sock"
	cpuPeriod   = 100000
)

// BasePath is the PATH of every process in a sandbox.
const BasePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// paths of one sandbox's host-side pieces.
type sandboxPaths struct {
	Rootfs    string // merged overlay (lower: image, upper: disk/upper)
	Workspace string // disk/workspace
	Tmp       string // disk/tmp
	Agent     string
	Trust     string // TrustBundle; "" for none
	Run       string // host side of runDir
	Netns     string
}

// BuildSpec returns the OCI runtime spec of a sandbox. It is a pure function
// of its inputs (golden-tested). cpus is the sandbox's cpuset (see cpus.go;
// nil for none): gVisor reports as many CPUs as it holds.
func BuildSpec(sb Sandbox, p sandboxPaths, cgroupsPath string, cpus []int) *specs.Spec {
	mem := sb.Limits.MemoryMiB << 20
	quota := int64(sb.Limits.VCPUs) * cpuPeriod
	period := uint64(cpuPeriod)
	// cpuset.mems stays empty: runsc copies the parent's into the new
	// cgroup (v1), and v2 inherits it.
	cpu := &specs.LinuxCPU{Quota: &quota, Period: &period, Cpus: formatCPUList(cpus)}
	nproc := uint64(sb.Limits.Processes)
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: []string{agentPath, "init", "--socket", agentSocket},
			Env:  []string{"PATH=" + BasePath},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  slices.Clone(initCaps),
				Effective: slices.Clone(initCaps),
				Permitted: slices.Clone(initCaps),
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NPROC", Hard: nproc, Soft: nproc},
				{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536},
			},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: p.Rootfs, Readonly: false},
		Hostname: "sandbox",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			// /tmp on the sandbox's disk: capped by diskMiB, not by memory.
			{Destination: "/tmp", Type: "bind", Source: p.Tmp, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
			{Destination: Workspace, Type: "bind", Source: p.Workspace, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
			{Destination: agentPath, Type: "bind", Source: p.Agent, Options: []string{"rbind", "ro"}},
			{Destination: runDir, Type: "bind", Source: p.Run, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: cgroupsPath,
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &mem},
				CPU:    cpu,
				Pids:   &specs.LinuxPids{Limit: sb.Limits.Pids},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: p.Netns},
			},
			MaskedPaths:   []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	if p.Trust != "" {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: TrustStore, Type: "bind", Source: p.Trust, Options: []string{"rbind", "ro"}})
	}
	return spec
}

// TrustStore is the sandbox's system roots (Debian's bundle, which git,
// curl, Python and apt read); TrustBundle is mounted over it.
const TrustStore = "/etc/ssl/certs/ca-certificates.crt"

// initCaps is what PID 1 (the agent) keeps; user commands get none.
var initCaps = []string{"CAP_KILL", "CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"}

// UserProcess returns the OCI process of a user command.
func UserProcess(args, env []string, cwd string) *specs.Process {
	return &specs.Process{
		User:            specs.User{UID: UserUID, GID: UserGID, AdditionalGids: []uint32{UserGID}},
		Args:            args,
		Env:             env,
		Cwd:             cwd,
		Capabilities:    &specs.LinuxCapabilities{},
		NoNewPrivileges: true,
	}
}

// DefaultProcesses and HostTasks derive a sandbox's two task limits from
// its size's pids: the guest's RLIMIT_NPROC (the user's processes and
// threads) and the host pids cgroup (gVisor's own tasks: the Sentry's
// threads, and a systrap stub process with threads per guest address
// space). A fork bomb must meet RLIMIT_NPROC inside before gVisor meets
// the cgroup: there the Sentry cannot make a thread and dies (newosproc),
// and the sandbox with it. Measured under fork bombs (server's
// TestRealAttackInside): 2 to over 3.7 host tasks per guest process, most
// while a bomb ramps up, and the stub pool keeps its peak (stubs are
// pooled, never freed; an address space is released after its process
// stopped counting against RLIMIT_NPROC). With the cgroup at pids,
// (pids - 64) / 3 processes reached it (512 tasks at 130 processes); at
// twice pids gVisor has about six host tasks per guest process.
func DefaultProcesses(pids int64) int64 {
	n := (pids - 64) / 3
	if n < 16 {
		n = 16
	}
	return n
}

// HostTasks is the pids cgroup limit for a size's pids (DefaultProcesses
// says why).
func HostTasks(pids int64) int64 { return 2 * pids }

func (l Limits) validate() error {
	switch {
	case l.VCPUs < 1, l.MemoryMiB < 128, l.DiskMiB < 64, l.Pids < 64, l.Processes < 1:
		return fmt.Errorf("limits too small: %+v", l)
	}
	return nil
}
