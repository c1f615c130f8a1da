package streams

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// WebSocket timing: a peer that sends nothing (not even a pong) for
// WSPongWait is gone; pings go out every WSPingEvery; one message must be
// written within WSWriteWait.
const (
	WSPongWait  = 60 * time.Second
	WSPingEvery = 20 * time.Second
	WSWriteWait = 10 * time.Second
	wsQueue     = 64
)

// Close codes a WSConn can end with.
const (
	CloseNormal        = websocket.CloseNormalClosure
	ClosePolicy        = websocket.ClosePolicyViolation
	CloseInternalError = websocket.CloseInternalServerErr
	CloseGoingAway     = websocket.CloseGoingAway
)

// WSConn follows gorilla/websocket's concurrency contract for one socket:
// one writer goroutine (Run) owns every write (messages, pings, the close
// frame) with a deadline per message; one reader (the owner of the
// connection's read side) calls Read, whose deadline every message and pong
// renews. Other goroutines hand messages to Send, which blocks while the
// queue is full (backpressure) and fails once the connection is done.
//
// The goroutine that upgraded the connection owns the WSConn: it starts Run
// and one reader, and returns when Done is closed; Run closes the socket
// when it ends.
type WSConn struct {
	c       *websocket.Conn
	out     chan wsMsg
	done    chan struct{}
	once    sync.Once
	closing atomic.Bool // a close frame is queued: Run writes what is before it, even after Close
}

type wsMsg struct {
	typ  int
	data []byte
}

// NewWSConn wraps an upgraded connection; readLimit caps one incoming
// message (larger ones end the connection).
func NewWSConn(c *websocket.Conn, readLimit int64) *WSConn {
	c.SetReadLimit(readLimit)
	c.SetReadDeadline(time.Now().Add(WSPongWait))
	c.SetPongHandler(func(string) error { return c.SetReadDeadline(time.Now().Add(WSPongWait)) })
	return &WSConn{c: c, out: make(chan wsMsg, wsQueue), done: make(chan struct{})}
}

// Done is closed when the connection ends (either side, or Close).
func (w *WSConn) Done() <-chan struct{} { return w.done }

// Close ends the connection: Run sends a close frame and closes the socket.
func (w *WSConn) Close() { w.once.Do(func() { close(w.done) }) }

func (w *WSConn) send(typ int, data []byte) bool {
	select {
	case <-w.done: // a done connection takes nothing, even with room queued
		return false
	default:
	}
	select {
	case w.out <- wsMsg{typ, data}:
		return true
	case <-w.done:
		return false
	}
}

// SendBinary queues a binary message; false once the connection is done.
func (w *WSConn) SendBinary(data []byte) bool { return w.send(websocket.BinaryMessage, data) }

// SendText queues a text message; false once the connection is done.
func (w *WSConn) SendText(data []byte) bool { return w.send(websocket.TextMessage, data) }

// SendJSON queues v as a JSON text message.
func (w *WSConn) SendJSON(v any) bool {
	b, _ := json.Marshal(v)
	return w.send(websocket.TextMessage, b)
}

// CloseWith queues a close frame with code and reason after what is queued;
// the connection ends once it is written.
func (w *WSConn) CloseWith(code int, reason string) {
	if w.send(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason)) {
		w.closing.Store(true)
	}
}

// Read returns the next message (binary is false for text), renewing the
// read deadline. Only the connection's one reader calls it; an error means
// the peer is gone, and the caller then calls Close.
func (w *WSConn) Read() (binary bool, data []byte, err error) {
	typ, data, err := w.c.ReadMessage()
	if err != nil {
		return false, nil, err
	}
	w.c.SetReadDeadline(time.Now().Add(WSPongWait))
	return typ == websocket.BinaryMessage, data, nil
}

// drain writes what was queued up to and including a close frame, within
// a second in all (the owner's Close must not drop an exit event queued
// before its CloseWith, nor wait long for a peer that is gone). It reports
// whether the close frame was written.
func (w *WSConn) drain() bool {
	deadline := time.Now().Add(time.Second)
	for {
		select {
		case m := <-w.out:
			w.c.SetWriteDeadline(deadline)
			if w.c.WriteMessage(m.typ, m.data) != nil {
				return true // the peer is gone: nothing more to say
			}
			if m.typ == websocket.CloseMessage {
				return true
			}
		default:
			return false
		}
	}
}

// Run is the only goroutine writing to the socket: queued messages and
// pings. It returns, closing the socket, when the connection ends.
func (w *WSConn) Run() {
	ping := time.NewTicker(WSPingEvery)
	defer ping.Stop()
	defer w.c.Close()
	for {
		select {
		case m := <-w.out:
			w.c.SetWriteDeadline(time.Now().Add(WSWriteWait))
			if err := w.c.WriteMessage(m.typ, m.data); err != nil {
				w.Close()
				return
			}
			if m.typ == websocket.CloseMessage {
				w.Close()
				return
			}
		case <-ping.C:
			if err := w.c.WriteControl(websocket.PingMessage, nil, time.Now().Add(WSWriteWait)); err != nil {
				w.Close()
				return
			}
		case <-w.done:
			if w.closing.Load() && w.drain() {
				return
			}
			w.c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			return
		}
	}
}
