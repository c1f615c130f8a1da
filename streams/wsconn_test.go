package streams

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// wsPair serves one WebSocket with fn on the server side and returns the
// client's end.
func wsPair(t *testing.T, fn func(w *WSConn)) *websocket.Conn {
	t.Helper()
	served := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		defer close(served)
		c, err := (&websocket.Upgrader{}).Upgrade(rw, r, nil)
		if err != nil {
			return
		}
		w := NewWSConn(c, 16)
		go w.Run()
		fn(w)
		<-w.Done()
	}))
	t.Cleanup(func() { <-served; srv.Close() })
	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestWSConnOrderAndClose(t *testing.T) {
	c := wsPair(t, func(w *WSConn) {
		w.SendText([]byte("one"))
		w.SendBinary([]byte{2})
		w.SendJSON(map[string]int{"three": 3})
		w.CloseWith(CloseNormal, "bye")
	})
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got []string
	for {
		_, b, err := c.ReadMessage()
		if err != nil {
			if !websocket.IsCloseError(err, CloseNormal) || !strings.Contains(err.Error(), "bye") {
				t.Fatalf("close: %v", err)
			}
			break
		}
		got = append(got, string(b))
	}
	if strings.Join(got, "|") != "one|\x02|{\"three\":3}" {
		t.Fatalf("messages = %q", got)
	}
}

// An owner that closes right after its CloseWith (as a handler returning
// does) loses nothing queued before the close frame: a terminal's exit
// event once went missing that way.
func TestWSConnCloseAfterCloseWith(t *testing.T) {
	for i := 0; i < 50; i++ {
		c := wsPair(t, func(w *WSConn) {
			w.SendJSON(map[string]string{"type": "exit"})
			w.CloseWith(CloseNormal, "exit")
			w.Close()
		})
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, b, err := c.ReadMessage()
		if err != nil || string(b) != `{"type":"exit"}` {
			t.Fatalf("round %d: %q %v", i, b, err)
		}
		if _, _, err := c.ReadMessage(); !websocket.IsCloseError(err, CloseNormal) || !strings.Contains(err.Error(), "exit") {
			t.Fatalf("round %d: close: %v", i, err)
		}
	}
}

func TestWSConnReadAndPeerGone(t *testing.T) {
	read := make(chan string, 4)
	ended := make(chan bool, 1)
	c := wsPair(t, func(w *WSConn) {
		for {
			binary, b, err := w.Read()
			if err != nil {
				w.Close()
				// After the end, Send fails instead of blocking.
				ended <- !w.SendText([]byte("late"))
				return
			}
			read <- map[bool]string{true: "b:", false: "t:"}[binary] + string(b)
		}
	})
	c.WriteMessage(websocket.TextMessage, []byte("hi"))
	c.WriteMessage(websocket.BinaryMessage, []byte("yo"))
	if a, b := <-read, <-read; a != "t:hi" || b != "b:yo" {
		t.Fatalf("read %q %q", a, b)
	}
	// Over the read limit (16 bytes) the connection ends.
	c.WriteMessage(websocket.TextMessage, []byte(strings.Repeat("x", 64)))
	select {
	case ok := <-ended:
		if !ok {
			t.Fatal("Send after the end succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an oversized message did not end the connection")
	}
}
