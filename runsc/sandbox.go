package runsc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Status of a sandbox as the runtime sees it.
type Status string

const (
	StatusRunning Status = "running"
	StatusCreated Status = "created"
	StatusStopped Status = "stopped" // not running: exited, killed, OOM or gone
	StatusMissing Status = "missing" // runsc does not know the id
	StatusFrozen  Status = "paused"  // frozen by runsc pause (a save or checkpoint in progress)
)

// State is what Inspect reports.
type State struct {
	ID       string
	Status   Status
	Pid      int   // host pid of the sandbox process (0 if none)
	OOMKills int64 // OOM kills recorded by the sandbox's memory cgroup
	// DiskFailed: the sandbox runs, but the kernel turned its disk
	// read-only (its journal aborted: a write to disk.img failed, e.g.
	// the host's disk was full). It stays so until the disk is unmounted.
	DiskFailed bool
}

// undoStack runs registered undo steps in reverse order (Create runs it
// when it fails).
type undoStack []func()

func (u *undoStack) push(f func()) { *u = append(*u, f) }
func (u *undoStack) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
}

// Create provisions and starts a sandbox. It is transactional: on any error
// every step already taken is undone (disk, mounts, netns, bundle, runsc
// container, cgroups) and nothing is left behind. An existing disk.img (from
// a teardown) is reused, so its files come back.
func (r *Runtime) Create(ctx context.Context, sb Sandbox) (err error) {
	r.warmed.Delete(sb.ID) // a new agent starts without a pool
	return r.setup(ctx, sb, func(ctx context.Context) error {
		if _, err := r.run(ctx, "start", sb.ID); err != nil {
			return fmt.Errorf("start: %w", err)
		}
		return nil
	})
}

// setup prepares and creates sandbox sb, then runs start (runsc start, or
// restore) on it, undoing every step if any fails.
func (r *Runtime) setup(ctx context.Context, sb Sandbox, start func(context.Context) error) (err error) {
	if !r.Owns(sb.ID) {
		return fmt.Errorf("container id %q not made by this runtime", sb.ID)
	}
	r.running.Delete(sb.ID)
	if err := sb.Limits.validate(); err != nil {
		return err
	}
	var undo undoStack
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	d := r.dir(sb.ID)
	_, statErr := os.Stat(filepath.Join(d, "disk.img"))
	hadDisk := statErr == nil
	if hadDisk {
		// runsc appends to its logs: start the kernel log afresh so a
		// resumed sandbox's is not read twice.
		os.RemoveAll(filepath.Join(d, "logs"))
	}
	for _, sub := range []string{"logs", "run"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o700); err != nil {
			return fmt.Errorf("sandbox dir: %w", err)
		}
	}
	os.Remove(filepath.Join(d, "run", "agent.sock")) // a stale socket from before a teardown
	undo.push(func() {
		if hadDisk {
			os.RemoveAll(filepath.Join(d, "logs"))
			os.Remove(filepath.Join(d, "config.json"))
			return
		}
		if !isMountPoint(filepath.Join(d, "disk")) {
			os.RemoveAll(d)
		}
	})
	if sb.Existing {
		if st, err := os.Lstat(filepath.Join(r.dir(sb.ID), "disk.img")); err != nil || !st.Mode().IsRegular() {
			return ErrDiskMissing
		}
	}
	// From here on the disk changes: it is no longer a copy of a save.
	if err := r.unmarkSaved(sb.ID); err != nil {
		return fmt.Errorf("disk marker: %w", err)
	}
	if _, err := r.mountDisk(sb.ID, sb.Image, sb.Limits.DiskMiB); err != nil {
		return err
	}
	undo.push(func() { r.unmountDisk(sb.ID) })

	if err := createSandboxNet(sb.ID); err != nil {
		return err
	}
	undo.push(func() { deleteSandboxNet(sb.ID) })
	r.hang("create-mounted")

	cpus, releaseCPUs := r.chooseCPUs(sb.ID, sb.Limits.VCPUs)
	defer releaseCPUs() // when Create returns, runsc has made the cgroup or Create failed
	spec := BuildSpec(sb, r.paths(sb.ID), sb.ID, cpus)
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(d, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}

	undo.push(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.run(dctx, "delete", "--force", sb.ID)
		r.cg.remove(sb.ID)
	})
	if err := r.create(ctx, sb.ID); err != nil {
		return err
	}
	r.hang("create-created")
	if err := start(ctx); err != nil {
		return err
	}
	// The agent comes up a few milliseconds after start; Create does not
	// wait for it: commands use runsc exec until it answers, and Start
	// (terminals) waits for it.
	return nil
}

