package server

// Attacks from outside that need a real sandbox (one, shared): oversized
// frames into a terminal and an exec stream with a real PTY and process
// behind them, and file names and symlinks made inside by the sandbox's
// user (see attack_outside_test.go for the rest).

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

func TestRealAttackOutside(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	h.provision("atk", "test-tiny")
	defer h.call(h.token, "DELETE", "/v1/sandbox/atk", nil)
	addr := strings.TrimPrefix(h.ts.URL, "http://")
	bearer := http.Header{"Authorization": {"Bearer " + h.token}}

	t.Run("oversized frames", func(t *testing.T) {
		// A terminal: the message over the limit ends that socket (1009);
		// the PTY outlives it and a new socket re-attaches.
		w := h.terminalWS(t, "atk", "cols=80&rows=24")
		w.send("echo ready-$((40+2))\n")
		if !w.readUntil("ready-42", 20*time.Second) || w.id == "" {
			t.Fatalf("terminal: %q", w.out.String())
		}
		for _, mt := range []int{websocket.BinaryMessage, websocket.TextMessage} {
			c, _, err := h.dialWS("/v1/sandbox/terminal/atk/ws?terminalId="+w.id, bearer)
			if err != nil {
				t.Fatal(err)
			}
			c.WriteMessage(mt, make([]byte, wsReadLimit+1))
			err = readToEnd(c)
			if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) && !isConnReset(err) {
				t.Errorf("terminal, %d-byte message (type %d): %v, want close 1009", wsReadLimit+1, mt, err)
			}
		}
		w.send("echo alive-$((40+3))\n")
		if !w.readUntil("alive-43", 20*time.Second) {
			t.Fatalf("the terminal after the oversized messages: %q", w.out.String())
		}
		// An exec stream likewise.
		c, _, err := h.dialWS("/v1/sandbox/terminal/atk/ws?tty=false&command="+url.QueryEscape("cat >/dev/null"), bearer)
		if err != nil {
			t.Fatal(err)
		}
		c.WriteMessage(websocket.BinaryMessage, make([]byte, 4<<20))
		if err := readToEnd(c); !websocket.IsCloseError(err, websocket.CloseMessageTooBig) && !isConnReset(err) {
			t.Errorf("exec stream, 4 MiB message: %v, want close 1009", err)
		}
		// Just under the limit is stdin like any other.
		c, _, err = h.dialWS("/v1/sandbox/terminal/atk/ws?tty=false&command="+url.QueryEscape("head -c 1000000 | wc -c"), bearer)
		if err != nil {
			t.Fatal(err)
		}
		c.WriteMessage(websocket.BinaryMessage, make([]byte, 1000000))
		var out strings.Builder
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		for {
			mt, b, err := c.ReadMessage()
			if err != nil || mt == websocket.TextMessage && strings.Contains(string(b), `"exit"`) {
				break
			}
			if mt == websocket.BinaryMessage && len(b) > 0 && b[0] == 1 {
				out.Write(b[1:])
			}
		}
		c.Close()
		if strings.TrimSpace(out.String()) != "1000000" {
			t.Errorf("a message under the limit: wc says %q", out.String())
		}
		if err := healthz(addr); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("names and links made inside", func(t *testing.T) {
		hostDir := t.TempDir()
		marker := "HOST-SECRET-" + randHex(8)
		if err := os.WriteFile(filepath.Join(hostDir, "secret.txt"), []byte(marker), 0o644); err != nil {
			t.Fatal(err)
		}
		r := h.sh("atk", fmt.Sprintf(`set -e; cd /workspace
printf x > "$(printf 'evil\r\nSet-Cookie: pwned=1\r\nX-Injected: "q";.txt')"
ln -s %[1]s/secret.txt l-file; ln -s %[1]s l-dir; ln -s / l-root; ln -s /proc/1/root%[1]s/secret.txt l-proc
mkdir -p d; ln -s ../l-dir d/inner; echo ok`, hostDir))
		if strings.TrimSpace(r.Stdout) != "ok" {
			t.Fatalf("setup: %+v", r)
		}
		name := "evil\r\nSet-Cookie: pwned=1\r\nX-Injected: \"q\";.txt"
		for _, target := range []string{
			"/v1/sandbox/atk/artifacts/" + url.PathEscape(name),
			"/v1/sandbox/atk/files?path=" + url.QueryEscape("/workspace/"+name),
		} {
			st, head, body, err := rawHTTP(addr, "GET "+target+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+h.token+"\r\nConnection: close\r\n\r\n")
			if err != nil || st != http.StatusOK || string(body) != "x" {
				t.Fatalf("download %s: %d %q %v", target, st, body, err)
			}
			assertNoInjection(t, "download of a name made inside", head, "Content-Disposition")
		}
		for _, p := range []string{
			"artifacts/l-file", "artifacts/l-dir/secret.txt", "artifacts/l-root" + hostDir + "/secret.txt", "artifacts/l-proc",
			"artifacts/d/inner/secret.txt", "artifacts/%2e%2e/%2e%2e" + hostDir + "/secret.txt", "artifacts/l-dir%2fsecret.txt",
			"files?path=/workspace/l-file", "files?path=/workspace/l-dir", "files?path=/workspace/l-root" + url.QueryEscape(hostDir),
			"files?path=/workspace/d/inner/secret.txt", "files?path=/workspace/l-proc",
		} {
			st, _, body, err := rawHTTP(addr, "GET /v1/sandbox/atk/"+p+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+h.token+"\r\nConnection: close\r\n\r\n")
			if err != nil || st == http.StatusOK || strings.Contains(string(body), marker) || strings.Contains(string(body), "secret.txt") {
				t.Errorf("%s: %d %.200s %v", p, st, body, err)
			}
			if code, _ := h.call(h.token, "PUT", "/v1/sandbox/atk/"+strings.Replace(p, "artifacts/", "files?path=/workspace/", 1), "pwned"); code < 400 {
				t.Errorf("PUT %s: %d", p, code)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(hostDir, "secret.txt")); string(b) != marker {
			t.Errorf("the host file changed: %q", b)
		}
		if ents, _ := os.ReadDir(hostDir); len(ents) != 1 {
			t.Errorf("the host directory changed: %v", ents)
		}
	})
}

// readToEnd reads a WebSocket until it ends and returns why.
func readToEnd(c *websocket.Conn) error {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		if _, _, err := c.ReadMessage(); err != nil {
			return err
		}
	}
}
