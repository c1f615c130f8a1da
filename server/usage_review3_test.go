package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Review 3: GET /v1/usage?period=DATE accepts any date time.Parse takes
// (years 0000-9999), but the store keeps times as int64 Unix nanoseconds
// (1678-2262) and JSON times stop at year 9999. Each date below is either
// refused (400 invalid_request, the contract's shape) or answered with the
// period that holds it and that period's numbers; today it is neither.
func TestReview3UsagePeriodOutOfRange(t *testing.T) {
	e := newAPIEnv(t)
	// A grant now, in the current period.
	if rec := e.do("POST", "/v1/orgs/"+e.owner.Org.ID+"/credits", e.token, map[string]any{"credits": 7}); rec.Code != http.StatusCreated {
		t.Fatalf("grant: %d %s", rec.Code, rec.Body)
	}
	type answer struct {
		Period  struct{ Start, End time.Time }
		Granted struct{ Milli int64 }
	}
	for _, date := range []string{
		"9999-12-15", // the period ends in year 10000: 200 with an empty body
		"0001-01-01", // time.Time's zero: answered with the current period
		"2611-06-22", // 2^64 ns after now: ts() wraps and the period shows this month's grant
		"1500-03-10", // before 1678: ts() overflows
	} {
		t.Run(date, func(t *testing.T) {
			rec := e.do("GET", "/v1/usage?period="+date, e.token, nil)
			if rec.Code == http.StatusBadRequest {
				apiError(t, rec, http.StatusBadRequest, "invalid_request")
				return
			}
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			var u answer
			if err := json.Unmarshal(rec.Body.Bytes(), &u); err != nil {
				t.Fatalf("200 with a body that is not JSON (%v): %q", err, rec.Body.String())
			}
			d, _ := time.Parse(time.DateOnly, date)
			if d.Before(u.Period.Start) || !d.Before(u.Period.End) {
				t.Errorf("asked for the period holding %s, got %s..%s", date, u.Period.Start, u.Period.End)
			}
			if u.Granted.Milli != 0 {
				t.Errorf("the period holding %s shows %d milli-credits granted today", date, u.Granted.Milli)
			}
		})
	}
}

// Review 3: a deleted session still counts in its period's usage (its
// runs outlive it), but GET /v1/usage lists it with status "" (and its
// egress and saved bytes as 0): the usage row is joined with the list of
// live sessions only. `sbx usage` shows "-". It should say "deleted".
func TestReview3UsageDeletedSessionStatus(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "gone-1"})
	if rec := e.do("DELETE", "/v1/sandbox/gone-1", e.token, nil); rec.Code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", rec.Code, rec.Body)
	}
	var u struct {
		Sessions []struct{ SessionID, Status string }
	}
	if err := json.Unmarshal(e.do("GET", "/v1/usage", e.token, nil).Body.Bytes(), &u); err != nil {
		t.Fatal(err)
	}
	if len(u.Sessions) != 1 || u.Sessions[0].SessionID != "gone-1" || u.Sessions[0].Status != "deleted" {
		t.Fatalf("usage of a deleted session: %+v", u.Sessions)
	}
}

// A grant's amount of the wrong type is named as the number it must be.
func TestGrantAmountType(t *testing.T) {
	e := newAPIEnv(t)
	rec := e.do("POST", "/v1/orgs/"+e.owner.Org.ID+"/credits", e.token, map[string]any{"credits": true})
	apiError(t, rec, http.StatusBadRequest, "invalid_request")
	if !strings.Contains(rec.Body.String(), "credits: must be a number") {
		t.Fatalf("grant of true: %s", rec.Body)
	}
}
