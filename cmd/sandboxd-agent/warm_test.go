package main

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeWarm drives a pool with fake shells and a fake clock: the logic of
// failures, back-off and recovery, without processes.
type fakeWarm struct {
	mu       sync.Mutex
	now      time.Time
	fail     bool
	attempts int
	p        *pool
	cfg      *warmConfig
}

func newFakeWarm(t *testing.T) *fakeWarm {
	home := t.TempDir()
	f := &fakeWarm{now: time.Unix(1_000_000, 0)}
	f.p = &pool{
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		start: func(cfg *warmConfig, stamp string) (*warmShell, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.attempts++
			if f.fail {
				return nil, errors.New("warm shell did not start")
			}
			return &warmShell{child: &child{done: make(chan struct{})}, base: cfg.env, prof: stamp}, nil
		},
		stop: func(*warmShell) {},
		now: func() time.Time {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.now
		},
		changed: make(chan struct{}),
	}
	f.cfg = &warmConfig{env: []string{"PATH=/usr/bin:/bin", "HOME=" + home}, uid: 1000, gid: 1000, cwd: "/", count: 2}
	return f
}

func (f *fakeWarm) set(fail bool) {
	f.mu.Lock()
	f.fail = fail
	f.mu.Unlock()
}

func (f *fakeWarm) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func (f *fakeWarm) attemptCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts
}

// take is a request eligible for a warm shell; it reports whether it got one.
func (f *fakeWarm) take() bool {
	w := f.p.take(f.cfg.uid, f.cfg.gid, f.cfg.env, "/")
	return w != nil
}

// settle waits until no start is in flight and cond holds.
func (f *fakeWarm) settle(t *testing.T, what string, cond func(warmStats) bool) warmStats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.p.mu.Lock()
		idle := f.p.starting == 0
		f.p.mu.Unlock()
		st := f.p.stats()
		if idle && cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached (stats %+v, %d attempts)", what, st, f.attemptCount())
		}
		time.Sleep(time.Millisecond)
	}
}

func backingOff(st warmStats) bool { return st.fails >= maxWarmFails }

func TestWarmPoolBacksOffAndRecovers(t *testing.T) {
	f := newFakeWarm(t)
	f.set(true)
	if err := f.p.configureAndWait(f.cfg, 10*time.Second); err == nil {
		t.Fatal("configureAndWait succeeded with failing starts")
	}
	st := f.settle(t, "back-off", backingOff)
	if st.retryIn != warmBackoff || st.ready != 0 {
		t.Fatalf("after the first failures: %+v, want retryIn %v", st, warmBackoff)
	}
	// Two shells start together, then both again after 100 ms.
	first := f.attemptCount()
	if first < maxWarmFails || first > maxWarmFails+1 {
		t.Fatalf("%d attempts before backing off", first)
	}

	// While backing off, requests start nothing and run cold.
	for range 100 {
		if f.take() {
			t.Fatal("a warm shell while every start fails")
		}
	}
	f.advance(warmBackoff - time.Second)
	f.take()
	// A repeated warm op neither waits nor ends the back-off.
	t0 := time.Now()
	if err := f.p.configureAndWait(f.cfg, 10*time.Second); err == nil || time.Since(t0) > time.Second {
		t.Fatalf("warm op while backing off: %v after %v", err, time.Since(t0))
	}
	time.Sleep(150 * time.Millisecond) // no late retry timer either
	f.settle(t, "idle", backingOff)
	if n := f.attemptCount(); n != first {
		t.Fatalf("%d attempts while backing off", n-first)
	}

	// Each back-off period allows one start, on a request; the period
	// doubles up to maxWarmBackoff.
	want := warmBackoff
	for i := 0; i < 8; i++ {
		f.advance(want)
		before := f.attemptCount()
		for range 5 {
			f.take()
		}
		want = min(2*want, maxWarmBackoff)
		st := f.settle(t, "probe", func(st warmStats) bool { return st.retryIn == want })
		if n := f.attemptCount() - before; n != 1 {
			t.Fatalf("period %d: %d starts, want 1 (%+v)", i, n, st)
		}
	}
	if want != maxWarmBackoff {
		t.Fatalf("back-off did not reach its cap: %v", want)
	}
	// Nothing happens without requests, whatever the time.
	before := f.attemptCount()
	f.advance(time.Hour)
	time.Sleep(150 * time.Millisecond)
	if n := f.attemptCount(); n != before {
		t.Fatalf("%d starts without a request", n-before)
	}

	// Once starts work again, the probe's success refills the pool.
	f.set(false)
	f.take()
	st = f.settle(t, "recovered", func(st warmStats) bool { return st.ready == 2 })
	if st.fails != 0 || st.retryIn != 0 {
		t.Fatalf("after recovery: %+v", st)
	}
	if !f.take() {
		t.Fatal("no warm shell after recovery")
	}
	// Failing again starts with the shortest back-off.
	f.set(true)
	f.p.configure(&warmConfig{env: f.cfg.env, uid: 1000, gid: 1000, cwd: "/", count: 1}) // drops the ready shells
	f.p.configure(f.cfg)
	if st := f.settle(t, "back-off again", backingOff); st.retryIn != warmBackoff {
		t.Fatalf("second back-off: %+v", st)
	}
}

