package server

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/server/procs"
)

// runCode calls a code runtime route and decodes its answer.
func (h *harness) runCode(lang, id string, req map[string]any) (int, codeResponse, string) {
	h.t.Helper()
	code, b := h.call(h.token, "POST", "/v1/sandbox/"+lang+"/"+id, req)
	var r codeResponse
	json.Unmarshal(b, &r)
	return code, r, string(b)
}

// TestRealCodeRuntimes runs Python and Node.js contexts in a real sandbox.
func TestRealCodeRuntimes(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	const secret = "rt-secret-value-77d1e0"
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "rt1", "size": "test-tiny",
		"secrets": map[string]string{"API_KEY": secret, "DB_PASS": `k"9\Tq2!Lw7Zp`, "P2": `m'4"Rv8Hx3Jq`}})
	if code != 201 {
		t.Fatalf("provision: %d %s", code, b)
	}
	run := func(lang string, req map[string]any) codeResponse {
		t.Helper()
		code, r, raw := h.runCode(lang, "rt1", req)
		if code != 200 {
			t.Fatalf("%s %v: %d %s", lang, req, code, raw)
		}
		if strings.Contains(raw, secret) || strings.Contains(raw, "Tq2!Lw7Zp") || strings.Contains(raw, "Rv8Hx3Jq") {
			t.Fatalf("secret in the answer: %s", raw)
		}
		return r
	}
	str := func(p *string) string {
		if p == nil {
			return "<nil>"
		}
		return *p
	}

	t.Run("python state, output, result, errors", func(t *testing.T) {
		r := run("python", map[string]any{"code": "import os\nx = 41\nprint('hi')\nx + 1"})
		if r.Stdout != "hi\n" || str(r.Result) != "42" || r.Error != nil || r.ContextID != "default" {
			t.Fatalf("%+v", r)
		}
		// State persists; a child process's output and stderr are the run's.
		r = run("python", map[string]any{"code": "import sys\nos.system('echo from-child; echo child-err >&2')\nprint('e', file=sys.stderr)\nx"})
		if r.Stdout != "from-child\n" || r.Stderr != "child-err\ne\n" || str(r.Result) != "41" {
			t.Fatalf("%+v", r)
		}
		r = run("python", map[string]any{"code": "def f():\n    return 1/0\nf()"})
		if r.Error == nil || r.Error.Name != "ZeroDivisionError" || !strings.Contains(r.Error.Traceback, "line 2, in f") || r.Result != nil {
			t.Fatalf("%+v", r.Error)
		}
		if strings.Contains(r.Error.Traceback, "python.py") || strings.Contains(r.Error.Traceback, "_main") {
			t.Fatalf("kernel frames in the traceback: %s", r.Error.Traceback)
		}
		r = run("python", map[string]any{"code": "x = ("})
		if r.Error == nil || r.Error.Name != "SyntaxError" {
			t.Fatalf("%+v", r)
		}
		// input() must not read the protocol; sys.exit ends the run, not the context.
		r = run("python", map[string]any{"code": "input()"})
		if r.Error == nil || r.Error.Name != "EOFError" {
			t.Fatalf("%+v", r)
		}
		r = run("python", map[string]any{"code": "import sys; sys.exit(3)"})
		if r.Error == nil || r.Error.Name != "SystemExit" {
			t.Fatalf("%+v", r)
		}
		// A forged mark (no nonce) is only text.
		r = run("python", map[string]any{"code": "print('\\x1eabc\\x1f{\"result\": \"forged\"}'); x"})
		if str(r.Result) != "41" || !strings.Contains(r.Stdout, "forged") {
			t.Fatalf("%+v", r)
		}
		// Output and the result are scrubbed.
		r = run("python", map[string]any{"code": "print(os.environ['API_KEY']); os.environ['API_KEY']"})
		if !strings.Contains(r.Stdout, "[REDACTED:API_KEY]") || !strings.Contains(str(r.Result), "[REDACTED:API_KEY]") {
			t.Fatalf("%+v", r)
		}
		r = run("python", map[string]any{"code": "raise ValueError(os.environ['API_KEY'])"})
		if r.Error == nil || !strings.Contains(r.Error.Value, "[REDACTED:API_KEY]") {
			t.Fatalf("%+v", r.Error)
		}
		// Values with quotes and backslashes, as repr prints them (run checks
		// the whole answer), and a secret as an exception's type name.
		for _, code := range []string{"os.environ['DB_PASS']", "os.environ['P2']", "print(repr(os.environ['P2']))",
			"raise type(os.environ['API_KEY'], (Exception,), {})('x')"} {
			run("python", map[string]any{"code": code})
		}
		// A forged result (the nonce is in the kernel's frame) ends only the
		// run that forged it: the next run gets its own result.
		forge := `import sys, os, json, time
f = sys._getframe()
while f.f_code.co_name != '_main':
    f = f.f_back
m, seq = f.f_locals['mark'], f.f_locals['req']['seq']
os.write(1, m + json.dumps({'seq': seq, 'result': "'FORGED'", 'error': None, 'display': []}).encode() + b'\n')
os.write(2, m + str(seq).encode() + b'\n')
time.sleep(0.3)
'real A'`
		if r := run("python", map[string]any{"code": forge, "contextId": "forge"}); str(r.Result) != "'FORGED'" {
			t.Fatalf("%+v", r)
		}
		if r := run("python", map[string]any{"code": "'B'", "contextId": "forge"}); str(r.Result) != "'B'" {
			t.Fatalf("a forged frame desynchronized the context: %+v", r)
		}
		// A forked child does not answer; a dying context's last words arrive.
		if r := run("python", map[string]any{"code": "if os.fork() == 0: pass\n7", "contextId": "forge"}); str(r.Result) != "7" {
			t.Fatalf("%+v", r)
		}
		if r := run("python", map[string]any{"code": "8", "contextId": "forge"}); str(r.Result) != "8" {
			t.Fatalf("after a fork: %+v", r)
		}
		r = run("python", map[string]any{"code": "print('last words', flush=True); os._exit(3)", "contextId": "forge"})
		if r.Stdout != "last words\n" || r.Error == nil || r.Error.Name != "ContextLost" {
			t.Fatalf("%+v", r)
		}
	})

	t.Run("python display", func(t *testing.T) {
		png := []byte("\x89PNG\r\n\x1a\nfake")
		r := run("python", map[string]any{"code": fmt.Sprintf("class P:\n    def _repr_png_(self): return %q.encode('latin-1')\n    def _repr_html_(self): return '<b>p</b>'\ndisplay(P(), 'text')\nP()", string(png))})
		if len(r.Display) != 5 {
			t.Fatalf("display: %+v", r.Display)
		}
		got, _ := base64.StdEncoding.DecodeString(r.Display[0].Data)
		if r.Display[0].Mime != "image/png" || string(got) != string(png) || r.Display[1].Mime != "text/html" || r.Display[2].Mime != "text/plain" || r.Display[2].Data != "'text'" {
			t.Fatalf("display: %+v", r.Display)
		}
	})

	t.Run("contexts are separate", func(t *testing.T) {
		run("python", map[string]any{"code": "y = 'a'", "contextId": "c1"})
		run("python", map[string]any{"code": "y = 'b'", "contextId": "c2"})
		if r := run("python", map[string]any{"code": "y", "contextId": "c1"}); str(r.Result) != "'a'" || r.ContextID != "c1" {
			t.Fatalf("%+v", r)
		}
		if r := run("python", map[string]any{"code": "y"}); r.Error == nil || r.Error.Name != "NameError" {
			t.Fatalf("default context sees another's state: %+v", r)
		}
		for _, bad := range []map[string]any{{"code": ""}, {"code": "1", "contextId": "../x"}, {"code": "1", "timeoutMs": 0}} {
			if code, _, raw := h.runCode("python", "rt1", bad); code != 400 {
				t.Fatalf("%v: %d %s", bad, code, raw)
			}
		}
		if code, _, _ := h.runCode("python", "nosuch", map[string]any{"code": "1"}); code != 404 {
			t.Fatalf("unknown session: %d", code)
		}
	})

	t.Run("timeouts interrupt, and kill a context that ignores them", func(t *testing.T) {
		run("python", map[string]any{"code": "z = 5", "contextId": "t"})
		start := time.Now()
		r := run("python", map[string]any{"code": "while True: pass", "contextId": "t", "timeoutMs": 500})
		if !r.TimedOut || r.Error == nil || r.Error.Name != "KeyboardInterrupt" || time.Since(start) > 10*time.Second {
			t.Fatalf("%+v", r)
		}
		if r := run("python", map[string]any{"code": "z", "contextId": "t"}); str(r.Result) != "5" {
			t.Fatalf("state lost after an interrupt: %+v", r)
		}
		r = run("python", map[string]any{"code": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", "contextId": "t", "timeoutMs": 300})
		if !r.TimedOut || r.Error == nil || r.Error.Name != "Timeout" {
			t.Fatalf("%+v", r)
		}
		if r := run("python", map[string]any{"code": "z", "contextId": "t"}); r.Error == nil || r.Error.Name != "NameError" {
			t.Fatalf("a killed context kept its state: %+v", r)
		}
		// A context whose process exits starts afresh on the next run.
		r = run("python", map[string]any{"code": "import os; os._exit(0)", "contextId": "t"})
		if r.Error == nil || r.Error.Name != "ContextLost" {
			t.Fatalf("%+v", r)
		}
		if r := run("python", map[string]any{"code": "1+1", "contextId": "t"}); str(r.Result) != "2" {
			t.Fatalf("%+v", r)
		}
		// Runs in one context are serialized.
		var wg sync.WaitGroup
		res := make([]codeResponse, 4)
		for i := range res {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, res[i], _ = h.runCode("python", "rt1", map[string]any{"code": fmt.Sprintf("import time\nn = globals().get('n', 0) + 1\ntime.sleep(0.05)\n(n, %d)", i), "contextId": "ser"})
			}()
		}
		wg.Wait()
		seen := map[string]bool{}
		for _, r := range res {
			seen[strings.SplitN(str(r.Result), ",", 2)[0]] = true
		}
		if len(seen) != 4 {
			t.Fatalf("runs were not serialized: %+v", res)
		}
	})

	t.Run("node", func(t *testing.T) {
		r := run("node", map[string]any{"code": "let a = 40; const f = (x) => x + 2; console.log('hi'); f(a)"})
		if r.Stdout != "hi\n" || str(r.Result) != "42" || r.Error != nil {
			t.Fatalf("%+v", r)
		}
		if r := run("node", map[string]any{"code": "a + 1"}); str(r.Result) != "41" {
			t.Fatalf("%+v", r)
		}
		if r := run("node", map[string]any{"code": "Promise.resolve({k: [1, 2]})"}); str(r.Result) != "{ k: [ 1, 2 ] }" {
			t.Fatalf("%+v", r)
		}
		if r := run("node", map[string]any{"code": "await new Promise(r => setTimeout(r, 20)); return a"}); str(r.Result) != "40" {
			t.Fatalf("%+v", r)
		}
		r = run("node", map[string]any{"code": "function g() { null.x }\ng()"})
		if r.Error == nil || r.Error.Name != "TypeError" || !strings.Contains(r.Error.Traceback, "<cell>") || strings.Contains(r.Error.Traceback, "node.js") {
			t.Fatalf("%+v", r.Error)
		}
		r = run("node", map[string]any{"code": "require('child_process').execSync('echo sub >&2'); process.env.API_KEY"})
		if r.Stderr != "sub\n" || !strings.Contains(str(r.Result), "[REDACTED:API_KEY]") {
			t.Fatalf("%+v", r)
		}
		for _, code := range []string{"process.env.DB_PASS", "const e = new Error('m'); e.name = process.env.API_KEY; throw e",
			"display('x', process.env.API_KEY)", "Promise.reject(new Error(process.env.API_KEY)); 1"} {
			run("node", map[string]any{"code": code})
		}
		// The kernel's names are out of reach, and stdin is not the protocol.
		if r := run("node", map[string]any{"code": "typeof mark + typeof queue"}); str(r.Result) != "'undefinedundefined'" {
			t.Fatalf("%+v", r)
		}
		if r := run("node", map[string]any{"code": "require('child_process').execSync('cat', {stdio: ['inherit', 'pipe', 'pipe']}).length"}); str(r.Result) != "0" {
			t.Fatalf("%+v", r)
		}
		r = run("node", map[string]any{"code": "while (true) {}", "timeoutMs": 300})
		if !r.TimedOut || r.Error == nil {
			t.Fatalf("%+v", r)
		}
		if r := run("node", map[string]any{"code": "a"}); str(r.Result) != "40" {
			t.Fatalf("state lost after an interrupt: %+v", r)
		}
		r = run("node", map[string]any{"code": "await new Promise(() => {})", "timeoutMs": 300})
		if !r.TimedOut || r.Error == nil || r.Error.Name != "KeyboardInterrupt" {
			t.Fatalf("%+v", r)
		}
	})

	t.Run("context limit and teardown", func(t *testing.T) {
		for i := 0; i < procs.MaxContextsPerSession+2; i++ {
			run("python", map[string]any{"code": "1", "contextId": fmt.Sprintf("many%d", i)})
		}
		count := func() int {
			r := h.sh("rt1", "ps -eo args= | grep -c '^/usr/bin/\\(python3\\|node\\) -[uce]'")
			var n int
			fmt.Sscanf(r.Stdout, "%d", &n)
			return n
		}
		if n := count(); n != procs.MaxContextsPerSession {
			t.Fatalf("%d interpreters for a limit of %d", n, procs.MaxContextsPerSession)
		}
		// A client that gives up while the context is busy: its code never runs.
		busy := make(chan codeResponse)
		go func() {
			_, r, _ := h.runCode("python", "rt1", map[string]any{"code": "import time; time.sleep(1.5)", "contextId": "busy"})
			busy <- r
		}()
		time.Sleep(300 * time.Millisecond)
		body := strings.NewReader(`{"contextId": "busy", "code": "open('/tmp/abandoned', 'w').write('ran')"}`)
		req, _ := http.NewRequest("POST", h.ts.URL+"/v1/sandbox/python/rt1", body)
		req.Header.Set("Authorization", "Bearer "+h.token)
		if _, err := (&http.Client{Timeout: 200 * time.Millisecond}).Do(req); err == nil {
			t.Fatal("the busy context answered at once")
		}
		<-busy
		if r := run("python", map[string]any{"code": "import os; os.path.exists('/tmp/abandoned')", "contextId": "busy"}); str(r.Result) != "False" {
			t.Fatalf("an abandoned request ran: %+v", r)
		}
		// A run in flight ends at once when its sandbox is torn down.
		go func() {
			_, r, _ := h.runCode("python", "rt1", map[string]any{"code": "import time; time.sleep(60)", "contextId": "busy"})
			busy <- r
		}()
		time.Sleep(300 * time.Millisecond)
		if code, _ := h.call(h.token, "POST", "/v1/sandbox/rt1/teardown", nil); code != 200 {
			t.Fatal("teardown")
		}
		select {
		case r := <-busy:
			if r.Error == nil || r.Error.Name != "ContextLost" || r.TimedOut {
				t.Fatalf("run cut by teardown: %+v", r)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a run outlived its sandbox's teardown")
		}
		if code, _, _ := h.runCode("python", "rt1", map[string]any{"code": "1"}); code != 409 {
			t.Fatalf("code in a stopped session: %d", code)
		}
		if code, _ := h.call(h.token, "POST", "/v1/sandbox/rt1/resume", nil); code != 200 {
			t.Fatal("resume")
		}
		if n := count(); n != 0 {
			t.Fatalf("%d interpreters after a resume", n)
		}
		if r := run("python", map[string]any{"code": "x"}); r.Error == nil || r.Error.Name != "NameError" {
			t.Fatalf("a context outlived its sandbox: %+v", r)
		}
		if n := h.s.contexts.Count(); n != 1 {
			t.Fatalf("%d contexts held, want 1", n)
		}
	})
}
