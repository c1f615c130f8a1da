package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// WebSocket timing. The server pings every 20 s and gives up on a peer
// silent for 60 s; a socket on which nothing (not even a ping) arrived for
// wsReadWait is dead.
const (
	wsReadWait  = 75 * time.Second
	wsWriteWait = 10 * time.Second
	wsReadLimit = 32 << 20
)

// dialWS opens a WebSocket to an API path with the bearer token. A refused
// handshake is the server's *Error; one refused with 429 or 503 and
// Retry-After is dialed again (retry.go).
func (c *Client) dialWS(ctx context.Context, p string, q url.Values) (*websocket.Conn, error) {
	for attempt := 1; ; attempt++ {
		conn, resp, err := c.dialWSOnce(ctx, p, q)
		if err == nil || resp == nil {
			return conn, err
		}
		apiErr := err.(*Error)
		wait, ok := c.retryWait(ctx, http.MethodGet, resp.StatusCode, resp.Header, attempt)
		if !ok {
			return nil, apiErr
		}
		path := p
		if u, err := url.Parse(c.url(p, nil)); err == nil {
			path = u.Path
		}
		if err := c.waitRetry(ctx, http.MethodGet, path, attempt, wait, apiErr); err != nil {
			return nil, err
		}
	}
}

// dialWSOnce is one handshake. A refusal returns the answer (its body
// closed) with the *Error.
func (c *Client) dialWSOnce(ctx context.Context, p string, q url.Values) (*websocket.Conn, *http.Response, error) {
	u := c.url(p, q)
	switch {
	case strings.HasPrefix(u, "https://"):
		u = "wss://" + strings.TrimPrefix(u, "https://")
	case strings.HasPrefix(u, "http://"):
		u = "ws://" + strings.TrimPrefix(u, "http://")
	}
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	h.Set("User-Agent", c.agent)
	conn, resp, err := c.dialer.DialContext(ctx, u, h)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			defer resp.Body.Close()
			return nil, resp, decodeError(resp)
		}
		return nil, nil, err
	}
	conn.SetReadLimit(wsReadLimit)
	conn.SetReadDeadline(time.Now().Add(wsReadWait))
	conn.SetPingHandler(func(data string) error {
		conn.SetReadDeadline(time.Now().Add(wsReadWait))
		err := conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(wsWriteWait))
		if errors.Is(err, websocket.ErrCloseSent) {
			return nil
		}
		return err
	})
	return conn, nil, nil
}

// closeWhenDone closes conn when ctx ends; the returned stop ends the watch.
func closeWhenDone(ctx context.Context, conn *websocket.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		conn.Close()
	})
}

// LogEntry is one entry of a session's log: Type "kernel" (a line gVisor's
// kernel printed), "event" (Kind: started, process_start, oom, exit,
// egress_denied, ...) or "service" (a portal service's line).
type LogEntry struct {
	Type    string    `json:"type"`
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind,omitempty"`
	Line    string    `json:"line,omitempty"`
	Service string    `json:"service,omitempty"`
	// Fields holds every field of the entry (numbers as json.Number).
	Fields map[string]any  `json:"-"`
	Raw    json.RawMessage `json:"-"`
}

// ParseLogEntry decodes one entry.
func ParseLogEntry(b []byte) (LogEntry, error) {
	var e LogEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("log entry: %w", err)
	}
	e.Fields, _ = decodeMap(b)
	e.Raw = append(json.RawMessage(nil), b...)
	return e, nil
}

// Logs returns a session's retained log (its kernel's output and events),
// oldest first.
func (c *Client) Logs(ctx context.Context, sessionID string) ([]LogEntry, error) {
	req, err := c.request(ctx, http.MethodGet, sandboxPath(sessionID)+"/logs", nil, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONBody))
	if err != nil {
		return nil, fmt.Errorf("logs: %w", err)
	}
	out := []LogEntry{}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		e, err := ParseLogEntry([]byte(line))
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
	return out, nil
}

