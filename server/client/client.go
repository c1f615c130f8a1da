// Package client is a Go client of sandboxd's public API (the REST and
// WebSocket contract in server/openapi.json): sessions (provision, get,
// list, pause, resume, teardown, delete), commands, code runs, files and
// artifacts (streamed, with progress callbacks), logs (a snapshot or
// followed over the WebSocket), live terminals, the caller, usage and
// credits, and the operators' plan changes and credit grants.
//
// It depends only on the standard library and gorilla/websocket, never on
// the server's packages: the types here mirror the JSON of the contract,
// and every decoded object keeps the body it came from (Raw) so a caller
// can pass the server's exact answer on, including fields this package
// does not know yet.
//
// An API error is a *Error with the status, the contract's code, message,
// request id and details.
//
// Retries: sandboxd answers 429 rate_limited with Retry-After when a
// client is over its fairness limits (connections, request rate, requests
// in flight). It answers so before any handler runs, so the request was
// not carried out and sending it again is safe whatever its method: a
// call so refused waits Retry-After (plus a little jitter) and is sent
// again, up to DefaultRetries times, for waits up to DefaultMaxRetryWait
// and within its context (a cancel ends the wait, with an error that wraps
// both the context's and the 429's *Error; a wait past the
// deadline is not started). A 429 without Retry-After (a plan's or a
// session's concurrency) is returned at once; a 503 with Retry-After
// (a proxy in front, a service starting) is retried only for idempotent
// methods, since what answered it may have done part of the work. Bodies
// are replayed: JSON always, an Upload's when its reader is an io.Seeker.
// WebSocket handshakes (terminals, exec streams, logs) are retried alike.
// WithRetries(0) turns retries off; WithRetryNotify reports each wait.
//
// Concurrency: a Client is safe for concurrent use. A Terminal allows one
// goroutine calling Recv and any number calling its send methods.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

