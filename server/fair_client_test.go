package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sandboxd/server/client"
	"sandboxd/server/config"
)

// goClient is a server/client.Client of addr with its own transport
// (closed when the test ends).
func goClient(t *testing.T, addr, token string, opts ...client.Option) *client.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := client.New("http://"+addr, token, append([]client.Option{client.WithHTTPClient(&http.Client{Transport: tr})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// clientBurst makes n calls at once: every fourth a provision (a POST with
// a body) of burst-<round>-<i>, the others GET /v1/me.
func clientBurst(c *client.Client, round string, n int) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if i%4 == 0 {
				_, errs[i] = c.Provision(ctx, client.ProvisionRequest{SessionID: fmt.Sprintf("burst-%s-%d", round, i)})
			} else {
				_, errs[i] = c.Me(ctx)
			}
		}()
	}
	wg.Wait()
	return errs
}

// The Go client over the real fairness layer (listener, limiters, router):
// a burst of calls well over a client's rate all succeed by waiting the
// Retry-After they are given, and a provision that was refused and
// retried ran once. With retries off the same burst sees the 429s, in the
// contract's shape.
func TestFairClientRetries(t *testing.T) {
	const perSecond, burst, calls = 5, 5, 12
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.RequestsPerSecond = perSecond
		c.Limits.RequestBurst = burst
	})
	addr, _ := serveAPI(t, e)

	off := goClient(t, addr, e.token, client.WithRetries(0))
	limited := 0
	for i, err := range clientBurst(off, "off", calls) {
		if err == nil {
			continue
		}
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusTooManyRequests || ce.Code != "rate_limited" || ce.RequestID == "" ||
			ce.Details["scope"] == nil || ce.Details["retryAfterSeconds"] == nil {
			t.Fatalf("call %d without retries: %v (%#v)", i, err, ce)
		}
		limited++
	}
	if limited == 0 { // calls-burst unless the burst took long enough for the bucket to refill
		t.Fatalf("without retries none of %d calls at once was refused (burst %d)", calls, burst)
	}

	time.Sleep(time.Second) // the buckets refill
	var waits atomic.Int64
	var longest atomic.Int64
	on := goClient(t, addr, e.token, client.WithRetryNotify(func(r client.Retry) {
		waits.Add(1)
		if r.Err == nil || r.Err.Code != "rate_limited" {
			t.Errorf("retried %+v", r)
		}
		if int64(r.Wait) > longest.Load() {
			longest.Store(int64(r.Wait))
		}
	}))
	t0 := time.Now()
	for i, err := range clientBurst(on, "on", calls) {
		if err != nil {
			t.Errorf("call %d with retries: %v", i, err)
		}
	}
	took := time.Since(t0)
	t.Logf("burst of %d with retries: %v, %d waits, longest %v", calls, took, waits.Load(), time.Duration(longest.Load()))
	if waits.Load() == 0 {
		t.Errorf("no waits for a burst of %d over a burst size of %d", calls, burst)
	}
	if l := time.Duration(longest.Load()); l < time.Second || l > 2*time.Second {
		t.Errorf("longest wait %v, want Retry-After (1 s) plus jitter", l)
	}
	if took > 8*time.Second {
		t.Errorf("the burst took %v", took)
	}
	// Each provision ran once: a retried one was not carried out before
	// (it would be 409 now, not 201).
	l, err := on.List(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < calls; i += 4 {
		if sid := fmt.Sprintf("burst-on-%d", i); !strings.Contains(string(l.Raw), `"sessionId":"`+sid+`"`) {
			t.Errorf("%s missing from the list: %s", sid, l.Raw)
		}
	}
}

// The same over the connection cap: calls that opened connections past
// the client's maxConnsPerClient are answered 429 by the listener, wait
// and are sent again (on the connections that were let in).
func TestFairClientRetriesConns(t *testing.T) {
	const perClient, calls = 4, 10
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.MaxAPIConns = 64
		c.Limits.MaxConnsPerClient = perClient
	})
	addr, _ := serveAPI(t, e)
	var waits atomic.Int64
	c := goClient(t, addr, e.token, client.WithRetryNotify(func(r client.Retry) {
		waits.Add(1)
		if r.Err == nil || r.Err.Code != "rate_limited" || r.Err.Details["limit"] != "maxConnsPerClient" {
			t.Errorf("retried %+v", r.Err)
		}
	}))
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, errs[i] = c.Me(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if waits.Load() == 0 {
		t.Errorf("%d calls at once over a cap of %d connections: no 429 was retried", calls, perClient)
	}
	t.Logf("%d waits", waits.Load())
}
