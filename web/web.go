package web

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed dist
var dist embed.FS

// CSP is the Content-Security-Policy of every console response: scripts,
// styles, images and connections only from the console's own origin (the
// API's), no plugins, no framing, no inline code.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; " +
	"font-src 'self'; connect-src 'self'; manifest-src 'self'; frame-src 'none'; worker-src 'none'; " +
	"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// AssetsPrefix is where the built files are served; "/" serves index.html.
const AssetsPrefix = "/assets/"

type file struct {
	body  []byte
	gz    []byte // gzip of body when that is smaller by a tenth or more
	ctype string
	etag  string
}

// Console serves the embedded console.
type Console struct {
	files map[string]file // "index.html", "app.js", ...
	mod   time.Time
}

// New loads the embedded build.
func New() *Console {
	c := &Console{files: map[string]file{}}
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err)
	}
	fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(sub, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ct := mime.TypeByExtension(path.Ext(p))
		if strings.HasSuffix(p, ".txt") {
			ct = "text/plain; charset=utf-8"
		}
		if ct == "" {
			ct = "application/octet-stream"
		}
		f := file{body: b, ctype: ct, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		var z bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
		zw.Write(b)
		zw.Close()
		if z.Len() < len(b)*9/10 {
			f.gz = z.Bytes()
		}
		c.files[p] = f
		return nil
	})
	return c
}

// Has reports whether name is a built file (for tests and the router).
func (c *Console) Has(name string) bool { _, ok := c.files[name]; return ok }

// Header sets the console's security headers on h.
func Header(h http.Header) {
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), usb=(), payment=()")
}

// ServeIndex answers GET / with the console's page.
func (c *Console) ServeIndex(w http.ResponseWriter, r *http.Request) {
	c.serve(w, r, "index.html")
}

// ServeAsset answers GET /assets/<name>; false if there is no such file.
func (c *Console) ServeAsset(w http.ResponseWriter, r *http.Request, name string) bool {
	if name == "index.html" || !c.Has(name) {
		return false
	}
	c.serve(w, r, name)
	return true
}

// acceptsGzip reads an Accept-Encoding header: gzip listed and not "q=0".
func acceptsGzip(v string) bool {
	for _, part := range strings.Split(v, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") {
			q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}

func (c *Console) serve(w http.ResponseWriter, r *http.Request, name string) {
	f := c.files[name]
	h := w.Header()
	Header(h)
	h.Set("Content-Type", f.ctype)
	// Revalidate every time (cheap: an ETag), so an upgraded server never
	// runs an old script against a new API.
	h.Set("Cache-Control", "no-cache")
	body, etag := f.body, f.etag
	if f.gz != nil {
		h.Add("Vary", "Accept-Encoding")
		if acceptsGzip(r.Header.Get("Accept-Encoding")) {
			// Compressed once at start (the script is 470 KB, 140 KB
			// gzipped); its own ETag, so caches keep the two apart.
			body, etag = f.gz, strings.TrimSuffix(f.etag, `"`)+`-gz"`
			h.Set("Content-Encoding", "gzip")
		}
	}
	h.Set("ETag", etag)
	http.ServeContent(w, r, "", c.mod, bytes.NewReader(body))
}
