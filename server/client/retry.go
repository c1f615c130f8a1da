package client

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Retries (the package doc says when and why). A 429 with Retry-After
// from sandboxd is answered by the listener (over maxConnsPerClient) or by
// middleware ahead of the route's handler and its audit record (the
// request limits): see server/fair.go and server/listen.go.

const (
	// DefaultRetries is how many times a call is retried after a 429 or
	// 503 with Retry-After (WithRetries changes it).
	DefaultRetries = 3
	// DefaultMaxRetryWait is the longest Retry-After waited for
	// (WithMaxRetryWait changes it).
	DefaultMaxRetryWait = 30 * time.Second
)

// Retry describes a wait before a retry, for WithRetryNotify.
type Retry struct {
	Method  string
	Path    string        // the API path, without the query
	Attempt int           // 1 for the first retry
	Wait    time.Duration // how long the client waits before it
	Err     *Error        // the answer being retried (429 or 503)
}

// WithRetries sets how many times a call is retried after a 429 (or a 503
// of an idempotent method) with Retry-After; 0 turns retries off, so the
// first such answer is returned as an *Error.
func WithRetries(n int) Option { return func(c *Client) { c.retries = max(n, 0) } }

// WithMaxRetryWait sets the longest Retry-After the client waits for; a
// longer one is returned at once.
func WithMaxRetryWait(d time.Duration) Option { return func(c *Client) { c.maxRetryWait = d } }

// WithRetryNotify makes the client call fn before each wait (to tell a
// person why a call is slow). fn runs on the calling goroutine.
func WithRetryNotify(fn func(Retry)) Option { return func(c *Client) { c.onRetry = fn } }

// idempotent methods (RFC 9110, 9.2.2) may be repeated after a 503.
func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// retryAfter parses Retry-After: delay-seconds or an HTTP date.
func retryAfter(h http.Header) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > int64(24*time.Hour/time.Second) {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}

// retryWait says whether an answer of status and header to method may be
// retried, on the attempt-th retry, and after how long (jitter included).
func (c *Client) retryWait(ctx context.Context, method string, status int, h http.Header, attempt int) (time.Duration, bool) {
	if attempt > c.retries {
		return 0, false
	}
	if status != http.StatusTooManyRequests && (status != http.StatusServiceUnavailable || !idempotent(method)) {
		return 0, false
	}
	d, ok := retryAfter(h)
	if !ok || d > c.maxRetryWait {
		return 0, false
	}
	// Up to a fifth more, at least 50 ms of spread.
	d += rand.N(max(d/5, 50*time.Millisecond))
	if dl, ok := ctx.Deadline(); ok && time.Now().Add(d).After(dl) {
		return 0, false // it would fail anyway: the answer says more
	}
	return d, true
}

// waitRetry tells onRetry, then waits d or until ctx ends.
func (c *Client) waitRetry(ctx context.Context, method, path string, attempt int, d time.Duration, apiErr *Error) error {
	if c.onRetry != nil {
		c.onRetry(Retry{Method: method, Path: path, Attempt: attempt, Wait: d, Err: apiErr})
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w while waiting to retry after: %w", ctx.Err(), apiErr)
	case <-t.C:
		return nil
	}
}

// replay returns req again with a fresh body, or false when its body
// cannot be sent twice.
func replay(req *http.Request) (*http.Request, bool, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, true, nil
	}
	if req.GetBody == nil {
		return nil, false, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, false, err
	}
	r := req.Clone(req.Context())
	r.Body = body
	return r, true, nil
}

// seekBody sets req's body to wrap(r), replayable when r is an io.Seeker
// that can tell where it is: each replay waits until the transport closed
// the previous body (it may still be reading it after the answer came
// back), seeks back and wraps r again.
func seekBody(req *http.Request, r io.Reader, wrap func(io.Reader) io.Reader) {
	s, ok := r.(io.Seeker)
	var start int64
	var err error
	if ok {
		start, err = s.Seek(0, io.SeekCurrent)
	}
	if !ok || err != nil { // not a seeker, or a pipe
		req.Body = io.NopCloser(wrap(r))
		return
	}
	cur := newClosedBody(wrap(r))
	req.Body = cur
	req.GetBody = func() (io.ReadCloser, error) {
		select {
		case <-cur.closed:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
		if _, err := s.Seek(start, io.SeekStart); err != nil {
			return nil, fmt.Errorf("rewind the body to retry: %w", err)
		}
		cur = newClosedBody(wrap(r))
		return cur, nil
	}
}

// closedBody reports its Close.
type closedBody struct {
	io.Reader
	once   sync.Once
	closed chan struct{}
}

func newClosedBody(r io.Reader) *closedBody {
	return &closedBody{Reader: r, closed: make(chan struct{})}
}

func (b *closedBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}