// create runs `runsc create`. Its stdio becomes the sandbox init's stdio, so
// it goes to a log file, never to a pipe that would outlive the command; and
// the sandbox starts in its own session so that stopping the server (or a
// Ctrl-C in its terminal) does not reach it.
func (r *Runtime) create(ctx context.Context, id string) error {
	d := r.dir(id)
	logf, err := os.OpenFile(filepath.Join(d, "logs", "init.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append(r.globalArgs(),
		"--platform", r.cfg.Platform,
		"--network", "sandbox",
		"--overlay2", "none",
		// The agent listens on a unix socket in the host-backed run dir.
		"--host-uds", "create",
		// The sentry's own log (unsupported syscalls, warnings): the
		// sandbox's kernel output. Info level, small.
		"--debug-log", filepath.Join(d, "logs", "runsc.%COMMAND%.log"),
	)
	if r.cfg.Debug {
		args = append(args, "--debug")
	}
	args = append(args, "create", "--bundle", d, "--pid-file", filepath.Join(d, "sandbox.pid"), id)
	cmd := exec.CommandContext(ctx, r.cfg.Binary, args...)
	cmd.Dir = d
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return &runscError{op: "create", msg: lastLine(filepath.Join(d, "logs", "init.log")), err: err}
	}
	return nil
}

