package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sandboxd/server/config"
)

// Plans and credits on real sandboxes: 402, 403 and 429 from real
// requests, the automatic teardown (saved) when credits run out with a
// clock the test controls, operators' grants, usage and metrics.

const e2ePlans = `
default: tiny
firstOrg: tiny
minSliceSeconds: 300
plans:
  - {name: tiny, monthlyCredits: 1, largestSize: standard-1, maxConcurrent: 1, egressMiB: 16, storageMiB: 0, pause: false}
  - {name: roomy, monthlyCredits: 100, largestSize: "", maxConcurrent: 8, egressMiB: 0, storageMiB: 0, pause: true}
`

type testClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().UTC().Add(c.off)
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

type usageOut struct {
	Plan      struct{ Name string }
	Used      struct{ Milli int64 }
	Remaining struct{ Milli int64 }
	Granted   struct{ Milli int64 }
	Sessions  []struct {
		SessionID      string
		Size           string
		RunningSeconds float64
		Credits        struct{ Milli int64 }
		SavedBytes     int64
		EgressBytes    int64
	}
	Days []struct {
		Date    string
		Credits struct{ Milli int64 }
	}
}

func (h *harness) usage(token, query string) usageOut {
	h.t.Helper()
	code, b := h.call(token, "GET", "/v1/usage"+query, nil)
	if code != http.StatusOK {
		h.t.Fatalf("usage: %d %s", code, b)
	}
	var u usageOut
	if err := json.Unmarshal(b, &u); err != nil {
		h.t.Fatal(err)
	}
	return u
}

// startCreditsServer starts a real server with the given plan table, a
// test-credits size (1 credit an hour) and a clock the test moves.
func startCreditsServer(t *testing.T, plansYAML string) (*harness, *testClock) {
	t.Helper()
	cfg := realConfig(t)
	cfg.Sizes.List = append(cfg.Sizes.List, config.Size{Name: "test-credits", VCPUs: 1, MemoryMiB: 512, DiskMiB: 256, Pids: 512, CreditsPerHour: 1000, EgressMiB: 64})
	plans, err := config.ParsePlans([]byte(plansYAML), cfg.Sizes)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Plans = plans
	clk := &testClock{}
	cfg.Clock = clk.now
	return startServer(t, cfg), clk
}

