package fair

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAddrKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7":                  "192.0.2.7",
		"::ffff:192.0.2.7":           "192.0.2.7",
		"2001:db8:1:2:3:4:5:6":       "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1":       "2001:db8:1:2::/64",
		"fe80::1%eth0":               "fe80::/64",
		"::1":                        "::/64",
		"2001:db8:1:3:3:4:5:6":       "2001:db8:1:3::/64",
		"127.0.0.2":                  "127.0.0.2",
		"2001:db8:1:2:3:4:5:6%zone0": "2001:db8:1:2::/64",
	} {
		if got := AddrKey(netip.MustParseAddr(in)); got != want {
			t.Errorf("AddrKey(%s) = %s, want %s", in, got, want)
		}
	}
}

// clock is a manual clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestRequestsRate(t *testing.T) {
	clk := &clock{t: time.Unix(1e9, 0)}
	r := NewRequests(RequestLimits{PerSecond: 10, Burst: 5}, clk.now)
	// A burst of 5, then refused with the time until the next token.
	for i := range 5 {
		rel, ref := r.Admit("a")
		if ref != nil {
			t.Fatalf("request %d of the burst refused: %+v", i, ref)
		}
		rel()
	}
	_, ref := r.Admit("a")
	if ref == nil || ref.Reason != ReasonRate || ref.RetryAfter != 100*time.Millisecond {
		t.Fatalf("over the burst: %+v, want rate, retry after 100ms", ref)
	}
	// Another key has its own bucket.
	if _, ref := r.Admit("b"); ref != nil {
		t.Fatalf("another key refused: %+v", ref)
	}
	// Refusals take nothing: after 100 ms exactly one more.
	for range 10 {
		r.Admit("a")
	}
	clk.add(100 * time.Millisecond)
	if _, ref := r.Admit("a"); ref != nil {
		t.Fatalf("after 100 ms: %+v", ref)
	}
	if _, ref := r.Admit("a"); ref == nil {
		t.Fatal("two requests admitted for one token's time")
	}
	// The sustained rate: one a 100 ms.
	ok := 0
	for range 100 {
		clk.add(10 * time.Millisecond)
		if _, ref := r.Admit("a"); ref == nil {
			ok++
		}
	}
	if ok != 10 {
		t.Fatalf("%d admitted in a second at 10/s", ok)
	}
}

func TestRequestsInFlight(t *testing.T) {
	r := NewRequests(RequestLimits{InFlight: 2}, nil)
	rel1, _ := r.Admit("a")
	rel2, _ := r.Admit("a")
	_, ref := r.Admit("a")
	if ref == nil || ref.Reason != ReasonInFlight || ref.RetryAfter <= 0 {
		t.Fatalf("third in flight: %+v", ref)
	}
	if _, ref := r.Admit("b"); ref != nil {
		t.Fatalf("another key: %+v", ref)
	}
	// Release is idempotent: one slot per release, however often called.
	rel1()
	rel1()
	rel3, ref := r.Admit("a")
	if ref != nil {
		t.Fatalf("after a release: %+v", ref)
	}
	if _, ref := r.Admit("a"); ref == nil {
		t.Fatal("a double release freed two slots")
	}
	rel2()
	rel3()
	// An in-flight refusal takes no token from the bucket.
	clk := &clock{t: time.Unix(1e9, 0)}
	r = NewRequests(RequestLimits{PerSecond: 1, Burst: 2, InFlight: 1}, clk.now)
	rel, _ := r.Admit("a")
	for range 5 {
		if _, ref := r.Admit("a"); ref == nil || ref.Reason != ReasonInFlight {
			t.Fatalf("%+v", ref)
		}
	}
	rel()
	if _, ref := r.Admit("a"); ref != nil {
		t.Fatalf("the burst's second token is gone: %+v", ref)
	}
}

func TestRequestsOff(t *testing.T) {
	r := NewRequests(RequestLimits{}, nil)
	for range 10000 {
		if _, ref := r.Admit("a"); ref != nil {
			t.Fatal(ref)
		}
	}
	if r.Keys() != 0 {
		t.Fatalf("an unlimited Requests remembers %d keys", r.Keys())
	}
}

