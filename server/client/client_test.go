package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// newServer serves h and returns a client of it with token "tok".
func newServer(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	c, err := New(ts.URL+"/", "tok")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewRejectsBadURLs(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://", "http://u:p@x", "http://x/?a=b"} {
		if _, err := New(u, "t"); err == nil {
			t.Errorf("New(%q): no error", u)
		}
	}
}

func TestErrorDecoding(t *testing.T) {
	cases := []struct {
		name        string
		status      int
		hdrID, body string
		want        Error
		wantString  string
	}{
		{"contract", 409, "hdr", `{"error":{"code":"conflict","message":"session id already used","requestId":"req-1"}}`,
			Error{Status: 409, Code: "conflict", Message: "session id already used", RequestID: "req-1"}, "session id already used (conflict, request req-1)"},
		{"header id", 404, "hdr-2", `{"error":{"code":"not_found","message":"no such session"}}`,
			Error{Status: 404, Code: "not_found", Message: "no such session", RequestID: "hdr-2"}, "no such session (not_found, request hdr-2)"},
		{"details", 402, "r3", `{"error":{"code":"insufficient_credits","message":"not enough credits","requestId":"r3",` +
			`"details":{"remaining":0,"needed":0.084,"size":"standard-1","creditsPerHour":1,"periodEnd":"2026-02-01T00:00:00Z","plan":"free"}}}`,
			Error{Status: 402, Code: "insufficient_credits", Message: "not enough credits", RequestID: "r3", Details: map[string]any{
				"remaining": 0.0, "needed": 0.084, "size": "standard-1", "creditsPerHour": 1.0, "periodEnd": "2026-02-01T00:00:00Z", "plan": "free"}},
			"not enough credits (insufficient_credits, request r3)"},
		{"empty details", 400, "r4", `{"error":{"code":"invalid_request","message":"bad","requestId":"r4","details":{}}}`,
			Error{Status: 400, Code: "invalid_request", Message: "bad", RequestID: "r4"}, "bad (invalid_request, request r4)"},
		{"html", 502, "", `<html><body>Bad Gateway</body></html>`,
			Error{Status: 502, Code: "http_502", Message: "Bad Gateway"}, "Bad Gateway (http_502)"},
		{"text", 500, "r", "upstream exploded\n",
			Error{Status: 500, Code: "http_500", Message: "upstream exploded", RequestID: "r"}, "upstream exploded (http_500, request r)"},
		{"empty", 503, "", "", Error{Status: 503, Code: "http_503", Message: "Service Unavailable"}, "Service Unavailable (http_503)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.hdrID != "" {
					w.Header().Set("X-Request-Id", tc.hdrID)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			})
			_, err := c.Get(context.Background(), "s1")
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v (%T), want *Error", err, err)
			}
			if !reflect.DeepEqual(*e, tc.want) {
				t.Errorf("got %+v, want %+v", *e, tc.want)
			}
			if e.Error() != tc.wantString {
				t.Errorf("Error() = %q, want %q", e.Error(), tc.wantString)
			}
			if !IsStatus(err, tc.status) || !IsCode(err, tc.want.Code) {
				t.Error("IsStatus/IsCode disagree")
			}
		})
	}
}

func TestProvisionSendsContract(t *testing.T) {
	var got map[string]any
	var auth, path string
	c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		auth, path = r.Header.Get("Authorization"), r.URL.Path
		json.NewDecoder(r.Body).Decode(&got)
		w.WriteHeader(201)
		io.WriteString(w, `{"sessionId":"s1","status":"running","size":"standard-1","resources":{"vcpus":1,"memoryMiB":1024,"diskMiB":8192},"future":42}`)
	})
	idle := 600
	sb, err := c.Provision(context.Background(), ProvisionRequest{SessionID: "s1", Size: "standard-1",
		Secrets: map[string]string{"K": "value-123456"}, IdleTimeoutSeconds: &idle, IdleAction: "pause"})
	if err != nil {
		t.Fatal(err)
	}
	if auth != "Bearer tok" || path != "/v1/sandbox" {
		t.Errorf("auth %q path %q", auth, path)
	}
	want := map[string]any{"sessionId": "s1", "size": "standard-1", "secrets": map[string]any{"K": "value-123456"},
		"idleTimeoutSeconds": float64(600), "idleAction": "pause"}
	if g, _ := json.Marshal(got); string(g) != mustJSON(want) {
		t.Errorf("body %s, want %s", g, mustJSON(want))
	}
	if sb.Status != "running" || sb.Resources.MemoryMiB != 1024 || !bytes.Contains(sb.Raw, []byte(`"future":42`)) {
		t.Errorf("decoded %+v raw %s", sb, sb.Raw)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestBasePathPrefixAndEscaping(t *testing.T) {
	var paths []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.EscapedPath()+"?"+r.URL.RawQuery)
		w.Header().Set("Content-Type", "application/octet-stream")
		io.WriteString(w, "x")
	}))
	defer ts.Close()
	c, err := New(ts.URL+"/sandboxd/", "tok")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c.DownloadArtifact(ctx, "s1", "/workspace/out dir/a#b.txt", io.Discard, nil)
	c.Download(ctx, "s1", "/workspace/a b&c.txt", io.Discard, nil)
	want := []string{"/sandboxd/v1/sandbox/s1/artifacts/out%20dir/a%23b.txt?", "/sandboxd/v1/sandbox/s1/files?path=%2Fworkspace%2Fa+b%26c.txt"}
	if strings.Join(paths, "\n") != strings.Join(want, "\n") {
		t.Errorf("paths\n%s\nwant\n%s", strings.Join(paths, "\n"), strings.Join(want, "\n"))
	}
}

