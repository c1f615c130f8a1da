package runsc

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// writeELF writes a minimal ELF64 executable for machine with a PT_LOAD
// segment and, if interp is not empty, a PT_INTERP naming it.
func writeELF(t *testing.T, machine elf.Machine, interp string) string {
	t.Helper()
	progs := []elf.Prog64{{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X), Align: 0x1000}}
	if interp != "" {
		progs = append([]elf.Prog64{{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Align: 1}}, progs...)
	}
	const ehsize, phsize = 64, 56
	data := []byte(interp + "\x00")
	dataOff := uint64(ehsize + phsize*len(progs))
	if interp != "" {
		progs[0].Off, progs[0].Filesz, progs[0].Memsz = dataOff, uint64(len(data)), uint64(len(data))
	}
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Entry: 0x401000, Phoff: ehsize, Ehsize: ehsize, Phentsize: phsize, Phnum: uint16(len(progs)), Shentsize: 64}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, h)
	binary.Write(&b, binary.LittleEndian, progs)
	if interp != "" {
		b.Write(data)
	}
	p := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(p, b.Bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDoctorStaticELF(t *testing.T) {
	here, ok := elfMachines[runtime.GOARCH]
	if !ok {
		t.Skipf("no ELF machine known for %s", runtime.GOARCH)
	}
	other := elf.EM_AARCH64
	if here == elf.EM_AARCH64 {
		other = elf.EM_X86_64
	}
	text := filepath.Join(t.TempDir(), "script")
	os.WriteFile(text, []byte("#!/bin/sh\necho hi\n"), 0o755)
	for _, c := range []struct {
		name, path, want string // want: "" for static
	}{
		{"static", writeELF(t, here, ""), ""},
		{"dynamic", writeELF(t, here, "/lib64/ld-linux-x86-64.so.2"), "dynamically linked (program interpreter /lib64/ld-linux-x86-64.so.2)"},
		{"other machine", writeELF(t, other, ""), "built for"},
		{"script", text, "not an ELF executable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := staticELF(c.path)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("staticELF: %v, want nil", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("staticELF: %v, want %q", err, c.want)
			}
		})
	}
	var dyn errDynamic
	if err := staticELF(writeELF(t, here, "/lib/ld.so")); !errors.As(err, &dyn) || dyn.interp != "/lib/ld.so" {
		t.Errorf("dynamic: %#v", err)
	}
	// A real dynamically linked program of the host, if there is one.
	for _, p := range []string{"/bin/ls", "/usr/bin/env"} {
		if f, err := elf.Open(p); err == nil {
			dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
			f.Close()
			if err := staticELF(p); dynamic != errors.As(err, &dyn) {
				t.Errorf("%s: dynamic %v, staticELF says %v", p, dynamic, err)
			}
		}
	}
}

func TestDoctorCheckBinary(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("x"), 0o644)
	static := writeELF(t, elfMachines[runtime.GOARCH], "")
	for _, c := range []struct {
		name, path     string
		status         Verdict
		seen, fix      string
		sameFixAsBuild bool
	}{
		{"ok", static, CheckOK, "static ELF", "", false},
		{"relative", "bin/runsc", CheckProblem, "not an absolute path", "make build", true},
		{"missing", filepath.Join(dir, "nope"), CheckProblem, "no such file or directory", "make build", true},
		{"directory", dir, CheckProblem, "not a regular file", "make build", true},
		{"not executable", plain, CheckProblem, "not executable", "sudo chmod 755 " + plain, false},
		{"dynamic", writeELF(t, elfMachines[runtime.GOARCH], "/lib/ld.so"), CheckProblem, "dynamically linked", "make build", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := checkBinary("runsc binary", c.path, "sudo make build")
			if f.Status != c.status || !strings.Contains(f.Seen, c.seen) || (c.fix != "" && !strings.Contains(f.Fix, c.fix)) {
				t.Fatalf("got %+v, want %s, seen ~%q, fix ~%q", f, c.status, c.seen, c.fix)
			}
			if f.Status == CheckProblem && f.Fix == "" {
				t.Error("a problem without a fix")
			}
		})
	}
}

