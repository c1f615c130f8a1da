package server

// The acceptance test of issue 14's known values: a session's registered
// secrets, printed from inside a real sandbox in the forms programs really
// print them, must not reach a client as a run of k or more consecutive
// bytes (leakThreshold) in any of those forms, on any output path: REST
// exec (every form), the exec stream, a PTY terminal, files, artifacts and
// the Python and Node.js runtimes (a representative set each). The checker
// is findLeaks (scrubleak_test.go).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// A shellForm prints the value of $S in one form. $H is half its length,
// $K its threshold. whole: the whole value is printed, so a redaction must
// show (the test cannot pass on empty output).
type shellForm struct {
	name  string
	cmd   string
	whole bool
}

var scrubShellForms = []shellForm{
	{"raw", `printf '%s\n' "$S"`, true},
	{"raw on stderr", `printf '%s\n' "$S" >&2`, true},
	{"in text", `printf 'token=%s; done\n' "$S"`, true},
	{"upper", `printf '%s\n' "${S^^}"`, true},
	{"lower", `printf '%s\n' "${S,,}"`, true},
	{"swapcase", `printf '%s\n' "${S~~}"`, true},
	{"first k", `printf '%s\n' "${S:0:K}"`, false},
	{"middle k", `printf '%s\n' "${S:2:K}"`, false},
	{"all but 3 (S[3:])", `printf '%s\n' "${S:3}"`, false},
	{"reversed (rev)", `printf '%s\n' "$S" | rev`, true},
	{"od -An -tx1", `printf %s "$S" | od -An -tx1`, true},
	{"od -An -tx1 upper", `printf %s "$S" | od -An -tx1 | tr a-f A-F`, true},
	// The image has neither xxd nor hexdump: their layouts are printed by
	// od and Python.
	{"xxd -p", `printf %s "$S" | od -An -tx1 -v | tr -d ' \n' | fold -w60; echo`, true},
	{"xxd -p -c7 after 1 byte", `printf %s "x$S" | od -An -tx1 -v | tr -d ' \n' | fold -w14; echo`, true},
	{"xxd", `printf %s "$S" | python3 -c '` + pyXXD + `'`, true},
	{"hexdump -C", `printf %s "$S" | python3 -c '` + pyHexdumpC + `'`, true},
	{"%XX per byte", `printf %s "$S" | od -An -tx1 -v | tr -d ' \n' | sed 's/../%&/g'; echo`, true},
	{`\xNN per byte`, `printf %s "$S" | od -An -tx1 -v | tr -d ' \n' | sed 's/../\\x&/g'; echo`, true},
	{`\u00NN per char`, `python3 -c 'import os; print("".join("\\u%04x" % ord(c) for c in os.environ["S"]))'`, true},
	{"base64", `printf %s "$S" | base64`, true},
	{"base64 -w0", `printf %s "$S" | base64 -w0; echo`, true},
	{"base64 -w8", `printf %s "$S" | base64 -w8`, true},
	{"base64 -w0 | fold -w5", `printf %s "$S" | base64 -w0 | fold -w5; echo`, true},
	{"base64 after 1 byte", `printf %s "x$S" | base64 -w0; echo`, true},
	{"base64 -w8 after 2 bytes", `printf %s "xy$S" | base64 -w8`, true},
	{"base64 of user:S:tail", `printf %s "user:$S:tail" | base64 -w0; echo`, true},
	{"base64url", `printf %s "$S" | basenc --base64url -w0; echo`, true},
	{"base64url after 1 byte", `printf %s "x$S" | basenc --base64url -w0; echo`, true},
	{"base64url after 2 bytes | fold -w5", `printf %s "xy$S" | basenc --base64url -w0 | fold -w5; echo`, true},
	{"url quote", `python3 -c 'import os, urllib.parse as u; print(u.quote(os.environ["S"], safe=""))'`, true},
	{"url quote (safe '/')", `python3 -c 'import os, urllib.parse as u; print(u.quote(os.environ["S"]))'`, true},
	{"json with \\/", `python3 -c 'import os, json; print(json.dumps({"k": os.environ["S"]}).replace("/", "\\/"))'`, true},
	{"url quote_plus", `python3 -c 'import os, urllib.parse as u; print(u.quote_plus(os.environ["S"]))'`, true},
	{"json", `python3 -c 'import os, json; print(json.dumps({"k": os.environ["S"]}))'`, true},
	{"printf %q", `printf '%q\n' "$S"`, true},
	{"python repr", `python3 -c 'import os; print(repr(os.environ["S"]))'`, true},
	// One node for the three (node takes seconds to start here).
	{"js: encodeURIComponent, JSON, inspect", `node -e 'const s = process.env.S; console.log(encodeURIComponent(s)); console.log(JSON.stringify(s), require("util").inspect(s))'`, true},
	{"utf-16le", `printf %s "$S" | iconv -t UTF-16LE`, true},
	{"utf-16 as python bytes", `python3 -c 'import os; print(os.environ["S"].encode("utf-16"))'`, true},
	{"utf-16 | cat -v", `printf %s "$S" | iconv -t UTF-16 | cat -v; echo`, true},
	{"hex with dashes", `python3 -c 'import os; print(os.environ["S"].encode().hex("-"))'`, true},
	{"utf-16be", `printf %s "$S" | iconv -t UTF-16BE`, true},
	{"utf-16 with BOM", `printf %s "$S" | iconv -t UTF-16`, true},
	{"space between", `printf %s "$S" | sed 's/./& /g'; echo`, true},
	{"tab between", `printf %s "$S" | sed 's/./&\t/g'; echo`, true},
	{"NUL between", `printf '%s\n' "$S" | fold -w1 | tr '\n' '\0'`, true},
	{"LF between", `printf '%s\n' "$S" | fold -w1`, true},
	{"CRLF between", `printf '%s\n' "$S" | fold -w1 | sed 's/$/\r/'`, true},
	{"CR between", `printf '%s\n' "$S" | fold -w1 | tr '\n' '\r'`, true},
	{"SGR between", `printf %s "$S" | sed 's/./&\x1b[31m/g'; printf '\033[0m\n'`, true},
	{"SGR 256-colour between", `python3 -c 'import os; print("\x1b[1;38;5;208m".join(os.environ["S"]) + "\x1b[0m")'`, true},
	{"two lines", `printf '%s\n%s\n' "${S:0:H}" "${S:H}"`, true},
	{"split by CR", `printf '%s\r%s\n' "${S:0:H}" "${S:H}"`, true},
	{"python list(k)", `python3 -c 'import os; print(list(os.environ["S"]))'`, true},
	// Paced (here and below): halves written faster than the server reads
	// the two pipes may arrive in either order (docs/SECURITY.md).
	{"stdout then stderr", `printf %s "${S:0:H}"; sleep 0.1; printf '%s\n' "${S:H}" >&2`, true},
	{"stderr then stdout", `printf %s "${S:0:H}" >&2; sleep 0.1; printf '%s\n' "${S:H}"`, true},
	{"alternating stdout/stderr", `Q=$((${#S}/4)); printf %s "${S:0:Q}"; sleep 0.1; printf %s "${S:Q:Q}" >&2; sleep 0.1; printf %s "${S:2*Q:Q}"; sleep 0.1; printf '%s\n' "${S:3*Q}" >&2`, true},
	// Issue 15's review: what a terminal shows as the value though its
	// bytes differ, and encodings programs print.
	{"X backspace before each char", `python3 -X utf8 -c 'import os; print("".join("X\b" + c for c in os.environ["S"]))'`, true},
	{"overstrike (nroff bold)", `python3 -X utf8 -c 'import os; print("".join(c + "\b" + c for c in os.environ["S"]))'`, true},
	{"zero-width space between", `python3 -X utf8 -c 'import os; print("\u200b".join(os.environ["S"]))'`, true},
	{"no-break space between", `python3 -X utf8 -c 'import os; print("\u00a0".join(os.environ["S"]))'`, true},
	{"fullwidth", `python3 -X utf8 -c 'import os; print("".join(chr(ord(c) + 0xfee0) if "!" <= c <= "~" else c for c in os.environ["S"]))'`, true},
	{"dotted decimal (perl %vd)", `perl -e 'printf "%vd\n", $ENV{S}'`, true},
	{`\u{NN} per char`, `node -e 'console.log([...process.env.S].map(c => "\\u{" + c.codePointAt(0).toString(16) + "}").join(""))'`, true},
}

