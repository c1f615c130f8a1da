package server

// Attacks from outside on WebSockets, tickets and the portal origin (see
// attack_outside_test.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"sandboxd/server/config"
	"sandboxd/server/portal"
	"sandboxd/store"
)

// atkUpstream is a server "in" org A's session on port 8000 (the fake
// runtime's DialFn reaches it); any other dial is recorded as a breach.
type atkUpstream struct {
	mu     sync.Mutex
	paths  []string // RawPath or Path of each request it got
	bad    []string // dials to any other sandbox or port
	srv    *httptest.Server
	header []http.Header
}

func (a *atkEnv) upstream(t *testing.T) *atkUpstream {
	t.Helper()
	u := &atkUpstream{}
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		p := r.URL.EscapedPath()
		u.paths = append(u.paths, p)
		u.header = append(u.header, r.Header.Clone())
		u.mu.Unlock()
		if websocket.IsWebSocketUpgrade(r) {
			c, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer c.Close()
			for {
				mt, b, err := c.ReadMessage()
				if err != nil {
					return
				}
				c.WriteMessage(mt, b)
			}
		}
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "upstream 8000 path %s body %d", p, n)
	}))
	t.Cleanup(u.srv.Close)
	ses, err := a.db.GetSession(context.Background(), a.orgA.Org.ID, a.mine)
	if err != nil {
		t.Fatal(err)
	}
	a.rt.Mu.Lock()
	a.rt.DialFn = func(ctx context.Context, id string, port int) (net.Conn, error) {
		if id == ses.ContainerID && port == 8000 {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", u.srv.Listener.Addr().String())
		}
		u.mu.Lock()
		u.bad = append(u.bad, fmt.Sprintf("%s:%d", id, port))
		u.mu.Unlock()
		return nil, errors.New("connection refused")
	}
	a.rt.Mu.Unlock()
	return u
}

func (u *atkUpstream) seen() (paths, bad []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.paths...), append([]string(nil), u.bad...)
}

// portalHost is the Host of a session's portal origin on this server.
func (a *atkEnv) portalHost(orgID, session string) string {
	_, port, _ := net.SplitHostPort(a.addr)
	return portal.SessionKey(orgID, session) + ".localhost:" + port
}

// ticket asks for a ticket for session with token.
func (a *atkEnv) ticket(t testing.TB, token, session string) string {
	t.Helper()
	r := a.do(t, "POST", "/v1/sandbox/"+session+"/tickets", token, nil)
	var tk struct{ Ticket string }
	if r.status != http.StatusCreated || json.Unmarshal(r.body, &tk) != nil || tk.Ticket == "" {
		t.Fatalf("ticket: %d %s", r.status, r.body)
	}
	return tk.Ticket
}

// portalLogin turns a ticket into the portal cookie ("name=value").
func (a *atkEnv) portalLogin(t testing.TB, orgID, session, tk string) string {
	t.Helper()
	r := a.do(t, "GET", "/.sandboxd/login?ticket="+tk+"&next=/", "", nil, "Host", a.portalHost(orgID, session))
	for _, c := range (&http.Response{Header: r.hdr}).Cookies() {
		if c.Name == portal.CookieName && r.status == http.StatusOK {
			return c.Name + "=" + c.Value
		}
	}
	t.Fatalf("portal login: %d %s", r.status, r.body)
	return ""
}

// wsDial opens a WebSocket to target on the server, addressed to host
// (the API's when ""), with the headers given.
func (a *atkEnv) wsDial(target, host string, h http.Header) (*websocket.Conn, atkResp, error) {
	if host == "" {
		host = a.addr
	}
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second,
		NetDial: func(network, _ string) (net.Conn, error) { return net.Dial(network, a.addr) }}
	c, resp, err := d.Dial("ws://"+host+target, h)
	var r atkResp
	if resp != nil {
		r.status, r.hdr = resp.StatusCode, resp.Header
		if resp.Body != nil {
			r.body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
	}
	return c, r, err
}

