package egress

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	denied  *prometheus.CounterVec
	allowed prometheus.Counter
	quota   prometheus.Counter
	bytes   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_egress_denied_total",
			Help: "Egress requests and tunnels refused, by reason.",
		}, []string{"reason"}),
		allowed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_egress_connections_total",
			Help: "Egress tunnels opened and plain HTTP requests forwarded.",
		}),
		quota: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_egress_quota_exceeded_total",
			Help: "Sessions cut off because their egress byte quota was used up.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandboxd_egress_bytes_total",
			Help: "Bytes moved through egress proxies, both directions, all sessions (what quotas count).",
		}),
	}
	if reg != nil {
		m.bytes = register(reg, m.bytes)
		m.denied = register(reg, m.denied)
		m.allowed = register(reg, m.allowed)
		m.quota = register(reg, m.quota)
	}
	return m
}

// register registers c, or reuses the collector already registered under
// the same name (two proxies sharing one registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
