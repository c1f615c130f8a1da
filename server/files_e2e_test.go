package server

// Real tests of the files and artifacts routes: real gVisor sandboxes, a
// real HTTP server, and a sandbox user that attacks the host through its
// workspace (symlinks to host files, symlinked directories, /proc magic
// links, FIFOs, sockets, encoded paths, swaps during the request).

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/server/workspace"
	"sandboxd/store"
)

// fileClient sends raw requests and remembers every body it got, so a test
// can check at the end that a host marker never came back.
type fileClient struct {
	h      *harness
	mu     sync.Mutex
	bodies [][]byte
}

func (fc *fileClient) do(token, method, target string, body io.Reader) (*http.Response, []byte) {
	fc.h.t.Helper()
	req, err := http.NewRequest(method, fc.h.ts.URL+target, body)
	if err != nil {
		fc.h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	cl := &http.Client{Timeout: 30 * time.Second}
	resp, err := cl.Do(req)
	if err != nil {
		fc.h.t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		fc.h.t.Fatalf("%s %s: reading the body: %v", method, target, err)
	}
	fc.mu.Lock()
	fc.bodies = append(fc.bodies, b)
	fc.mu.Unlock()
	return resp, b
}

func filesURL(id, p string, extra ...string) string {
	u := "/v1/sandbox/" + id + "/files?path=" + url.QueryEscape(p)
	for _, e := range extra {
		u += "&" + e
	}
	return u
}

func (fc *fileClient) get(id, p string) (*http.Response, []byte) {
	return fc.do(fc.h.token, "GET", filesURL(id, p), nil)
}

func (fc *fileClient) put(id, p string, body []byte) (*http.Response, []byte) {
	return fc.do(fc.h.token, "PUT", filesURL(id, p), bytes.NewReader(body))
}

func (fc *fileClient) del(id, p string, extra ...string) (*http.Response, []byte) {
	return fc.do(fc.h.token, "DELETE", filesURL(id, p, extra...), nil)
}

func (fc *fileClient) artifacts(id string) ([]workspace.Artifact, http.Header) {
	fc.h.t.Helper()
	resp, b := fc.do(fc.h.token, "GET", "/v1/sandbox/"+id+"/artifacts", nil)
	if resp.StatusCode != 200 {
		fc.h.t.Fatalf("artifacts of %s: %d %s", id, resp.StatusCode, b)
	}
	var out []workspace.Artifact
	if err := json.Unmarshal(b, &out); err != nil {
		fc.h.t.Fatalf("artifacts: %v: %s", err, b)
	}
	return out, resp.Header
}

func findArtifact(list []workspace.Artifact, p string) (workspace.Artifact, bool) {
	for _, a := range list {
		if a.Path == p {
			return a, true
		}
	}
	return workspace.Artifact{}, false
}

func errCode(b []byte) string {
	var e errorBody
	json.Unmarshal(b, &e)
	return e.Error.Code
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// mountsUnderSandboxes lists the mount points below the data dir's
// sandboxes/ directory.
func mountsUnderSandboxes(cfg *config.Config) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], filepath.Join(cfg.DataDir, "sandboxes")+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

func TestRealFiles(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	fc := &fileClient{h: h}
	const secret = "tok-3f9a8b7c6d5e4f3a2b1c"
	code, b := h.call(h.token, "POST", "/v1/sandbox", map[string]any{"sessionId": "f1", "size": "test-tiny",
		"secrets": map[string]string{"TOKEN": secret}})
	if code != 201 {
		t.Fatalf("provision: %d %s", code, b)
	}

	// A marker on the host that the sandbox user tries to reach.
	hostDir := t.TempDir()
	rnd := make([]byte, 12)
	rand.Read(rnd)
	marker := "HOSTMARKER-" + hex.EncodeToString(rnd)
	hostFile := filepath.Join(hostDir, "marker.txt")
	if err := os.WriteFile(hostFile, []byte(marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(hostDir, 0o755)
	defer func() {
		if got, err := os.ReadFile(hostFile); err != nil || string(got) != marker+"\n" {
			t.Errorf("host marker changed: %q %v", got, err)
		}
		ents, _ := os.ReadDir(hostDir)
		if len(ents) != 1 {
			t.Errorf("host dir gained entries: %v", ents)
		}
		for _, body := range fc.bodies {
			if bytes.Contains(body, []byte(marker)) {
				t.Errorf("a response carried the host marker: %.200q", body)
			}
			if bytes.Contains(body, []byte(secret)) {
				t.Errorf("a response carried the secret: %.200q", body)
			}
		}
	}()

	t.Run("put then cat inside, owned by the sandbox user", func(t *testing.T) {
		resp, b := fc.put("f1", "/workspace/up/deep/a.txt", []byte("hello from the API\n"))
		if resp.StatusCode != 201 {
			t.Fatalf("put: %d %s", resp.StatusCode, b)
		}
		var e workspace.Entry
		json.Unmarshal(b, &e)
		if e.Name != "a.txt" || e.Path != "/workspace/up/deep/a.txt" || e.Type != "file" || e.Size != 19 || e.ModifiedAt.IsZero() {
			t.Fatalf("entry: %s", b)
		}
		r := h.sh("f1", "cat /workspace/up/deep/a.txt; stat -c '%u:%g %a %F' /workspace/up/deep/a.txt /workspace/up/deep /workspace/up; ls -a /workspace/up/deep")
		want := "hello from the API\n1000:1000 644 regular file\n1000:1000 755 directory\n1000:1000 755 directory\n.\n..\na.txt\n"
		if r.Stdout != want {
			t.Fatalf("inside: %q, want %q (stderr %q)", r.Stdout, want, r.Stderr)
		}
		// Replace: 200, and the sandbox user can append to it.
		resp, b = fc.put("f1", "/workspace/up/deep/a.txt", []byte("replaced\n"))
		if resp.StatusCode != 200 {
			t.Fatalf("replace: %d %s", resp.StatusCode, b)
		}
		if r := h.sh("f1", "echo more >> /workspace/up/deep/a.txt && cat /workspace/up/deep/a.txt"); r.Stdout != "replaced\nmore\n" {
			t.Fatalf("after replace: %+v", r)
		}
		// Larger than limits.maxBodyBytes (JSON bodies): uploads have their own limit.
		big := make([]byte, 3<<20)
		rand.Read(big)
		if resp, b := fc.put("f1", "/workspace/big.bin", big); resp.StatusCode != 201 {
			t.Fatalf("3 MiB upload: %d %s", resp.StatusCode, b)
		}
		if r := h.sh("f1", "sha256sum < /workspace/big.bin"); !strings.HasPrefix(r.Stdout, sha(big)) {
			t.Fatalf("uploaded bytes differ inside: %q", r.Stdout)
		}
		// A directory or a parent that is a file is a conflict.
		if resp, b := fc.put("f1", "/workspace/up", []byte("x")); resp.StatusCode != 409 {
			t.Fatalf("put on a dir: %d %s", resp.StatusCode, b)
		}
		if resp, b := fc.put("f1", "/workspace/up/deep/a.txt/x", []byte("x")); resp.StatusCode != 409 {
			t.Fatalf("put below a file: %d %s", resp.StatusCode, b)
		}
		if resp, b := fc.put("f1", "/workspace", []byte("x")); resp.StatusCode != 400 || errCode(b) != "invalid_path" {
			t.Fatalf("put on /workspace: %d %s", resp.StatusCode, b)
		}
	})

	t.Run("written inside, read via GET with defensive headers", func(t *testing.T) {
		h.sh("f1", "mkdir -p /workspace/out/sub && printf 'line one\\nline two\\n' > /workspace/out/report.txt && echo x > /workspace/out/sub/z && ln -s report.txt /workspace/out/link && mkfifo /workspace/out/fifo")
		resp, b := fc.get("f1", "/workspace/out/report.txt")
		if resp.StatusCode != 200 || string(b) != "line one\nline two\n" {
			t.Fatalf("get: %d %q", resp.StatusCode, b)
		}
		for k, v := range map[string]string{
			"Content-Type":            "application/octet-stream",
			"Content-Disposition":     `attachment; filename="report.txt"; filename*=UTF-8''report.txt`,
			"X-Content-Type-Options":  "nosniff",
			"Content-Security-Policy": "sandbox",
		} {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("%s = %q, want %q", k, got, v)
			}
		}
		// Listing: sorted by name, symlinks not followed, FIFOs left out.
		resp, b = fc.get("f1", "/workspace/out")
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("list: %d %s", resp.StatusCode, b)
		}
		var list []workspace.Entry
		json.Unmarshal(b, &list)
		var got []string
		for _, e := range list {
			got = append(got, fmt.Sprintf("%s %s %s", e.Name, e.Path, e.Type))
			if e.ModifiedAt.IsZero() {
				t.Errorf("no modifiedAt: %+v", e)
			}
		}
		want := []string{"link /workspace/out/link symlink", "report.txt /workspace/out/report.txt file", "sub /workspace/out/sub dir"}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("listing %q, want %q", got, want)
		}
		if list[1].Size != 18 {
			t.Errorf("size %d", list[1].Size)
		}
		// The workspace itself, with a trailing slash too.
		for _, p := range []string{"/workspace", "/workspace/"} {
			if resp, b := fc.get("f1", p); resp.StatusCode != 200 || !strings.Contains(string(b), `"name":"out"`) {
				t.Fatalf("list %s: %d %s", p, resp.StatusCode, b)
			}
		}
		if resp, b := fc.get("f1", "/workspace/nope.txt"); resp.StatusCode != 404 || errCode(b) != "not_found" {
			t.Fatalf("missing: %d %s", resp.StatusCode, b)
		}
		// A file named with a trailing slash is not a directory (open(2)'s ENOTDIR).
		if resp, b := fc.get("f1", "/workspace/out/report.txt/"); resp.StatusCode != 400 || errCode(b) != "invalid_path" {
			t.Fatalf("file with a trailing slash: %d %s", resp.StatusCode, b)
		}
		// Nor may one be written, deleted or downloaded as an artifact by
		// such a name, nor a new file made by it; the file is left as it was.
		for name, resp := range map[string]func() (*http.Response, []byte){
			"put":     func() (*http.Response, []byte) { return fc.put("f1", "/workspace/out/report.txt/", []byte("over")) },
			"put new": func() (*http.Response, []byte) { return fc.put("f1", "/workspace/out/newf/", []byte("new")) },
			"delete":  func() (*http.Response, []byte) { return fc.del("f1", "/workspace/out/report.txt/") },
			"artifact": func() (*http.Response, []byte) {
				return fc.do(fc.h.token, "GET", "/v1/sandbox/f1/artifacts/out/report.txt/", nil)
			},
		} {
			if r, b := resp(); r.StatusCode != 400 || errCode(b) != "invalid_path" {
				t.Fatalf("%s with a trailing slash: %d %s", name, r.StatusCode, b)
			}
		}
		if r := h.sh("f1", "wc -c < /workspace/out/report.txt; test -e /workspace/out/newf || echo no newf"); r.Stdout != "18\nno newf\n" {
			t.Fatalf("after the trailing-slash requests: %q", r.Stdout)
		}
	})

	t.Run("binary bytes round-trip", func(t *testing.T) {
		data := make([]byte, 0, 1<<20+512)
		for i := 0; i < 512; i++ {
			data = append(data, byte(i))
		}
		rnd := make([]byte, 1<<20)
		rand.Read(rnd)
		data = append(data, rnd...)
		if resp, b := fc.put("f1", "/workspace/bin/blob.bin", data); resp.StatusCode != 201 {
			t.Fatalf("put: %d %s", resp.StatusCode, b)
		}
		if r := h.sh("f1", "sha256sum < /workspace/bin/blob.bin"); !strings.HasPrefix(r.Stdout, sha(data)) {
			t.Fatalf("inside: %q", r.Stdout)
		}
		if resp, b := fc.get("f1", "/workspace/bin/blob.bin"); resp.StatusCode != 200 || !bytes.Equal(b, data) {
			t.Fatalf("get: %d, %d bytes, equal %v", resp.StatusCode, len(b), bytes.Equal(b, data))
		}
		// Written inside (every byte value), read out.
		h.sh("f1", "python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256))*4)' > /workspace/bin/inside.bin")
		want := bytes.Repeat(func() []byte {
			b := make([]byte, 256)
			for i := range b {
				b[i] = byte(i)
			}
			return b
		}(), 4)
		if resp, b := fc.get("f1", "/workspace/bin/inside.bin"); resp.StatusCode != 200 || !bytes.Equal(b, want) {
			t.Fatalf("inside.bin: %d %d bytes", resp.StatusCode, len(b))
		}
	})

	t.Run("artifacts list and download", func(t *testing.T) {
		h.sh("f1", `mkdir -p /workspace/out && printf '%%PDF-fake' > '/workspace/out/rép "x";.pdf' && printf 'nl' > $'/workspace/out/a\r\nb.txt'`)
		list, hdr := fc.artifacts("f1")
		if hdr.Get(truncatedHdr) != "" {
			t.Fatalf("truncated: %q", hdr.Get(truncatedHdr))
		}
		var paths []string
		for _, a := range list {
			paths = append(paths, a.Path)
		}
		for _, p := range []string{"out/report.txt", "out/sub/z", "up/deep/a.txt", "bin/blob.bin", "big.bin", `out/rép "x";.pdf`} {
			if _, ok := findArtifact(list, p); !ok {
				t.Errorf("%s not listed: %q", p, paths)
			}
		}
		for _, p := range []string{"out/link", "out/fifo", "out", "out/sub"} {
			if _, ok := findArtifact(list, p); ok {
				t.Errorf("%s listed", p)
			}
		}
		for i := 1; i < len(paths); i++ {
			if paths[i-1] >= paths[i] {
				t.Errorf("not sorted: %q", paths)
			}
		}
		for _, a := range list {
			resp, b := fc.do(h.token, "GET", "/v1/sandbox/f1/artifacts/"+(&url.URL{Path: a.Path}).EscapedPath(), nil)
			if resp.StatusCode != 200 || int64(len(b)) != a.Size || sha(b) != a.SHA256 {
				t.Errorf("%s: %d, %d bytes (listed %d), sha %s (listed %s)", a.Path, resp.StatusCode, len(b), a.Size, sha(b), a.SHA256)
			}
			if resp.Header.Get("Content-Type") != "application/octet-stream" || resp.Header.Get("X-Content-Type-Options") != "nosniff" ||
				resp.Header.Get("Content-Security-Policy") != "sandbox" || !strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment; filename=\"") {
				t.Errorf("%s: headers %v", a.Path, resp.Header)
			}
		}
		resp, _ := fc.do(h.token, "GET", "/v1/sandbox/f1/artifacts/out/r%C3%A9p%20%22x%22%3B.pdf", nil)
		if cd := resp.Header.Get("Content-Disposition"); cd != `attachment; filename="r_p _x__.pdf"; filename*=UTF-8''r%C3%A9p%20%22x%22%3B.pdf` {
			t.Errorf("Content-Disposition %q", cd)
		}
		resp, b := fc.do(h.token, "GET", "/v1/sandbox/f1/artifacts/out/a%0D%0Ab.txt", nil)
		if cd := resp.Header.Get("Content-Disposition"); resp.StatusCode != 200 || string(b) != "nl" || cd != `attachment; filename="a__b.txt"; filename*=UTF-8''a%0D%0Ab.txt` {
			t.Errorf("CR LF name: %d %q %q", resp.StatusCode, b, cd)
		}
		if a, ok := findArtifact(list, "out/report.txt"); !ok || a.Size != 18 || a.SHA256 != sha([]byte("line one\nline two\n")) || a.ModifiedAt.IsZero() {
			t.Errorf("report.txt: %+v", a)
		}
		for _, p := range []string{"out", "out/nope", ""} {
			if resp, b := fc.do(h.token, "GET", "/v1/sandbox/f1/artifacts/"+p, nil); resp.StatusCode != 404 && resp.StatusCode != 400 {
				t.Errorf("artifact %q: %d %s", p, resp.StatusCode, b)
			}
		}
	})

	t.Run("secrets scrubbed from files, names and digests", func(t *testing.T) {
		h.sh("f1", `mkdir -p /workspace/sec && printf 'start %s end\n' "$TOKEN" > /workspace/sec/leak.txt && printf 'x' > "/workspace/sec/name-$TOKEN.txt"`)
		resp, b := fc.get("f1", "/workspace/sec/leak.txt")
		if resp.StatusCode != 200 || string(b) != "start [REDACTED:TOKEN] end\n" {
			t.Fatalf("get: %d %q", resp.StatusCode, b)
		}
		resp, b = fc.get("f1", "/workspace/sec")
		if resp.StatusCode != 200 || strings.Contains(string(b), secret) || !strings.Contains(string(b), "name-[REDACTED:TOKEN].txt") {
			t.Fatalf("listing: %d %s", resp.StatusCode, b)
		}
		list, _ := fc.artifacts("f1")
		a, ok := findArtifact(list, "sec/leak.txt")
		if !ok {
			t.Fatalf("leak.txt not listed")
		}
		if _, ok := findArtifact(list, "sec/name-[REDACTED:TOKEN].txt"); !ok {
			t.Errorf("secret name not listed redacted")
		}
		resp, b = fc.do(h.token, "GET", "/v1/sandbox/f1/artifacts/sec/leak.txt", nil)
		if resp.StatusCode != 200 || string(b) != "start [REDACTED:TOKEN] end\n" || sha(b) != a.SHA256 || int64(len(b)) != a.Size {
			t.Fatalf("download: %d %q, listed %+v", resp.StatusCode, b, a)
		}
	})

	t.Run("escapes", func(t *testing.T) {
		// The sandbox user plants links to the host (their targets mean
		// nothing inside the sandbox, everything on the host).
		r := h.sh("f1", fmt.Sprintf(`set -e; cd /workspace; mkdir -p esc/real; echo inside > esc/real/marker.txt
ln -s %[1]s esc/final; ln -s %[2]s esc/dir; ln -s /proc/self/root%[1]s esc/proc; ln -s /proc/1/root/etc/passwd esc/proc1
ln -s ../../../../../../../../../../..%[1]s esc/rel; ln -s real esc/inner; mkfifo esc/fifo
python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.bind("/workspace/esc/sock")'; ls esc | wc -l`, hostFile, hostDir))
		if strings.TrimSpace(r.Stdout) != "9" {
			t.Fatalf("setup: %+v", r)
		}
		// gVisor keeps FIFOs and sockets made inside to itself; a disk can
		// still hold real ones (made on the host here).
		ws := filepath.Join(cfg.DataDir, "sandboxes", h.s.rt.ContainerID(orgOf(t, h), "f1"), "disk", "workspace")
		if err := unix.Mkfifo(filepath.Join(ws, "esc", "hostfifo"), 0o666); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("unix", filepath.Join(ws, "esc", "hostsock"))
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		defer ln.Close()
		bad := map[string][]string{ // path -> acceptable codes
			"/workspace/esc/hostfifo":          {"400"},
			"/workspace/esc/hostsock":          {"400"},
			"/workspace/esc/final":             {"400"},
			"/workspace/esc/dir/marker.txt":    {"400"},
			"/workspace/esc/proc":              {"400"},
			"/workspace/esc/proc1":             {"400"},
			"/workspace/esc/rel":               {"400"},
			"/workspace/esc/inner/marker.txt":  {"400"},
			"/workspace/esc/fifo":              {"400", "404"},
			"/workspace/esc/sock":              {"400", "404"},
			"/workspace/../etc/passwd":         {"400"},
			"/workspace/esc/../../etc/passwd":  {"400"},
			"/etc/passwd":                      {"400"},
			hostFile:                           {"400"},
			"workspace/esc/real/marker.txt":    {"400"},
			"/workspacex/a":                    {"400"},
			"/workspace//esc/real/marker.txt":  {"400"},
			"/workspace/./esc/real/marker.txt": {"400"},
			"/workspace/esc/real\x00/x":        {"400"},
			"":                                 {"400"},
		}
		for p, codes := range bad {
			start := time.Now()
			resp, b := fc.get("f1", p)
			if !contains(codes, fmt.Sprint(resp.StatusCode)) || (resp.StatusCode == 400 && errCode(b) != "invalid_path") {
				t.Errorf("GET %q: %d %s", p, resp.StatusCode, b)
			}
			if time.Since(start) > 5*time.Second {
				t.Errorf("GET %q took %v", p, time.Since(start))
			}
			resp, b = fc.do(h.token, "GET", "/v1/sandbox/f1/artifacts/"+(&url.URL{Path: strings.TrimPrefix(strings.TrimPrefix(p, "/workspace"), "/")}).EscapedPath(), nil)
			if resp.StatusCode != 400 && resp.StatusCode != 404 {
				t.Errorf("artifact %q: %d %s", p, resp.StatusCode, b)
			}
		}
		// Encoded tricks, sent raw.
		for _, target := range []string{
			"/v1/sandbox/f1/files?path=/workspace/%2e%2e/%2e%2e" + url.PathEscape(hostFile),
			"/v1/sandbox/f1/files?path=%2Fworkspace%2F..%2F..%2F..%2Fetc%2Fpasswd",
			"/v1/sandbox/f1/files?path=/workspace/esc/real/marker.txt%00",
			"/v1/sandbox/f1/artifacts/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
			"/v1/sandbox/f1/artifacts/..%2F..%2F..%2Fetc%2Fpasswd",
			"/v1/sandbox/f1/artifacts/../../../../../../etc/passwd",
			"/v1/sandbox/f1/artifacts/esc/real/marker.txt%00.pdf",
			"/v1/sandbox/f1/artifacts/esc/dir/marker.txt",
		} {
			resp, b := fc.do(h.token, "GET", target, nil)
			if resp.StatusCode != 400 && resp.StatusCode != 404 {
				t.Errorf("GET %s: %d %s", target, resp.StatusCode, b)
			}
		}
		// The real file next to the links is served.
		if resp, b := fc.get("f1", "/workspace/esc/real/marker.txt"); resp.StatusCode != 200 || string(b) != "inside\n" {
			t.Errorf("real file: %d %q", resp.StatusCode, b)
		}
		// Writes through links leave the host alone.
		for _, p := range []string{"/workspace/esc/final", "/workspace/esc/dir/marker.txt", "/workspace/esc/dir/new.txt",
			"/workspace/esc/proc", "/workspace/esc/rel", "/workspace/esc/dir/sub/new.txt", "/workspace/esc/inner/new.txt"} {
			resp, b := fc.put("f1", p, []byte("pwned\n"))
			if resp.StatusCode != 400 || errCode(b) != "invalid_path" {
				t.Errorf("PUT %q: %d %s", p, resp.StatusCode, b)
			}
		}
		for _, p := range []string{"/workspace/esc/dir/marker.txt", "/workspace/esc/proc/x", "/workspace/esc/inner/marker.txt", "/workspace/../etc/passwd"} {
			resp, b := fc.del("f1", p)
			if resp.StatusCode != 400 {
				t.Errorf("DELETE %q: %d %s", p, resp.StatusCode, b)
			}
		}
		// Deleting a link removes the link, never its target, also recursively.
		for _, p := range []string{"/workspace/esc/final", "/workspace/esc/dir"} {
			if resp, b := fc.del("f1", p, "recursive=true"); resp.StatusCode != 204 {
				t.Errorf("DELETE link %q: %d %s", p, resp.StatusCode, b)
			}
		}
		if r := h.sh("f1", "ls /workspace/esc | tr '\\n' ' '"); r.Stdout != "fifo hostfifo hostsock inner proc proc1 real rel sock " {
			t.Errorf("after deleting links: %q", r.Stdout)
		}
		// The artifact walk does not follow them either.
		list, _ := fc.artifacts("f1")
		for _, a := range list {
			if strings.HasPrefix(a.Path, "esc/") && a.Path != "esc/real/marker.txt" {
				t.Errorf("listed %q", a.Path)
			}
		}
		if resp, _ := fc.put("f1", "/workspace/.sandboxd-upload-x", []byte("x")); resp.StatusCode != 400 {
			t.Errorf("reserved name: %d", resp.StatusCode)
		}
	})

	t.Run("swaps during requests never reach the host", func(t *testing.T) {
		// The sandbox swaps a real directory and a symlink to the host dir
		// under the same name as fast as it can while the server reads and
		// writes through it (and puts back what a PUT made in between).
		if resp, b := fc.put("f1", "/workspace/race.py", []byte(raceScript)); resp.StatusCode != 201 {
			t.Fatalf("put script: %d %s", resp.StatusCode, b)
		}
		h.sh("f1", fmt.Sprintf("mkdir -p /workspace/race/d && echo inside > /workspace/race/d/marker.txt && (python3 /workspace/race.py /workspace/race %s >/dev/null 2>&1 &)", hostDir))
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[string]int{}
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 100; i++ {
					resp, b := fc.get("f1", "/workspace/race/d/marker.txt")
					if resp.StatusCode == 200 && string(b) != "inside\n" {
						t.Errorf("got %q", b)
					}
					resp2, _ := fc.put("f1", "/workspace/race/d/put.txt", []byte("put\n"))
					resp3, _ := fc.get("f1", "/workspace/race/d")
					mu.Lock()
					codes[fmt.Sprintf("GET %d", resp.StatusCode)]++
					codes[fmt.Sprintf("PUT %d", resp2.StatusCode)]++
					codes[fmt.Sprintf("LIST %d", resp3.StatusCode)]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		h.exec("f1", map[string]any{"action": "kill"})
		t.Logf("status counts: %v", codes)
		if codes["GET 400"] == 0 || codes["GET 200"] == 0 {
			t.Errorf("the race did not alternate: %v", codes)
		}
	})

	t.Run("huge sparse file bounds the artifact walk", func(t *testing.T) {
		h.sh("f1", "truncate -s 64G /workspace/sparse.bin")
		start := time.Now()
		list, hdr := fc.artifacts("f1")
		if hdr.Get(truncatedHdr) != "bytes" || time.Since(start) > 10*time.Second {
			t.Fatalf("truncated %q after %v", hdr.Get(truncatedHdr), time.Since(start))
		}
		if _, ok := findArtifact(list, "sparse.bin"); ok {
			t.Fatal("sparse.bin listed")
		}
		if _, ok := findArtifact(list, "out/report.txt"); !ok {
			t.Fatal("the other files are not listed")
		}
		if resp, b := fc.del("f1", "/workspace/sparse.bin"); resp.StatusCode != 204 {
			t.Fatalf("delete: %d %s", resp.StatusCode, b)
		}
		if _, hdr := fc.artifacts("f1"); hdr.Get(truncatedHdr) != "" {
			t.Fatalf("still truncated: %q", hdr.Get(truncatedHdr))
		}
	})

	t.Run("names that escape to six times their size bound the answer", func(t *testing.T) {
		// 3000 names of 240 '<' (each "\u003c" in JSON) in a directory named
		// like them: a listing would answer ~13 MB, the artifacts ~9.5 MB.
		dir := "/workspace/wide" + strings.Repeat("<", 200)
		h.sh("f1", `mkdir -p '`+dir+`' && cd '`+dir+`' && python3 -c "
for i in range(3000): open('%04d' % i + '<' * 240, 'w').close()"`)
		resp, b := fc.get("f1", dir)
		if resp.StatusCode != 200 || resp.Header.Get(truncatedHdr) != "size" || len(b) > workspace.MaxListBytes+(1<<20) {
			t.Fatalf("listing: %d, %q, %d bytes", resp.StatusCode, resp.Header.Get(truncatedHdr), len(b))
		}
		list, hdr := fc.artifacts("f1")
		if !strings.Contains(hdr.Get(truncatedHdr), "size") || len(list) == 0 || len(list) >= 3000 {
			t.Fatalf("artifacts: %q, %d entries", hdr.Get(truncatedHdr), len(list))
		}
		if resp, b := fc.del("f1", dir, "recursive=true"); resp.StatusCode != 204 {
			t.Fatalf("delete: %d %s", resp.StatusCode, b)
		}
	})

	t.Run("a slow client holds the session only until the deadline", func(t *testing.T) {
		old := h.s.fileIO.Swap(int64(time.Second))
		defer h.s.fileIO.Store(old)
		h.sh("f1", "truncate -s 1G /workspace/slow.bin")
		// A download whose client never reads, and an upload that stalls.
		for _, req := range []string{
			"GET /v1/sandbox/f1/artifacts/slow.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
			"PUT /v1/sandbox/f1/files?path=/workspace/stalled.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 10000000\r\n\r\npartial",
		} {
			conn, err := net.Dial("tcp", h.ts.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, req, h.token)
			time.Sleep(300 * time.Millisecond)
			start := time.Now()
			resp, b := fc.get("f1", "/workspace/out/report.txt")
			took := time.Since(start)
			conn.Close()
			if resp.StatusCode != 200 || took < 300*time.Millisecond || took > 10*time.Second {
				t.Errorf("%.20s: a reader behind it got %d %q after %v", req, resp.StatusCode, b, took)
			}
		}
		if r := h.sh("f1", "ls -A /workspace | grep -c -e stalled -e sandboxd-upload || true"); strings.TrimSpace(r.Stdout) != "0" {
			t.Errorf("a stalled upload left a file: %q", r.Stdout)
		}
		if resp, b := fc.del("f1", "/workspace/slow.bin"); resp.StatusCode != 204 {
			t.Fatalf("delete: %d %s", resp.StatusCode, b)
		}
	})

	t.Run("delete", func(t *testing.T) {
		h.sh("f1", "mkdir -p /workspace/del/a/b/c /workspace/del/empty && touch /workspace/del/a/b/c/f /workspace/del/a/x /workspace/del/file")
		if resp, b := fc.del("f1", "/workspace/del/file"); resp.StatusCode != 204 {
			t.Fatalf("file: %d %s", resp.StatusCode, b)
		}
		if resp, b := fc.del("f1", "/workspace/del/file"); resp.StatusCode != 404 || errCode(b) != "not_found" {
			t.Fatalf("again: %d %s", resp.StatusCode, b)
		}
		if resp, b := fc.del("f1", "/workspace/del/empty"); resp.StatusCode != 204 {
			t.Fatalf("empty dir: %d %s", resp.StatusCode, b)
		}
		if resp, b := fc.del("f1", "/workspace/del/a"); resp.StatusCode != 409 {
			t.Fatalf("non-empty dir: %d %s", resp.StatusCode, b)
		}
		if resp, b := fc.del("f1", "/workspace/del/a", "recursive=true"); resp.StatusCode != 204 {
			t.Fatalf("tree: %d %s", resp.StatusCode, b)
		}
		if r := h.sh("f1", "ls -A /workspace/del | wc -l"); strings.TrimSpace(r.Stdout) != "0" {
			t.Fatalf("left: %q", r.Stdout)
		}
		if resp, b := fc.del("f1", "/workspace"); resp.StatusCode != 400 {
			t.Fatalf("workspace: %d %s", resp.StatusCode, b)
		}
	})

	t.Run("disk full is 507", func(t *testing.T) {
		h.sh("f1", "dd if=/dev/zero of=/workspace/fill bs=1M count=400 2>/dev/null; true")
		resp, b := fc.put("f1", "/workspace/more.bin", make([]byte, 2<<20))
		if resp.StatusCode != 507 || errCode(b) != "insufficient_storage" {
			t.Fatalf("put on a full disk: %d %s", resp.StatusCode, b)
		}
		img := filepath.Join(cfg.DataDir, "sandboxes", h.s.rt.ContainerID(orgOf(t, h), "f1"), "disk.img")
		allocated := func() int64 {
			unix.Sync()
			var st unix.Stat_t
			if err := unix.Stat(img, &st); err != nil {
				t.Fatal(err)
			}
			return st.Blocks * 512
		}
		full := allocated()
		if resp, b := fc.del("f1", "/workspace/fill"); resp.StatusCode != 204 {
			t.Fatalf("delete fill: %d %s", resp.StatusCode, b)
		}
		// The space comes back to the host too (the disk is mounted with
		// discard, so ext4's freed blocks are punched out of disk.img).
		freed := false
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !freed; time.Sleep(100 * time.Millisecond) {
			freed = allocated() < full-100<<20
		}
		if !freed {
			t.Errorf("disk.img still allocates %d MiB of %d after the delete", allocated()>>20, full>>20)
		}
		if resp, b := fc.put("f1", "/workspace/more.bin", make([]byte, 2<<20)); resp.StatusCode != 201 {
			t.Fatalf("put after freeing: %d %s", resp.StatusCode, b)
		}
		if r := h.sh("f1", "ls -A /workspace | grep -c sandboxd-upload || true"); strings.TrimSpace(r.Stdout) != "0" {
			t.Fatalf("temporary files left: %q", r.Stdout)
		}
	})

	t.Run("roles and other organizations", func(t *testing.T) {
		p, err := h.s.db.Authenticate(context.Background(), h.token)
		if err != nil {
			t.Fatal(err)
		}
		_, _, viewer, err := h.s.db.AddMember(context.Background(), p.Org.ID, "fviewer", store.RoleViewer)
		if err != nil {
			t.Fatal(err)
		}
		if resp, _ := fc.do(viewer, "GET", filesURL("f1", "/workspace/out/report.txt"), nil); resp.StatusCode != 200 {
			t.Errorf("viewer read: %d", resp.StatusCode)
		}
		if resp, _ := fc.do(viewer, "GET", "/v1/sandbox/f1/artifacts", nil); resp.StatusCode != 200 {
			t.Errorf("viewer artifacts: %d", resp.StatusCode)
		}
		if resp, _ := fc.do(viewer, "PUT", filesURL("f1", "/workspace/v.txt"), strings.NewReader("x")); resp.StatusCode != 403 {
			t.Errorf("viewer write: %d", resp.StatusCode)
		}
		if resp, _ := fc.do(viewer, "DELETE", filesURL("f1", "/workspace/out/report.txt"), nil); resp.StatusCode != 403 {
			t.Errorf("viewer delete: %d", resp.StatusCode)
		}
		_, other, err := h.s.db.CreateOrg(context.Background(), "files-other", "owner-o")
		if err != nil {
			t.Fatal(err)
		}
		for _, rq := range [][2]string{
			{"GET", filesURL("%s", "/workspace/out/report.txt")}, {"PUT", filesURL("%s", "/workspace/o.txt")},
			{"DELETE", filesURL("%s", "/workspace/out/report.txt")}, {"GET", "/v1/sandbox/%s/artifacts"},
			{"GET", "/v1/sandbox/%s/artifacts/out/report.txt"},
		} {
			r1, b1 := fc.do(other, rq[0], strings.Replace(rq[1], "%s", "f1", 1), strings.NewReader("x"))
			r2, b2 := fc.do(other, rq[0], strings.Replace(rq[1], "%s", "nosuch", 1), strings.NewReader("x"))
			if r1.StatusCode != 404 || r2.StatusCode != 404 || stripRequestID(b1) != stripRequestID(b2) {
				t.Errorf("%s %s from another org: %d %s / %d %s", rq[0], rq[1], r1.StatusCode, b1, r2.StatusCode, b2)
			}
		}
		if r := h.sh("f1", "cat /workspace/out/report.txt; ls /workspace/o.txt 2>&1 | grep -c 'No such'"); r.Stdout != "line one\nline two\n1\n" {
			t.Errorf("after other org: %q", r.Stdout)
		}
	})

	t.Run("after teardown: read-only from the saved disk", func(t *testing.T) {
		before, _ := fc.artifacts("f1")
		if code, b := h.call(h.token, "POST", "/v1/sandbox/f1/teardown", nil); code != 200 {
			t.Fatalf("teardown: %d %s", code, b)
		}
		if m := mountsUnderSandboxes(cfg); len(m) > 0 {
			t.Fatalf("mounts after teardown: %v", m)
		}
		after, _ := fc.artifacts("f1")
		if len(after) != len(before) {
			t.Fatalf("artifacts %d after teardown, %d before", len(after), len(before))
		}
		for i := range after {
			if after[i].Path != before[i].Path || after[i].SHA256 != before[i].SHA256 || after[i].Size != before[i].Size {
				t.Errorf("artifact changed: %+v -> %+v", before[i], after[i])
			}
		}
		resp, b := fc.do(h.token, "GET", "/v1/sandbox/f1/artifacts/sec/leak.txt", nil)
		if resp.StatusCode != 200 || string(b) != "start [REDACTED:TOKEN] end\n" || resp.Header.Get("Content-Security-Policy") != "sandbox" {
			t.Fatalf("download after teardown: %d %q", resp.StatusCode, b)
		}
		if resp, b := fc.get("f1", "/workspace/out/report.txt"); resp.StatusCode != 200 || string(b) != "line one\nline two\n" {
			t.Fatalf("get after teardown: %d %q", resp.StatusCode, b)
		}
		if resp, b := fc.get("f1", "/workspace/esc/proc"); resp.StatusCode != 400 {
			t.Fatalf("link after teardown: %d %s", resp.StatusCode, b)
		}
		for _, p := range []string{"/workspace/esc/hostfifo", "/workspace/esc/hostsock"} {
			if resp, b := fc.get("f1", p); resp.StatusCode != 400 {
				t.Fatalf("%s after teardown: %d %s", p, resp.StatusCode, b)
			}
		}
		if resp, b := fc.put("f1", "/workspace/new.txt", []byte("x")); resp.StatusCode != 409 || errCode(b) != "conflict" {
			t.Fatalf("put after teardown: %d %s", resp.StatusCode, b)
		}
		if resp, b := fc.del("f1", "/workspace/out/report.txt"); resp.StatusCode != 409 {
			t.Fatalf("delete after teardown: %d %s", resp.StatusCode, b)
		}
		// Concurrent readers take turns on the one read-only mount.
		var wg sync.WaitGroup
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if resp, b := fc.do(h.token, "GET", "/v1/sandbox/f1/artifacts/bin/blob.bin", nil); resp.StatusCode != 200 || len(b) != 1<<20+512 {
					t.Errorf("concurrent download: %d %d", resp.StatusCode, len(b))
				}
			}()
		}
		wg.Wait()
		if m := mountsUnderSandboxes(cfg); len(m) > 0 {
			t.Fatalf("mounts left after reading a stopped session: %v", m)
		}
		// The read-only mount: its options, and a mount left behind (a
		// crash) is what Collect removes at the next start.
		rt := h.s.rt.(*runsc.Runtime)
		cid := rt.ContainerID(orgOf(t, h), "f1")
		dir, release, err := rt.OpenWorkspace(cid, true)
		if err != nil {
			t.Fatal(err)
		}
		ws := dir.Name()
		if _, err := os.Stat(filepath.Join(ws, "out", "report.txt")); err != nil {
			t.Fatal(err)
		}
		opts := ""
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(mi), "\n") {
			if f := strings.Fields(line); len(f) > 5 && f[4] == filepath.Dir(ws) {
				opts = f[5]
			}
		}
		for _, o := range []string{"ro", "nosuid", "nodev", "noexec"} {
			if !contains(strings.Split(opts, ","), o) {
				t.Errorf("read-only mount options %q lack %s", opts, o)
			}
		}
		if got := rt.Collect(context.Background(), map[string]bool{}); len(got) != 1 || got[0] != cid {
			t.Errorf("collected %v", got)
		}
		if m := mountsUnderSandboxes(cfg); len(m) > 0 {
			t.Fatalf("Collect left mounts: %v", m)
		}
		release() // nothing left to release
		if _, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid, "disk.img")); err != nil {
			t.Fatal("Collect removed the disk")
		}
		// The disk was released: the session resumes on it.
		if code, b := h.call(h.token, "POST", "/v1/sandbox/f1/resume", nil); code != 200 {
			t.Fatalf("resume: %d %s", code, b)
		}
		if r := h.sh("f1", "cat /workspace/out/report.txt"); r.Stdout != "line one\nline two\n" {
			t.Fatalf("after resume: %+v", r)
		}
		if code, b := h.call(h.token, "DELETE", "/v1/sandbox/f1", nil); code != 204 {
			t.Fatalf("delete: %d %s", code, b)
		}
		for _, target := range []string{filesURL("f1", "/workspace"), "/v1/sandbox/f1/artifacts", "/v1/sandbox/f1/artifacts/out/report.txt"} {
			if resp, b := fc.do(h.token, "GET", target, nil); resp.StatusCode != 404 {
				t.Errorf("%s after delete: %d %s", target, resp.StatusCode, b)
			}
		}
	})
}

