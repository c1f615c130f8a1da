package fair

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RequestLimits are what each key of a Requests may use.
type RequestLimits struct {
	// PerSecond is the sustained request rate; 0: no rate limit.
	PerSecond float64
	// Burst is how many requests may come at once after a quiet spell
	// (the bucket's size); at least 1 when PerSecond is set.
	Burst int
	// InFlight caps the requests of one key being worked on at once; 0:
	// no cap.
	InFlight int
}

// Why a request was refused.
const (
	ReasonRate     = "rate"      // over the rate: the bucket is empty
	ReasonInFlight = "in_flight" // as many in flight as allowed
)

// Refusal says why a request was refused and when to try again.
type Refusal struct {
	Reason     string
	RetryAfter time.Duration
}

// Requests admits requests per key (see RequestLimits). Keys nobody used
// for a while (nothing in flight, a full bucket) are forgotten, so the
// map stays about as large as the set of recently active clients.
type Requests struct {
	lim RequestLimits
	now func() time.Time

	mu      sync.Mutex
	m       map[string]*reqClient
	sweepAt int // sweep when the map reaches this size
}

type reqClient struct {
	bucket   *rate.Limiter // nil: no rate limit
	inFlight int
}

// minSweep is the map size below which nothing is swept.
const minSweep = 1024

// NewRequests makes a Requests; now is its clock (nil: time.Now).
func NewRequests(lim RequestLimits, now func() time.Time) *Requests {
	if now == nil {
		now = time.Now
	}
	return &Requests{lim: lim, now: now, m: map[string]*reqClient{}, sweepAt: minSweep}
}

// Off reports whether r limits nothing.
func (r *Requests) Off() bool { return r.lim.PerSecond <= 0 && r.lim.InFlight <= 0 }

// Admit takes one request of key. It returns a release function, to call
// when the request no longer counts as in flight (safe to call more than
// once), or the refusal: then nothing was taken.
func (r *Requests) Admit(key string) (release func(), ref *Refusal) {
	if r.Off() {
		return func() {}, nil
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.m[key]
	if c == nil {
		if len(r.m) >= r.sweepAt {
			r.sweep(now)
		}
		c = &reqClient{}
		if r.lim.PerSecond > 0 {
			c.bucket = rate.NewLimiter(rate.Limit(r.lim.PerSecond), max(r.lim.Burst, 1))
		}
		r.m[key] = c
	}
	if r.lim.InFlight > 0 && c.inFlight >= r.lim.InFlight {
		// A slot frees when one of them ends: no telling when.
		return nil, &Refusal{Reason: ReasonInFlight, RetryAfter: time.Second}
	}
	if c.bucket != nil && !c.bucket.AllowN(now, 1) {
		missing := 1 - c.bucket.TokensAt(now)
		wait := time.Duration(math.Ceil(missing / r.lim.PerSecond * float64(time.Second)))
		return nil, &Refusal{Reason: ReasonRate, RetryAfter: max(wait, time.Millisecond)}
	}
	c.inFlight++
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			c.inFlight--
			r.mu.Unlock()
		})
	}, nil
}

// sweep forgets the keys that hold nothing: none in flight and a full
// bucket (a new one would be the same). Next sweep at twice the size left,
// so sweeping costs O(1) per new key. r.mu is held.
func (r *Requests) sweep(now time.Time) {
	for k, c := range r.m {
		if c.inFlight == 0 && (c.bucket == nil || c.bucket.TokensAt(now) >= float64(c.bucket.Burst())) {
			delete(r.m, k)
		}
	}
	r.sweepAt = max(2*len(r.m), minSweep)
}

// InFlight is the number of key's requests in flight.
func (r *Requests) InFlight(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.m[key]; c != nil {
		return c.inFlight
	}
	return 0
}

// Keys is the number of keys remembered (tests).
func (r *Requests) Keys() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}