func TestDoctorKernelFeature(t *testing.T) {
	probed := 0
	probeOK := func() error { probed++; return nil }
	probeFail := func() error { probed++; return errors.New("operation not supported") }
	none := func(string) bool { return false }
	veth := kernelFeature{name: "kernel: veth", module: "veth", config: "VETH", probe: probeOK, fix: "sudo modprobe veth"}
	overlay := kernelFeatures[0]
	netns := kernelFeatures[3]
	for _, c := range []struct {
		name   string
		k      kernelInfo
		f      kernelFeature
		status Verdict
		seen   string
		probes int
	}{
		{"file system registered", kernelInfo{filesystems: map[string]bool{"overlay": true}, exists: none}, overlay, CheckOK, "in /proc/filesystems", 0},
		{"module loaded", kernelInfo{loaded: map[string]bool{"veth": true}, exists: none}, veth, CheckOK, "loaded", 0},
		{"built in (config)", kernelInfo{config: map[string]string{"VETH": "y"}, exists: none}, veth, CheckOK, "built into the kernel", 0},
		{"built in (modules.builtin)", kernelInfo{builtin: map[string]bool{"veth": true}, exists: none}, veth, CheckOK, "built into the kernel", 0},
		{"loadable module", kernelInfo{config: map[string]string{"OVERLAY_FS": "m"}, exists: none}, overlay, CheckWarn, "not loaded", 0},
		{"loadable (modules.dep)", kernelInfo{modules: map[string]bool{"overlay": true}, exists: none}, overlay, CheckWarn, "not loaded", 0},
		{"not configured", kernelInfo{release: "6.1.0", config: map[string]string{"OVERLAY_FS": "n"}, configFrom: "/boot/config-6.1.0", exists: none}, overlay, CheckProblem, "built without CONFIG_OVERLAY_FS", 0},
		{"unknown, no probe", kernelInfo{release: "6.1.0", exists: none}, overlay, CheckProblem, "not found", 0},
		{"unknown, probe works", kernelInfo{exists: none}, veth, CheckOK, "tried in a throwaway network namespace", 1},
		{"config known: no probe", kernelInfo{config: map[string]string{}, exists: none}, veth, CheckProblem, "built without CONFIG_VETH", 0},
		{"present path", kernelInfo{exists: func(p string) bool { return p == "/proc/self/ns/net" }}, netns, CheckOK, "/proc/self/ns/net exists", 0},
		{"no netns", kernelInfo{config: map[string]string{"NET_NS": "n"}, exists: none}, netns, CheckProblem, "CONFIG_NET_NS", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			probed = 0
			got := c.k.feature(c.f)
			if got.Status != c.status || !strings.Contains(got.Seen, c.seen) || probed != c.probes {
				t.Fatalf("got %+v (probes %d), want %s ~%q (probes %d)", got, probed, c.status, c.seen, c.probes)
			}
			if got.Status != CheckOK && got.Fix != c.f.fix {
				t.Errorf("fix %q, want %q", got.Fix, c.f.fix)
			}
		})
	}
	veth.probe = probeFail
	if got := (&kernelInfo{exists: none}).feature(veth); got.Status != CheckProblem || !strings.Contains(got.Seen, "operation not supported") {
		t.Errorf("failed probe: %+v", got)
	}
}

func TestDoctorParseKernelInfo(t *testing.T) {
	cfg := parseKernelConfig("#\n# Automatically generated\nCONFIG_VETH=m\nCONFIG_NET_NS=y\n# CONFIG_OVERLAY_FS is not set\nCONFIG_LOCALVERSION=\"-amd64\"\n")
	want := map[string]string{"VETH": "m", "NET_NS": "y", "OVERLAY_FS": "n", "LOCALVERSION": "-amd64"}
	if len(cfg) != len(want) {
		t.Errorf("config %v, want %v", cfg, want)
	}
	for k, v := range want {
		if cfg[k] != v {
			t.Errorf("config[%s] = %q, want %q", k, cfg[k], v)
		}
	}
	mods := parseModuleList("kernel/fs/overlayfs/overlay.ko.xz:\nkernel/drivers/net/veth.ko: kernel/net/core/x.ko\nkernel/drivers/hid/hid-generic.ko\n\n")
	for _, m := range []string{"overlay", "veth", "hid_generic"} {
		if !mods[m] {
			t.Errorf("module %s missing from %v", m, mods)
		}
	}
	fs := parseFilesystems("nodev\tsysfs\nnodev\toverlay\n\text4\n")
	if !fs["overlay"] || !fs["ext4"] || fs["nodev"] {
		t.Errorf("filesystems %v", fs)
	}
}

