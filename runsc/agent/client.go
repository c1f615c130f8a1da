package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// StreamBuffer is how many bytes of stdout (and of stderr) a Process
// buffers for its consumer before the connection blocks.
const StreamBuffer = 1 << 20

// Client talks to one agent. The zero DialTimeout means no limit beyond the
// context's.
type Client struct {
	Socket      string
	DialTimeout time.Duration
}

// Spec describes a process to start. UID and GID are sent as given: 0 is root.
type Spec struct {
	Args, Env  []string
	Cwd        string
	UID, GID   uint32
	TTY        bool
	Cols, Rows uint16
	Stdin      bool
}

// Exit is how a process ended. A process killed by a signal has Code
// 128+signo and Signal set to the signal's name ("SIGKILL").
type Exit struct {
	Code   int
	Signal string
}

// AgentError is an error the agent reported in an 'E' frame.
type AgentError struct {
	Message string
}

func (e *AgentError) Error() string { return "agent: " + e.Message }

// ErrClosed is returned by Wait after Close ended the process's connection
// before its exit status arrived.
var ErrClosed = errors.New("agent: connection closed")

// Start starts a process and returns once the agent reported its pid. ctx
// bounds dialing and starting only; use Signal or Close to end the process.
func (c *Client) Start(ctx context.Context, s Spec) (*Process, error) {
	uid, gid := s.UID, s.GID
	req := &Request{
		Op: OpStart, Args: s.Args, Env: s.Env, Cwd: s.Cwd, UID: &uid, GID: &gid,
		TTY: s.TTY, Cols: s.Cols, Rows: s.Rows, Stdin: s.Stdin,
	}
	var started Started
	conn, br, err := c.roundTrip(ctx, req, func(typ byte, payload []byte) (bool, error) {
		switch typ {
		case FrameStarted:
			return true, json.Unmarshal(payload, &started)
		case FrameExit:
			return false, errors.New("agent: exit before start")
		}
		return false, fmt.Errorf("agent: unexpected frame %q before start", typ)
	})
	if err != nil {
		return nil, err
	}
	p := &Process{
		client: *c, conn: conn, br: br, pid: started.Pid, warm: started.Warm, tty: s.TTY,
		out: newOutBuf(StreamBuffer), done: make(chan struct{}),
	}
	p.cond.L = &p.mu
	if s.Stdin {
		p.stdin = &stdinWriter{p: p}
	}
	go p.readLoop()
	return p, nil
}

// KillAll kills every process in the sandbox but the agent, for at most
// wait (0: DefaultKillWait), and says what survived.
func (c *Client) KillAll(ctx context.Context, wait time.Duration) (KillResult, error) {
	var res KillResult
	b, err := c.simple(ctx, &Request{Op: OpKillAll, WaitMs: int(wait / time.Millisecond)})
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, fmt.Errorf("agent: killall answer: %w", err)
	}
	return res, nil
}

// Suspend makes the agent close its listener and every other connection
// (before a checkpoint: gVisor cannot save a socket bound to a host file).
// Processes whose connection it closed wait, parked, for Reattach; the
// agent listens again on SIGUSR1.
func (c *Client) Suspend(ctx context.Context) error {
	_, err := c.simple(ctx, &Request{Op: OpSuspend})
	return err
}

// Expire makes the agent kill the processes still parked (after a
// restore, once the server re-attached every process it knows of).
func (c *Client) Expire(ctx context.Context) error {
	_, err := c.simple(ctx, &Request{Op: OpExpire})
	return err
}

// Ping measures one round trip, dialing included.
func (c *Client) Ping(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	_, err := c.simple(ctx, &Request{Op: OpPing})
	return time.Since(t0), err
}

// Warm sets the base environment and size of the warm-shell pool and
// returns once the pool is full. An *AgentError means the pool is
// configured but not full (its shells failed to start, or are slow): the
// agent keeps trying on its own.
func (c *Client) Warm(ctx context.Context, env []string, count int) error {
	if env == nil {
		env = []string{}
	}
	_, err := c.simple(ctx, &Request{Op: OpWarm, Env: env, Count: &count})
	return err
}

// Stats reports the agent's goroutines, descriptors and warm pool (for
// tests and debugging).
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	b, err := c.simple(ctx, &Request{Op: OpStats})
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	return st, err
}

