package egress

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// sourceServer sends size bytes on every connection, then closes it.
func sourceServer(b *testing.B, size int) net.Listener {
	chunk := blob(64 << 10)
	return tcpServer(b, func(c net.Conn) {
		for left := size; left > 0; left -= len(chunk) {
			if _, err := c.Write(chunk[:min(left, len(chunk))]); err != nil {
				return
			}
		}
	})
}

func connectVia(b *testing.B, proxyAddr, target string) net.Conn {
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"); err != nil {
		b.Fatal(err)
	}
	reply := make([]byte, len(connectOK))
	if _, err := io.ReadFull(c, reply); err != nil || !bytes.Equal(reply, connectOK) {
		b.Fatalf("CONNECT: %q %v", reply, err)
	}
	return c
}

// BenchmarkEgressDownload downloads the same bytes directly and through a
// CONNECT tunnel (plain TCP on loopback) in each iteration and reports both
// throughputs, their ratio, and the connection setup latency the proxy
// adds (p50 of dial+CONNECT+reply minus p50 of a direct dial).
func BenchmarkEgressDownload(b *testing.B) {
	const size = 32 << 20
	src := sourceServer(b, size)
	echo := echoServer(b)
	sp, ep := portOf(b, src.Addr().String()), portOf(b, echo.Addr().String())
	e := newEnv(b, testConfig(sp, ep))
	proxyAddr := e.serve("bench", 0, 1<<62)
	target := fmt.Sprintf("allowed.test:%d", sp)
	buf := make([]byte, 64<<10)

	var direct, proxied time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		c, err := net.Dial("tcp", src.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.CopyBuffer(io.Discard, c, buf)
		c.Close()
		direct += time.Since(t0)
		if n != size {
			b.Fatalf("direct: %d bytes", n)
		}

		t0 = time.Now()
		c = connectVia(b, proxyAddr, target)
		n, _ = io.CopyBuffer(io.Discard, c, buf)
		c.Close()
		proxied += time.Since(t0)
		if n != size {
			b.Fatalf("proxied: %d bytes", n)
		}
	}
	b.StopTimer()
	mb := float64(size) * float64(b.N) / (1 << 20)
	b.ReportMetric(mb/direct.Seconds(), "direct-MB/s")
	b.ReportMetric(mb/proxied.Seconds(), "proxy-MB/s")
	b.ReportMetric(direct.Seconds()/proxied.Seconds(), "proxy/direct")

	const samples = 200
	var ds, ps []time.Duration
	etarget := fmt.Sprintf("allowed.test:%d", ep)
	for i := 0; i < samples; i++ {
		t0 := time.Now()
		c, err := net.Dial("tcp", echo.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(t0))
		c.Close()
		t0 = time.Now()
		c = connectVia(b, proxyAddr, etarget)
		ps = append(ps, time.Since(t0))
		c.Close()
	}
	slices.Sort(ds)
	slices.Sort(ps)
	b.ReportMetric(float64((ps[samples/2] - ds[samples/2]).Microseconds()), "setup-added-p50-µs")
}
