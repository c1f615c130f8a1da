package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"sandboxd/server/client"
)

func (a *app) shellCmd() *cobra.Command {
	var (
		terminalID string
		reconnect  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "shell SESSION",
		Short: "Open an interactive shell in a sandbox",
		Long: `shell opens a login shell in a terminal (PTY) in the sandbox, with this
terminal in raw mode and its size followed. When the connection drops it
reconnects to the same shell (the server keeps it) and shows only what was
missed. It ends, with the shell's exit status, when the shell exits.

--terminal re-attaches to a shell left open earlier (its id is printed when a
shell is left, e.g. after a pause).`,
		Args: args(1, 1, "SESSION"),
		RunE: remoteStatus(func(cmd *cobra.Command, argv []string) error {
			if err := checkSession(argv[0]); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.shell(cmd.Context(), c, argv[0], terminalID, reconnect)
		}),
	}
	cmd.Flags().StringVar(&terminalID, "terminal", "", "re-attach to this terminal id")
	cmd.Flags().DurationVar(&reconnect, "reconnect-timeout", 2*time.Minute, "how long to keep trying to reconnect a dropped connection")
	return cmd
}

// termSize is the local terminal's size, or $COLUMNS/$LINES, or 120x40.
func (a *app) termSize() (cols, rows int) {
	for _, f := range []any{a.stdout, a.stdin, a.stderr} {
		if of, ok := f.(*os.File); ok && term.IsTerminal(int(of.Fd())) {
			if w, h, err := term.GetSize(int(of.Fd())); err == nil && w > 0 && h > 0 {
				return min(w, 1000), min(h, 1000)
			}
		}
	}
	cols, rows = 120, 40
	if n, err := strconv.Atoi(a.getenv("COLUMNS")); err == nil && n > 0 && n <= 1000 {
		cols = n
	}
	if n, err := strconv.Atoi(a.getenv("LINES")); err == nil && n > 0 && n <= 1000 {
		rows = n
	}
	return cols, rows
}

// shell runs the interactive terminal until the shell exits.
func (a *app) shell(ctx context.Context, c *client.Client, id, terminalID string, reconnectFor time.Duration) error {
	cols, rows := a.termSize()
	t, err := c.DialTerminal(ctx, id, client.TerminalOptions{Cols: cols, Rows: rows, TerminalID: terminalID})
	if err != nil {
		return err
	}

	// Raw mode when standard input is a terminal, restored however this
	// ends (the deferred call; SIGTERM and SIGHUP cancel ctx first).
	nl := "\n"
	if f, ok := a.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		state, err := term.MakeRaw(int(f.Fd()))
		if err != nil {
			t.Close()
			return fmt.Errorf("raw mode: %w", err)
		}
		defer term.Restore(int(f.Fd()), state)
		nl = "\r\n"
		a.eol = nl
		defer func() { a.eol = "\n" }()
	}
	ctx, cancel := signal.NotifyContext(ctx, syscall.SIGHUP, syscall.SIGTERM)
	defer cancel()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)

	input := make(chan []byte, 64)
	go pumpInput(a.stdin, input) // ends with standard input (or the process)

	s := &shellSession{a: a, c: c, id: id, nl: nl, input: input, winch: winch, reconnectFor: reconnectFor}
	s.terminalID = t.ID()
	return s.run(ctx, t)
}

// pumpInput copies r into ch in chunks; at the end it closes ch.
func pumpInput(r io.Reader, ch chan<- []byte) {
	defer close(ch)
	for {
		buf := make([]byte, 4096)
		n, err := r.Read(buf)
		if n > 0 {
			ch <- buf[:n]
		}
		if err != nil {
			return
		}
	}
}

// shellSession is one sbx shell: its terminal id, what it has shown (to
// skip the replay on reconnect) and the loop that relays.
type shellSession struct {
	a            *app
	c            *client.Client
	id           string
	terminalID   string
	nl           string
	input        <-chan []byte
	winch        <-chan os.Signal
	reconnectFor time.Duration

	seen          tail
	replayPending bool   // the next output is the server's replay
	pending       []byte // input not yet sent when the connection dropped
	inputClosed   bool
}

// errDropped ends one connection: reconnect.
var errDropped = errors.New("connection dropped")

func (s *shellSession) run(ctx context.Context, t *client.Terminal) error {
	for {
		err := s.serve(ctx, t)
		t.Close()
		if !errors.Is(err, errDropped) {
			return err
		}
		if t, err = s.reconnect(ctx); err != nil {
			return err
		}
	}
}