// Client calls one sandboxd server with one bearer token.
type Client struct {
	base   *url.URL
	token  string
	hc     *http.Client
	agent  string
	dialer *websocket.Dialer

	retries      int
	maxRetryWait time.Duration
	onRetry      func(Retry)
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client use hc for REST calls (its transport,
// proxies and TLS settings). Leave its Timeout zero: transfers and long
// operations are bounded by the caller's context instead.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithUserAgent sets the User-Agent of every request.
func WithUserAgent(ua string) Option { return func(c *Client) { c.agent = ua } }

// WithDialer makes the client open WebSockets (terminals, logs) with d.
func WithDialer(d *websocket.Dialer) Option { return func(c *Client) { c.dialer = d } }

// New returns a client of the server at baseURL (e.g.
// "http://127.0.0.1:8080", optionally with a path prefix when the server
// sits behind a reverse proxy) that authenticates with token.
func New(baseURL, token string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil {
		return nil, fmt.Errorf("server URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("server URL %q: must be http:// or https:// with a host", baseURL)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("server URL %q: no user info, query or fragment", baseURL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	c := &Client{base: u, token: token, agent: "sandboxd-client",
		hc:      &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
		dialer:  &websocket.Dialer{Proxy: http.ProxyFromEnvironment, HandshakeTimeout: 30 * time.Second},
		retries: DefaultRetries, maxRetryWait: DefaultMaxRetryWait}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// BaseURL is the server's URL as the client uses it.
func (c *Client) BaseURL() string { return c.base.String() }

// Error is an error answered by the API: the HTTP status and the body's
// code, message, request id (the X-Request-Id header when the body has
// none) and details. A body that is not the contract's error (a proxy's
// page, say) gives the code "http_<status>" and the start of the body as
// message.
type Error struct {
	Status    int
	Code      string
	Message   string
	RequestID string
	// Details are the facts a caller can act on, when the server gives
	// any (nil otherwise), decoded as by encoding/json (numbers are
	// float64). For 402 insufficient_credits: "remaining", "needed",
	// "size", "creditsPerHour", "periodEnd" (RFC 3339) and "plan".
	Details map[string]any
}

func (e *Error) Error() string {
	if e.RequestID == "" {
		return fmt.Sprintf("%s (%s)", e.Message, e.Code)
	}
	return fmt.Sprintf("%s (%s, request %s)", e.Message, e.Code, e.RequestID)
}

// IsCode reports whether err is an API error with the contract code code
// (e.g. "not_found", "conflict").
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// IsStatus reports whether err is an API error with HTTP status status.
func IsStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}

// maxErrorBody bounds how much of an error body is read.
const maxErrorBody = 64 << 10

// decodeError turns a non-2xx response into an *Error.
func decodeError(resp *http.Response) *Error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return errorFrom(resp.StatusCode, resp.Header.Get("X-Request-Id"), body)
}

func errorFrom(status int, requestID string, body []byte) *Error {
	e := &Error{Status: status, RequestID: requestID}
	var eb struct {
		Error *struct {
			Code      string         `json:"code"`
			Message   string         `json:"message"`
			RequestID string         `json:"requestId"`
			Details   map[string]any `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &eb) == nil && eb.Error != nil && eb.Error.Code != "" {
		e.Code, e.Message = eb.Error.Code, eb.Error.Message
		if len(eb.Error.Details) > 0 {
			e.Details = eb.Error.Details
		}
		if eb.Error.RequestID != "" {
			e.RequestID = eb.Error.RequestID
		}
		return e
	}
	e.Code = fmt.Sprintf("http_%d", status)
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	if msg == "" || strings.ContainsAny(msg, "<\x00") { // empty, HTML or binary
		msg = http.StatusText(status)
	}
	if msg == "" {
		msg = "HTTP status " + fmt.Sprint(status)
	}
	e.Message = msg
	return e
}

// url returns the absolute URL of an API path (already escaped) and query.
func (c *Client) url(p string, q url.Values) string {
	u := *c.base
	u.RawPath = ""
	u.Path = ""
	s := u.String() + c.base.EscapedPath() + p
	if len(q) > 0 {
		s += "?" + q.Encode()
	}
	return s
}

// seg escapes one path segment.
func seg(s string) string { return url.PathEscape(s) }

// request builds a request with the token and User-Agent.
func (c *Client) request(ctx context.Context, method, p string, q url.Values, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.url(p, q), body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("User-Agent", c.agent)
	return req, nil
}

// send runs req; a non-2xx answer becomes an *Error (and the body is
// closed). A 429 (or a 503 of an idempotent method) with Retry-After is
// retried (retry.go) when req's body can be sent again.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		resp, err := c.hc.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
			return resp, nil
		}
		apiErr := decodeError(resp)
		resp.Body.Close()
		ctx := req.Context()
		wait, ok := c.retryWait(ctx, req.Method, resp.StatusCode, resp.Header, attempt)
		if !ok {
			return nil, apiErr
		}
		next, ok, err := replay(req)
		if err != nil || !ok {
			return nil, apiErr
		}
		if err := c.waitRetry(ctx, req.Method, req.URL.Path, attempt, wait, apiErr); err != nil {
			return nil, err
		}
		req = next
	}
}

// maxJSONBody bounds a JSON answer (a code run's display output is the
// largest; listings stop at 8 MiB on the server).
const maxJSONBody = 256 << 20

// doJSON sends in (when not nil) as JSON and decodes the answer into out
// (when not nil); it returns the raw answer.
func (c *Client) doJSON(ctx context.Context, method, p string, q url.Values, in, out any) (json.RawMessage, *http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := c.request(ctx, method, p, q, body)
	if err != nil {
		return nil, nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJSONBody))
	if err != nil {
		return nil, resp, fmt.Errorf("%s %s: read answer: %w", method, p, err)
	}
	if out != nil && len(bytes.TrimSpace(raw)) == 0 && resp.StatusCode != http.StatusNoContent {
		// A truncated or failed answer, never a zero-valued success.
		return raw, resp, fmt.Errorf("%s %s: the server sent an empty answer (status %d)", method, p, resp.StatusCode)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return raw, resp, fmt.Errorf("%s %s: decode answer: %w", method, p, err)
		}
	}
	return raw, resp, nil
}

// Health calls GET /healthz (no token needed).
func (c *Client) Health(ctx context.Context) error {
	_, _, err := c.doJSON(ctx, http.MethodGet, "/healthz", nil, nil, nil)
	return err
}
