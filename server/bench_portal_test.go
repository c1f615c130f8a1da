package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"sandboxd/runsc"
)

// BenchmarkPortal: a server inside a sandbox reached through the portal
// (HTTP proxy on the API route, the agent's relay into the sandbox) against
// the same server reached over the portal's own channel without the proxy
// (a raw HTTP/1.1 request written on a connection from the agent's dial
// op): the channel is the path's ceiling, and the ratio is what the proxy
// costs. Download throughput of 256 MiB, and time to the first byte of a
// small response on a new client connection (p50 of 50).
func BenchmarkPortal(b *testing.B) {
	const size = 256 << 20
	h := startServer(b, realConfig(b))
	const id = "bench-portal"
	h.provision(id, "standard-2")
	h.startUpstream(id, 8000, size)
	rt := h.s.rt.(*runsc.Runtime)
	cid := rt.ContainerID(h.get(id).OrgID, id)
	apiURL := h.ts.URL + "/v1/sandbox/proxy/" + id + "/port/8000"

	// raw sends one request over the channel and reads the answer to EOF;
	// it returns the time to the first byte and the body's length.
	raw := func(path string) (ttfb, total time.Duration, n int64) {
		t0 := time.Now()
		c, err := rt.DialPort(context.Background(), cid, 8000)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path)
		br := bufio.NewReaderSize(c, 256<<10)
		if _, err := br.Peek(1); err != nil {
			b.Fatal(err)
		}
		ttfb = time.Since(t0)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		n, _ = io.Copy(io.Discard, res.Body)
		return ttfb, time.Since(t0), n
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}
	viaProxy := func(path string) (ttfb, total time.Duration, n int64) {
		t0 := time.Now()
		req, _ := http.NewRequest("GET", apiURL+path, nil)
		req.Header.Set("Authorization", "Bearer "+h.token)
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer res.Body.Close()
		br := bufio.NewReaderSize(res.Body, 256<<10)
		br.Peek(1)
		ttfb = time.Since(t0)
		n, _ = io.Copy(io.Discard, br)
		return ttfb, time.Since(t0), n
	}
	mbps := func(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / 1e6 }
	// Warm both paths (the portal pools its upstream connections).
	raw("/headers")
	viaProxy("/headers")
	var dRaw, dProxy []float64
	for range 5 { // interleaved rounds; medians
		_, t, n := raw("/big")
		if n != size {
			b.Fatalf("channel download: %d bytes", n)
		}
		dRaw = append(dRaw, mbps(n, t))
		_, t, n = viaProxy("/big")
		if n != size {
			b.Fatalf("proxy download: %d bytes", n)
		}
		dProxy = append(dProxy, mbps(n, t))
	}
	var tRaw, tProxy []time.Duration
	for range 50 {
		t, _, _ := raw("/headers")
		tRaw = append(tRaw, t)
		t, _, _ = viaProxy("/headers")
		tProxy = append(tProxy, t)
	}
	// The upstream itself, from inside the sandbox over its loopback.
	r := h.sh(id, "curl -sS -o /dev/null -w '%{speed_download}' 127.0.0.1:8000/big")
	var inside float64
	fmt.Sscanf(strings.TrimSpace(r.Stdout), "%f", &inside)

	medF := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	medD := func(v []time.Duration) time.Duration { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(medF(dRaw), "channel-MB/s")
	b.ReportMetric(medF(dProxy), "portal-MB/s")
	b.ReportMetric(medF(dProxy)/medF(dRaw), "portal/channel")
	b.ReportMetric(float64(medD(tProxy).Microseconds()), "portal-ttfb-us")
	b.ReportMetric(float64(medD(tRaw).Microseconds()), "channel-ttfb-us")
	fmt.Printf("portal download of 256 MiB: channel (agent relay, no proxy) %.0f MB/s | through the portal %.0f MB/s (%.2fx) | in-sandbox curl over loopback %.0f MB/s\n",
		medF(dRaw), medF(dProxy), medF(dProxy)/medF(dRaw), inside/1e6)
	fmt.Printf("  time to first byte, new client connection, p50 of 50: channel %v | portal %v (%.2fx)\n",
		medD(tRaw).Round(10*time.Microsecond), medD(tProxy).Round(10*time.Microsecond),
		float64(medD(tProxy))/float64(medD(tRaw)))
}