// xxd's and hexdump -C's layouts (hex columns and a text column).
const pyXXD = `import sys
b = sys.stdin.buffer.read()
for i in range(0, len(b), 16):
    l = b[i:i+16]
    h = " ".join(l[j:j+2].hex() for j in range(0, len(l), 2))
    print("%08x: %-39s  %s" % (i, h, "".join(chr(c) if 32 <= c < 127 else "." for c in l)))`

const pyHexdumpC = `import sys
b = sys.stdin.buffer.read()
for i in range(0, len(b), 16):
    l = b[i:i+16]
    h = " ".join("%02x" % c for c in l[:8]), " ".join("%02x" % c for c in l[8:])
    print("%08x  %-23s  %-23s  |%s|" % (i, h[0], h[1], "".join(chr(c) if 32 <= c < 127 else "." for c in l)))
print("%08x" % len(b))`

// The representative set for the other paths.
var scrubPathForms = []string{"raw", "reversed (rev)", "od -An -tx1", "base64 -w8", "SGR between", "utf-16le", "stdout then stderr", "alternating stdout/stderr"}

// Issue 15's forms, through the exec stream and a terminal as well.
var scrubTerminalForms = []string{"X backspace before each char", "overstrike (nroff bold)", "zero-width space between", "no-break space between", "fullwidth", "dotted decimal (perl %vd)", `\u{NN} per char`}

