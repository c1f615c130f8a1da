package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"sandboxd/runsc"
	"sandboxd/runsc/image"
	"sandboxd/server/config"
)

// The data dir's free space against the two floors: below
// minFreeDiskMiB a problem, below pressureFreeDiskMiB a warning.
func TestDoctorCheckDisk(t *testing.T) {
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Image.CacheDir = t.TempDir()
	free, _, err := freeMiB(cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		min, pressure int64
		status        runsc.Verdict
		seen          string
	}{
		{free + 100, free + 200, runsc.CheckProblem, "below limits.minFreeDiskMiB"},
		{0, free + 1<<20, runsc.CheckWarn, "below limits.pressureFreeDiskMiB"},
		{1, 2, runsc.CheckOK, "pressureFreeDiskMiB 2"},
	} {
		cfg.Limits.MinFreeDiskMiB, cfg.Limits.PressureFreeDiskMiB = int(c.min), int(c.pressure)
		f := checkDisk(cfg, true)[0]
		if f.Status != c.status || !strings.Contains(f.Seen, c.seen) || (c.status != runsc.CheckOK && f.Fix == "") {
			t.Errorf("min %d, pressure %d, free %d: %+v", c.min, c.pressure, free, f)
		}
	}
}

func TestDoctorParseLockHolder(t *testing.T) {
	locks := `1: POSIX  ADVISORY  WRITE 900 fd:01:1234 0 EOF
2: FLOCK  ADVISORY  WRITE 4321 fd:01:1234 0 EOF
2: -> FLOCK  ADVISORY  WRITE 555 fd:01:1234 0 EOF
3: FLOCK  ADVISORY  WRITE 77 103:02:1234 0 EOF
4: OFDLCK ADVISORY  READ -1 fd:01:99 0 EOF
`
	for _, c := range []struct {
		major, minor uint32
		ino          uint64
		want         int
	}{
		{0xfd, 1, 1234, 4321}, // the FLOCK, not the POSIX lock or the waiter
		{0x103, 2, 1234, 77},  // device numbers are hex
		{0xfd, 1, 99, 0},      // not a flock
		{0xfd, 2, 1234, 0},
	} {
		if got := parseLockHolder(locks, c.major, c.minor, c.ino); got != c.want {
			t.Errorf("%x:%x:%d: got %d, want %d", c.major, c.minor, c.ino, got, c.want)
		}
	}
}