func TestRealCredits(t *testing.T) {
	h, clk := startCreditsServer(t, e2ePlans)

	// 403: above the plan's largest size, with the plan named.
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "big", "size": "standard-2"})
	if code != http.StatusForbidden || !strings.Contains(string(b), "tiny plan") {
		t.Fatalf("size above plan: %d %s", code, b)
	}
	o := h.provision("c1", "test-credits")
	if o.Egress.BytesLimit != 16<<20 {
		t.Fatalf("plan's egress cap: %+v", o.Egress)
	}
	// 429: the plan's concurrency.
	code, b = h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "c2", "size": "test-credits"})
	if code != http.StatusTooManyRequests || !strings.Contains(string(b), "tiny plan") {
		t.Fatalf("over concurrency: %d %s", code, b)
	}
	// 403: no pause on this plan.
	if code, b := h.call(h.token, "POST", "/v1/sandbox/c1/pause", nil); code != http.StatusForbidden {
		t.Fatalf("pause: %d %s", code, b)
	}
	if r := h.sh("c1", "echo kept > /workspace/note.txt"); r.ExitCode != 0 {
		t.Fatalf("%+v", r)
	}

	// The clock jumps an hour: the organization's one credit is spent, and
	// the monitor (every 5 s) tears the session down, saved.
	clk.advance(61 * time.Minute)
	deadline := time.Now().Add(90 * time.Second)
	for h.get("c1").Status != "stopped" {
		if time.Now().After(deadline) {
			t.Fatalf("not torn down after credits ran out: %+v", h.get("c1"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	got := h.get("c1")
	if got.Storage.SavedBytes == 0 {
		t.Fatalf("torn down without a save: %+v", got)
	}
	if logs := h.logsText("c1"); !strings.Contains(logs, "credits_exhausted") {
		t.Fatalf("no credits_exhausted event: %s", logs)
	}
	h.s.db.FlushAudit(t.Context())
	code, b = h.call(h.token, "GET", "/v1/audit?action=sandbox.credits_exhausted", nil)
	if code != 200 || !strings.Contains(string(b), `"userId":"system"`) {
		t.Fatalf("audit: %d %s", code, b)
	}
	u := h.usage(h.token, "")
	if u.Plan.Name != "tiny" || u.Used.Milli < 1016 || u.Remaining.Milli > 0 || len(u.Sessions) != 1 ||
		u.Sessions[0].SessionID != "c1" || u.Sessions[0].SavedBytes == 0 || len(u.Days) == 0 {
		t.Fatalf("usage: %+v", u)
	}

	// 402 with the numbers, and the session stays as it was.
	code, b = h.call(h.token, "POST", "/v1/sandbox/c1/resume", nil)
	var eb struct {
		Error struct {
			Code    string
			Details map[string]any
		}
	}
	json.Unmarshal(b, &eb)
	if code != http.StatusPaymentRequired || eb.Error.Code != "insufficient_credits" || eb.Error.Details["needed"] != 0.084 {
		t.Fatalf("resume without credits: %d %s", code, b)
	}
	if h.get("c1").Status != "stopped" {
		t.Fatal("a refused resume changed the session")
	}

	// Operators grant credits and change plans; members cannot.
	dev := h.newMember("dev", "developer")
	if code, _ := h.call(dev, "POST", "/v1/orgs/"+o.OrgID+"/credits", map[string]any{"credits": 5}); code != http.StatusForbidden {
		t.Fatalf("developer granted credits: %d", code)
	}
	if code, b := h.call(h.token, "POST", "/v1/orgs/"+o.OrgID+"/credits", map[string]any{"credits": 0.0001}); code != http.StatusBadRequest {
		t.Fatalf("4 decimals: %d %s", code, b)
	}
	if code, b := h.call(h.token, "POST", "/v1/orgs/"+o.OrgID+"/credits", map[string]any{"credits": 5, "note": "trial"}); code != http.StatusCreated {
		t.Fatalf("grant: %d %s", code, b)
	}
	if u := h.usage(dev, ""); u.Granted.Milli != 5000 || u.Remaining.Milli <= 3000 {
		t.Fatalf("after grant: %+v", u)
	}
	if code, b := h.call(h.token, "POST", "/v1/sandbox/c1/resume", nil); code != http.StatusOK {
		t.Fatalf("resume after grant: %d %s", code, b)
	}
	if r := h.sh("c1", "cat /workspace/note.txt"); r.Stdout != "kept\n" {
		t.Fatalf("workspace after exhaustion and resume: %+v", r)
	}
	if code, b := h.call(h.token, "PUT", "/v1/orgs/"+o.OrgID+"/plan", map[string]any{"plan": "gold"}); code != http.StatusBadRequest {
		t.Fatalf("unknown plan: %d %s", code, b)
	}
	if code, b := h.call(h.token, "PUT", "/v1/orgs/"+o.OrgID+"/plan", map[string]any{"plan": "roomy"}); code != http.StatusOK {
		t.Fatalf("set plan: %d %s", code, b)
	}
	if code, b := h.call(h.token, "POST", "/v1/sandbox/c1/pause", nil); code != http.StatusOK {
		t.Fatalf("pause on roomy: %d %s", code, b)
	}
	// Paused: nothing drawn.
	before := h.usage(h.token, "").Used.Milli
	clk.advance(3 * time.Hour)
	if after := h.usage(h.token, "").Used.Milli; after != before {
		t.Fatalf("paused session drew %d", after-before)
	}
	// Metrics count what was drawn.
	code, b = h.call("", "GET", "/metrics", nil)
	if code != 200 || !strings.Contains(string(b), "sandboxd_credits_drawn_total ") || strings.Contains(string(b), "sandboxd_credits_drawn_total 0\n") {
		t.Fatalf("metrics: %s", grepLines(string(b), "credits"))
	}
	h.call(h.token, "DELETE", "/v1/sandbox/c1", nil)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// newMember adds a user with a role to the owner's organization and
// returns its token.
func (h *harness) newMember(name, role string) string {
	h.t.Helper()
	code, b := h.call(h.token, "GET", "/v1/me", nil)
	var me struct{ Organization struct{ ID string } }
	json.Unmarshal(b, &me)
	code, b = h.call(h.token, "POST", "/v1/orgs/"+me.Organization.ID+"/members", map[string]any{"name": name, "role": role})
	if code != http.StatusCreated {
		h.t.Fatalf("add member: %d %s", code, b)
	}
	var r struct{ Token struct{ Token string } }
	json.Unmarshal(b, &r)
	return r.Token.Token
}

// Usage survives kill -9: running time is charged up to the last moment
// the server saw the session alive, the time it was down is not charged,
// and the adopted sandbox goes on drawing, never twice.
func TestRealUsageKill9(t *testing.T) {
	cfg := realConfig(t)
	p := startProc(t, cfg, "")
	t0 := time.Now()
	p.h.provision("k1", "standard-1")
	time.Sleep(7 * time.Second) // at least one sighting by the monitor
	killed := time.Now()
	p.stop(syscall.SIGKILL)
	time.Sleep(3 * time.Second) // down: not charged
	p = startProc(t, cfg, "")
	restarted := time.Now()
	if st := p.h.get("k1").Status; st != "running" {
		t.Fatalf("after kill -9: %s", st)
	}
	u1 := p.h.usage(p.h.token, "")
	if len(u1.Sessions) != 1 {
		t.Fatalf("usage: %+v", u1)
	}
	before := killed.Sub(t0).Seconds()
	if r := u1.Sessions[0].RunningSeconds; r < before-5.5-1 || r > before+time.Since(restarted).Seconds()+1 {
		t.Fatalf("running seconds %.2f after kill -9 (%.2f s ran before it, %.2f s since the restart)", r, before, time.Since(restarted).Seconds())
	}
	time.Sleep(2 * time.Second)
	u2 := p.h.usage(p.h.token, "")
	if r := u2.Sessions[0].RunningSeconds; r <= u1.Sessions[0].RunningSeconds || r > time.Since(t0).Seconds()-3+0.5 {
		t.Fatalf("running seconds %.2f then %.2f; %.2f s since the start, 3 s of them down", u1.Sessions[0].RunningSeconds, r, time.Since(t0).Seconds())
	}
	if code, b := p.h.call(p.h.token, "DELETE", "/v1/sandbox/k1", nil); code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("delete: %d %s", code, b)
	}
}