func shellFormNamed(t *testing.T, name string) shellForm {
	for _, f := range scrubShellForms {
		if f.name == name {
			return f
		}
	}
	t.Fatalf("no form %q", name)
	return shellForm{}
}

// scrubCommand is f's command for sec, in a subshell.
func scrubCommand(f shellForm, sec leakSecret) string {
	n := len(sec.value)
	return fmt.Sprintf(`(S="$%s" H=%d K=%d; export S; set -o pipefail; %s)`, sec.name, n/2, leakThreshold(n), f.cmd)
}

// scrubBatch prints f for each secret in turn, each followed by a mark on
// both streams (one exec per form instead of one per secret: an exec costs
// about half a second here). A mark breaks any run: no secret has < or >.
// The pause after the marks keeps the stderr mark from coming after the
// next secret's first piece on stdout (between its pieces in the merged
// view, which docs/SECURITY.md leaves out of reach).
func scrubBatch(f shellForm, secrets []leakSecret) string {
	var b strings.Builder
	for i, sec := range secrets {
		fmt.Fprintf(&b, "%s; s=$?; printf '\\n<<%d>>\\n'; printf '\\n<<%d>>\\n' >&2; [ $s = 0 ] || exit $s; sleep 0.1\n", scrubCommand(f, sec), i, i)
	}
	return b.String()
}

// scrubSplit cuts an output of scrubBatch into the secrets' parts.
func scrubSplit(t *testing.T, out string, n int) []string {
	t.Helper()
	parts := make([]string, n)
	for i := range parts {
		mark := fmt.Sprintf("\n<<%d>>\n", i)
		j := strings.Index(out, mark)
		if j < 0 {
			t.Fatalf("mark %d missing in %q", i, clip(out, 600))
		}
		parts[i], out = out[:j], out[j+len(mark):]
	}
	return parts
}

// leakLog collects what leaked where, for a summary at the end.
type leakLog struct {
	mu   sync.Mutex
	rows map[string]map[string][]string // path -> form -> "secret: what"
}

func (l *leakLog) add(path, form, what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rows[path] == nil {
		l.rows[path] = map[string][]string{}
	}
	l.rows[path][form] = append(l.rows[path][form], what)
}

func (l *leakLog) summary() string {
	var s strings.Builder
	for _, p := range slices.Sorted(maps.Keys(l.rows)) {
		fmt.Fprintf(&s, "\n%s: %d forms fail", p, len(l.rows[p]))
		for _, f := range slices.Sorted(maps.Keys(l.rows[p])) {
			rows := l.rows[p][f]
			sort.Strings(rows)
			fmt.Fprintf(&s, "\n  %-36s %s", f+":", strings.Join(rows, "; "))
		}
	}
	return s.String()
}

