package procs

import (
	"encoding/json"
	"errors"
	"io"
	"sync"
	"time"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/streams"
	"sandboxd/streams/scrub"
)

// control is a JSON text message from a WebSocket client.
type control struct {
	Type   string `json:"type"`
	Data   string `json:"data"`
	Cols   uint16 `json:"cols"`
	Rows   uint16 `json:"rows"`
	Signal string `json:"signal"`
}

// Attach serves one socket on a terminal: replay, then live output; input
// and control messages go to the PTY. It returns when the socket or the
// terminal ends; the terminal outlives the socket.
func (ts *Terminals) Attach(w *streams.WSConn, t *Terminal) {
	v, _ := t.hub.Attach()
	defer t.hub.Detach(v)
	w.SendJSON(map[string]any{"type": "ready", "terminalId": t.ID})
	go readControl(w, true, t.writeStdin, t.proc) // ends with the socket
	for {
		select {
		case chunk, ok := <-v.C:
			if !ok {
				switch {
				case errors.Is(v.Err(), streams.ErrClosed):
					<-t.done
					w.SendJSON(map[string]any{"type": "exit", "exitCode": t.exit.Code, "signal": t.exit.Signal})
					w.CloseWith(streams.CloseNormal, "exit")
				case errors.Is(v.Err(), ErrPaused):
					w.SendJSON(map[string]any{"type": "error", "code": "paused", "message": "the session was paused; resume it, then reconnect with terminalId: the shell is still there"})
					w.CloseWith(streams.CloseGoingAway, "paused")
				case errors.Is(v.Err(), streams.ErrSlowViewer):
					ts.log.Warn("terminal viewer dropped: too slow", "terminal", t.ID)
					w.SendJSON(map[string]any{"type": "error", "code": "slow_client", "message": "output queue full; reconnect with terminalId to resume"})
					w.CloseWith(streams.ClosePolicy, "slow client")
				}
				return
			}
			if !w.SendBinary(chunk) {
				return
			}
		case <-w.Done():
			return
		}
	}
}

// ttySignalChars are the signals a PTY delivers as interrupt characters.
var ttySignalChars = map[string]byte{"SIGINT": 0x03, "SIGQUIT": 0x1c, "SIGTSTP": 0x1a}

// readControl is the socket's one reader: stdin bytes (binary messages)
// and JSON controls (text). It ends, closing the socket, when the client
// goes away or stdin fails.
func readControl(w *streams.WSConn, tty bool, stdin func([]byte) error, p runsc.Process) {
	defer w.Close()
	for {
		binary, data, err := w.Read()
		if err != nil {
			return
		}
		if binary {
			if stdin(data) != nil {
				return
			}
			continue
		}
		var m control
		if json.Unmarshal(data, &m) != nil {
			w.SendJSON(map[string]any{"type": "error", "code": "invalid_request", "message": "text messages must be JSON controls"})
			continue
		}
		switch m.Type {
		case "stdin":
			if stdin([]byte(m.Data)) != nil {
				return
			}
		case "resize":
			if m.Cols < 1 || m.Rows < 1 || m.Cols > 1000 || m.Rows > 1000 {
				w.SendJSON(map[string]any{"type": "error", "code": "invalid_request", "message": "resize: cols and rows must be 1-1000"})
				continue
			}
			p.Resize(m.Cols, m.Rows)
		case "signal":
			// On a PTY, interrupt characters reach the foreground job
			// (job control puts it in its own process group).
			if ch, ok := ttySignalChars[m.Signal]; ok && tty {
				if stdin([]byte{ch}) != nil {
					return
				}
				continue
			}
			switch m.Signal {
			case "SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGTSTP", "SIGCONT", "SIGUSR1", "SIGUSR2", "SIGWINCH":
				p.Signal(m.Signal, true)
			default:
				w.SendJSON(map[string]any{"type": "error", "code": "invalid_request", "message": "signal: unsupported"})
			}
		case "close_stdin":
			if in := p.Stdin(); in != nil {
				in.Close()
			}
		default:
			w.SendJSON(map[string]any{"type": "error", "code": "invalid_request", "message": "unknown message type"})
		}
	}
}

// ServeExec runs one command without a PTY on a socket: frames prefixed by
// 1 (stdout) or 2 (stderr), scrubbed as a scrub.Pair, then the
// exit event. Backpressure instead of dropping: a big burst arrives
// complete and in order. A client that goes away gets the process group
// killed (Close). It returns when the exit was sent or the socket ended.
func ServeExec(w *streams.WSConn, p runsc.Process, set *scrub.Set) {
	defer p.Close()
	w.SendJSON(map[string]any{"type": "ready"})
	go readControl(w, false, func(data []byte) error { // ends with the socket
		if in := p.Stdin(); in != nil {
			_, err := in.Write(data)
			return err
		}
		return nil
	}, p)
	// One Pair: a value split between stdout and stderr is caught too.
	// One goroutine writes it and flushes it when the output goes quiet (a
	// prompt without a newline shows), as a terminal does.
	pair := set.NewPair(frameWriter{w, 1}, frameWriter{w, 2})
	type chunk struct {
		tag int
		b   []byte
	}
	chunks := make(chan chunk, 16)
	var wg sync.WaitGroup
	for tag, src := range []io.Reader{p.Stdout(), p.Stderr()} {
		wg.Add(1)
		go func() { // ends with the stream (Close ends it early)
			defer wg.Done()
			for {
				buf := make([]byte, 32<<10)
				n, err := src.Read(buf)
				if n > 0 {
					chunks <- chunk{tag, buf[:n]}
				}
				if err != nil {
					return
				}
			}
		}()
	}
	go func() { // ends when both streams have
		wg.Wait()
		close(chunks)
	}()
	pumped := make(chan struct{})
	go func() { // ends when both streams have
		defer close(pumped)
		idle := time.NewTimer(time.Hour)
		defer idle.Stop()
		ws := []io.Writer{pair.Stdout(), pair.Stderr()}
		for {
			select {
			case c, ok := <-chunks:
				if !ok {
					pair.Close()
					return
				}
				ws[c.tag].Write(c.b)
				idle.Reset(scrubIdleFlush)
			case <-idle.C:
				pair.Flush()
			}
		}
	}()
	exitc := make(chan agent.Exit, 1)
	go func() { // ends when the process ends (Close kills it)
		e, err := p.Wait()
		<-pumped
		exitc <- killedExit(e, err)
	}()
	select {
	case e := <-exitc:
		w.SendJSON(map[string]any{"type": "exit", "exitCode": e.Code, "signal": e.Signal})
		w.CloseWith(streams.CloseNormal, "exit")
		<-w.Done()
	case <-w.Done(): // the client went away: Close kills the process group
	}
}

// frameWriter sends each write as binary frames with a stream tag.
type frameWriter struct {
	w   *streams.WSConn
	tag byte
}

func (f frameWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		c := min(len(p), 64<<10)
		frame := make([]byte, c+1)
		frame[0] = f.tag
		copy(frame[1:], p[:c])
		if !f.w.SendBinary(frame) {
			return 0, io.ErrClosedPipe
		}
		p = p[c:]
	}
	return n, nil
}

// AgentMessage is the public text of a failed start: the agent's own
// message (a fixed string), or that it is not reachable.
func AgentMessage(err error) string {
	var ae *agent.AgentError
	if errors.As(err, &ae) {
		return ae.Message
	}
	return "the sandbox agent is not reachable"
}