func TestWarmPoolProfileChangeEndsBackOff(t *testing.T) {
	f := newFakeWarm(t)
	home, _ := lookupEnv(f.cfg.env, "HOME")
	profile := filepath.Join(home, ".profile")
	os.WriteFile(profile, []byte("sleep 30\n"), 0o644)
	f.set(true)
	f.p.configure(f.cfg)
	f.settle(t, "back-off", backingOff)

	// Still broken after an edit: one more round of starts, then a
	// back-off again.
	os.WriteFile(profile, []byte("sleep 30 # still\n"), 0o644)
	before := f.attemptCount()
	f.take()
	st := f.settle(t, "back-off after an edit", backingOff)
	if n := f.attemptCount() - before; n < 1 || n > maxWarmFails+1 || st.retryIn != warmBackoff {
		t.Fatalf("after an edit that fixes nothing: %d starts, %+v", n, st)
	}
	// A request with no further change starts nothing.
	before = f.attemptCount()
	for range 10 {
		f.take()
	}
	time.Sleep(150 * time.Millisecond)
	if n := f.attemptCount(); n != before {
		t.Fatalf("%d starts without a profile change", n-before)
	}

	// Fixed: the next request ends the back-off at once.
	os.WriteFile(profile, []byte("export FIXED=1\n"), 0o644)
	f.set(false)
	if f.take() {
		t.Fatal("warm shell before the pool refilled")
	}
	st = f.settle(t, "refilled", func(st warmStats) bool { return st.ready == 2 })
	if st.fails != 0 || st.retryIn != 0 {
		t.Fatalf("after the fix: %+v", st)
	}
	if !f.take() {
		t.Fatal("no warm shell after the fix")
	}
}

// A profile that rewrites one of the profile files each time it runs does
// not end its own back-off.
func TestWarmPoolSelfChangingProfileBacksOff(t *testing.T) {
	f := newFakeWarm(t)
	home, _ := lookupEnv(f.cfg.env, "HOME")
	rc := filepath.Join(home, ".bashrc")
	n := 0
	start := f.p.start
	f.p.start = func(cfg *warmConfig, stamp string) (*warmShell, error) {
		f.mu.Lock()
		n++
		os.WriteFile(rc, []byte(strings.Repeat("#", n)), 0o644)
		f.mu.Unlock()
		return start(cfg, stamp)
	}
	f.set(true)
	f.p.configure(f.cfg)
	f.settle(t, "back-off", backingOff)
	before := f.attemptCount()
	for range 20 {
		f.take()
	}
	time.Sleep(150 * time.Millisecond)
	f.settle(t, "idle", backingOff)
	if n := f.attemptCount(); n != before {
		t.Fatalf("%d starts while backing off", n-before)
	}
}
