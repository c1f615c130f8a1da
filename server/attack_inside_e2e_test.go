package server

// Attacks from inside a sandbox (issue 15, docs/SECURITY.md): one real
// server, an attacker sandbox in one organization (with a second session
// of the same organization beside it) and a bystander in another. Each
// attack is a subtest that checks the attacker is contained where it
// should be (its process limit, its memory cgroup, its disk, its output
// cap, its proxy's connection cap and header timeout, a network with
// nothing in it but its proxy), that the service stays correct (kill
// verified, the session's true state, nothing leaked), and measures the
// bystanders meanwhile: a REST exec of true, a CPU-bound loop, a small
// write with fsync and a fetch through its own egress proxy inside the
// bystander, an API call, and an exec in the attacker's neighbour. The
// figures (median and worst ratio to a baseline taken just before each
// attack) go to test-output/attack_inside.json; only a loose bound is
// asserted (every probe answers, within a generous time): the machine is
// shared.
// make test runs the quick size; make test-hardening (SANDBOXD_HARDENING=1)
// holds each attack longer and scales its counts up.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"sandboxd/egress"
	"sandboxd/runsc"
	"sandboxd/server/sandbox"
	"sandboxd/server/sessionlog"
)

// insideScale is how hard and how long the attacks push.
type insideScale struct {
	name        string
	hold        time.Duration // how long a standing attack is held while probed
	baseline    int           // baseline samples, before each attack
	procs       int           // processes the many-processes attack asks for
	bombRounds  int           // fork bombs, each held bombHold then killed
	bombHold    time.Duration // how long each bomb runs before its kill
	connsOver   int           // connections past the proxy's per-session cap
	slowConns   int           // slowloris connections (at most the cap)
	streamLines int           // lines read through an exec stream
}

func attackScale() insideScale {
	if hardening() {
		return insideScale{name: "hardening", hold: 60 * time.Second, baseline: 5, procs: 5000, bombRounds: 6, bombHold: 20 * time.Second, connsOver: 1000, slowConns: 1 << 20, streamLines: 10_000_000}
	}
	return insideScale{name: "quick", hold: 8 * time.Second, baseline: 3, procs: 1000, bombRounds: 2, bombHold: 8 * time.Second, connsOver: 64, slowConns: 128, streamLines: 1_000_000}
}

// probeMetrics are the bystanders' measures, in milliseconds.
var probeMetrics = []string{"execMs", "cpuMs", "ioMs", "netMs", "apiMs", "peerExecMs"}

// bystanderProbe runs inside the bystander: a CPU-bound loop, a 1 MiB
// write with fsync on its disk, and a fetch through its egress proxy, each
// timed inside (microseconds).
const bystanderProbe = `i=0; a=${EPOCHREALTIME/./}
while (( i < 20000 )); do (( i++ )); done
b=${EPOCHREALTIME/./}
dd if=/dev/zero of=/workspace/.probe bs=64k count=16 conv=fsync status=none || echo ddfailed
c=${EPOCHREALTIME/./}
code=$(curl -s -o /dev/null -w '%{http_code}' -m 60 "$1")
d=${EPOCHREALTIME/./}
echo "cpu=$((b-a)) io=$((c-b)) net=$((d-c)) code=$code"
`

// insideEnv is the test's server, sessions and measurements.
type insideEnv struct {
	t         *testing.T
	h         *harness
	u         *upstreams
	sc        insideScale
	tokB      string // the bystander organization's owner
	client    *http.Client
	fetchURL  string
	baseline  map[string]float64
	mu        sync.Mutex
	attacks   []map[string]any
	after     map[string]any // the server's goroutines and descriptors
	connCap   int
	headerTO  time.Duration
	startGor  int
	startFDs  int
	atkCID    string
	atkLimits struct{ pids, procs int } // host tasks, guest processes
}

