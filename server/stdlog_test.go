package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/server/config"
	"sandboxd/server/errdefs"
)

// The standard library's log lines (net/http's) pass the scrubber, with
// the secrets of every session, and a rate limit. Fake runtime, no root.
func TestStdLogScrubbedAndRateLimited(t *testing.T) {
	clearConfigEnv(t)
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var buf lockedBuffer
	e := newAPIEnvWith(t, cfg, slog.New(slog.NewTextHandler(&buf, nil)))
	const secret = "upstream-s3cret-9f2c71"
	const ghToken = "ghp_0123456789abcdefghijABCDEFGHIJ012345"
	e.provision(e.token, map[string]any{"sessionId": "leaky", "secrets": map[string]string{"UPSTREAM_TOKEN": secret}})

	restore := e.s.captureStdLog()
	t.Cleanup(restore)
	leaked := func() {
		t.Helper()
		if out := buf.String(); strings.Contains(out, secret) || strings.Contains(out, ghToken) {
			t.Fatalf("secret in the server log:\n%s", out)
		}
	}

	// net/http's own complaint about bytes an upstream sent on an idle
	// keep-alive connection, with a session's secret and a GitHub token
	// among them (a sandbox can make an upstream echo what it likes).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	idle, seen := make(chan struct{}), make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		http.ReadRequest(bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		<-idle // the client's connection is idle now
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Echo: "+secret+"\r\nAuthorization: token "+ghToken+"\r\n\r\n")
		<-seen // open until the client has complained
	}()
	defer close(seen)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	close(idle)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), "Unsolicited response") {
		if time.Now().After(deadline) {
			t.Fatalf("net/http's log line never reached the server log:\n%s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	leaked()
	out := buf.String()
	if !strings.Contains(out, "[REDACTED:UPSTREAM_TOKEN]") || !strings.Contains(out, "[REDACTED:github-token]") || !strings.Contains(out, "level=WARN") {
		t.Fatalf("log line not redacted as expected:\n%s", out)
	}

	// A burst of 1000 lines: stdLogBurst are logged, the rest counted and
	// reported with the next line let through.
	restore()
	var now atomic.Int64 // the limiter's clock from here on (ns)
	now.Store(int64(time.Hour))
	e.s.stdLogClock = func() time.Time { return time.Unix(0, now.Load()) }
	restore = e.s.captureStdLog() // a fresh limiter
	buf.mu.Lock()
	buf.b.Reset()
	buf.mu.Unlock()
	for i := range 1000 {
		log.Printf("Unsolicited response received on idle HTTP channel starting with %q; line %d", "X-Echo: "+secret, i)
	}
	logged := strings.Count(buf.String(), "msg=\"go log\"")
	if logged != stdLogBurst {
		t.Fatalf("%d of 1000 lines logged at once, want %d (the burst)", logged, stdLogBurst)
	}
	now.Add(int64(time.Second / stdLogRate))
	log.Print("after the burst")
	m := regexp.MustCompile(`line="after the burst" suppressedBefore=(\d+)`).FindStringSubmatch(buf.String())
	if m == nil || m[1] != strconv.Itoa(1000-logged) {
		t.Fatalf("next line does not report %d suppressed lines:\n%s", 1000-logged, buf.String())
	}
	if want := "sandboxd_stdlog_suppressed_total " + strconv.Itoa(1000-logged) + "\n"; !strings.Contains(e.do("GET", "/metrics", "", nil).Body.String(), want) {
		t.Errorf("metrics lack %q", want)
	}
	if n := strings.Count(buf.String(), "[REDACTED:UPSTREAM_TOKEN]"); n != logged {
		t.Errorf("%d redactions in %d logged lines", n, logged)
	}
	leaked()

	// Long lines are cut (after scrubbing).
	now.Add(int64(time.Second / stdLogRate))
	log.Print(strings.Repeat("x", 10*stdLogMaxLine))
	if out := buf.String(); !strings.Contains(out, strings.Repeat("x", stdLogMaxLine)+"...") ||
		strings.Contains(out, strings.Repeat("x", stdLogMaxLine+1)) {
		t.Error("a long line was not cut to stdLogMaxLine")
	}

	// restore puts the previous output back.
	restore()
	if _, ok := log.Writer().(*stdLog); ok {
		t.Error("log output still captured after restore")
	}
}

// A failed request's cause may quote what a sandbox sent (the portal's
// "malformed MIME header" of an answer a program in the sandbox wrote):
// the request's session's secrets are redacted from the log line, on the
// API's routes and on the portal origin.
func TestFailureLogRedactsSessionSecrets(t *testing.T) {
	clearConfigEnv(t)
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var buf lockedBuffer
	e := newAPIEnvWith(t, cfg, slog.New(slog.NewTextHandler(&buf, nil)))
	const secret = "iK2ZWeqhFWCEPyYngFb51yBMWX"
	e.provision(e.token, map[string]any{"sessionId": "leaky", "secrets": map[string]string{"BIG1": secret}})
	ses, err := e.s.sessions.Get(context.Background(), e.owner.Org.ID, "leaky")
	if err != nil {
		t.Fatal(err)
	}
	cause := fmt.Errorf("net/http: HTTP/1.x transport connection broken: malformed MIME header: missing colon: %q", secret+"\r\n")
	failure := errdefs.New(errdefs.ErrBadGateway, "no HTTP answer from that port").WithCause(cause)

	c, _ := gin.CreateTestContext(httptest.NewRecorder())
	c.Request = httptest.NewRequest("GET", "/v1/sandbox/proxy/leaky/port/9000/", nil)
	c.Set(ctxSessionPK, ses.ID)
	e.s.writeError(c, failure)
	e.s.portalError(httptest.NewRecorder(), httptest.NewRequest("GET", "/port/9000/", nil), "rid", ses.ID, failure)
	e.s.writeError(c, fmt.Errorf("an internal error quoting %s", secret))

	out := buf.String()
	if strings.Contains(out, secret[:12]) || strings.Count(out, "[REDACTED:BIG1]") != 3 {
		t.Fatalf("the failures' log lines:\n%s", out)
	}
}
