package server

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
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
		{"HEAD", false},
		{"x/HEAD", true},
		{"head", true},
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
		{map[string]string{"FOO": strings.Repeat("x", 128*1024+1)}, "over the 128 KiB"},
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
	for _, k := range []string{"PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "BASH_FUNC_x%%", "PYTHONSTARTUP", "NODE_OPTIONS"} {
		e := checkSecretNames(map[string]string{"API_KEY": "abcdefgh", k: "/tmp/evil-value"})
		if _, _, msg := statusOf(e); e == nil || !strings.Contains(msg, k+" is read by the shell") || strings.Contains(msg, "evil") {
			t.Errorf("secret named %s: %v", k, e)
		}
	}
	if e := checkSecretNames(map[string]string{"API_KEY": "x", "LDAP_PASSWORD": "y", "PATHNAME_TOKEN": "z"}); e != nil {
		t.Errorf("ordinary secret names refused: %v", e)
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

// Every static word after /v1/sandbox/ is a reserved session id, and a
// provision (REST or MCP's create_sandbox, one validator) with one is 400:
// a session named "terminal" would take another session's actions.
func TestReservedSessionIDsCoverTheRoutes(t *testing.T) {
	e := newAPIEnv(t)
	words := map[string]bool{}
	for _, r := range e.s.engine.Routes() {
		rest, ok := strings.CutPrefix(r.Path, "/v1/sandbox/")
		if !ok {
			continue
		}
		if w, _, _ := strings.Cut(rest, "/"); w != "" && !strings.HasPrefix(w, ":") && !strings.HasPrefix(w, "*") {
			words[w] = true
		}
	}
	if !maps.Equal(words, reservedSessionIDs) {
		t.Errorf("the routes' words after /v1/sandbox/ are %v, reserved are %v", slices.Sorted(maps.Keys(words)), slices.Sorted(maps.Keys(reservedSessionIDs)))
	}
	for w := range words {
		w := e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": w, "size": "standard-1"})
		if w.Code != 400 || !strings.Contains(w.Body.String(), "invalid_session_id") || !strings.Contains(w.Body.String(), "a word of the API's routes") {
			t.Errorf("provision of a reserved id: %d %s", w.Code, w.Body)
		}
	}
	if w := e.do("POST", "/v1/sandbox", e.token, map[string]any{"sessionId": "terminals", "size": "standard-1"}); w.Code != 201 {
		t.Errorf("provision of an ordinary id: %d %s", w.Code, w.Body)
	}
}
