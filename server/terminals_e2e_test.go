package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// wsClient is a real WebSocket client of a terminal.
type wsClient struct {
	t    testing.TB
	c    *websocket.Conn
	out  bytes.Buffer
	exit *int
	id   string
}

func (h *harness) dialWS(path string, hdr http.Header) (*websocket.Conn, *http.Response, error) {
	u := "ws" + strings.TrimPrefix(h.ts.URL, "http") + path
	return websocket.DefaultDialer.Dial(u, hdr)
}

func (h *harness) terminalWS(t testing.TB, session, query string) *wsClient {
	t.Helper()
	hdr := http.Header{"Authorization": {"Bearer " + h.token}}
	c, resp, err := h.dialWS("/v1/sandbox/terminal/"+session+"/ws?"+query, hdr)
	if err != nil {
		code, body := 0, ""
		if resp != nil {
			code = resp.StatusCode
			b := make([]byte, 500)
			n, _ := resp.Body.Read(b)
			body = string(b[:n])
		}
		t.Fatalf("dial: %v (%d %s)", err, code, body)
	}
	w := &wsClient{t: t, c: c}
	t.Cleanup(func() { c.Close() })
	return w
}

// readUntil reads messages until the accumulated output contains want (or
// an exit event arrives, or the deadline passes).
func (w *wsClient) readUntil(want string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	if strings.Contains(w.out.String(), want) {
		return true
	}
	for {
		if time.Now().After(deadline) {
			return false
		}
		w.c.SetReadDeadline(deadline)
		typ, data, err := w.c.ReadMessage()
		if err != nil {
			return strings.Contains(w.out.String(), want)
		}
		if typ == websocket.BinaryMessage {
			// Look only at the new bytes plus an overlap (output can be large).
			from := max(0, w.out.Len()-len(want))
			w.out.Write(data)
			if strings.Contains(string(w.out.Bytes()[from:]), want) {
				return true
			}
			continue
		}
		var ev map[string]any
		json.Unmarshal(data, &ev)
		switch ev["type"] {
		case "ready":
			if id, ok := ev["terminalId"].(string); ok {
				w.id = id
			}
		case "exit":
			code := int(ev["exitCode"].(float64))
			w.exit = &code
			return strings.Contains(w.out.String(), want)
		}
	}
}

func (w *wsClient) send(s string) {
	w.c.WriteMessage(websocket.BinaryMessage, []byte(s))
}

func (w *wsClient) control(v any) {
	b, _ := json.Marshal(v)
	w.c.WriteMessage(websocket.TextMessage, b)
}

