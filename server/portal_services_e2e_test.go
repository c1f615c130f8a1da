package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/gorilla/websocket"
)

// signIn opens a route of a session's portal in the browser (ticket, then
// cookie) and returns the portal origin.
func (h *harness) signIn(t testing.TB, ctx context.Context, id, route string) string {
	t.Helper()
	code, b := h.call(h.token, "POST", "/v1/sandbox/"+id+"/tickets", nil)
	var r struct{ Ticket string }
	if json.Unmarshal(b, &r); code != http.StatusCreated {
		t.Fatalf("ticket: %d %s", code, b)
	}
	if err := do(ctx, 60*time.Second, chromedp.Navigate(h.ts.URL+"/v1/sandbox/proxy/"+id+route+"?ticket="+r.Ticket)); err != nil {
		screenshot(t, ctx, "signin-failed"+strings.ReplaceAll(route, "/", "-"))
		loc, _ := get(ctx, 5*time.Second, chromedp.Location())
		t.Fatalf("open %s: %v (at %s)", route, err, loc)
	}
	// The login page may still be moving on to the route (seen under load:
	// "Inspected target navigated or closed"): ask again until it settles.
	var err error
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var origin string
		if origin, err = get(ctx, 5*time.Second, chromedp.Evaluate[string](`location.origin`)); err == nil {
			return origin
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}

// waitFor polls a JavaScript expression until it is true; the starting
// page reloads itself meanwhile.
func waitFor(t testing.TB, ctx context.Context, what, expr string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := get(ctx, 5*time.Second, chromedp.Evaluate[bool](`(()=>{try{return !!(`+expr+`)}catch(e){return false}})()`))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			screenshot(t, ctx, "timeout-"+strings.ReplaceAll(what, " ", "-"))
			t.Fatalf("%s: not after %v (%v)", what, d, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// The image's services through the portal, in a real browser: VS Code,
// Jupyter, the display and Chromium over CDP, plus the data libraries of
// the Python runtime.
func TestRealPortalServices(t *testing.T) {
	h := startServer(t, realConfig(t))
	const id = "portal-services"
	h.provision(id, "standard-3")
	h.startUpstream(id, 8000, 1)
	ctx := newBrowser(t)

	t.Run("data libraries", func(t *testing.T) {
		code, r, body := h.runCode("python", id, map[string]any{"code": `
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt, pandas as pd, numpy as np
plt.plot(np.arange(10), np.arange(10) ** 2)
df = pd.DataFrame({"a": [1, 2], "b": [3, 4]})
df`})
		if code != 200 || r.Error != nil {
			t.Fatalf("%d %s", code, body)
		}
		mimes := map[string]bool{}
		for _, d := range r.Display {
			mimes[d.Mime] = true
		}
		html := ""
		for _, d := range r.Display {
			if d.Mime == "text/html" {
				html = d.Data
			}
		}
		if !mimes["image/png"] || !strings.Contains(html, "<table") {
			t.Errorf("display: %v; body %.400s", mimes, body)
		}
	})

	// Each surface in a tab of its own: a page that asks before it is left
	// (VS Code) does not hold up the next.
	tab := func(t *testing.T) context.Context {
		tctx, cancel := chromedp.NewContext(ctx)
		t.Cleanup(cancel)
		if err := chromedp.Do(tctx); err != nil { // open it (no deadline: it would close the tab)
			t.Fatal(err)
		}
		return tctx
	}
	t.Run("editor", func(t *testing.T) {
		ctx := tab(t)
		if r := h.sh(id, "printf 'first line\\n' > /workspace/hello.txt"); r.ExitCode != 0 {
			t.Fatal(r)
		}
		t0 := time.Now()
		h.signIn(t, ctx, id, "/editor/")
		waitFor(t, ctx, "workbench", `document.querySelector(".monaco-workbench .explorer-folders-view .monaco-list-row")`, 3*time.Minute)
		t.Logf("editor: workbench with the Explorer after %v", time.Since(t0).Round(time.Millisecond))
		screenshot(t, ctx, "portal-editor-workbench")
		// Quick Open the file, type at its start, save.
		if err := do(ctx, 30*time.Second,
			chromedp.KeyEvent("p", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
			chromedp.Sleep(time.Second),
			chromedp.KeyEvent("hello.txt")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "quick open result", `[...document.querySelectorAll(".quick-input-list .monaco-list-row")].some(r => r.innerText.includes("hello.txt"))`, 30*time.Second)
		if err := do(ctx, 10*time.Second, chromedp.KeyEvent("\r")); err != nil {
			t.Fatal(err)
		}
		// (The chat box is a Monaco editor too; VS Code shows spaces as NBSPs.)
		waitFor(t, ctx, "file open", `[...document.querySelectorAll(".editor-instance .monaco-editor .view-lines")].some(e => e.innerText.replace(/\u00a0/g, " ").includes("first line"))`, time.Minute)
		if err := do(ctx, 30*time.Second,
			chromedp.KeyEvent("edited in the browser "),
			chromedp.KeyEvent("s", chromedp.KeyModifiers(chromedp.ModifierCtrl))); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(h.sh(id, "cat /workspace/hello.txt").Stdout, "edited in the browser first line") {
			if time.Now().After(deadline) {
				screenshot(t, ctx, "portal-editor-save-failed")
				t.Fatalf("not saved: %q", h.sh(id, "cat /workspace/hello.txt").Stdout)
			}
			time.Sleep(250 * time.Millisecond)
		}
		screenshot(t, ctx, "portal-editor-saved")
		// The integrated terminal runs a command.
		if err := do(ctx, 30*time.Second, chromedp.KeyEvent("`", chromedp.KeyModifiers(chromedp.ModifierCtrl))); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "terminal", `document.querySelector(".terminal-wrapper .xterm-screen")`, time.Minute)
		time.Sleep(3 * time.Second) // the shell's prompt
		if err := do(ctx, 30*time.Second,
			chromedp.Click(chromedp.CSS(".terminal-wrapper .xterm-screen")),
			insertText("echo $((6*7)) from $(whoami) > /workspace/term.txt"),
			chromedp.KeyEvent("\r")); err != nil {
			t.Fatal(err)
		}
		deadline = time.Now().Add(30 * time.Second)
		for strings.TrimSpace(h.sh(id, "cat /workspace/term.txt 2>/dev/null").Stdout) != "42 from user" {
			if time.Now().After(deadline) {
				screenshot(t, ctx, "portal-editor-terminal-failed")
				t.Fatalf("terminal: %q", h.sh(id, "cat /workspace/term.txt").Stdout)
			}
			time.Sleep(250 * time.Millisecond)
		}
		screenshot(t, ctx, "portal-editor-terminal")
	})

	t.Run("notebook", func(t *testing.T) {
		ctx := tab(t)
		// A notebook made through Jupyter's own API on the proxy route.
		res := h.proxyReq(h.token, "POST", "/v1/sandbox/proxy/"+id+"/notebook/api/contents",
			strings.NewReader(`{"type":"notebook"}`), http.Header{"Content-Type": {"application/json"}})
		b := readAll(t, res)
		var nb struct{ Path string }
		if json.Unmarshal(b, &nb); res.StatusCode != http.StatusCreated || nb.Path == "" {
			t.Fatalf("create notebook: %d %s", res.StatusCode, b)
		}
		h.signIn(t, ctx, id, "/notebook/notebooks/"+nb.Path)
		waitFor(t, ctx, "kernel", `Jupyter.notebook && Jupyter.notebook.kernel && Jupyter.notebook.kernel.is_connected()`, 2*time.Minute)
		if _, err := get(ctx, 10*time.Second, chromedp.Evaluate[bool](`(()=>{const c=Jupyter.notebook.get_cell(0); c.set_text("print(6*7)"); Jupyter.notebook.execute_cell(0); return true})()`)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "cell output", `document.querySelector(".output_area pre") && document.querySelector(".output_area pre").innerText.includes("42")`, time.Minute)
		if _, err := get(ctx, 10*time.Second, chromedp.Evaluate[bool](`(Jupyter.notebook.save_notebook(), true)`)); err != nil {
			t.Fatal(err)
		}
		screenshot(t, ctx, "portal-notebook")
		deadline := time.Now().Add(30 * time.Second)
		for {
			r := h.sh(id, "cat '/workspace/"+nb.Path+"'")
			if strings.Contains(r.Stdout, `"42\n"`) && strings.Contains(r.Stdout, "print(6*7)") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("notebook not saved with its output: %s", r.Stdout)
			}
			time.Sleep(250 * time.Millisecond)
		}
	})

	t.Run("display", func(t *testing.T) {
		ctx := tab(t)
		h.signIn(t, ctx, id, "/display/")
		waitFor(t, ctx, "noVNC connected", `document.querySelector("#noVNC_container canvas, #noVNC_screen canvas") && document.querySelector("canvas").width > 100`, 2*time.Minute)
		r := h.sh(id, "setsid xterm -geometry 60x12+40+40 -bg '#1f6feb' -fg white -e 'echo shown on the display; sleep 3600' >/dev/null 2>&1 < /dev/null & sleep 3; echo ok")
		if r.ExitCode != 0 {
			t.Fatal(r)
		}
		// The xterm's blue fills part of the screen.
		expr := `(()=>{const c=document.querySelector("canvas");const x=c.getContext("2d");const d=x.getImageData(0,0,c.width,c.height).data;let n=0;for(let i=0;i<d.length;i+=4){if(d[i]<60&&d[i+1]>90&&d[i+1]<140&&d[i+2]>200)n++}return n})()`
		deadline := time.Now().Add(30 * time.Second)
		for {
			n, err := get(ctx, 10*time.Second, chromedp.Evaluate[int](expr))
			if err == nil && n > 10000 {
				t.Logf("display: %d blue pixels of the xterm", n)
				break
			}
			if time.Now().After(deadline) {
				screenshot(t, ctx, "portal-display-failed")
				t.Fatalf("xterm not on the display: %d %v", n, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		screenshot(t, ctx, "portal-display")
	})

	t.Run("browser over CDP", func(t *testing.T) {
		res := h.proxyReq(h.token, "GET", "/v1/sandbox/proxy/"+id+"/browser/json/version", nil, nil)
		b := readAll(t, res)
		var v struct{ WebSocketDebuggerURL string }
		json.Unmarshal(b, &v)
		want := "ws" + strings.TrimPrefix(h.ts.URL, "http") + "/v1/sandbox/proxy/" + id + "/browser/devtools/browser/"
		if res.StatusCode != 200 || !strings.HasPrefix(v.WebSocketDebuggerURL, want) {
			t.Fatalf("json/version: %d %s", res.StatusCode, b)
		}
		c, _, err := websocket.DefaultDialer.Dial(v.WebSocketDebuggerURL, http.Header{"Authorization": {"Bearer " + h.token}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cdp := newCDP(t, c)
		tgt := cdp.call("", "Target.createTarget", map[string]any{"url": "about:blank"})
		sess := cdp.call("", "Target.attachToTarget", map[string]any{"targetId": tgt["targetId"], "flatten": true})["sessionId"].(string)
		cdp.call(sess, "Page.enable", nil)
		cdp.call(sess, "Page.navigate", map[string]any{"url": "http://127.0.0.1:8000/page"})
		cdp.waitEvent(sess, "Page.loadEventFired")
		ev := cdp.call(sess, "Runtime.evaluate", map[string]any{"expression": `document.getElementById("h").innerText`, "returnByValue": true})
		if got := ev["result"].(map[string]any)["value"]; got != "Hello from the sandbox" {
			t.Errorf("DOM: %v", ev)
		}
		shot := cdp.call(sess, "Page.captureScreenshot", map[string]any{"format": "png"})
		img, _ := base64.StdEncoding.DecodeString(shot["data"].(string))
		if _, err := png.Decode(bytes.NewReader(img)); err != nil || len(img) < 1000 {
			t.Fatalf("screenshot: %d bytes, %v", len(img), err)
		}
		dir := filepath.Join("..", "test-output", "screenshots")
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "portal-browser-cdp.png"), img, 0o644)
	})

	// The services' output is in the session log.
	if logs := h.logsText(id); !strings.Contains(logs, `"service":"editor"`) || !strings.Contains(logs, "service_start") {
		t.Errorf("session log has no service output:\n%.2000s", logs)
	}
}

// insertText types text as one input event (xterm.js doubles characters
// of synthesized key and char events).
func insertText(text string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, input.InsertText, input.InsertTextParams{Text: text})
		return err
	})
}

// cdpClient is a raw Chrome DevTools Protocol client over one WebSocket.
type cdpClient struct {
	t      *testing.T
	c      *websocket.Conn
	id     int
	events []map[string]any
}

func newCDP(t *testing.T, c *websocket.Conn) *cdpClient { return &cdpClient{t: t, c: c} }

func (x *cdpClient) call(session, method string, params any) map[string]any {
	x.t.Helper()
	x.id++
	msg := map[string]any{"id": x.id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	x.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := x.c.WriteJSON(msg); err != nil {
		x.t.Fatal(err)
	}
	x.c.SetReadDeadline(time.Now().Add(60 * time.Second))
	for {
		var m map[string]any
		if err := x.c.ReadJSON(&m); err != nil {
			x.t.Fatalf("%s: %v", method, err)
		}
		if id, ok := m["id"].(float64); ok && int(id) == x.id {
			if e := m["error"]; e != nil {
				x.t.Fatalf("%s: %v", method, e)
			}
			r, _ := m["result"].(map[string]any)
			return r
		}
		x.events = append(x.events, m)
	}
}

func (x *cdpClient) waitEvent(session, method string) {
	x.t.Helper()
	match := func(m map[string]any) bool {
		return m["method"] == method && (session == "" || m["sessionId"] == session)
	}
	for _, m := range x.events {
		if match(m) {
			return
		}
	}
	x.c.SetReadDeadline(time.Now().Add(60 * time.Second))
	for {
		var m map[string]any
		if err := x.c.ReadJSON(&m); err != nil {
			x.t.Fatalf("waiting for %s: %v", method, err)
		}
		if match(m) {
			return
		}
	}
}
