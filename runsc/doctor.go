package runsc

// Host checks for `sandboxd doctor`: what the driver needs of the machine
// (kernel features, cgroups, loop devices, the commands it executes) and of
// its configuration (static runsc and agent binaries, socket path lengths,
// the platform). The checks read /proc, /sys, /dev and the binaries' ELF
// headers and change nothing. The one probe that creates something (a veth
// pair, made only when nothing readable tells whether the kernel has veth)
// makes it inside a throwaway network namespace with no name, which the
// kernel destroys, veth included, as soon as the probe's thread leaves it,
// even if the process dies.

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Verdict is a check's outcome.
type Verdict string

// A problem stops sandboxes from working; a warning may.
const (
	CheckOK      Verdict = "ok"
	CheckWarn    Verdict = "warn"
	CheckProblem Verdict = "problem"
)

// Finding is the outcome of one check.
type Finding struct {
	Name   string  `json:"name"`
	Status Verdict `json:"status"`
	// Seen says what the check found.
	Seen string `json:"seen"`
	// Fix is the command that fixes a problem (or a warning), if there is one.
	Fix string `json:"fix,omitempty"`
}

// HostCommand is a program the driver executes and the Debian package that
// has it (configs/host/packages.txt lists the same pairs).
type HostCommand struct{ Command, Package, Use string }

// HostCommands are the host programs the driver executes.
var HostCommands = []HostCommand{
	{"mount", "mount", "loop-mounts sandbox disks"},
	{"mkfs.ext4", "e2fsprogs", "formats sandbox disks"},
	{"e2fsck", "e2fsprogs", "checks a sandbox disk before it is mounted again"},
}

// Check runs every check of the driver for cfg: CheckHost, then cfg's
// binaries, state dir and platform. It takes well under a second.
func Check(ctx context.Context, cfg Config) []Finding {
	out := CheckHost(ctx)
	bin := checkBinary("runsc binary", cfg.Binary, "sudo make build   (bin/runsc: static, from the gVisor pinned in go.mod)")
	out = append(out, bin)
	if bin.Status != CheckProblem {
		out = append(out, checkRunscRuns(ctx, cfg.Binary))
	}
	out = append(out, checkBinary("agent binary", cfg.Agent, "sudo make build   (bin/sandboxd-agent: static)"))
	out = append(out, checkSocketFinding(cfg.StateDir, cfg.Prefix), checkPlatform(cfg.Platform))
	return out
}

// CheckHost checks what the driver needs of the machine, whatever its
// configuration: kernel features, cgroups, loop devices and host commands.
func CheckHost(ctx context.Context) []Finding {
	k := readKernelInfo()
	var out []Finding
	loop := CheckOK
	for _, f := range kernelFeatures {
		fd := k.feature(f)
		if f.module == "loop" {
			loop = fd.Status
		}
		out = append(out, fd)
	}
	out = append(out, checkCgroups(), checkLoopDevices(loop != CheckProblem))
	for _, c := range HostCommands {
		out = append(out, checkCommand(c))
	}
	return out
}

// ----- kernel features -----

type kernelFeature struct {
	name   string
	fs     string // its name in /proc/filesystems, if it is a file system
	module string // its module name, if it can be one
	config string // its kernel config option, without CONFIG_
	// present is a path that exists exactly when the kernel has it.
	present string
	// probe tries it for real when nothing readable decides.
	probe func() error
	fix   string
}

var kernelFeatures = []kernelFeature{
	{name: "kernel: overlayfs", fs: "overlay", module: "overlay", config: "OVERLAY_FS", fix: "sudo modprobe overlay"},
	{name: "kernel: ext4", fs: "ext4", module: "ext4", config: "EXT4_FS", fix: "sudo modprobe ext4"},
	{name: "kernel: loop", module: "loop", config: "BLK_DEV_LOOP", fix: "sudo modprobe loop"},
	{name: "kernel: network namespaces", config: "NET_NS", present: "/proc/self/ns/net",
		fix: "boot a kernel with network namespaces (CONFIG_NET_NS=y; Debian's kernels have it)"},
	{name: "kernel: veth", module: "veth", config: "VETH", probe: probeVeth, fix: "sudo modprobe veth"},
}

// kernelInfo is what the running kernel says about itself.
type kernelInfo struct {
	release     string
	filesystems map[string]bool // /proc/filesystems
	loaded      map[string]bool // /proc/modules and /sys/module
	config      map[string]string
	configFrom  string          // where config came from ("": no kernel config found)
	modules     map[string]bool // loadable: modules.dep
	builtin     map[string]bool // modules.builtin
	exists      func(path string) bool
}

