package server

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sandboxd/runsc"
)

// BenchmarkEgressDownload: a 256 MB download from a loopback upstream by
// curl inside a sandbox (gVisor netstack, veth, the session's proxy)
// against the same curl on the host straight from the upstream, in the
// same run; and the connection setup the proxy adds (time to the first
// byte of a small response, p50 of 50 fresh connections each way).
func BenchmarkEgressDownload(b *testing.B) {
	const size = 256 << 20
	blob := make([]byte, 1<<20)
	mux := http.NewServeMux()
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		for i := 0; i < size/len(blob); i++ {
			if _, err := w.Write(blob); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	up := httptest.NewServer(mux)
	defer up.Close()
	port := up.Listener.Addr().(*net.TCPAddr).Port

	cfg := realConfig(b)
	cfg.Egress.AllowNetworks = append(cfg.Egress.AllowNetworks, "127.0.0.0/8")
	cfg.Egress.Allowlist = append(cfg.Egress.Allowlist, egressRule("pkgs."+testDomain, port))
	cfg.EgressResolver = testResolver{}
	// standard-2 with room for ten 256 MB downloads in its egress quota.
	z, _ := cfg.Sizes.Resolve("standard-2")
	z.Name, z.EgressMiB = "bench-egress", 64<<10
	cfg.Sizes.List = append(cfg.Sizes.List, z)
	h := startServer(b, cfg)
	h.provision("bench-egress", "bench-egress")
	url := fmt.Sprintf("http://pkgs.%s:%d", testDomain, port)
	direct := fmt.Sprintf("http://127.0.0.1:%d", port)

	// Baseline 2: the same sandbox downloading from an upstream listening in
	// its proxy namespace, without the proxy (gVisor's netstack and the veth
	// only): what remains is what the proxy costs.
	id := h.s.rt.(*runsc.Runtime).ContainerID(h.get("bench-egress").OrgID, "bench-egress")
	nsLn := listenInNetns(b, id+"-px", runsc.ProxyAddr+":8081")
	defer nsLn.Close()
	go http.Serve(nsLn, mux)

	inSandbox := func(args string) time.Duration {
		r := h.exec("bench-egress", map[string]any{"command": "curl -sS -o /dev/null -w '%{time_total}' " + args})
		if r.ExitCode != 0 {
			b.Fatalf("curl %s: %+v", args, r)
		}
		secs, _ := strconv.ParseFloat(strings.TrimSpace(r.Stdout), 64)
		return time.Duration(secs * float64(time.Second))
	}
	// Five interleaved rounds; medians, so one disturbed round does not
	// decide the ratio.
	type result struct{ direct, netns, plain, tunnel float64 }
	rounds := func(host bool) result {
		var dDirect, dNetns, dPlain, dTunnel []time.Duration
		for i := 0; i < 5; i++ {
			if host {
				t0 := time.Now()
				if out, err := exec.Command("curl", "-sS", "--noproxy", "*", "-o", "/dev/null", direct+"/blob").CombinedOutput(); err != nil {
					b.Fatalf("direct: %v %s", err, out)
				}
				dDirect = append(dDirect, time.Since(t0))
			}
			dNetns = append(dNetns, inSandbox("--noproxy '*' http://"+runsc.ProxyAddr+":8081/blob"))
			dPlain = append(dPlain, inSandbox(url+"/blob"))
			// As HTTPS clients (pip, npm, git) use it: a CONNECT tunnel.
			dTunnel = append(dTunnel, inSandbox("--proxytunnel "+url+"/blob"))
		}
		mbps := func(ds []time.Duration) float64 {
			if len(ds) == 0 {
				return 0
			}
			slices.Sort(ds)
			return float64(size) / ds[len(ds)/2].Seconds() / 1e6
		}
		return result{mbps(dDirect), mbps(dNetns), mbps(dPlain), mbps(dTunnel)}
	}
	shared := rounds(true)
	// The same downloads with the sandbox held to CPU 0 and this process
	// (proxy and upstreams) to the others: the proxy's own cost, without
	// its competing with a sandbox that can use every core of the machine.
	var split result
	if restore, err := splitCPUs(id); err != nil {
		fmt.Printf("split-CPU rounds skipped: %v\n", err)
	} else {
		func() {
			defer restore() // also when a round fails
			split = rounds(false)
		}()
	}

	// Setup latency: curl's time to first byte of /small on a new connection.
	loop := "for i in $(seq 50); do curl -sS -o /dev/null -w '%{time_starttransfer}\\n' " + url + "/small; done"
	r := h.sh("bench-egress", loop)
	proxied := p50(b, r.Stdout)
	out, err := exec.Command("bash", "-c", strings.ReplaceAll(loop, url, direct)+" 2>&1").Output()
	if err != nil {
		b.Fatal(err)
	}
	directTTFB := p50(b, string(out))
	// And the same sandbox straight to the listener in its proxy namespace:
	// the setup cost of the proxy alone, gVisor's own connect excluded.
	r = h.sh("bench-egress", strings.ReplaceAll(loop, url, "--noproxy '*' http://"+runsc.ProxyAddr+":8081"))
	netnsTTFB := p50(b, r.Stdout)

	b.ReportMetric(shared.direct, "host-direct-MB/s")
	b.ReportMetric(shared.netns, "sandbox-direct-MB/s")
	b.ReportMetric(shared.plain, "proxy-http-MB/s")
	b.ReportMetric(shared.tunnel, "proxy-connect-MB/s")
	b.ReportMetric(shared.tunnel/shared.netns, "connect/direct")
	fmt.Printf("egress download of 256 MB: host direct %.0f MB/s | sandbox direct to its proxy netns (no proxy) %.0f MB/s\n", shared.direct, shared.netns)
	fmt.Printf("  through the proxy: plain HTTP %.0f MB/s (%.2fx sandbox direct, %.2fx host), CONNECT tunnel %.0f MB/s (%.2fx, %.2fx)\n",
		shared.plain, shared.plain/shared.netns, shared.plain/shared.direct, shared.tunnel, shared.tunnel/shared.netns, shared.tunnel/shared.direct)
	if split.netns > 0 {
		b.ReportMetric(split.tunnel/split.netns, "split-cpu-connect/direct")
		fmt.Printf("  sandbox on CPU 0, proxy on the others: sandbox direct %.0f MB/s | plain HTTP %.0f MB/s (%.2fx) | CONNECT %.0f MB/s (%.2fx)\n",
			split.netns, split.plain, split.plain/split.netns, split.tunnel, split.tunnel/split.netns)
	}
	b.ReportMetric((proxied-netnsTTFB)*1e3, "proxy-setup-ms")
	fmt.Printf("time to first byte, new connection, p50 of 50: host direct %.2f ms | sandbox direct to its proxy netns %.2f ms | sandbox through its proxy %.2f ms (+%.2f ms)\n",
		directTTFB*1e3, netnsTTFB*1e3, proxied*1e3, (proxied-netnsTTFB)*1e3)
}

// splitCPUs holds the sandbox's cgroup to CPU 0 and every thread of this
// process to the other CPUs; restore undoes both. Needs 2+ CPUs and a cpuset
// cgroup (v1 or v2) for the sandbox.
func splitCPUs(id string) (restore func(), err error) {
	n := runtime.NumCPU()
	if n < 2 {
		return nil, fmt.Errorf("%d CPU", n)
	}
	cpus := ""
	for _, line := range strings.Split(readFile("/proc/self/cgroup"), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpuset" {
				cpus = filepath.Join("/sys/fs/cgroup/cpuset", parts[2], id, "cpuset.cpus")
			}
		}
		if parts[1] == "" && cpus == "" {
			cpus = filepath.Join("/sys/fs/cgroup", parts[2], id, "cpuset.cpus")
		}
	}
	old, err := os.ReadFile(cpus)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(cpus, []byte("0"), 0o644); err != nil {
		return nil, err
	}
	var mine, all unix.CPUSet
	for c := 0; c < n; c++ {
		all.Set(c)
		if c > 0 {
			mine.Set(c)
		}
	}
	setAll := func(set *unix.CPUSet) {
		tids, _ := os.ReadDir("/proc/self/task")
		for _, t := range tids {
			if tid, err := strconv.Atoi(t.Name()); err == nil {
				unix.SchedSetaffinity(tid, set)
			}
		}
	}
	setAll(&mine)
	return func() {
		setAll(&all)
		os.WriteFile(cpus, old, 0o644)
	}, nil
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// listenInNetns opens a TCP listener inside a named network namespace.
func listenInNetns(b *testing.B, name, addr string) net.Listener {
	type res struct {
		l   net.Listener
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		ns, err := netns.GetFromName(name)
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			ch <- res{err: err}
			return
		}
		l, err := net.Listen("tcp4", addr)
		ch <- res{l, err}
	}()
	r := <-ch
	if r.err != nil {
		b.Fatal(r.err)
	}
	return r.l
}

func p50(b *testing.B, lines string) float64 {
	var v []float64
	for _, f := range strings.Fields(lines) {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil {
			b.Fatalf("not a number: %q", f)
		}
		v = append(v, x)
	}
	if len(v) == 0 {
		b.Fatal("no samples")
	}
	sort.Float64s(v)
	return v[len(v)/2]
}
