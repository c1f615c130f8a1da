package server

import (
	"strings"
	"testing"
)

func TestMetricsEndpoint(t *testing.T) {
	e := newAPIEnv(t)
	e.provision(e.token, map[string]any{"sessionId": "m1"})
	if rec := e.exec(e.token, "m1", map[string]any{"action": "exec", "command": "true"}); rec.Code != 200 {
		t.Fatalf("exec: %d", rec.Code)
	}
	rec := e.do("GET", "/metrics", "", nil)
	body := rec.Body.String()
	for _, want := range []string{`sandboxd_sessions{status="running"} 1`, "sandboxd_provision_seconds_count 1", "sandboxd_exec_seconds_count 1", `sandboxd_http_requests_total{code="201",route="/v1/sandbox"} 1`,
		"sandboxd_disk_pressure_stops_total 0", "sandboxd_data_dir_free_bytes "} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(body, "m1") {
		t.Error("metrics mention a session id")
	}
}