func readKernelInfo() *kernelInfo {
	k := &kernelInfo{filesystems: map[string]bool{}, loaded: map[string]bool{}, modules: map[string]bool{}, builtin: map[string]bool{},
		exists: func(p string) bool { _, err := os.Stat(p); return err == nil }}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		k.release = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/filesystems"); err == nil {
		k.filesystems = parseFilesystems(string(b))
	}
	if b, err := os.ReadFile("/proc/modules"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				k.loaded[moduleName(f[0])] = true
			}
		}
	}
	if ents, err := os.ReadDir("/sys/module"); err == nil {
		for _, e := range ents {
			k.loaded[moduleName(e.Name())] = true
		}
	}
	for _, p := range []string{"/proc/config.gz", "/boot/config-" + k.release} {
		if cfg, err := readKernelConfig(p); err == nil {
			k.config, k.configFrom = cfg, p
			break
		}
	}
	dir := filepath.Join("/lib/modules", k.release)
	if b, err := os.ReadFile(filepath.Join(dir, "modules.dep")); err == nil {
		k.modules = parseModuleList(string(b))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		k.builtin = parseModuleList(string(b))
	}
	return k
}

// feature decides whether the kernel has f: registered or loaded now, built
// in, loadable, or (only when none of that is known) probed.
func (k *kernelInfo) feature(f kernelFeature) Finding {
	ok := func(seen string) Finding { return Finding{Name: f.name, Status: CheckOK, Seen: seen} }
	switch {
	case f.fs != "" && k.filesystems[f.fs]:
		return ok(f.fs + " is in /proc/filesystems")
	case f.present != "" && k.exists(f.present):
		return ok(f.present + " exists")
	case f.module != "" && k.loaded[f.module]:
		return ok("module " + f.module + " is loaded or built in (/sys/module)")
	case k.config[f.config] == "y" || (f.module != "" && k.builtin[f.module]):
		return ok("built into the kernel (CONFIG_" + f.config + "=y)")
	case k.config[f.config] == "m" || (f.module != "" && k.modules[f.module]):
		return Finding{Name: f.name, Status: CheckWarn, Fix: f.fix,
			Seen: "module " + f.module + " is not loaded; the kernel loads it on first use, or load it now"}
	}
	if f.probe != nil && k.config == nil {
		if err := f.probe(); err != nil {
			return Finding{Name: f.name, Status: CheckProblem, Fix: f.fix, Seen: "not available: " + err.Error()}
		}
		return ok("works (tried in a throwaway network namespace)")
	}
	seen := "not found: the kernel " + k.release + " does not list it"
	if k.config != nil {
		seen = fmt.Sprintf("the kernel %s is built without CONFIG_%s (%s)", k.release, f.config, k.configFrom)
	}
	return Finding{Name: f.name, Status: CheckProblem, Seen: seen, Fix: f.fix}
}

func parseFilesystems(s string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(s, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			out[f[len(f)-1]] = true
		}
	}
	return out
}

// parseModuleList reads the module names of modules.dep or modules.builtin
// ("kernel/fs/overlayfs/overlay.ko.xz: deps...").
func parseModuleList(s string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(s, "\n") {
		path, _, _ := strings.Cut(line, ":")
		name, _, ok := strings.Cut(filepath.Base(strings.TrimSpace(path)), ".ko")
		if ok && name != "" {
			out[moduleName(name)] = true
		}
	}
	return out
}

// moduleName normalizes a module name: the kernel treats - and _ alike.
func moduleName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// readKernelConfig reads a kernel config (gzipped if its name says so):
// option (without CONFIG_) -> "y", "m" or the value; "is not set" -> "n".
func readKernelConfig(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return nil, err
		}
		defer gz.Close()
		r = gz
	}
	b, err := io.ReadAll(io.LimitReader(r, 16<<20))
	if err != nil {
		return nil, err
	}
	return parseKernelConfig(string(b)), nil
}

func parseKernelConfig(s string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if opt, ok := strings.CutPrefix(line, "# CONFIG_"); ok {
			if name, ok := strings.CutSuffix(opt, " is not set"); ok {
				out[name] = "n"
			}
			continue
		}
		if opt, ok := strings.CutPrefix(line, "CONFIG_"); ok {
			if name, val, ok := strings.Cut(opt, "="); ok {
				out[name] = strings.Trim(val, `"`)
			}
		}
	}
	return out
}

// probeVeth makes a veth pair in a new, unnamed network namespace and
// deletes it. Nothing outlives the probe: the namespace has no name and is
// destroyed with everything in it when the probe's thread leaves it.
func probeVeth() error {
	return inNetns(netns.New, func(h netns.NsHandle) error {
		nh, err := netlink.NewHandleAt(h)
		if err != nil {
			return fmt.Errorf("netlink: %w", err)
		}
		defer nh.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sbxdoctor0"}, PeerName: "sbxdoctor1"}
		if err := nh.LinkAdd(veth); err != nil {
			return fmt.Errorf("create veth: %w", err)
		}
		return nh.LinkDel(veth)
	})
}

