package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"sandboxd/runsc"
	"sandboxd/runsc/image"
	"sandboxd/server"
	"sandboxd/server/config"
	"sandboxd/server/sandbox"
	"sandboxd/store"
)

// doctor checks this machine and the configuration for what the server
// needs, with the server stopped or running: the gVisor driver's host
// requirements (runsc.Check: kernel, cgroups, loop devices, commands,
// binaries), the image, free disk space, the listen address and root. It
// only reads: it never builds, mounts, locks or creates anything.

func (c *cli) doctorCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this machine for what sandboxd needs; say what is missing and how to fix it",
		Long: `Checks this machine and the configuration for what the server needs: root, kernel
features (overlayfs, ext4, loop, network namespaces, veth), cgroups, loop
devices, host commands, the runsc and agent binaries (static), the image, free
disk space and the listen address. Works with the server stopped or running
and changes nothing. Prints each finding, with the command that fixes each
problem; exits 1 when there is a problem (warnings alone exit 0).`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := c.doctor(cmd.Context())
			var err error
			if asJSON {
				err = writeFindingsJSON(c.stdout, fs)
			} else {
				err = writeFindings(c.stdout, fs)
			}
			if err != nil {
				return err
			}
			if problems, _ := countFindings(fs); problems > 0 {
				return exitCode(1)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the findings as JSON")
	cmd.Flags().StringVar(&c.o.Listen, "listen", "", "the address to check (default: the configuration's listen)")
	return cmd
}

// doctor runs every check, in the order they are printed.
func (c *cli) doctor(ctx context.Context) []runsc.Finding {
	out := []runsc.Finding{checkRoot()}
	cfg, err := c.config()
	if err != nil {
		out = append(out, runsc.Finding{Name: "config", Status: runsc.CheckProblem, Seen: err.Error(),
			Fix: "correct the config file (every key is documented in configs/sandboxd.yaml), then run doctor again"})
		return append(out, runsc.CheckHost(ctx)...)
	}
	out = append(out, c.configFinding(cfg))
	bin, agent := server.Binaries(cfg)
	out = append(out, runsc.Check(ctx, runsc.Config{Binary: bin, Agent: agent, StateDir: cfg.DataDir,
		Prefix: config.ResourcePrefix(cfg.DataDir), Platform: cfg.Runsc.Platform})...)
	out = append(out, checkDataDir(cfg.DataDir))
	imgs, built := c.checkImage(cfg)
	out = append(out, imgs...)
	out = append(out, checkDisk(cfg, built)...)
	out = append(out, checkPids(cfg))
	srv, lockPid := checkServer(cfg.DataDir)
	return append(out, srv, checkListen(cfg.Listen, srv.Seen != serverStopped, lockPid))
}

func countFindings(fs []runsc.Finding) (problems, warnings int) {
	for _, f := range fs {
		switch f.Status {
		case runsc.CheckProblem:
			problems++
		case runsc.CheckWarn:
			warnings++
		}
	}
	return problems, warnings
}

func writeFindingsJSON(w io.Writer, fs []runsc.Finding) error {
	problems, warnings := countFindings(fs)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Problems int             `json:"problems"`
		Warnings int             `json:"warnings"`
		Findings []runsc.Finding `json:"findings"`
	}{problems, warnings, fs})
}

