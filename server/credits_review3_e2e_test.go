package server

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// Review 3: plans with a small storage cap, and a size that draws a credit
// an hour (the test's clock jumps past the month's one credit).
const review3Plans = `
default: capped
firstOrg: capped
minSliceSeconds: 300
plans:
  - {name: capped, monthlyCredits: 1, largestSize: "", maxConcurrent: 2, egressMiB: 0, storageMiB: 4, pause: false}
`

// Credits run out, but the session's workspace is larger than what the
// plan may save (storageMiB): the teardown's save is refused with 507 and
// the sandbox keeps running, on no credits, for as long as the user likes
// (the monitor retries, and fails, every 5 s, logging an event and an
// audit record each time). A user gets unlimited free compute by writing
// more incompressible bytes to /workspace than the plan's storage cap (on
// the free plan: 2 GiB on a standard-1's 8 GiB disk). When credits run
// out the sandbox must stop drawing them (stopped without a save, its
// disk kept on the node, or paused), whatever the save says.
func TestReview3CreditsExhaustedOverStorageQuota(t *testing.T) {
	h, clk := startCreditsServer(t, review3Plans)
	h.provision("q1", "test-credits")
	t.Cleanup(func() { h.call(h.token, "DELETE", "/v1/sandbox/q1", nil) })
	if r := h.sh("q1", "head -c 16777216 /dev/urandom > /workspace/noise.bin && echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("write: %+v", r)
	}

	clk.advance(61 * time.Minute) // the month's one credit is spent
	deadline := time.Now().Add(60 * time.Second)
	// running until the credits check, then stopping (under load, for
	// seconds) until stopped
	for st := h.get("q1").Status; (st == "running" || st == "stopping") && time.Now().Before(deadline); st = h.get("q1").Status {
		time.Sleep(time.Second)
	}
	st := h.get("q1").Status
	u := h.usage(h.token, "")
	if st == "running" {
		r := h.sh("q1", "echo still computing")
		h.s.db.FlushAudit(t.Context())
		_, b := h.call(h.token, "GET", "/v1/audit?action=sandbox.credits_exhausted", nil)
		t.Fatalf("credits ran out (remaining %d milli-credits) 60 s ago and the sandbox still runs (exec: %q); "+
			"%d credits_exhausted audit records so far, each failing on the storage quota",
			u.Remaining.Milli, r.Stdout, strings.Count(string(b), `"sandbox.credits_exhausted"`))
	}
	if code, b := h.call(h.token, "POST", "/v1/sandbox/terminal/q1", map[string]any{"action": "exec", "command": "true"}); code != http.StatusConflict {
		t.Fatalf("exec after credits ran out: %d %s", code, b)
	}
	// Stopped without a save, says so, and loses nothing: with credits
	// granted, the resume starts from the disk kept on the node.
	o := h.get("q1")
	if o.Status != "stopped" || o.StatusReason == nil || *o.StatusReason != "credits_exhausted" {
		t.Fatalf("after credits ran out: %+v", o)
	}
	h.s.db.FlushAudit(t.Context())
	if _, b := h.call(h.token, "GET", "/v1/audit?action=sandbox.credits_exhausted", nil); strings.Count(string(b), `"outcome":"unsaved"`) != 1 {
		t.Fatalf("audit: %s", b)
	}
	if logs := h.logsText("q1"); !strings.Contains(logs, `"saved":false`) || !strings.Contains(logs, "storage quota") {
		t.Fatalf("no unsaved credits_exhausted event: %s", logs)
	}
	if code, b := h.call(h.token, "POST", "/v1/orgs/"+o.OrgID+"/credits", map[string]any{"credits": 5}); code != http.StatusCreated {
		t.Fatalf("grant: %d %s", code, b)
	}
	if code, b := h.call(h.token, "POST", "/v1/sandbox/q1/resume", nil); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, b)
	}
	if r := h.sh("q1", "stat -c %s /workspace/noise.bin"); r.Stdout != "16777216\n" {
		t.Fatalf("after resume: %+v", r)
	}
}