// scrubCheck fails t if any part (a client-visible text) carries a run of
// any of the secrets, or if nothing at all was redacted for a form that
// printed a whole value.
func scrubCheck(t *testing.T, leaks *leakLog, path, form string, printed leakSecret, secrets []leakSecret, whole bool, parts ...string) {
	t.Helper()
	all := strings.Join(parts, "")
	short := strings.TrimPrefix(printed.name, "SCRUB_")
	if strings.TrimSpace(all) == "" {
		t.Errorf("no output")
		leaks.add(path, form, short+": no output")
		return
	}
	for _, sec := range secrets {
		// The longest run per form over the parts, forms in findLeaks' order.
		var found []leak
		for _, p := range parts {
			for _, l := range findLeaks(p, sec) {
				i := slices.IndexFunc(found, func(f leak) bool { return f.form == l.form })
				switch {
				case i < 0:
					found = append(found, l)
				case l.run > found[i].run:
					found[i] = l
				}
			}
		}
		if len(found) == 0 {
			continue
		}
		var ls, brief []string
		for _, l := range dropShadowed(found) {
			ls = append(ls, l.String())
			brief = append(brief, fmt.Sprintf("%s %d", l.form, l.run))
		}
		t.Errorf("%s (k=%d) leaks: %s\noutput: %q", sec.name, leakThreshold(len(sec.value)), strings.Join(ls, "; "), clip(all, 600))
		what := strings.TrimPrefix(sec.name, "SCRUB_") + " " + strings.Join(brief, ", ")
		if !strings.HasPrefix(what, short+" ") {
			what += " (printing " + short + ")"
		}
		leaks.add(path, form, what)
	}
	if whole && !strings.Contains(all, "[REDACTED:") {
		t.Errorf("nothing redacted: %q", clip(all, 600))
		leaks.add(path, form, short+" nothing redacted")
	}
}

// A shellRun is one command's output, by REST exec or the exec stream.
type shellRun struct {
	stdout, stderr string
	exit           int
	truncated      bool
	err            error
}