// callAs is h.call for another token and any goroutine: it returns
// errors instead of failing, and gives up after 2 minutes.
func (e *insideEnv) callAs(token, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	req, _ := http.NewRequest(method, e.h.ts.URL+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (e *insideEnv) execAs(token, id, cmd string) (execResponse, time.Duration, error) {
	t0 := time.Now()
	code, b, err := e.callAs(token, "POST", "/v1/sandbox/terminal/"+id, map[string]any{"action": "exec", "command": cmd, "timeoutMs": 90000})
	took := time.Since(t0)
	var r execResponse
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%d %.300s", code, b)
	}
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	return r, took, err
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// sample measures the bystanders once.
func (e *insideEnv) sample() (map[string]float64, error) {
	m := map[string]float64{}
	r, took, err := e.execAs(e.tokB, "by", "true")
	if err != nil || r.ExitCode != 0 {
		return nil, fmt.Errorf("bystander exec: %v %+v", err, r)
	}
	m["execMs"] = msOf(took)
	r, _, err = e.execAs(e.tokB, "by", "bash /tmp/probe.sh "+e.fetchURL)
	var cpu, io_, netw int64
	var code string
	if err != nil || r.ExitCode != 0 {
		return nil, fmt.Errorf("bystander probe: %v %+v", err, r)
	}
	if n, _ := fmt.Sscanf(r.Stdout, "cpu=%d io=%d net=%d code=%s", &cpu, &io_, &netw, &code); n != 4 || code != "200" {
		return nil, fmt.Errorf("bystander probe: %q %q", r.Stdout, r.Stderr)
	}
	m["cpuMs"], m["ioMs"], m["netMs"] = float64(cpu)/1000, float64(io_)/1000, float64(netw)/1000
	t0 := time.Now()
	c, b, err := e.callAs(e.tokB, "GET", "/v1/sandbox/by", nil)
	if err != nil || c != http.StatusOK || !strings.Contains(string(b), `"status":"running"`) {
		return nil, fmt.Errorf("bystander GET: %d %v %.300s", c, err, b)
	}
	m["apiMs"] = msOf(time.Since(t0))
	r, took, err = e.execAs(e.h.token, "peer", "true")
	if err != nil || r.ExitCode != 0 {
		return nil, fmt.Errorf("neighbour exec: %v %+v", err, r)
	}
	m["peerExecMs"] = msOf(took)
	return m, nil
}

// probe samples until stop is closed (at least once) and sends what it
// measured on the returned channel.
type probeResult struct {
	samples []map[string]float64
	fails   []string
}

func (e *insideEnv) probe(stop <-chan struct{}) <-chan probeResult {
	out := make(chan probeResult, 1)
	go func() {
		var res probeResult
		for {
			m, err := e.sample()
			if err != nil {
				res.fails = append(res.fails, err.Error())
			} else {
				res.samples = append(res.samples, m)
			}
			select {
			case <-stop:
				out <- res
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func column(samples []map[string]float64, k string) []float64 {
	var out []float64
	for _, s := range samples {
		out = append(out, s[k])
	}
	return out
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// baselineNow samples the bystanders sc.baseline times and returns each
// measure's median.
func (e *insideEnv) baselineNow(t *testing.T) map[string]float64 {
	t.Helper()
	var base []map[string]float64
	for range e.sc.baseline {
		m, err := e.sample()
		if err != nil {
			t.Fatalf("baseline: %v", err)
		}
		base = append(base, m)
	}
	med := map[string]float64{}
	for _, k := range probeMetrics {
		med[k] = round2(median(column(base, k)))
	}
	return med
}

// attack runs fn as a subtest while the bystanders are probed, and
// records the slowdown and fn's facts. The slowdown is against a baseline
// taken just before: the load of the machine's other work drifts more
// than the attacks move the figures.
func (e *insideEnv) attack(name string, fn func(t *testing.T, facts map[string]any)) {
	e.t.Run(name, func(t *testing.T) {
		base := e.baselineNow(t)
		facts := map[string]any{}
		stop := make(chan struct{})
		res := e.probe(stop)
		t0 := time.Now()
		// Recorded and checked even when fn stops the subtest.
		defer func() {
			close(stop)
			pr := <-res
			e.record(t, name, time.Since(t0), base, facts, pr)
		}()
		fn(t, facts)
	})
}

// record adds an attack's figures to the report and checks the loose
// bound: every probe answered, each exec and API call within a minute.
func (e *insideEnv) record(t *testing.T, name string, took time.Duration, base map[string]float64, facts map[string]any, pr probeResult) {
	rec := map[string]any{"attack": name, "seconds": round2(took.Seconds()), "samples": len(pr.samples), "baselineMs": base, "facts": facts}
	med, worst, medR, worstR := map[string]float64{}, map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, k := range probeMetrics {
		col := column(pr.samples, k)
		if len(col) == 0 {
			continue
		}
		med[k], worst[k] = round2(median(col)), round2(slicesMax(col))
		if b := base[k]; b > 0 {
			medR[k], worstR[k] = round2(med[k]/b), round2(worst[k]/b)
		}
	}
	rec["medianMs"], rec["maxMs"], rec["medianRatio"], rec["maxRatio"] = med, worst, medR, worstR
	if len(pr.fails) > 0 {
		rec["probeFailures"] = pr.fails
	}
	e.mu.Lock()
	e.attacks = append(e.attacks, rec)
	e.mu.Unlock()
	for _, f := range pr.fails {
		t.Errorf("a bystander probe failed during %s: %s", name, f)
	}
	if len(pr.samples) == 0 {
		t.Errorf("no bystander sample during %s", name)
	}
	for _, k := range []string{"execMs", "peerExecMs", "apiMs"} {
		if w := worst[k]; w > 60_000 {
			t.Errorf("%s: the bystanders' %s took %.0f ms", name, k, w)
		}
	}
	t.Logf("%s: %d samples; median ratio %v; max ratio %v; %v", name, len(pr.samples), medR, worstR, facts)
}

func slicesMax(v []float64) float64 {
	m := math.Inf(-1)
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// runscPS counts a sandbox's processes from outside (runsc ps): at its
// process limit nothing of the user's can start, ps included.
func (e *insideEnv) runscPS(cid string) int {
	out, err := exec.Command(e.h.cfg.Runsc.Binary, "--root", filepath.Join(e.h.cfg.DataDir, "runsc"), "ps", "--format", "json", cid).Output()
	var ps []int
	if err != nil || json.Unmarshal(out, &ps) != nil {
		return -1
	}
	return len(ps)
}

// cgroupFile reads a number from one of a sandbox's cgroup files (v1 or
// v2 names), -1 if none has it.
func cgroupFile(cid string, names ...string) int64 {
	for _, dir := range prefixedCgroups(cid) {
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(dir, n))
			if err != nil {
				continue
			}
			if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				return v
			}
		}
	}
	return -1
}

// killAll sends {"action":"kill"} to a session and checks the answer is
// verified: killed true, no survivor. It returns how long it took (ms).
func (e *insideEnv) killAll(id string) (int64, error) {
	t0 := time.Now()
	code, b, err := e.callAs(e.h.token, "POST", "/v1/sandbox/terminal/"+id, map[string]any{"action": "kill"})
	var ans struct {
		Killed    *bool
		Survivors *int
	}
	if json.Unmarshal(b, &ans); err != nil || code != 200 || ans.Killed == nil || !*ans.Killed || ans.Survivors == nil || *ans.Survivors != 0 {
		return 0, fmt.Errorf("kill: %d %v %s", code, err, b)
	}
	return time.Since(t0).Milliseconds(), nil
}

// psBack waits until the attacker has no more processes than baseline
// (the agent and its warm shells) as runsc ps sees them.
func (e *insideEnv) psBack(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n := e.runscPS(e.atkCID)
		if n >= 0 && n <= base+1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after kill: %d processes in the attacker, %d before the attack", n, base)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func TestRealAttackInside(t *testing.T) {
	sc := attackScale()
	// As the server does at start (and systemd's LimitNOFILE): the proxy's
	// connection budget is a share of the open-file limit.
	RaiseFileLimit()
	u := startUpstreams(t)
	cfg := egressTestConfig(t, u)
	// A node's worth of sandboxes whose proxy connections fit this
	// process's open-file limit (20,000 in the test container; the systemd
	// unit's 1,048,576 fits 1,000): each session gets the full cap (256),
	// not the 16 guaranteed when they do not fit.
	cfg.Limits.MaxSandboxes = 16
	h := startServer(t, cfg)
	e := &insideEnv{t: t, h: h, u: u, sc: sc, client: &http.Client{Timeout: 2 * time.Minute}}
	e.fetchURL = fmt.Sprintf("http://pkgs.%s:%d/small", testDomain, u.httpPort)
	e.connCap, _, _ = egress.ConnLimits(cfg.Limits.MaxSandboxes)
	e.headerTO = cfg.Egress.HeaderTimeout
	if e.headerTO <= 0 {
		e.headerTO = 10 * time.Second
	}
	ctx := context.Background()
	pB, tokB, err := h.s.db.CreateOrg(ctx, "bystanders", "bystander")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.s.db.SetPlan(ctx, pB.Org.ID, "team"); err != nil {
		t.Fatal(err)
	}
	e.tokB = tokB
	if code, b, err := e.callAs(tokB, "POST", "/v1/sandbox", map[string]any{"sessionId": "by", "size": "test-egress"}); err != nil || code != http.StatusCreated {
		t.Fatalf("bystander: %d %v %s", code, err, b)
	}
	atk := h.provision("atk", "test-egress")
	h.provision("peer", "test-tiny")
	e.atkCID = cidOf(cfg, atk.OrgID, "atk")
	for _, z := range cfg.Sizes.List {
		if z.Name == "test-egress" {
			e.atkLimits.pids, e.atkLimits.procs = int(runsc.HostTasks(int64(z.Pids))), int(runsc.DefaultProcesses(int64(z.Pids)))
		}
	}
	if code, b, err := e.callAs(tokB, "POST", "/v1/sandbox/terminal/by", map[string]any{"action": "exec", "command": "cat > /tmp/probe.sh", "stdin": bystanderProbe}); err != nil || code != 200 {
		t.Fatalf("probe script: %d %v %s", code, err, b)
	}
	// The bystander serves on its port 8000, as a sandbox may: the
	// attacker must not reach it.
	if code, b, err := e.callAs(tokB, "POST", "/v1/sandbox/terminal/by", map[string]any{"action": "exec",
		"command": "(python3 -m http.server 8000 >/dev/null 2>&1 &); for i in $(seq 50); do curl -s --noproxy '*' -o /dev/null -w '%{http_code}' http://10.200.0.2:8000/ && break; sleep 0.2; done"}); err != nil || code != 200 || !strings.Contains(string(b), `200","stderr"`) {
		t.Fatalf("bystander server: %d %v %s", code, err, b)
	}

	// The bystanders before any attack (after one sample to warm up).
	if _, err := e.sample(); err != nil {
		t.Fatalf("first sample: %v", err)
	}
	e.baseline = e.baselineNow(t)
	e.startGor = runtime.NumGoroutine()
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		e.startFDs = len(ents)
	}
	defer e.report()

	e.attack("network", e.attackNetwork)
	e.attack("proxy connections", e.attackConnections)
	e.attack("slowloris on its proxy", e.attackSlowloris)
	e.attack("output flood", e.attackOutputFlood)
	e.attack("million-line log", e.attackMillionLines)
	e.attack("many processes", e.attackManyProcesses)
	e.attack("fork bomb", e.attackForkBomb)
	e.attack("disk fill", e.attackDiskFill)
	e.attack("inode fill", e.attackInodeFill)
	e.attack("memory bomb", e.attackMemoryBomb)

	t.Run("the service after the attacks", e.checkAfter)
}

// report writes test-output/attack_inside.json (attack_inside.quick.json
// at the quick size) and logs a table.
func (e *insideEnv) report() {
	out := map[string]any{"scale": e.sc.name, "holdSeconds": e.sc.hold.Seconds(), "firstBaselineMs": e.baseline, "attacks": e.attacks, "after": e.after,
		"proxyConnsPerSession": e.connCap, "cpus": runtime.NumCPU()}
	b, _ := json.MarshalIndent(out, "", "  ")
	os.MkdirAll("test-output", 0o755)
	name := "attack_inside.json" // the hardening record, committed
	if os.Getenv("SANDBOXD_HARDENING") == "" {
		name = "attack_inside.quick.json"
	}
	os.WriteFile(filepath.Join("test-output", name), b, 0o644)
	var tb strings.Builder
	fmt.Fprintf(&tb, "bystander slowdown, median/max ratio to the baseline taken just before each attack (before any: %v ms)\n%-24s", e.baseline, "attack")
	for _, k := range probeMetrics {
		fmt.Fprintf(&tb, " %14s", k)
	}
	for _, a := range e.attacks {
		fmt.Fprintf(&tb, "\n%-24s", a["attack"])
		mr, _ := a["medianRatio"].(map[string]float64)
		xr, _ := a["maxRatio"].(map[string]float64)
		for _, k := range probeMetrics {
			fmt.Fprintf(&tb, " %14s", fmt.Sprintf("%.2f/%.2f", mr[k], xr[k]))
		}
	}
	e.t.Log(tb.String())
}

// The network from inside: nothing but its own proxy, which refuses every
// internal destination. Each probe's exact failure is checked.
const networkProbe = `
import errno, json, socket, sys
api_port, host_port, http_port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
host_addrs = [a for a in sys.argv[4].split(",") if a]
res = {}

def why(e):
    if isinstance(e, socket.timeout):
        return "timeout"
    if isinstance(e, socket.gaierror):
        return "gaierror"
    if isinstance(e, OSError) and e.errno:
        return errno.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__

def fam(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET

def sockaddr(host, port):
    if "%" in host:  # a link-local address and its link
        a, dev = host.split("%")
        return (a, port, 0, socket.if_nametoindex(dev))
    return (host, port)

def tcp(name, host, port):
    s = socket.socket(fam(host), socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(sockaddr(host, port))
        res[name] = "connected"
    except Exception as e:
        res[name] = why(e)
    finally:
        s.close()

DNSQ = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01"
def udp(name, host, port=53):
    s = socket.socket(fam(host), socket.SOCK_DGRAM)
    s.settimeout(2)
    try:
        s.sendto(DNSQ, sockaddr(host, port))
        s.recv(512)
        res[name] = "answered"
    except Exception as e:
        res[name] = why(e)
    finally:
        s.close()

def head(s):
    data = b""
    while b"\r\n\r\n" not in data:
        b = s.recv(4096)
        if not b:
            break
        data += b
    return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "none"

def connect(name, target):
    try:
        s = socket.create_connection(("10.200.0.1", 3128), timeout=10)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        res[name] = head(s)
        s.close()
    except Exception as e:
        res[name] = why(e)

def get(name, url, host):
    try:
        s = socket.create_connection(("10.200.0.1", 3128), timeout=10)
        s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (url, host)).encode())
        res[name] = head(s)
        s.close()
    except Exception as e:
        res[name] = why(e)

for a in host_addrs:
    tcp("direct host %s api" % a, a, api_port)
    tcp("direct host %s listener" % a, a, host_port)
for port in (22, 53, 80, 443, 3129, api_port, host_port):
    tcp("direct gateway:%d" % port, "10.200.0.1", port)
tcp("direct loopback api", "127.0.0.1", api_port)
tcp("direct loopback6 api", "::1", api_port)
tcp("direct other sandbox 10.200.0.2:8000", "10.200.0.2", 8000)
tcp("direct other subnet 10.200.1.2:8000", "10.200.1.2", 8000)
tcp("direct metadata", "169.254.169.254", 80)
tcp("direct metadata6", "fd00:ec2::254", 80)
tcp("direct internet", "1.1.1.1", 443)
tcp("direct internet6", "2606:4700:4700::1111", 443)
# Link-local IPv6 on the veth: the proxy namespace's end, any address.
tcp("direct link-local6", "fe80::1%eth0", 3128)
udp("direct link-local6 all nodes", "ff02::1%eth0")
with open("/proc/net/if_inet6") as f:
    res["ipv6 addresses"] = ",".join(l.split()[0] + "@" + l.split()[-1] for l in f if l.split()[-1] != "lo") or "none"
udp("dns udp 8.8.8.8", "8.8.8.8")
udp("dns udp gateway", "10.200.0.1")
udp("dns udp6", "2001:4860:4860::8888")
tcp("dns tcp 8.8.8.8", "8.8.8.8", 53)
tcp("dns tcp gateway", "10.200.0.1", 53)
try:
    socket.getaddrinfo("example.com", 443)
    res["dns getaddrinfo"] = "resolved"
except Exception as e:
    res["dns getaddrinfo"] = why(e)
for a in ["127.0.0.1", "[::1]", "localhost", "10.200.0.1", "[fd00:ec2::254]"] + ["[%s]" % a if ":" in a else a for a in host_addrs]:
    connect("proxy CONNECT %s api" % a, "%s:%d" % (a, api_port))
connect("proxy CONNECT metadata", "169.254.169.254:80")
connect("proxy CONNECT metadata6", "[fd00:ec2::254]:80")
connect("proxy CONNECT metadata name", "metadata.google.internal:80")
connect("proxy CONNECT itself", "10.200.0.1:3128")
connect("proxy CONNECT other sandbox", "10.200.0.2:8000")
connect("proxy CONNECT allowlisted name, api port", "pkgs.sandboxd.test:%d" % api_port)
connect("proxy CONNECT dns", "8.8.8.8:53")
connect("proxy CONNECT dns6", "[2001:4860:4860::8888]:53")
get("proxy GET api", "http://127.0.0.1:%d/v1/sandbox" % api_port, "127.0.0.1:%d" % api_port)
get("proxy GET metadata", "http://169.254.169.254/latest/meta-data/", "169.254.169.254")
get("proxy GET metadata6", "http://[fd00:ec2::254]/latest/meta-data/", "[fd00:ec2::254]")
get("proxy GET allowlisted name, api port", "http://pkgs.sandboxd.test:%d/v1/sandbox" % api_port, "pkgs.sandboxd.test:%d" % api_port)
print(json.dumps(res))
`

func (e *insideEnv) attackNetwork(t *testing.T, facts map[string]any) {
	h := e.h
	// A listener on every host address, as TestRealEgress's.
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost-reached"))
			c.Close()
		}
	}()
	hostPort := ln.Addr().(*net.TCPAddr).Port
	apiPort := h.ts.Listener.Addr().(*net.TCPAddr).Port
	var hostAddrs []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			hostAddrs = append(hostAddrs, ipn.IP.String())
		}
	}
	t0 := time.Now()
	r := h.exec("atk", map[string]any{"command": fmt.Sprintf("python3 - %d %d %d '%s'", apiPort, hostPort, e.u.httpPort, strings.Join(hostAddrs, ",")),
		"stdin": networkProbe, "timeoutMs": 300000})
	var got map[string]string
	if err := json.Unmarshal([]byte(r.Stdout), &got); err != nil || r.ExitCode != 0 {
		t.Fatalf("network probe: %+v", r)
	}
	facts["probes"], facts["seconds"] = len(got), round2(time.Since(t0).Seconds())
	want := func(name string, alts ...string) {
		t.Helper()
		v, ok := got[name]
		if !ok {
			t.Errorf("%s: not probed", name)
			return
		}
		for _, a := range alts {
			if v == a {
				return
			}
		}
		t.Errorf("%s: %s, want %s", name, v, strings.Join(alts, " or "))
	}
	// No route but to the proxy's /30: the host, the internet, the
	// metadata address and everything IPv6 but loopback are unreachable.
	const unreach = "ENETUNREACH"
	for _, a := range hostAddrs {
		want("direct host "+a+" api", unreach)
		want("direct host "+a+" listener", unreach)
	}
	for _, n := range []string{"direct other subnet 10.200.1.2:8000", "direct metadata", "direct metadata6", "direct internet",
		"direct internet6", "direct link-local6", "direct link-local6 all nodes", "dns udp 8.8.8.8", "dns udp6", "dns tcp 8.8.8.8"} {
		want(n, unreach)
	}
	// No IPv6 on the veth at all (runsc turns it off on both ends): only
	// loopback has an address.
	want("ipv6 addresses", "none")
	// The proxy's side of the veth has no other socket: every other port
	// there is refused, DNS included; and its own loopback and address are
	// the sandbox's own (the bystander serves on 10.200.0.2:8000 in its
	// sandbox: here nothing listens).
	for _, port := range []int{22, 53, 80, 443, 3129, apiPort, hostPort} {
		want(fmt.Sprintf("direct gateway:%d", port), "ECONNREFUSED")
	}
	want("direct loopback api", "ECONNREFUSED")
	want("direct loopback6 api", "ECONNREFUSED")
	want("direct other sandbox 10.200.0.2:8000", "ECONNREFUSED")
	want("dns tcp gateway", "ECONNREFUSED")
	want("dns udp gateway", "ECONNREFUSED", "timeout")
	// No resolver: names are resolved by the proxy only.
	want("dns getaddrinfo", "gaierror")
	// The proxy refuses every internal address and the API's port.
	for n := range got {
		if strings.HasPrefix(n, "proxy ") {
			want(n, "403")
		}
	}
	for n, v := range got {
		if v == "connected" || v == "answered" || v == "resolved" || v == "200" {
			t.Errorf("%s: %s", n, v)
		}
	}
	if t.Failed() {
		t.Logf("probes: %v", got)
	}
}

