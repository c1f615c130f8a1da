package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// limited is a server that answers the first refuse requests 429
// rate_limited (in the contract's shape) with Retry-After, then passes
// them to next. It records each request's arrival and body.
type limited struct {
	mu         sync.Mutex
	refuse     int
	retryAfter string
	status     int // of the refusals: 429 unless set
	readBody   bool
	times      []time.Time
	bodies     [][]byte
	methods    []string
}

func (l *limited) handler(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		l.mu.Lock()
		refuse := len(l.times) < l.refuse
		l.mu.Unlock()
		if !refuse || l.readBody {
			body, _ = io.ReadAll(r.Body)
		}
		l.mu.Lock()
		n := len(l.times)
		l.times = append(l.times, time.Now())
		l.bodies = append(l.bodies, body)
		l.methods = append(l.methods, r.Method)
		l.mu.Unlock()
		if refuse {
			if l.retryAfter != "" {
				w.Header().Set("Retry-After", l.retryAfter)
			}
			status := l.status
			if status == 0 {
				status = http.StatusTooManyRequests
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Request-Id", fmt.Sprintf("req-%d", n))
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"error":{"code":"rate_limited","message":"too many requests from your address: retry in %s s","requestId":"req-%d","details":{"scope":"address","limit":"requestsPerSecond"}}}`, l.retryAfter, n)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next(w, r)
	}
}

func (l *limited) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.times)
}

// seen is what the server saw: arrival times and bodies.
func (l *limited) seen() ([]time.Time, [][]byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.times...), append([][]byte(nil), l.bodies...)
}

func serveLimited(t *testing.T, l *limited, next http.HandlerFunc, opts ...Option) *Client {
	t.Helper()
	ts := httptest.NewServer(l.handler(next))
	t.Cleanup(ts.Close)
	c, err := New(ts.URL, "tok", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func okSandbox(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"sessionId":"s1","status":"running"}`)
}

// A POST refused twice with Retry-After: 1 is sent again after a second
// each time, with the same body, and its answer is the third's.
func TestRetryHonoursRetryAfter(t *testing.T) {
	l := &limited{refuse: 2, retryAfter: "1", readBody: true}
	var notes []Retry
	c := serveLimited(t, l, okSandbox, WithRetryNotify(func(r Retry) { notes = append(notes, r) }))
	t0 := time.Now()
	sb, err := c.Provision(context.Background(), ProvisionRequest{SessionID: "s1", Size: "standard-1", Secrets: map[string]string{"K": "v-123456"}})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if sb.SessionID != "s1" || l.count() != 3 {
		t.Fatalf("sandbox %+v after %d requests", sb, l.count())
	}
	times, bodies := l.seen()
	for i := 1; i < 3; i++ {
		if gap := times[i].Sub(times[i-1]); gap < time.Second || gap > 2*time.Second {
			t.Errorf("retry %d came %v after the refusal, want Retry-After (1 s) plus a little", i, gap)
		}
		if !bytes.Equal(bodies[i], bodies[0]) || !bytes.Contains(bodies[0], []byte(`"sessionId":"s1"`)) {
			t.Errorf("body %d %q, first %q", i, bodies[i], bodies[0])
		}
	}
	if took > 5*time.Second {
		t.Errorf("took %v", took)
	}
	if len(notes) != 2 {
		t.Fatalf("notified %d times, want 2: %+v", len(notes), notes)
	}
	for i, n := range notes {
		if n.Attempt != i+1 || n.Method != "POST" || n.Path != "/v1/sandbox" || n.Wait < time.Second || n.Wait > 1200*time.Millisecond ||
			n.Err == nil || n.Err.Status != 429 || n.Err.Code != "rate_limited" || n.Err.RequestID != fmt.Sprintf("req-%d", i) {
			t.Errorf("notice %d: %+v (err %+v)", i, n, n.Err)
		}
	}
}

