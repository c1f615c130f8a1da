package streams

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts (hub viewers, WebSocket writers) has ended
// when the package's tests are done.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
