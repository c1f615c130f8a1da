package portal

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCookie(t *testing.T) {
	k := NewKeyring([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Unix(1_800_000_000, 0)
	g := Grant{Org: "o1", Session: "s1", User: "u1", Token: "t1", Expires: now.Add(time.Hour).UTC()}
	v := k.Sign(g)
	if got, ok := k.Verify(v, now); !ok || got != g {
		t.Fatalf("verify: %v %v", got, ok)
	}
	if _, ok := k.Verify(v, now.Add(2*time.Hour)); ok {
		t.Error("expired cookie accepted")
	}
	other := NewKeyring([]byte("another key, another key, 32 by"))
	if _, ok := other.Verify(v, now); ok {
		t.Error("cookie of another key accepted")
	}
	forged := Grant{Org: "o1", Session: "s2", User: "u1", Token: "t1", Expires: now.Add(time.Hour)}
	for _, bad := range []string{"", "v1", "v1..", v + "x", "v2" + v[2:], other.Sign(forged)} {
		if _, ok := k.Verify(bad, now); ok {
			t.Errorf("%q accepted", bad)
		}
	}
	// A tossed cookie of the same name (another session's, or junk) does
	// not hide or replace the real one, and grants nothing by itself.
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Add("Cookie", CookieName+"=junk; "+CookieName+"="+k.Sign(forged))
	r.Header.Add("Cookie", CookieName+"="+v)
	if gs := k.Grants(r, SessionKey("o1", "s1"), now); len(gs) != 1 || gs[0] != g {
		t.Errorf("grants = %v", gs)
	}
	if gs := k.Grants(r, SessionKey("o2", "s1"), now); len(gs) != 0 {
		t.Errorf("grants for another session = %v", gs)
	}
}

func TestLoadKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "portal.key")
	k1, err := LoadKey(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
	k2, err := LoadKey(p)
	if err != nil || string(k1.key) != string(k2.key) {
		t.Errorf("reload: %v", err)
	}
	os.WriteFile(p, []byte("short"), 0o600)
	if _, err := LoadKey(p); err == nil {
		t.Error("short key accepted")
	}
}

func TestStripCookie(t *testing.T) {
	h := http.Header{"Cookie": {"a=1; " + CookieName + "=x", CookieName + "=y;b=2"}}
	StripCookie(h)
	if got := h.Values("Cookie"); len(got) != 1 || got[0] != "a=1; b=2" {
		t.Errorf("Cookie = %q", got)
	}
	h = http.Header{"Cookie": {CookieName + "=x"}}
	if StripCookie(h); h.Get("Cookie") != "" {
		t.Errorf("Cookie = %q", h.Get("Cookie"))
	}
}

func TestCrossOrigin(t *testing.T) {
	own := "http://s1.localhost:8080"
	for _, c := range []struct {
		method string
		hdr    map[string]string
		ok     bool
	}{
		{"GET", nil, true},
		{"GET", map[string]string{"Origin": own}, true},
		{"POST", map[string]string{"Origin": own, "Sec-Fetch-Site": "same-origin"}, true},
		{"GET", map[string]string{"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"}, true},
		{"GET", map[string]string{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}, true},
		{"GET", map[string]string{"Referer": own + "/port/8000/page"}, true},
		// Another session's page (same site) or another site: whatever
		// the mode, navigations included (a GET may change state).
		{"GET", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}, false},
		{"GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}, false},
		{"GET", map[string]string{"Origin": "http://s2.localhost:8080"}, false},
		{"GET", map[string]string{"Origin": "null"}, false},
		{"GET", map[string]string{"Origin": "http://s1.localhost:8081"}, false},
		{"GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}, false},
		{"GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"}, false},
		{"GET", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "websocket"}, false},
		{"POST", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}, false},
		// No Fetch Metadata (plain http on a real domain): the Referer.
		{"GET", map[string]string{"Referer": "http://s2.localhost:8080/evil"}, false},
		{"GET", map[string]string{"Referer": "::bad"}, false},
	} {
		r := httptest.NewRequest(c.method, own+"/", nil)
		for k, v := range c.hdr {
			r.Header.Set(k, v)
		}
		if got := CrossOrigin(r, own) == ""; got != c.ok {
			t.Errorf("%s %v: allowed %v, want %v", c.method, c.hdr, got, c.ok)
		}
	}
}
