package workspace

import (
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"sandboxd/streams/scrub"

	"golang.org/x/sys/unix"
)

// FuzzWorkspacePath: a client's path (as sent, or percent-encoded in a
// query) that Rel accepts is /workspace or a normalized path below it, and
// the operation on it (Open, Put or Remove, picked by op) in a workspace
// whose symlinks point up, to an absolute path and at a file outside never
// reaches outside: nothing there changes, an opened file is one of the
// workspace's own, and an uploaded file lies below /workspace through
// directories only.
func FuzzWorkspacePath(f *testing.F) {
	for _, p := range []string{
		"/workspace/d/f", "/workspace/up/outside/secret", "/workspace/abs/secret", "/workspace/esc",
		"/workspace/d/back/secret", "/workspace/%2e%2e/outside", "/workspace/../outside/secret", "/workspace/d/",
		"/workspace", "/workspace/up", "/workspace/new/dir/file", "/workspace/d/sub/../../up", "/workspace//d",
		"/workspace/d/./f", "/workspace/d/f/", "/workspace/.sandboxd-upload-x", "/workspacex/f", "/workspace/d\x00/f",
		"/workspace/%2F..%2Foutside", "%2Fworkspace%2Fd%2Ff",
	} {
		for op := range byte(3) {
			f.Add(op, p, strings.Contains(p, "%"))
		}
	}
	set, err := scrub.NewSet(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, op byte, p string, encoded bool) {
		if encoded {
			var err error
			if p, err = url.QueryUnescape(p); err != nil {
				return
			}
		}
		rel, err := Rel(p)
		if err != nil {
			return
		}
		// The oracle: what the contract says a workspace path is.
		want := strings.TrimSuffix(p, "/")
		if rel != "" {
			if want != "/workspace/"+rel {
				t.Fatalf("Rel(%q) = %q", p, rel)
			}
			for _, c := range strings.Split(rel, "/") {
				if c == "" || c == "." || c == ".." || len(c) > 255 || strings.IndexByte(c, 0) >= 0 {
					t.Fatalf("Rel(%q) = %q: component %q", p, rel, c)
				}
			}
		} else if want != "/workspace" {
			t.Fatalf("Rel(%q) = the workspace", p)
		}
		if len(p) > 4096 {
			t.Fatalf("Rel accepted %d bytes", len(p))
		}

		base := t.TempDir()
		ws, outside := filepath.Join(base, "ws"), filepath.Join(base, "outside")
		for _, d := range []string{outside, filepath.Join(ws, "d", "sub")} {
			must(t, os.MkdirAll(d, 0o755))
		}
		must(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("keep"), 0o644))
		must(t, os.WriteFile(filepath.Join(ws, "d", "f"), []byte("in"), 0o644))
		for name, target := range map[string]string{"up": "..", "abs": outside, "esc": "../outside/secret", "d/back": "../../outside"} {
			must(t, os.Symlink(target, filepath.Join(ws, name)))
		}
		inodes := map[uint64]bool{}
		filepath.Walk(ws, func(_ string, fi os.FileInfo, err error) error {
			if err == nil {
				inodes[fi.Sys().(*syscall.Stat_t).Ino] = true
			}
			return nil
		})
		wsf, err := os.Open(ws)
		must(t, err)
		defer wsf.Close()
		d := New(os.Getuid(), os.Getgid()).Dir(wsf, "pk", set)

		switch op % 3 {
		case 0:
			if f, _, err := d.Open(rel); err == nil {
				var st unix.Stat_t
				must(t, unix.Fstat(int(f.Fd()), &st))
				f.Close()
				if !inodes[st.Ino] {
					t.Fatalf("Open(%q) opened something outside the workspace", rel)
				}
			}
		case 1:
			if _, _, _, err := d.Put(rel, strings.NewReader("new")); err == nil {
				at := ws
				for _, c := range strings.Split(rel, "/") {
					fi, err := os.Lstat(at)
					if err != nil || !fi.IsDir() {
						t.Fatalf("Put(%q) went through %s, not a directory: %v", rel, at, err)
					}
					at = filepath.Join(at, c)
				}
				if b, err := os.ReadFile(at); err != nil || string(b) != "new" {
					t.Fatalf("Put(%q) left %q, %v", rel, b, err)
				}
			}
		case 2:
			d.Remove(rel, true, false, time.Now().Add(time.Second))
		}
		top, _ := os.ReadDir(base)
		names := []string{}
		for _, e := range top {
			names = append(names, e.Name())
		}
		out, _ := os.ReadDir(outside)
		b, _ := os.ReadFile(filepath.Join(outside, "secret"))
		if !slices.Equal(names, []string{"outside", "ws"}) || len(out) != 1 || string(b) != "keep" {
			t.Fatalf("op %d on %q changed what is outside the workspace: %v, %d entries, %q", op%3, rel, names, len(out), b)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
