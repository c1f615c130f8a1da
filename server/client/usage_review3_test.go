package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Review 3: a 200 with an empty body (what GET /v1/usage?period=9999-12-15
// answers today, its JSON encoding having failed) is taken as a success:
// Usage returns an all-zero report and no error, so `sbx usage` prints an
// organization with no name on a plan of 0 credits and exits 0. An answer
// that should carry JSON and carries none is an error.
func TestReview3EmptyAnswerIsAnError(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(http.StatusOK)
	}))
	defer ts.Close()
	c, err := New(ts.URL, "sbx_test")
	if err != nil {
		t.Fatal(err)
	}
	u, err := c.Usage(context.Background(), UsageOptions{Period: "9999-12-15"})
	if err == nil {
		t.Fatalf("an empty 200 answer gave no error, and usage %+v", u)
	}
	if sb, err := c.Get(context.Background(), "demo"); err == nil {
		t.Fatalf("an empty 200 answer to GET /v1/sandbox/demo gave no error, and %+v", sb)
	}
}
