package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/streams"
	"sandboxd/streams/scrub"
)

const (
	wsReadLimit    = 1 << 20
	wsSubprotocol  = "sandboxd"
	bearerProtoPfx = "bearer."
)

// originAllowed: no Origin (not a browser) is fine, it authenticates with a
// header; a browser's Origin must be this server's own or a configured one.
func (s *Server) originAllowed(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, r.Host) && (u.Scheme == "http" || u.Scheme == "https") {
		return true
	}
	for _, o := range s.cfg.AllowedOrigins {
		if strings.EqualFold(strings.TrimSuffix(o, "/"), origin) {
			return true
		}
	}
	return false
}

// wsToken finds a bearer token in a WebSocket upgrade's subprotocols.
func wsToken(r *http.Request) string {
	for _, p := range websocket.Subprotocols(r) {
		if t, ok := strings.CutPrefix(p, bearerProtoPfx); ok {
			return t
		}
	}
	return ""
}

func (s *Server) upgrader() *websocket.Upgrader {
	return &websocket.Upgrader{
		ReadBufferSize: 32 << 10, WriteBufferSize: 32 << 10,
		CheckOrigin: s.originAllowed,
		// Answer with "sandboxd" when offered, never echo a bearer token.
		Subprotocols: []string{wsSubprotocol},
	}
}

type wsControl struct {
	Type   string `json:"type"`
	Data   string `json:"data"`
	Cols   uint16 `json:"cols"`
	Rows   uint16 `json:"rows"`
	Signal string `json:"signal"`
}

// wsSession checks a WebSocket request (the session, an upgrade, the
// Origin) before anything is started.
func (s *Server) wsSession(c *gin.Context) (*store.Session, bool) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return nil, false
	}
	if !websocket.IsWebSocketUpgrade(c.Request) {
		s.writeError(c, badRequest("this endpoint needs a WebSocket upgrade"))
		return nil, false
	}
	if !s.originAllowed(c.Request) {
		s.writeError(c, errdefs.Forbidden("cross-origin WebSocket refused"))
		return nil, false
	}
	return ses, true
}

// terminalWS: GET /v1/sandbox/terminal/:sessionId/ws.
func (s *Server) terminalWS(c *gin.Context) {
	ses, ok := s.wsSession(c)
	if !ok {
		return
	}
	if ses.Status != store.StatusRunning {
		s.writeError(c, errdefs.Conflict("session is %s; terminals need a running session", ses.Status))
		return
	}
	if strings.Contains(c.Request.URL.RawQuery, ";") {
		s.writeError(c, badRequest("query: use & between parameters and URL-encode ';' in command"))
		return
	}
	q := c.Request.URL.Query()
	tty := q.Get("tty") != "false"
	cols, rows := parseSize(q.Get("cols"), 120), parseSize(q.Get("rows"), 40)
	termID := q.Get("terminalId")
	command := q.Get("command")
	if !tty && command == "" {
		s.writeError(c, badRequest("command: required with tty=false"))
		return
	}
	var term *terminal
	if termID != "" {
		if term = s.terms.get(termID); term == nil || term.sessionPK != ses.ID {
			s.writeError(c, errdefs.NotFound("no such terminal"))
			return
		}
	} else if tty && s.terms.count(ses.ID) >= maxTerminalsPerSession {
		s.writeError(c, errdefs.RateLimited("at most %d terminals per session", maxTerminalsPerSession))
		return
	}
	var endExec func()
	if !tty { // an exec stream counts as a running command
		var ok bool
		if endExec, ok = s.sb.begin(ses.ID, s.cfg.Limits.MaxExecsPerSession); !ok {
			s.writeError(c, errdefs.RateLimited("at most %d commands run at once in a session", s.cfg.Limits.MaxExecsPerSession))
			return
		}
		defer endExec()
	}
	secrets, err := s.db.Secrets(c.Request.Context(), ses.ID)
	if err != nil {
		s.writeError(c, err)
		return
	}
	set := s.scrub.forSession(ses.ID, secrets)
	// Upgrade first: a failed handshake starts nothing.
	conn, err := s.upgrader().Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		return // the upgrader answered
	}
	s.met.wsConns.Inc()
	defer s.met.wsConns.Dec()
	w := streams.NewWSConn(conn, wsReadLimit)
	go w.Run()
	var proc Process
	if term == nil {
		args := []string{"/bin/bash", "-l"}
		if command != "" {
			args = []string{"/bin/bash", "-lc", command}
		}
		env := commandEnv(ses.Env, secrets, nil)
		if tty {
			env = setEnv(env, "TERM", "xterm-256color")
		}
		ctx, cancel := startCtx()
		spec := agent.Spec{Args: args, Env: env, Cwd: runsc.Workspace,
			UID: runsc.UserUID, GID: runsc.UserGID, TTY: tty, Cols: cols, Rows: rows, Stdin: true}
		var err error
		if tty {
			proc, err = s.rt.Start(ctx, ses.ContainerID, spec)
		} else {
			// Bulk output streams faster through runsc exec's host pipes
			// than through the agent's socket.
			proc, err = s.rt.StartDirect(ctx, ses.ContainerID, spec)
		}
		cancel()
		if err != nil {
			s.log.Warn("start process", "session", ses.SessionID, "err", err)
			w.SendJSON(map[string]any{"type": "error", "code": "conflict", "message": "could not start the process: " + agentMessage(err)})
			w.CloseWith(streams.CloseInternalError, "start failed")
			<-w.Done()
			return
		}
		shown := clip(string(set.Redact([]byte(command))), 256) // redact before cutting
		if tty {
			term = s.terms.start(ses.ID, ses.SessionID, proc, set)
			s.logs.Event(ses.ID, "terminal_open", map[string]any{"terminalId": term.id, "command": shown})
		} else {
			s.logs.Event(ses.ID, "process_start", map[string]any{"command": shown, "stream": true})
		}
	}
	auditDetail(c, "tty", tty)
	if term != nil {
		auditDetail(c, "terminalId", term.id)
		s.serveTerminal(w, term)
		return
	}
	s.serveExecStream(w, proc, set)
}

