package procs

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"sandboxd/streams"

	"github.com/gorilla/websocket"
)

// A terminal over a real WebSocket: input reaches the PTY, output comes back
// scrubbed, a second viewer gets the replay, controls are applied, and the
// process's exit reaches every viewer.
func TestTerminalAttach(t *testing.T) {
	ts := NewTerminals(time.Minute, slog.New(slog.DiscardHandler))
	defer ts.Close()
	p := startFake(echo)
	term := ts.Start("pk1", p, testSet(t))

	c1 := socket(t, func(w *streams.WSConn) { ts.Attach(w, term) })
	if got := readUntil(t, c1, `"ready"`); !strings.Contains(got, term.ID) {
		t.Fatalf("ready = %s", got)
	}
	// A secret at the very end of the output could go on after the line
	// break: its redaction shows with the next output (here, as in a
	// shell, the next line).
	c1.WriteMessage(websocket.BinaryMessage, []byte("hello "+secret+"\n$ \n"))
	if got := readUntil(t, c1, "hello [REDACTED:TOKEN]"); strings.Contains(got, secret) {
		t.Fatalf("output not scrubbed: %q", got)
	}

	// Controls: resize, an interrupt written as ^C, a signal to the group,
	// bad input answered with an error.
	for _, m := range []string{
		`{"type":"resize","cols":100,"rows":30}`,
		`{"type":"signal","signal":"SIGINT"}`,
		`{"type":"signal","signal":"SIGTERM"}`,
		`{"type":"resize","cols":0,"rows":30}`,
		`{"type":"nope"}`,
		`not json`,
	} {
		c1.WriteMessage(websocket.TextMessage, []byte(m))
	}
	got := readUntil(t, c1, "text messages must be JSON controls")
	for _, want := range []string{"resize: cols and rows must be 1-1000", "unknown message type"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in %q", want, got)
		}
	}
	if !strings.Contains(got, "\x03") {
		readUntil(t, c1, "\x03") // the PTY echoes the interrupt character
	}
	signals, sizes := p.got()
	if len(sizes) != 1 || sizes[0] != [2]uint16{100, 30} || len(signals) != 1 || signals[0] != "SIGTERM" {
		t.Errorf("signals %v sizes %v", signals, sizes)
	}

	// A second viewer starts with the replay, scrubbed too.
	c2 := socket(t, func(w *streams.WSConn) { ts.Attach(w, term) })
	if got := readUntil(t, c2, "[REDACTED:TOKEN]"); strings.Contains(got, secret) {
		t.Fatalf("replay not scrubbed: %q", got)
	}
	if n := term.Viewers(); n != 2 {
		t.Errorf("viewers = %d", n)
	}

	// The process exits: both viewers get the exit, the terminal is done.
	c1.WriteMessage(websocket.BinaryMessage, []byte("exit"))
	for _, c := range []*websocket.Conn{c1, c2} {
		got := readUntil(t, c, `"exit"`)
		var last map[string]any
		json.Unmarshal([]byte(got[strings.LastIndex(got, "{"):]), &last)
		if last["exitCode"] != float64(7) {
			t.Errorf("exit = %s", got)
		}
	}
	if term.Running() {
		t.Error("terminal still running after exit")
	}
}

// The reaper closes a terminal nobody watches for the idle time, and
// CloseSession ends a session's terminals only.
func TestTerminalReaperAndCloseSession(t *testing.T) {
	ts := NewTerminals(50*time.Millisecond, slog.New(slog.DiscardHandler))
	defer ts.Close()
	idle := startFake(echo)
	tIdle := ts.Start("pk1", idle, testSet(t))
	other := startFake(echo)
	ts.Start("pk2", other, testSet(t))
	mine := startFake(echo)
	ts.Start("pk3", mine, testSet(t))

	// A hub counts idle time from its creation: the reaper (every second)
	// closes the unwatched terminal.
	deadline := time.Now().Add(5 * time.Second)
	for (!idle.wasClosed() || ts.Get("pk1", tIdle.ID) != nil) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !idle.wasClosed() || ts.Get("pk1", tIdle.ID) != nil {
		t.Fatal("idle terminal not reaped")
	}
	ts.CloseSession("pk3")
	if !mine.wasClosed() || len(ts.List("pk3")) != 0 {
		t.Fatal("CloseSession left the terminal")
	}
	if ts.Get("pk3", tIdle.ID) != nil || ts.Get("other", "x") != nil {
		t.Fatal("Get crosses sessions")
	}
}

// An exec stream: stdout and stderr frames tagged 1 and 2, scrubbed, then
// the exit; a client that goes away gets the process killed.
func TestServeExec(t *testing.T) {
	p := startFake(func(p *fakeProc) int {
		p.outW.Write([]byte("out " + secret + "\n"))
		p.errW.Write([]byte("err\n"))
		return 3
	})
	c := socket(t, func(w *streams.WSConn) { ServeExec(w, p, testSet(t)) })
	var out, errs strings.Builder
	var exit map[string]any
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for exit == nil {
		typ, b, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("read: %v (out %q err %q)", err, out.String(), errs.String())
		}
		switch {
		case typ == websocket.BinaryMessage && b[0] == 1:
			out.Write(b[1:])
		case typ == websocket.BinaryMessage && b[0] == 2:
			errs.Write(b[1:])
		case typ == websocket.TextMessage && strings.Contains(string(b), `"exit"`):
			json.Unmarshal(b, &exit)
		}
	}
	if out.String() != "out [REDACTED:TOKEN]\n" || errs.String() != "err\n" || exit["exitCode"] != float64(3) {
		t.Fatalf("out %q err %q exit %v", out.String(), errs.String(), exit)
	}

	// The client leaves while the command runs: Close kills it.
	long := startFake(echo)
	c2 := socket(t, func(w *streams.WSConn) { ServeExec(w, long, testSet(t)) })
	readUntil(t, c2, `"ready"`)
	c2.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !long.wasClosed() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !long.wasClosed() {
		t.Fatal("the process outlived its client")
	}
}