// Connections to its own proxy past the per-session cap are closed at
// once; the tunnels within it work; the count is released when they close.
const connsProbe = `
import errno, socket, sys, time
n, hold, port = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
target = "pkgs.sandboxd.test:%d" % port
tunnels, refused, other = [], {}, {}
for i in range(n):
    try:
        s = socket.create_connection(("10.200.0.1", 3128), timeout=10)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        resp = b""
        while b"\r\n\r\n" not in resp:
            b = s.recv(4096)
            if not b:
                break
            resp += b
        if resp.startswith(b"HTTP/1.1 200"):
            tunnels.append(s)
            continue
        k = resp.split(b"\r\n")[0].decode() or "EOF"
        (refused if k == "EOF" else other)[k] = (refused if k == "EOF" else other).get(k, 0) + 1
        s.close()
    except OSError as e:
        k = errno.errorcode.get(e.errno, str(e))
        refused[k] = refused.get(k, 0) + 1
# Every tunnel carries a request.
ok = 0
for s in tunnels:
    s.sendall(b"GET /small HTTP/1.1\r\nHost: pkgs.sandboxd.test\r\n\r\n")
for s in tunnels:
    data = b""
    while b"hello from upstream" not in data:
        b = s.recv(4096)
        if not b:
            break
        data += b
    ok += b"hello from upstream" in data
print("tunnels=%d working=%d refused=%s other=%s" % (len(tunnels), ok, sorted(refused.items()), sorted(other.items())), flush=True)
# Held, while new connections churn as fast as they can: each is accepted
# and closed at once.
churn, served, t0 = 0, 0, time.time()
while time.time() - t0 < hold:
    try:
        s = socket.create_connection(("10.200.0.1", 3128), timeout=10)
        s.sendall(b"GET http://pkgs.sandboxd.test:%d/small HTTP/1.1\r\nHost: pkgs.sandboxd.test:%d\r\n\r\n" % (port, port))
        served += b"hello" in s.recv(4096)
        s.close()
    except OSError:
        pass
    churn += 1
print("churn=%d served=%d" % (churn, served))
for s in tunnels:
    s.close()
`

