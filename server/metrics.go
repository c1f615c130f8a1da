package server

import (
	"context"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"sandboxd/server/sandbox"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

// metrics are one server's Prometheus metrics (own registry, so several
// servers in one process do not collide). Only aggregates: no session ids.
type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	provision prometheus.Histogram
	exec      prometheus.Histogram
	wsConns   prometheus.Gauge
	// API connections: open (hijacked WebSockets included) and closed
	// at once over limits.maxAPIConns.
	apiConns   prometheus.Gauge
	apiRefused prometheus.Counter
	// Fairness between clients (fair.go, listen.go): connections answered
	// 429 over limits.maxConnsPerClient, idle ones closed to make room at
	// limits.maxAPIConns, and requests answered 429 by scope (address,
	// token) and reason (rate, in_flight).
	apiClientRefused prometheus.Counter
	apiEvicted       prometheus.Counter
	limited          *prometheus.CounterVec
	// Standard library log lines dropped by the rate limit (stdlog.go).
	stdLogSuppressed   prometheus.Counter
	auditDeniedDropped prometheus.Counter
	// Credits drawn by running sandboxes, as the monitor sees them accrue.
	credits prometheus.Counter
	// The monitor's rounds (every 5 s): at high density their length is
	// what to watch.
	monitorRound prometheus.Histogram
	// Sandboxes the disk watcher stopped (limits.pressureFreeDiskMiB).
	diskStops prometheus.Counter
}

func newMetrics(db *store.DB, dataDir string) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_http_requests_total", Help: "API requests by route and status code.",
	}, []string{"route", "code"})
	m.provision = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sandboxd_provision_seconds", Help: "Time from provision request to running sandbox.",
		Buckets: []float64{.05, .1, .15, .2, .3, .5, 1, 2, 5, 10},
	})
	m.exec = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sandboxd_exec_seconds", Help: "REST exec round trip inside the server (command run time included).",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	m.wsConns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sandboxd_websocket_connections", Help: "Open WebSocket connections."})
	m.apiConns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sandboxd_api_connections", Help: "Open API connections (WebSockets included)."})
	m.apiRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandboxd_api_connections_refused_total", Help: "API connections closed at once because limits.maxAPIConns were open.",
	})
	m.apiClientRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandboxd_api_client_connections_refused_total", Help: "API connections answered 429 and closed because their client had limits.maxConnsPerClient open.",
	})
	m.apiEvicted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandboxd_api_connections_evicted_total", Help: "Idle API connections of the client holding the most closed to make room at limits.maxAPIConns.",
	})
	m.limited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_api_requests_limited_total", Help: "Requests answered 429 over a client's request limits, by scope (address, token) and reason (rate, in_flight).",
	}, []string{"scope", "reason"})
	m.auditDeniedDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandboxd_audit_denied_dropped_total", Help: "Failed authentications not written to the audit log: past an address's burst of them (60, then one a second).",
	})
	m.stdLogSuppressed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandboxd_stdlog_suppressed_total", Help: "Go standard library log lines dropped by the rate limit.",
	})
	m.credits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandboxd_credits_drawn_total", Help: "Usage credits drawn by running sandboxes (counted as the monitor sees them run, every 5 s, and at each stop).",
	})
	m.monitorRound = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "sandboxd_monitor_round_seconds", Help: "Time one monitor round took (deaths, idle timeouts, egress counts, running time, credits, memory pressure).",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	m.diskStops = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandboxd_disk_pressure_stops_total", Help: "Sandboxes stopped because the data dir's file system was below limits.pressureFreeDiskMiB and their disks grew.",
	})
	dataFree := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sandboxd_data_dir_free_bytes", Help: "Free space on the data dir's file system (sandbox disks, saves, the database).",
	}, func() float64 { return float64(sandbox.FreeBytes(dataDir)) })
	m.reg.MustRegister(m.diskStops, dataFree, m.monitorRound, m.requests, m.provision, m.exec, m.wsConns, m.apiConns, m.apiRefused, m.apiClientRefused, m.apiEvicted, m.limited, m.stdLogSuppressed, m.auditDeniedDropped, m.credits, sessionCollector{db},
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// registerScrubBudget adds the totals of the sessions' scrubbing budgets
// (limits.scrubCpuCores), read at scrape time: what scrubbing their output
// cost the server, and how long their streams were held back for it.
func (m *metrics) registerScrubBudget(stats func() scrub.BudgetStats) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandboxd_scrub_cpu_seconds_total",
			Help: "Server CPU spent scrubbing sessions' output (terminals, exec streams and answers, code runs, service lines, downloads, events)."},
			func() float64 { return stats().CPU.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandboxd_scrub_throttled_seconds_total",
			Help: "Time sessions' output streams waited because their scrubbing was over its CPU budget (limits.scrubCpuCores); two streams waiting at once count twice."},
			func() float64 { return stats().Held.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandboxd_scrub_throttles_total",
			Help: "Waits of sessions' output streams for their scrubbing CPU budget."},
			func() float64 { return float64(stats().Waits) }),
	)
}

// registerSecretsMemory adds the memory the sessions' secrets take in
// their scrubbers (limits.maxSecretsMemoryMiB bounds the running ones').
func (m *metrics) registerSecretsMemory(memory func() (running, cached int)) {
	const help = "Memory the sessions' secrets take in their scrubbers' indexes (bytes): running sessions' (limits.maxSecretsMemoryMiB bounds them), and stopped ones' loaded for a read (evicted when the room is needed)."
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandboxd_scrub_secrets_memory_bytes", Help: help, ConstLabels: prometheus.Labels{"sessions": "running"}},
			func() float64 { r, _ := memory(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandboxd_scrub_secrets_memory_bytes", Help: help, ConstLabels: prometheus.Labels{"sessions": "stopped"}},
			func() float64 { r, c := memory(); return float64(max(c-r, 0)) }),
	)
}

// sessionCollector reads session counts by status from the store at scrape time.
type sessionCollector struct{ db *store.DB }

var sessionsDesc = prometheus.NewDesc("sandboxd_sessions", "Sessions by status.", []string{"status"}, nil)

func (c sessionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- sessionsDesc }

func (c sessionCollector) Collect(ch chan<- prometheus.Metric) {
	if c.db == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := c.db.CountByStatus(ctx)
	if err != nil {
		return
	}
	for _, st := range sandbox.Statuses {
		ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(counts[st]), st)
	}
}

// countRequests is middleware counting every request by route template.
func (m *metrics) countRequests(c *gin.Context) {
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	m.requests.WithLabelValues(route, strconv.Itoa(c.Writer.Status())).Inc()
}

func (m *metrics) handler() gin.HandlerFunc {
	h := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return func(c *gin.Context) { h.ServeHTTP(c.Writer, c.Request) }
}
