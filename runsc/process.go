package runsc

import (
	"io"

	"sandboxd/runsc/agent"
)

// Process is a process started in a sandbox that outlives the call that
// started it: a PTY or stream through the agent (*agent.Process) or a
// stream through runsc exec (*DirectProcess). Safe for concurrent use.
type Process interface {
	Stdin() io.WriteCloser
	Stdout() io.Reader
	Stderr() io.Reader
	Resize(cols, rows uint16) error
	Signal(name string, group bool) error
	// Wait returns the exit status once the process ended and its output
	// was read.
	Wait() (agent.Exit, error)
	// Close kills the process group (if still running) and frees the
	// connection.
	Close() error
}

var (
	_ Process = (*agent.Process)(nil)
	_ Process = (*DirectProcess)(nil)
)
