package server

import (
	"bufio"
	"net/http"

	"github.com/gin-gonic/gin"

	"sandboxd/streams"
)

// getLogs: GET /v1/sandbox/:sessionId/logs — the retained history, JSON lines.
func (s *Server) getLogs(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	entries := s.logs.Entries(ses.ID)
	c.Header("Content-Type", "application/x-ndjson")
	c.Status(http.StatusOK)
	w := bufio.NewWriter(c.Writer)
	for _, e := range entries {
		w.Write(e)
		w.WriteByte('\n')
	}
	w.Flush()
}

// logsWS: GET /v1/sandbox/:sessionId/logs/ws — history, then live entries.
func (s *Server) logsWS(c *gin.Context) {
	ses, ok := s.wsSession(c)
	if !ok {
		return
	}
	conn, err := s.upgrader().Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		return
	}
	s.met.wsConns.Inc()
	defer s.met.wsConns.Dec()
	w := streams.NewWSConn(conn, 4096)
	go w.Run()
	go s.guard(w, principal(c), PermProjectRead)
	go func() { // the one reader: pongs and close
		defer w.Close()
		for {
			if _, _, err := w.Read(); err != nil {
				return
			}
		}
	}()
	history, ch, cancel := s.logs.Subscribe(ses.ID)
	defer cancel()
	for _, e := range history {
		if !w.SendText(e) {
			return
		}
	}
	for {
		select {
		case e := <-ch:
			if !w.SendText(e) {
				return
			}
		case <-w.Done():
			return
		}
	}
}