func TestUploadDownloadStreamWithProgress(t *testing.T) {
	var stored []byte
	c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPut:
			if r.ContentLength != 300000 {
				t.Errorf("Content-Length %d", r.ContentLength)
			}
			stored, _ = io.ReadAll(r.Body)
			w.WriteHeader(201)
			io.WriteString(w, `{"name":"f","path":"/workspace/f","type":"file","size":300000}`)
		case http.MethodGet:
			if r.URL.Query().Get("path") == "/workspace" {
				w.Header().Set("Content-Type", "application/json; charset=utf-8")
				w.Header().Set("X-Listing-Truncated", "entries")
				io.WriteString(w, `[{"name":"f","path":"/workspace/f","type":"file","size":300000}]`)
				return
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(stored)
		}
	})
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789"), 30000)
	var last, total int64
	res, err := c.Upload(ctx, "s1", "/workspace/f", bytes.NewReader(data), int64(len(data)), func(d, tot int64) { last, total = d, tot })
	if err != nil {
		t.Fatal(err)
	}
	if !res.Created || res.Entry.Size != 300000 || last != 300000 || total != 300000 {
		t.Errorf("upload: %+v progress %d/%d", res, last, total)
	}
	var buf bytes.Buffer
	n, err := c.Download(ctx, "s1", "/workspace/f", &buf, func(d, _ int64) { last = d })
	if err != nil || n != int64(len(data)) || !bytes.Equal(buf.Bytes(), data) || last != n {
		t.Errorf("download: n=%d err=%v equal=%v progress=%d", n, err, bytes.Equal(buf.Bytes(), data), last)
	}
	if _, err := c.Download(ctx, "s1", "/workspace", io.Discard, nil); !errors.Is(err, ErrIsDirectory) {
		t.Errorf("download of a directory: %v", err)
	}
	l, err := c.ListDir(ctx, "s1", "/workspace")
	if err != nil || len(l.Entries) != 1 || l.Truncated != "entries" {
		t.Errorf("list: %+v %v", l, err)
	}
	if _, err := c.ListDir(ctx, "s1", "/workspace/f"); !errors.Is(err, ErrNotDirectory) {
		t.Errorf("list of a file: %v", err)
	}
}

// A download the server cuts after its headers is an error, not a short file.
func TestDownloadCutIsError(t *testing.T) {
	c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(200)
		w.Write(bytes.Repeat([]byte("x"), 10000))
		w.(http.Flusher).Flush()
		conn, _, _ := http.NewResponseController(w).Hijack()
		conn.Close()
	})
	if _, err := c.Download(context.Background(), "s1", "/workspace/f", io.Discard, nil); err == nil {
		t.Fatal("no error for a cut transfer")
	}
}