func TestRealTerminals(t *testing.T) {
	h := startServer(t, realConfig(t))
	code, _ := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "tty1", "size": "test-tiny",
		"secrets": map[string]string{"TOPSECRET": "hunter2-very-secret"}})
	if code != 201 {
		t.Fatal(code)
	}
	goroutines := runtime.NumGoroutine()
	fds := countFDs()

	t.Run("echo resize winch ctrl-c", func(t *testing.T) {
		w := h.terminalWS(t, "tty1", "cols=100&rows=30")
		if !w.readUntil("$ ", 10*time.Second) || w.id == "" {
			t.Fatalf("no prompt: %q id=%q", w.out.String(), w.id)
		}
		w.send("tty; stty size; echo $((6*7))\n")
		if !w.readUntil("42", 5*time.Second) || !strings.Contains(w.out.String(), "/dev/pts/") || !strings.Contains(w.out.String(), "30 100") {
			t.Fatalf("%q", w.out.String())
		}
		// The marker is printed (not echoed: the shell computes it) once
		// the trap is set.
		w.send("trap 'echo WINCH-$(tput cols)' WINCH; echo TRAP-$((1+1)); sleep 3 & wait\n")
		if !w.readUntil("TRAP-2", 5*time.Second) {
			t.Fatalf("no trap: %q", w.out.String())
		}
		w.control(map[string]any{"type": "resize", "cols": 132, "rows": 40})
		if !w.readUntil("WINCH-132", 5*time.Second) {
			t.Fatalf("no WINCH: %q", w.out.String())
		}
		w.send("echo SLEEP-$((2+2)); sleep 100\n")
		if !w.readUntil("SLEEP-4", 5*time.Second) {
			t.Fatalf("no sleep: %q", w.out.String())
		}
		// ^C once sleep runs: a ^C while bash is still starting it is a
		// different test (bash and job control racing the fork).
		for i := 0; i < 50 && h.sh("tty1", "pgrep -x sleep").ExitCode != 0; i++ {
			time.Sleep(50 * time.Millisecond)
		}
		w.control(map[string]any{"type": "signal", "signal": "SIGINT"})
		w.send("echo after-$((1+1))\n")
		if !w.readUntil("after-2", 5*time.Second) {
			t.Fatalf("Ctrl-C did not interrupt: %q", w.out.String())
		}
		// The secret never appears in a frame.
		w.send("echo $TOPSECRET; printf %s \"$TOPSECRET\" | base64\n")
		if !w.readUntil("[REDACTED:TOPSECRET]", 5*time.Second) || strings.Contains(w.out.String(), "hunter2") {
			t.Fatalf("secret: %q", w.out.String())
		}
		// Reconnect with terminalId replays; two viewers see the same output.
		id := w.id
		w.c.Close()
		a := h.terminalWS(t, "tty1", "terminalId="+id)
		b := h.terminalWS(t, "tty1", "terminalId="+id)
		if !a.readUntil("after-2", 5*time.Second) {
			t.Fatalf("no replay: %q", a.out.String())
		}
		a.send("echo both-$((2+3))\n")
		if !a.readUntil("both-5", 5*time.Second) || !b.readUntil("both-5", 5*time.Second) {
			t.Fatalf("viewers: %q / %q", a.out.String(), b.out.String())
		}
		a.send("exit 3\n")
		if !a.readUntil("\x00never", 5*time.Second) && (a.exit == nil || *a.exit != 3) {
			t.Fatalf("exit: %v", a.exit)
		}
	})

	// A prompt without a newline shows while the command waits: the
	// stream's scrubber is flushed when output goes quiet ("pass" is a
	// prefix of a keyword: held until then).
	t.Run("exec stream prompt", func(t *testing.T) {
		hdr := http.Header{"Authorization": {"Bearer " + h.token}}
		c, _, err := h.dialWS("/v1/sandbox/terminal/tty1/ws?tty=false&command="+
			url.QueryEscape("printf 'Press a key to pass'; sleep 4; echo done"), hdr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var got strings.Builder
		deadline := time.Now().Add(3 * time.Second)
		for !strings.Contains(got.String(), "to pass") {
			c.SetReadDeadline(deadline)
			typ, data, err := c.ReadMessage()
			if err != nil {
				t.Fatalf("the prompt did not show within 3 s: %q (%v)", got.String(), err)
			}
			if typ == websocket.BinaryMessage && data[0] == 1 {
				got.Write(data[1:])
			}
		}
		if strings.Contains(got.String(), "done") {
			t.Fatalf("prompt came with the end: %q", got.String())
		}
	})

	t.Run("exec stream burst", func(t *testing.T) {
		hdr := http.Header{"Authorization": {"Bearer " + h.token}}
		c, _, err := h.dialWS("/v1/sandbox/terminal/tty1/ws?tty=false&command="+
			"head%20-c%2050000000%20/dev/zero%20%7C%20tr%20%27%5C0%27%20x%3B%20echo%20err%20%3E%262", hdr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var stdout, stderr int
		var exit = -1
		for exit < 0 {
			c.SetReadDeadline(time.Now().Add(60 * time.Second))
			typ, data, err := c.ReadMessage()
			if err != nil {
				t.Fatalf("read: %v (stdout %d)", err, stdout)
			}
			if typ == websocket.BinaryMessage {
				switch data[0] {
				case 1:
					if bytes.Count(data[1:], []byte("x")) != len(data)-1 {
						t.Fatal("corrupt stdout frame")
					}
					stdout += len(data) - 1
				case 2:
					stderr += len(data) - 1
				}
				continue
			}
			var ev map[string]any
			json.Unmarshal(data, &ev)
			if ev["type"] == "exit" {
				exit = int(ev["exitCode"].(float64))
			}
		}
		if stdout != 50000000 || stderr != 4 || exit != 0 {
			t.Fatalf("stdout %d stderr %d exit %d", stdout, stderr, exit)
		}
	})

	t.Run("origin and tickets", func(t *testing.T) {
		hdr := http.Header{"Authorization": {"Bearer " + h.token}, "Origin": {"https://evil.example"}}
		if _, resp, err := h.dialWS("/v1/sandbox/terminal/tty1/ws", hdr); err == nil || resp == nil || resp.StatusCode != 403 {
			t.Fatalf("foreign origin accepted: %v", err)
		}
		// A browser-like client: own Origin, no header, a ticket, used twice.
		code, b := h.call(h.token, "POST", "/v1/sandbox/tty1/tickets", nil)
		if code != 201 {
			t.Fatal(code, string(b))
		}
		var tk struct{ Ticket string }
		json.Unmarshal(b, &tk)
		own := http.Header{"Origin": {h.ts.URL}}
		c, _, err := h.dialWS("/v1/sandbox/terminal/tty1/ws?ticket="+tk.Ticket, own)
		if err != nil {
			t.Fatalf("ticket rejected: %v", err)
		}
		c.Close()
		if _, resp, err := h.dialWS("/v1/sandbox/terminal/tty1/ws?ticket="+tk.Ticket, own); err == nil || resp.StatusCode != 401 {
			t.Fatalf("ticket used twice: %v", err)
		}
		// Subprotocol bearer token, answered with "sandboxd" (never the token).
		d := websocket.Dialer{Subprotocols: []string{"sandboxd", "bearer." + h.token}}
		c, resp, err := d.Dial("ws"+strings.TrimPrefix(h.ts.URL, "http")+"/v1/sandbox/terminal/tty1/ws", own)
		if err != nil || resp.Header.Get("Sec-WebSocket-Protocol") != "sandboxd" {
			t.Fatalf("subprotocol auth: %v", err)
		}
		c.Close()
	})

	t.Run("slow viewer does not stall a fast one", func(t *testing.T) {
		fast := h.terminalWS(t, "tty1", "")
		fast.readUntil("$ ", 10*time.Second)
		slow := h.terminalWS(t, "tty1", "terminalId="+fast.id) // never reads
		_ = slow
		fast.send("head -c 30000000 /dev/zero | base64 | tail -c 100 >/dev/null; yes | head -c 20000000; echo done-$((3*3))\n")
		if !fast.readUntil("done-9", 60*time.Second) {
			t.Fatalf("fast viewer stalled (%d bytes)", fast.out.Len())
		}
		fast.send("exit\n")
	})

	// Terminals closed, sockets gone: goroutines and fds back near baseline.
	code, _ = h.call(h.token, "POST", "/v1/sandbox/tty1/teardown", nil)
	if code != 200 {
		t.Fatal(code)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && (runtime.NumGoroutine() > goroutines+5 || countFDs() > fds+5) {
		time.Sleep(100 * time.Millisecond)
	}
	if g, f := runtime.NumGoroutine(), countFDs(); g > goroutines+5 || f > fds+5 {
		t.Fatalf("leak: goroutines %d -> %d, fds %d -> %d", goroutines, g, fds, f)
	}
}

func countFDs() int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", os.Getpid()))
	return len(ents)
}

func TestRealKernelLogAndEvents(t *testing.T) {
	h := startServer(t, realConfig(t))
	code, _ := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "log1", "size": "test-tiny",
		"secrets": map[string]string{"TOPSECRET": "hunter2-very-secret"}})
	if code != 201 {
		t.Fatal(code)
	}
	hdr := http.Header{"Authorization": {"Bearer " + h.token}}
	ws, _, err := h.dialWS("/v1/sandbox/log1/logs/ws", hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	h.sh("log1", "python3 -c 'import ctypes; ctypes.CDLL(None).syscall(442)'; echo $TOPSECRET")
	h.sh("log1", "echo hunter2-very-secret")
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ws.SetReadDeadline(deadline)
		_, data, err := ws.ReadMessage()
		if err != nil {
			break
		}
		got = append(got, string(data))
		all := strings.Join(got, "\n")
		if strings.Contains(all, "sys_442") && strings.Count(all, `"process_exit"`) >= 2 {
			break
		}
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{`"type":"kernel"`, "Unsupported syscall sys_442", `"kind":"started"`, `"kind":"process_start"`, `"kind":"process_exit"`, "[REDACTED:TOPSECRET]", `"redactions":{"value:TOPSECRET":1}`} {
		if !strings.Contains(all, want) {
			t.Errorf("log stream lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "hunter2") || strings.Contains(all, h.cfg.DataDir) {
		t.Errorf("log stream leaks a secret or a host path:\n%s", all)
	}
	code, b := h.call(h.token, "GET", "/v1/sandbox/log1/logs", nil)
	if code != 200 || !strings.Contains(string(b), "sys_442") || strings.Contains(string(b), "hunter2") {
		t.Fatalf("GET logs: %d %s", code, b)
	}
}

// Terminals are listed, killed by id, and closed after the idle time
// without viewers.
func TestRealTerminalListKillIdle(t *testing.T) {
	cfg := realConfig(t)
	cfg.Limits.TerminalIdleSeconds = 1
	h := startServer(t, cfg)
	h.provision("tl", "test-tiny")
	list := func() []terminalJSON {
		code, b := h.call(h.token, "GET", "/v1/sandbox/tl/terminals", nil)
		if code != 200 {
			t.Fatal(code)
		}
		var out struct{ Terminals []terminalJSON }
		json.Unmarshal(b, &out)
		return out.Terminals
	}
	a := h.terminalWS(t, "tl", "")
	a.readUntil("$ ", 10*time.Second)
	if l := list(); len(l) != 1 || l[0].TerminalID != a.id || l[0].Viewers != 1 || !l[0].Running {
		t.Fatalf("list: %+v", l)
	}
	if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/tl/terminals/"+a.id, nil); code != 204 {
		t.Fatalf("kill: %d", code)
	}
	a.readUntil("\x00never", 5*time.Second)
	if a.exit == nil || *a.exit != 137 {
		t.Fatalf("killed terminal exit: %v", a.exit)
	}
	if l := list(); len(l) != 0 {
		t.Fatalf("after kill: %+v", l)
	}
	// Idle: a terminal nobody watches is closed after terminalIdleSeconds.
	b := h.terminalWS(t, "tl", "")
	b.readUntil("$ ", 10*time.Second)
	b.c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for len(list()) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if l := list(); len(l) != 0 {
		t.Fatalf("idle terminal kept: %+v", l)
	}
}

// An exec stream whose client goes away has its process group killed.
func TestRealExecStreamClientGone(t *testing.T) {
	h := startServer(t, realConfig(t))
	h.provision("gone", "test-tiny")
	hdr := http.Header{"Authorization": {"Bearer " + h.token}}
	c, _, err := h.dialWS("/v1/sandbox/terminal/gone/ws?tty=false&command=sleep%20321%20%26%20sleep%20322", hdr)
	if err != nil {
		t.Fatal(err)
	}
	c.ReadMessage() // ready
	time.Sleep(500 * time.Millisecond)
	count := "ps -eo args= | grep -c '^sleep 32[12]$' || true"
	if r := h.sh("gone", count); strings.TrimSpace(r.Stdout) != "2" {
		t.Fatalf("not running: %q", r.Stdout)
	}
	c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if r := h.sh("gone", count); strings.TrimSpace(r.Stdout) == "0" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("stream's processes survived the client")
}

// Full-screen programs in a terminal: top draws and quits on a key, the
// Python REPL evaluates.
func TestRealFullScreenPrograms(t *testing.T) {
	h := startServer(t, realConfig(t))
	h.provision("fs", "test-tiny")
	w := h.terminalWS(t, "fs", "cols=100&rows=30")
	if !w.readUntil("$ ", 10*time.Second) {
		t.Fatal("no prompt")
	}
	w.send("top\n")
	if !w.readUntil("load average", 10*time.Second) {
		t.Fatalf("top: %q", w.out.String())
	}
	w.send("q")
	time.Sleep(time.Second) // top reads keys until it has quit
	w.send("python3\n")
	if !w.readUntil(">>> ", 10*time.Second) {
		t.Fatalf("python: %q", w.out.String())
	}
	w.send("6 * 7\n")
	if !w.readUntil("42", 10*time.Second) {
		t.Fatalf("python eval: %q", w.out.String())
	}
	w.send("exit()\n")
	w.send("echo back-$((2*21))\n")
	if !w.readUntil("back-42", 10*time.Second) {
		t.Fatalf("after python: %q", w.out.String())
	}
	w.out.Reset()
	w.send("vi /tmp/v.txt\n")
	if !w.readUntil("/tmp/v.txt", 10*time.Second) {
		t.Fatalf("vi did not draw: %q", w.out.String())
	}
	w.send("ihello from vim\x1b")
	w.send(":wq\r")
	if !w.readUntil("written", 10*time.Second) {
		t.Fatalf("vi write: %q", w.out.String())
	}
	// Keep what came after "written": the prompt may have come with it.
	rest := w.out.String()[strings.LastIndex(w.out.String(), "written"):]
	w.out.Reset()
	w.out.WriteString(rest)
	if !w.readUntil("$ ", 10*time.Second) { // vim drops typeahead as it quits
		t.Fatalf("no prompt after vi: %q", w.out.String())
	}
	w.send("echo saved-$(cat /tmp/v.txt | tr ' ' _)\n")
	if !w.readUntil("saved-hello_from_vim", 10*time.Second) {
		t.Fatalf("vi edit: %q", w.out.String())
	}
}

// Closing a terminal ends its shell's jobs as a terminal hang-up does on
// Linux (gVisor sends no SIGHUP): the foreground job and a background one
// end, a nohup'd one lives on.
func TestRealTerminalCloseEndsItsJobs(t *testing.T) {
	h := startServer(t, realConfig(t))
	h.provision("tj1", "test-tiny")
	w := h.terminalWS(t, "tj1", "")
	if !w.readUntil("$ ", 20*time.Second) {
		t.Fatalf("no prompt: %q", w.out.String())
	}
	w.send("sleep 666 & nohup sleep 777 >/dev/null 2>&1 & echo TERM-$((2+3)); sleep 888\n")
	if !w.readUntil("TERM-5", 10*time.Second) {
		t.Fatalf("terminal: %q", w.out.String())
	}
	jobs := func() string {
		return h.sh("tj1", "ps -eo args= | grep -E '^sleep [678]{3}$' | sort | tr '\\n' ' '").Stdout
	}
	for i := 0; jobs() != "sleep 666 sleep 777 sleep 888 "; i++ {
		if i > 50 {
			t.Fatalf("jobs: %q", jobs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, b := h.call(h.token, "DELETE", "/v1/sandbox/tj1/terminals/"+w.id, nil); code != 204 {
		t.Fatalf("close: %d %s", code, b)
	}
	for i := 0; jobs() != "sleep 777 "; i++ {
		if i > 50 {
			t.Fatalf("after close: %q", jobs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
