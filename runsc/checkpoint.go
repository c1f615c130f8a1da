package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"sandboxd/runsc/agent"
)

// Pause with memory: Checkpoint saves a running sandbox (its memory and
// processes) with `runsc checkpoint` into an image directory and releases
// everything but its disk; Restore brings it back from that image with
// `runsc create` + `runsc restore` on the same disk, bundle paths and
// container id.
//
// What had to change for our sandboxes (measured on real gVisor):
//   - gVisor cannot save a socket bound to a host file ("Cannot save
//     endpoint with bound host socket"), which the agent's listener in the
//     host-backed run dir is. Before the checkpoint the agent is suspended
//     (op suspend: listener and connections closed, its processes parked
//     with their output kept), and after a restore, or a checkpoint that
//     failed, SIGUSR1 (runsc kill) makes it listen again.
//   - The host side of the agent's processes (terminals, code contexts, a
//     running exec) are *agent.Process values that outlive the pause:
//     they are parked before the suspend and re-attached by pid after the
//     restore, so the server's terminals and contexts go on unchanged.
//   - runsc exec processes (exec streams) hold host pipes gVisor cannot
//     carry over: they are ended before the checkpoint.
//   - Restore re-creates the netns, mounts and cgroups as a create does;
//     the netstack's state comes from the image.

// checkpointDir is where a sandbox's checkpoint image lives, under its
// directory (CheckpointDir).
const checkpointDir = "checkpoint"

// ImageFiles are the files of a checkpoint image (runsc checkpoint without
// compression).
var ImageFiles = []string{"checkpoint.img", "pages_meta.img", "pages.img"}

// CheckpointDir is the local image directory of sandbox id's checkpoint.
func (r *Runtime) CheckpointDir(id string) string { return filepath.Join(r.dir(id), checkpointDir) }

// procSet is what a sandbox's agent runs for the server right now.
type procSet struct {
	mu     sync.Mutex
	agent  map[*agent.Process]struct{}
	direct map[*DirectProcess]struct{}
}

func (r *Runtime) procSet(id string) *procSet {
	v, _ := r.procs.LoadOrStore(id, &procSet{agent: map[*agent.Process]struct{}{}, direct: map[*DirectProcess]struct{}{}})
	return v.(*procSet)
}

// track remembers a started agent process (dropping ended ones).
func (r *Runtime) track(id string, p *agent.Process) {
	s := r.procSet(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	for q := range s.agent {
		if q.Done() {
			delete(s.agent, q)
		}
	}
	s.agent[p] = struct{}{}
}

func (r *Runtime) trackDirect(id string, p *DirectProcess) {
	s := r.procSet(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	for q := range s.direct {
		select {
		case <-q.done:
			delete(s.direct, q)
		default:
		}
	}
	s.direct[p] = struct{}{}
}

func (s *procSet) live() (ap []*agent.Process, dp []*DirectProcess) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.agent {
		if !p.Done() {
			ap = append(ap, p)
		}
	}
	for p := range s.direct {
		dp = append(dp, p)
	}
	return ap, dp
}

// ErrCheckpointFailed wraps a checkpoint that failed with the sandbox
// still running.
var ErrCheckpointFailed = errors.New("checkpoint failed")

// Checkpoint saves the running sandbox id with its memory into imageDir
// (created 0700; it must not exist or be empty) and stops it, releasing its cgroups,
// netns and mounts; its disk and bundle stay for Restore. commit (if not
// nil) runs once the image is complete, while the sandbox is still there,
// frozen: it keeps the image (e.g. in storage). If the checkpoint or
// commit fails and the sandbox still runs, it goes on as before (processes
// re-attached) and the error wraps ErrCheckpointFailed (and commit's
// error); imageDir is removed either way.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string, commit func(context.Context) error) (err error) {
	if !r.Owns(id) {
		return fmt.Errorf("container id %q not made by this runtime", id)
	}
	if err := os.Mkdir(imageDir, 0o700); err != nil && !emptyDir(imageDir) {
		return fmt.Errorf("%w: image dir: %v", ErrCheckpointFailed, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(imageDir)
		}
	}()
	aps, dps := r.procSet(id).live()
	for _, p := range dps {
		p.Close() // host pipes cannot be saved
	}
	for _, p := range aps {
		p.Park()
	}
	if err := r.Agent(id).Suspend(ctx); err != nil {
		r.wake(id, aps)
		return fmt.Errorf("%w: suspend agent: %v", ErrCheckpointFailed, err)
	}
	// gVisor ends the sandbox after a save, and after a failed one too.
	// So the sandbox is paused first and saved with --leave-running: it
	// stays frozen after a good save (nothing runs between the image and
	// the delete, so the disk matches the memory) and resumes after a bad
	// one.
	if _, err := r.run(ctx, "pause", id); err != nil {
		r.wake(id, aps)
		return fmt.Errorf("%w: pause: %v", ErrCheckpointFailed, err)
	}
	_, err = r.run(ctx, "checkpoint", "--leave-running", "--image-path", imageDir, id)
	if err == nil {
		for _, f := range ImageFiles {
			os.Chmod(filepath.Join(imageDir, f), 0o600)
		}
		if commit != nil {
			if cerr := commit(ctx); cerr != nil {
				err = fmt.Errorf("keep the image: %w", cerr)
			}
		}
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, rerr := r.run(rctx, "resume", id)
		cancel()
		if rerr == nil && r.alive(id) {
			r.wake(id, aps)
			return fmt.Errorf("%w: %w", ErrCheckpointFailed, err)
		}
		r.AbandonParked(id)
		return errors.Join(err, rerr) // the sandbox died: the caller tears it down
	}
	// Release the frozen sandbox's compute, keep disk.img and the image.
	// The parked processes wait for Restore.
	return r.release(ctx, id)
}

