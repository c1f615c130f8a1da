package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"sandboxd/server/config"
)

// The web console (web/src/api.js) over the real request limits, in a real
// Chromium, on a fake runtime: a GET refused with 429 and Retry-After is
// sent again after the wait and its page shows the answer; one refused
// past the retries shows the server's message.
func TestFairConsoleRetriesGET(t *testing.T) {
	if testing.Short() {
		t.Skip("a browser test (not in -short)")
	}
	// Room for loading the console and signing in, then half a request a
	// second: an emptied bucket answers Retry-After of 1 or 2 s.
	e := newAPIEnv(t, func(c *config.Config) {
		c.Limits.RequestsPerSecond = 0.5
		c.Limits.RequestBurst = 40
	})
	ts := httptest.NewServer(e.s.Handler())
	t.Cleanup(ts.Close)
	c := newConsole(t, &harness{t: t, ts: ts, token: e.token})

	var mu sync.Mutex
	answers := map[string][]int64{} // path and query -> statuses, in order
	chromedp.Listen(c.ctx, func(ev any) {
		if r, ok := ev.(*network.EventResponseReceived); ok && strings.Contains(r.Response.URL, "/v1/") {
			mu.Lock()
			k := strings.TrimPrefix(r.Response.URL, ts.URL)
			answers[k] = append(answers[k], r.Response.Status)
			mu.Unlock()
		}
	})
	statuses := func(k string) []int64 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int64(nil), answers[k]...)
	}
	c.signIn(e.token)

	// The test shares the browser's address (127.0.0.1): unauthenticated
	// requests from here empty its bucket (they never reach a token's).
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	t.Cleanup(hc.Transport.(*http.Transport).CloseIdleConnections)
	drain := func() bool {
		resp, err := hc.Get(ts.URL + "/v1/me")
		if err != nil {
			t.Error(err)
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusTooManyRequests
	}
	for i := 0; !drain(); i++ {
		if i > 100 {
			t.Fatal("the address was never limited")
		}
	}

	// Retried: the tokens page loads.
	c.do(20*time.Second, "tokens page after a 429", chromedp.Navigate(ts.URL+"/#/tokens"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-token]`)))
	got := statuses("/v1/tokens")
	if len(got) < 2 || got[0] != http.StatusTooManyRequests || got[len(got)-1] != http.StatusOK {
		t.Fatalf("GET /v1/tokens answers %v, want 429 then 200", got)
	}
	if txt := c.text(".error"); txt != "" {
		t.Fatalf("an error is shown after a retried GET: %q", txt)
	}

	// Refused all along (the test keeps the bucket empty): the server's
	// message after the first try and three retries.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			drain()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	defer func() { stop(); wg.Wait() }()
	c.do(30*time.Second, "refused past the retries", chromedp.Click(chromedp.CSS(`.page-head input[type=checkbox]`)),
		chromedp.WaitVisible(chromedp.CSS(`.error`)))
	if txt := c.text(".error"); !strings.Contains(txt, "too many requests from your address") || !strings.Contains(txt, "rate_limited") ||
		!strings.Contains(txt, "Request id") {
		t.Fatalf("error shown: %q", txt)
	}
	if got := statuses("/v1/tokens?all=true"); len(got) != 4 || got[0] != 429 || got[3] != 429 {
		t.Fatalf("GET /v1/tokens?all=true answers %v, want four 429s", got)
	}
}