// Past the retries the last 429 is the caller's error, in the contract's
// shape; WithRetries(0) returns the first.
func TestRetryGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []Option
		requests int
	}{
		{"default", nil, 1 + DefaultRetries},
		{"five", []Option{WithRetries(5)}, 6},
		{"off", []Option{WithRetries(0)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &limited{refuse: 100, retryAfter: "0"}
			c := serveLimited(t, l, okSandbox, tc.opts...)
			_, err := c.Get(context.Background(), "s1")
			var e *Error
			if !errors.As(err, &e) || e.Status != 429 || e.Code != "rate_limited" || !strings.Contains(e.Message, "too many requests") ||
				e.RequestID != fmt.Sprintf("req-%d", tc.requests-1) || e.Details["scope"] != "address" {
				t.Fatalf("err = %v (%#v)", err, e)
			}
			if l.count() != tc.requests {
				t.Fatalf("%d requests, want %d", l.count(), tc.requests)
			}
		})
	}
}

// Which answers are retried: 429 with Retry-After for any method; 503
// with Retry-After only for idempotent methods; never an answer without
// Retry-After, or with one over the longest wait.
func TestRetryWhich(t *testing.T) {
	date := time.Now().Add(time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string
		post       bool
		opts       []Option
		retried    bool
	}{
		{"429 get", 429, "0", false, nil, true},
		{"429 post", 429, "0", true, nil, true},
		{"429 http date", 429, date, false, nil, true},
		{"429 without retry-after", 429, "", false, nil, false},
		{"429 garbled retry-after", 429, "soon", false, nil, false},
		{"429 over the longest wait", 429, "31", false, nil, false},
		{"429 over a set longest wait", 429, "2", false, []Option{WithMaxRetryWait(time.Second)}, false},
		{"503 get", 503, "0", false, nil, true},
		{"503 post", 503, "0", true, nil, false},
		{"503 without retry-after", 503, "", false, nil, false},
		{"500", 500, "0", false, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &limited{refuse: 1, retryAfter: tc.retryAfter, status: tc.status}
			c := serveLimited(t, l, okSandbox, tc.opts...)
			var err error
			if tc.post {
				_, err = c.Teardown(context.Background(), "s1")
			} else {
				_, err = c.Get(context.Background(), "s1")
			}
			if tc.retried {
				if err != nil || l.count() != 2 {
					t.Fatalf("err %v after %d requests, want a retry", err, l.count())
				}
				return
			}
			if !IsStatus(err, tc.status) || l.count() != 1 {
				t.Fatalf("err %v after %d requests, want the %d at once", err, l.count(), tc.status)
			}
		})
	}
}

// Cancelling the context ends the wait at once: the error is the
// context's and wraps the 429. A Retry-After past the deadline is not
// waited for.
func TestRetryStopsWithContext(t *testing.T) {
	l := &limited{refuse: 100, retryAfter: "10"}
	c := serveLimited(t, l, okSandbox)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	t0 := time.Now()
	_, err := c.Get(ctx, "s1")
	if took := time.Since(t0); took > 3*time.Second {
		t.Fatalf("the cancel did not end the wait: %v", took)
	}
	if !errors.Is(err, context.Canceled) || !IsCode(err, "rate_limited") || l.count() != 1 {
		t.Fatalf("err = %v after %d requests", err, l.count())
	}

	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 = time.Now()
	_, err = c.Get(ctx, "s1")
	if took := time.Since(t0); took > 3*time.Second {
		t.Fatalf("waited %v for a Retry-After past the deadline", took)
	}
	if errors.Is(err, context.DeadlineExceeded) || !IsCode(err, "rate_limited") || l.count() != 2 {
		t.Fatalf("err = %v after %d requests, want the 429 at once", err, l.count())
	}
}