// The real /proc/locks names this process as the holder of its flock.
func TestDoctorLockHolder(t *testing.T) {
	dir := t.TempDir()
	if serverRunning(dir) {
		t.Fatal("server running without a lock file")
	}
	p := filepath.Join(dir, lockName)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := lockHolder(p); got != 0 {
		t.Errorf("unlocked: holder %d", got)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if got := lockHolder(p); got != os.Getpid() {
		t.Errorf("holder %d, want %d", got, os.Getpid())
	}
	srv, pid := checkServer(dir)
	if pid != os.Getpid() || !strings.Contains(srv.Seen, fmt.Sprintf("pid %d", os.Getpid())) {
		t.Errorf("checkServer: %+v %d", srv, pid)
	}
}

func TestDoctorParseListeners(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:D2A4 01 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 20 4 30 10 -1
`
	tcp6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5555 1 0000000000000000 100 0 0 10 0
`
	got := append(parseListeners(tcp), parseListeners(tcp6)...)
	want := []tcpListener{
		{net.ParseIP("127.0.0.1").To4(), 8080, 1111},
		{net.IPv4zero.To4(), 22, 2222},
		{net.ParseIP("::1"), 8081, 4444},
		{net.IPv6zero, 80, 5555},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if !got[i].ip.Equal(want[i].ip) || got[i].port != want[i].port || got[i].inode != want[i].inode {
			t.Errorf("%d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// checkListen on real sockets: a free address, one this process holds
// (as a stranger, and as the data dir's server), one held by another pid.
func TestDoctorCheckListen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := ln.Addr().String()
	if pids := listenerPids(held); !slices.Contains(pids, os.Getpid()) {
		t.Fatalf("listenerPids(%s) = %v, want %d among them", held, pids, os.Getpid())
	}
	// A wildcard address conflicts with the loopback listener.
	_, port, _ := net.SplitHostPort(held)
	if pids := listenerPids("0.0.0.0:" + port); !slices.Contains(pids, os.Getpid()) {
		t.Errorf("wildcard: %v", pids)
	}
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	freeAddr := free.Addr().String()
	free.Close()
	me := os.Getpid()
	for _, c := range []struct {
		name      string
		addr      string
		running   bool
		serverPid int
		status    runsc.Verdict
		seen, fix string
	}{
		{"free", freeAddr, false, 0, runsc.CheckOK, "free", ""},
		{"free, server elsewhere", freeAddr, true, me, runsc.CheckOK, "listens elsewhere", ""},
		{"held by a stranger", held, false, 0, runsc.CheckProblem, fmt.Sprintf("in use by pid %d", me), fmt.Sprintf("stop pid %d", me)},
		{"held by the server", held, true, me, runsc.CheckOK, fmt.Sprintf("held by the server running on this data dir (pid %d)", me), ""},
		{"held, server pid unknown", held, true, 0, runsc.CheckOK, "server running on this data dir", ""},
		{"held, not by the server", held, true, 1, runsc.CheckProblem, "not by the server on this data dir (pid 1)", "listen on another address"},
		{"not an address of this host", "192.0.2.1:80", false, 0, runsc.CheckProblem, "cannot listen", "address of this host"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := checkListen(c.addr, c.running, c.serverPid)
			if f.Name != "listen "+c.addr || f.Status != c.status || !strings.Contains(f.Seen, c.seen) || !strings.Contains(f.Fix, c.fix) {
				t.Fatalf("got %+v, want %s ~%q fix ~%q", f, c.status, c.seen, c.fix)
			}
		})
	}
}

// Every host command doctor checks is one configs/host/packages.txt
// installs (make host-packages, the fix doctor names), with the same package.
func TestDoctorHostPackages(t *testing.T) {
	b, err := os.ReadFile("../../configs/host/packages.txt")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			listed[f[0]] = f[1]
		}
	}
	cmds := append(slices.Clone(runsc.HostCommands), runsc.HostCommand{Command: image.Builder, Package: image.Builder})
	for _, c := range cmds {
		if listed[c.Command] != c.Package {
			t.Errorf("%s: doctor says package %s, packages.txt %q", c.Command, c.Package, listed[c.Command])
		}
	}
}

func TestDoctorWriteFindings(t *testing.T) {
	fs := []runsc.Finding{
		{Name: "root", Status: runsc.CheckOK, Seen: "euid 0"},
		{Name: "image", Status: runsc.CheckProblem, Seen: "not built", Fix: "sudo make image"},
		{Name: "kernel: veth", Status: runsc.CheckWarn, Seen: "module veth is not loaded", Fix: "sudo modprobe veth"},
	}
	var b bytes.Buffer
	if err := writeFindings(&b, fs); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.HasPrefix(lines[1], "PROBLEM  image") || strings.TrimSpace(lines[2]) != "fix: sudo make image" ||
		!strings.HasPrefix(lines[3], "warn     kernel: veth") || strings.TrimSpace(lines[4]) != "fix: sudo modprobe veth" {
		t.Errorf("table:\n%s", b.String())
	}
	// The fix lines start in the "seen" column.
	if strings.Index(lines[2], "fix:") != strings.Index(lines[1], "not built") {
		t.Errorf("fix not aligned:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "\n1 problem, 1 warning: run the fixes above") {
		t.Errorf("summary:\n%s", b.String())
	}
	b.Reset()
	writeFindings(&b, fs[:1])
	if !strings.HasSuffix(b.String(), "\nno problems\n") {
		t.Errorf("summary without problems:\n%s", b.String())
	}
}