func lastLine(path string) string {
	b, _ := os.ReadFile(path)
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// DestroyOpts says what Destroy keeps.
type DestroyOpts struct {
	// KeepDisk keeps disk.img (the sandbox's writable state: /workspace,
	// /tmp, the root layer) and its disk.saved marker for a later Create
	// with the same id: the node's cache of the session's save in the
	// organization's storage (see save.go). It also keeps a checkpoint
	// image (pause; its owner deletes it).
	KeepDisk bool
}

// Destroy stops and removes a sandbox. It is idempotent and keeps going after
// a failed step.
func (r *Runtime) Destroy(ctx context.Context, id string, o DestroyOpts) error {
	if !r.Owns(id) {
		return fmt.Errorf("container id %q not made by this runtime", id)
	}
	r.running.Delete(id)
	d := r.dir(id)
	if fi, err := os.Lstat(d); err == nil && !fi.IsDir() {
		// Planted or broken: nothing is followed out of the sandboxes dir.
		return fmt.Errorf("sandbox dir %s is not a directory (a symlink?): not touched", d)
	}
	var errs []error
	if err := r.forgetDeadState(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if _, err := r.run(ctx, "delete", "--force", id); err != nil {
		var re *runscError
		if !(errors.As(err, &re) && re.notFound()) {
			// The sandbox process may be gone while runsc's state remains
			// (e.g. after an OOM kill): kill what is left, then retry.
			r.killSandboxProcess(id)
			if _, err2 := r.run(ctx, "delete", "--force", id); err2 != nil && !(errors.As(err2, &re) && re.notFound()) {
				errs = append(errs, err2)
			}
		}
	}
	if err := r.cg.remove(id); err != nil {
		errs = append(errs, err)
	}
	if err := deleteSandboxNet(id); err != nil {
		errs = append(errs, err)
	}
	r.AbandonParked(id)
	r.procs.Delete(id)
	if err := errors.Join(r.unmountDisk(id), unmount(filepath.Join(d, restoreMnt)), unmountAllUnder(d)); err != nil {
		errs = append(errs, err)
		return errors.Join(errs...) // never delete through a live mount
	}
	if o.KeepDisk {
		for _, name := range []string{"config.json", "sandbox.pid", "rootfs", "disk", "exec", "run", restoreMnt, restoreImgName} {
			p := filepath.Join(d, name)
			if err := os.RemoveAll(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	} else if err := os.RemoveAll(d); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// MoveDir renames the sandbox dir of from (a container id of another
// prefix: the data dir was moved, and its prefix is a hash of its path) to
// to, this runtime's id of the same session. Only a real directory with
// nothing mounted below it moves; a missing one is not an error.
func (r *Runtime) MoveDir(from, to string) error {
	if !r.Owns(to) || from == "" || filepath.Base(from) != from || from == "." || from == ".." {
		return fmt.Errorf("move sandbox dir %q to %q: bad id", from, to)
	}
	src, dst := filepath.Join(r.cfg.StateDir, "sandboxes", from), r.dir(to)
	fi, err := os.Lstat(src)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("sandbox dir %s is not a directory: not moved", src)
	case len(mountsUnder(src)) > 0 || isMountPoint(src):
		return fmt.Errorf("sandbox dir %s has mounts: not moved", src)
	}
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("sandbox dir %s exists: %s not moved", dst, src)
	}
	return os.Rename(src, dst)
}

func (r *Runtime) killSandboxProcess(id string) {
	b, err := os.ReadFile(filepath.Join(r.dir(id), "sandbox.pid"))
	if err != nil {
		return
	}
	var pid int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &pid); err == nil && pid > 1 && r.isSandboxProcess(pid, id) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// isSandboxProcess reports whether pid is sandbox id's runsc sandbox
// process (argv[0] runsc-sandbox, booting its bundle), not merely a live
// pid: runsc's state outlives a reboot (it is on the data dir's disk) and
// pids wrap, so the pid a dead sandbox had may be another process's now.
func (r *Runtime) isSandboxProcess(pid int, id string) bool {
	if !pidAlive(pid) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	return args[0] == "runsc-sandbox" && slices.Contains(args, "--bundle="+r.dir(id))
}

// forgetDeadState removes runsc's state of a sandbox whose recorded
// process is not its sandbox any more, so that no runsc command signals
// the pids it recorded (runsc delete --force kills them, whatever they now
// are). A live sandbox's state is left to runsc.
func (r *Runtime) forgetDeadState(ctx context.Context, id string) error {
	out, err := r.run(ctx, "state", id)
	if err != nil {
		return nil // unknown to runsc (or unreadable: delete says)
	}
	var st runscState
	if json.Unmarshal(out, &st) != nil || st.Pid <= 0 || r.isSandboxProcess(st.Pid, id) {
		return nil
	}
	root := filepath.Join(r.cfg.StateDir, "runsc")
	files, _ := filepath.Glob(filepath.Join(root, id+"_sandbox:*"))
	files = append(files, filepath.Join(root, "runsc-"+id+".sock"))
	var errs []error
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	r.log.Warn("runsc's record of a dead sandbox names a pid that is not its process any more; record removed", "id", id, "pid", st.Pid)
	return errors.Join(errs...)
}

type runscState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
}

// Inspect returns the sandbox's state, checked against the host: runsc's
// record can say "running" after the sandbox was killed (OOM), so the
// process is checked too.
func (r *Runtime) Inspect(ctx context.Context, id string) (State, error) {
	// A sandbox runsc said runs is checked through its sandbox process
	// (still runsc-sandbox of this bundle) and its cgroup, without a runsc
	// process: the monitor inspects every running sandbox every few
	// seconds, and at a thousand sandboxes "runsc state" each time would
	// take more CPU than the node has. Anything else asks runsc.
	if v, ok := r.running.Load(id); ok {
		if pid := v.(int); r.isSandboxProcess(pid, id) {
			return State{ID: id, Pid: pid, Status: StatusRunning, OOMKills: r.cg.oomKills(id), DiskFailed: r.diskFailed(id)}, nil
		}
		r.running.Delete(id)
	}
	out, err := r.run(ctx, "state", id)
	if err != nil {
		var re *runscError
		if errors.As(err, &re) && re.notFound() {
			return State{ID: id, Status: StatusMissing}, nil
		}
		return State{}, err
	}
	var st runscState
	if err := json.Unmarshal(out, &st); err != nil {
		return State{}, fmt.Errorf("runsc state: %w", err)
	}
	state := r.check(st)
	if state.Status == StatusRunning {
		r.running.Store(id, state.Pid)
	}
	return state, nil
}

func (r *Runtime) check(st runscState) State {
	s := State{ID: st.ID, Pid: st.Pid, OOMKills: r.cg.oomKills(st.ID)}
	switch st.Status {
	case "running", "created", "paused":
		s.Status = Status(st.Status)
		if !r.isSandboxProcess(st.Pid, st.ID) {
			s.Status = StatusStopped
		}
		s.DiskFailed = s.Status == StatusRunning && r.diskFailed(st.ID)
	default:
		s.Status = StatusStopped
	}
	return s
}

// pidAlive reports whether pid runs (a zombie, which an ancestor has not
// reaped yet, does not).
func pidAlive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || (b[i+2] != 'Z' && b[i+2] != 'X')
}

// List returns the states of this runtime's sandboxes known to runsc.
func (r *Runtime) List(ctx context.Context) ([]State, error) {
	out, err := r.run(ctx, "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var sts []runscState
	if len(strings.TrimSpace(string(out))) > 0 && strings.TrimSpace(string(out)) != "null" {
		if err := json.Unmarshal(out, &sts); err != nil {
			return nil, fmt.Errorf("runsc list: %w", err)
		}
	}
	var res []State
	for _, st := range sts {
		if r.Owns(st.ID) {
			res = append(res, r.check(st))
		}
	}
	return res, nil
}

// Collect destroys every resource with this runtime's prefix whose id is not
// in keep: runsc containers, netns, mounts and cgroups left by a crash (see
// Leftovers). Disks are kept (they may be a stopped session's state) unless
// the id is unknown to the caller too, which is the caller's decision via
// Destroy; an id with nothing but its sandbox dir is left alone.
func (r *Runtime) Collect(ctx context.Context, keep map[string]bool) []string {
	var collected []string
	ls, _ := r.Leftovers(ctx, keep) // what runsc list could not say, the other listings do
	for _, l := range ls {
		if !l.Live() {
			continue
		}
		if err := r.Destroy(ctx, l.ID, DestroyOpts{KeepDisk: true}); err != nil {
			r.log.Warn("collect leftover sandbox", "id", l.ID, "err", err)
			continue
		}
		collected = append(collected, l.ID)
	}
	return collected
}
