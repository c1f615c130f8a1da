package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Review 3: `sbx exec` exits with the remote command's status, and with 1
// when sbx itself fails (paused or missing session, revoked token, server
// down). A script cannot tell `test -f x` answering 1 ("no such file")
// from "the command never ran": `sbx exec demo -- test -f done || rerun`
// reruns the job when the session is merely paused. ssh keeps 255 for its
// own failures for this reason; sbx's own failure of an exec must not look
// like a remote exit status of 1.
func TestReview3ExecOwnFailureIsNotExit1(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"error":{"code":"conflict","message":"session is paused; resume it first","requestId":"r1"}}`)
	}))
	defer ts.Close()
	var out, errb bytes.Buffer
	a := newApp(strings.NewReader(""), &out, &errb, envOf(map[string]string{"XDG_CONFIG_HOME": t.TempDir()}))
	cmd := a.root()
	cmd.SetArgs([]string{"exec", "demo", "-n", "--server", ts.URL, "--token", "sbx_t", "--", "test -f done"})
	if code := report(&errb, cmd.Execute()); code == 1 || code == 0 {
		t.Fatalf("exec that never ran exits %d, the same as a remote `exit %d` (%s)", code, code, strings.TrimSpace(errb.String()))
	}
}