// serve relays one connection until the shell exits (exitStatus or nil),
// the connection drops (errDropped) or ctx ends.
func (s *shellSession) serve(ctx context.Context, t *client.Terminal) error {
	events := make(chan client.Event, 16)
	recvErr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // ends when the socket does (run closes it) or serve returned
		defer close(events)
		for {
			ev, err := t.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case events <- ev:
			case <-stop:
				return
			}
		}
	}()
	if len(s.pending) > 0 {
		if _, err := t.Write(s.pending); err != nil {
			return errDropped
		}
		s.pending = nil
	}
	input := s.input
	if s.inputClosed {
		input = nil
	}
	// After standard input ended, Ctrl-D again every second until the
	// shell exits: one sent while the shell was still starting is lost
	// when it puts its terminal in raw mode, and a command that does not
	// read its input leaves the next one for the shell.
	eofTick := time.NewTicker(time.Second)
	defer eofTick.Stop()
	for {
		select {
		case <-eofTick.C:
			if s.inputClosed {
				if _, err := t.Write([]byte{4}); err != nil {
					return errDropped
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-events:
			if !ok {
				err := <-recvErr
				if errors.Is(err, io.EOF) {
					// Closed without an exit event: the terminal ended
					// elsewhere (killed, session stopped).
					return errors.New("the terminal was closed by the server")
				}
				return errDropped
			}
			switch ev.Type {
			case "output":
				data := ev.Data
				if s.replayPending {
					s.replayPending = false
					data = data[overlap(s.seen.bytes(), data):]
				}
				s.seen.write(data)
				if _, err := s.a.stdout.Write(data); err != nil {
					return err
				}
			case "exit":
				if ev.ExitCode != 0 {
					return exitStatus(ev.ExitCode)
				}
				return nil
			case "error":
				switch ev.Code {
				case "slow_client":
					return errDropped
				case "paused":
					return fmt.Errorf("the session was paused; the shell is kept: 'sbx resume %s', then 'sbx shell %s --terminal %s'", s.id, s.id, s.terminalID)
				}
				fmt.Fprintf(s.a.stderr, "%ssbx: %s (%s)%s", s.nl, ev.Message, ev.Code, s.nl)
			}
		case data, ok := <-input:
			if !ok {
				// Standard input ended (a pipe): end the shell's input
				// as a terminal's Ctrl-D would.
				input, s.inputClosed = nil, true
				data = []byte{4}
			}
			if _, err := t.Write(data); err != nil {
				s.pending = append(s.pending, data...)
				return errDropped
			}
		case <-s.winch:
			cols, rows := s.a.termSize()
			t.Resize(cols, rows)
		}
	}
}

// reconnect dials the terminal again until it answers or reconnectFor has
// passed; a terminal that is gone, or a session that is not running any
// more, ends it.
func (s *shellSession) reconnect(ctx context.Context) (*client.Terminal, error) {
	fmt.Fprintf(s.a.stderr, "%ssbx: connection lost; reconnecting...%s", s.nl, s.nl)
	deadline := time.Now().Add(s.reconnectFor)
	wait := 250 * time.Millisecond
	for {
		cols, rows := s.a.termSize()
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		t, err := s.c.DialTerminal(dctx, s.id, client.TerminalOptions{Cols: cols, Rows: rows, TerminalID: s.terminalID})
		cancel()
		if err == nil {
			// The size may have changed meanwhile; the replay comes first.
			t.Resize(cols, rows)
			s.replayPending = s.seen.len() > 0
			fmt.Fprintf(s.a.stderr, "sbx: reconnected%s", s.nl)
			return t, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ae *client.Error
		if errors.As(err, &ae) && ae.Status != 0 && ae.Status != 409 && ae.Status != 429 && ae.Status < 500 {
			return nil, err // gone (404), or no access any more
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("could not reconnect within %s: %w", s.reconnectFor, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// replayKeep is how much shown output a shell keeps to recognize the
// server's replay (which holds the last 256 KiB).
const replayKeep = 256 << 10

// tail keeps the last replayKeep bytes written.
type tail struct{ b []byte }

func (t *tail) write(p []byte) {
	t.b = append(t.b, p...)
	if len(t.b) > 2*replayKeep {
		t.b = append(t.b[:0], t.b[len(t.b)-replayKeep:]...)
	}
}

func (t *tail) bytes() []byte {
	if len(t.b) > replayKeep {
		return t.b[len(t.b)-replayKeep:]
	}
	return t.b
}

func (t *tail) len() int { return len(t.b) }

// overlap is the length of the longest prefix of replay that is a suffix
// of seen: the part of a replay that was shown already (Knuth-Morris-Pratt,
// linear time).
func overlap(seen, replay []byte) int {
	if len(replay) == 0 || len(seen) == 0 {
		return 0
	}
	if len(seen) > len(replay) {
		seen = seen[len(seen)-len(replay):]
	}
	fail := make([]int, len(replay))
	for i, k := 1, 0; i < len(replay); i++ {
		for k > 0 && replay[i] != replay[k] {
			k = fail[k-1]
		}
		if replay[i] == replay[k] {
			k++
		}
		fail[i] = k
	}
	q := 0
	for _, b := range seen {
		for q > 0 && (q == len(replay) || replay[q] != b) {
			q = fail[q-1]
		}
		if replay[q] == b {
			q++
		}
	}
	return q
}
