package main

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"sandboxd/runsc/agent"
)

// dialTimeout bounds connecting to a port on the sandbox's loopback, which
// answers at once or not at all.
const dialTimeout = 5 * time.Second

// relayBuffer is the copy buffer of each direction: fewer syscalls, each
// of which the sentry serves.
const relayBuffer = 256 << 10

// onlyReader hides WriteTo/ReadFrom so that io.CopyBuffer uses the buffer
// (splice and sendfile do not apply to these sockets under gVisor).
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// serveDial connects to 127.0.0.1:port and relays raw bytes between it and
// the client until both directions are done. It returns when the relay
// ends, closing both connections.
func serveDial(c *conn, req *agent.Request) {
	if req.Port < 1 || req.Port > 65535 {
		c.writeError("bad port")
		return
	}
	tc, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(req.Port)), dialTimeout)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			c.writeError("connection refused")
		} else {
			c.writeError("port unreachable")
		}
		return
	}
	defer tc.Close()
	if c.writeOK(); c.werr != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // sandbox -> client
		defer wg.Done()
		io.CopyBuffer(c.nc, onlyReader{tc}, make([]byte, relayBuffer))
		c.nc.CloseWrite()
	}()
	// client -> sandbox; bytes the request reader already buffered first.
	io.CopyBuffer(tc, onlyReader{c.br}, make([]byte, relayBuffer))
	tc.(*net.TCPConn).CloseWrite()
	wg.Wait()
}
