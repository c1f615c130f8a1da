package sandbox

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/store"
)

// secretOf is a random base64 value of n bytes, the same for the same seed.
func secretOf(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return base64.StdEncoding.EncodeToString(b)[:n]
}

// estimateBytes is an upper bound of what the index takes, and not a
// gross one (an admit refused on it would have fitted).
func TestSecretsEstimate(t *testing.T) {
	s := &scrubbers{base: builtinRules()}
	for _, c := range []struct{ n, k int }{{6, 1}, {33, 2}, {64, 1}, {256, 1}, {1024, 2}, {16 << 10, 1}} {
		if c.n > 1024 && testing.Short() {
			continue // seconds under the race detector
		}
		sec := map[string]string{}
		for i := range c.k {
			sec[fmt.Sprint("S", i)] = secretOf(uint64(c.n*10+i), c.n)
		}
		est, got := estimateBytes(sec), s.withSecrets(sec).MemoryBytes()
		if est < got || est > 3*got {
			t.Errorf("%d x %d bytes: estimate %d, the index takes %d", c.k, c.n, est, got)
		}
	}
}

// With the budget full, admits are refused before anything is compiled:
// a burst of them costs neither the memory nor the CPU of compiling.
func TestSecretsBudgetRefusesBeforeCompiling(t *testing.T) {
	s := &scrubbers{base: builtinRules()}
	first := map[string]string{"K": secretOf(1, 64)}
	size := s.withSecrets(first).MemoryBytes()
	s.memBudget = size + estimateBytes(first) - 1 // one fits, not two
	s.compiles.Store(0)
	if err := s.admit(context.Background(), "a", first); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Go(func() {
			errs[i] = s.admit(context.Background(), fmt.Sprint("b", i), map[string]string{"K": secretOf(uint64(i+2), 64)})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "running sessions take") {
			t.Fatalf("admit over the budget: %v", err)
		}
	}
	if n := s.compiles.Load(); n != 1 {
		t.Errorf("%d compilations, want 1 (the refused ones compiled)", n)
	}
	if pinned, all := s.memory(); pinned != size || all != size {
		t.Errorf("memory %d, %d; want %d (nothing reserved left)", pinned, all, size)
	}
	// Sessions without secrets are not refused.
	if err := s.admit(context.Background(), "plain", nil); err != nil {
		t.Error(err)
	}
}

// At most GOMAXPROCS sets compile at once; waiting for a turn ends with
// the request's context, and gives back what it reserved.
func TestSecretsCompileTurns(t *testing.T) {
	s := &scrubbers{base: builtinRules(), memBudget: 64 << 20}
	s.sem = make(chan struct{}, 1)
	s.sem <- struct{}{} // a compilation runs
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := s.admit(ctx, "a", map[string]string{"K": secretOf(1, 64)})
	if !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("admit waiting for a turn: %v", err)
	}
	if pinned, _ := s.memory(); pinned != 0 || s.compiles.Load() != 0 {
		t.Fatalf("after the wait: %d bytes pinned, %d compiled", pinned, s.compiles.Load())
	}
	<-s.sem
	if err := s.admit(context.Background(), "a", map[string]string{"K": secretOf(1, 64)}); err != nil {
		t.Fatal(err)
	}
}

// Scrubbers loaded for reads of sessions that do not run are evicted,
// least recently used first, when a load or an admit needs the room; an
// admit is refused only when the running (pinned) sessions fill the budget.
func TestSecretsEviction(t *testing.T) {
	s := &scrubbers{base: builtinRules()}
	sec := func(i uint64) map[string]string { return map[string]string{"K": secretOf(i, 64)} }
	size := s.withSecrets(sec(1)).MemoryBytes()
	est := estimateBytes(sec(1))
	s.memBudget = 2*size + size/2 // two sets, with estimates: one pinned and one more
	if est > size+size/2 {
		t.Fatalf("estimate %d of %d: the test's figures do not hold", est, size)
	}
	isCached := func(pk string) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.m[pk] != nil
	}
	s.forSession("a", sec(1))
	s.forSession("b", sec(2))
	s.cached("a") // b is the least recently used
	s.forSession("c", sec(3))
	if !isCached("a") || isCached("b") || !isCached("c") {
		t.Fatalf("a lazy load evicted the wrong one: a %v b %v c %v", isCached("a"), isCached("b"), isCached("c"))
	}
	// Unpinned ones never hold an admit back.
	if err := s.admit(context.Background(), "d", sec(4)); err != nil {
		t.Fatalf("admit with only unpinned sets cached: %v", err)
	}
	if err := s.admit(context.Background(), "e", sec(5)); err != nil {
		t.Fatal(err)
	}
	if isCached("a") || isCached("c") {
		t.Error("the admits did not evict the unpinned sets")
	}
	// d and e are pinned: a third is refused, and loads do not evict them.
	if err := s.admit(context.Background(), "f", sec(6)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("admit over the pinned sets: %v", err)
	}
	s.forSession("a", sec(1))
	if !isCached("d") || !isCached("e") || !isCached("a") {
		t.Fatal("a lazy load evicted a pinned set (or was not cached)")
	}
	if got := s.redactAll([]byte(secretOf(4, 64) + " " + secretOf(1, 64))); string(got) != "[REDACTED:K] [REDACTED:K]" {
		t.Errorf("redactAll = %q", got)
	}
	// e stops: its room is free for the next admit (a and e are evicted).
	s.unpin("e")
	if err := s.admit(context.Background(), "f", sec(6)); err != nil {
		t.Fatalf("admit after an unpin: %v", err)
	}
	if pinned, all := s.memory(); pinned != s.m["d"].bytes+s.m["f"].bytes || all > s.memBudget {
		t.Errorf("memory: %d pinned, %d cached, budget %d", pinned, all, s.memBudget)
	}
	// Pinning a cached unpinned set is an admit too.
	s.forSession("g", sec(7))
	if err := s.pin(context.Background(), "g", nil, true); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("pin over the budget: %v", err)
	}
	s.forget("f")
	if err := s.pin(context.Background(), "g", nil, true); err != nil {
		t.Fatal(err)
	}
}

