package server

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/store"
)

// Unit tests of the pure parts of the server: validation, permissions, sizes,
// configuration, command environment, output capping, redaction, the
// lifecycle table and credits. No root, no gVisor.

func TestValidSessionID(t *testing.T) {
	cases := []struct {
		in   string
		want bool
	}{
		{"a", true},
		{"0", true},
		{"sess-1", true},
		{"Sess_1.2-3", true},
		{"a" + strings.Repeat("b", 127), true},  // 128
		{"a" + strings.Repeat("b", 128), false}, // 129
		{"", false},
		{".hidden", false},
		{"-dash", false},
		{"_under", false},
		{"has space", false},
		{"slash/x", false},
		{"dots..ok", true},
		{"ünïcode", false},
		{"abc\u00e9", false},
		{"abc\n", false},
		{"abc\x00", false},
		{"日本", false},
	}
	for _, c := range cases {
		if got := validSessionID(c.in); got != c.want {
			t.Errorf("validSessionID(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestValidRepo(t *testing.T) {
	cases := []struct {
		in   string
		want bool
	}{
		{"octo/repo", true},
		{"octo-cat/re.po_x-1", true},
		{strings.Repeat("a", 39) + "/r", true},
		{strings.Repeat("a", 40) + "/r", false},
		{"-octo/repo", false},
		{"octo/.", false},
		{"octo/..", false},
		{"octo/.github", true},
		{"octo/" + strings.Repeat("r", 100), true},
		{"octo/" + strings.Repeat("r", 101), false},
		{"octorepo", false},
		{"octo/repo/extra", false},
		{"/repo", false},
		{"octo/", false},
		{"", false},
		{"oc_to/repo", false},
		{"octo/re po", false},
		{"octo/repo\n", false},
	}
	for _, c := range cases {
		if got := validRepo(c.in); got != c.want {
			t.Errorf("validRepo(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestValidBranch(t *testing.T) {
	cases := []struct {
		in   string
		want bool
	}{
		{"main", true},
		{"feature/x-1", true},
		{"release/1.2.3", true},
		{"v1.0", true},
		{"a..b", false},
		{"a@{b", false},
		{"@", false},
		{"topic.lock", false},
		{"dir.lock/x", false},
		{"x/.hidden", false},
		{".hidden", false},
		{"-flag", false},
		{"a//b", false},
		{"a/", false},
		{"/a", false},
		{"ends.", false},
		{"", false},
		{"has space", false},
		{"a~b", false},
		{"a^b", false},
		{"a:b", false},
		{"a\\b", false},
		{"a*b", false},
		{"a?b", false},
		{"a[b", false},
		{strings.Repeat("b", 255), true},
		{strings.Repeat("b", 256), false},
	}
	for _, c := range cases {
		if got := validBranch(c.in); got != c.want {
			t.Errorf("validBranch(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestCheckEnv(t *testing.T) {
	ok := []map[string]string{
		nil,
		{},
		{"FOO": "bar", "_X": "", "A1_B2": "multi\nline"},
		{"BIG": strings.Repeat("x", 128*1024)},
	}
	for _, env := range ok {
		if e := checkEnv("env", env); e != nil {
			t.Errorf("checkEnv(%v) = %v, want nil", len(env), e)
		}
	}
	bad := []struct {
		env  map[string]string
		want string // substring of the message
	}{
		{map[string]string{"1ABC": "x"}, "invalid variable name"},
		{map[string]string{"A-B": "x"}, "invalid variable name"},
		{map[string]string{"": "x"}, "invalid variable name"},
		{map[string]string{"A=B": "x"}, "invalid variable name"},
		{map[string]string{"A B": "x"}, "invalid variable name"},
		{map[string]string{"ÄB": "x"}, "invalid variable name"},
		{map[string]string{strings.Repeat("A", 129): "x"}, "invalid variable name"},
		{map[string]string{"HOME": "/root"}, "HOME is set by the platform"},
		{map[string]string{"USER": "root"}, "USER is set by the platform"},
		{map[string]string{"LOGNAME": "root"}, "LOGNAME is set by the platform"},
		{map[string]string{"SHELL": "/bin/sh"}, "SHELL is set by the platform"},
		{map[string]string{"FOO": "a\x00b"}, "must not contain NUL"},
		{map[string]string{"FOO": strings.Repeat("x", 128*1024+1)}, "under 128 KiB"},
	}
	for _, c := range bad {
		e := checkEnv("secrets", c.env)
		if e == nil {
			t.Errorf("checkEnv(%q) = nil, want error", c.env)
			continue
		}
		status, code, msg := statusOf(e)
		if status != 400 || code != "invalid_request" {
			t.Errorf("checkEnv: status/code = %d/%s, want 400/invalid_request", status, code)
		}
		if !strings.HasPrefix(msg, "secrets: ") || !strings.Contains(msg, c.want) {
			t.Errorf("checkEnv message = %q, want prefix %q and %q", msg, "secrets: ", c.want)
		}
		// Values never appear in messages.
		for _, v := range c.env {
			if len(v) > 3 && strings.Contains(msg, v) {
				t.Errorf("checkEnv message leaks the value: %q", msg)
			}
		}
	}
	many := map[string]string{}
	for i := range 257 {
		many[fmt.Sprintf("V%d", i)] = "x"
	}
	if e := checkEnv("env", many); e == nil || !strings.Contains(e.Error(), "at most 256") {
		t.Errorf("checkEnv(257 vars) = %v, want 'at most 256'", e)
	}
	delete(many, "V0")
	if e := checkEnv("env", many); e != nil {
		t.Errorf("checkEnv(256 vars) = %v, want nil", e)
	}
}

func TestValidCwd(t *testing.T) {
	cases := []struct {
		in   string
		want bool
	}{
		{"/", true},
		{"/workspace", true},
		{"/workspace/sub dir", true},
		{"", false},
		{"workspace", false},
		{"./workspace", false},
		{"/workspace/", false},
		{"/workspace/../etc", false},
		{"/workspace/./x", false},
		{"//workspace", false},
		{"/a\x00b", false},
		{"/" + strings.Repeat("a", 4095), true},
		{"/" + strings.Repeat("a", 4096), false},
	}
	for _, c := range cases {
		if got := validCwd(c.in); got != c.want {
			t.Errorf("validCwd(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestCanTable(t *testing.T) {
	perms := []string{PermProjectUpdate, PermProjectRead, PermAuditRead, PermOrgManage}
	want := map[string]map[string]bool{
		store.RoleOwner:     {PermProjectUpdate: true, PermProjectRead: true, PermAuditRead: true, PermOrgManage: true},
		store.RoleAdmin:     {PermProjectUpdate: true, PermProjectRead: true, PermAuditRead: true, PermOrgManage: true},
		store.RoleDeveloper: {PermProjectUpdate: true, PermProjectRead: true},
		store.RoleViewer:    {PermProjectRead: true},
		"":                  {},
		"root":              {},
		"Owner":             {},
	}
	for role, grants := range want {
		for _, perm := range perms {
			if got := Can(role, perm); got != grants[perm] {
				t.Errorf("Can(%q, %q) = %v, want %v", role, perm, got, grants[perm])
			}
		}
		if Can(role, "") || Can(role, "project.delete") {
			t.Errorf("Can(%q, unknown permission) = true", role)
		}
		var list []string
		for _, perm := range perms {
			if grants[perm] {
				list = append(list, perm)
			}
		}
		got := Permissions(role)
		if len(got) != len(list) || (len(list) > 0 && !reflect.DeepEqual(got, list)) {
			t.Errorf("Permissions(%q) = %v, want %v", role, got, list)
		}
	}
	if Can(store.RoleViewer, PermProjectUpdate) {
		t.Error("viewer must not have project.update")
	}
	// Permissions returns a copy: changing it does not change the table.
	p := Permissions(store.RoleViewer)
	p[0] = PermOrgManage
	if Can(store.RoleViewer, PermOrgManage) {
		t.Error("Permissions returned the table itself")
	}
}

func envMap(t *testing.T, env []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("env entry %q has no '='", kv)
		}
		if _, dup := m[k]; dup {
			t.Fatalf("env has %s twice", k)
		}
		m[k] = v
	}
	return m
}

func TestCommandEnv(t *testing.T) {
	def := commandEnv(nil, nil, nil)
	want := []string{
		"HOME=/home/user", "HTTPS_PROXY=" + runsc.ProxyURL, "HTTP_PROXY=" + runsc.ProxyURL,
		"LANG=C.UTF-8", "LOGNAME=user", "NO_PROXY=localhost,127.0.0.1,::1", "PATH=" + runsc.BasePath,
		"SHELL=/bin/bash", "TERM=dumb", "USER=user",
		"http_proxy=" + runsc.ProxyURL, "https_proxy=" + runsc.ProxyURL, "no_proxy=localhost,127.0.0.1,::1",
	}
	if !reflect.DeepEqual(def, want) {
		t.Errorf("defaults = %q, want %q", def, want)
	}

	sessionEnv := map[string]string{"A": "session", "B": "session", "TERM": "xterm", "LANG": "de_DE.UTF-8"}
	secrets := map[string]string{"B": "secret", "C": "secret", "TOKEN": "s3cr3t-value"}
	reqEnv := map[string]string{"C": "request", "D": "request", "LANG": "request"}
	env := commandEnv(sessionEnv, secrets, reqEnv)
	for i := 1; i < len(env); i++ {
		if env[i-1] >= env[i] {
			t.Fatalf("env not sorted: %q", env)
		}
	}
	m := envMap(t, env)
	wantM := map[string]string{
		"A": "session", "B": "secret", "C": "request", "D": "request", "TOKEN": "s3cr3t-value",
		"TERM": "xterm", "LANG": "request",
		"HOME": "/home/user", "USER": "user", "LOGNAME": "user", "SHELL": "/bin/bash", "PATH": runsc.BasePath,
	}
	for k, v := range runsc.ProxyEnv() {
		wantM[k] = v
	}
	if !reflect.DeepEqual(m, wantM) {
		t.Errorf("commandEnv = %v, want %v", m, wantM)
	}
	// Inputs are not modified.
	if sessionEnv["B"] != "session" || len(sessionEnv) != 4 {
		t.Errorf("sessionEnv modified: %v", sessionEnv)
	}
	// What reaches commandEnv has passed checkEnv, which keeps HOME and
	// friends out of every client-supplied map.
	for _, k := range []string{"HOME", "USER", "LOGNAME", "SHELL"} {
		if checkEnv("env", map[string]string{k: "x"}) == nil {
			t.Errorf("checkEnv accepts %s", k)
		}
	}
}

func TestRedact(t *testing.T) {
	secrets := map[string]string{"TOKEN": "s3cr3t-value", "SHORT": "abc", "API": "key-123456"}
	cases := []struct{ in, want string }{
		{"", ""},
		{"nothing here", "nothing here"},
		{"token=s3cr3t-value;", "token=[REDACTED:TOKEN];"},
		{"s3cr3t-values3cr3t-value", "[REDACTED:TOKEN][REDACTED:TOKEN]"},
		{"a key-123456 and s3cr3t-value", "a [REDACTED:API] and [REDACTED:TOKEN]"},
		// Values under minSecretLen are never replaced (they would redact ordinary text).
		{"abc abc", "abc abc"},
		// A partial value is not redacted.
		{"s3cr3t-valu", "s3cr3t-valu"},
	}
	for _, c := range cases {
		if got := redact(c.in, secrets); got != c.want {
			t.Errorf("redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := redact("s3cr3t-value", nil); got != "s3cr3t-value" {
		t.Errorf("redact with no secrets = %q", got)
	}
}

func TestCappedOutput(t *testing.T) {
	o := newCappedOutput(10)
	out, errw := o.writer(&o.stdout), o.writer(&o.stderr)
	write := func(w capWriter, s string) {
		t.Helper()
		n, err := w.Write([]byte(s))
		if err != nil || n != len(s) {
			t.Fatalf("Write(%q) = %d, %v; want %d, nil (writers always drain)", s, n, err, len(s))
		}
	}
	write(out, "abcd") // 4 kept, 6 left
	if o.truncated {
		t.Fatal("truncated too early")
	}
	write(errw, "EFG")  // 3 kept, 3 left
	write(out, "hijkl") // 3 kept ("hij"), 0 left
	if !o.truncated {
		t.Fatal("not truncated after exceeding the cap")
	}
	write(errw, "MORE") // nothing kept
	write(out, "")
	if got := o.stdout.String(); got != "abcdhij" {
		t.Errorf("stdout = %q, want %q", got, "abcdhij")
	}
	if got := o.stderr.String(); got != "EFG" {
		t.Errorf("stderr = %q, want %q", got, "EFG")
	}
	if n := o.stdout.Len() + o.stderr.Len(); n != 10 {
		t.Errorf("kept %d bytes, want exactly 10", n)
	}

	// Exactly at the cap is not truncated.
	o = newCappedOutput(5)
	w := o.writer(&o.stdout)
	w.Write([]byte("12345"))
	if o.truncated || o.stdout.String() != "12345" {
		t.Errorf("exact fit: %q truncated=%v", o.stdout.String(), o.truncated)
	}
	w.Write([]byte("6"))
	if !o.truncated || o.stdout.String() != "12345" {
		t.Errorf("one past: %q truncated=%v", o.stdout.String(), o.truncated)
	}

	// Concurrent writers share the cap (run with -race).
	o = newCappedOutput(1000)
	done := make(chan struct{})
	for _, b := range []*bytes.Buffer{&o.stdout, &o.stderr} {
		go func() {
			w := o.writer(b)
			for range 200 {
				w.Write([]byte("0123456789"))
			}
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	if n := o.stdout.Len() + o.stderr.Len(); n != 1000 || !o.truncated {
		t.Errorf("concurrent: kept %d, truncated=%v", n, o.truncated)
	}
}

func TestCanTransitionTable(t *testing.T) {
	all := []string{
		store.StatusProvisioning, store.StatusRunning, store.StatusPaused, store.StatusStopping,
		store.StatusStopped, store.StatusFailed, store.StatusDeleted,
	}
	allowed := map[[2]string]bool{
		{store.StatusProvisioning, store.StatusRunning}: true,
		{store.StatusProvisioning, store.StatusFailed}:  true,
		{store.StatusProvisioning, store.StatusStopped}: true, // a failed resume
		{store.StatusStopped, store.StatusProvisioning}: true, // resume
		{store.StatusRunning, store.StatusStopping}:     true,
		{store.StatusRunning, store.StatusFailed}:       true,
		{store.StatusRunning, store.StatusDeleted}:      true,
		{store.StatusStopping, store.StatusStopped}:     true,
		{store.StatusStopping, store.StatusFailed}:      true,
		{store.StatusFailed, store.StatusStopping}:      true,
		{store.StatusFailed, store.StatusDeleted}:       true,
		{store.StatusStopped, store.StatusDeleted}:      true,
	}
	for _, from := range all {
		for _, to := range all {
			want := allowed[[2]string{from, to}]
			if got := canTransition(from, to); got != want {
				t.Errorf("canTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
		if canTransition(from, "bogus") || canTransition("bogus", from) {
			t.Errorf("unknown status accepted with %s", from)
		}
	}
	// deleted is terminal.
	for _, to := range all {
		if canTransition(store.StatusDeleted, to) {
			t.Errorf("deleted -> %s allowed", to)
		}
	}
}

func TestCredits(t *testing.T) {
	start := time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC)
	ses := &store.Session{CreditsPerHour: 4, StartedAt: &start}
	cases := []struct {
		end  time.Time
		want float64
	}{
		{start, 0},
		{start.Add(time.Hour), 4},
		{start.Add(90 * time.Minute), 6},
		{start.Add(45 * time.Second), 0.05},
		{start.Add(-time.Minute), 0}, // clock went backwards
	}
	for _, c := range cases {
		if got := credits(ses, c.end); absDiff(got-c.want) > 1e-9 {
			t.Errorf("credits(end=%v) = %v, want %v", c.end.Sub(start), got, c.want)
		}
	}
	if got := credits(&store.Session{CreditsPerHour: 4}, start); got != 0 {
		t.Errorf("never started: %v", got)
	}
	if got := credits(&store.Session{StartedAt: &start}, start.Add(time.Hour)); got != 0 {
		t.Errorf("free size: %v", got)
	}
	// Pure: same inputs, same output; the session is not modified.
	before := *ses
	a, b := credits(ses, start.Add(time.Hour)), credits(ses, start.Add(time.Hour))
	if a != b || !reflect.DeepEqual(before, *ses) {
		t.Error("credits is not a pure function of its inputs")
	}
}

func absDiff(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// TestRedactOverlapping documents a known defect: when one secret value
// contains another, redact's result depends on map iteration order, and the
// shorter value may be replaced first, leaking the rest of the longer one
// ("[REDACTED:SHORT]gh"). It skips while the defect is present; fix: replace
// longer values first (sort by length, descending).
func TestRedactOverlapping(t *testing.T) {
	secrets := map[string]string{"LONG": "abcdefgh", "SHORT": "abcdef"}
	for range 100 {
		if got := redact("x abcdefgh y", secrets); got != "x [REDACTED:LONG] y" {
			t.Fatalf("overlapping secrets give %q", got)
		}
	}
}

// redact runs text through a session scrubber with these secrets, as exec
// output does.
func redact(in string, secrets map[string]string) string {
	return string((&scrubbers{base: loadScrubber()}).forSession("test", secrets).Redact([]byte(in)))
}

func TestSizeLimits(t *testing.T) {
	cfg, err := config.Load(config.Overrides{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	z, _ := cfg.Sizes.Resolve("small")
	want := runsc.Limits{VCPUs: 2, MemoryMiB: 2048, DiskMiB: 16384, Pids: 1024, Processes: runsc.DefaultProcesses(1024)}
	if l := sizeLimits(z); l != want {
		t.Errorf("sizeLimits = %+v, want %+v", l, want)
	}
}
