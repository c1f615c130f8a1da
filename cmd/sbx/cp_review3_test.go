package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Review 3: a download to a local path that is not a regular file (a FIFO,
// a character device such as /dev/null or /dev/stdout, a terminal) writes
// a temporary file next to it and renames it over the path: the FIFO, or
// the device node, is replaced by a regular file. `sudo sbx cp
// demo:/workspace/big.log /dev/null` turns the host's /dev/null into a
// regular file; `sbx cp demo:out.csv /tmp/pipe` leaves the pipe's reader
// with nothing. A path that exists and is not a regular file must be
// written through (or refused), never replaced.
func TestReview3CpDownloadToFIFOKeepsIt(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandbox/demo/files" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		io.WriteString(w, "file bytes\n")
	}))
	defer ts.Close()
	fifo := filepath.Join(t.TempDir(), "pipe")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		f, err := os.OpenFile(fifo, os.O_RDONLY, 0)
		if err != nil {
			got <- "open: " + err.Error()
			return
		}
		defer f.Close()
		b, _ := io.ReadAll(f)
		got <- string(b)
	}()
	var out, errb bytes.Buffer
	a := newApp(strings.NewReader(""), &out, &errb, envOf(map[string]string{"XDG_CONFIG_HOME": t.TempDir()}))
	cmd := a.root()
	cmd.SetArgs([]string{"cp", "demo:/workspace/f.txt", fifo, "--server", ts.URL, "--token", "sbx_t"})
	code := report(&errb, cmd.Execute())
	st, err := os.Lstat(fifo)
	if err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("exit %d (%s): the FIFO at %s is now %v (%v)", code, strings.TrimSpace(errb.String()), fifo, st.Mode(), err)
	}
	if code != 0 {
		return // refused: the FIFO is kept
	}
	select {
	case s := <-got:
		if s != "file bytes\n" {
			t.Fatalf("the FIFO's reader got %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the FIFO's reader got nothing")
	}
}
