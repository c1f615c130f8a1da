package procs

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/goleak"

	"sandboxd/runsc"
	"sandboxd/runsc/agent"
	"sandboxd/streams"
	"sandboxd/streams/scrub"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeProc is a process on pipes: run gets the process's side (its stdin
// to read, stdout and stderr to write) and returns its exit code.
type fakeProc struct {
	inR, outR, errR *io.PipeReader
	inW, outW, errW *io.PipeWriter

	mu      sync.Mutex
	signals []string
	sizes   [][2]uint16
	closed  bool

	done chan struct{}
	exit agent.Exit
	err  error
}

func startFake(run func(p *fakeProc) int) *fakeProc {
	p := &fakeProc{done: make(chan struct{})}
	p.inR, p.inW = io.Pipe()
	p.outR, p.outW = io.Pipe()
	p.errR, p.errW = io.Pipe()
	go func() {
		code := run(p)
		p.outW.Close()
		p.errW.Close()
		p.mu.Lock()
		p.exit = agent.Exit{Code: code}
		if p.closed {
			p.err = errors.New("killed")
			p.exit = agent.Exit{}
		}
		p.mu.Unlock()
		close(p.done)
	}()
	return p
}

func (p *fakeProc) Stdin() io.WriteCloser { return p.inW }
func (p *fakeProc) Stdout() io.Reader     { return p.outR }
func (p *fakeProc) Stderr() io.Reader     { return p.errR }

func (p *fakeProc) Resize(cols, rows uint16) error {
	p.mu.Lock()
	p.sizes = append(p.sizes, [2]uint16{cols, rows})
	p.mu.Unlock()
	return nil
}

func (p *fakeProc) Signal(name string, group bool) error {
	p.mu.Lock()
	p.signals = append(p.signals, name)
	p.mu.Unlock()
	return nil
}

func (p *fakeProc) Wait() (agent.Exit, error) {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit, p.err
}

// Close "kills" the process: its pipes break, so run returns.
func (p *fakeProc) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.inR.CloseWithError(io.ErrClosedPipe)
	p.outR.CloseWithError(io.ErrClosedPipe)
	p.errR.CloseWithError(io.ErrClosedPipe)
	<-p.done
	return nil
}

func (p *fakeProc) wasClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *fakeProc) got() (signals []string, sizes [][2]uint16) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.signals...), append([][2]uint16(nil), p.sizes...)
}

var _ runsc.Process = (*fakeProc)(nil)

// echo copies stdin to stdout until stdin ends or "exit N" arrives.
func echo(p *fakeProc) int {
	buf := make([]byte, 4096)
	for {
		n, err := p.inR.Read(buf)
		if n > 0 {
			if s := string(buf[:n]); strings.HasPrefix(s, "exit") {
				return 7
			}
			if _, err := p.outW.Write(buf[:n]); err != nil {
				return 1
			}
		}
		if err != nil {
			return 0
		}
	}
}

const secret = "s3cr3t-token-value-42"

func testSet(t *testing.T) *scrub.Set {
	t.Helper()
	set, err := scrub.NewSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	set, err = set.WithValues(map[string]string{"TOKEN": secret})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// socket serves one WebSocket with serve and returns the client's end;
// the cleanup waits for serve to return.
func socket(t *testing.T, serve func(w *streams.WSConn)) *websocket.Conn {
	t.Helper()
	served := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		defer close(served)
		c, err := (&websocket.Upgrader{}).Upgrade(rw, r, nil)
		if err != nil {
			return
		}
		w := streams.NewWSConn(c, 1<<20)
		go w.Run()
		serve(w)
		w.Close()
	}))
	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		<-served
		srv.Close()
	})
	return c
}

// readUntil reads messages until one contains want; it returns all text read.
func readUntil(t *testing.T, c *websocket.Conn, want string) string {
	t.Helper()
	var all strings.Builder
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for !strings.Contains(all.String(), want) {
		_, b, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("waiting for %q: %v; read %q", want, err, all.String())
		}
		all.Write(b)
	}
	return all.String()
}

// fakeStarter hands out processes made by run.
type fakeStarter struct {
	run   func(p *fakeProc) int
	mu    sync.Mutex
	procs []*fakeProc
	gate  chan struct{} // if set, Start waits for it
}

func (f *fakeStarter) Start(ctx context.Context, id string, s agent.Spec) (runsc.Process, error) {
	if f.gate != nil {
		<-f.gate
	}
	p := startFake(f.run)
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	return p, nil
}

func (f *fakeStarter) all() []*fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeProc(nil), f.procs...)
}