// wsRoutes are the engine's WebSocket routes (GET .../ws).
func (a *atkEnv) wsRoutes() []string {
	var out []string
	for _, r := range a.s.engine.Routes() {
		if r.Method == http.MethodGet && strings.HasSuffix(r.Path, "/ws") {
			out = append(out, r.Path)
		}
	}
	return out
}

// TestAttackWebSocketOrigin: every WebSocket route refuses a browser page
// of another origin, the session's own portal origin included, whichever
// way it authenticates; a client without Origin (not a browser), the
// API's own origin and a configured one are let in. On the API's proxy
// route a browser cannot authenticate at all.
func TestAttackWebSocketOrigin(t *testing.T) {
	a := newAtkEnv(t, func(c *config.Config) { c.AllowedOrigins = []string{"https://console.example"} })
	_, port, _ := net.SplitHostPort(a.addr)
	routes := a.wsRoutes()
	if len(routes) < 2 {
		t.Fatalf("WebSocket routes: %v", routes)
	}
	foreign := []string{
		"http://evil.example", "null", "http://" + a.portalHost(a.orgA.Org.ID, a.mine),
		"http://" + a.addr + ".evil.example", "http://127.0.0.1:1", "http://localhost:" + port,
		"http://" + a.addr + "@evil.example", "ftp://" + a.addr, "file://", "https://console.example.evil",
	}
	allowed := []string{"", "http://" + a.addr, "https://" + a.addr, "https://console.example"}
	auths := map[string]func(h http.Header){
		"header":      func(h http.Header) { h.Set("Authorization", "Bearer "+a.token) },
		"subprotocol": func(h http.Header) { h.Set("Sec-WebSocket-Protocol", "sandboxd, bearer."+a.token) },
	}
	for _, route := range routes {
		target := a.fill(route, "own")
		for how, auth := range auths {
			for _, o := range foreign {
				h := http.Header{}
				auth(h)
				h.Set("Origin", o)
				c, r, err := a.wsDial(target, "", h)
				if err == nil {
					c.Close()
					t.Errorf("%s (%s) from %q: upgraded", route, how, o)
					continue
				}
				contractErr(t, fmt.Sprintf("%s (%s) from %q", route, how, o), r, http.StatusForbidden, "forbidden")
			}
			for _, o := range allowed {
				h := http.Header{}
				auth(h)
				if o != "" {
					h.Set("Origin", o)
				}
				c, r, err := a.wsDial(target, "", h)
				if err != nil {
					t.Errorf("%s (%s) from %q: %v %d %s", route, how, o, err, r.status, r.body)
					continue
				}
				if how == "subprotocol" && c.Subprotocol() != wsSubprotocol {
					t.Errorf("%s: subprotocol answered %q", route, c.Subprotocol())
				}
				c.Close()
			}
		}
		// A ticket from a foreign page is refused and not spent.
		tk := a.ticket(t, a.token, a.mine)
		_, r, err := a.wsDial(target+"?ticket="+tk, "", http.Header{"Origin": {"http://evil.example"}})
		if err == nil || r.status != http.StatusForbidden {
			t.Errorf("%s: ticket from a foreign origin: %v %d", route, err, r.status)
		}
		c, r, err := a.wsDial(target+"?ticket="+tk, "", http.Header{"Origin": {"http://" + a.addr}})
		if err != nil {
			t.Errorf("%s: the ticket after a refused foreign use: %v %d %s", route, err, r.status, r.body)
		} else {
			c.Close()
		}
	}

	// The API's proxy route: a browser has only subprotocols, tickets
	// (which send it to the portal origin) and cookies (never read there).
	up := a.upstream(t)
	for _, h := range []http.Header{
		{"Sec-WebSocket-Protocol": {"bearer." + a.token}, "Origin": {"http://evil.example"}},
		{"Sec-WebSocket-Protocol": {"bearer." + a.token}},
		{"Cookie": {a.portalLogin(t, a.orgA.Org.ID, a.mine, a.ticket(t, a.token, a.mine))}},
	} {
		_, r, err := a.wsDial("/v1/sandbox/proxy/"+a.mine+"/port/8000/ws", "", h)
		if err == nil || r.status != http.StatusUnauthorized {
			t.Errorf("proxy WebSocket with %v: %v %d %s", h, err, r.status, r.body)
		}
	}
	// A client with the token in its header reaches the sandbox's server.
	c, _, err := a.wsDial("/v1/sandbox/proxy/"+a.mine+"/port/8000/ws", "", http.Header{"Authorization": {"Bearer " + a.token}})
	if err != nil {
		t.Fatalf("proxy WebSocket with a bearer header: %v", err)
	}
	c.Close()

	// The portal origin: its cookie, and a page of any other origin
	// (another session's portal, the API's) is refused.
	cookie := a.portalLogin(t, a.orgA.Org.ID, a.mine, a.ticket(t, a.token, a.mine))
	e2 := a.provision(a.token, map[string]any{"sessionId": "a-two"})
	host := a.portalHost(a.orgA.Org.ID, a.mine)
	for _, o := range []string{"http://" + a.portalHost(a.orgA.Org.ID, e2.SessionID), "http://" + a.addr, "http://evil.example", "null"} {
		_, r, err := a.wsDial("/port/8000/ws", host, http.Header{"Cookie": {cookie}, "Origin": {o}})
		if err == nil {
			t.Errorf("portal WebSocket from %q upgraded", o)
			continue
		}
		contractErr(t, "portal WebSocket from "+o, r, http.StatusForbidden, "forbidden")
	}
	c, _, err = a.wsDial("/port/8000/ws", host, http.Header{"Cookie": {cookie}, "Origin": {"http://" + host}})
	if err != nil {
		t.Fatalf("portal WebSocket from its own origin: %v", err)
	}
	c.WriteMessage(websocket.TextMessage, []byte("hi"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, b, err := c.ReadMessage(); err != nil || string(b) != "hi" {
		t.Errorf("portal WebSocket echo: %q %v", b, err)
	}
	c.Close()
	if _, bad := up.seen(); len(bad) > 0 {
		t.Errorf("dials to other sandboxes or ports: %v", bad)
	}
}

// TestAttackWebSocketFrames: a message over a WebSocket's read limit ends
// that socket with 1009 (message too big); the server, its other sockets
// and new ones carry on. (The terminal's, with a real PTY behind it, is in
// TestRealAttackOutside.)
func TestAttackWebSocketFrames(t *testing.T) {
	a := newAtkEnv(t)
	target := "/v1/sandbox/" + a.mine + "/logs/ws"
	h := http.Header{"Authorization": {"Bearer " + a.token}}
	bystander, _, err := a.wsDial(target, "", h)
	if err != nil {
		t.Fatal(err)
	}
	defer bystander.Close()
	for _, size := range []int{8 << 10, 4 << 20} {
		for _, mt := range []int{websocket.TextMessage, websocket.BinaryMessage} {
			c, _, err := a.wsDial(target, "", h)
			if err != nil {
				t.Fatal(err)
			}
			c.WriteMessage(mt, make([]byte, size)) // may fail once the server has closed
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			for {
				if _, _, err = c.ReadMessage(); err != nil {
					break
				}
			}
			c.Close()
			if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) && !isConnReset(err) {
				t.Errorf("%d-byte message (type %d): %v, want close 1009", size, mt, err)
			}
		}
	}
	// Many fragments that add up past the limit count as one message.
	c, _, err := a.wsDial(target, "", h)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := c.NextWriter(websocket.BinaryMessage)
	for range 64 {
		w.Write(make([]byte, 1024))
	}
	w.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, _, err = c.ReadMessage(); err != nil {
			break
		}
	}
	c.Close()
	if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) && !isConnReset(err) {
		t.Errorf("fragmented message: %v, want close 1009", err)
	}
	// The bystander is still open; the server answers.
	a.s.logs.Event(mustPK(t, a), "test_event", map[string]any{"n": 1})
	bystander.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		_, b, err := bystander.ReadMessage()
		if err != nil {
			t.Fatalf("bystander socket: %v", err)
		}
		if strings.Contains(string(b), "test_event") {
			break
		}
	}
	if err := healthz(a.addr); err != nil {
		t.Fatal(err)
	}
}

func isConnReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF)
}

func mustPK(t testing.TB, a *atkEnv) string {
	ses, err := a.db.GetSession(context.Background(), a.orgA.Org.ID, a.mine)
	if err != nil {
		t.Fatal(err)
	}
	return ses.ID
}

// TestAttackTickets: a ticket works once, for its session, before it
// expires, for a token that still has access; on the WebSocket routes and
// at the portal's login alike.
func TestAttackTickets(t *testing.T) {
	a := newAtkEnv(t)
	a.upstream(t)
	two := a.provision(a.token, map[string]any{"sessionId": "a-two"}).SessionID
	logsWS := func(session string) string { return "/v1/sandbox/" + session + "/logs/ws" }
	use := func(target, tk string) (int, error) {
		c, r, err := a.wsDial(target+"?ticket="+tk, "", nil)
		if err == nil {
			c.Close()
			return http.StatusSwitchingProtocols, nil
		}
		return r.status, err
	}
	expire := func(tk string) {
		a.s.tix.mu.Lock()
		x := a.s.tix.m[tk]
		x.expires = time.Now().Add(-time.Second)
		a.s.tix.m[tk] = x
		a.s.tix.mu.Unlock()
	}

	t.Run("replayed", func(t *testing.T) {
		tk := a.ticket(t, a.token, a.mine)
		if st, err := use(logsWS(a.mine), tk); st != http.StatusSwitchingProtocols {
			t.Fatalf("first use: %d %v", st, err)
		}
		for _, target := range []string{logsWS(a.mine), "/v1/sandbox/terminal/" + a.mine + "/ws"} {
			if st, _ := use(target, tk); st != http.StatusUnauthorized {
				t.Errorf("replay on %s: %d", target, st)
			}
		}
		// At the portal: once.
		tk = a.ticket(t, a.token, a.mine)
		a.portalLogin(t, a.orgA.Org.ID, a.mine, tk)
		r := a.do(t, "GET", "/.sandboxd/login?ticket="+tk+"&next=/", "", nil, "Host", a.portalHost(a.orgA.Org.ID, a.mine))
		contractErr(t, "replayed portal login", r, http.StatusUnauthorized, "unauthenticated")
		if len(r.hdr.Values("Set-Cookie")) != 0 {
			t.Errorf("replayed portal login set a cookie")
		}
	})

	t.Run("another session", func(t *testing.T) {
		tk := a.ticket(t, a.token, a.mine)
		if st, _ := use(logsWS(two), tk); st != http.StatusUnauthorized {
			t.Errorf("ticket of %s on %s: %d", a.mine, two, st)
		}
		// Another organization's ticket, on a session id of this one.
		tkB := a.ticket(t, a.tokB, a.theirs)
		if st, _ := use(logsWS(a.mine), tkB); st != http.StatusUnauthorized {
			t.Errorf("the other organization's ticket on %s: %d", a.mine, st)
		}
		// At the portal: another session's origin refuses it (403) and
		// the API's redirect does not send it anywhere else.
		tk = a.ticket(t, a.token, a.mine)
		r := a.do(t, "GET", "/v1/sandbox/proxy/"+two+"/port/8000/?ticket="+tk, "", nil)
		contractErr(t, "ticket on another session's proxy route", r, http.StatusUnauthorized, "unauthenticated")
		r = a.do(t, "GET", "/.sandboxd/login?ticket="+tk+"&next=/", "", nil, "Host", a.portalHost(a.orgA.Org.ID, two))
		contractErr(t, "ticket at another session's portal origin", r, http.StatusForbidden, "forbidden")
		r = a.do(t, "GET", "/.sandboxd/login?ticket="+a.ticket(t, a.tokB, a.theirs)+"&next=/", "", nil, "Host", a.portalHost(a.orgA.Org.ID, a.mine))
		contractErr(t, "the other organization's ticket at this portal origin", r, http.StatusForbidden, "forbidden")
		// A ticket is not a bearer token.
		r = a.do(t, "GET", "/v1/sandbox/"+a.mine, a.ticket(t, a.token, a.mine), nil)
		contractErr(t, "ticket as a bearer token", r, http.StatusUnauthorized, "unauthenticated")
	})

	t.Run("expired", func(t *testing.T) {
		tk := a.ticket(t, a.token, a.mine)
		expire(tk)
		if st, _ := use(logsWS(a.mine), tk); st != http.StatusUnauthorized {
			t.Errorf("expired ticket: %d", st)
		}
		tk = a.ticket(t, a.token, a.mine)
		expire(tk)
		r := a.do(t, "GET", "/v1/sandbox/proxy/"+a.mine+"/port/8000/?ticket="+tk, "", nil)
		contractErr(t, "expired ticket on the proxy route", r, http.StatusUnauthorized, "unauthenticated")
		r = a.do(t, "GET", "/.sandboxd/login?ticket="+tk+"&next=/", "", nil, "Host", a.portalHost(a.orgA.Org.ID, a.mine))
		contractErr(t, "expired ticket at the portal", r, http.StatusUnauthorized, "unauthenticated")
	})

	t.Run("token revoked or role lowered after issue", func(t *testing.T) {
		dev, devTok := a.addMember(store.RoleDeveloper)
		p, err := a.db.Authenticate(context.Background(), devTok)
		if err != nil {
			t.Fatal(err)
		}
		tkWS, tkPortal := a.ticket(t, devTok, a.mine), a.ticket(t, devTok, a.mine)
		if r := a.do(t, "DELETE", "/v1/tokens/"+p.TokenID, a.token, nil); r.status != http.StatusNoContent {
			t.Fatalf("revoke: %d %s", r.status, r.body)
		}
		if st, _ := use(logsWS(a.mine), tkWS); st != http.StatusUnauthorized {
			t.Errorf("ticket of a revoked token: %d", st)
		}
		r := a.do(t, "GET", "/.sandboxd/login?ticket="+tkPortal+"&next=/", "", nil, "Host", a.portalHost(a.orgA.Org.ID, a.mine))
		if r.status != http.StatusUnauthorized || len(r.hdr.Values("Set-Cookie")) != 0 {
			t.Errorf("portal login with a revoked token's ticket: %d %v %s", r.status, r.hdr.Values("Set-Cookie"), r.body)
		}
		// Lowered to viewer: no terminal, no portal.
		_, devTok2 := a.addMember(store.RoleDeveloper)
		p2, _ := a.db.Authenticate(context.Background(), devTok2)
		tkTerm, tkPortal := a.ticket(t, devTok2, a.mine), a.ticket(t, devTok2, a.mine)
		if err := a.db.SetMemberRole(context.Background(), a.orgA.Org.ID, p2.User.ID, store.RoleViewer); err != nil {
			t.Fatal(err)
		}
		c, r, err := a.wsDial("/v1/sandbox/terminal/"+a.mine+"/ws?ticket="+tkTerm, "", nil)
		if err == nil {
			c.Close()
			t.Errorf("a viewer's terminal opened with the ticket it had as a developer")
		} else if r.status != http.StatusForbidden && r.status != http.StatusUnauthorized {
			t.Errorf("demoted ticket on the terminal: %d %s", r.status, r.body)
		}
		r = a.do(t, "GET", "/.sandboxd/login?ticket="+tkPortal+"&next=/", "", nil, "Host", a.portalHost(a.orgA.Org.ID, a.mine))
		if r.status != http.StatusForbidden || len(r.hdr.Values("Set-Cookie")) != 0 {
			t.Errorf("portal login with a demoted user's ticket: %d %v %s", r.status, r.hdr.Values("Set-Cookie"), r.body)
		}
		_ = dev
	})
}