func TestUsage(t *testing.T) {
	var query string
	c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/usage" || r.Method != "GET" {
			t.Errorf("%s %s", r.Method, r.URL.Path)
		}
		query = r.URL.RawQuery
		io.WriteString(w, `{"organization":{"id":"org_1","name":"acme"},`+
			`"plan":{"name":"team","monthlyCredits":3000,"largestSize":"","maxConcurrent":32,"egressMiB":0,"storageMiB":0,"pause":true},`+
			`"period":{"start":"2026-01-15T00:00:00Z","end":"2026-02-15T00:00:00Z"},`+
			`"allowance":{"credits":3000,"milli":3000000},"granted":{"credits":10.5,"milli":10500},`+
			`"used":{"credits":0.209,"milli":209},"remaining":{"credits":3010.291,"milli":3010291},`+
			`"sessions":[{"sessionId":"demo-1","status":"stopped","size":"standard-1","runningSeconds":754.2,`+
			`"credits":{"credits":0.209,"milli":209},"egressBytes":12,"savedBytes":81920}],`+
			`"days":[{"date":"2026-01-20","runningSeconds":754.2,"credits":{"credits":0.209,"milli":209}}],"future":1}`)
	})
	u, err := c.Usage(context.Background(), UsageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if query != "" {
		t.Errorf("default query %q", query)
	}
	if u.Organization.Name != "acme" || u.Plan.Name != "team" || u.Plan.MaxConcurrent != 32 || !u.Plan.Pause ||
		u.Period.Start.Day() != 15 || u.Period.End.Month() != time.February ||
		u.Allowance.Milli != 3000000 || u.Granted.Credits != 10.5 || u.Used.Milli != 209 || u.Remaining.Milli != 3010291 {
		t.Errorf("usage %+v", u)
	}
	if len(u.Sessions) != 1 || u.Sessions[0] != (SessionUsage{"demo-1", "stopped", "standard-1", 754.2, Amount{0.209, 209}, 12, 81920}) {
		t.Errorf("sessions %+v", u.Sessions)
	}
	if len(u.Days) != 1 || u.Days[0] != (DayUsage{"2026-01-20", 754.2, Amount{0.209, 209}}) {
		t.Errorf("days %+v", u.Days)
	}
	if m, err := u.Map(); err != nil || m["future"].(json.Number).String() != "1" {
		t.Errorf("map %v %v", m, err)
	}
	if _, err := c.Usage(context.Background(), UsageOptions{Period: "previous", OrgID: "org 2"}); err != nil {
		t.Fatal(err)
	}
	if query != "orgId=org+2&period=previous" {
		t.Errorf("query %q", query)
	}
}

func TestOperatorCalls(t *testing.T) {
	type call struct{ method, path, body string }
	var got []call
	c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, call{r.Method, r.URL.EscapedPath(), string(b)})
		switch {
		case strings.HasSuffix(r.URL.Path, "/plan"):
			io.WriteString(w, `{"organization":{"id":"org/2","name":"beta"},"plan":{"name":"pro","monthlyCredits":500,"largestSize":"standard-4"}}`)
		default:
			w.WriteHeader(201)
			io.WriteString(w, `{"grant":{"id":7,"credits":{"credits":0.5,"milli":500},"time":"2026-01-20T10:00:00Z","note":"trial"},`+
				`"remaining":{"credits":20.5,"milli":20500},"period":{"start":"2026-01-15T00:00:00Z","end":"2026-02-15T00:00:00Z"}}`)
		}
	})
	ctx := context.Background()
	pc, err := c.SetPlan(ctx, "org/2", "pro")
	if err != nil || pc.Plan.Name != "pro" || pc.Plan.MonthlyCredits != 500 || pc.Organization.Name != "beta" || len(pc.Raw) == 0 {
		t.Fatalf("SetPlan: %+v %v", pc, err)
	}
	g, err := c.GrantCredits(ctx, "org/2", "0.5", "trial")
	if err != nil || g.Grant.ID != 7 || g.Grant.Credits.Milli != 500 || g.Remaining.Milli != 20500 || g.Period.End.Month() != time.February {
		t.Fatalf("GrantCredits: %+v %v", g, err)
	}
	want := []call{
		{"PUT", "/v1/orgs/org%2F2/plan", `{"plan":"pro"}`},
		{"POST", "/v1/orgs/org%2F2/credits", `{"credits":0.5,"note":"trial"}`},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
	for _, bad := range []string{"", "ten", "1e", "0x10"} {
		if _, err := c.GrantCredits(ctx, "o", bad, ""); err == nil || IsStatus(err, 201) {
			t.Errorf("GrantCredits(%q): %v", bad, err)
		}
	}
	if len(got) != 2 {
		t.Errorf("bad amounts reached the server: %q", got[2:])
	}
}

