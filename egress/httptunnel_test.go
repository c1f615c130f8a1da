package egress

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestTunnelEveryRequest: in a tunnel carrying HTTP, every request is
// checked, not just the first, and bodies are framed so a request hidden in
// a body is data and one after it is checked. What reaches the upstream is
// recorded byte for byte.
func TestTunnelEveryRequest(t *testing.T) {
	got := make(chan string, 1)
	up := tcpServer(t, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		got <- string(b)
	})
	port := up.Addr().(*net.TCPAddr).Port
	e := newEnv(t, testConfig(port))
	addr := e.serve("s1", 0, 1<<30)
	target := fmt.Sprintf("allowed.test:%d", port)
	hostHdr := "Host: " + target + "\r\n"
	req := func(path string, extra ...string) string {
		return "GET " + path + " HTTP/1.1\r\n" + hostHdr + strings.Join(extra, "") + "\r\n"
	}
	hidden := "GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n" // 36 bytes, 0x24

	for _, tc := range []struct {
		name, send, reason string
		reaches            string // what the upstream must receive ("*": anything without "evil")
		pause              int    // send this many bytes, wait, then the rest
	}{
		{name: "keep-alive", send: req("/a") + req("/b"), reaches: req("/a") + req("/b")},
		{name: "second Host differs", send: req("/a") + "GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: ReasonHostMismatch, reaches: req("/a")},
		{name: "second absolute-form", send: req("/a") + "GET http://evil.test/ HTTP/1.1\r\n" + hostHdr + "\r\n", reason: ReasonAbsoluteForm, reaches: req("/a")},
		{name: "request in a Content-Length body is data",
			send:    "POST /a HTTP/1.1\r\n" + hostHdr + "Content-Length: 36\r\n\r\n" + hidden + req("/c"),
			reaches: "POST /a HTTP/1.1\r\n" + hostHdr + "Content-Length: 36\r\n\r\n" + hidden + req("/c")},
		{name: "request in a chunked body is data",
			send:    "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n24;ext=1\r\n" + hidden + "\r\n0\r\nX-Trailer: 1\r\n\r\n" + req("/c"),
			reaches: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n24;ext=1\r\n" + hidden + "\r\n0\r\nX-Trailer: 1\r\n\r\n" + req("/c")},
		{name: "after a chunked body", send: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + hidden,
			reason: ReasonHostMismatch, reaches: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"},
		{name: "Content-Length and chunked", send: req("/a") + "POST /b HTTP/1.1\r\n" + hostHdr + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
			reason: ReasonHTTPFraming, reaches: req("/a")},
		{name: "two Content-Lengths", send: "POST /b HTTP/1.1\r\n" + hostHdr + "Content-Length: 0\r\nContent-Length: 36\r\n\r\n" + hidden,
			reason: ReasonHTTPFraming, reaches: ""},
		{name: "Transfer-Encoding not just chunked", send: "POST /b HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
			reason: ReasonHTTPFraming, reaches: ""},
		{name: "Content-Length with a sign", send: "POST /b HTTP/1.1\r\n" + hostHdr + "Content-Length: +36\r\n\r\n" + hidden,
			reason: ReasonHTTPFraming, reaches: ""},
		{name: "bad chunk size", send: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + hidden,
			reason: ReasonHTTPFraming, reaches: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n"},
		{name: "folded header line", send: req("/a") + "GET /b HTTP/1.1\r\n" + hostHdr + "X: a\r\n Host: evil.test\r\n\r\n",
			reason: ReasonHTTPFraming, reaches: req("/a")},
		{name: "bare LF in a later head", send: req("/a") + "GET /b HTTP/1.1\n" + hostHdr + "\r\n", reason: ReasonNotHTTP, reaches: req("/a")},
		{name: "bare LF in the first head", send: "GET /b HTTP/1.1\r\nHost: " + target + "\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "not HTTP after a request", send: req("/a") + "\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: req("/a")},
		{name: "first request after a blank line", send: "\r\n" + hidden, reason: ReasonHostMismatch, reaches: "\r\n"},
		{name: "first request after a whitespace line", send: " \t\x0b\r\n" + hidden, reason: ReasonHostMismatch, reaches: " \t\x0b\r\n"},
		{name: "request line with a leading space", send: " GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "request line with a vertical tab", send: "\x0bGET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "request line with two spaces", send: "GET  /x HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "request line with a tab", send: "GET\t/x HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "non-ASCII target", send: "GET /\xc3\xa9 HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: "*", reaches: ""},
		{name: "a request line completed after a pause", send: "GET /x HTTP/1.1\r\nHost: evil.test\r\n\r\n", pause: 6, reason: ReasonHostMismatch, reaches: "GET "},
		{name: "a request line completed after a pause, right Host", send: req("/x"), pause: 6, reaches: req("/x")},
		{name: "Host with a trailing dot", send: "GET /x HTTP/1.1\r\nHost: allowed.test.\r\n\r\n", reason: ReasonHostMismatch, reaches: ""},
		{name: "Host with another port", send: "GET /x HTTP/1.1\r\nHost: allowed.test:1\r\n\r\n", reason: ReasonHostMismatch, reaches: ""},
		{name: "Host in upper case", send: "GET /x HTTP/1.1\r\nHost: " + strings.ToUpper(target) + "\r\n\r\n", reaches: "GET /x HTTP/1.1\r\nHost: " + strings.ToUpper(target) + "\r\n\r\n"},
		{name: "HTTP/1.0 with chunked", send: "POST /x HTTP/1.0\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", reason: ReasonHTTPFraming, reaches: ""},
		{name: "GET with a body", send: "GET /x HTTP/1.1\r\n" + hostHdr + "Content-Length: 36\r\n\r\n" + hidden, reason: ReasonHTTPFraming, reaches: ""},
		{name: "first request with a lower-case method", send: "get /x HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: ReasonHostMismatch, reaches: ""},
		{name: "a protocol other than HTTP passes", send: "PING\r\nSSH-2.0-x y\r\n", reaches: "PING\r\nSSH-2.0-x y\r\n"},
		{name: "a request in the trailers", send: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n0\r\nX: y\r\n" + hidden,
			reason: ReasonHTTPFraming, reaches: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n0\r\nX: y\r\n"},
		{name: "a signed chunk size", send: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n",
			reason: ReasonHTTPFraming, reaches: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n"},
		{name: "a chunk size with a space", send: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n0\r\n\r\n",
			reason: ReasonHTTPFraming, reaches: "POST /a HTTP/1.1\r\n" + hostHdr + "Transfer-Encoding: chunked\r\n\r\n"},
		{name: "a scheme-relative target", send: "GET //evil.test/x HTTP/1.1\r\n" + hostHdr + "\r\n", reason: ReasonAbsoluteForm, reaches: ""},
		{name: "a partial request line is held", send: "get /x", reaches: "get "},
		{name: "a partial absolute-form line is held", send: "GET http://evil.test/x HTTP/1.1", reaches: "GET "},
		{name: "a method like an SSH banner", send: "SSH-2.0 /x HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: ReasonHostMismatch, reaches: ""},
		{name: "a token that waits flows", send: "PING", reaches: "PING"},
		{name: "a version-less (HTTP/0.9) line with headers", send: "GET /x\r\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "HTTP/0.9 then a pipelined request", send: "GET /x\r\nHost: evil.test\r\nConnection: keep-alive\r\n\r\nGET /y HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "an absolute HTTP/0.9 target", send: "GET http://evil.test/x\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "an RTSP version", send: "OPTIONS / RTSP/1.0\r\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "an ICE version", send: "SOURCE / ICE/1.0\r\nHost: evil.test\r\n\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "a text command with arguments", send: "EHLO example.com\r\n", reason: ReasonNotHTTP, reaches: ""},
		{name: "an SSH banner with a comment passes", send: "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n\x00\x00\x01", reaches: "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n\x00\x00\x01"},
		{name: "binary passes", send: "\x00\x01GET / HTTP/1.1\r\n", reaches: "\x00\x01GET / HTTP/1.1\r\n"},
		{name: "a request line with a 40 KB target", send: "GET /" + strings.Repeat("a", 40<<10) + " HTTP/1.1\r\nHost: evil.test\r\n\r\n", reason: "*", reaches: "*"},
		{name: "no opaque bytes after an upgrade",
			send:   req("/ws", "Upgrade: websocket\r\nConnection: Upgrade\r\n") + " \xa0GET /y HTTP/1.1\r\nHost: evil.test\r\n\r\n",
			reason: ReasonNotHTTP, reaches: req("/ws", "Upgrade: websocket\r\nConnection: Upgrade\r\n")},
		{name: "a request after an upgrade is still checked",
			send:   req("/ws", "Upgrade: websocket\r\nConnection: Upgrade\r\n") + hidden,
			reason: ReasonHostMismatch, reaches: req("/ws", "Upgrade: websocket\r\nConnection: Upgrade\r\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.events.mu.Lock()
			e.events.denied = nil
			e.events.mu.Unlock()
			conn, _, resp := rawConnect(t, addr, target, true)
			if resp.StatusCode != 200 {
				t.Fatal(resp.Status)
			}
			// Byte by byte for one case in three, so framing never relies
			// on how the stream was segmented.
			if tc.pause > 0 {
				_, _ = io.WriteString(conn, tc.send[:tc.pause])
				time.Sleep(100 * time.Millisecond)
				_, _ = io.WriteString(conn, tc.send[tc.pause:])
			} else if len(tc.name)%3 == 0 {
				for i := 0; i < len(tc.send); i++ {
					if _, err := conn.Write([]byte{tc.send[i]}); err != nil {
						break
					}
				}
			} else {
				_, _ = io.WriteString(conn, tc.send)
			}
			if tc.reason == "" {
				_ = conn.(*net.TCPConn).CloseWrite()
			}
			select {
			case b := <-got:
				// Sent a byte at a time, the start of a refused request's
				// first line may flow before its end: never a whole line.
				partial := tc.reason != "" && strings.HasPrefix(tc.send, b) && strings.HasPrefix(b, tc.reaches) &&
					!strings.Contains(b[len(tc.reaches):], "\n")
				if tc.reaches == "*" && strings.Contains(b, "evil") || tc.reaches != "*" && b != tc.reaches && !partial {
					t.Errorf("upstream received\n%q\nwant\n%q", b, tc.reaches)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("upstream saw no end of stream")
			}
			if tc.reason == "*" {
				for deadline := time.Now().Add(5 * time.Second); len(e.events.denials()) == 0; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("not refused")
					}
				}
			} else if tc.reason != "" {
				e.events.waitDenied(t, tc.reason)
				if n, err := conn.Read(make([]byte, 1)); err == nil {
					t.Errorf("tunnel still open (%d bytes)", n)
				}
			} else if d := e.events.denials(); len(d) > 0 {
				t.Errorf("denied: %+v", d)
			}
		})
	}
}
