package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Amount is an amount of credits, as a number and exactly in thousandths
// (Milli); prefer Milli for sums and comparisons.
type Amount struct {
	Credits float64 `json:"credits"`
	Milli   int64   `json:"milli"`
}

// Plan is what an organization's plan allows.
type Plan struct {
	Name           string  `json:"name"`
	MonthlyCredits float64 `json:"monthlyCredits"` // credits each billing period
	LargestSize    string  `json:"largestSize"`    // "": any size
	MaxConcurrent  int     `json:"maxConcurrent"`  // sandboxes running or starting at once
	EgressMiB      int64   `json:"egressMiB"`      // cap on each session's egress quota (0: the size's)
	StorageMiB     int64   `json:"storageMiB"`     // cap on saved workspaces (0: the server's)
	Pause          bool    `json:"pause"`          // whether sandboxes may pause with their memory
}

// Period is a billing period [Start, End): a month from the organization's
// anchor day, 00:00 UTC.
type Period struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// SessionUsage is one session's use in a period. Status, EgressBytes and
// SavedBytes are the session's now, not the period's.
type SessionUsage struct {
	SessionID      string  `json:"sessionId"`
	Status         string  `json:"status"`
	Size           string  `json:"size"`
	RunningSeconds float64 `json:"runningSeconds"`
	Credits        Amount  `json:"credits"`
	EgressBytes    int64   `json:"egressBytes"`
	SavedBytes     int64   `json:"savedBytes"`
}

// DayUsage is one UTC day's use (Date is YYYY-MM-DD).
type DayUsage struct {
	Date           string  `json:"date"`
	RunningSeconds float64 `json:"runningSeconds"`
	Credits        Amount  `json:"credits"`
}

// Usage is an organization's usage in a billing period (GET /v1/usage):
// its plan, the period's allowance, operators' grants, credits used and
// remaining, and the sessions and days with running time. Raw is the
// server's answer as it came, fields this package does not know included.
type Usage struct {
	Organization Ref            `json:"organization"`
	Plan         Plan           `json:"plan"`
	Period       Period         `json:"period"`
	Allowance    Amount         `json:"allowance"`
	Granted      Amount         `json:"granted"`
	Used         Amount         `json:"used"`
	Remaining    Amount         `json:"remaining"`
	Sessions     []SessionUsage `json:"sessions"`
	Days         []DayUsage     `json:"days"`

	Raw json.RawMessage `json:"-"`
}

// Map decodes the whole answer (numbers as json.Number).
func (u *Usage) Map() (map[string]any, error) {
	return decodeMap(u.Raw)
}

// UsageOptions choose the period and organization of Usage.
type UsageOptions struct {
	// Period is "current" (or ""), "previous", or a date (YYYY-MM-DD) in
	// the period wanted.
	Period string
	// OrgID is another organization than the caller's (operators only;
	// others get 404).
	OrgID string
}

// Usage returns an organization's usage in a billing period. A bad
// Period is a 400 *Error (code "invalid_request").
func (c *Client) Usage(ctx context.Context, opts UsageOptions) (*Usage, error) {
	q := url.Values{}
	if opts.Period != "" {
		q.Set("period", opts.Period)
	}
	if opts.OrgID != "" {
		q.Set("orgId", opts.OrgID)
	}
	var u Usage
	raw, _, err := c.doJSON(ctx, http.MethodGet, "/v1/usage", q, nil, &u)
	if err != nil {
		return nil, err
	}
	u.Raw = raw
	return &u, nil
}

func orgPath(id string) string { return "/v1/orgs/" + seg(id) }

// PlanChange is the answer of SetPlan: the organization and its new plan.
type PlanChange struct {
	Organization Ref             `json:"organization"`
	Plan         Plan            `json:"plan"`
	Raw          json.RawMessage `json:"-"`
}

// SetPlan moves an organization to a plan (PUT /v1/orgs/{orgId}/plan).
// Operators only (403 forbidden otherwise); an unknown plan is a 400
// whose message names the plans.
func (c *Client) SetPlan(ctx context.Context, orgID, plan string) (*PlanChange, error) {
	var pc PlanChange
	raw, _, err := c.doJSON(ctx, http.MethodPut, orgPath(orgID)+"/plan", nil, map[string]string{"plan": plan}, &pc)
	if err != nil {
		return nil, err
	}
	pc.Raw = raw
	return &pc, nil
}

// Grant is a credit grant as recorded.
type Grant struct {
	ID      int64     `json:"id"`
	Credits Amount    `json:"credits"`
	Time    time.Time `json:"time"`
	Note    string    `json:"note"`
}

// GrantResult is the answer of GrantCredits: the grant, and what the
// organization has left in its current period.
type GrantResult struct {
	Grant     Grant           `json:"grant"`
	Remaining Amount          `json:"remaining"`
	Period    Period          `json:"period"`
	Raw       json.RawMessage `json:"-"`
}

// GrantCredits adds credits to an organization's current billing period
// (POST /v1/orgs/{orgId}/credits); a negative amount takes back. credits
// is a decimal number with at most 3 decimals ("100", "0.5", "-10"), sent
// as written so that no float rounding changes it. Operators only.
func (c *Client) GrantCredits(ctx context.Context, orgID, credits, note string) (*GrantResult, error) {
	in := struct {
		Credits json.Number `json:"credits"`
		Note    string      `json:"note,omitempty"`
	}{json.Number(strings.TrimSpace(credits)), note}
	if _, err := json.Marshal(in.Credits); err != nil || in.Credits == "" {
		return nil, fmt.Errorf("credits %q: not a number (e.g. 100, 0.5 or -10)", credits)
	}
	var g GrantResult
	raw, _, err := c.doJSON(ctx, http.MethodPost, orgPath(orgID)+"/credits", nil, in, &g)
	if err != nil {
		return nil, err
	}
	g.Raw = raw
	return &g, nil
}
