package server

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"sandboxd/configs"
	"sandboxd/streams/scrub"
)

// loadScrubber compiles the pattern rules of configs/scrubber.yaml. The
// rules are embedded and tested, so a failure here is a build defect.
func loadScrubber() *scrub.Set {
	b, err := configs.FS.ReadFile("scrubber.yaml")
	if err != nil {
		panic("scrubber rules: " + err.Error())
	}
	rules, err := scrub.LoadRules(b)
	if err != nil {
		panic("scrubber rules: " + err.Error())
	}
	set, err := scrub.NewSet(rules)
	if err != nil {
		panic("scrubber rules: " + err.Error())
	}
	return set
}

// redactions exposes the scrubber's counters (per rule, and "value" for
// all known values together: secret names are not metric labels).
type redactions struct{ set *scrub.Set }

var redactionsDesc = prometheus.NewDesc("sandboxd_scrubber_redactions_total", "Secrets redacted from output, by rule (known values as \"value\").", []string{"rule"}, nil)

func (r redactions) Describe(ch chan<- *prometheus.Desc) { ch <- redactionsDesc }

func (r redactions) Collect(ch chan<- prometheus.Metric) {
	values := int64(0)
	for k, n := range r.set.Counts() {
		if len(k) > 6 && k[:6] == "value:" {
			values += n
			continue
		}
		ch <- prometheus.MustNewConstMetric(redactionsDesc, prometheus.CounterValue, float64(n), k)
	}
	ch <- prometheus.MustNewConstMetric(redactionsDesc, prometheus.CounterValue, float64(values), "value")
}

// scrubHandler redacts secret patterns from our own log records.
type scrubHandler struct {
	slog.Handler
	set *scrub.Set
}

func (h scrubHandler) Handle(ctx context.Context, r slog.Record) error {
	nr := slog.NewRecord(r.Time, r.Level, h.set.RedactString(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(h.scrubAttr(a))
		return true
	})
	return h.Handler.Handle(ctx, nr)
}

func (h scrubHandler) scrubAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.set.RedactString(v.String()))
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			return slog.String(a.Key, h.set.RedactString(err.Error()))
		}
		return slog.String(a.Key, h.set.RedactString(v.String()))
	case slog.KindGroup:
		attrs := v.Group()
		out := make([]any, 0, len(attrs))
		for _, g := range attrs {
			out = append(out, h.scrubAttr(g))
		}
		return slog.Group(a.Key, out...)
	}
	return a
}

func (h scrubHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = h.scrubAttr(a)
	}
	return scrubHandler{h.Handler.WithAttrs(out), h.set}
}

func (h scrubHandler) WithGroup(name string) slog.Handler {
	return scrubHandler{h.Handler.WithGroup(name), h.set}
}
