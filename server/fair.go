package server

import (
	"bufio"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/time/rate"

	"sandboxd/server/errdefs"
	"sandboxd/server/fair"
)

// Fairness between API clients, per request (server/fair): each client
// address, before authentication, and each token, after it, may send
// limits.requestsPerSecond requests a second (bursts of requestBurst) and
// have limits.maxRequestsInFlight being answered at once. Past either the
// request is answered 429 rate_limited with Retry-After, before the audit
// middleware (a flood would bury the audit log; the refusals are counted in
// sandboxd_api_requests_limited_total instead). A request stops counting as
// in flight when it becomes a WebSocket or its answer starts streaming (a
// flush): from then on it is a connection, capped per client in listen.go.
// The portal's own origins are limited the same way (servePortal).

// Failed authentications recorded per address: a burst, then one a
// second; the rest are counted (sandboxd_audit_denied_dropped_total).
const (
	deniedAuditBurst     = 60
	deniedAuditPerSecond = 1
)

const (
	scopeAddress = "address"
	scopeToken   = "token"
)

// fairness is the request limiters and who a client is.
type fairness struct {
	byAddr, byToken *fair.Requests
	// deniedAudit bounds the audit records of failed authentications per
	// address: within the request rate a client could otherwise grow the
	// database by megabytes a second with no token at all.
	deniedAudit *fair.Requests
	trusted     []netip.Prefix // trustedProxies
	warn        rate.Sometimes
}

func (s *Server) newFairness() {
	l := s.cfg.Limits
	lim := fair.RequestLimits{PerSecond: l.RequestsPerSecond, Burst: l.RequestBurst, InFlight: l.MaxRequestsInFlight}
	s.fair = &fairness{byAddr: fair.NewRequests(lim, nil), byToken: fair.NewRequests(lim, nil),
		deniedAudit: fair.NewRequests(fair.RequestLimits{PerSecond: deniedAuditPerSecond, Burst: deniedAuditBurst}, nil),
		trusted:     parsePrefixes(s.cfg.TrustedProxies), warn: rate.Sometimes{Interval: time.Minute}}
}

// parsePrefixes reads trustedProxies (validated by config: IPs or CIDRs).
func parsePrefixes(list []string) []netip.Prefix {
	var ps []netip.Prefix
	for _, v := range list {
		if p, err := netip.ParsePrefix(v); err == nil {
			ps = append(ps, p.Masked())
		} else if a, err := netip.ParseAddr(v); err == nil {
			a = a.Unmap()
			ps = append(ps, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return ps
}

// clientKey is the fairness key of r's client: the socket's address, or,
// from a trustedProxies peer, the last address in X-Forwarded-For that is
// not a trusted proxy (what gin's ClientIP gives the audit log).
func (s *Server) clientKey(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	a := ap.Addr().Unmap()
	if trustedAddr(s.fair.trusted, a) {
		if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
			hops := strings.Split(strings.Join(xff, ","), ",")
			for i := len(hops) - 1; i >= 0; i-- {
				h, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
				if err != nil {
					break // a garbled header: the peer it came from
				}
				a = h.Unmap()
				if !trustedAddr(s.fair.trusted, a) {
					break
				}
			}
		}
	}
	return fair.AddrKey(a)
}

// admit takes a request slot of key in scope. Refused, it sets
// Retry-After on h and returns the 429 to answer.
func (s *Server) admit(h http.Header, scope, key string) (release func(), err error) {
	q := s.fair.byAddr
	if scope == scopeToken {
		q = s.fair.byToken
	}
	release, ref := q.Admit(key)
	if ref == nil {
		return release, nil
	}
	secs := int(math.Ceil(ref.RetryAfter.Seconds()))
	secs = max(secs, 1)
	h.Set("Retry-After", strconv.Itoa(secs))
	s.met.limited.WithLabelValues(scope, ref.Reason).Inc()
	s.fair.warn.Do(func() {
		s.log.Warn("API client over its request limits; answering 429", "scope", scope, "client", key, "reason", ref.Reason)
	})
	who := "from your address"
	if scope == scopeToken {
		who = "with this token"
	}
	l := s.cfg.Limits
	details := map[string]any{"scope": scope, "retryAfterSeconds": secs}
	if ref.Reason == fair.ReasonInFlight {
		details["limit"] = "maxRequestsInFlight"
		return nil, errdefs.RateLimited("too many requests %s at once: at most %d are answered at a time; retry when one ends",
			who, l.MaxRequestsInFlight).WithDetails(details)
	}
	details["limit"] = "requestsPerSecond"
	return nil, errdefs.RateLimited("too many requests %s: at most %s a second (bursts of %d); retry in %d s",
		who, strconv.FormatFloat(l.RequestsPerSecond, 'f', -1, 64), l.RequestBurst, secs).WithDetails(details)
}

// limitAddress is the first middleware after the request id: an address
// over its limits is refused before authentication costs anything.
// /healthz is exempt (a probe sharing an address with a busy client must
// not take the server for dead).
func (s *Server) limitAddress(c *gin.Context) {
	if c.Request.URL.Path == "/healthz" {
		c.Next()
		return
	}
	s.limitGin(c, scopeAddress, s.clientKey(c.Request))
}

// limitToken follows authenticate: the token's own limits.
func (s *Server) limitToken(c *gin.Context) {
	if key := principal(c).TokenID; key != "" {
		s.limitGin(c, scopeToken, key)
		return
	}
	c.Next()
}

func (s *Server) limitGin(c *gin.Context, scope, key string) {
	release, err := s.admit(c.Writer.Header(), scope, key)
	if err != nil {
		s.writeError(c, err)
		return
	}
	defer release()
	c.Writer = &ginReleaser{ResponseWriter: c.Writer, release: release}
	c.Next()
}

// ginReleaser gives the request's in-flight slot back when it becomes a
// WebSocket or starts streaming. Unwrap keeps what http.ResponseController
// reaches through gin's writer (the file transfers' deadlines).
type ginReleaser struct {
	gin.ResponseWriter
	release func()
}

func (w *ginReleaser) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *ginReleaser) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.release()
	return w.ResponseWriter.Hijack()
}

func (w *ginReleaser) Flush() {
	w.release()
	w.ResponseWriter.Flush()
}

// releaser is ginReleaser for the portal's origins (plain net/http).
type releaser struct {
	http.ResponseWriter
	release func()
}

func (w *releaser) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *releaser) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.release()
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *releaser) Flush() { w.FlushError() }

func (w *releaser) FlushError() error {
	w.release()
	return http.NewResponseController(w.ResponseWriter).Flush()
}
