package server

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"sandboxd/server/config"
	"sandboxd/streams/scrub"
)

// Fuzz targets of the HTTP edge's pure parts: the strict JSON decoder with
// the request types it decodes and the checks behind it, the validators,
// and the attachment header. Each checks what an accepted input must
// satisfy against an oracle written here from the contract (API.md), not
// by calling the code under test again. The seeds run with the unit tests;
// make fuzz runs each at random for a bounded count.

// fuzzServer is a Server with the built-in configuration: enough for the
// request checks, which read only s.cfg.
func fuzzServer(tb testing.TB) *Server {
	tb.Helper()
	for _, k := range config.EnvVars {
		tb.Setenv(k, "")
	}
	cfg, err := config.Load(config.Overrides{DataDir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	return &Server{cfg: cfg}
}

// decodeLimited runs decodeJSON on body as the API does: the body limited by
// http.MaxBytesReader (bodyLimit).
func decodeLimited(body []byte, limit int64, v any) error {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	r.Body = http.MaxBytesReader(rec, r.Body, limit)
	return decodeJSON(&gin.Context{Request: r}, v)
}

// grantRequest is grantCredits' body (a json.Number field).
type grantRequest struct {
	Credits json.Number `json:"credits"`
	Note    string      `json:"note"`
}

// fuzzBodyLimit is small, so that 413 is reached too.
const fuzzBodyLimit = 8 << 10

// FuzzDecodeRequest: decodeJSON and the checks behind it, for the
// provision, exec, code and credit grant bodies (kind picks one).
// decodeJSON accepts exactly one JSON object, whose top-level keys are the
// type's JSON names spelled exactly, and what it decoded re-encodes and
// decodes to itself; it fails with 400, or 413 exactly when the body is
// over the limit. A request its check accepts satisfies the contract's
// rules (fuzzProvisionOK, fuzzExecOK, fuzzCodeOK), and a refused one gets
// the same message whatever its env and secret values are, so no value is
// ever echoed.
func FuzzDecodeRequest(f *testing.F) {
	s := fuzzServer(f)
	for _, b := range []string{
		`{"sessionId":"s1"}`,
		`{"sessionId":"019d-a.b_c","size":"small","gitRepo":"octo/re.po","gitBranch":"feature/x-1","projectId":"p","env":{"K":"V"},"secrets":{"TOKEN":"abcdef1234"},"idleTimeoutSeconds":900,"idleAction":"pause"}`,
		`{"sessionId":"s1","SIZE":"large"}`,
		`{"sessionId":"s1","ſize":"large"}`,
		`{"sessionId":"s1","size":"standard-9"}`,
		`{"sessionId":"s1","gitRepo":"octo/..","gitBranch":"a..b"}`,
		`{"sessionId":"s1","gitRepo":"octo/repo","gitBranch":"HEAD"}`,
		`{"sessionId":"s1","env":{"HOME":"/root"},"secrets":{"A":"short"}}`,
		`{"sessionId":"s1","secrets":{"B":"abc\u0000defgh","A":"x"}}`,
		`{"sessionId":"s1","sessionId":"../x"}`,
		`{"sessionId":"s1"} {}`,
		`{"sessionId":"s1"}x`,
		`["sessionId"]`,
		`{"idleTimeoutSeconds":1.5}`,
		`{"idleTimeoutSeconds":-1,"sessionId":"s"}`,
		"\t{\"sessionId\":\"s\"}\n",
		`{"action":"exec","command":"echo hi","cwd":"/workspace","env":{"K":"V"},"timeoutMs":60000,"stdin":"x"}`,
		`{"action":"exec","command":"ls","cwd":"/workspace/../etc"}`,
		`{"action":"exec","command":"ls","cwd":"/workspace/"}`,
		`{"action":"exec","command":" \t"}`,
		`{"action":"exec","command":"a\u0000b"}`,
		`{"action":"exec","command":"ls","timeoutMs":0}`,
		`{"action":"kill"}`,
		`{"action":"kill","stdin":""}`,
		`{"action":"KILL"}`,
		`{"code":"x = 1\nx + 1","timeoutMs":30000,"contextId":"ctx-1"}`,
		`{"code":"1","contextId":".hidden"}`,
		`{"code":""}`,
		`{"credits":1.5,"note":"n"}`,
		`{"credits":"1"}`,
		`{"credits":1e3}`,
		`{`,
		``,
		`null`,
		`{"env":{"A":1}}`,
	} {
		for kind := range byte(4) {
			f.Add(kind, []byte(b))
		}
	}
	f.Add(byte(0), []byte(`{"sessionId":"`+strings.Repeat("a", fuzzBodyLimit)+`"}`))
	f.Fuzz(func(t *testing.T, kind byte, body []byte) {
		var v any
		switch kind % 4 {
		case 0:
			v = &provisionRequest{}
		case 1:
			v = &execRequest{}
		case 2:
			v = &codeRequest{}
		case 3:
			v = &grantRequest{}
		}
		err := decodeLimited(body, fuzzBodyLimit, v)
		if err != nil {
			status, code, msg := statusOf(err)
			over := len(body) > fuzzBodyLimit
			switch {
			case over && (status != http.StatusRequestEntityTooLarge || code != "too_large"):
				t.Fatalf("a body over the limit: %d %s %q", status, code, msg)
			case !over && (status != http.StatusBadRequest || code != "invalid_request"):
				t.Fatalf("refused with %d %s %q", status, code, msg)
			case msg == "":
				t.Fatal("refused without a message")
			}
			return
		}
		checkDecoded(t, body, v)
		switch req := v.(type) {
		case *provisionRequest:
			checkProvision(t, s, req)
		case *execRequest:
			checkExecRequest(t, s, req)
		case *codeRequest:
			checkCodeRequest(t, s, req)
		}
	})
}

// checkDecoded: body, which decodeJSON accepted into v, is one JSON
// object, its top-level keys are v's JSON names exactly, and v survives a
// round trip.
func checkDecoded(t *testing.T, body []byte, v any) {
	t.Helper()
	if !json.Valid(body) || bytes.TrimLeft(body, " \t\r\n")[0] != '{' {
		t.Fatalf("accepted what is not one JSON object: %q", body)
	}
	names := map[string]bool{}
	rt := reflect.TypeOf(v).Elem()
	for i := range rt.NumField() {
		names[strings.Split(rt.Field(i).Tag.Get("json"), ",")[0]] = true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.Token() // {
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		if !names[k.(string)] {
			t.Fatalf("accepted the key %q, which is no field's name", k)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatal(err)
		}
	}
	again := reflect.New(rt).Interface()
	enc, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := decodeLimited(enc, int64(len(enc)), again); err != nil {
		t.Fatalf("re-encoded %s: %v", enc, err)
	}
	if g, ok := again.(*grantRequest); ok && g.Credits == "0" && v.(*grantRequest).Credits == "" {
		g.Credits = "" // encoding/json writes an empty json.Number as 0
	}
	if !reflect.DeepEqual(v, again) {
		t.Fatalf("round trip: %+v became %+v", v, again)
	}
}

// withValuesHidden is env with every value's bytes but NUL replaced: the
// same lengths and NULs, so the same checks pass or fail.
func withValuesHidden(env map[string]string) map[string]string {
	if env == nil {
		return nil
	}
	out := make(map[string]string, len(env))
	for k, v := range env {
		b := []byte(v)
		for i := range b {
			if b[i] != 0 {
				b[i] = 'x'
			}
		}
		out[k] = string(b)
	}
	return out
}

// The documented sizes (API.md): current names, and legacy ones mapped.
var docSizes = map[string]string{
	"": "standard-1", "standard-1": "standard-1", "standard-2": "standard-2", "standard-3": "standard-3",
	"standard-4": "standard-4", "standard-5": "standard-5", "small": "standard-2", "standard": "standard-3", "large": "standard-4",
}

func checkProvision(t *testing.T, s *Server, req *provisionRequest) {
	t.Helper()
	orig := *req
	size, err := s.validateProvision(req)
	if err != nil {
		status, code, msg := statusOf(err)
		switch code {
		case "invalid_request", "invalid_session_id", "invalid_size", "invalid_repo", "invalid_branch":
		default:
			t.Fatalf("refused with the code %q", code)
		}
		if status != http.StatusBadRequest {
			t.Fatalf("refused with %d", status)
		}
		hidden := orig
		hidden.Env, hidden.Secrets = withValuesHidden(orig.Env), withValuesHidden(orig.Secrets)
		_, err2 := s.validateProvision(&hidden)
		if _, _, msg2 := statusOf(err2); msg2 != msg {
			t.Fatalf("the message depends on the values:\n %q\n %q", msg, msg2)
		}
		return
	}
	if !fuzzSessionIDOK(req.SessionID) {
		t.Fatalf("accepted the session id %q", req.SessionID)
	}
	if want, ok := docSizes[req.Size]; !ok || size.Name != want {
		t.Fatalf("size %q accepted as %q", req.Size, size.Name)
	}
	if req.GitRepo != "" && !fuzzRepoOK(req.GitRepo) {
		t.Fatalf("accepted the repo %q", req.GitRepo)
	}
	if req.GitBranch != "" && (req.GitRepo == "" || !fuzzBranchOK(req.GitBranch)) {
		t.Fatalf("accepted the branch %q (repo %q)", req.GitBranch, req.GitRepo)
	}
	if req.IdleAction != "" && req.IdleAction != "teardown" && req.IdleAction != "pause" {
		t.Fatalf("accepted the idle action %q", req.IdleAction)
	}
	if n := req.IdleTimeoutSeconds; n != nil && (*n < 0 || *n > 604800) {
		t.Fatalf("accepted the idle timeout %d", *n)
	}
	checkEnvOK(t, req.Env)
	checkEnvOK(t, req.Secrets)
	total := 0
	for k, v := range req.Secrets {
		if len(v) < scrub.MinValueLen || len(v) > scrub.MaxValueLen {
			t.Fatalf("accepted the secret %s of %d bytes", k, len(v))
		}
		total += len(v)
	}
	if total > scrub.MaxValuesLen {
		t.Fatalf("accepted %d bytes of secrets", total)
	}
}

func checkEnvOK(t *testing.T, env map[string]string) {
	t.Helper()
	if len(env) > 256 {
		t.Fatalf("accepted %d variables", len(env))
	}
	for k, v := range env {
		if !fuzzEnvNameOK(k) || k == "HOME" || k == "USER" || k == "LOGNAME" || k == "SHELL" {
			t.Fatalf("accepted the variable %q", k)
		}
		if strings.IndexByte(v, 0) >= 0 || len(v) > 128<<10 {
			t.Fatalf("accepted the value of %s (%d bytes)", k, len(v))
		}
	}
}

func checkExecRequest(t *testing.T, s *Server, req *execRequest) {
	t.Helper()
	orig := *req
	switch req.Action {
	case "kill":
		err := checkKill(req)
		empty := req.Command == "" && req.Cwd == "" && req.Env == nil && req.TimeoutMs == nil && req.Stdin == nil
		if (err == nil) != empty {
			t.Fatalf("kill with %+v: %v", req, err)
		}
		return
	}
	timeout, err := s.checkExec(req)
	if err != nil {
		if status, _, msg := statusOf(err); status != http.StatusBadRequest || msg == "" {
			t.Fatalf("refused with %d %q", status, msg)
		}
		hidden := orig
		hidden.Env = withValuesHidden(orig.Env)
		_, err2 := s.checkExec(&hidden)
		if err2 == nil || err2.Error() != err.Error() {
			t.Fatalf("the message depends on the values: %v / %v", err, err2)
		}
		return
	}
	if strings.TrimSpace(req.Command) == "" || len(req.Command) > 256<<10 || strings.IndexByte(req.Command, 0) >= 0 {
		t.Fatalf("accepted the command %q", req.Command)
	}
	if orig.Cwd == "" && req.Cwd != "/workspace" || !fuzzCwdOK(req.Cwd) {
		t.Fatalf("accepted the cwd %q as %q", orig.Cwd, req.Cwd)
	}
	checkEnvOK(t, req.Env)
	checkTimeout(t, s, req.TimeoutMs, timeout, time.Minute)
}

func checkTimeout(t *testing.T, s *Server, ms *int64, got, def time.Duration) {
	t.Helper()
	switch {
	case ms == nil && got != def:
		t.Fatalf("no timeoutMs gave %v, want %v", got, def)
	case ms != nil && (*ms < 1 || *ms > s.cfg.Limits.ExecMaxTimeoutMs || got != time.Duration(*ms)*time.Millisecond):
		t.Fatalf("timeoutMs %d accepted as %v", *ms, got)
	}
}

func checkCodeRequest(t *testing.T, s *Server, req *codeRequest) {
	t.Helper()
	orig := *req
	timeout, err := s.checkCode(req)
	if err != nil {
		if status, _, msg := statusOf(err); status != http.StatusBadRequest || msg == "" {
			t.Fatalf("refused with %d %q", status, msg)
		}
		return
	}
	if req.Code == "" || len(req.Code) > 1<<20 {
		t.Fatalf("accepted %d bytes of code", len(req.Code))
	}
	if orig.ContextID == "" && req.ContextID != "default" || !fuzzContextIDOK(req.ContextID) {
		t.Fatalf("accepted the context id %q as %q", orig.ContextID, req.ContextID)
	}
	checkTimeout(t, s, req.TimeoutMs, timeout, 30*time.Second)
}

// The oracles: the contract's rules, byte by byte.

// allBytes reports whether s is min-max bytes, its first byte passes first
// and the rest pass rest.
func allBytes(s string, lo, hi int, first, rest func(byte) bool) bool {
	if len(s) < lo || len(s) > hi {
		return false
	}
	for i := 0; i < len(s); i++ {
		if i == 0 && !first(s[i]) || i > 0 && !rest(s[i]) {
			return false
		}
	}
	return true
}

func idByte(c byte) bool { return isAlnum(c) || c == '.' || c == '_' || c == '-' }

func branchByte(c byte) bool { return idByte(c) || c == '/' }

// sessionId: 1-128 of [A-Za-z0-9._-], starting with a letter or digit.
func fuzzSessionIDOK(s string) bool { return allBytes(s, 1, 128, isAlnum, idByte) }

// contextId: 1-64 of [A-Za-z0-9._-], starting with a letter or digit.
func fuzzContextIDOK(s string) bool { return allBytes(s, 1, 64, isAlnum, idByte) }

// gitRepo: owner/name; owner 1-39 of [A-Za-z0-9-], not starting with '-';
// name 1-100 of [A-Za-z0-9._-], not "." or "..".
func fuzzRepoOK(s string) bool {
	i := strings.IndexByte(s, '/')
	if i < 0 {
		return false
	}
	owner, name := s[:i], s[i+1:]
	ownerByte := func(c byte) bool { return isAlnum(c) || c == '-' }
	return allBytes(owner, 1, 39, isAlnum, ownerByte) && allBytes(name, 1, 100, idByte, idByte) && name != "." && name != ".."
}

// gitBranch: [A-Za-z0-9._/-] only, at most 255 bytes, and what
// git check-ref-format --branch accepts (git-check-ref-format(1)): no
// component starting with '.' or ending in ".lock", no "..", no empty
// component (no leading, trailing or double '/'), not ending in '.', no
// "@{", not "@"; --branch also refuses a leading '-' and "HEAD".
func fuzzBranchOK(s string) bool {
	if !allBytes(s, 1, 255, branchByte, branchByte) || s == "@" || s == "HEAD" || s[0] == '-' ||
		strings.Contains(s, "..") || strings.Contains(s, "@{") || strings.HasSuffix(s, ".") {
		return false
	}
	for _, c := range strings.Split(s, "/") {
		if c == "" || c[0] == '.' || strings.HasSuffix(c, ".lock") {
			return false
		}
	}
	return true
}

// An environment variable's name: 1-128 of [A-Za-z0-9_], not starting
// with a digit.
func fuzzEnvNameOK(s string) bool {
	nameByte := func(c byte) bool { return isAlnum(c) || c == '_' }
	return allBytes(s, 1, 128, func(c byte) bool { return nameByte(c) && !(c >= '0' && c <= '9') }, nameByte)
}

// cwd: absolute, normalized (no empty, "." or ".." component, no trailing
// '/' but for "/"), at most 4096 bytes, no NUL.
func fuzzCwdOK(s string) bool {
	if s == "/" {
		return true
	}
	if len(s) > 4096 || !strings.HasPrefix(s, "/") || strings.IndexByte(s, 0) >= 0 {
		return false
	}
	for _, c := range strings.Split(s[1:], "/") {
		if c == "" || c == "." || c == ".." {
			return false
		}
	}
	return true
}

// FuzzValidators: each validator accepts exactly what its oracle (the
// contract's rule, above) accepts; sizes resolve to the documented ones.
func FuzzValidators(f *testing.F) {
	s := fuzzServer(f)
	for _, v := range []string{
		"a", "sess-1", "Sess_1.2-3", ".hidden", "-dash", "dots..ok", "ünïcode", "abc\n", "abc\x00",
		"octo/repo", "octo/.", "octo/..", "-octo/repo", "octo/repo/extra", "oc_to/repo", strings.Repeat("a", 40) + "/r",
		"main", "feature/x-1", "a..b", "a@{b", "@", "topic.lock", "dir.lock/x", "x/.hidden", "a//b", "a/", "/a",
		"ends.", "HEAD", "x/HEAD", "-flag", "a~b", "a:b", "refs/heads/x", "@x", "a@b",
		"/", "/workspace", "/workspace/", "/workspace/../etc", "//workspace", "/a/./b", "/a/.", "/a/..",
		"FOO", "_X", "1ABC", "A-B", "HOME", "small", "standard", "large", "standard-1", "standard-6", "Small",
		"ctx-1", "default", strings.Repeat("c", 65),
	} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, in string) {
		check := func(name string, got, want bool) {
			if got != want {
				t.Fatalf("%s(%q) = %v, the contract says %v", name, in, got, want)
			}
		}
		check("validSessionID", validSessionID(in), fuzzSessionIDOK(in))
		check("validRepo", validRepo(in), fuzzRepoOK(in))
		check("validBranch", validBranch(in), fuzzBranchOK(in))
		check("validCwd", validCwd(in), fuzzCwdOK(in))
		check("contextId", contextIDRe.MatchString(in), fuzzContextIDOK(in))
		check("env name", checkEnv("env", map[string]string{in: "v"}) == nil,
			fuzzEnvNameOK(in) && in != "HOME" && in != "USER" && in != "LOGNAME" && in != "SHELL")
		size, ok := s.cfg.Sizes.Resolve(in)
		want, documented := docSizes[in]
		check("Sizes.Resolve", ok, documented)
		if ok && size.Name != want {
			t.Fatalf("size %q resolved to %q, want %q", in, size.Name, want)
		}
	})
}

