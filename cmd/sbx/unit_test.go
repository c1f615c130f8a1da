package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/server/client"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestResolvePrecedence(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "tok")
	os.WriteFile(tokFile, []byte("  file-token\n"), 0o600)
	saved := fileConfig{Server: "http://saved:1", Token: "saved-token"}
	cases := []struct {
		name                      string
		flagServer, flagTok, file string
		env                       map[string]string
		cfg                       fileConfig
		wantServer, wantTok, src  string
	}{
		{"defaults", "", "", "", nil, fileConfig{}, DefaultServer, "", ""},
		{"config", "", "", "", nil, saved, "http://saved:1", "saved-token", "config"},
		{"env beats config", "", "", "", map[string]string{"SBX_TOKEN": "env-token", "SBX_SERVER": "http://saved:1/"}, saved, "http://saved:1", "env-token", "SBX_TOKEN"},
		{"flag beats env", "http://flag:2", "flag-token", "", map[string]string{"SBX_TOKEN": "env-token", "SBX_SERVER": "http://env:3"}, saved, "http://flag:2", "flag-token", "--token"},
		{"token file beats env", "", "", tokFile, map[string]string{"SBX_TOKEN": "env-token"}, saved, "http://saved:1", "file-token", "--token-file"},
		{"env server beats config", "", "", "", map[string]string{"SBX_SERVER": "http://env:3"}, saved, "http://env:3", "", ""},
		// The saved token belongs to the saved server only.
		{"saved token not sent elsewhere", "http://other:4", "", "", nil, saved, "http://other:4", "", ""},
		{"saved token, default server", "", "", "", nil, fileConfig{Token: "t0"}, DefaultServer, "t0", "config"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := resolve(tc.flagServer, tc.flagTok, tc.file, envOf(tc.env), nil, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if c.Server != tc.wantServer || c.Token != tc.wantTok || c.TokenSource != tc.src {
				t.Errorf("got %+v, want server %s token %q from %q", c, tc.wantServer, tc.wantTok, tc.src)
			}
		})
	}
	if _, err := resolve("", "a", tokFile, envOf(nil), nil, fileConfig{}); !errors.As(err, new(usageError)) {
		t.Errorf("--token with --token-file: %v", err)
	}
	c, err := resolve("", "", "-", envOf(nil), strings.NewReader("stdin-token\n"), fileConfig{})
	if err != nil || c.Token != "stdin-token" {
		t.Errorf("--token-file -: %+v %v", c, err)
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	path, err := configPath(envOf(map[string]string{"XDG_CONFIG_HOME": dir}))
	if err != nil || path != filepath.Join(dir, "sbx", "config.json") {
		t.Fatalf("%s %v", path, err)
	}
	if p, _ := configPath(envOf(map[string]string{"HOME": "/home/u"})); p != "/home/u/.config/sbx/config.json" {
		t.Errorf("without XDG_CONFIG_HOME: %s", p)
	}
	if c, err := loadConfig(path); err != nil || c != (fileConfig{}) {
		t.Errorf("missing file: %+v %v", c, err)
	}
	want := fileConfig{Server: "http://x:1", Token: "sbx_secret"}
	if err := saveConfig(path, want); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", st.Mode())
	}
	if c, err := loadConfig(path); err != nil || c != want {
		t.Errorf("reload: %+v %v", c, err)
	}
}