// raceScript swaps d between a real directory and a symlink to argv[2].
const raceScript = `import os, shutil, sys
os.chdir(sys.argv[1])
os.symlink(sys.argv[2], "d.link")
while True:
    try:
        os.rename("d", "d.real")
        os.rename("d.link", "d")
        os.rename("d", "d.link")
        os.rename("d.real", "d")
    except OSError:
        try:
            if os.path.islink("d") and not os.path.lexists("d.link"):
                os.rename("d", "d.link")
            if os.path.lexists("d") and not os.path.islink("d") and os.path.lexists("d.real"):
                shutil.rmtree("d")
            if not os.path.lexists("d") and os.path.lexists("d.real"):
                os.rename("d.real", "d")
        except OSError:
            pass
`

func orgOf(t *testing.T, h *harness) string {
	p, err := h.s.db.Authenticate(context.Background(), h.token)
	if err != nil {
		t.Fatal(err)
	}
	return p.Org.ID
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A failed (dead) session's workspace is readable too.
func TestRealFilesFailedSession(t *testing.T) {
	cfg := realConfig(t)
	h := startServer(t, cfg)
	fc := &fileClient{h: h}
	o := h.provision("ff", "test-tiny")
	h.sh("ff", "echo survived > /workspace/note.txt")
	st, err := h.s.rt.Inspect(context.Background(), h.s.rt.ContainerID(o.OrgID, "ff"))
	if err != nil || st.Pid <= 0 {
		t.Fatalf("inspect: %+v %v", st, err)
	}
	unix.Kill(st.Pid, unix.SIGKILL)
	time.Sleep(300 * time.Millisecond)
	h.call(h.token, "POST", "/v1/sandbox/terminal/ff", map[string]any{"action": "exec", "command": "true"})
	for deadline := time.Now().Add(15 * time.Second); h.get("ff").Status != "failed"; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("status %s", h.get("ff").Status)
		}
	}
	list, _ := fc.artifacts("ff")
	if a, ok := findArtifact(list, "note.txt"); !ok || a.SHA256 != sha([]byte("survived\n")) {
		t.Fatalf("artifacts of a failed session: %+v", list)
	}
	if resp, b := fc.get("ff", "/workspace/note.txt"); resp.StatusCode != 200 || string(b) != "survived\n" {
		t.Fatalf("get: %d %q", resp.StatusCode, b)
	}
	if resp, _ := fc.put("ff", "/workspace/x", []byte("x")); resp.StatusCode != 409 {
		t.Fatalf("put into a failed session: %d", resp.StatusCode)
	}
	if m := mountsUnderSandboxes(cfg); len(m) > 0 {
		t.Fatalf("mounts left: %v", m)
	}
}
