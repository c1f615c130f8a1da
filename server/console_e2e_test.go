package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"sandboxd/runsc"
	"sandboxd/web"
)

// console drives the web console in a real Chromium against a real server.
type console struct {
	t   *testing.T
	h   *harness
	ctx context.Context

	mu       sync.Mutex
	requests []string // every URL the console's tab asked for (HTTP and WebSocket)
	errors   []string // exceptions and console errors of the page
}

// cspProbe reports CSP violations of every document, from its first line,
// as console errors (collected in console.errors).
const cspProbe = `document.addEventListener('securitypolicyviolation',
  e => console.error('CSP-VIOLATION ' + e.violatedDirective + ' ' + e.blockedURI + ' ' + (e.sample || '')));`

func newConsole(t *testing.T, h *harness) *console {
	c := &console{t: t, h: h, ctx: newBrowser(t)}
	chromedp.Listen(c.ctx, func(ev any) {
		c.mu.Lock()
		defer c.mu.Unlock()
		switch e := ev.(type) {
		case *network.EventRequestWillBeSent:
			c.requests = append(c.requests, e.Request.URL)
		case *network.EventWebSocketCreated:
			c.requests = append(c.requests, e.URL)
		case *cdpruntime.EventExceptionThrown:
			c.errors = append(c.errors, e.ExceptionDetails.Text+" "+func() string {
				if e.ExceptionDetails.Exception != nil {
					return e.ExceptionDetails.Exception.Description
				}
				return ""
			}())
		case *cdpruntime.EventConsoleAPICalled:
			if e.Type == "error" || e.Type == "warning" {
				var parts []string
				for _, a := range e.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				c.errors = append(c.errors, string(e.Type)+": "+strings.Join(parts, " "))
			}
		}
	})
	if _, err := chromedp.Call(c.ctx, cdpruntime.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(c.ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(c.ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: cspProbe}); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *console) do(d time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	if err := do(c.ctx, d, steps...); err != nil {
		c.shot("failed-" + regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(what), "-"))
		c.mu.Lock()
		errs := strings.Join(c.errors, "\n")
		c.mu.Unlock()
		c.t.Fatalf("%s: %v\npage errors:\n%s\npage text:\n%.3000s", what, err, errs, c.text("body"))
	}
}

func (c *console) eval(js string) string {
	c.t.Helper()
	v, err := get(c.ctx, 20*time.Second, chromedp.Evaluate[string](js))
	if err != nil {
		c.t.Fatalf("evaluate %.80s: %v", js, err)
	}
	return v
}

func (c *console) text(sel string) string {
	v, _ := get(c.ctx, 5*time.Second, chromedp.Evaluate[string](`(document.querySelector(`+strconv.Quote(sel)+`)||{}).innerText||''`))
	return v
}

// shot saves a screenshot and checks the page for controls a keyboard or
// screen-reader user could not use: a button, link or field without a name.
func (c *console) shot(name string) {
	screenshot(c.t, c.ctx, "console-"+name)
	if strings.HasPrefix(name, "failed-") {
		return
	}
	if bad := c.eval(`JSON.stringify([...document.querySelectorAll('button, a[href], input:not([type=hidden]):not([hidden]), select, textarea')].filter(e => {
	  if (e.closest('.xterm')) return false; // xterm.js's own helper textarea
	  const name = (e.getAttribute('aria-label') || e.textContent || e.value || '').trim();
	  if (e.matches('input, select, textarea')) return !(e.labels && e.labels.length) && !e.getAttribute('aria-label');
	  return !name;
	}).map(e => e.outerHTML.slice(0, 120)))`); bad != "[]" {
		c.t.Errorf("page %s has unnamed controls: %s", name, bad)
	}
}

// fill sets an input's value the way typing does (an input event).
func fill(sel, val string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](`(() => { const e = document.querySelector(` + strconv.Quote(sel) + `);
	  e.value = ` + strconv.Quote(val) + `; e.dispatchEvent(new Event('input', {bubbles: true})); })()`)
}

// waitFor polls a JavaScript expression until it is true.
func (c *console) waitFor(d time.Duration, what, js string) {
	c.t.Helper()
	if err := c.until(d, js); err != nil {
		c.do(time.Second, what, func(context.Context, *chromedp.Target) (chromedp.Void, error) { return chromedp.Void{}, err })
	}
}