// The CLI against a fake server: --token beats $SBX_TOKEN beats the saved
// token, and API errors print as the contract says.
func TestCLITokenPrecedenceAndErrors(t *testing.T) {
	var seen []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Header.Get("Authorization"))
		switch r.URL.Path {
		case "/v1/me":
			io.WriteString(w, `{"user":{"id":"u1","name":"owner"},"organization":{"id":"o1","name":"acme"},"role":"owner"}`)
		case "/v1/sandbox/missing":
			w.Header().Set("X-Request-Id", "req-7")
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"code":"not_found","message":"no such session","requestId":"req-7"}}`)
		default:
			io.WriteString(w, `{"sandboxes":[]}`)
		}
	}))
	defer ts.Close()
	cfgDir := t.TempDir()
	run := func(env map[string]string, argv ...string) (int, string, string) {
		env["XDG_CONFIG_HOME"] = cfgDir
		var out, errb bytes.Buffer
		a := newApp(strings.NewReader(""), &out, &errb, envOf(env))
		cmd := a.root()
		cmd.SetArgs(argv)
		return report(&errb, cmd.Execute()), out.String(), errb.String()
	}
	if code, out, errs := run(map[string]string{}, "login", "--server", ts.URL, "--token", "saved"); code != 0 || !strings.Contains(out, "as owner") {
		t.Fatalf("login: %d %q %q", code, out, errs)
	}
	run(map[string]string{}, "ls")
	run(map[string]string{"SBX_TOKEN": "env"}, "ls")
	run(map[string]string{"SBX_TOKEN": "env"}, "ls", "--token", "flag")
	want := []string{"Bearer saved", "Bearer saved", "Bearer env", "Bearer flag"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Errorf("tokens sent %v, want %v", seen, want)
	}
	code, _, errs := run(map[string]string{}, "get", "missing")
	if code != 1 || errs != "sbx: no such session (not_found, request req-7)\n" {
		t.Errorf("error: %d %q", code, errs)
	}
	if code, _, _ := run(map[string]string{}, "get"); code != 2 {
		t.Errorf("usage error: exit %d", code)
	}
	if code, _, _ := run(map[string]string{}, "provision", "s1", "--secret", "K=literal"); code != 2 {
		t.Errorf("literal secret: exit %d", code)
	}
}

func TestReport(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		msg  string
	}{
		{nil, 0, ""},
		{exitStatus(3), 3, ""},
		{usagef("bad"), 2, "sbx: bad\n"},
		{&client.Error{Status: 409, Code: "conflict", Message: "used", RequestID: "r1"}, 1, "sbx: used (conflict, request r1)\n"},
		{errors.New("boom"), 1, "sbx: boom\n"},
		{&client.Error{Status: 400, Code: "invalid_request", Message: "bad", RequestID: "r2", Details: map[string]any{"z": []any{1.0}, "a": true, "plan": "free"}},
			1, "sbx: bad (invalid_request, request r2)\n  plan: free  a: true  z: [1]\n"},
	} {
		var b bytes.Buffer
		if code := report(&b, tc.err); code != tc.code || !strings.HasPrefix(b.String(), tc.msg) {
			t.Errorf("report(%v) = %d %q", tc.err, code, b.String())
		}
	}
}

// A 402 with details prints them under the message, known ones first.
func TestCLIErrorDetails(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req-9")
		w.WriteHeader(402)
		io.WriteString(w, `{"error":{"code":"insufficient_credits","requestId":"req-9",`+
			`"message":"not enough credits: 0.000 left this period","details":{"plan":"free","periodEnd":"2026-02-15T00:00:00Z",`+
			`"creditsPerHour":1,"size":"standard-1","needed":0.084,"remaining":0,"extra":"x"}}}`)
	}))
	defer ts.Close()
	var out, errb bytes.Buffer
	a := newApp(strings.NewReader(""), &out, &errb, envOf(map[string]string{"XDG_CONFIG_HOME": t.TempDir()}))
	cmd := a.root()
	cmd.SetArgs([]string{"provision", "s1", "--server", ts.URL, "--token", "t"})
	code := report(&errb, cmd.Execute())
	want := "sbx: not enough credits: 0.000 left this period (insufficient_credits, request req-9)\n" +
		"  remaining: 0  needed: 0.084  size: standard-1  creditsPerHour: 1  periodEnd: 2026-02-15T00:00:00Z  plan: free  extra: x\n"
	if code != 1 || errb.String() != want || out.Len() != 0 {
		t.Errorf("exit %d\nstderr %q\nwant   %q\nstdout %q", code, errb.String(), want, out.String())
	}
}

func TestPrintUsage(t *testing.T) {
	day := func(s string) time.Time { d, _ := time.Parse(time.DateOnly, s); return d }
	u := &client.Usage{
		Organization: client.Ref{ID: "org_1", Name: "acme"},
		Plan:         client.Plan{Name: "free", MonthlyCredits: 20, LargestSize: "standard-2", MaxConcurrent: 2},
		Period:       client.Period{Start: day("2026-01-15"), End: day("2026-02-15")},
		Allowance:    client.Amount{Credits: 20, Milli: 20000}, Granted: client.Amount{Credits: 0.5, Milli: 500},
		Used: client.Amount{Credits: 20.709, Milli: 20709}, Remaining: client.Amount{Credits: -0.209, Milli: -209},
		Sessions: []client.SessionUsage{{SessionID: "demo-1", Status: "stopped", Size: "standard-1", RunningSeconds: 754.2,
			Credits: client.Amount{Milli: 209}, EgressBytes: 2048, SavedBytes: 81920}, {SessionID: "gone", RunningSeconds: 3600, Credits: client.Amount{Milli: 20500}}},
		Days: []client.DayUsage{{Date: "2026-01-20", RunningSeconds: 4354.2, Credits: client.Amount{Milli: 20709}}},
	}
	var b bytes.Buffer
	printUsage(&b, u, day("2026-02-01"))
	want := `organization:  acme (org_1)