// writeFindings prints one line per finding, its fix below a problem or
// warning, and a summary.
func writeFindings(w io.Writer, fs []runsc.Finding) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range fs {
		st := string(f.Status)
		if f.Status == runsc.CheckProblem {
			st = "PROBLEM"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", st, f.Name, f.Seen)
		if f.Fix != "" && f.Status != runsc.CheckOK {
			fmt.Fprintf(tw, "\t\tfix: %s\n", f.Fix)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	problems, warnings := countFindings(fs)
	switch {
	case problems > 0:
		_, err := fmt.Fprintf(w, "\n%s, %s: run the fixes above, then sandboxd doctor again\n", plural(problems, "problem"), plural(warnings, "warning"))
		return err
	case warnings > 0:
		_, err := fmt.Fprintf(w, "\nno problems, %s\n", plural(warnings, "warning"))
		return err
	}
	_, err := fmt.Fprintln(w, "\nno problems")
	return err
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// self is how the operator ran this binary, for fix commands.
func self() string {
	if len(os.Args) > 0 && os.Args[0] != "" {
		return os.Args[0]
	}
	return "sandboxd"
}

func checkRoot() runsc.Finding {
	if id := os.Geteuid(); id != 0 {
		return runsc.Finding{Name: "root", Status: runsc.CheckProblem,
			Seen: fmt.Sprintf("euid %d: the server needs root (network namespaces, mounts, cgroups), and some checks need it to see everything", id),
			Fix:  "sudo " + self() + " doctor"}
	}
	return runsc.Finding{Name: "root", Status: runsc.CheckOK, Seen: "euid 0"}
}

// configFile is the config file the shared flags or environment name ("":
// the built-in defaults alone).
func (c *cli) configFinding(cfg *config.Config) runsc.Finding {
	from := "built-in defaults"
	if f := c.configFile(); f != "" {
		from = f
	}
	return runsc.Finding{Name: "config", Status: runsc.CheckOK,
		Seen: fmt.Sprintf("%s; data dir %s, listen %s, image cache %s", from, cfg.DataDir, cfg.Listen, cfg.Image.CacheDir)}
}

func checkDataDir(dir string) runsc.Finding {
	const name = "data dir"
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return runsc.Finding{Name: name, Status: runsc.CheckOK, Seen: dir + " does not exist yet (the server makes it)"}
	case err != nil:
		return runsc.Finding{Name: name, Status: runsc.CheckProblem, Seen: err.Error(), Fix: "sudo " + self() + " doctor   (as root)"}
	case !st.IsDir():
		return runsc.Finding{Name: name, Status: runsc.CheckProblem, Seen: dir + " is not a directory",
			Fix: "point --data-dir (or dataDir) at a directory, e.g. /var/lib/sandboxd"}
	}
	if st.Mode().Perm()&0o002 != 0 {
		return runsc.Finding{Name: name, Status: runsc.CheckProblem,
			Seen: fmt.Sprintf("%s is writable by every user (mode %o): anyone could swap the server's directories or its key", dir, st.Mode().Perm()),
			Fix:  "sudo chmod 700 " + dir}
	}
	seen := dir
	db := config.DBPath(dir)
	if f, err := os.Open(db); err == nil {
		head := make([]byte, 16)
		n, _ := io.ReadFull(f, head)
		f.Close()
		if n > 0 && string(head[:n]) != sqliteMagic { // an empty file is a database yet to be made
			return runsc.Finding{Name: name, Status: runsc.CheckProblem, Seen: db + " is not an SQLite database",
				Fix: "restore it from a backup, or move it away to start afresh: sudo mv " + db + " " + db + ".broken"}
		}
		seen += " (with a database)"
	} else {
		seen += " (no database yet: the server makes it at its first start)"
	}
	key := filepath.Join(dir, store.KeyFile)
	if st, err := os.Stat(key); err == nil && os.Getenv("SANDBOXD_SECRETS_KEY") == "" && st.Size() != 32 {
		return runsc.Finding{Name: name, Status: runsc.CheckProblem, Seen: fmt.Sprintf("%s holds %d bytes, not a 32-byte key: the server cannot open its sealed secrets", key, st.Size()),
			Fix: "restore " + key + " from a backup (a new key cannot open secrets sealed with the old one; without any, remove it)"}
	} else if err == nil && st.Mode().Perm()&0o077 != 0 {
		return runsc.Finding{Name: name, Status: runsc.CheckProblem, Seen: fmt.Sprintf("%s is readable by other users (mode %o): it opens every stored secret", key, st.Mode().Perm()),
			Fix: "sudo chmod 600 " + key}
	}
	return runsc.Finding{Name: name, Status: runsc.CheckOK, Seen: seen}
}

// sqliteMagic starts every SQLite database file.
const sqliteMagic = "SQLite format 3\x00"

// checkImage looks for the configured recipe's image where the server
// would (image.Find: without building or touching the cache), and for the
// command a build needs.
func (c *cli) checkImage(cfg *config.Config) (out []runsc.Finding, built bool) {
	r, err := cfg.ImageRecipe()
	if err != nil {
		return []runsc.Finding{{Name: "image", Status: runsc.CheckProblem, Seen: "image recipe: " + err.Error(), Fix: "sudo make build   (the recipe is built into sandboxd)"}}, false
	}
	path, built := image.Find(cfg.Image.CacheDir, r)
	if built {
		out = append(out, runsc.Finding{Name: "image", Status: runsc.CheckOK, Seen: r.Key() + " at " + path})
	} else {
		seen := fmt.Sprintf("%s is not built in %s", r.Key(), cfg.Image.CacheDir)
		if image.Building(cfg.Image.CacheDir) {
			seen += "; a build is running now (another process holds the cache's lock): wait for it"
		} else if cfg.Image.AutoBuild {
			seen += "; serve would build it first (image.autoBuild), which takes minutes"
		}
		fix := "sudo make image   (or: sudo " + self() + " image)"
		if f := c.configFile(); f != "" {
			fix = "sudo " + self() + " image --config " + f
		}
		out = append(out, runsc.Finding{Name: "image", Status: runsc.CheckProblem, Seen: seen, Fix: fix})
	}
	name := "command: " + image.Builder
	fix := "sudo apt-get install -y " + image.Builder + "   (or: sudo make host-packages)"
	switch p, err := exec.LookPath(image.Builder); {
	case err == nil:
		out = append(out, runsc.Finding{Name: name, Status: runsc.CheckOK, Seen: p})
	case built:
		out = append(out, runsc.Finding{Name: name, Status: runsc.CheckWarn, Fix: fix,
			Seen: "not on PATH: needed only to build an image (a new recipe)"})
	default:
		out = append(out, runsc.Finding{Name: name, Status: runsc.CheckProblem, Fix: fix,
			Seen: "not on PATH: the missing image cannot be built without it"})
	}
	return out, built
}

// imageBuildMiB is about what a build of the default image takes.
const imageBuildMiB = 4096

// checkDisk compares the free space of the data dir's file system with
// limits.minFreeDiskMiB (below it the server refuses provisions) and
// pressureFreeDiskMiB (below it growing sandboxes are stopped), and that
// of the image cache with what a build needs when the image is missing.
func checkDisk(cfg *config.Config, imageBuilt bool) []runsc.Finding {
	min, pressure := int64(cfg.Limits.MinFreeDiskMiB), int64(cfg.Limits.PressureFreeDiskMiB)
	data := runsc.Finding{Name: "disk: data dir"}
	dataFree, dataFS, err := freeMiB(cfg.DataDir)
	switch {
	case err != nil:
		data.Status, data.Seen = runsc.CheckWarn, err.Error()
	case dataFree < min:
		data.Status = runsc.CheckProblem
		data.Seen = fmt.Sprintf("%d MiB free on the file system of %s, below limits.minFreeDiskMiB (%d): the server refuses to provision", dataFree, cfg.DataDir, min)
		data.Fix = fmt.Sprintf("free %d MiB or more there (sudo du -xh -d1 %s | sort -h shows what takes it), or lower limits.minFreeDiskMiB in the config", min-dataFree, existingAncestor(cfg.DataDir))
	case dataFree < pressure:
		data.Status = runsc.CheckWarn
		data.Seen = fmt.Sprintf("%d MiB free on the file system of %s, below limits.pressureFreeDiskMiB (%d): the server stops every sandbox whose disk grows", dataFree, cfg.DataDir, pressure)
		data.Fix = fmt.Sprintf("free %d MiB or more there (sudo du -xh -d1 %s | sort -h shows what takes it), or lower limits.pressureFreeDiskMiB in the config", pressure-dataFree, existingAncestor(cfg.DataDir))
	default:
		data.Status = runsc.CheckOK
		data.Seen = fmt.Sprintf("%d MiB free on the file system of %s (limits.minFreeDiskMiB %d, pressureFreeDiskMiB %d)", dataFree, cfg.DataDir, min, pressure)
	}
	cache := runsc.Finding{Name: "disk: image cache"}
	cacheFree, cacheFS, err := freeMiB(cfg.Image.CacheDir)
	switch {
	case err != nil:
		cache.Status, cache.Seen = runsc.CheckWarn, err.Error()
	case !imageBuilt && cacheFree < imageBuildMiB:
		cache.Status = runsc.CheckWarn
		cache.Seen = fmt.Sprintf("%d MiB free on the file system of %s; building the missing image takes about %d MiB", cacheFree, cfg.Image.CacheDir, imageBuildMiB)
		cache.Fix = fmt.Sprintf("free %d MiB or more there, or set image.cacheDir to a larger file system", imageBuildMiB-cacheFree)
	default:
		cache.Status = runsc.CheckOK
		cache.Seen = fmt.Sprintf("%d MiB free on the file system of %s", cacheFree, cfg.Image.CacheDir)
		if dataFS == cacheFS {
			cache.Seen += " (the data dir's)"
		}
	}
	return []runsc.Finding{data, cache}
}

// freeMiB is the space an unprivileged writer may use on the file system
// of path (or of its nearest existing parent), and that file system's id.
func freeMiB(path string) (int64, [2]int32, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(existingAncestor(path), &st); err != nil {
		return 0, [2]int32{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	return int64(st.Bavail) * int64(st.Bsize) >> 20, st.Fsid.Val, nil
}

func existingAncestor(p string) string {
	for {
		if _, err := os.Stat(p); err == nil || p == filepath.Dir(p) {
			return p
		}
		p = filepath.Dir(p)
	}
}

const serverStopped = "not running on this data dir"

// checkServer says whether a server runs on the data dir (it holds
// <data-dir>/sandboxd.lock) and, if /proc/locks tells, its pid.
func checkServer(dataDir string) (runsc.Finding, int) {
	if !serverRunning(dataDir) {
		return runsc.Finding{Name: "server", Status: runsc.CheckOK, Seen: serverStopped}, 0
	}
	lock := filepath.Join(dataDir, lockName)
	pid := lockHolder(lock)
	seen := "running: a process holds " + lock
	if pid > 0 {
		seen = fmt.Sprintf("running: pid %d (%s) holds %s", pid, comm(pid), lock)
	}
	return runsc.Finding{Name: "server", Status: runsc.CheckOK, Seen: seen}, pid
}

// lockHolder returns the pid /proc/locks names for a flock on path (0 if
// none or unknown).
func lockHolder(path string) int {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	return parseLockHolder(string(b), unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
}

// parseLockHolder finds the holder of a FLOCK on the file (device numbers,
// inode) in /proc/locks lines like "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF".
func parseLockHolder(locks string, major, minor uint32, ino uint64) int {
	for _, line := range strings.Split(locks, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != "FLOCK" { // "->" lines are waiters
			continue
		}
		id := strings.Split(f[5], ":")
		if len(id) != 3 {
			continue
		}
		maj, err1 := strconv.ParseUint(id[0], 16, 32)
		mnr, err2 := strconv.ParseUint(id[1], 16, 32)
		in, err3 := strconv.ParseUint(id[2], 10, 64)
		pid, err4 := strconv.Atoi(f[4])
		if err1 == nil && err2 == nil && err3 == nil && err4 == nil && uint32(maj) == major && uint32(mnr) == minor && in == ino && pid > 0 {
			return pid
		}
	}
	return 0
}

// checkListen checks that the server can listen on addr: it is free, or a
// server on this data dir holds it (serverPid, when known, must be the
// process that listens).
func checkListen(addr string, serverOnDataDir bool, serverPid int) runsc.Finding {
	name := "listen " + addr
	fix := "listen on another address (listen: in the config, or serve --listen ADDR)"
	l, err := net.Listen("tcp", addr)
	if err == nil {
		l.Close()
		seen := "free"
		if serverOnDataDir {
			seen = "free: the server on this data dir listens elsewhere (started with --listen? give doctor the same)"
		}
		return runsc.Finding{Name: name, Status: runsc.CheckOK, Seen: seen}
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return runsc.Finding{Name: name, Status: runsc.CheckProblem, Seen: "cannot listen: " + err.Error(),
			Fix: "set listen: to an address of this host (e.g. 127.0.0.1:8080)"}
	}
	pids := listenerPids(addr)
	switch {
	case serverOnDataDir && serverPid > 0 && slices.Contains(pids, serverPid):
		return runsc.Finding{Name: name, Status: runsc.CheckOK, Seen: fmt.Sprintf("held by the server running on this data dir (pid %d)", serverPid)}
	case serverOnDataDir && (serverPid == 0 || len(pids) == 0):
		return runsc.Finding{Name: name, Status: runsc.CheckOK, Seen: "in use; server running on this data dir (it holds sandboxd.lock)"}
	}
	holder := "another process"
	if len(pids) > 0 {
		var who []string
		for _, p := range pids {
			who = append(who, fmt.Sprintf("pid %d (%s)", p, comm(p)))
		}
		holder = strings.Join(who, ", ")
		fix = fmt.Sprintf("stop %s, or %s", holder, fix)
	}
	seen := "in use by " + holder
	if serverOnDataDir {
		seen += fmt.Sprintf(", not by the server on this data dir (pid %d)", serverPid)
	}
	return runsc.Finding{Name: name, Status: runsc.CheckProblem, Seen: seen, Fix: fix}
}

// comm is a process's command name ("?" if it is gone).
func comm(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// listenerPids returns the processes with a listening TCP socket that
// keeps addr from being bound: same port, and the same or a wildcard
// address (a wildcard addr conflicts with every address).
func listenerPids(addr string) []int {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil
	}
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else if host != "" {
		ips, _ = net.LookupIP(host)
	}
	inodes := map[uint64]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range parseListeners(string(b)) {
			if s.port != port {
				continue
			}
			conflict := len(ips) == 0 || s.ip.IsUnspecified()
			for _, ip := range ips {
				conflict = conflict || ip.IsUnspecified() || ip.Equal(s.ip)
			}
			if conflict {
				inodes[s.inode] = true
			}
		}
	}
	if len(inodes) == 0 {
		return nil
	}
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name()))
			if err != nil {
				continue
			}
			if n, ok := strings.CutPrefix(link, "socket:["); ok {
				if ino, err := strconv.ParseUint(strings.TrimSuffix(n, "]"), 10, 64); err == nil && inodes[ino] {
					pids = append(pids, pid)
					break
				}
			}
		}
	}
	return pids
}

