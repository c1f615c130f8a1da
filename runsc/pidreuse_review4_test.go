package runsc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// Review 4: a dead sandbox whose pid another process got since (a host
// reboot: runsc's state root is <data-dir>/runsc, on disk, so its state
// files outlive the boot; or a wrap of pid_max, 32768 on this host) is
// reported running by Inspect and List: runsc trusts the pid in its state
// file and check() only asks whether that pid exists and is not a zombie.
// The server's Reconcile, started after such a reboot, therefore adopts
// the session as running: exec answers "internal error" (no agent), every
// teardown fails ("the session could not be saved; ... retry"), and its
// delete (runsc delete --force) SIGKILLs the unrelated process (see
// cmd/sandboxd's TestReview4GCKillsProcessWithReusedSandboxPid for gc).
// Expected: Inspect says stopped when the process with that pid is not
// the sandbox's (its start time is after the state file's creation, or
// its cmdline is not runsc-sandbox with this root and id).
func TestReview4InspectTrustsReusedPid(t *testing.T) {
	r, img := realRuntime(t)
	sb := testSandbox(t, r, img, "reused")
	ms, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, "runsc", sb.ID+"_sandbox:*.state"))
	if len(ms) != 1 {
		t.Fatalf("state files: %v", ms)
	}
	raw, err := os.ReadFile(ms[0])
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		GoferPid int `json:"goferPid"`
		Sandbox  struct {
			Pid int `json:"pid"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || st.Sandbox.Pid <= 1 {
		t.Fatalf("state: %v %+v", err, st)
	}
	// The sandbox's processes end (as at a reboot); runsc's state stays.
	for _, p := range []int{st.Sandbox.Pid, st.GoferPid} {
		if p > 1 {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range []int{st.Sandbox.Pid, st.GoferPid} {
		for p > 1 && time.Now().Before(deadline) {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p)); err != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if got, err := r.Inspect(context.Background(), sb.ID); err != nil || got.Status == StatusRunning {
		t.Fatalf("before the pid is reused: %+v %v", got, err)
	}

	// An unrelated process gets the sandbox's pid.
	var victim *exec.Cmd
	for i := 0; i < 500 && victim == nil; i++ {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(st.Sandbox.Pid-1)), 0o644); err != nil {
			t.Skipf("ns_last_pid: %v", err)
		}
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == st.Sandbox.Pid {
			victim = cmd
			break
		}
		cmd.Process.Kill()
		cmd.Wait()
	}
	if victim == nil {
		t.Skipf("could not get pid %d", st.Sandbox.Pid)
	}
	t.Cleanup(func() { victim.Process.Kill(); victim.Wait() })

	got, err := r.Inspect(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status == StatusRunning {
		t.Fatalf("Inspect of a dead sandbox whose pid %d is now an unrelated `sleep`: %+v, want %s", st.Sandbox.Pid, got, StatusStopped)
	}
}
