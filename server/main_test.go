package server

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the server starts (monitor, reaper, tailers, proxy,
// WebSocket pumps, processes' readers) has ended when the package's tests
// are done: each test closes its server. Idle keep-alive connections of
// http.DefaultClient, which the tests use, are closed first.
func TestMain(m *testing.M) {
	code := m.Run()
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