type tcpListener struct {
	ip    net.IP
	port  int
	inode uint64
}

// parseListeners reads the listening sockets of /proc/net/tcp or tcp6:
// "sl local_address rem_address st ... uid timeout inode", the address as
// hex of the kernel's 32-bit words in host byte order.
func parseListeners(s string) []tcpListener {
	var out []tcpListener
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "0A" { // TCP_LISTEN
			continue
		}
		hexIP, hexPort, ok := strings.Cut(f[1], ":")
		if !ok || (len(hexIP) != 8 && len(hexIP) != 32) {
			continue
		}
		port, err1 := strconv.ParseUint(hexPort, 16, 16)
		inode, err2 := strconv.ParseUint(f[9], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		ip := make(net.IP, len(hexIP)/2)
		bad := false
		for w := 0; w < len(ip)/4; w++ {
			v, err := strconv.ParseUint(hexIP[w*8:w*8+8], 16, 32)
			if err != nil {
				bad = true
				break
			}
			binary.NativeEndian.PutUint32(ip[w*4:], uint32(v))
		}
		if !bad {
			out = append(out, tcpListener{ip: ip, port: int(port), inode: inode})
		}
	}
	return out
}

// threadsPerSandbox is about how many host threads (each a process id) a
// sandbox takes: 31 measured idle on a standard-1 (the sentry's 17
// threads, the gofer's 9, systrap stubs, runsc), more when busy.
const threadsPerSandbox = 32

