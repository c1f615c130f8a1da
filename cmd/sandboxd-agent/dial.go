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
		io.Copy(c.nc, tc)
		c.nc.CloseWrite()
	}()
	// client -> sandbox; bytes the request reader already buffered first.
	io.Copy(tc, c.br)
	tc.(*net.TCPConn).CloseWrite()
	wg.Wait()
}