// until polls js from here, not with an in-page poll: a predicate that
// throws once (mid-render) or a page that stalls would leave an in-page
// poll waiting out its whole deadline.
func (c *console) until(d time.Duration, js string) error {
	probe := `(() => { try { return !!(` + js + `) } catch (e) { return false } })()`
	deadline := time.Now().Add(d)
	for {
		ok, err := get(c.ctx, 5*time.Second, chromedp.Evaluate[bool](probe))
		if err == nil && ok {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = context.DeadlineExceeded
			}
			return fmt.Errorf("not true after %s: %.120s: %w", d, js, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *console) signIn(token string) {
	c.t.Helper()
	c.do(30*time.Second, "sign in", chromedp.Navigate(c.h.ts.URL+"/"), chromedp.WaitVisible(chromedp.ID("token")),
		fill("#token", token), chromedp.Click(chromedp.CSS(`form button[type=submit]`)), chromedp.WaitVisible(chromedp.ID("who-name")))
}

func (c *console) signOut() {
	c.t.Helper()
	c.do(10*time.Second, "sign out", chromedp.Click(chromedp.CSS(`button.signout`)), chromedp.WaitVisible(chromedp.ID("token")))
}

// termLines is the active terminal's whole buffer (xterm.js's own view of it).
func (c *console) termLines() []string {
	v, _ := get(c.ctx, 5*time.Second, chromedp.Evaluate[string](`(() => {
	  const el = document.querySelector('.term-tab:not([hidden]) .term'); if (!el || !el.__term) return '';
	  const b = el.__term.buffer.active, out = [];
	  for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true));
	  return out.join('\n'); })()`))
	return strings.Split(v, "\n")
}

// typeLine types a command into the active terminal and presses Enter.
func (c *console) typeLine(cmd string) {
	c.t.Helper()
	c.do(10*time.Second, "type "+cmd, chromedp.Focus(chromedp.CSS(`.term-tab:not([hidden]) textarea.xterm-helper-textarea`), chromedp.NodeReady),
		insertText(cmd), chromedp.KeyEvent("\r"))
}

// waitLine waits for a terminal line matching re and returns its groups.
func (c *console) waitLine(d time.Duration, re string) []string {
	c.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(d)
	for {
		for _, l := range c.termLines() {
			if m := rx.FindStringSubmatch(strings.TrimRight(l, " ")); m != nil {
				return m
			}
		}
		if time.Now().After(deadline) {
			c.shot("failed-terminal")
			c.mu.Lock()
			errs := strings.Join(c.errors, "\n")
			c.mu.Unlock()
			c.t.Fatalf("no terminal line matches %q; page errors:\n%s\nterminal:\n%s", re, errs, strings.Join(c.termLines(), "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRealConsole drives the console as a person would: sign in, provision,
// a terminal, resize, files, artifacts, the log with an egress denial,
// roles, a revoked token, the CSP and same-origin requests; screenshots of
// each page go to test-output/screenshots/console-*.png.
func TestRealConsole(t *testing.T) {
	h := startServer(t, realConfig(t))
	origin := h.ts.URL
	wsOrigin := "ws" + strings.TrimPrefix(origin, "http")

	// Every console response carries the strict CSP and its companions.
	for _, p := range []string{"/", "/assets/app.js", "/assets/app.css", "/assets/icon.svg"} {
		res, err := http.Get(origin + p)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 || res.Header.Get("Content-Security-Policy") != web.CSP ||
			res.Header.Get("X-Frame-Options") != "DENY" || res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("GET %s: %d %v", p, res.StatusCode, res.Header)
		}
	}

	c := newConsole(t, h)
	c.do(30*time.Second, "open", chromedp.Navigate(origin+"/"), chromedp.WaitVisible(chromedp.ID("token")))
	c.shot("signin")
	// A wrong token is refused in words.
	c.do(20*time.Second, "wrong token", fill("#token", "sbx_nope"), chromedp.Click(chromedp.CSS(`form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`.error`)))
	if txt := c.text(".error"); !strings.Contains(txt, "not valid") || !strings.Contains(txt, "Request id") {
		t.Fatalf("wrong token message: %q", txt)
	}

	// Signing in works from the keyboard alone: the field has focus, Enter submits.
	c.do(20*time.Second, "keyboard sign-in", chromedp.Navigate(origin+"/"), chromedp.WaitVisible(chromedp.ID("token")),
		insertText(h.token), chromedp.KeyEvent("\r"), chromedp.WaitVisible(chromedp.ID("who-name")))
	if who := c.text(".who"); !strings.Contains(who, "owner") || !strings.Contains(who, "default") {
		t.Fatalf("who am I: %q", who)
	}
	// The token is in this tab's sessionStorage only: not in the URL, not
	// in localStorage, not in a cookie.
	if got := c.eval(`JSON.stringify([location.href, Object.keys(localStorage), document.cookie, sessionStorage.getItem('sandboxd.token') ? 'set' : ''])`); strings.Contains(got, h.token) || !strings.Contains(got, `"set"`) || strings.Contains(got, "sandboxd.token") {
		t.Fatalf("token storage: %s", got)
	}

	t.Run("provision", func(t *testing.T) {
		c.t = t
		c.do(20*time.Second, "open provision", chromedp.Click(chromedp.ID("new-sandbox")), chromedp.WaitVisible(chromedp.CSS(`.size`)))
		if id := c.eval(`document.querySelector('#p-id').value`); !regexp.MustCompile(`^s-\d{8}-[0-9a-f]{6}$`).MatchString(id) {
			t.Fatalf("suggested id %q", id)
		}
		if sizes := c.text(".sizes"); !strings.Contains(sizes, "standard-1") || !strings.Contains(sizes, "1 vCPU") || !strings.Contains(sizes, "credits/h") {
			t.Fatalf("size picker: %q", sizes)
		}
		c.do(10*time.Second, "fill", fill("#p-id", "web-1"), chromedp.Click(chromedp.CSS(`details summary`)),
			fill(`input[aria-label="Secret 1 name"]`, "CONSOLE_SECRET"), fill(`input[aria-label="Secret 1 value"]`, "cs-7f3a9q-very-secret-value"),
			fill("#p-repo", "octo/repo"), chromedp.WaitVisible(chromedp.ID("no-git")))
		if txt := c.text("#no-git"); !strings.Contains(txt, "No GitHub credential") {
			t.Fatalf("no git message: %q", txt)
		}
		c.shot("provision")
		c.do(10*time.Second, "clear repo", fill("#p-repo", ""), chromedp.WaitNotPresent(chromedp.ID("no-git")))
		c.do(90*time.Second, "start", chromedp.Click(chromedp.ID("p-submit")),
			chromedp.WaitVisible(chromedp.CSS(`.term-state.ts-connected`)))
		if loc := c.eval(`location.hash`); loc != "#/s/web-1" {
			t.Fatalf("after provision at %q", loc)
		}
		if body := c.eval(`document.documentElement.outerHTML`); strings.Contains(body, "cs-7f3a9q-very-secret-value") {
			t.Fatal("the page echoes the secret's value")
		}
		if txt := c.text(".gauges"); !strings.Contains(txt, "CONSOLE_SECRET") || !strings.Contains(txt, "Egress") {
			t.Fatalf("gauges: %q", txt)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		c.t = t
		c.typeLine("echo $((6*7))")
		c.waitLine(20*time.Second, `^42$`)
		c.typeLine("echo \"[$CONSOLE_SECRET]\"")
		m := c.waitLine(20*time.Second, `^\[(.*)\]$`)
		if strings.Contains(m[1], "very-secret") {
			t.Fatalf("terminal shows the secret: %q", m[1])
		}
		c.waitFor(15*time.Second, "memory gauge", `document.querySelector('.gauges').innerText.includes('Memory')`)
		// The gauges' figures are the host's own, of this sandbox.
		var st statsJSON
		if code, b := h.call(h.token, "GET", "/v1/sandbox/web-1/stats", nil); code != 200 || json.Unmarshal(b, &st) != nil ||
			st.Memory.UsedBytes == nil || *st.Memory.UsedBytes < 1<<20 || *st.Memory.LimitBytes < 1<<30 || st.Pids.Current == nil || *st.Pids.Current < 2 ||
			st.Pids.Limit == nil || *st.Pids.Limit != runsc.HostTasks(512) || st.Disk.TotalBytes == nil || *st.Disk.TotalBytes < 7<<30 || st.CPU.Seconds == nil || *st.CPU.Seconds <= 0 {
			t.Fatalf("stats: %d %s", code, b)
		}
		// Colours (xterm.js's style rules pass the CSP as adopted sheets).
		c.typeLine(`printf '\e[31mRED\e[0m plain \e[38;2;0;200;0mTRUE\e[0m\n'`)
		c.waitLine(20*time.Second, `^RED plain TRUE$`)
		color := func(text string) string {
			return c.eval(`(() => { const s = [...document.querySelectorAll('.term-tab:not([hidden]) .xterm-rows span')].find(e => e.textContent === ` + strconv.Quote(text) + `);
			  return s ? getComputedStyle(s).color : 'no span'; })()`)
		}
		if col := color("RED"); col == "no span" || col == "rgb(230, 237, 243)" {
			t.Fatalf("red text is drawn %s", col)
		}
		if col := color("TRUE"); col != "rgb(0, 200, 0)" { // 24-bit colour: a style attribute, through the CSSOM
			t.Fatalf("24-bit green text is drawn %s", col)
		}
		c.shot("terminal")
	})

	t.Run("resize", func(t *testing.T) {
		c.t = t
		// A closing mark: a line read mid-draw ("cols=11" of 119) must not match.
		c.typeLine("echo cols=$(tput cols).")
		before, _ := strconv.Atoi(c.waitLine(20*time.Second, `^cols=(\d+)\.$`)[1])
		c.do(10*time.Second, "narrow", chromedp.EmulateViewport(760, 800))
		// Under a loaded CI machine the first frame after a viewport change
		// has come late; say what the page measured if it never comes.
		if err := c.until(30*time.Second, `document.querySelector('.term-tab:not([hidden]) .term').__term.cols < `+strconv.Itoa(before)); err != nil {
			t.Fatalf("refit: %v; the page measures %s", err, c.eval(`(() => { const el = document.querySelector('.term-tab:not([hidden]) .term');
			  return 'window ' + innerWidth + ', terminal element ' + el.clientWidth + ' wide (parent ' + el.parentElement.clientWidth + '), ' + el.__term.cols + ' columns'; })()`))
		}
		want := c.eval(`String(document.querySelector('.term-tab:not([hidden]) .term').__term.cols)`)
		c.typeLine("clear; echo cols2=$(tput cols).")
		after := c.waitLine(20*time.Second, `^cols2=(\d+)\.$`)[1]
		if after != want || after == strconv.Itoa(before) {
			t.Fatalf("tput cols %d before, %s after a resize to %s columns", before, after, want)
		}
		c.shot("terminal-narrow")
		c.do(10*time.Second, "widen", chromedp.EmulateViewport(1280, 800))
	})

	t.Run("tabs and reconnect", func(t *testing.T) {
		c.t = t
		c.do(30*time.Second, "second tab", chromedp.Click(chromedp.ID("new-terminal")),
			chromedp.WaitVisible(chromedp.CSS(`.term-tab:not([hidden]) .term-state.ts-connected`)))
		c.typeLine("echo tab2-$((40+2))")
		c.waitLine(20*time.Second, `^tab2-42$`)
		// Reload: the tabs re-attach by terminalId and replay their output.
		c.do(30*time.Second, "reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`.term-tab:not([hidden]) .term-state.ts-connected`)),
			chromedp.Click(chromedp.CSS(`.term-tabbtn:nth-child(2) button[role=tab]`)),
			chromedp.WaitVisible(chromedp.CSS(`.term-tab:not([hidden]) .term-state.ts-connected`)))
		c.waitLine(20*time.Second, `^tab2-42$`)
		if n := c.eval(`String(document.querySelectorAll('.term-tabbtn').length)`); n != "2" {
			t.Fatalf("%s terminal tabs after reload, want 2", n)
		}
		c.do(10*time.Second, "first tab", chromedp.Click(chromedp.CSS(`.term-tabbtn:first-child button[role=tab]`)))
		c.waitLine(20*time.Second, `^cols2=\d+\.$`) // replayed (after its clear)
		// A dropped connection reconnects by itself, replays, and goes on.
		c.typeLine("echo before-drop")
		c.waitLine(20*time.Second, `^before-drop$`)
		c.eval(`document.querySelector('.term-tab:not([hidden]) .term').__drop(), 'ok'`)
		c.waitFor(10*time.Second, "reconnecting", `document.querySelector('.term-tab:not([hidden]) .term-state').className.includes('ts-reconnecting')`)
		c.do(20*time.Second, "reconnected", chromedp.WaitVisible(chromedp.CSS(`.term-tab:not([hidden]) .term-state.ts-connected`)))
		c.waitLine(20*time.Second, `^before-drop$`)
		c.typeLine("echo after-drop")
		c.waitLine(20*time.Second, `^after-drop$`)
	})

	t.Run("exited shell", func(t *testing.T) {
		c.t = t
		c.typeLine("exit")
		c.do(20*time.Second, "exited", chromedp.WaitVisible(chromedp.CSS(`.term-tab:not([hidden]) .term-state.ts-exited button.new-shell`)),
			chromedp.Click(chromedp.CSS(`.term-tab:not([hidden]) button.new-shell`)),
			chromedp.WaitVisible(chromedp.CSS(`.term-tab:not([hidden]) .term-state.ts-connected`)))
		c.typeLine("echo new-$((1+1))")
		c.waitLine(20*time.Second, `^new-2$`)
	})

	t.Run("files", func(t *testing.T) {
		c.t = t
		up := filepath.Join(t.TempDir(), "hello-upload.txt")
		os.WriteFile(up, []byte("uploaded from the console\n"), 0o644)
		c.do(20*time.Second, "files tab", chromedp.Navigate(origin+"/#/s/web-1/files"), chromedp.WaitVisible(chromedp.CSS(`.filelist`)))
		c.do(30*time.Second, "upload", chromedp.SetUploadFiles(chromedp.ID("upload-input"), []string{up}, chromedp.NodeReady),
			chromedp.WaitVisible(chromedp.CSS(`tr[data-file="hello-upload.txt"]`)))
		// Drag and drop: a drop of a file onto the list uploads it.
		c.do(10*time.Second, "drop", chromedp.Evaluate[chromedp.Void](`(() => {
		  const dt = new DataTransfer(); dt.items.add(new File(['dropped\n'], 'dropped.txt'));
		  const el = document.querySelector('.files');
		  el.dispatchEvent(new DragEvent('dragover', {dataTransfer: dt, bubbles: true, cancelable: true}));
		  el.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true})); })()`))
		c.do(30*time.Second, "dropped", chromedp.WaitVisible(chromedp.CSS(`tr[data-file="dropped.txt"]`)))
		if txt := c.text(".uploads"); strings.Count(txt, "done") != 2 {
			t.Fatalf("upload progress: %q", txt)
		}
		c.shot("files")
		c.do(20*time.Second, "back to the terminal", chromedp.Click(chromedp.ID("tab-terminal")),
			chromedp.WaitVisible(chromedp.CSS(`.term-tab:not([hidden]) .term-state.ts-connected`)))
		c.typeLine("ls /workspace; cat /workspace/dropped.txt")
		c.waitLine(20*time.Second, `hello-upload\.txt`)
		c.waitLine(20*time.Second, `^dropped$`)
	})

	t.Run("artifact download", func(t *testing.T) {
		c.t = t
		content := "artifact made in the sandbox " + strconv.FormatInt(time.Now().UnixNano(), 10) + "\n"
		c.typeLine("mkdir -p /workspace/out && printf '" + strings.TrimSuffix(content, "\n") + "\\n' > /workspace/out/report.txt && echo made")
		c.waitLine(20*time.Second, `^made$`)
		dir := t.TempDir()
		if _, err := chromedp.CallBrowser(c.ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dir}); err != nil {
			t.Fatal(err)
		}
		c.do(20*time.Second, "artifacts tab", chromedp.Click(chromedp.ID("tab-artifacts")),
			chromedp.WaitVisible(chromedp.CSS(`tr[data-artifact="out/report.txt"]`)))
		sum := sha256.Sum256([]byte(content))
		if got := c.eval(`document.querySelector('tr[data-artifact="out/report.txt"] .sha').title`); got != hex.EncodeToString(sum[:]) {
			t.Fatalf("sha256 shown %q, want %x", got, sum)
		}
		c.shot("artifacts")
		c.do(10*time.Second, "download", chromedp.Click(chromedp.CSS(`tr[data-artifact="out/report.txt"] button`)))
		deadline := time.Now().Add(20 * time.Second)
		for {
			b, err := os.ReadFile(filepath.Join(dir, "report.txt"))
			if err == nil && string(b) == content {
				break
			}
			if time.Now().After(deadline) {
				ents, _ := os.ReadDir(dir)
				t.Fatalf("no download: %v %q %v", err, b, ents)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("egress denial in the log", func(t *testing.T) {
		c.t = t
		c.do(20*time.Second, "terminal", chromedp.Click(chromedp.ID("tab-terminal")),
			chromedp.WaitVisible(chromedp.CSS(`.term-tab:not([hidden]) .term-state.ts-connected`)))
		c.typeLine("curl -sS -m 10 https://evil.example/; echo curl=$?")
		c.waitLine(20*time.Second, `^curl=\d+$`)
		c.do(20*time.Second, "log tab", chromedp.Click(chromedp.ID("tab-logs")),
			chromedp.WaitVisible(chromedp.CSS(`.ll.event.denied[data-kind="egress_denied"]`)))
		if txt := c.text(`.ll.event.denied[data-kind="egress_denied"]`); !strings.Contains(txt, "evil.example") {
			t.Fatalf("denial line: %q", txt)
		}
		c.shot("log")
	})

	t.Run("portal opens on its own origin", func(t *testing.T) {
		c.t = t
		ch := chromedp.WaitNewTarget(c.ctx, func(i *target.Info) bool { return i.Type == "page" })
		c.do(10*time.Second, "editor", chromedp.Click(chromedp.CSS(`button[data-portal="editor"]`)))
		var id target.ID
		select {
		case id = <-ch:
		case <-time.After(15 * time.Second):
			t.Fatal("no new tab for the editor")
		}
		host := regexp.MustCompile(`^http://s[0-9a-f]{20}\.localhost:` + regexp.QuoteMeta(strings.Split(origin, ":")[2]) + `/`)
		deadline := time.Now().Add(30 * time.Second)
		for {
			ts, _ := chromedp.Targets(c.ctx)
			var u string
			for _, i := range ts {
				if i.TargetID == id {
					u = i.URL
				}
			}
			if host.MatchString(u) {
				if strings.Contains(u, "ticket=") && !strings.Contains(u, "/.sandboxd/login") {
					t.Fatalf("ticket left in the portal URL: %s", u)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("editor tab at %q, not on the portal origin", u)
			}
			time.Sleep(200 * time.Millisecond)
		}
		// The tab got no copy of the console's token: back on the API's
		// origin it shows the sign-in form (with a token, the sessions).
		pctx, cancel := chromedp.NewContext(c.ctx, chromedp.WithTargetID(id))
		defer cancel()
		if err := do(pctx, 20*time.Second, chromedp.Navigate(origin+"/"), chromedp.WaitVisible(chromedp.ID("token"))); err != nil {
			t.Fatalf("the portal's tab, back on the console: %v", err)
		}
		chromedp.CallBrowser(c.ctx, target.CloseTarget, target.CloseTargetParams{TargetID: id})
	})

	t.Run("organization pages", func(t *testing.T) {
		c.t = t
		h.newMember("dana", "developer")
		for _, p := range []struct{ route, sel, name string }{
			{"usage", "#plan-card", "usage"},
			{"tokens", "tr[data-token]", "tokens"},
			{"members", `tr[data-member="dana"]`, "members"},
			{"audit", `tr[data-action="sandbox.provision"]`, "audit"},
			{"sessions", `tr[data-session="web-1"]`, "sessions"},
		} {
			c.do(20*time.Second, p.route, chromedp.Navigate(origin+"/#/"+p.route), chromedp.WaitVisible(chromedp.CSS(p.sel)))
			c.shot(p.name)
		}
		c.do(20*time.Second, "usage chart", chromedp.Navigate(origin+"/#/usage"), chromedp.WaitVisible(chromedp.CSS(`#plan-card`)))
		if txt := c.text("#plan-card"); !strings.Contains(strings.ToLower(txt), "team") {
			t.Fatalf("plan card: %q", txt)
		}
		// Audit filters: by session and by action.
		c.do(20*time.Second, "audit filter", chromedp.Navigate(origin+"/#/audit"), chromedp.WaitVisible(chromedp.ID("a-session")),
			fill("#a-action", "sandbox.files_put"), chromedp.Click(chromedp.CSS(`form.filters button[type=submit]`)),
			chromedp.WaitNotPresent(chromedp.CSS(`tr[data-action="sandbox.provision"]`)), chromedp.WaitVisible(chromedp.CSS(`tr[data-action="sandbox.files_put"]`)))
		// A refused change says why: the last owner cannot step down.
		c.do(20*time.Second, "demote the last owner", chromedp.Navigate(origin+"/#/members"), chromedp.WaitVisible(chromedp.CSS(`tr[data-member="dana"] select`)),
			chromedp.Evaluate[chromedp.Void](`(() => { const s = document.querySelector('tr[data-member="owner"] select');
			  s.value = 'viewer'; s.dispatchEvent(new Event('change', {bubbles: true})); })()`),
			// One's own role: asked first, then refused in words.
			chromedp.WaitVisible(chromedp.CSS(`dialog[open] button.danger`)), chromedp.Click(chromedp.CSS(`dialog[open] button.danger`)),
			chromedp.WaitVisible(chromedp.CSS(`dialog[open] .error`)))
		if txt := c.text("dialog[open] .error"); !strings.Contains(txt, "owner") || !strings.Contains(txt, "Request id") {
			t.Fatalf("refused role change: %q", txt)
		}
		c.do(10*time.Second, "close", chromedp.KeyEvent("\x1b"), chromedp.WaitNotPresent(chromedp.CSS(`dialog[open]`)))
		if v := c.eval(`document.querySelector('tr[data-member="owner"] select').value`); v != "owner" {
			t.Fatalf("the select shows %q after a refused change", v)
		}
		// A malformed link does not blank the console.
		c.do(20*time.Second, "bad link", chromedp.Navigate(origin+"/#/s/%E0%A4%A"), chromedp.WaitVisible(chromedp.CSS(`main#main h1`)),
			chromedp.Navigate(origin+"/#/sessions"), chromedp.WaitVisible(chromedp.CSS(`tr[data-session="web-1"]`)))
		// The provision form says what is wrong, even in a folded section.
		c.do(20*time.Second, "bad idle timeout", chromedp.Click(chromedp.ID("new-sandbox")), chromedp.WaitVisible(chromedp.ID("p-idle"), chromedp.NodeReady),
			fill("#p-idle", "1.5"), chromedp.Click(chromedp.ID("p-submit")), chromedp.WaitVisible(chromedp.CSS(`dialog[open] .error`)))
		if txt := c.text("dialog[open] .error"); !strings.Contains(txt, "Idle timeout") {
			t.Fatalf("idle timeout message: %q", txt)
		}
		c.do(10*time.Second, "close", chromedp.KeyEvent("\x1b"), chromedp.WaitNotPresent(chromedp.CSS(`dialog[open]`)))
		// A token is shown once on creation.
		c.do(20*time.Second, "create token", chromedp.Navigate(origin+"/#/tokens"), chromedp.WaitVisible(chromedp.ID("tok-name")),
			fill("#tok-name", "from-console"), chromedp.Click(chromedp.ID("tok-create")), chromedp.WaitVisible(chromedp.ID("fresh-token")))
		tok := c.eval(`document.querySelector('#fresh-token').value`)
		if code, _ := h.call(tok, "GET", "/v1/me", nil); code != 200 {
			t.Fatalf("the token the console showed does not work: %d", code)
		}
		c.shot("token-created")
	})

	t.Run("phone", func(t *testing.T) {
		c.t = t
		c.do(20*time.Second, "phone", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile),
			chromedp.Navigate(origin+"/#/sessions"), chromedp.WaitVisible(chromedp.CSS(`tr[data-session="web-1"]`)))
		c.shot("phone-sessions")
		c.do(20*time.Second, "phone log", chromedp.Navigate(origin+"/#/s/web-1/logs"), chromedp.WaitVisible(chromedp.CSS(`.ll.event`)))
		if w := c.eval(`String(document.documentElement.scrollWidth)`); w != "390" {
			t.Errorf("the log page is %s px wide on a 390 px screen", w)
		}
		c.shot("phone-log")
		c.do(10*time.Second, "desktop", chromedp.EmulateViewport(1280, 800))
	})

	t.Run("lifecycle", func(t *testing.T) {
		c.t = t
		confirm := func(action, status string) {
			c.do(90*time.Second, action, chromedp.Navigate(origin+"/#/s/web-1"), chromedp.WaitVisible(chromedp.CSS(`button[data-action="`+action+`"]`)),
				chromedp.Click(chromedp.CSS(`button[data-action="`+action+`"]`)), chromedp.WaitVisible(chromedp.CSS(`dialog[open] button.primary`)),
				chromedp.Click(chromedp.CSS(`dialog[open] button.primary`)), chromedp.WaitNotPresent(chromedp.CSS(`dialog[open]`)),
				chromedp.WaitVisible(chromedp.CSS(`h1 .status.st-`+status)))
		}
		confirm("teardown", "stopped")
		c.waitFor(20*time.Second, "saved size", `/Saved workspace\n[0-9.]+ (B|KiB|MiB|GiB)/.test(document.querySelector('.gauges').innerText)`)
		c.shot("stopped")
		confirm("resume", "running")
		confirm("pause", "paused")
		confirm("resume", "running")
		c.do(30*time.Second, "terminal after resume", chromedp.Click(chromedp.ID("tab-terminal")),
			chromedp.WaitVisible(chromedp.CSS(`.term-tab:not([hidden]) .term-state.ts-connected`)))
		c.typeLine("cat /workspace/dropped.txt")
		c.waitLine(20*time.Second, `^dropped$`)
		// Deleting a file from the browser.
		c.do(20*time.Second, "delete a file", chromedp.Click(chromedp.ID("tab-files")), chromedp.WaitVisible(chromedp.CSS(`tr[data-file="dropped.txt"]`)),
			chromedp.Click(chromedp.CSS(`button[aria-label="Delete dropped.txt"]`)), chromedp.WaitVisible(chromedp.CSS(`dialog[open] button.danger`)),
			chromedp.Click(chromedp.CSS(`dialog[open] button.danger`)), chromedp.WaitNotPresent(chromedp.CSS(`tr[data-file="dropped.txt"]`)))
		if r := h.sh("web-1", "test -e /workspace/dropped.txt; echo $?"); strings.TrimSpace(r.Stdout) != "1" {
			t.Fatalf("dropped.txt still there: %+v", r)
		}
	})

	t.Run("roles", func(t *testing.T) {
		c.t = t
		c.signOut()
		devToken := h.newMember("devon", "developer")
		c.signIn(devToken)
		c.do(20*time.Second, "dev session", chromedp.Navigate(origin+"/#/s/web-1"), chromedp.WaitVisible(chromedp.CSS(`button[data-action="teardown"]`)))
		// Demoted while the page is open: the server refuses, the console says why.
		var me struct{ Organization struct{ ID string } }
		_, b := h.call(devToken, "GET", "/v1/me", nil)
		json.Unmarshal(b, &me)
		var m struct {
			Members []struct{ UserID, Name string }
		}
		_, b = h.call(h.token, "GET", "/v1/orgs/"+me.Organization.ID+"/members", nil)
		json.Unmarshal(b, &m)
		for _, x := range m.Members {
			if x.Name == "devon" {
				if code, b := h.call(h.token, "PATCH", "/v1/orgs/"+me.Organization.ID+"/members/"+x.UserID, map[string]any{"role": "viewer"}); code != 200 {
					t.Fatalf("demote: %d %s", code, b)
				}
			}
		}
		c.do(20*time.Second, "forbidden teardown", chromedp.Click(chromedp.CSS(`button[data-action="teardown"]`)),
			chromedp.WaitVisible(chromedp.CSS(`dialog[open] button.primary`)), chromedp.Click(chromedp.CSS(`dialog[open] button.primary`)),
			chromedp.WaitVisible(chromedp.CSS(`dialog[open] .error`)))
		if txt := c.text(`dialog[open] .error`); !strings.Contains(txt, "forbidden") || !strings.Contains(txt, "Request id") {
			t.Fatalf("forbidden message: %q", txt)
		}
		c.shot("forbidden")
		if got := h.get("web-1").Status; got != "running" {
			t.Fatalf("the forbidden teardown ran: %s", got)
		}
		c.do(10*time.Second, "close dialog", chromedp.KeyEvent("\x1b"))
		// Signed in again as the viewer it now is: no provision button, a note.
		c.signOut()
		c.signIn(devToken)
		c.do(20*time.Second, "viewer list", chromedp.WaitVisible(chromedp.ID("viewer-note")), chromedp.WaitVisible(chromedp.CSS(`tr[data-session="web-1"]`)))
		if n := c.eval(`String(document.querySelectorAll('#new-sandbox, button[data-action]').length)`); n != "0" {
			t.Fatalf("a viewer sees %s provision or lifecycle buttons", n)
		}
		c.shot("viewer")
		c.do(20*time.Second, "viewer audit", chromedp.Navigate(origin+"/#/audit"), chromedp.WaitVisible(chromedp.CSS(`.notice[role=alert]`)))
		if txt := c.text(`.notice[role=alert]`); !strings.Contains(txt, "audit.read") {
			t.Fatalf("viewer audit page: %q", txt)
		}
		c.signOut()
	})

	t.Run("revoked token signs out", func(t *testing.T) {
		c.t = t
		tok := h.newToken("console-tab")
		c.signIn(tok.Token)
		c.do(20*time.Second, "list", chromedp.WaitVisible(chromedp.CSS(`tr[data-session="web-1"]`)))
		if code, b := h.call(h.token, "DELETE", "/v1/tokens/"+tok.ID, nil); code/100 != 2 {
			t.Fatalf("revoke: %d %s", code, b)
		}
		c.do(30*time.Second, "signed out", chromedp.WaitVisible(chromedp.ID("token")), chromedp.WaitVisible(chromedp.CSS(`.notice`)))
		if txt := c.text(".notice"); !strings.Contains(txt, "signed out") {
			t.Fatalf("sign-out notice: %q", txt)
		}
		if got := c.eval(`sessionStorage.getItem('sandboxd.token') || ''`); got != "" {
			t.Fatal("the revoked token stays in the tab's storage")
		}
		c.shot("signed-out")
	})

	c.t = t
	// No CSP violation on any page, and no request to any other origin.
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.errors {
		if strings.Contains(e, "CSP-VIOLATION") {
			t.Errorf("CSP violation: %s", e)
		}
	}
	var foreign []string
	for _, u := range c.requests {
		if !strings.HasPrefix(u, origin+"/") && !strings.HasPrefix(u, wsOrigin+"/") && !strings.HasPrefix(u, "data:") && !strings.HasPrefix(u, "blob:"+origin) {
			foreign = append(foreign, u)
		}
	}
	if len(foreign) > 0 || len(c.requests) < 20 {
		t.Errorf("%d requests; to other origins: %v", len(c.requests), foreign)
	}
	if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/web-1", nil); code/100 != 2 {
		t.Errorf("delete: %d", code)
	}
}
