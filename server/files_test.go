package server

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

func TestContentDisposition(t *testing.T) {
	for name, want := range map[string]string{
		"report.pdf":    `attachment; filename="report.pdf"; filename*=UTF-8''report.pdf`,
		`a"b\c;d%e.txt`: `attachment; filename="a_b_c_d_e.txt"; filename*=UTF-8''a%22b%5Cc%3Bd%25e.txt`,
		"a\r\nb.txt":    `attachment; filename="a__b.txt"; filename*=UTF-8''a%0D%0Ab.txt`,
		"résumé 1.pdf":  `attachment; filename="r_sum_ 1.pdf"; filename*=UTF-8''r%C3%A9sum%C3%A9%201.pdf`,
		"日本.txt":        `attachment; filename="__.txt"; filename*=UTF-8''%E6%97%A5%E6%9C%AC.txt`,
		"bad\xffutf8":   `attachment; filename="bad_utf8"; filename*=UTF-8''bad%EF%BF%BDutf8`,
	} {
		got := contentDisposition(name)
		if got != want {
			t.Errorf("contentDisposition(%q) = %s, want %s", name, got, want)
		}
		if strings.ContainsAny(got, "\r\n\x00") || strings.Count(got, `"`) != 2 {
			t.Errorf("contentDisposition(%q) = %q is not a safe header", name, got)
		}
	}
}

// Uploads have their own body limit (maxUploadBytes); other routes keep
// limits.maxBodyBytes.
func TestUploadBodyLimit(t *testing.T) {
	e := newAPIEnv(t)
	body := bytes.Repeat([]byte("x"), int(e.s.cfg.Limits.MaxBodyBytes)+1)
	rec := e.do("PUT", "/v1/sandbox/nosuch/files?path=/workspace/a", e.token, bytes.NewReader(body))
	apiError(t, rec, http.StatusNotFound, "not_found")
	rec = e.do("POST", "/v1/sandbox/terminal/nosuch", e.token, bytes.NewReader(body))
	apiError(t, rec, http.StatusRequestEntityTooLarge, "too_large")
	rec = e.do("PUT", "/v1/sandbox/nosuch/files?path=/workspace/a", e.token, strings.NewReader("x"),
		func(r *http.Request) { r.ContentLength = maxUploadBytes + 1 })
	apiError(t, rec, http.StatusRequestEntityTooLarge, "too_large")
	rec = e.do("GET", "/v1/sandbox/nosuch/files?path=/workspace/..", e.token, nil)
	apiError(t, rec, http.StatusBadRequest, "invalid_path")
	rec = e.do("GET", "/v1/sandbox/nosuch/artifacts/%2e%2e/etc/passwd", e.token, nil)
	apiError(t, rec, http.StatusBadRequest, "invalid_path")
}