// scrubExec runs cmd by REST exec.
func scrubExec(h *harness, id, cmd string) shellRun {
	b, _ := json.Marshal(map[string]any{"action": "exec", "command": cmd, "timeoutMs": 60000})
	req, _ := http.NewRequest("POST", h.ts.URL+"/v1/sandbox/terminal/"+id, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+h.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return shellRun{err: err}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r execResponse
	if resp.StatusCode != 200 || json.Unmarshal(body, &r) != nil {
		return shellRun{err: fmt.Errorf("exec: %d %s", resp.StatusCode, body)}
	}
	return shellRun{stdout: r.Stdout, stderr: r.Stderr, exit: r.ExitCode, truncated: r.Truncated}
}

// scrubRequest sends a request as the owner (safe in parallel subtests: it
// fails only t).
func scrubRequest(t *testing.T, h *harness, method, path string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, h.ts.URL+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+h.token)
	req.Header.Set("Content-Type", "application/json")
	cl := &http.Client{Timeout: 90 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// scrubStream runs cmd over the exec stream.
func scrubStream(h *harness, id, cmd string) shellRun {
	hdr := http.Header{"Authorization": {"Bearer " + h.token}}
	c, _, err := h.dialWS("/v1/sandbox/terminal/"+id+"/ws?tty=false&command="+url.QueryEscape(cmd), hdr)
	if err != nil {
		return shellRun{err: err}
	}
	defer c.Close()
	var o, e strings.Builder
	deadline := time.Now().Add(60 * time.Second)
	for {
		c.SetReadDeadline(deadline)
		typ, data, err := c.ReadMessage()
		if err != nil {
			return shellRun{err: fmt.Errorf("read: %v (stdout %q)", err, o.String())}
		}
		if typ == websocket.BinaryMessage && len(data) > 0 {
			switch data[0] {
			case 1:
				o.Write(data[1:])
			case 2:
				e.Write(data[1:])
			default:
				return shellRun{err: fmt.Errorf("frame of stream %d", data[0])}
			}
			continue
		}
		var ev map[string]any
		json.Unmarshal(data, &ev)
		switch ev["type"] {
		case "exit":
			return shellRun{stdout: o.String(), stderr: e.String(), exit: int(ev["exitCode"].(float64))}
		case "error":
			return shellRun{err: fmt.Errorf("stream error: %s", data)}
		}
	}
}

func TestRealScrubForms(t *testing.T) {
	h := startServer(t, realConfig(t))
	secrets := []leakSecret{
		newLeakSecret(t, "SCRUB_LONG", 40, ""),
		newLeakSecret(t, "SCRUB_PUNCT", 30, testPunct),
		newLeakSecret(t, "SCRUB_SHORT", 10, ""),
	}
	env := map[string]string{}
	for _, s := range secrets {
		env[s.name] = s.value
	}
	const id = "scrub1"
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": id, "size": "test-tiny", "secrets": env})
	if code != http.StatusCreated {
		t.Fatalf("provision: %d %s", code, b)
	}
	t.Cleanup(func() { h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil) })
	// The tools the forms use are in the image (a missing one would read
	// as a scrubber failure).
	if r := h.sh(id, "for c in rev od base64 basenc fold iconv sed tr python3 node perl; do command -v $c >/dev/null || echo missing $c; done"); r.ExitCode != 0 || r.Stdout != "" {
		t.Fatalf("tools: %+v", r)
	}
	leaks := &leakLog{rows: map[string]map[string][]string{}}
	t.Cleanup(func() {
		if len(leaks.rows) > 0 {
			t.Logf("leak summary (secret, form found and its longest run in bytes, base64 in characters):%s", leaks.summary())
		}
	})

	// The paths are tried side by side (as many at a time as -parallel
	// allows), in the one sandbox.
	checkRun := func(t *testing.T, path string, f shellForm, r shellRun) {
		if r.err != nil || r.exit != 0 || r.truncated {
			t.Fatalf("err %v exit %d truncated %v, stderr %q", r.err, r.exit, r.truncated, r.stderr)
		}
		outs, errs := scrubSplit(t, r.stdout, len(secrets)), scrubSplit(t, r.stderr, len(secrets))
		for i, sec := range secrets {
			t.Run(sec.name, func(t *testing.T) {
				// The client sees both streams and may join them.
				parts := streamViews(f.name, sec.value, outs[i], errs[i])
				scrubCheck(t, leaks, path, f.name, sec, secrets, f.whole, parts...)
			})
		}
	}
	// Token shapes (not registered values) as real tools print them: grep
	// --color puts a colour code right before the token, tput sgr0 an nF
	// escape; env and python print them plainly.
	t.Run("token shapes", func(t *testing.T) {
		t.Parallel()
		// the token and how much of it grep is asked for (a keyword split
		// by a highlight is out of reach: docs/SECURITY.md)
		tokens := map[string]struct {
			tok string
			hl  int
		}{
			"github":    {"ghp_" + strings.Repeat("aB3dE6gH9k", 3) + "123456", 4},
			"gitlab":    {"glpat-" + strings.Repeat("Xy7_k2Lm9Q", 2), 8},
			"openai":    {"sk-proj-" + strings.Repeat("Zq9vX2pLmN4tR8sW", 4), 8},
			"anthropic": {"sk-ant-api03-" + strings.Repeat("aZ9-bY8_cX7", 8) + "AA", 7},
			"hf":        {"hf_" + strings.Repeat("kLmNoPqRsT", 3) + "uVwX", 3},
		}
		for name, tk := range tokens {
			tok := tk.tok
			for form, cmd := range map[string]string{
				"grep --color":             fmt.Sprintf(`printf 'TOKEN=%%s\n' "$T" | grep --color=always -e "${T:0:%d}"`, tk.hl),
				"env | grep --color TOKEN": `export MY_TOKEN="opaque${T: -20}"; env | grep --color=always TOKEN`,
				"tput sgr0":                `printf '\033(B\033[m%s\033(B\033[m\n' "$T"`,
				"env":                      `export MY_TOKEN="$T"; env | grep '^MY_TOKEN='`,
				"python":                   `python3 -c 'import os; print({"token": os.environ["T"]})'`,
			} {
				r := scrubExec(h, id, "export T='"+tok+"'; "+cmd)
				if r.err != nil || r.exit != 0 {
					t.Fatalf("%s/%s: %v exit %d %q", name, form, r.err, r.exit, r.stderr)
				}
				if strings.Contains(r.stdout, tok[len(tok)-12:]) || !strings.Contains(r.stdout, "[REDACTED:") {
					t.Errorf("%s/%s: %q", name, form, r.stdout)
				}
			}
		}
	})
	t.Run("rest exec", func(t *testing.T) {
		t.Parallel()
		for _, f := range scrubShellForms {
			t.Run(f.name, func(t *testing.T) {
				t.Parallel()
				checkRun(t, "rest exec", f, scrubExec(h, id, scrubBatch(f, secrets)))
			})
		}
	})
	t.Run("exec stream", func(t *testing.T) {
		t.Parallel()
		for _, name := range append(slices.Clone(scrubPathForms), scrubTerminalForms...) {
			f := shellFormNamed(t, name)
			t.Run(f.name, func(t *testing.T) {
				t.Parallel()
				checkRun(t, "exec stream", f, scrubStream(h, id, scrubBatch(f, secrets)))
			})
		}
	})

	t.Run("pty terminal", func(t *testing.T) {
		t.Parallel()
		w := h.terminalWS(t, id, "cols=200&rows=50")
		if !w.readUntil("$ ", 60*time.Second) {
			t.Fatalf("no prompt: %q", w.out.String())
		}
		seq := 1000
		for _, name := range append(slices.Clone(scrubPathForms), scrubTerminalForms...) {
			f := shellFormNamed(t, name)
			for _, sec := range secrets {
				t.Run(f.name+"/"+sec.name, func(t *testing.T) {
					// The markers are computed by the shell, so the echo of the
					// typed line does not contain them.
					seq++
					begin, end, done := fmt.Sprintf("B%d.", seq), fmt.Sprintf("E%d:", seq), fmt.Sprintf(":F%d", seq)
					from := w.out.Len()
					w.send(fmt.Sprintf("echo B$((%d)).; %s; echo E$((%d)):$?:F$((%d))\n", seq, scrubCommand(f, sec), seq, seq))
					if !w.readUntil(done, 60*time.Second) {
						t.Fatalf("no end marker: %q", clip(w.out.String()[from:], 600))
					}
					out := w.out.String()[from:]
					i, j, k := strings.Index(out, begin), strings.Index(out, end), strings.Index(out, done)
					if i < 0 || j < i || k < j {
						t.Fatalf("markers: %q", clip(out, 600))
					}
					if st := out[j+len(end) : k]; st != "0" {
						t.Errorf("exit status %s", st)
					}
					scrubCheck(t, leaks, "pty terminal", f.name, sec, secrets, f.whole, out[i+len(begin):j])
				})
			}
		}
		w.send("exit\n")
	})

	// One exec writes every form into a file of the workspace (both
	// streams); files and artifacts download them.
	t.Run("workspace", func(t *testing.T) {
		t.Parallel()
		type written struct {
			f    shellForm
			sec  leakSecret
			path string // under /workspace
		}
		var files []written
		var sh strings.Builder
		sh.WriteString("mkdir -p /workspace/scrubforms")
		for i, name := range scrubPathForms {
			f := shellFormNamed(t, name)
			for _, sec := range secrets {
				p := fmt.Sprintf("scrubforms/%d-%s.txt", i, strings.ToLower(sec.name))
				files = append(files, written{f, sec, p})
				fmt.Fprintf(&sh, " && %s > /workspace/%s 2>&1", scrubCommand(f, sec), p)
			}
		}
		if r := scrubExec(h, id, sh.String()); r.err != nil || r.exit != 0 {
			t.Fatalf("writing the files: %+v", r)
		}
		for _, route := range []string{"files", "artifacts"} {
			t.Run(route, func(t *testing.T) {
				for _, wf := range files {
					t.Run(wf.f.name+"/"+wf.sec.name, func(t *testing.T) {
						target := filesURL(id, "/workspace/"+wf.path)
						if route == "artifacts" {
							target = "/v1/sandbox/" + id + "/artifacts/" + wf.path
						}
						code, b := scrubRequest(t, h, "GET", target, nil)
						if code != 200 {
							t.Fatalf("%s: %d %s", target, code, b)
						}
						scrubCheck(t, leaks, route, wf.f.name, wf.sec, secrets, wf.f.whole, string(b))
					})
				}
			})
		}
	})

	// The runtimes: each program prints one form of the value in S.
	type codeForm struct{ name, python, node string }
	codeForms := []codeForm{
		{"raw", `print(S)`, `console.log(S)`},
		{"reversed", `print(S[::-1])`, `console.log([...S].reverse().join(''))`},
		{"hex with spaces", `print(S.encode().hex(' '))`, `console.log(Buffer.from(S).toString('hex').match(/../g).join(' '))`},
		{"base64 wrapped at 8", `import base64; b = base64.b64encode(S.encode()).decode(); print('\n'.join(b[i:i+8] for i in range(0, len(b), 8)))`,
			`console.log(Buffer.from(S).toString('base64').match(/.{1,8}/g).join('\n'))`},
		{"SGR between", `print('\x1b[31m'.join(S) + '\x1b[0m')`, `console.log([...S].join('\x1b[31m') + '\x1b[0m')`},
		{"utf-16le", `print(S.encode('utf-16-le').decode('ascii'))`, `console.log(Buffer.from(S, 'utf16le').toString('latin1'))`},
		{"stdout then stderr", `import time; print(S[:len(S)//2], end='', flush=True); time.sleep(0.1); print(S[len(S)//2:], file=sys.stderr)`,
			`process.stdout.write(S.slice(0, S.length >> 1)); Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 100); process.stderr.write(S.slice(S.length >> 1) + '\n')`},
		{"alternating stdout/stderr", `import time
q = len(S)//4
for i, f in enumerate([sys.stdout, sys.stderr, sys.stdout, sys.stderr]):
    print(S[i*q:(i+1)*q] if i < 3 else S[3*q:], end='', file=f, flush=True)
    time.sleep(0.1)
print(file=sys.stderr)`,
			`{ const q = S.length >> 2; for (const i of [0, 1, 2, 3]) { (i % 2 ? process.stderr : process.stdout).write(i < 3 ? S.slice(i*q, (i+1)*q) : S.slice(3*q) + '\n'); Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 100) } }`},
		{"result reversed", `S[::-1]`, `[...S].reverse().join('')`},
		{"error with hex", `raise ValueError(S.encode().hex(' '))`, `throw new Error(Buffer.from(S).toString('hex').match(/../g).join(' '))`},
	}
	for _, lang := range []string{"python", "node"} {
		t.Run(lang, func(t *testing.T) {
			t.Parallel()
			for _, cf := range codeForms {
				for _, sec := range secrets {
					t.Run(cf.name+"/"+sec.name, func(t *testing.T) {
						prog := "import os, sys\nS = os.environ['" + sec.name + "']\n" + cf.python
						if lang == "node" {
							prog = "var S = process.env['" + sec.name + "'];\n" + cf.node
						}
						req, _ := json.Marshal(map[string]any{"code": prog, "timeoutMs": 60000})
						code, body := scrubRequest(t, h, "POST", "/v1/sandbox/"+lang+"/"+id, req)
						var r codeResponse
						if code != 200 || json.Unmarshal(body, &r) != nil {
							t.Fatalf("%d %s", code, body)
						}
						parts := streamViews(cf.name, sec.value, r.Stdout, r.Stderr)
						if r.Result != nil {
							parts = append(parts, *r.Result)
						}
						if r.Error != nil {
							parts = append(parts, r.Error.Name, r.Error.Value, r.Error.Traceback)
						}
						for _, d := range r.Display {
							parts = append(parts, d.Data)
						}
						scrubCheck(t, leaks, lang, cf.name, sec, secrets, true, parts...)
					})
				}
			}
		})
	}
}

// streamViews: what a client can join from the two streams of one command:
// either after the other, and for the alternating form (quarters of the
// value on stdout, stderr, stdout, stderr) the quarters put back in turn.
// Stdout and stderr are scrubbed as one Pair, so none of these shows k
// characters of the value.
func streamViews(form, value, stdout, stderr string) []string {
	views := []string{stdout + stderr, stderr + stdout}
	if strings.HasPrefix(form, "alternating") {
		q := len(value) / 4
		o, e := stdout, stderr
		cut := func(s string, n int) (string, string) { n = min(n, len(s)); return s[:n], s[n:] }
		var a, b, c, d string
		a, o = cut(o, q)
		b, e = cut(e, q)
		c, o = cut(o, q)
		d = e
		views = append(views, a+b+c+d+o)
	}
	return views
}