// ----- cgroups -----

// cgroupControllers are the controllers a sandbox's spec sets limits with
// (memory and cpu are mandatory for runsc; pids and cpuset are in every
// spec this driver writes, or may be).
var cgroupControllers = []string{"memory", "cpu", "cpuset", "pids"}

func checkCgroups() Finding {
	const name = "cgroups"
	l, err := loadCgroupLayout()
	if err != nil {
		return Finding{Name: name, Status: CheckProblem, Seen: err.Error() + " (/proc/self/cgroup, /proc/self/mountinfo)",
			Fix: "sudo mount -t cgroup2 none /sys/fs/cgroup   (or boot with systemd, which mounts the cgroup file systems)"}
	}
	version := "v1"
	if l.v2 {
		version = "v2"
	}
	var seen, missing, fixes []string
	for _, c := range cgroupControllers {
		dir, ok := l.ctrls[c]
		if ok {
			if _, err := os.Stat(dir); err != nil {
				ok = false
			}
		}
		if !ok {
			missing = append(missing, c)
			if parent := filepath.Join(filepath.Dir(l.memory), "cgroup.subtree_control"); l.v2 && isFile(parent) {
				fixes = append(fixes, fmt.Sprintf("echo +%s | sudo tee %s", c, parent))
			} else if l.v2 {
				fixes = append(fixes, "boot with the "+c+" controller on cgroup v2 (not bound to a v1 hierarchy; systemd.unified_cgroup_hierarchy=1)")
			} else {
				mnt := filepath.Join("/sys/fs/cgroup", c)
				fixes = append(fixes, fmt.Sprintf("sudo mkdir -p %s && sudo mount -t cgroup -o %s cgroup %s", mnt, c, mnt))
			}
			continue
		}
		if !l.v2 {
			seen = append(seen, c+" "+dir)
		}
	}
	if l.v2 {
		seen = append(seen, strings.Join(cgroupControllers, ", ")+" in "+l.memory)
	}
	if len(missing) > 0 {
		return Finding{Name: name, Status: CheckProblem, Fix: strings.Join(fixes, "; "),
			Seen: fmt.Sprintf("cgroup %s: no %s controller for this process's cgroup", version, strings.Join(missing, ", "))}
	}
	cpus, err := l.usableCPUs()
	if err != nil {
		return Finding{Name: name, Status: CheckProblem, Seen: "cpuset: " + err.Error(),
			Fix: "give the server's cpuset cgroup CPUs (cpuset.cpus) and memory nodes (cpuset.mems)"}
	}
	return Finding{Name: name, Status: CheckOK,
		Seen: fmt.Sprintf("cgroup %s, this process's: %s; CPUs %s (sandboxes nest under the server's own)", version, strings.Join(seen, ", "), formatCPUList(cpus))}
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// ----- loop devices -----

func checkLoopDevices(kernelHasLoop bool) Finding {
	const name = "loop devices"
	var st unix.Stat_t
	if err := unix.Stat("/dev/loop-control", &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		fix := "sudo modprobe loop"
		if kernelHasLoop {
			fix = "sudo mknod -m 660 /dev/loop-control c 10 237"
		}
		return Finding{Name: name, Status: CheckProblem, Seen: "no /dev/loop-control: sandbox disks cannot be mounted", Fix: fix}
	}
	total, free := loopDevices()
	seen := fmt.Sprintf("/dev/loop-control; %d loop devices, %d free", total, free)
	if free > 0 {
		return Finding{Name: name, Status: CheckOK, Seen: seen}
	}
	if devIsDevtmpfs() {
		return Finding{Name: name, Status: CheckOK, Seen: seen + " (mount adds one through /dev/loop-control)"}
	}
	return Finding{Name: name, Status: CheckWarn, Seen: seen + "; /dev is not devtmpfs, so a loop device the kernel adds may have no node",
		Fix: fmt.Sprintf("sudo mknod -m 660 /dev/loop%d b 7 %d", total, total)}
}

// loopDevices counts the loop devices and those bound to no file (sysfs
// shows loopN/loop/ only while it is bound) that have a node in /dev.
func loopDevices() (total, free int) {
	ents, _ := os.ReadDir("/sys/block")
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, "loop") {
			continue
		}
		total++
		if _, err := os.Stat(filepath.Join("/sys/block", n, "loop")); err == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/dev", n)); err == nil {
			free++
		}
	}
	return total, free
}

