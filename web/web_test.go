package web

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func serve(t *testing.T, c *Console, path string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	if path == "/" {
		c.ServeIndex(w, r)
	} else if !c.ServeAsset(w, r, strings.TrimPrefix(path, AssetsPrefix)) {
		w.Code = http.StatusNotFound
	}
	return w
}

// Every file carries the CSP and the other headers; scripts and styles
// come only from this origin; index.html is not an asset.
func TestConsoleFiles(t *testing.T) {
	c := New()
	for _, f := range []struct{ path, ctype string }{
		{"/", "text/html; charset=utf-8"},
		{"/assets/app.js", "text/javascript; charset=utf-8"},
		{"/assets/app.css", "text/css; charset=utf-8"},
		{"/assets/icon.svg", "image/svg+xml"},
		{"/assets/app.js.LEGAL.txt", "text/plain; charset=utf-8"},
	} {
		w := serve(t, c, f.path)
		if w.Code != 200 || w.Header().Get("Content-Type") != f.ctype || w.Body.Len() == 0 {
			t.Errorf("%s: %d %q %d bytes", f.path, w.Code, w.Header().Get("Content-Type"), w.Body.Len())
		}
		for k, v := range map[string]string{"Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
			"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cross-Origin-Opener-Policy": "same-origin"} {
			if got := w.Header().Get(k); got != v {
				t.Errorf("%s: %s = %q", f.path, k, got)
			}
		}
		// Revalidated with its ETag.
		if w2 := serve(t, c, f.path, "If-None-Match", w.Header().Get("ETag")); w2.Code != http.StatusNotModified {
			t.Errorf("%s with its ETag: %d", f.path, w2.Code)
		}
	}
	// The script goes gzipped to browsers that take it, whole to others.
	plain := serve(t, c, "/assets/app.js")
	gz := serve(t, c, "/assets/app.js", "Accept-Encoding", "gzip, deflate, br")
	if gz.Header().Get("Content-Encoding") != "gzip" || gz.Body.Len()*2 > plain.Body.Len() || gz.Header().Get("ETag") == plain.Header().Get("ETag") ||
		!strings.Contains(gz.Header().Get("Vary"), "Accept-Encoding") || gz.Header().Get("Content-Security-Policy") != CSP {
		t.Errorf("gzip: %v, %d vs %d bytes", gz.Header(), gz.Body.Len(), plain.Body.Len())
	}
	zr, err := gzip.NewReader(gz.Body)
	if err != nil {
		t.Fatal(err)
	}
	if un, _ := io.ReadAll(zr); !bytes.Equal(un, plain.Body.Bytes()) {
		t.Error("gunzipped script differs")
	}
	if w := serve(t, c, "/assets/app.js", "Accept-Encoding", "gzip;q=0, identity"); w.Header().Get("Content-Encoding") != "" {
		t.Error("gzip sent though refused")
	}
	for _, p := range []string{"/assets/index.html", "/assets/nope.js", "/assets/../web.go", "/assets/"} {
		if w := serve(t, c, p); w.Code != http.StatusNotFound {
			t.Errorf("%s: %d", p, w.Code)
		}
	}
	for _, d := range []string{"script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'", "object-src 'none'", "base-uri 'none'"} {
		if !strings.Contains(CSP, d) {
			t.Errorf("CSP lacks %q", d)
		}
	}
	if strings.Contains(CSP, "unsafe") || strings.Contains(CSP, "*") || strings.Contains(CSP, "http") {
		t.Errorf("CSP is not strict: %s", CSP)
	}
	// The page loads only its own files: no inline script or style, no
	// other origin.
	idx := serve(t, c, "/").Body.String()
	if strings.Contains(idx, "<script>") || strings.Contains(idx, "<style") || strings.Contains(idx, "style=") {
		t.Errorf("index.html has inline code or a foreign URL:\n%s", idx)
	}
	if strings.Contains(idx, "http:") || strings.Contains(idx, "https:") {
		t.Errorf("index.html names another origin:\n%s", idx)
	}
	js := serve(t, c, "/assets/app.js").Body.String()
	for _, bad := range []string{"fonts.googleapis", "cdn.jsdelivr", "unpkg.com", "localStorage.setItem"} {
		if strings.Contains(js, bad) {
			t.Errorf("app.js contains %q", bad)
		}
	}
}

// TestDistInSync rebuilds the console from src/ and the locked packages
// and compares it with the committed dist/ byte for byte: the embedded
// build is the one the sources make.
func TestDistInSync(t *testing.T) {
	if _, err := os.Stat("node_modules/.package-lock.json"); err != nil {
		t.Fatal("web/node_modules is missing: run `make web` (npm ci from the lockfile)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is missing: `make test` installs it (configs/host/packages.txt)")
	}
	out := filepath.Join(t.TempDir(), "dist")
	cmd := exec.Command(node, "build.mjs", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	want, _ := filepath.Glob("dist/*")
	got, _ := filepath.Glob(filepath.Join(out, "*"))
	if len(want) != len(got) || len(want) == 0 {
		t.Fatalf("dist has %d files, a fresh build %d", len(want), len(got))
	}
	for _, p := range want {
		a, _ := os.ReadFile(p)
		b, err := os.ReadFile(filepath.Join(out, filepath.Base(p)))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs from a fresh build of src/ (%v): run `make web` and commit web/dist", p, err)
		}
	}
}