plan:          free (20 credits a month, sizes up to standard-2, 2 sandboxes at once, no pause)
period:        2026-01-15 to 2026-02-15 UTC (current, 14 days left)
allowance:     20.000 credits
granted:       0.500
used:          20.709
remaining:     -0.209

SESSION  SIZE        STATUS   RUNNING  CREDITS  EGRESS   SAVED
demo-1   standard-1  stopped  12m34s   0.209    2.0 KiB  80.0 KiB
gone     -           -        1h0m0s   20.500   0 B      0 B

DAY (UTC)   RUNNING   CREDITS
2026-01-20  1h12m34s  20.709
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	u.Sessions, u.Days = nil, nil
	printUsage(&b, u, day("2026-03-01"))
	if !strings.Contains(b.String(), "UTC (ended)\n") || !strings.HasSuffix(b.String(), "\nNo session ran in this period.\n") {
		t.Errorf("empty period:\n%s", b.String())
	}
}

func TestOverlap(t *testing.T) {
	for _, tc := range []struct {
		seen, replay string
		want         int
	}{
		{"", "abc", 0},
		{"hello $ ", "hello $ ", 8},           // nothing new
		{"xxhello $ ", "hello $ ls\r\n", 8},   // new output after what was seen
		{"abcabc", "abcabcabd", 6},            // the longest overlap
		{"$ echo 1\r\n1\r\n$ ", "2\r\n$ ", 0}, // the ring wrapped: nothing seen in it
		{"aaaa", "aaaaaa", 4},
		{strings.Repeat("ab", 1000), "abab!", 4},
	} {
		if got := overlap([]byte(tc.seen), []byte(tc.replay)); got != tc.want {
			t.Errorf("overlap(%q, %q) = %d, want %d", tc.seen, tc.replay, got, tc.want)
		}
	}
}

func TestParseRemote(t *testing.T) {
	for in, want := range map[string]string{
		"s1:/workspace/a.txt": "s1 /workspace/a.txt",
		"s1:out/r.pdf":        "s1 /workspace/out/r.pdf",
		"s1:/workspace/dir/":  "s1 /workspace/dir/",
		"s1:":                 "s1 /workspace/",
		"./a:b":               "local",
		"/tmp/x":              "local",
		"-":                   "local",
	} {
		r, ok := parseRemote(in)
		got := "local"
		if ok {
			got = r.Session + " " + r.Path
		}
		if got != want {
			t.Errorf("parseRemote(%q) = %q, want %q", in, got, want)
		}
	}
}

// sbx talks to the server only through the client package.
func TestOnlyClientDependency(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, d := range strings.Fields(string(out)) {
		if strings.HasPrefix(d, "sandboxd/") && d != "sandboxd/cmd/sbx" && d != "sandboxd/server/client" {
			t.Errorf("sbx depends on %s", d)
		}
	}
}