func devIsDevtmpfs() bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == "/dev" {
			for i, x := range f {
				if x == "-" && i+1 < len(f) {
					return f[i+1] == "devtmpfs"
				}
			}
		}
	}
	return false
}

// ----- host commands -----

func checkCommand(c HostCommand) Finding {
	name := "command: " + c.Command
	p, err := exec.LookPath(c.Command)
	if err != nil {
		return Finding{Name: name, Status: CheckProblem, Seen: "not on PATH (it " + c.Use + ")",
			Fix: "sudo apt-get install -y " + c.Package + "   (or: sudo make host-packages)"}
	}
	return Finding{Name: name, Status: CheckOK, Seen: p}
}

// ----- binaries -----

func checkBinary(name, path, fix string) Finding {
	problem := func(seen string) Finding { return Finding{Name: name, Status: CheckProblem, Seen: seen, Fix: fix} }
	if !filepath.IsAbs(path) {
		return problem(fmt.Sprintf("%q is not an absolute path", path))
	}
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return problem(fmt.Sprintf("%s: %v", path, errors.Unwrap(err)))
	case !st.Mode().IsRegular():
		return problem(path + " is not a regular file")
	case st.Mode().Perm()&0o111 == 0:
		return Finding{Name: name, Status: CheckProblem, Seen: path + " is not executable", Fix: "sudo chmod 755 " + path}
	}
	if err := staticELF(path); err != nil {
		return problem(path + ": " + err.Error())
	}
	seen := path + ": static ELF"
	if bi, err := buildinfo.ReadFile(path); err == nil && bi.Main.Path == "gvisor.dev/gvisor" {
		seen += ", gvisor.dev/gvisor " + bi.Main.Version
	}
	return Finding{Name: name, Status: CheckOK, Seen: seen}
}

// errDynamic is a dynamically linked executable: a sandbox cannot start it
// (runsc re-executes itself in an empty chroot, where no loader exists).
type errDynamic struct{ interp string }

func (e errDynamic) Error() string {
	return "dynamically linked (program interpreter " + e.interp + "): gVisor cannot start it in its empty chroot"
}

var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "386": elf.EM_386, "arm": elf.EM_ARM,
	"riscv64": elf.EM_RISCV, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390,
}

// staticELF checks that path is an ELF executable for this machine without
// a program interpreter (PT_INTERP), i.e. statically linked.
func staticELF(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return errors.New("not an ELF executable")
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("not an executable (ELF type %v)", f.Type)
	}
	if m, ok := elfMachines[runtime.GOARCH]; ok && f.Machine != m {
		return fmt.Errorf("built for %v, this machine is %s", f.Machine, runtime.GOARCH)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, _ := io.ReadAll(io.LimitReader(p.Open(), 256))
			return errDynamic{string(bytes.TrimRight(b, "\x00"))}
		}
	}
	return nil
}

// checkRunscRuns runs `runsc --version`.
func checkRunscRuns(ctx context.Context, bin string) Finding {
	const name = "runsc runs"
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--version")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		return Finding{Name: name, Status: CheckProblem, Seen: fmt.Sprintf("%s --version: %v %s", bin, err, msg),
			Fix: "sudo make build   (rebuilds bin/runsc)"}
	}
	first, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
	return Finding{Name: name, Status: CheckOK, Seen: "runsc --version: " + first}
}

// ----- configuration -----

func checkSocketFinding(stateDir, prefix string) Finding {
	const name = "socket paths"
	n := socketPathLen(stateDir, prefix)
	if err := checkSocketPaths(stateDir, prefix); err != nil {
		return Finding{Name: name, Status: CheckProblem, Seen: err.Error(),
			Fix: fmt.Sprintf("use a data dir of at most %d bytes (--data-dir, $SANDBOXD_DATA_DIR or dataDir; default /var/lib/sandboxd)", len(stateDir)-(n-maxSocketPath))}
	}
	return Finding{Name: name, Status: CheckOK, Seen: fmt.Sprintf("agent sockets take %d of %d bytes", n, maxSocketPath)}
}

func checkPlatform(platform string) Finding {
	const name = "platform"
	if platform == "" {
		platform = "systrap"
	}
	if platform != "kvm" {
		return Finding{Name: name, Status: CheckOK, Seen: platform + " (needs no /dev/kvm)"}
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return Finding{Name: name, Status: CheckProblem, Seen: "kvm, but there is no /dev/kvm",
			Fix: "sudo modprobe kvm_intel (or kvm_amd), or set runsc.platform: systrap"}
	}
	return Finding{Name: name, Status: CheckOK, Seen: "kvm, /dev/kvm exists"}
}