// simple runs a request answered by a single 'x' (or 'E') frame and
// returns the 'x' payload.
func (c *Client) simple(ctx context.Context, req *Request) ([]byte, error) {
	var exit []byte
	conn, _, err := c.roundTrip(ctx, req, func(typ byte, payload []byte) (bool, error) {
		if typ != FrameExit {
			return false, fmt.Errorf("agent: unexpected frame %q", typ)
		}
		exit = payload
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	conn.Close()
	return exit, nil
}

// roundTrip dials, sends req and reads frames until handle says done. 'E'
// frames become *AgentError. On success the connection is returned with no
// deadline; on failure it is closed.
func (c *Client) roundTrip(ctx context.Context, req *Request, handle func(byte, []byte) (bool, error)) (net.Conn, *bufio.Reader, error) {
	line, err := json.Marshal(req)
	if err != nil {
		return nil, nil, err
	}
	d := net.Dialer{Timeout: c.DialTimeout}
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return nil, nil, fmt.Errorf("agent: dial: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (net.Conn, *bufio.Reader, error) {
		stop()
		conn.Close()
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, err
	}
	if _, err := conn.Write(append(line, '\n')); err != nil {
		return fail(fmt.Errorf("agent: send request: %w", err))
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	for {
		typ, payload, err := ReadFrame(br)
		if err != nil {
			return fail(fmt.Errorf("agent: read reply: %w", err))
		}
		if typ == FrameError {
			var m ErrorMsg
			json.Unmarshal(payload, &m)
			return fail(&AgentError{Message: m.Message})
		}
		done, err := handle(typ, payload)
		if err != nil {
			return fail(err)
		}
		if done {
			break
		}
	}
	if !stop() {
		return fail(ctx.Err())
	}
	conn.SetDeadline(time.Time{})
	return conn, br, nil
}

// Process is a process started by the agent. Its methods are safe for
// concurrent use.
//
// A process survives a suspend of its agent (pause with memory): Park,
// before the suspend op, makes the loss of the connection a pause instead
// of the end; Reattach, once the agent listens again, goes on with a new
// connection, losing no output. Writes fail with ErrParked meanwhile.
type Process struct {
	client Client
	wmu    sync.Mutex // frame writes
	pid    int
	warm   bool
	tty    bool
	stdin  *stdinWriter
	out    *outBuf // both streams, in the order the agent sent them

	mu     sync.Mutex // guards conn, br, parked and gone; cond signals their change
	cond   sync.Cond
	conn   net.Conn
	br     *bufio.Reader
	gen    int // connections so far
	parked bool
	gone   error // set when a parked process cannot come back

	done      chan struct{} // closed by readLoop
	exit      Exit
	err       error
	closeOnce sync.Once
	closing   atomic.Bool // Close was called
}

// ErrParked is returned by writes to a parked process.
var ErrParked = errors.New("agent: process parked (sandbox paused)")

// Pid is the process's pid inside the sandbox; it leads its process group.
func (p *Process) Pid() int { return p.pid }

// Stdin is nil unless Spec.Stdin was set. Close sends end-of-file (^D on
// a terminal).
func (p *Process) Stdin() io.WriteCloser {
	if p.stdin == nil {
		return nil
	}
	return p.stdin
}

// Stdout returns the process's standard output (with a TTY: all terminal
// output). It reports io.EOF after the exit status arrived.
func (p *Process) Stdout() io.Reader { return streamReader{p.out, 0} }

// Stderr returns the process's standard error; nil with a TTY.
func (p *Process) Stderr() io.Reader {
	if p.tty {
		return nil
	}
	return streamReader{p.out, 1}
}

// ReadOutput reads output of either stream in the order the agent sent it
// (which Stdout and Stderr, read by two goroutines, lose): stderr reports
// the stream. It reports io.EOF after the exit status arrived. Use it or
// the two readers, not both.
func (p *Process) ReadOutput(b []byte) (n int, stderr bool, err error) {
	n, tag, err := p.out.read(-1, b)
	return n, tag == 1, err
}

// Resize changes the terminal size (TTY only) and signals SIGWINCH.
func (p *Process) Resize(cols, rows uint16) error {
	if !p.tty {
		return errors.New("agent: resize without a tty")
	}
	b, _ := json.Marshal(ResizeMsg{Cols: cols, Rows: rows})
	return p.writeFrame(FrameResize, b)
}

// Signal sends a signal ("SIGINT", "SIGKILL", ...) to the process, or to
// its whole process group.
func (p *Process) Signal(name string, group bool) error {
	b, _ := json.Marshal(SignalMsg{Signal: name, Group: group})
	return p.writeFrame(FrameSignal, b)
}

// Wait waits for the exit status. Output may remain buffered in Stdout and
// Stderr after Wait returned.
func (p *Process) Wait() (Exit, error) {
	<-p.done
	return p.exit, p.err
}

// Close ends the connection: if the process still runs, the agent kills its
// process group. Unread output is discarded. A parked process is given up
// (its agent kills it when nobody attaches).
func (p *Process) Close() error {
	p.closeOnce.Do(func() {
		p.closing.Store(true)
		p.mu.Lock()
		p.conn.Close()
		p.cond.Broadcast()
		p.mu.Unlock()
		p.out.closeRead()
	})
	<-p.done
	return nil
}

// Done reports whether the process ended (its exit status is known or it
// was lost).
func (p *Process) Done() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Park makes the loss of the connection a pause: call it before the agent
// is suspended.
func (p *Process) Park() {
	p.mu.Lock()
	p.parked = true
	p.mu.Unlock()
}

// Reattach gives a parked process a new connection to its agent (which
// listens again after a restore) and unparks it. If the agent no longer
// has the process, the process ends as lost.
func (p *Process) Reattach(ctx context.Context) error {
	p.mu.Lock()
	parked := p.parked
	p.mu.Unlock()
	if !parked || p.Done() {
		return nil
	}
	conn, br, err := p.client.roundTrip(ctx, &Request{Op: OpAttach, Pid: p.pid}, func(typ byte, _ []byte) (bool, error) {
		if typ != FrameStarted {
			return false, fmt.Errorf("agent: unexpected frame %q on attach", typ)
		}
		return true, nil
	})
	if err != nil {
		var ae *AgentError
		if errors.As(err, &ae) {
			p.Abandon(err)
		}
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing.Load() || p.gone != nil {
		conn.Close()
		return nil
	}
	// The reader finishes the old connection first (the agent closed it),
	// so output sent on it before the cut is not lost.
	p.conn, p.br, p.parked = conn, br, false
	p.gen++
	p.cond.Broadcast()
	return nil
}

// Abandon ends a parked process as lost with err (its sandbox was not
// restored).
func (p *Process) Abandon(err error) {
	p.mu.Lock()
	if p.parked && p.gone == nil {
		p.gone = err
		p.cond.Broadcast()
	}
	p.mu.Unlock()
}

func (p *Process) writeFrame(typ byte, payload []byte) error {
	p.mu.Lock()
	conn, parked := p.conn, p.parked
	p.mu.Unlock()
	if parked {
		return ErrParked
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return WriteFrame(conn, typ, payload)
}

// readLoop is the connection's only reader: it owns p.exit and p.err until
// it closes p.done. A parked process's lost connection is waited out.
func (p *Process) readLoop() {
	defer close(p.done)
	var err error
	for {
		p.mu.Lock()
		conn, br, gen := p.conn, p.br, p.gen
		p.mu.Unlock()
		err = p.demux(br)
		conn.Close()
		if err == nil || !p.awaitReattach(&err, gen) {
			break
		}
	}
	if err != nil {
		if p.closing.Load() {
			err = ErrClosed
		}
		p.err = err
	}
	end := err
	if end == nil {
		end = io.EOF
	}
	p.out.closeWrite(end)
}

// awaitReattach waits while the process is parked after connection gen
// failed. It reports whether to read again (reattached); otherwise err may
// be replaced by the reason it was given up.
func (p *Process) awaitReattach(err *error, gen int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.gen == gen && p.parked && p.gone == nil && !p.closing.Load() {
		p.cond.Wait()
	}
	switch {
	case p.closing.Load():
		return false
	case p.gen != gen:
		return true
	case p.gone != nil:
		*err = fmt.Errorf("agent: process lost while paused: %w", p.gone)
	}
	return false
}

func (p *Process) demux(br *bufio.Reader) error {
	for {
		typ, payload, err := ReadFrame(br)
		if err != nil {
			return fmt.Errorf("agent: connection lost: %w", err)
		}
		switch typ {
		case FrameStdout:
			p.out.write(0, payload)
		case FrameStderr:
			if p.tty {
				p.out.write(0, payload)
			} else {
				p.out.write(1, payload)
			}
		case FrameExit:
			var st ExitStatus
			if err := json.Unmarshal(payload, &st); err != nil {
				return fmt.Errorf("agent: bad exit frame: %w", err)
			}
			p.exit = Exit{Code: st.ExitCode, Signal: st.Signal}
			return nil
		case FrameError:
			var m ErrorMsg
			json.Unmarshal(payload, &m)
			return &AgentError{Message: m.Message}
		default:
			return fmt.Errorf("agent: unexpected frame %q", typ)
		}
	}
}

type stdinWriter struct {
	p      *Process
	closed sync.Once
}

func (w *stdinWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), 256<<10)]
		if err := w.p.writeFrame(FrameStdin, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		b = b[len(chunk):]
	}
	return n, nil
}

func (w *stdinWriter) Close() error {
	var err error
	w.closed.Do(func() { err = w.p.writeFrame(FrameCloseStdin, nil) })
	return err
}

// outBuf holds both streams' output between the reader goroutine (writer
// side) and the consumers (reader side): a FIFO of chunks per stream, each
// chunk numbered in arrival order so that an ordered reader can take the
// older of the two heads. write blocks while max bytes of its stream are
// queued.
type outBuf struct {
	mu      sync.Mutex
	cond    sync.Cond
	q       [2][]outChunk // per stream: 0 stdout, 1 stderr
	queued  [2]int        // bytes per stream
	seq     uint64
	max     int
	werr    error // set when the writer is done: io.EOF or the failure
	rclosed bool  // consumer gone: writes are dropped
}

type outChunk struct {
	seq uint64
	b   []byte
}

func newOutBuf(max int) *outBuf {
	b := &outBuf{max: max}
	b.cond.L = &b.mu
	return b
}

// write queues p (which the buffer then owns) for stream tag.
func (b *outBuf) write(tag int, p []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.queued[tag] >= b.max && !b.rclosed {
		b.cond.Wait()
	}
	if b.rclosed || len(p) == 0 {
		return
	}
	// A frame right after one of the same stream joins it: a flood of
	// one-byte frames costs its bytes, not a chunk each.
	if q := b.q[tag]; len(q) > 0 && q[len(q)-1].seq == b.seq {
		q[len(q)-1].b = append(q[len(q)-1].b, p...)
	} else {
		b.seq++
		b.q[tag] = append(q, outChunk{b.seq, p})
	}
	b.queued[tag] += len(p)
	b.cond.Broadcast()
}

func (b *outBuf) closeWrite(err error) {
	b.mu.Lock()
	b.werr = err
	b.cond.Broadcast()
	b.mu.Unlock()
}

func (b *outBuf) closeRead() {
	b.mu.Lock()
	b.rclosed = true
	b.q, b.queued = [2][]outChunk{}, [2]int{}
	b.cond.Broadcast()
	b.mu.Unlock()
}

// read reads from the head chunk of stream tag, or (tag -1) from the
// older head of the two; it returns the stream read.
func (b *outBuf) read(tag int, p []byte) (int, int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		t := tag
		if t < 0 {
			switch {
			case len(b.q[0]) > 0 && (len(b.q[1]) == 0 || b.q[0][0].seq < b.q[1][0].seq):
				t = 0
			case len(b.q[1]) > 0:
				t = 1
			}
		}
		if t >= 0 && len(b.q[t]) > 0 {
			c := &b.q[t][0]
			n := copy(p, c.b)
			c.b = c.b[n:]
			b.queued[t] -= n
			if len(c.b) == 0 {
				*c = outChunk{} // the backing array outlives the entry
				b.q[t] = b.q[t][1:]
				if len(b.q[t]) == 0 {
					b.q[t] = nil
				}
			}
			b.cond.Broadcast()
			return n, t, nil
		}
		if b.rclosed {
			return 0, t, ErrClosed
		}
		if b.werr != nil {
			return 0, t, b.werr
		}
		b.cond.Wait()
	}
}

// streamReader reads one stream of an outBuf.
type streamReader struct {
	b   *outBuf
	tag int
}

func (r streamReader) Read(p []byte) (int, error) {
	n, _, err := r.b.read(r.tag, p)
	return n, err
}

// Dial connects to 127.0.0.1:port inside the sandbox through the agent. The
// returned connection carries raw bytes; CloseWrite half-closes it. ctx
// bounds the dial only.
func (c *Client) Dial(ctx context.Context, port int) (net.Conn, error) {
	conn, br, err := c.roundTrip(ctx, &Request{Op: OpDial, Port: port}, func(typ byte, _ []byte) (bool, error) {
		if typ != FrameExit {
			return false, fmt.Errorf("agent: unexpected frame %q", typ)
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return &dialConn{Conn: conn, r: br}, nil
}

// dialConn reads what the reply's reader buffered before the socket.
type dialConn struct {
	net.Conn
	r *bufio.Reader
}

func (d *dialConn) Read(p []byte) (int, error) { return d.r.Read(p) }

// CloseWrite half-closes the connection: the sandbox side sees EOF.
func (d *dialConn) CloseWrite() error {
	if cw, ok := d.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("agent: half-close not supported")
}