// exec and code runs say what the output cap dropped and that a command
// was stopped for its output (exit 141 passes through).
func TestExecSaysWhatWasDropped(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.URL.Path, "/python/") {
			io.WriteString(w, `{"stdout":"x","stderr":"","result":null,"error":{"name":"KeyboardInterrupt","value":"","traceback":""},"display":[],"contextId":"default","durationMs":5,"timedOut":false,"truncated":true,"stdoutDropped":70000000,"stderrDropped":0,"stoppedForOutput":true}`)
			return
		}
		io.WriteString(w, `{"exitCode":141,"stdout":"y\n","stderr":"","durationMs":900,"timedOut":false,"truncated":true,"oom":false,"stdoutDropped":67108870,"stderrDropped":12,"stoppedForOutput":true}`)
	}))
	defer ts.Close()
	run := func(stdin string, args ...string) (int, string) {
		var out, errb bytes.Buffer
		a := newApp(strings.NewReader(stdin), &out, &errb, envOf(map[string]string{"XDG_CONFIG_HOME": t.TempDir()}))
		cmd := a.root()
		cmd.SetArgs(args)
		return report(&errb, cmd.Execute()), errb.String()
	}
	code, stderr := run("", "exec", "demo", "-n", "--server", ts.URL, "--token", "sbx_t", "--", "yes")
	if code != 141 || !strings.Contains(stderr, "stopped") || !strings.Contains(stderr, "67108870 bytes of stdout and 12 of stderr") {
		t.Errorf("exec: %d %q", code, stderr)
	}
	_, stderr = run("while True: print(1)", "run", "python", "demo", "--server", ts.URL, "--token", "sbx_t")
	if !strings.Contains(stderr, "interrupted") || !strings.Contains(stderr, "70000000 bytes of stdout") {
		t.Errorf("run: %q", stderr)
	}
}

// A call refused by the server's rate limits waits Retry-After and is
// sent again, saying so on stderr (not with --json: stdout is the
// answer, stderr stays quiet); past the retries the 429 is the error.
func TestCLIRetriesRateLimited(t *testing.T) {
	var mu sync.Mutex
	refuse := 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := refuse
		refuse--
		mu.Unlock()
		if n > 0 {
			w.Header().Set("Retry-After", "0")
			w.Header().Set("X-Request-Id", "req-4")
			w.WriteHeader(429)
			io.WriteString(w, `{"error":{"code":"rate_limited","message":"too many requests from your address: at most 5 a second (bursts of 5); retry in 1 s","requestId":"req-4"}}`)
			return
		}
		io.WriteString(w, `{"sandboxes":[]}`)
	}))
	defer ts.Close()
	run := func(refusals int, argv ...string) (int, string, string) {
		mu.Lock()
		refuse = refusals
		mu.Unlock()
		var out, errb bytes.Buffer
		a := newApp(strings.NewReader(""), &out, &errb, envOf(map[string]string{"XDG_CONFIG_HOME": t.TempDir()}))
		cmd := a.root()
		cmd.SetArgs(append(argv, "--server", ts.URL, "--token", "t"))
		return report(&errb, cmd.Execute()), out.String(), errb.String()
	}
	code, out, errs := run(2, "ls")
	if code != 0 || errs != strings.Repeat("sbx: rate limited: retrying now\n", 2) || !strings.Contains(out, "SESSION") {
		t.Errorf("ls after two 429s: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if code, out, errs := run(2, "ls", "--json"); code != 0 || errs != "" || !strings.Contains(out, `"sandboxes"`) {
		t.Errorf("ls --json after two 429s: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, _, errs = run(100, "ls")
	want := strings.Repeat("sbx: rate limited: retrying now\n", 3) +
		"sbx: too many requests from your address: at most 5 a second (bursts of 5); retry in 1 s (rate_limited, request req-4)\n"
	if code != 1 || errs != want {
		t.Errorf("ls past the retries: exit %d, stderr %q", code, errs)
	}
}

func TestRetryNotice(t *testing.T) {
	for _, tc := range []struct {
		wait   time.Duration
		status int
		want   string
	}{
		{2130 * time.Millisecond, 429, "sbx: rate limited: retrying in 2s\n"},
		{430 * time.Millisecond, 429, "sbx: rate limited: retrying in 400ms\n"},
		{20 * time.Millisecond, 429, "sbx: rate limited: retrying now\n"},
		{time.Second, 503, "sbx: the server is unavailable: retrying in 1s\n"},
	} {
		var errb bytes.Buffer
		a := newApp(strings.NewReader(""), io.Discard, &errb, envOf(nil))
		a.retryNotice(client.Retry{Wait: tc.wait, Err: &client.Error{Status: tc.status}})
		if errb.String() != tc.want {
			t.Errorf("%v %d: %q, want %q", tc.wait, tc.status, errb.String(), tc.want)
		}
	}
}