func (e *insideEnv) attackConnections(t *testing.T, facts map[string]any) {
	n := e.connCap + e.sc.connsOver
	t0 := time.Now()
	r := e.h.exec("atk", map[string]any{"command": fmt.Sprintf("python3 - %d %f %d", n, e.sc.hold.Seconds(), e.u.httpPort), "stdin": connsProbe, "timeoutMs": 600000})
	facts["asked"], facts["cap"], facts["seconds"] = n, e.connCap, round2(time.Since(t0).Seconds())
	var tunnels, working int
	fmt.Sscanf(r.Stdout, "tunnels=%d working=%d", &tunnels, &working)
	facts["tunnels"], facts["answer"] = tunnels, strings.TrimSpace(r.Stdout)
	var churn, served int
	if i := strings.Index(r.Stdout, "churn="); i >= 0 {
		fmt.Sscanf(r.Stdout[i:], "churn=%d served=%d", &churn, &served)
	}
	facts["churnedConnections"], facts["churnPerSecond"] = churn, round2(float64(churn)/e.sc.hold.Seconds())
	// Exactly the cap (the attacker has no other proxy connection), each
	// working; none past it, the churn's included.
	if r.ExitCode != 0 || tunnels != e.connCap || working != tunnels || !strings.Contains(r.Stdout, "refused=[(") || strings.Contains(r.Stdout, "other=[(") ||
		churn < 10 || served != 0 {
		t.Fatalf("%d connections, cap %d: %+v", n, e.connCap, r)
	}
	// Refused connections are reported (rate-limited) in the session's log.
	if logs := e.h.logsText("atk"); !strings.Contains(logs, egress.ReasonTooManyConns) {
		t.Errorf("no %s event: %.2000s", egress.ReasonTooManyConns, logs[max(0, len(logs)-2000):])
	}
	// Closed, they are released: its own proxy serves it again.
	e.waitOwnProxy(t, facts)
}

