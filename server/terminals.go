package server

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/server/errdefs"
	"sandboxd/server/procs"
	"sandboxd/server/sandbox"
	"sandboxd/streams"
)

// terminalWS: GET /v1/sandbox/terminal/:sessionId/ws.
func (s *Server) terminalWS(c *gin.Context) {
	ses, ok := s.wsSession(c)
	if !ok {
		return
	}
	if strings.Contains(c.Request.URL.RawQuery, ";") {
		s.writeError(c, badRequest("query: use & between parameters and URL-encode ';' in command"))
		return
	}
	q := c.Request.URL.Query()
	tty := true
	switch q.Get("tty") {
	case "", "true":
	case "false":
		tty = false
	default:
		s.writeError(c, badRequest("tty: must be true or false"))
		return
	}
	cols, rows := parseSize(q.Get("cols"), 120), parseSize(q.Get("rows"), 40)
	termID := q.Get("terminalId")
	command := q.Get("command")
	if !tty && command == "" {
		s.writeError(c, badRequest("command: required with tty=false"))
		return
	}
	// An exec stream counts as a running command; an attached terminal as
	// use (for the idle timeout) while its socket is open.
	cmd, err := s.sessions.Command(c.Request.Context(), *ses, sandbox.Admit{NotRunning: "terminals need a running session", Slot: !tty, Use: tty})
	if err != nil {
		s.writeError(c, err)
		return
	}
	*ses = cmd.Session // resumed if it was paused for memory pressure
	defer cmd.End()
	var term *procs.Terminal
	if termID != "" {
		if term = s.terms.Get(ses.ID, termID); term == nil {
			s.writeError(c, errdefs.NotFound("no such terminal: it ended, or the server restarted since it was opened (terminals do not outlive the server process); open a new one"))
			return
		}
	} else if tty && len(s.terms.List(ses.ID)) >= procs.MaxTerminalsPerSession {
		s.writeError(c, errdefs.RateLimited("at most %d terminals per session", procs.MaxTerminalsPerSession))
		return
	}
	set := cmd.Scrubber
	// Upgrade first: a failed handshake starts nothing.
	conn, err := s.upgrader().Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		return // the upgrader answered
	}
	s.met.wsConns.Inc()
	defer s.met.wsConns.Dec()
	w := streams.NewWSConn(conn, wsReadLimit)
	go w.Run()
	go s.guard(w, principal(c), PermProjectUpdate)
	var proc runsc.Process
	if term == nil {
		args := []string{"/bin/bash", "-l"}
		if command != "" {
			args = []string{"/bin/bash", "-lc", command}
		}
		env := cmd.Env(nil)
		if tty {
			env = sandbox.SetEnv(env, "TERM", "xterm-256color")
		}
		ctx, cancel := sandbox.StartContext(c.Request.Context())
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
			w.SendJSON(map[string]any{"type": "error", "code": "conflict", "message": "could not start the process: " + procs.AgentMessage(err)})
			w.CloseWith(streams.CloseInternalError, "start failed")
			<-w.Done()
			return
		}
		shown := clip(set.RedactString(command), 256) // redact before cutting
		if tty {
			term = s.terms.Start(ses.ID, proc, set)
			s.logs.Event(ses.ID, "terminal_open", map[string]any{"terminalId": term.ID, "command": shown})
		} else {
			s.logs.Event(ses.ID, "process_start", map[string]any{"command": shown, "stream": true})
		}
	}
	auditDetail(c, "tty", tty)
	if term != nil {
		auditDetail(c, "terminalId", term.ID)
		s.terms.Attach(w, term)
		return
	}
	procs.ServeExec(w, proc, set)
}

func parseSize(v string, def uint16) uint16 {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		return def
	}
	return uint16(n)
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
	for _, t := range s.terms.List(ses.ID) {
		out = append(out, terminalJSON{TerminalID: t.ID, CreatedAt: t.Created.UTC(), Viewers: t.Viewers(), Running: t.Running()})
	}
	c.JSON(http.StatusOK, gin.H{"terminals": out, "limit": procs.MaxTerminalsPerSession})
}

// killTerminal: DELETE /v1/sandbox/:sessionId/terminals/:terminalId.
func (s *Server) killTerminal(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	t := s.terms.Get(ses.ID, c.Param("terminalId"))
	if t == nil {
		s.writeError(c, errdefs.NotFound("no such terminal"))
		return
	}
	s.terms.Remove(t)
	c.Status(http.StatusNoContent)
}
