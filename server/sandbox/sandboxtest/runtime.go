// Package sandboxtest holds test doubles for the sandbox domain: a fake
// gVisor driver. Tests only; nothing here reaches a running server.
package sandboxtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
)

// Runtime is a fake gVisor driver that records what it is asked and
// keeps each sandbox's workspace as a plain directory under WorkspaceRoot.
// Set the exported fields before use (or under Mu).
type Runtime struct {
	Mu            sync.Mutex
	WorkspaceRoot string
	Calls         []string // "create <id>", "destroy <id> keep=<bool>", "exec <id>", "inspect <id>"
	Created       []runsc.Sandbox
	Execs         []runsc.ExecRequest
	CreateErr     error
	DestroyErr    error
	InspectState  runsc.State
	// ExecFn, if set, runs for Exec; by default Exec prints "ok" and exits 0.
	ExecFn func(req runsc.ExecRequest) (runsc.ExecResult, error)
	// CreateGate, if set, makes Create signal CreateStarted and wait for it.
	CreateGate    chan struct{}
	CreateStarted chan struct{}
	// CheckpointErr and RestoreErr fail Checkpoint and Restore.
	CheckpointErr, RestoreErr error
	// DialFn, if set, serves DialPort; by default nothing listens.
	DialFn func(ctx context.Context, id string, port int) (net.Conn, error)
	// Disks is what DiskUse answers, by container id (zero if absent).
	Disks map[string]runsc.DiskUse
}

// DiskUse answers from Disks.
func (f *Runtime) DiskUse(id string) runsc.DiskUse {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	return f.Disks[id]
}

// SetDisk sets what DiskUse answers for id.
func (f *Runtime) SetDisk(id string, u runsc.DiskUse) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if f.Disks == nil {
		f.Disks = map[string]runsc.DiskUse{}
	}
	f.Disks[id] = u
}

// ContainerID hashes org and session like the real driver.
func (f *Runtime) ContainerID(orgID, sessionID string) string {
	sum := sha256.Sum256([]byte(orgID + "\x00" + sessionID))
	return "sbxtest-" + hex.EncodeToString(sum[:8])
}

// Record appends a call.
func (f *Runtime) Record(s string) {
	f.Mu.Lock()
	f.Calls = append(f.Calls, s)
	f.Mu.Unlock()
}

func (f *Runtime) Create(ctx context.Context, sb runsc.Sandbox) error {
	if f.CreateGate != nil {
		f.CreateStarted <- struct{}{}
		<-f.CreateGate
	}
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.Calls = append(f.Calls, "create "+sb.ID)
	f.Created = append(f.Created, sb)
	if f.CreateErr != nil {
		return f.CreateErr
	}
	ws := filepath.Join(f.WorkspaceRoot, sb.ID)
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(ws, "README"), []byte("hello"), 0o644)
}

func (f *Runtime) Destroy(ctx context.Context, id string, o runsc.DestroyOpts) error {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.Calls = append(f.Calls, fmt.Sprintf("destroy %s keep=%v", id, o.KeepDisk))
	return f.DestroyErr
}

func (f *Runtime) Inspect(ctx context.Context, id string) (runsc.State, error) {
	f.Record("inspect " + id)
	f.Mu.Lock()
	defer f.Mu.Unlock()
	st := f.InspectState
	st.ID = id
	if st.Status == "" {
		st.Status = runsc.StatusRunning
	}
	return st, nil
}

func (f *Runtime) Exec(ctx context.Context, id string, req runsc.ExecRequest) (runsc.ExecResult, error) {
	f.Mu.Lock()
	f.Calls = append(f.Calls, "exec "+id)
	f.Execs = append(f.Execs, req)
	fn := f.ExecFn
	f.Mu.Unlock()
	if fn != nil {
		return fn(req)
	}
	io.WriteString(req.Stdout, "ok\n")
	return runsc.ExecResult{Duration: 5 * time.Millisecond}, nil
}

func (f *Runtime) Collect(ctx context.Context, keep map[string]bool) []string { return nil }

// MoveDir: the fake keeps no sandbox dirs.
func (f *Runtime) MoveDir(from, to string) error { return nil }