// FuzzContentDisposition: the attachment header for any file name is
// printable ASCII (no header injection, nothing a client mangles), and a
// MIME parser reads it as an attachment whose file name is the name (as
// valid UTF-8).
func FuzzContentDisposition(f *testing.F) {
	for _, n := range []string{
		"report.pdf", "a b.txt", `q"uote\.txt`, "x\r\nSet-Cookie: a=b", "日本語.txt", "\xff\xfe.bin",
		"%41;b=c", "", "a'b", "tab\there", "\x7f",
	} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, name string) {
		h := contentDisposition(name)
		for i := 0; i < len(h); i++ {
			if h[i] < 0x20 || h[i] >= 0x7f {
				t.Fatalf("byte %#x in %q", h[i], h)
			}
		}
		typ, params, err := mime.ParseMediaType(h)
		if err != nil || typ != "attachment" {
			t.Fatalf("%q does not parse: %q %v", h, typ, err)
		}
		if want := strings.ToValidUTF8(name, "\uFFFD"); params["filename"] != want || !utf8.ValidString(params["filename"]) {
			t.Fatalf("file name %q read back as %q from %q", want, params["filename"], h)
		}
	})
}

// TestBranchOracleMatchesGit checks FuzzValidators' branch oracle against
// git itself on every short name over the characters that matter: a name
// the oracle accepts is a branch name to git, and one git takes within the
// character set is accepted unless it starts with '-'.
func TestBranchOracleMatchesGit(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	names := []string{"HEAD", "x/HEAD", "a.lock", "a.lock/b", "a/b.lock", "a.locked", "feature/x-1", "a_b", "v1.0", "@",
		"a/.b", "a..b", "a/-b", "a//b", ".a/b", "a/b.", "a/b/", "-a/b"}
	var gen func(prefix string, n int)
	gen = func(prefix string, n int) {
		if prefix != "" {
			names = append(names, prefix)
		}
		for _, c := range "a./-"[:min(4, 4*n)] {
			gen(prefix+string(c), n-1)
		}
	}
	gen("", 3)
	gitOK := func(args ...string) bool {
		return exec.Command("git", append([]string{"check-ref-format"}, args...)...).Run() == nil
	}
	for _, n := range names {
		git := gitOK("refs/heads/"+n) && gitOK("--branch", n)
		oracle := fuzzBranchOK(n)
		switch {
		case oracle && !git:
			t.Errorf("the oracle accepts %q, git does not", n)
		case !oracle && git && allBytes(n, 1, 255, branchByte, branchByte) && n[0] != '-':
			t.Errorf("git accepts %q, the oracle does not", n)
		}
	}
}