// Keys that hold nothing are forgotten: many one-off clients do not grow
// the map without bound.
func TestRequestsSweep(t *testing.T) {
	clk := &clock{t: time.Unix(1e9, 0)}
	r := NewRequests(RequestLimits{PerSecond: 100, Burst: 10, InFlight: 4}, clk.now)
	held, _ := r.Admit("held")
	for i := range 100_000 {
		rel, ref := r.Admit(fmt.Sprint("k", i))
		if ref != nil {
			t.Fatal(ref)
		}
		rel()
		clk.add(time.Millisecond) // a key's bucket is full again 10 ms on
	}
	if n := r.Keys(); n > 3*minSweep {
		t.Fatalf("%d keys remembered", n)
	}
	// The key with a request in flight was kept, with its count.
	for range 3 {
		if _, ref := r.Admit("held"); ref != nil {
			t.Fatal(ref)
		}
	}
	if _, ref := r.Admit("held"); ref == nil {
		t.Fatal("the in-flight count of a key was lost in a sweep")
	}
	held()
}

func TestRequestsConcurrent(t *testing.T) {
	r := NewRequests(RequestLimits{PerSecond: 1e9, Burst: 1e6, InFlight: 8}, nil)
	var in, peak atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				key := "shared"
				if i%3 == 0 {
					key = fmt.Sprint("own", g, i%50)
				}
				rel, ref := r.Admit(key)
				if ref != nil {
					continue
				}
				if key == "shared" {
					n := in.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					in.Add(-1)
				}
				rel()
				rel()
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > 8 {
		t.Fatalf("%d in flight at once, cap 8", p)
	}
	for range 8 {
		if _, ref := r.Admit("shared"); ref != nil {
			t.Fatalf("slots leaked: %+v", ref)
		}
	}
}

type closer struct {
	name   string
	closed atomic.Int32
}

func (c *closer) Close() error { c.closed.Add(1); return nil }

func open(t *testing.T, cs *Conns, key string, exempt bool) (*Conn, *closer, *closer, Verdict) {
	t.Helper()
	c := &closer{name: key}
	h, ev, v := cs.Admit(key, exempt, c)
	var evc *closer
	if ev != nil {
		evc = ev.(*closer)
		evc.Close()
	}
	return h, c, evc, v
}

func TestConnsPerClient(t *testing.T) {
	cs := NewConns(100, 3)
	var hs []*Conn
	for range 3 {
		h, _, _, v := open(t, cs, "a", false)
		if v != Admitted {
			t.Fatalf("verdict %v", v)
		}
		hs = append(hs, h)
	}
	if _, _, _, v := open(t, cs, "a", false); v != OverClient {
		t.Fatalf("fourth of one client: %v, want OverClient", v)
	}
	if _, _, _, v := open(t, cs, "b", false); v != Admitted {
		t.Fatalf("another client: %v", v)
	}
	// An exempt client (a trusted proxy) has no per-client cap.
	for range 10 {
		if _, _, _, v := open(t, cs, "proxy", true); v != Admitted {
			t.Fatalf("exempt: %v", v)
		}
	}
	// Closing one frees its place; a second Release is a no-op.
	if !hs[0].Release() || hs[0].Release() {
		t.Fatal("Release: want true once, then false")
	}
	if _, _, _, v := open(t, cs, "a", false); v != Admitted {
		t.Fatalf("after a close: %v", v)
	}
	if n := cs.Count(); n != 3+1+10 {
		t.Fatalf("open %d", n)
	}
	// A per-client cap at or over the total is none.
	if NewConns(10, 10).PerClient() != 0 || NewConns(10, 0).PerClient() != 0 || NewConns(10, 9).PerClient() != 9 {
		t.Fatal("PerClient")
	}
}