// secretsEnv is a manager whose secrets budget holds one session with a
// 4 KiB secret (about 5.8 MB of index, 9.2 MB estimated), not two.
func secretsEnv(t *testing.T) *env {
	return newEnv(t, func(c *config.Config) { c.Limits.MaxSecretsMemoryMiB = 10 })
}

func (e *env) provisionSecret(id string, seed uint64) error {
	z, _ := e.cfg.Sizes.Resolve("")
	_, err := e.m.Provision(context.Background(), e.p, Spec{SessionID: id, Size: z, Secrets: map[string]string{"KEY": secretOf(seed, 4096)}})
	return err
}

// The budget is the running sessions': a teardown frees the room, and a
// resume is admitted like a provision.
func TestSecretsBudgetRunningSessions(t *testing.T) {
	e := secretsEnv(t)
	ctx := context.Background()
	if err := e.provisionSecret("s1", 1); err != nil {
		t.Fatal(err)
	}
	if err := e.provisionSecret("s2", 2); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("second provision: %v", err)
	}
	if _, _, err := e.m.Teardown(ctx, e.p.Org.ID, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := e.provisionSecret("s2", 2); err != nil {
		t.Fatalf("provision after the other's teardown: %v", err)
	}
	// s1's scrubber, read while it is stopped (its log, its files), does
	// not count; its resume is refused while s2 runs.
	e.m.Scrubber(sessionPK(t, e, "s1"))
	if _, err := e.m.Resume(ctx, e.p.Org.ID, "s1"); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "redacting") {
		t.Fatalf("resume over the budget: %v", err)
	}
	if st := e.status("s1"); st != store.StatusStopped {
		t.Fatalf("s1 is %s after the refused resume", st)
	}
	// s2 dies: its room is free.
	e.rt.Mu.Lock()
	e.rt.InspectState.Status = "stopped"
	e.rt.Mu.Unlock()
	e.m.sweep()
	if st := e.status("s2"); st != store.StatusFailed {
		t.Fatalf("s2 is %s", st)
	}
	e.rt.Mu.Lock()
	e.rt.InspectState.Status = "running"
	e.rt.Mu.Unlock()
	if _, err := e.m.Resume(ctx, e.p.Org.ID, "s1"); err != nil {
		t.Fatalf("resume after the other died: %v", err)
	}
	if running, _ := e.m.ScrubMemory(); running <= 0 || running > 8<<20 {
		t.Errorf("running sessions' secrets: %d bytes", running)
	}
}

// After a restart the running sessions are pinned again, and a stopped
// session's scrubber loaded for a read does not push admits over.
func TestSecretsBudgetAcrossRestart(t *testing.T) {
	e := secretsEnv(t)
	ctx := context.Background()
	if err := e.provisionSecret("s1", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.m.Teardown(ctx, e.p.Org.ID, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := e.provisionSecret("s2", 2); err != nil {
		t.Fatal(err)
	}
	e.m.Close()
	e.m = e.newManager()
	if err := e.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	e.m.Scrubber(sessionPK(t, e, "s1")) // GET artifacts of the stopped session
	if err := e.provisionSecret("s3", 3); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("provision while s2 runs (adopted): %v", err)
	}
	if _, _, err := e.m.Teardown(ctx, e.p.Org.ID, "s2"); err != nil {
		t.Fatal(err)
	}
	if err := e.provisionSecret("s3", 3); err != nil {
		t.Fatalf("provision with only stopped sessions' scrubbers cached: %v", err)
	}
}

func sessionPK(t *testing.T, e *env, id string) string {
	t.Helper()
	ses, err := e.m.Get(context.Background(), e.p.Org.ID, id)
	if err != nil {
		t.Fatal(err)
	}
	return ses.ID
}

// A session's scrubber whose secrets cannot be read is an error, never the
// rules alone: what the caller would show (a stopped session's files, a
// log entry) could hold a secret (found by a review in session 21).
func TestScrubberFailsClosed(t *testing.T) {
	e := secretsEnv(t)
	ctx := context.Background()
	if err := e.provisionSecret("s1", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.m.Teardown(ctx, e.p.Org.ID, "s1"); err != nil {
		t.Fatal(err)
	}
	pk := sessionPK(t, e, "s1")
	e.m.Close()
	e.m = e.newManager() // nothing cached
	if set, err := e.m.Scrubber(pk); err != nil || set == nil {
		t.Fatalf("readable secrets: %v", err)
	}
	e.m.scrub.forget(pk)
	e.db.Close() // every read fails from now on
	if set, err := e.m.Scrubber(pk); err == nil || set != nil || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("unreadable secrets: %v %v", set, err)
	}
}