// OpenWorkspace opens the fake sandbox's workspace, a plain directory.
func (f *Runtime) OpenWorkspace(id string, readOnly bool) (*os.File, func() error, error) {
	d, err := os.Open(filepath.Join(f.WorkspaceRoot, id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, runsc.ErrNoDisk
	}
	if err != nil {
		return nil, nil, err
	}
	return d, d.Close, nil
}

func (f *Runtime) KernelLog(id string) string {
	return filepath.Join(f.WorkspaceRoot, id+".kernel.log")
}

func (f *Runtime) ReleaseIdle() {}

func (f *Runtime) KillAll(ctx context.Context, id string) (runsc.KillResult, error) {
	f.Record("killall " + id)
	return runsc.KillResult{}, nil
}

func (f *Runtime) CleanExecFiles() {}

// ListenProxy gives the fake sandbox a loopback listener for its proxy.
func (f *Runtime) ListenProxy(id string) (net.Listener, error) {
	return net.Listen("tcp", "127.0.0.1:0")
}

func (f *Runtime) StartDirect(ctx context.Context, id string, s agent.Spec) (runsc.Process, error) {
	f.Record("startdirect " + id)
	return nil, errors.New("no runsc in the fake runtime")
}

func (f *Runtime) Start(ctx context.Context, id string, s agent.Spec) (runsc.Process, error) {
	f.Record("start " + id)
	return nil, &agent.AgentError{Message: "no agent in the fake runtime"}
}

// CallsWith lists the calls starting with prefix.
// DialPort connects to a port in a sandbox (DialFn).
func (f *Runtime) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	f.Record(fmt.Sprintf("dial %s %d", id, port))
	if f.DialFn != nil {
		return f.DialFn(ctx, id, port)
	}
	return nil, errors.New("connection refused")
}

func (f *Runtime) CallsWith(prefix string) []string {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	var out []string
	for _, c := range f.Calls {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

// Usage reports fixed figures for a sandbox the fake runs.
func (f *Runtime) Usage(id string) (runsc.Usage, error) {
	f.Record("usage " + id)
	return runsc.Usage{MemoryBytes: 11 << 20, MemoryLimit: 1 << 30, CPU: time.Second, Pids: 9, PidsLimit: 512, DiskUsed: 1 << 20, DiskTotal: 8 << 30}, nil
}

// CheckpointDir is where the fake writes a checkpoint image.
func (f *Runtime) CheckpointDir(id string) string {
	return filepath.Join(f.WorkspaceRoot, id+".checkpoint")
}

// Checkpoint writes a fake image into imageDir (or fails with
// CheckpointErr, writing nothing).
func (f *Runtime) Checkpoint(ctx context.Context, id, imageDir string, commit func(context.Context) error) error {
	f.Record("checkpoint " + id)
	f.Mu.Lock()
	err := f.CheckpointErr
	f.Mu.Unlock()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(imageDir, "checkpoint.img"), []byte("memory"), 0o600); err != nil {
		return err
	}
	if commit != nil {
		if err := commit(ctx); err != nil {
			os.RemoveAll(imageDir)
			return fmt.Errorf("%w: %w", runsc.ErrCheckpointFailed, err)
		}
	}
	return nil
}

// Wake records that a sandbox's agent was woken.
func (f *Runtime) Wake(id string) error { f.Record("wake " + id); return nil }

// Thaw records that a frozen sandbox was let go on.
func (f *Runtime) Thaw(ctx context.Context, id string) error { f.Record("thaw " + id); return nil }

// Restore needs the image Checkpoint wrote (or fails with RestoreErr).
func (f *Runtime) Restore(ctx context.Context, sb runsc.Sandbox, imageDir string) error {
	f.Record("restore " + sb.ID)
	f.Mu.Lock()
	err := f.RestoreErr
	f.Mu.Unlock()
	if err != nil {
		return err
	}
	_, err = os.Stat(filepath.Join(imageDir, "checkpoint.img"))
	return err
}

func (f *Runtime) AbandonParked(id string) { f.Record("abandon " + id) }
