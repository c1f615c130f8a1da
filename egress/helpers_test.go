package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeResolver maps names to addresses; anything else does not resolve.
type fakeResolver struct {
	mu    sync.Mutex
	names map[string][]netip.Addr
}

func newResolver() *fakeResolver { return &fakeResolver{names: map[string][]netip.Addr{}} }

func (r *fakeResolver) set(name string, addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var as []netip.Addr
	for _, a := range addrs {
		as = append(as, netip.MustParseAddr(a))
	}
	r.names[name] = as
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if as, ok := r.names[host]; ok {
		return as, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

type denial struct {
	session, host string
	port          int
	reason        string
}

// recEvents records every event.
type recEvents struct {
	mu      sync.Mutex
	denied  []denial
	quota   []int64 // used at each QuotaExceeded
	quotaID []string
}

func (e *recEvents) Denied(key, host string, port int, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.denied = append(e.denied, denial{key, host, port, reason})
}

func (e *recEvents) QuotaExceeded(key string, used, limit int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.quota = append(e.quota, used)
	e.quotaID = append(e.quotaID, key)
}

func (e *recEvents) denials() []denial {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]denial(nil), e.denied...)
}

func (e *recEvents) quotaCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.quota)
}

// waitDenied waits for a denial with reason (events of a closed tunnel may
// land just after the client sees the close).
func (e *recEvents) waitDenied(t *testing.T, reason string) denial {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, d := range e.denials() {
			if d.reason == reason {
				return d
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no %q denial; got %+v", reason, e.denials())
	return denial{}
}

// testCA issues certificates for the upstream test servers; clients trust
// it through RootCAs, so TLS is verified end to end through tunnels.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

var (
	caOnce sync.Once
	ca     *testCA
)

func getCA(t testing.TB) *testCA {
	caOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(1),
			Subject:               pkix.Name{CommonName: "egress test CA"},
			NotBefore:             time.Now().Add(-time.Hour),
			NotAfter:              time.Now().Add(24 * time.Hour),
			IsCA:                  true,
			BasicConstraintsValid: true,
			KeyUsage:              x509.KeyUsageCertSign,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		cert, _ := x509.ParseCertificate(der)
		pool := x509.NewCertPool()
		pool.AddCert(cert)
		pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		ca = &testCA{cert: cert, key: key, pool: pool, pem: pemBytes}
	})
	return ca
}

func (c *testCA) leaf(names ...string) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(mrand.Int64N(1 << 62)),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		panic(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// upstreamNames are the names the test certificates cover.
var upstreamNames = []string{"allowed.test", "tls443.test", "xn--bcher-kva.test", "a.wild.test"}

// newTLSUpstream starts an HTTPS server on l (nil: 127.0.0.1:0).
func newTLSUpstream(t testing.TB, l net.Listener, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	if l != nil {
		_ = srv.Listener.Close()
		srv.Listener = l
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{getCA(t).leaf(upstreamNames...)}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func newHTTPUpstream(t testing.TB, l net.Listener, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	if l != nil {
		_ = srv.Listener.Close()
		srv.Listener = l
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func portOf(t testing.TB, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// listenPrivileged listens on a random 127.x.y.z address at port (80 or
// 443: the port-specific tunnel rules need them). It needs root.
func listenPrivileged(t testing.TB, port int) (net.Listener, string) {
	t.Helper()
	for i := 0; i < 20; i++ {
		ip := fmt.Sprintf("127.%d.%d.%d", 100+mrand.IntN(100), mrand.IntN(250)+1, mrand.IntN(250)+1)
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err == nil {
			return l, ip
		}
		if errors.Is(err, syscall.EACCES) {
			t.Skipf("listening on port %d needs root", port)
		}
	}
	t.Fatalf("no free loopback address for port %d", port)
	return nil, ""
}

// env is one proxy with a resolver and recorded events.
type env struct {
	t      testing.TB
	p      *Proxy
	res    *fakeResolver
	events *recEvents
}

// testConfig allows the test names on the given ports and loopback dialing.
func testConfig(ports ...int) *Config {
	ps := append([]int{443, 80}, ports...)
	return &Config{
		Allowlist: []Rule{
			{Host: "allowed.test", Ports: ps},
			{Host: "tls443.test", Ports: ps},
			{Host: "h80.test", Ports: ps},
			{Host: "xn--bcher-kva.test", Ports: ps},
			{Host: "*.wild.test", Ports: ps},
			{Host: "rebind.test", Ports: ps},
			{Host: "meta.test", Ports: ps},
			{Host: "mixed.test", Ports: ps},
			{Host: "127.0.0.2", Ports: ps},
		},
		AllowNetworks: []string{"127.0.0.0/8"},
		IdleTimeout:   time.Minute,
		HeaderTimeout: 2 * time.Second,
		DialTimeout:   2 * time.Second,
	}
}

func newEnv(t testing.TB, cfg *Config) *env {
	t.Helper()
	pol, err := NewPolicy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, res: newResolver(), events: &recEvents{}}
	e.res.set("allowed.test", "127.0.0.1")
	e.res.set("xn--bcher-kva.test", "127.0.0.1")
	e.res.set("a.wild.test", "127.0.0.1")
	e.res.set("meta.test", "169.254.169.254")
	e.res.set("mixed.test", "127.0.0.1", "10.1.2.3")
	e.p = New(pol, Options{Events: e.events, Resolver: e.res})
	t.Cleanup(e.p.Shutdown)
	return e
}

// serve starts a session on a fresh loopback listener and returns the
// proxy's address; cleanup closes it and checks Serve returned nil.
func (e *env) serve(id string, used, limit int64) string {
	e.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.p.ServeWithPolicy(l, id, nil, used, limit) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, _, ok := e.p.Usage(id); ok {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("session %s not registered", id)
		}
	}
	e.t.Cleanup(func() {
		e.p.Close(id)
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("Serve(%s): %v", id, err)
			}
		case <-time.After(5 * time.Second):
			e.t.Errorf("Serve(%s) did not return after Close", id)
		}
	})
	return l.Addr().String()
}

// client is an HTTP client using the proxy for http and https, trusting
// the test CA, never the environment's proxy.
func client(proxyAddr string) *http.Client {
	pu, _ := url.Parse("http://" + proxyAddr)
	return &http.Client{
		Transport: &http.Transport{
			Proxy:             http.ProxyURL(pu),
			TLSClientConfig:   &tls.Config{RootCAs: getCA(nil).pool},
			ForceAttemptHTTP2: false,
		},
		Timeout: 30 * time.Second,
	}
}

// rawConnect sends a CONNECT for target on a new connection and returns
// the connection, the status code and the response (body read when not
// 200).
func rawConnect(t testing.TB, proxyAddr, target string, withHost bool) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "CONNECT " + target + " HTTP/1.1\r\n"
	if withHost {
		req += "Host: " + target + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
	}
	return c, br, resp
}

// bufConn reads through br (which may hold bytes after the CONNECT reply).
type bufConn struct {
	net.Conn
	br *bufio.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.br.Read(b) }

// echoServer echoes every connection until EOF.
func echoServer(t testing.TB) net.Listener {
	t.Helper()
	return tcpServer(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// tcpServer accepts on loopback and runs handle for each connection (then
// closes it) until the test ends.
func tcpServer(t testing.TB, handle func(net.Conn)) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return l
}

func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}