// At the cap, the newcomer takes the place of an idle connection of the
// heaviest client, never of a busy one, never of a client that would end up
// with fewer than the newcomer's.
func TestConnsEvictsHeaviestIdle(t *testing.T) {
	cs := NewConns(10, 0)
	var heavy []*Conn
	var heavyC []*closer
	for range 7 {
		h, c, _, _ := open(t, cs, "heavy", false)
		heavy, heavyC = append(heavy, h), append(heavyC, c)
	}
	var mid []*Conn
	for range 3 {
		h, _, _, _ := open(t, cs, "mid", false)
		mid = append(mid, h)
	}
	// All busy: nothing can be closed, the newcomer is refused.
	for _, h := range append(heavy, mid...) {
		h.SetIdle(false)
	}
	if _, _, _, v := open(t, cs, "new", false); v != OverTotal {
		t.Fatalf("all busy: %v, want OverTotal", v)
	}
	// mid's connections idle, heavy's busy: mid has 3, the newcomer
	// would have 1 — mid is evicted from (3 > 0+1).
	for _, h := range mid {
		h.SetIdle(true)
	}
	h, _, ev, v := open(t, cs, "new", false)
	if v != Admitted || ev == nil || ev.name != "mid" {
		t.Fatalf("verdict %v, evicted %+v; want mid's idle connection", v, ev)
	}
	// One of heavy's idle now: heavy (7) is the heaviest with an idle one.
	heavy[3].SetIdle(true)
	_, _, ev, v = open(t, cs, "new", false)
	if v != Admitted || ev != heavyC[3] {
		t.Fatalf("verdict %v, evicted %+v; want heavy's idle connection", v, ev)
	}
	if heavy[3].Release() {
		t.Fatal("an evicted connection was still counted")
	}
	if cs.Count() != 10 || cs.CountBy("heavy") != 6 || cs.CountBy("mid") != 2 || cs.CountBy("new") != 2 {
		t.Fatalf("open %d: heavy %d mid %d new %d", cs.Count(), cs.CountBy("heavy"), cs.CountBy("mid"), cs.CountBy("new"))
	}
	// A client as heavy as the newcomer's is not evicted from: mid (2)
	// vs new (2 -> 3).
	for _, h := range heavy {
		h.SetIdle(false)
	}
	if _, _, _, v := open(t, cs, "new", false); v != OverTotal {
		t.Fatalf("evicted from a client with no more than the newcomer: %v", v)
	}
	// A client's own idle connection is not closed for it.
	h.SetIdle(true)
	if _, _, _, v := open(t, cs, "new", false); v != OverTotal {
		t.Fatalf("%v", v)
	}
}

// Random opens, closes and state changes from many goroutines: the counts
// stay exact and the cap holds (run with -race).
func TestConnsConcurrent(t *testing.T) {
	const max = 50
	cs := NewConns(max, 12)
	var wg sync.WaitGroup
	var over atomic.Int32
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []*Conn
			for range 3000 {
				switch op := rng.IntN(10); {
				case op < 5:
					c := &closer{}
					h, ev, v := cs.Admit(fmt.Sprint("c", rng.IntN(6)), rng.IntN(8) == 0, c)
					if ev != nil {
						ev.Close()
					}
					if v == Admitted {
						mine = append(mine, h)
					}
				case op < 8 && len(mine) > 0:
					mine[rng.IntN(len(mine))].SetIdle(rng.IntN(2) == 0)
				case len(mine) > 0:
					i := rng.IntN(len(mine))
					mine[i].Release()
					mine = append(mine[:i], mine[i+1:]...)
				}
				if cs.Count() > max {
					over.Add(1)
				}
			}
			for _, h := range mine {
				h.Release()
			}
		}()
	}
	wg.Wait()
	if over.Load() > 0 {
		t.Fatal("more than max open")
	}
	if cs.Count() != 0 || len(cs.clients) != 0 || len(cs.idle) != 0 {
		t.Fatalf("after all closed: open %d, clients %d, idle heap %d", cs.Count(), len(cs.clients), len(cs.idle))
	}
}