// checkPids compares the host's process ids with what limits.maxSandboxes
// sandboxes need: a sandbox that cannot make a host thread dies, so the
// server refuses starts below limits.minFreePids.
func checkPids(cfg *config.Config) runsc.Finding {
	f := runsc.Finding{Name: "process ids"}
	used, limit := sandbox.HostPids()
	if used < 0 || limit < 0 {
		f.Status, f.Seen = runsc.CheckWarn, "cannot read /proc/loadavg or kernel.pid_max"
		return f
	}
	need := cfg.Limits.MaxSandboxes*threadsPerSandbox + cfg.Limits.MinFreePids + used
	f.Seen = fmt.Sprintf("%d of %d in use (the smaller of kernel.pid_max and kernel.threads-max); limits.maxSandboxes %d at about %d threads each needs %d",
		used, limit, cfg.Limits.MaxSandboxes, threadsPerSandbox, need)
	if limit < need {
		f.Status = runsc.CheckWarn
		f.Seen += fmt.Sprintf(": the server will refuse starts (limits.minFreePids) at about %d sandboxes", max(0, (limit-used-cfg.Limits.MinFreePids)/threadsPerSandbox))
		f.Fix = "raise the limit: sudo sysctl -w kernel.pid_max=4194304 (and put kernel.pid_max = 4194304 in /etc/sysctl.d/60-sandboxd.conf to keep it), or lower limits.maxSandboxes"
		return f
	}
	f.Status = runsc.CheckOK
	return f
}
