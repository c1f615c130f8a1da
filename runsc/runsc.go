// Package runsc drives gVisor sandboxes: one runsc container per session,
// with its own OCI bundle, disk (a loop-mounted ext4 image holding the
// writable root layer and /workspace), network namespace and cgroups nested
// under the server's own.
//
// Every resource a Runtime makes carries its Prefix (container ids, netns
// names, cgroup names, mount points under StateDir), so leftovers of a crashed
// server can be found (Leftovers) and collected by Collect or sandboxd gc.
//
// Concurrency: a Runtime is safe for concurrent use on different sandbox ids;
// callers serialize operations on the same id.
package runsc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Config locates runsc and the state a Runtime keeps.
type Config struct {
	// Binary is the absolute path of runsc (built from the pinned module).
	Binary string
	// StateDir holds runsc's state root and one directory per sandbox.
	StateDir string
	// Agent is the absolute path of the static sandboxd-agent binary,
	// bind-mounted read-only into every sandbox as its init.
	Agent string
	// Prefix starts every container id, netns and cgroup name (e.g. "sbx-1a2b3c").
	Prefix string
	// Platform is runsc's --platform (default systrap).
	Platform string
	// TrustBundle, if set, is a host PEM file mounted read-only over the
	// sandbox's system trust store (/etc/ssl/certs/ca-certificates.crt):
	// the image's roots plus the installation's Git host CA.
	TrustBundle string
	// RestoreBackground restores checkpoints with runsc restore
	// --background: the sandbox runs as soon as its kernel state is loaded
	// and its memory pages load after (see docs/BENCHMARKS.md).
	RestoreBackground bool
	// CgroupsAnywhere looks for (and removes) sandboxes' cgroups in the
	// whole of every cgroup hierarchy, not only under this process's own
	// cgroup, where the server's sandboxes nest: for a tool run outside
	// the server's cgroup (sandboxd gc). Sandboxes it creates still nest
	// under its own.
	CgroupsAnywhere bool
	// Debug writes runsc debug logs under each sandbox's logs/ directory.
	Debug bool
	// Logger receives component logs; nil means slog.Default().
	Logger *slog.Logger
}

// Runtime creates, inspects and destroys sandboxes.
type Runtime struct {
	cfg    Config
	log    *slog.Logger
	cg     cgroupLayout
	cpus   cpuPlacer // cpusets chosen for sandboxes being created
	warmed sync.Map  // container id -> base env its agent's warm pool has
	procs  sync.Map  // container id -> *procSet: processes a checkpoint parks
	// running: container id -> pid of a sandbox runsc state said runs
	// (Inspect's fast path); dropped when that process is gone or the
	// sandbox is destroyed or created again.
	running sync.Map
}

// ErrDiskMissing: a resume found no disk for the sandbox on this node.
var ErrDiskMissing = errors.New("the sandbox's disk is not on this node")

// ErrNotFound is returned for a sandbox runsc does not know.
var ErrNotFound = errors.New("sandbox not found")

// New checks the configuration and prepares the state directories.
func New(cfg Config) (*Runtime, error) {
	if !filepath.IsAbs(cfg.Binary) {
		return nil, fmt.Errorf("runsc binary must be an absolute path")
	}
	if _, err := os.Stat(cfg.Binary); err != nil {
		return nil, fmt.Errorf("runsc binary: %w", err)
	}
	if !filepath.IsAbs(cfg.Agent) {
		return nil, fmt.Errorf("agent binary must be an absolute path")
	}
	if _, err := os.Stat(cfg.Agent); err != nil {
		return nil, fmt.Errorf("agent binary: %w", err)
	}
	if cfg.Prefix == "" || strings.ContainsAny(cfg.Prefix, "/ \t\n") {
		return nil, fmt.Errorf("invalid resource prefix %q", cfg.Prefix)
	}
	if err := checkSocketPaths(cfg.StateDir, cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, "runsc"), filepath.Join(cfg.StateDir, "sandboxes")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
	}
	cg, err := loadCgroupLayout()
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	cg.anywhere = cfg.CgroupsAnywhere
	return &Runtime{cfg: cfg, log: cfg.Logger.With("component", "runsc"), cg: cg}, nil
}

// maxSocketPath is the longest path a unix socket may have (sun_path holds
// 108 bytes with the terminating NUL).
const maxSocketPath = 107

// checkSocketPaths refuses a state dir whose sandboxes' agent sockets would
// be too long: a unix socket path has 107 bytes at most, and a longer one
// would fail every command later.
func checkSocketPaths(stateDir, prefix string) error {
	if n := socketPathLen(stateDir, prefix); n > maxSocketPath {
		return fmt.Errorf("data dir %q is too long: sandbox sockets under it would exceed the %d-byte limit of a unix socket path (use a data dir of at most %d bytes)",
			stateDir, maxSocketPath, len(stateDir)-(n-maxSocketPath))
	}
	return nil
}

// socketPathLen is the length of a sandbox's agent socket path (every
// container id has the same length).
func socketPathLen(stateDir, prefix string) int {
	return len(filepath.Join(stateDir, "sandboxes", prefix+"-0123456789abcdef", "run", "agent.sock"))
}

// ContainerID derives the fixed-length runsc container id of a session. A
// client's session id is never used directly: runsc resolves ids by prefix,
// and equal-length ids cannot prefix each other.
func (r *Runtime) ContainerID(orgID, sessionID string) string {
	sum := sha256.Sum256([]byte(orgID + "\x00" + sessionID))
	return r.cfg.Prefix + "-" + hex.EncodeToString(sum[:8])
}

// Owns reports whether id was made by this Runtime's prefix.
func (r *Runtime) Owns(id string) bool {
	rest, ok := strings.CutPrefix(id, r.cfg.Prefix+"-")
	if !ok || len(rest) != 16 {
		return false
	}
	_, err := hex.DecodeString(rest)
	return err == nil
}

func (r *Runtime) dir(id string) string { return filepath.Join(r.cfg.StateDir, "sandboxes", id) }

// globalArgs are the runsc flags every invocation shares.
func (r *Runtime) globalArgs() []string {
	return []string{"--root", filepath.Join(r.cfg.StateDir, "runsc")}
}

// run executes a short runsc command and returns its stdout. runsc's stderr
// goes into the returned error for the server's log only: it may hold paths
// and argv, so callers never pass it to a client.
func (r *Runtime) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.cfg.Binary, append(r.globalArgs(), args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		return out.Bytes(), &runscError{op: args[0], msg: msg, err: err}
	}
	return out.Bytes(), nil
}

// runscError keeps runsc's own message for logs; Error() is safe to log,
// never to send to a client.
type runscError struct {
	op, msg string
	err     error
}

func (e *runscError) Error() string { return fmt.Sprintf("runsc %s: %v: %s", e.op, e.err, e.msg) }
func (e *runscError) Unwrap() error { return e.err }

func (e *runscError) notFound() bool {
	return strings.Contains(e.msg, "does not exist") || strings.Contains(e.msg, "not found") ||
		strings.Contains(e.msg, "no such file")
}

// ReleaseIdle undoes what runsc keeps for running sandboxes when none is
// left: the "null-netns" bind mount it pins in its state root. Called when
// the server stops, so an idle data dir holds no mount.
func (r *Runtime) ReleaseIdle() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if sts, err := r.List(ctx); err != nil || len(sts) > 0 {
		return
	}
	if p, mounted := r.NullNetns(); mounted {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			r.log.Warn("unmount runsc null-netns", "err", err)
		}
	}
}