func emptyDir(p string) bool {
	ents, err := os.ReadDir(p)
	return err == nil && len(ents) == 0
}

// release removes the runsc container, cgroups, netns and mounts of a
// checkpointed sandbox, keeping its directory (disk.img, image, run dir).
func (r *Runtime) release(ctx context.Context, id string) error {
	var errs []error
	if _, err := r.run(ctx, "delete", "--force", id); err != nil {
		var re *runscError
		if !(errors.As(err, &re) && re.notFound()) {
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
	if err := r.unmountDisk(id); err != nil {
		errs = append(errs, err)
	}
	os.Remove(filepath.Join(r.dir(id), "sandbox.pid"))
	return errors.Join(errs...)
}

// wake makes a suspended agent listen again and re-attaches the parked
// processes (those it cannot are ended as lost).
func (r *Runtime) wake(id string, aps []*agent.Process) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.run(ctx, "kill", id, "USR1")
	var err error
	for {
		if _, err = r.Agent(id).Ping(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, p := range aps {
		if e := p.Reattach(ctx); e != nil {
			p.Abandon(e)
		}
	}
	if err != nil {
		return fmt.Errorf("agent after restore: %w", err)
	}
	// What is still parked has no client here (a server restart lost it):
	// ended now, not at the agent's 60 s expiry. An agent too old for the
	// op leaves them to that expiry.
	if e := r.Agent(id).Expire(ctx); e != nil {
		r.log.Debug("expire parked processes", "id", id, "err", e)
	}
	return nil
}

// Wake makes the agent of a running sandbox listen again if a pause left it
// suspended (a server killed between the agent's suspend and the end of the
// checkpoint, or between a restore and the re-listen) and ends the
// processes it still keeps parked for a server that is gone. A no-op on a
// listening agent with nothing parked.
func (r *Runtime) Wake(id string) error {
	return r.wake(id, nil)
}

// Restore starts sandbox sb again from the image Checkpoint wrote, on its
// kept disk: processes go on where they were. It is transactional like
// Create (on failure nothing but the disk and the image is left), and the
// processes parked by the checkpoint are re-attached; if it fails they end
// as lost.
func (r *Runtime) Restore(ctx context.Context, sb Sandbox, imageDir string) error {
	if _, err := os.Stat(filepath.Join(imageDir, "checkpoint.img")); err != nil {
		return fmt.Errorf("checkpoint image: %w", err)
	}
	aps, _ := r.procSet(sb.ID).live()
	err := r.setup(ctx, sb, func(ctx context.Context) error {
		args := []string{"restore", "--image-path", imageDir, "--detach"}
		if r.cfg.RestoreBackground {
			args = append(args, "--background")
		}
		if _, err := r.run(ctx, append(args, sb.ID)...); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := r.wake(sb.ID, aps); err != nil {
		return err
	}
	return nil
}

// AbandonParked ends the parked processes of a sandbox that will not be
// restored (torn down or deleted while paused, or restored cold).
func (r *Runtime) AbandonParked(id string) {
	aps, _ := r.procSet(id).live()
	for _, p := range aps {
		p.Abandon(errors.New("sandbox not restored"))
	}
}