const maxTerminalsPerSession = 16

// killedExit reports a process whose connection was closed before its
// exit status arrived (terminal closed, teardown) as killed.
func killedExit(e agent.Exit, err error) agent.Exit {
	if err != nil && e.Code == 0 && e.Signal == "" {
		return agent.Exit{Code: 137, Signal: "SIGKILL"}
	}
	return e
}

func parseSize(v string, def uint16) uint16 {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		return def
	}
	return uint16(n)
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

func agentMessage(err error) string {
	var ae *agent.AgentError
	if errors.As(err, &ae) {
		return ae.Message
	}
	return "the sandbox agent is not reachable"
}

// serveTerminal attaches a socket to a PTY: replay, then live output; input
// and control messages go to the PTY. The PTY outlives the socket.
func (s *Server) serveTerminal(w *streams.WSConn, t *terminal) {
	v, _ := t.hub.Attach()
	defer t.hub.Detach(v)
	w.SendJSON(map[string]any{"type": "ready", "terminalId": t.id})
	go s.readControl(w, true, func(data []byte) error { return t.writeStdin(data) }, t.proc)
	for {
		select {
		case chunk, ok := <-v.C:
			if !ok {
				switch {
				case errors.Is(v.Err(), streams.ErrClosed):
					<-t.done
					w.SendJSON(map[string]any{"type": "exit", "exitCode": t.exit.Code, "signal": t.exit.Signal})
					w.CloseWith(streams.CloseNormal, "exit")
				case errors.Is(v.Err(), streams.ErrSlowViewer):
					s.log.Warn("terminal viewer dropped: too slow", "terminal", t.id)
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

// readControl is the socket's one reader: stdin bytes and JSON controls.
var ttySignalChars = map[string]byte{"SIGINT": 0x03, "SIGQUIT": 0x1c, "SIGTSTP": 0x1a}

func (s *Server) readControl(w *streams.WSConn, tty bool, stdin func([]byte) error, p Process) {
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
		var m wsControl
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

// serveExecStream runs one command without a PTY: frames prefixed by 1
// (stdout) or 2 (stderr), then the exit event. Backpressure instead of
// dropping: a big burst arrives complete and in order.
func (s *Server) serveExecStream(w *streams.WSConn, p Process, set *scrub.Set) {
	defer p.Close()
	w.SendJSON(map[string]any{"type": "ready"})
	go s.readControl(w, false, func(data []byte) error {
		if in := p.Stdin(); in != nil {
			_, err := in.Write(data)
			return err
		}
		return nil
	}, p)
	var wg sync.WaitGroup
	for _, st := range []struct {
		tag byte
		src io.Reader
	}{{1, p.Stdout()}, {2, p.Stderr()}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sw := set.NewWriter(frameWriter{w, st.tag})
			io.Copy(sw, st.src)
			sw.Close()
		}()
	}
	exitc := make(chan agent.Exit, 1)
	go func() {
		e, err := p.Wait()
		wg.Wait()
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

// frameWriter sends each write as one binary frame with a stream tag.
type frameWriter struct {
	w   *streams.WSConn
	tag byte
}

func (f frameWriter) Write(p []byte) (int, error) {
	for len(p) > 0 {
		n := min(len(p), 64<<10)
		frame := make([]byte, n+1)
		frame[0] = f.tag
		copy(frame[1:], p[:n])
		if !f.w.SendBinary(frame) {
			return 0, io.ErrClosedPipe
		}
		p = p[n:]
	}
	return len(p), nil
}

type terminalJSON struct {
	TerminalID string    `json:"terminalId"`
	CreatedAt  time.Time `json:"createdAt"`
	Viewers    int       `json:"viewers"`
	Running    bool      `json:"running"`
}

// listTerminals: GET /v1/sandbox/:sessionId/terminals.
func (s *Server) listTerminals(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	out := []terminalJSON{}
	for _, t := range s.terms.list(ses.ID) {
		n, _ := t.hub.Viewers()
		running := true
		select {
		case <-t.done:
			running = false
		default:
		}
		out = append(out, terminalJSON{TerminalID: t.id, CreatedAt: t.created.UTC(), Viewers: n, Running: running})
	}
	c.JSON(http.StatusOK, gin.H{"terminals": out})
}

// killTerminal: DELETE /v1/sandbox/:sessionId/terminals/:terminalId.
func (s *Server) killTerminal(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	t := s.terms.get(c.Param("terminalId"))
	if t == nil || t.sessionPK != ses.ID {
		s.writeError(c, errdefs.NotFound("no such terminal"))
		return
	}
	s.terms.remove(t)
	c.Status(http.StatusNoContent)
}