// waitOwnProxy waits until the attacker's own fetch through its proxy
// works again.
func (e *insideEnv) waitOwnProxy(t *testing.T, facts map[string]any) {
	t.Helper()
	t0 := time.Now()
	for {
		r := e.h.sh("atk", "curl -s -m 10 "+e.fetchURL)
		if r.Stdout == "hello from upstream" {
			facts["ownProxyBackMs"] = time.Since(t0).Milliseconds()
			return
		}
		if time.Since(t0) > 30*time.Second {
			t.Fatalf("the attacker's own proxy after the attack: %+v", r)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Slowloris: connections that send a request head a byte at a time are
// cut by the proxy's header timeout; nothing is answered.
const slowlorisProbe = `
import select, socket, sys, time
n, port, limit = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
head = ("GET http://pkgs.sandboxd.test:%d/small HTTP/1.1\r\nHost: pkgs.sandboxd.test:%d\r\nX-Slow: " % (port, port)).encode() + b"a" * 100000
socks, lives, answers, t0 = {}, [], {}, time.time()
for i in range(n):
    s = socket.create_connection(("10.200.0.1", 3128), timeout=10)
    s.setblocking(False)
    socks[s] = [time.time(), 0]
def end(s, now):
    lives.append(now - socks.pop(s)[0])
    s.close()
while socks and time.time() - t0 < limit:
    r, _, _ = select.select(list(socks), [], [], 0.5)
    now = time.time()
    for s in r:
        try:
            d = s.recv(4096)
        except OSError:
            d = b""
        if d:
            k = d.split(b"\r\n")[0].decode("latin1")
            answers[k] = answers.get(k, 0) + 1
        end(s, now)
    for s, st in list(socks.items()):
        try:
            s.send(head[st[1]:st[1] + 1])
            st[1] += 1
        except OSError:
            end(s, now)
lives.sort()
print("closed=%d open=%d min=%.1f median=%.1f max=%.1f answers=%s" % (len(lives), len(socks), lives[0] if lives else -1,
      lives[len(lives) // 2] if lives else -1, lives[-1] if lives else -1, sorted(answers.items())))
`

// slowAnswers: nothing, or net/http's 400 when the header timeout cut a
// request head mid-way.
var slowAnswers = regexp.MustCompile(`^\[(\('HTTP/1.1 400 Bad Request', \d+\))?\]\n$`)

func (e *insideEnv) attackSlowloris(t *testing.T, facts map[string]any) {
	n := min(e.sc.slowConns, e.connCap)
	limit := e.headerTO + 20*time.Second
	r := e.h.exec("atk", map[string]any{"command": fmt.Sprintf("python3 - %d %d %f", n, e.u.httpPort, limit.Seconds()), "stdin": slowlorisProbe, "timeoutMs": 600000})
	var closed, open int
	var lo, mid, hi float64
	fmt.Sscanf(r.Stdout, "closed=%d open=%d min=%f median=%f max=%f", &closed, &open, &lo, &mid, &hi)
	facts["connections"], facts["headerTimeoutSeconds"], facts["answer"] = n, e.headerTO.Seconds(), strings.TrimSpace(r.Stdout)
	facts["lifeMinSeconds"], facts["lifeMedianSeconds"], facts["lifeMaxSeconds"] = lo, mid, hi
	// Every connection is cut at the header timeout (accepted within a
	// few seconds of each other), none answered, none kept.
	to := e.headerTO.Seconds()
	_, answers, _ := strings.Cut(r.Stdout, " answers=")
	if r.ExitCode != 0 || closed != n || open != 0 || lo < to-1 || hi > to+8 || !slowAnswers.MatchString(answers) {
		t.Fatalf("%d slow connections, header timeout %v: %+v", n, e.headerTO, r)
	}
	e.waitOwnProxy(t, facts)
}

func (e *insideEnv) attackOutputFlood(t *testing.T, facts map[string]any) {
	h := e.h
	// A stream read as fast as it comes, meanwhile: its client gets all of
	// it; closed, its processes end.
	hdr := http.Header{"Authorization": {"Bearer " + h.token}}
	c, _, err := h.dialWS("/v1/sandbox/terminal/atk/ws?tty=false&command="+url.QueryEscape("yes flood"), hdr)
	if err != nil {
		t.Fatal(err)
	}
	var streamed int64
	streamDone := make(chan struct{})
	go func() {
		defer close(streamDone)
		c.SetReadDeadline(time.Now().Add(e.sc.hold))
		for {
			mt, b, err := c.ReadMessage()
			if err != nil {
				return
			}
			if mt == websocket.BinaryMessage {
				streamed += int64(len(b))
			}
		}
	}()
	// The REST answer keeps its cap and stops the command past the
	// dropped-bytes limit.
	t0 := time.Now()
	r := h.exec("atk", map[string]any{"command": "yes out & yes err >&2; wait", "timeoutMs": 300000})
	took := time.Since(t0)
	<-streamDone
	c.Close()
	facts["restStoppedAfterMs"], facts["restDroppedBytes"] = took.Milliseconds(), r.StdoutDropped+r.StderrDropped
	facts["streamedBytes"], facts["streamMiBps"] = streamed, round2(float64(streamed)/(1<<20)/e.sc.hold.Seconds())
	if !r.StoppedForOutput || r.ExitCode != 141 || r.TimedOut || len(r.Stdout)+len(r.Stderr) != h.cfg.Limits.ExecOutputBytes ||
		r.StdoutDropped+r.StderrDropped <= h.cfg.Limits.ExecMaxDroppedBytes {
		t.Fatalf("flood: stopped %v exit %d timedOut %v kept %d dropped %d+%d", r.StoppedForOutput, r.ExitCode, r.TimedOut, len(r.Stdout)+len(r.Stderr), r.StdoutDropped, r.StderrDropped)
	}
	if streamed < 1<<20 {
		t.Errorf("the stream delivered %d bytes in %v", streamed, e.sc.hold)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := h.sh("atk", "ps -eo comm= | grep -c '^yes$' || true")
		if strings.TrimSpace(r.Stdout) == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("yes processes survived: %q", r.Stdout)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// logSpam tries every way a sandbox has to write to a log the host keeps:
// the console, the kernel's log, PID 1's output, syslog, and the sentry's
// own log through unsupported system calls with many arguments.
const logSpam = `
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
line = b"spam spam spam spam spam spam spam spam\n"
for path in ["/dev/kmsg", "/dev/console", "/proc/1/fd/1", "/proc/1/fd/2", "/dev/tty"]:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
    except OSError as e:
        print(path, errno.errorcode.get(e.errno))
        continue
    n = 0
    try:
        for i in range(100000):
            n += os.write(fd, line)
        print(path, "wrote", n)
    except OSError as e:
        print(path, "write", errno.errorcode.get(e.errno), n)
for path in ["/dev/log", "/run/systemd/journal/socket"]:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.connect(path)
        print(path, "connected")
    except OSError as e:
        print(path, errno.errorcode.get(e.errno))
calls = 0
for nr in list(range(335, 424)) + list(range(470, 512)):
    for a in range(200):
        libc.syscall(nr, a, a * 7, 0)
        calls += 1
s = socket.socket()
for cmd in range(0x89f0, 0x89f0 + 20000):
    try:
        libc.ioctl(s.fileno(), cmd, 0)
    except Exception:
        pass
    calls += 1
print("syscalls", calls)
`

// dirBytes is the size of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func (e *insideEnv) attackMillionLines(t *testing.T, facts map[string]any) {
	h := e.h
	logDir := filepath.Join(h.cfg.DataDir, "sandboxes", e.atkCID, "logs")
	logsBefore := dirBytes(logDir)
	// A million lines in a REST exec: 1 MiB kept, the rest counted, the
	// command not stopped (under the dropped-bytes limit).
	const lines, bytes = 1_000_000, 6_888_896 // seq 1000000 | wc -c
	r := h.exec("atk", map[string]any{"command": fmt.Sprintf("seq %d", lines), "timeoutMs": 300000})
	if r.ExitCode != 0 || !r.Truncated || r.StoppedForOutput || len(r.Stdout) != h.cfg.Limits.ExecOutputBytes ||
		r.StdoutDropped != int64(bytes-h.cfg.Limits.ExecOutputBytes) || !strings.HasPrefix(r.Stdout, "1\n2\n3\n") {
		t.Fatalf("seq: exit %d truncated %v stopped %v kept %d dropped %d", r.ExitCode, r.Truncated, r.StoppedForOutput, len(r.Stdout), r.StdoutDropped)
	}
	// The same through an exec stream read by its client: every line.
	hdr := http.Header{"Authorization": {"Bearer " + h.token}}
	c, _, err := h.dialWS("/v1/sandbox/terminal/atk/ws?tty=false&command="+url.QueryEscape(fmt.Sprintf("seq %d", e.sc.streamLines)), hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got, wantBytes int64
	for i, p := 1, int64(1); i <= 8; i, p = i+1, p*10 { // digits of 1..n, plus newlines
		lo, hi := p, min(p*10-1, int64(e.sc.streamLines))
		if lo <= hi {
			wantBytes += (hi - lo + 1) * int64(i+1)
		}
	}
	var tail []byte
	exit := -1
	t0 := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Minute))
	for exit < 0 {
		mt, b, err := c.ReadMessage()
		if err != nil {
			t.Fatalf("stream after %d bytes: %v", got, err)
		}
		if mt == websocket.BinaryMessage && len(b) > 0 && b[0] == 1 {
			got += int64(len(b) - 1)
			tail = append(tail, b[1:]...)
			tail = tail[max(0, len(tail)-64):]
		} else if mt == websocket.TextMessage {
			var ev struct {
				Type     string
				ExitCode int
			}
			if json.Unmarshal(b, &ev); ev.Type == "exit" {
				exit = ev.ExitCode
			}
		}
	}
	facts["streamLines"], facts["streamSeconds"] = e.sc.streamLines, round2(time.Since(t0).Seconds())
	if exit != 0 || got != wantBytes || !strings.HasSuffix(string(tail), fmt.Sprintf("\n%d\n", e.sc.streamLines)) {
		t.Fatalf("stream: exit %d, %d bytes of %d, tail %q", exit, got, wantBytes, tail)
	}
	// Every log the host keeps for it.
	r = h.exec("atk", map[string]any{"command": "python3 -", "stdin": logSpam, "timeoutMs": 300000})
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "syscalls") {
		t.Fatalf("log spam: %+v", r)
	}
	facts["spam"] = strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if strings.Contains(r.Stdout, "wrote") || strings.Contains(r.Stdout, "connected") {
		t.Errorf("a host log was writable: %s", r.Stdout)
	}
	time.Sleep(time.Second) // the kernel log is tailed every 250 ms
	grew := dirBytes(logDir) - logsBefore
	facts["hostLogGrowthBytes"] = grew
	if grew > 1<<20 {
		t.Errorf("the attacker's host logs grew %d bytes", grew)
	}
	code, b := h.call(h.token, "GET", "/v1/sandbox/atk/logs", nil)
	n := strings.Count(string(b), "\n")
	facts["sessionLogEntries"], facts["sessionLogBytes"] = n, len(b)
	if code != 200 || n > sessionlog.Retain {
		t.Errorf("session log: %d, %d entries", code, n)
	}
}

// spawnMany starts up to n sleeping processes (posix_spawn, the lightest
// way) and reports how far it got and why it stopped.
const spawnMany = `
import errno, os, sys
n, started = int(sys.argv[1]), 0
os.setsid()  # they outlive the command, as a daemon's would
null = [(os.POSIX_SPAWN_OPEN, fd, "/dev/null", os.O_RDWR, 0) for fd in (0, 1, 2)]
try:
    while started < n:
        os.posix_spawn("/bin/sleep", ["sleep", "600"], {}, file_actions=null)
        started += 1
    print("started", started, "all")
except OSError as e:
    print("started", started, errno.errorcode.get(e.errno))
`

func (e *insideEnv) attackManyProcesses(t *testing.T, facts map[string]any) {
	base := e.runscPS(e.atkCID)
	t0 := time.Now()
	r := e.h.exec("atk", map[string]any{"command": fmt.Sprintf("python3 - %d", e.sc.procs), "stdin": spawnMany, "timeoutMs": 120000})
	facts["spawnMs"] = time.Since(t0).Milliseconds()
	var started int
	var why string
	fmt.Sscanf(r.Stdout, "started %d %s", &started, &why)
	facts["asked"], facts["started"], facts["stoppedBy"], facts["processLimit"] = e.sc.procs, started, why, e.atkLimits.procs
	// RLIMIT_NPROC inside: the user's processes (its warm shells, this
	// command's shell and python) stop it short of the limit.
	if r.ExitCode != 0 || why != "EAGAIN" || started >= e.atkLimits.procs || started < e.atkLimits.procs-16 {
		t.Fatalf("spawning %d (limit %d): %+v", e.sc.procs, e.atkLimits.procs, r)
	}
	n := e.runscPS(e.atkCID)
	facts["processes"], facts["hostTasks"] = n, cgroupFile(e.atkCID, "pids.current")
	if n < started {
		t.Fatalf("%d processes left of the %d started", n, started)
	}
	time.Sleep(e.sc.hold)
	ms, err := e.killAll("atk")
	if err != nil {
		t.Fatal(err)
	}
	facts["killMs"] = ms
	e.psBack(t, base)
}

// sandboxWatch keeps, until stopped, what would explain a sandbox's
// death (its directory and cgroups go with it): host tasks, the pids
// cgroup's events, the tail of the sentry's log.
type sandboxWatch struct {
	mu       sync.Mutex
	tasks    int64
	maxTasks int64
	events   string
	bootLog  string
	stop     chan struct{}
	done     chan struct{}
}

func (e *insideEnv) watch(cid string) *sandboxWatch {
	w := &sandboxWatch{stop: make(chan struct{}), done: make(chan struct{})}
	boot := filepath.Join(e.h.cfg.DataDir, "sandboxes", cid, "logs", "runsc.boot.log")
	var pidsDir string
	for _, d := range prefixedCgroups(cid) {
		if _, err := os.Stat(filepath.Join(d, "pids.events")); err == nil {
			pidsDir = d
		}
	}
	go func() {
		defer close(w.done)
		for {
			n := cgroupFile(cid, "pids.current")
			ev, _ := os.ReadFile(filepath.Join(pidsDir, "pids.events"))
			var tail []byte
			if f, err := os.Open(boot); err == nil {
				if fi, err := f.Stat(); err == nil {
					tail = make([]byte, min(fi.Size(), 4096))
					f.ReadAt(tail, fi.Size()-int64(len(tail)))
				}
				f.Close()
			}
			w.mu.Lock()
			if n > 0 {
				w.tasks, w.maxTasks = n, max(w.maxTasks, n)
			}
			if len(ev) > 0 {
				w.events = strings.TrimSpace(string(ev))
			}
			if len(tail) > 0 {
				w.bootLog = string(tail)
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *sandboxWatch) end() {
	close(w.stop)
	<-w.done
}

func (w *sandboxWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("host tasks %d (max %d), pids.events %q, the sentry's log ends:\n%s", w.tasks, w.maxTasks, w.events, w.bootLog)
}

func (e *insideEnv) attackForkBomb(t *testing.T, facts map[string]any) {
	h := e.h
	base := e.runscPS(e.atkCID)
	// Two bombs: the classic (each process starts two and ends: it churns
	// at the limit) and one whose processes fork for as long as they live.
	h.sh("atk", `printf 'f(){ while :; do f & done; }; f\n' > /tmp/bomb.sh; printf 'f(){ f | f & }; f; sleep 600\n' > /tmp/classic.sh`)
	w := e.watch(e.atkCID)
	defer w.end()
	pidsMax := cgroupFile(e.atkCID, "pids.max")
	maxProcs := 0
	var kills, tasksAfter []int64
	for i := range e.sc.bombRounds {
		var done chan struct{}
		if i%2 == 0 {
			// setsid -f: they outlive the command that starts them.
			if r := h.sh("atk", "setsid -f bash /tmp/classic.sh >/dev/null 2>&1; setsid -f bash /tmp/bomb.sh >/dev/null 2>&1; echo started"); r.Stdout != "started\n" {
				t.Fatalf("round %d: bombs: %+v", i, r)
			}
		} else {
			// In the command's own process group, killed while it runs
			// (its answer may be anything: it is not waited for here).
			done = make(chan struct{})
			go func() {
				defer close(done)
				e.callAs(h.token, "POST", "/v1/sandbox/terminal/atk", map[string]any{"action": "exec", "timeoutMs": 120000,
					"command": "bash /tmp/classic.sh >/dev/null 2>&1 & bash /tmp/bomb.sh >/dev/null 2>&1; wait"})
			}()
		}
		for end := time.Now().Add(e.sc.bombHold); time.Now().Before(end); time.Sleep(time.Second) {
			maxProcs = max(maxProcs, e.runscPS(e.atkCID))
		}
		if o := h.get("atk"); o.Status != "running" {
			t.Fatalf("round %d: the attacker's sandbox died under its bomb: %+v; %s", i, o, w)
		}
		ms, err := e.killAll("atk")
		if err != nil {
			t.Fatalf("round %d: %v; %s", i, err, w)
		}
		kills = append(kills, ms)
		if done != nil {
			<-done
		}
		e.psBack(t, base)
		tasksAfter = append(tasksAfter, cgroupFile(e.atkCID, "pids.current"))
	}
	w.mu.Lock()
	maxTasks := w.maxTasks
	w.mu.Unlock()
	facts["rounds"], facts["maxProcesses"], facts["processLimit"] = e.sc.bombRounds, maxProcs, e.atkLimits.procs
	facts["maxHostTasks"], facts["hostTaskLimit"], facts["hostTasksAfterKills"], facts["killMs"] = maxTasks, pidsMax, tasksAfter, kills
	// The user's processes stay under RLIMIT_NPROC (plus the agent and
	// its root-owned helpers), and gVisor's host tasks under the pids
	// cgroup, which the bombs never reach.
	if maxProcs < e.atkLimits.procs/2 || maxProcs > e.atkLimits.procs+8 {
		t.Errorf("the bomb peaked at %d processes (limit %d)", maxProcs, e.atkLimits.procs)
	}
	if pidsMax != int64(e.atkLimits.pids) || maxTasks >= pidsMax {
		t.Errorf("host tasks %d, pids.max %d (want %d); %s", maxTasks, pidsMax, e.atkLimits.pids, w)
	}
	if r := h.sh("atk", "echo survived"); r.Stdout != "survived\n" {
		t.Fatalf("after the bombs: %+v", r)
	}
}

// allocated is the host space a file takes.
func allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return -1
	}
	return st.Blocks * 512
}

func hostFree(dir string) int64 {
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return -1
	}
	return int64(st.Bavail) * st.Bsize
}

func (e *insideEnv) attackDiskFill(t *testing.T, facts map[string]any) {
	h := e.h
	img := filepath.Join(h.cfg.DataDir, "sandboxes", e.atkCID, "disk.img")
	freeBefore, imgBefore := hostFree(h.cfg.DataDir), allocated(img)
	r := h.sh("atk", "dd if=/dev/zero of=/workspace/fill bs=1M 2>&1 | grep -v records; df -m /workspace | tail -1")
	imgAfter, freeAfter := allocated(img), hostFree(h.cfg.DataDir)
	facts["dd"] = strings.TrimSpace(r.Stdout)
	facts["diskImgMiB"], facts["hostFreeDropMiB"] = imgAfter>>20, (freeBefore-freeAfter)>>20
	diskMiB := int64(h.get("atk").Resources.DiskMiB)
	if !strings.Contains(r.Stdout, "No space left on device") {
		t.Fatalf("disk fill: %+v", r)
	}
	// Its disk is a file of at most its size on the host; the host's data
	// dir keeps its free space but for that (other writers share the
	// machine: only what the image took is asserted).
	if imgAfter > (diskMiB+8)<<20 || imgAfter < imgBefore {
		t.Errorf("disk.img takes %d MiB for a %d MiB disk", imgAfter>>20, diskMiB)
	}
	time.Sleep(e.sc.hold / 2) // the bystanders meanwhile, with the disk full
	if r := h.sh("atk", "rm -f /workspace/fill && echo fine > /workspace/ok && cat /workspace/ok"); r.Stdout != "fine\n" {
		t.Fatalf("after the fill: %+v", r)
	}
	if o := h.get("atk"); o.Status != "running" {
		t.Fatalf("the attacker after the fill: %+v", o)
	}
}

// inodeFill creates empty files, four writers at once, until the disk has
// no inode left.
const inodeFill = `
import errno, os
from multiprocessing import Pool
def fill(w):
    d = "/workspace/inodes/%d" % w
    os.makedirs(d, exist_ok=True)
    n = 0
    try:
        while True:
            os.close(os.open("%s/%d" % (d, n), os.O_CREAT | os.O_WRONLY, 0o644))
            n += 1
    except OSError as e:
        return n, errno.errorcode.get(e.errno, str(e.errno))
with Pool(4) as p:
    res = p.map(fill, range(4))
print("created", sum(n for n, _ in res), ",".join(sorted(set(w for _, w in res))))
`

func (e *insideEnv) attackInodeFill(t *testing.T, facts map[string]any) {
	h := e.h
	t0 := time.Now()
	r := h.exec("atk", map[string]any{"command": "python3 -; df -i /workspace | tail -1", "stdin": inodeFill, "timeoutMs": 600000})
	facts["fillMs"] = time.Since(t0).Milliseconds()
	var created int
	var why string
	fmt.Sscanf(r.Stdout, "created %d %s", &created, &why)
	facts["created"], facts["stoppedBy"] = created, why
	if lines := strings.Split(strings.TrimSpace(r.Stdout), "\n"); len(lines) == 2 {
		facts["df"] = lines[1]
		if f := strings.Fields(lines[1]); len(f) < 5 || f[3] != "0" {
			t.Errorf("inodes left: %q", lines[1])
		}
	}
	if why != "ENOSPC" || created < 1000 {
		t.Fatalf("inode fill: %+v", r)
	}
	// The bystander's disk is its own: it creates files meanwhile.
	if code, b, err := e.callAs(e.tokB, "POST", "/v1/sandbox/terminal/by", map[string]any{"action": "exec", "command": "mkdir -p /workspace/many && cd /workspace/many && touch $(seq 1000) && ls | wc -l && rm -r /workspace/many"}); err != nil || code != 200 || !strings.Contains(string(b), `"stdout":"1000\n"`) {
		t.Errorf("bystander files: %d %v %s", code, err, b)
	}
	time.Sleep(e.sc.hold / 2) // the bystanders meanwhile, its inodes used up
	// A few removed, the attacker creates files again (the rest stay:
	// removing 32,000 files through gVisor takes 20 s).
	if r := h.sh("atk", "cd /workspace/inodes/0 && rm -f $(seq 0 99) && touch /workspace/after && echo fine"); r.Stdout != "fine\n" {
		t.Fatalf("after the fill: %+v", r)
	}
}

func (e *insideEnv) attackMemoryBomb(t *testing.T, facts map[string]any) {
	h := e.h
	o := h.provision("atk-mem", "test-tiny")
	cid := cidOf(h.cfg, o.OrgID, "atk-mem")
	// Memory file systems are the sandbox's memory, and small.
	r := h.sh("atk-mem", "head -c 200M /dev/zero > /dev/shm/fill; echo rc=$?; du -m /dev/shm/fill | cut -f1; rm -f /dev/shm/fill")
	if !strings.Contains(r.Stderr, "No space left on device") || !strings.Contains(r.Stdout, "rc=1\n64\n") {
		t.Errorf("/dev/shm fill: %+v", r)
	}
	limit := cgroupFile(cid, "memory.limit_in_bytes", "memory.max")
	facts["cgroupLimitMiB"] = limit >> 20
	if limit != int64(o.Resources.MemoryMiB)<<20 {
		t.Errorf("memory cgroup limit %d, size %d MiB", limit, o.Resources.MemoryMiB)
	}
	// Host memory and the sandbox's cgroup, sampled while the bomb runs.
	stop := make(chan struct{})
	var peak, minAvail int64 = 0, math.MaxInt64
	sampled := make(chan struct{})
	availBefore := int64(sandbox.MemAvailableMiB())
	go func() {
		defer close(sampled)
		for {
			peak = max(peak, cgroupFile(cid, "memory.usage_in_bytes", "memory.current"))
			minAvail = min(minAvail, int64(sandbox.MemAvailableMiB()))
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t0 := time.Now()
	r = h.exec("atk-mem", map[string]any{"command": `for i in 1 2 3 4; do python3 -c 'b = []
while True: b.append(bytearray(32 << 20))' & done; wait; echo survived`, "timeoutMs": 120000})
	close(stop)
	<-sampled
	facts["oomAfterMs"], facts["cgroupPeakMiB"] = time.Since(t0).Milliseconds(), peak>>20
	facts["hostMemAvailableDropMiB"] = availBefore - minAvail
	// Which process the kernel's OOM killer takes varies: the sentry (all
	// at once), or first a bomb, the shell running on to print "survived"
	// until the sandbox is failed. Either way the command is an OOM.
	if r.ExitCode != 137 || !r.OOM {
		t.Fatalf("memory bomb: %+v", r)
	}
	// cgroup v1 charges in per-CPU batches: a few pages past the limit.
	if peak > limit+1<<20 {
		t.Errorf("cgroup usage peaked at %d over its limit %d", peak, limit)
	}
	o = h.get("atk-mem")
	if o.Status != "failed" || o.StatusReason == nil || *o.StatusReason != "oom" {
		t.Fatalf("after the bomb: %+v", o)
	}
	if code, _ := h.call(h.token, "POST", "/v1/sandbox/terminal/atk-mem", map[string]any{"action": "exec", "command": "true"}); code != 409 {
		t.Errorf("exec after oom: %d", code)
	}
	if code, b := h.call(h.token, "DELETE", "/v1/sandbox/atk-mem", nil); code != 204 {
		t.Fatalf("delete after oom: %d %s", code, b)
	}
	if left := hostResources(t, h.cfg, cid); len(left) > 0 {
		t.Errorf("left on the host after the oom and delete: %v", left)
	}
}

// checkAfter: the sessions are in their true state, the database intact,
// and the server's goroutines and descriptors back near where they were.
func (e *insideEnv) checkAfter(t *testing.T) {
	h := e.h
	for _, id := range []string{"atk", "peer"} {
		if o := h.get(id); o.Status != "running" {
			t.Errorf("%s: %+v", id, o)
		}
	}
	if _, err := e.sample(); err != nil {
		t.Errorf("the bystanders after the attacks: %v", err)
	}
	var gor, fds int
	deadline := time.Now().Add(30 * time.Second)
	for {
		gor = runtime.NumGoroutine()
		ents, _ := os.ReadDir("/proc/self/fd")
		fds = len(ents)
		if gor <= e.startGor+50 && fds <= e.startFDs+50 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	e.mu.Lock()
	e.after = map[string]any{"goroutines": gor, "goroutinesBefore": e.startGor, "fds": fds, "fdsBefore": e.startFDs}
	e.mu.Unlock()
	if gor > e.startGor+50 || fds > e.startFDs+50 {
		t.Errorf("goroutines %d (before: %d), descriptors %d (before: %d)", gor, e.startGor, fds, e.startFDs)
	}
	integrityCheck(t, h.cfg)
}
