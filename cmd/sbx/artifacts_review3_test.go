package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Review 3: file names inside a sandbox are the sandbox's to choose (code
// running there is untrusted), and `sbx artifacts` prints them to the
// user's terminal as they are: a name with escape sequences retitles the
// terminal, clears it, recolours or rewrites what the user sees (here an
// OSC title and a fake "PATH" row after a newline). Names must be printed
// with control characters escaped (as ls -b, or Go's %q), never raw.
func TestReview3ArtifactNamesEscaped(t *testing.T) {
	evil := "out/evil\x1b]0;pwned\x07\x1b[2J\rreport.pdf\nfake.txt  1  2026-01-01 00:00:00  000000000000"
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandbox/demo/artifacts" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `[{"path":`+jsonString(evil)+`,"size":3,"modifiedAt":"2026-12-01T00:00:00Z","sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}]`)
	}))
	defer ts.Close()
	var out, errb bytes.Buffer
	a := newApp(strings.NewReader(""), &out, &errb, envOf(map[string]string{"XDG_CONFIG_HOME": t.TempDir()}))
	cmd := a.root()
	cmd.SetArgs([]string{"artifacts", "demo", "--server", ts.URL, "--token", "sbx_t"})
	if code := report(&errb, cmd.Execute()); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	printed := out.String()
	if strings.ContainsAny(printed, "\x1b\x07\r") || strings.Count(printed, "\n") != 2 {
		t.Fatalf("sandbox-chosen control characters reached the terminal:\n%q", printed)
	}
}

func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&15])
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