func TestDoctorSocketPaths(t *testing.T) {
	ok := checkSocketFinding("/var/lib/sandboxd", "sbxabc123")
	if ok.Status != CheckOK || !strings.Contains(ok.Seen, "of 107 bytes") {
		t.Errorf("short dir: %+v", ok)
	}
	long := "/tmp/" + strings.Repeat("d", 80)
	f := checkSocketFinding(long, "sbxabc123")
	if f.Status != CheckProblem || !strings.Contains(f.Fix, "at most") {
		t.Fatalf("long dir: %+v", f)
	}
	// The same rule as New's.
	if _, err := New(Config{Binary: "/bin/true", Agent: "/bin/true", StateDir: long, Prefix: "sbxabc123"}); err == nil || err.Error() != f.Seen {
		t.Errorf("New: %v, doctor: %s", err, f.Seen)
	}
	// At the limit exactly, both accept.
	n := socketPathLen("/x", "sbxabc123")
	edge := "/" + strings.Repeat("x", 1+maxSocketPath-n)
	if socketPathLen(edge, "sbxabc123") != maxSocketPath || checkSocketFinding(edge, "sbxabc123").Status != CheckOK {
		t.Errorf("edge %d bytes: %+v", socketPathLen(edge, "sbxabc123"), checkSocketFinding(edge, "sbxabc123"))
	}
}

// On this machine (root, the host sandboxd runs on) the host checks find
// nothing missing, and do not leave anything behind.
func TestDoctorCheckHostReal(t *testing.T) {
	if testing.Short() {
		t.Skip("reads the real host (not in -short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	links, _ := netlink.LinkList()
	nss, _ := os.ReadDir(netnsDir)
	names := map[string]bool{}
	for _, f := range CheckHost(context.Background()) {
		t.Logf("%-8s %-28s %s", f.Status, f.Name, f.Seen)
		names[f.Name] = true
		if f.Status == CheckProblem {
			t.Errorf("problem on this host: %+v", f)
		}
		if f.Seen == "" {
			t.Errorf("%s: nothing seen", f.Name)
		}
	}
	for _, n := range []string{"kernel: overlayfs", "kernel: ext4", "kernel: loop", "kernel: network namespaces", "kernel: veth",
		"cgroups", "loop devices", "command: mount", "command: mkfs.ext4"} {
		if !names[n] {
			t.Errorf("no finding %q", n)
		}
	}
	after, _ := netlink.LinkList()
	nss2, _ := os.ReadDir(netnsDir)
	if len(after) != len(links) || len(nss2) != len(nss) {
		t.Errorf("links %d -> %d, named netns %d -> %d", len(links), len(after), len(nss), len(nss2))
	}
}

// The veth probe works here and leaves no link and no namespace.
func TestDoctorProbeVeth(t *testing.T) {
	if testing.Short() {
		t.Skip("makes a veth pair (not in -short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	before, _ := netlink.LinkList()
	nss, _ := os.ReadDir(netnsDir)
	if err := probeVeth(); err != nil {
		t.Fatal(err)
	}
	after, _ := netlink.LinkList()
	nss2, _ := os.ReadDir(netnsDir)
	for _, l := range after {
		if strings.HasPrefix(l.Attrs().Name, "sbxdoctor") {
			t.Errorf("probe link %s in the host namespace", l.Attrs().Name)
		}
	}
	if len(after) != len(before) || len(nss2) != len(nss) {
		t.Errorf("links %d -> %d, named netns %d -> %d", len(before), len(after), len(nss), len(nss2))
	}
}