// FollowLogs calls fn with a session's retained log entries, then with new
// ones as they come (GET /v1/sandbox/:id/logs/ws), until ctx ends (it
// returns ctx's error), fn returns an error (returned), or the server
// closes the socket.
func (c *Client) FollowLogs(ctx context.Context, sessionID string, fn func(LogEntry) error) error {
	conn, err := c.dialWS(ctx, sandboxPath(sessionID)+"/logs/ws", nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := closeWhenDone(ctx, conn)
	defer stop()
	for {
		_, data, err := conn.ReadMessage()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway) {
				return nil
			}
			return fmt.Errorf("log stream: %w", err)
		}
		conn.SetReadDeadline(time.Now().Add(wsReadWait))
		e, err := ParseLogEntry(data)
		if err != nil {
			continue // not an entry: skip it
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}

// TerminalOptions opens a terminal. Zero values take the defaults.
type TerminalOptions struct {
	Cols, Rows int // the PTY's size (default 120x40)
	// TerminalID re-attaches to a terminal that is still open (after a
	// dropped connection, or a pause and resume): its recent output is
	// replayed first.
	TerminalID string
	// Command runs instead of a login shell (bash -lc Command).
	Command string
}

// Terminal is one WebSocket on a sandbox's terminal (a PTY) or exec stream.
// One goroutine may call Recv; any may call the send methods.
type Terminal struct {
	conn   *websocket.Conn
	id     string
	stream bool // an exec stream: output frames carry a stream tag
	wmu    sync.Mutex
}

// Event is a message from a terminal's socket.
type Event struct {
	// Type is "output" (Data holds terminal bytes), "exit" (ExitCode,
	// Signal), "error" (Code, Message) or another event of the server's.
	Type     string
	Data     []byte
	Stream   int // exec streams: 1 stdout, 2 stderr
	ExitCode int
	Signal   string
	Code     string
	Message  string
	Raw      json.RawMessage // a text event's JSON
}

// DialTerminal opens a live terminal (GET /v1/sandbox/terminal/:id/ws):
// a login shell in a PTY, or the one in opts.TerminalID. It returns once
// the server said ready; a refusal is the server's *Error.
func (c *Client) DialTerminal(ctx context.Context, sessionID string, opts TerminalOptions) (*Terminal, error) {
	q := url.Values{}
	if opts.Cols > 0 {
		q.Set("cols", fmt.Sprint(opts.Cols))
	}
	if opts.Rows > 0 {
		q.Set("rows", fmt.Sprint(opts.Rows))
	}
	if opts.TerminalID != "" {
		q.Set("terminalId", opts.TerminalID)
	}
	if opts.Command != "" {
		q.Set("command", opts.Command)
	}
	return c.dialTerminal(ctx, sessionID, q, false)
}

// DialExec runs command without a PTY, streaming its output (tty=false):
// Recv gives "output" events with Stream 1 (stdout) or 2 (stderr), then
// the "exit" event. Write feeds its stdin, CloseStdin ends it. Closing the
// socket early kills the command's process group.
func (c *Client) DialExec(ctx context.Context, sessionID, command string) (*Terminal, error) {
	return c.dialTerminal(ctx, sessionID, url.Values{"tty": {"false"}, "command": {command}}, true)
}

func (c *Client) dialTerminal(ctx context.Context, sessionID string, q url.Values, stream bool) (*Terminal, error) {
	conn, err := c.dialWS(ctx, "/v1/sandbox/terminal/"+seg(sessionID)+"/ws", q)
	if err != nil {
		return nil, err
	}
	t := &Terminal{conn: conn, stream: stream}
	// The first message is "ready" (or an error, then the close).
	stop := closeWhenDone(ctx, conn)
	ev, err := t.Recv()
	stop()
	switch {
	case err != nil && ctx.Err() != nil:
		conn.Close()
		return nil, ctx.Err()
	case err != nil:
		conn.Close()
		return nil, fmt.Errorf("terminal: %w", err)
	case ev.Type == "error":
		conn.Close()
		return nil, &Error{Code: ev.Code, Message: ev.Message}
	case ev.Type != "ready":
		conn.Close()
		return nil, fmt.Errorf("terminal: expected a ready event, got %q", ev.Type)
	}
	var ready struct {
		TerminalID string `json:"terminalId"`
	}
	json.Unmarshal(ev.Raw, &ready)
	t.id = ready.TerminalID
	return t, nil
}

// ID is the terminal's id (empty for an exec stream): pass it as
// TerminalOptions.TerminalID to re-attach.
func (t *Terminal) ID() string { return t.id }

// Recv returns the next message. After the exit event the server closes
// the socket: Recv then returns io.EOF. A dropped connection is another
// error.
func (t *Terminal) Recv() (Event, error) {
	for {
		typ, data, err := t.conn.ReadMessage()
		if err != nil {
			if websocket.IsCloseError(err, websocket.CloseNormalClosure) {
				return Event{}, io.EOF
			}
			return Event{}, err
		}
		t.conn.SetReadDeadline(time.Now().Add(wsReadWait))
		if typ == websocket.BinaryMessage {
			ev := Event{Type: "output", Data: data}
			if t.stream {
				if len(data) == 0 {
					continue
				}
				ev.Stream, ev.Data = int(data[0]), data[1:]
			}
			return ev, nil
		}
		var m struct {
			Type     string `json:"type"`
			ExitCode int    `json:"exitCode"`
			Signal   string `json:"signal"`
			Code     string `json:"code"`
			Message  string `json:"message"`
		}
		if json.Unmarshal(data, &m) != nil {
			continue // not an event: skip it
		}
		return Event{Type: m.Type, ExitCode: m.ExitCode, Signal: m.Signal, Code: m.Code, Message: m.Message, Raw: data}, nil
	}
}

func (t *Terminal) write(typ int, data []byte) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	t.conn.SetWriteDeadline(time.Now().Add(wsWriteWait))
	return t.conn.WriteMessage(typ, data)
}

func (t *Terminal) control(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.write(websocket.TextMessage, b)
}

// Write sends p as input (keystrokes, or an exec stream's stdin).
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.write(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Resize sets the PTY's size; the shell gets SIGWINCH.
func (t *Terminal) Resize(cols, rows int) error {
	return t.control(map[string]any{"type": "resize", "cols": cols, "rows": rows})
}

// Signal sends a signal (SIGINT, SIGTERM, SIGKILL, SIGHUP, ...) to the
// process; on a PTY, SIGINT, SIGQUIT and SIGTSTP go to the foreground job.
func (t *Terminal) Signal(sig string) error {
	return t.control(map[string]any{"type": "signal", "signal": sig})
}

// CloseStdin ends the process's standard input (exec streams).
func (t *Terminal) CloseStdin() error {
	return t.control(map[string]any{"type": "close_stdin"})
}

// Close closes the socket. A terminal's PTY stays open on the server (for
// a while) and can be re-attached with its ID; an exec stream's command is
// killed.
func (t *Terminal) Close() error {
	t.wmu.Lock()
	t.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	t.wmu.Unlock()
	return t.conn.Close()
}