// An upload from a seekable reader is sent again from where it started,
// even when the server answered without reading it; one from a pipe is
// not replayable and returns the 429.
func TestRetryUploadReplaysBody(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB
	var mu sync.Mutex
	var last []byte // the body the upload handler got
	put := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		last = b
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"path":"a.bin","type":"file","size":%d}`, len(b))
	}
	uploaded := func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
	t.Run("seeker", func(t *testing.T) {
		l := &limited{refuse: 2, retryAfter: "0"}
		c := serveLimited(t, l, put)
		f, err := os.Create(filepath.Join(t.TempDir(), "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		f.Write([]byte("skip"))
		f.Write(data)
		f.Seek(4, io.SeekStart) // the upload starts where the reader is
		var last, total int64
		res, err := c.Upload(context.Background(), "s1", "a.bin", f, int64(len(data)), func(done, t int64) { last, total = done, t })
		if err != nil {
			t.Fatal(err)
		}
		if got := uploaded(); l.count() != 3 || !bytes.Equal(got, data) || res.Entry.Size != int64(len(data)) || !res.Created {
			t.Fatalf("%d requests; got %d bytes (equal %v); %+v", l.count(), len(got), bytes.Equal(got, data), res)
		}
		if last != int64(len(data)) || total != int64(len(data)) {
			t.Errorf("progress ended at %d of %d", last, total)
		}
	})
	t.Run("bytes reader, refusal read", func(t *testing.T) {
		l := &limited{refuse: 1, retryAfter: "0", readBody: true}
		c := serveLimited(t, l, put)
		if _, err := c.Upload(context.Background(), "s1", "a.bin", bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
		_, bodies := l.seen()
		if got := uploaded(); l.count() != 2 || !bytes.Equal(bodies[0], data) || !bytes.Equal(got, data) {
			t.Fatalf("%d requests; bodies %d, %d bytes", l.count(), len(bodies[0]), len(got))
		}
	})
	// Over 256 KiB unread the server closes the connection after its
	// answer: the transport may still be sending the first body when
	// the 429 is back, and the replay must wait for it (-race).
	t.Run("large, refusal unread", func(t *testing.T) {
		big := bytes.Repeat(data, 32) // 4 MiB
		l := &limited{refuse: 2, retryAfter: "0"}
		c := serveLimited(t, l, put)
		if _, err := c.Upload(context.Background(), "s1", "a.bin", bytes.NewReader(big), int64(len(big)), nil); err != nil {
			t.Fatal(err)
		}
		if got := uploaded(); l.count() != 3 || !bytes.Equal(got, big) {
			t.Fatalf("%d requests; got %d bytes (equal %v)", l.count(), len(got), bytes.Equal(got, big))
		}
	})
	t.Run("pipe", func(t *testing.T) {
		l := &limited{refuse: 1, retryAfter: "0"}
		c := serveLimited(t, l, put)
		_, err := c.Upload(context.Background(), "s1", "a.bin", io.MultiReader(bytes.NewReader(data)), int64(len(data)), nil)
		if !IsCode(err, "rate_limited") || l.count() != 1 {
			t.Fatalf("err %v after %d requests", err, l.count())
		}
	})
}

// A WebSocket handshake refused with 429 and Retry-After is dialed again.
func TestRetryWebSocket(t *testing.T) {
	up := websocket.Upgrader{}
	l := &limited{refuse: 2, retryAfter: "0"}
	c := serveLimited(t, l, func(w http.ResponseWriter, r *http.Request) {
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"ready","terminalId":"t-1"}`))
		conn.ReadMessage()
	})
	term, err := c.DialTerminal(context.Background(), "s1", TerminalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	term.Close()
	if term.ID() != "t-1" || l.count() != 3 {
		t.Fatalf("terminal %q after %d handshakes", term.ID(), l.count())
	}

	// Retries off: the refusal is the *Error.
	l2 := &limited{refuse: 1, retryAfter: "0"}
	c2 := serveLimited(t, l2, func(w http.ResponseWriter, r *http.Request) {}, WithRetries(0))
	if _, err := c2.DialExec(context.Background(), "s1", "true"); !IsCode(err, "rate_limited") || l2.count() != 1 {
		t.Fatalf("err %v after %d handshakes", err, l2.count())
	}
}
