package runsc

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// Test hooks, read once at start and empty in production: they let the
// fault tests (server/faults_e2e_test.go) stop or fail the real code at
// one point, everything else running as it does for real.
var (
	// hangAt (SANDBOXD_TEST_HANG_AT, shared with server/sandbox): at the
	// named step of a create the driver writes <state-dir>/hang-<step> and
	// blocks for good, so a test can kill -9 the server exactly there.
	// Steps: create-mounted (disk mounted, netns made), create-created
	// (runsc create done, not started).
	hangAt = os.Getenv("SANDBOXD_TEST_HANG_AT")
	// faultAt (SANDBOXD_TEST_FAULT): "no-loop-device" gives every loop
	// mount a device node that does not exist, so mount(8) fails to set up
	// its loop device exactly as when the kernel has no free one left.
	faultAt = os.Getenv("SANDBOXD_TEST_FAULT")
)

func (r *Runtime) hang(step string) {
	if hangAt != step {
		return
	}
	os.WriteFile(filepath.Join(r.cfg.StateDir, "hang-"+step), nil, 0o600)
	select {} // the test kills the process
}

// loopOption is mount(8)'s option that attaches the image to a free loop
// device.
func loopOption() string {
	if faultAt == "no-loop-device" {
		return "loop=/dev/sandboxd-test-no-loop-device"
	}
	return "loop"
}

// ErrNoLoopDevice: mount(8) could not attach a sandbox disk image to a loop
// device (the host has none free, or cannot make one).
var ErrNoLoopDevice = errors.New("no loop device could be set up for the disk image")

// loopMountError is the error of a failed loop mount: ErrNoLoopDevice when
// mount(8) says its loop setup failed (libmount's MNT_ERR_LOOPDEV), else
// what it said.
func loopMountError(what string, err error, out []byte) error {
	msg := strings.TrimSpace(string(out))
	if strings.Contains(msg, "failed to setup loop device") || strings.Contains(msg, "could not find any free loop device") {
		return &mountError{what: what, msg: msg, err: ErrNoLoopDevice}
	}
	return &mountError{what: what, msg: msg, err: err}
}

type mountError struct {
	what, msg string
	err       error
}

func (e *mountError) Error() string { return e.what + ": " + e.err.Error() + ": " + e.msg }
func (e *mountError) Unwrap() error { return e.err }