func TestLogsSnapshot(t *testing.T) {
	c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"event","time":"2026-01-02T03:04:05Z","kind":"process_start","command":"ls"}`+"\n"+
			`{"type":"kernel","time":"2026-01-02T03:04:06Z","line":"warning"}`+"\n")
	})
	l, err := c.Logs(context.Background(), "s1")
	if err != nil || len(l) != 2 {
		t.Fatalf("%v %v", l, err)
	}
	if l[0].Kind != "process_start" || l[0].Fields["command"] != "ls" || l[1].Line != "warning" || l[1].Time.Second() != 6 {
		t.Errorf("%+v", l)
	}
}

// A fake terminal endpoint speaking the contract's frames.
func TestTerminal(t *testing.T) {
	up := websocket.Upgrader{}
	got := make(chan string, 10)
	c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(401)
			io.WriteString(w, `{"error":{"code":"unauthenticated","message":"no","requestId":"r"}}`)
			return
		}
		if r.URL.Query().Get("terminalId") == "gone" {
			w.Header().Set("X-Request-Id", "r9")
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"code":"not_found","message":"no such terminal","requestId":"r9"}}`)
			return
		}
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		got <- "size " + r.URL.Query().Get("cols") + "x" + r.URL.Query().Get("rows")
		conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"ready","terminalId":"term_1"}`))
		conn.WriteMessage(websocket.BinaryMessage, []byte("$ "))
		for i := 0; i < 2; i++ {
			typ, data, err := conn.ReadMessage()
			if err != nil {
				return
			}
			got <- map[int]string{websocket.TextMessage: "text ", websocket.BinaryMessage: "bin "}[typ] + string(data)
		}
		conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"exit","exitCode":3}`))
		conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "exit"))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.DialTerminal(ctx, "s1", TerminalOptions{TerminalID: "gone"}); !IsCode(err, "not_found") {
		t.Fatalf("dial of a gone terminal: %v", err)
	}
	term, err := c.DialTerminal(ctx, "s1", TerminalOptions{Cols: 100, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	if term.ID() != "term_1" {
		t.Errorf("id %q", term.ID())
	}
	ev, err := term.Recv()
	if err != nil || ev.Type != "output" || string(ev.Data) != "$ " {
		t.Fatalf("%+v %v", ev, err)
	}
	term.Resize(80, 24)
	term.Write([]byte("exit 3\r"))
	if ev, err = term.Recv(); err != nil || ev.Type != "exit" || ev.ExitCode != 3 {
		t.Fatalf("%+v %v", ev, err)
	}
	if _, err = term.Recv(); err != io.EOF {
		t.Errorf("after exit: %v, want io.EOF", err)
	}
	for _, want := range []string{"size 100x30", `text {"cols":80,"rows":24,"type":"resize"}`, "bin exit 3\r"} {
		if g := <-got; g != want {
			t.Errorf("server saw %q, want %q", g, want)
		}
	}
}

// The client is meant to be imported by tools: it stays free of the
// server's packages (and of its framework).
func TestNoServerDependencies(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, d := range strings.Fields(string(out)) {
		if (strings.HasPrefix(d, "sandboxd/") && d != "sandboxd/server/client") || strings.Contains(d, "gin-gonic") {
			t.Errorf("client depends on %s", d)
		}
	}
}

type schemaObj struct {
	Properties map[string]json.RawMessage `json:"properties"`
	Items      *schemaObj                 `json:"items"`
}

// The mirrored types keep up with the contract: every property of the
// OpenAPI document's schemas is a field of the client's type.
func TestTypesMatchOpenAPI(t *testing.T) {
	b, err := os.ReadFile("../openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]schemaObj `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for schema, v := range map[string]any{
		"Sandbox": Sandbox{}, "Resources": Resources{}, "EgressUsage": EgressUsage{}, "CreditUsage": CreditUsage{},
		"StorageUsage": StorageUsage{}, "TeardownResult": TeardownResult{}, "ExecResponse": ExecResult{},
		"CodeResponse": CodeResult{}, "FileEntry": FileEntry{}, "Artifact": Artifact{}, "Me": Me{},
		"OrgRef": Ref{}, "Usage": Usage{}, "Amount": Amount{}, "Plan": Plan{},
		// The usage's inline objects.
		"Usage.period": Period{}, "Usage.sessions": SessionUsage{}, "Usage.days": DayUsage{},
	} {
		s, ok := doc.Components.Schemas[schema]
		if name, prop, inline := strings.Cut(schema, "."); inline {
			ok = false
			var p schemaObj
			if raw, found := doc.Components.Schemas[name].Properties[prop]; found && json.Unmarshal(raw, &p) == nil {
				if p.Items != nil {
					p = *p.Items
				}
				s, ok = p, len(p.Properties) > 0
			}
		}
		if !ok {
			t.Errorf("schema %s not in openapi.json", schema)
			continue
		}
		fields := map[string]bool{}
		rt := reflect.TypeOf(v)
		for i := 0; i < rt.NumField(); i++ {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			fields[name] = true
		}
		for p := range s.Properties {
			if !fields[p] {
				t.Errorf("%s.%s: no field in %s", schema, p, rt.Name())
			}
		}
	}
}
