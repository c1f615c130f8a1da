package agent

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Protocol limits.
const (
	// MaxFrame is the largest frame payload either side sends or accepts.
	MaxFrame = 1 << 20
	// MaxRequest is the longest request line the agent accepts.
	MaxRequest = 4 << 20
	// DrainGrace is how long the agent keeps reading output after the
	// process exited when something else still holds the pipes open.
	DrainGrace = 100 * time.Millisecond
)

// Request operations.
const (
	OpStart   = "start"
	OpKillAll = "killall"
	OpPing    = "ping"
	OpWarm    = "warm"
	OpStats   = "stats"
	OpDial    = "dial"
	OpSuspend = "suspend"
	OpAttach  = "attach"
	OpExpire  = "expire"
)

// Frame types.
const (
	FrameStarted byte = 'p'
	FrameStdout  byte = 'o'
	FrameStderr  byte = 'e'
	FrameExit    byte = 'x'
	FrameError   byte = 'E'

	FrameStdin      byte = 'i'
	FrameCloseStdin byte = 'c'
	FrameResize     byte = 'r'
	FrameSignal     byte = 's'
)

// Request is the JSON line that opens every connection. UID and GID are
// pointers so that an absent field means the default user (1000), not root.
type Request struct {
	Op    string   `json:"op"`
	Args  []string `json:"args,omitempty"`
	Env   []string `json:"env,omitempty"`
	Cwd   string   `json:"cwd,omitempty"`
	UID   *uint32  `json:"uid,omitempty"`
	GID   *uint32  `json:"gid,omitempty"`
	TTY   bool     `json:"tty,omitempty"`
	Cols  uint16   `json:"cols,omitempty"`
	Rows  uint16   `json:"rows,omitempty"`
	Stdin bool     `json:"stdin,omitempty"`
	Count *int     `json:"count,omitempty"` // warm
	Port  int      `json:"port,omitempty"`  // dial
	Pid   int      `json:"pid,omitempty"`   // attach
	// WaitMs bounds a killall: how long it keeps killing while processes
	// are left (0: DefaultKillWait).
	WaitMs int `json:"waitMs,omitempty"`
}

// DefaultKillWait and MaxKillWait bound how long a killall keeps killing.
const (
	DefaultKillWait = 10 * time.Second
	MaxKillWait     = 30 * time.Second
)

// KillWait is the wait a killall request asks for, within its bounds.
func KillWait(ms int) time.Duration {
	if ms <= 0 {
		return DefaultKillWait
	}
	return min(time.Duration(ms)*time.Millisecond, MaxKillWait)
}

// KillResult is the payload of the 'x' frame answering a killall (and the
// killall command's output): how many processes were still alive when it
// gave up. Unknown means /proc could not be read, so none left cannot be
// told; Survivors then counts what was seen.
type KillResult struct {
	ExitCode  int  `json:"exitCode"`
	Survivors int  `json:"survivors"`
	Unknown   bool `json:"unknown,omitempty"`
}

// Killed says the killall left nothing running.
func (r KillResult) Killed() bool { return r.Survivors == 0 && !r.Unknown }

// Started is the payload of a 'p' frame.
type Started struct {
	Pid  int  `json:"pid"`
	Warm bool `json:"warm,omitempty"`
}

// ExitStatus is the payload of an 'x' frame.
type ExitStatus struct {
	ExitCode int    `json:"exitCode"`
	Signal   string `json:"signal"`
}

// ErrorMsg is the payload of an 'E' frame.
type ErrorMsg struct {
	Message string `json:"message"`
}

// ResizeMsg is the payload of an 'r' frame.
type ResizeMsg struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// SignalMsg is the payload of an 's' frame.
type SignalMsg struct {
	Signal string `json:"signal"`
	Group  bool   `json:"group"`
}

// Stats is the payload of the 'x' frame answering a stats request.
type Stats struct {
	ExitCode   int `json:"exitCode"`
	Goroutines int `json:"goroutines"`
	FDs        int `json:"fds"`
	Warm       int `json:"warm"`
	// WarmFails counts consecutive failed warm-shell starts; from 3 on
	// the pool backs off, and WarmRetryMs is how long until it may try
	// again (on the next request).
	WarmFails   int   `json:"warmFails"`
	WarmRetryMs int64 `json:"warmRetryMs"`
}

// ErrFrameTooLarge is returned for a frame longer than MaxFrame.
var ErrFrameTooLarge = errors.New("agent: frame too large")

// AppendHeader appends a frame header for a payload of n bytes.
func AppendHeader(b []byte, typ byte, n int) []byte {
	return binary.BigEndian.AppendUint32(append(b, typ), uint32(n))
}

// PutHeader fills the first 5 bytes of frame with the header of a frame
// whose payload is frame[5:].
func PutHeader(frame []byte, typ byte) {
	frame[0] = typ
	binary.BigEndian.PutUint32(frame[1:5], uint32(len(frame)-5))
}

// WriteFrame writes one frame in a single Write call.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return ErrFrameTooLarge
	}
	b := make([]byte, 0, 5+len(payload))
	b = append(AppendHeader(b, typ, len(payload)), payload...)
	_, err := w.Write(b)
	return err
}

// ReadFrame reads one frame. The payload is freshly allocated.
func ReadFrame(r *bufio.Reader) (typ byte, payload []byte, err error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxFrame {
		return 0, nil, ErrFrameTooLarge
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return h[0], payload, nil
}

// ReadRequestLine reads the request line (without its '\n'), refusing
// lines longer than max.
func ReadRequestLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 {
			return nil, fmt.Errorf("agent: request line longer than %d bytes", max)
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}
