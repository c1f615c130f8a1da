package portal

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// CookieName is the portal cookie's name. It is set host-only on one
// session's portal origin and removed from every request before the
// sandbox sees it.
const CookieName = "sandboxd_portal"

// CookieTTL is how long a portal cookie is valid; the token behind it is
// checked on every request as well.
const CookieTTL = 12 * time.Hour

// Grant is what a portal cookie says: who opened which session's portal,
// until when.
type Grant struct {
	Org     string    `json:"o"`
	Session string    `json:"s"`
	User    string    `json:"u"`
	Token   string    `json:"t"` // the API token the ticket was made with
	Expires time.Time `json:"e"`
}

// Keyring signs and checks portal cookies.
type Keyring struct{ key []byte }

// LoadKey reads the signing key from path, creating it (0600, 32 random
// bytes) if it is missing, so cookies outlive a restart.
func LoadKey(path string) (*Keyring, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		b = make([]byte, 32)
		rand.Read(b)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("portal key: %w", err)
		}
		_, err = f.Write(b)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("portal key: %w", err)
		}
		return &Keyring{key: b}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("portal key: %w", err)
	}
	if len(b) < 32 {
		return nil, errors.New("portal key: shorter than 32 bytes")
	}
	return &Keyring{key: b}, nil
}

// NewKeyring uses key as it is (tests).
func NewKeyring(key []byte) *Keyring { return &Keyring{key: key} }

func (k *Keyring) mac(b []byte) []byte {
	h := hmac.New(sha256.New, k.key)
	h.Write([]byte("sandboxd portal cookie v1\x00"))
	h.Write(b)
	return h.Sum(nil)
}

// Sign encodes a grant as a cookie value.
func (k *Keyring) Sign(g Grant) string {
	b, _ := json.Marshal(g)
	return "v1." + base64.RawURLEncoding.EncodeToString(b) + "." + base64.RawURLEncoding.EncodeToString(k.mac(b))
}

// Verify decodes a cookie value signed by this keyring that has not expired.
func (k *Keyring) Verify(v string, now time.Time) (Grant, bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 3 || parts[0] != "v1" {
		return Grant{}, false
	}
	b, err1 := base64.RawURLEncoding.DecodeString(parts[1])
	sig, err2 := base64.RawURLEncoding.DecodeString(parts[2])
	if err1 != nil || err2 != nil || !hmac.Equal(sig, k.mac(b)) {
		return Grant{}, false
	}
	var g Grant
	if json.Unmarshal(b, &g) != nil || !now.Before(g.Expires) {
		return Grant{}, false
	}
	return g, true
}

// Grants returns every valid grant in r's portal cookies for the session
// whose key is key. Several cookies of the name may arrive (a page of
// another portal origin can set one for a parent domain); only those
// signed for this session count.
func (k *Keyring) Grants(r *http.Request, key string, now time.Time) []Grant {
	var out []Grant
	for _, c := range r.CookiesNamed(CookieName) {
		if g, ok := k.Verify(c.Value, now); ok && SessionKey(g.Org, g.Session) == key {
			out = append(out, g)
		}
	}
	return out
}

// SessionKey is the DNS label of a session's portal origin: fixed length,
// lower-case hex, the same across restarts. It is not a secret: the cookie
// is what grants access.
func SessionKey(orgID, sessionID string) string {
	sum := sha256.Sum256([]byte("portal\x00" + orgID + "\x00" + sessionID))
	return "s" + hex.EncodeToString(sum[:10])
}

// StripCookie removes the portal cookie from a request's Cookie headers,
// keeping the sandbox's own cookies, so the sandbox never sees it.
func StripCookie(h http.Header) {
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return
	}
	var kept []string
	for _, line := range lines {
		for _, part := range strings.Split(line, ";") {
			name, _, _ := strings.Cut(strings.TrimSpace(part), "=")
			if strings.TrimSpace(part) != "" && name != CookieName {
				kept = append(kept, strings.TrimSpace(part))
			}
		}
	}
	h.Del("Cookie")
	if len(kept) > 0 {
		h.Set("Cookie", strings.Join(kept, "; "))
	}
}

// CrossOrigin reports why a cookie-authenticated request must be refused
// because another origin made it ("" if it may pass). origin is the
// portal's own ("http://s1.localhost:8080"). Every portal origin of a
// server is on one site (one parent domain), so SameSite does not keep one
// session's pages from sending requests with another session's cookie:
// only requests the browser says this origin made (Sec-Fetch-Site
// same-origin) or a person made (none: typed, a bookmark) pass, and no
// request with a foreign Origin. A browser sends no Fetch Metadata to a
// non-secure origin (plain http on a real domain); then a foreign Referer
// refuses it, and what has neither passes (docs/SECURITY.md: use https).
func CrossOrigin(r *http.Request, origin string) string {
	if o := r.Header.Get("Origin"); o != "" && o != origin {
		return "request from another origin"
	}
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin", "none":
		return ""
	case "":
		if ref := r.Header.Get("Referer"); ref != "" {
			if u, err := url.Parse(ref); err != nil || u.Scheme+"://"+u.Host != origin {
				return "request from another origin"
			}
		}
		return ""
	}
	return "request from another origin"
}
