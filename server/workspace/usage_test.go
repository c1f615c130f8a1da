package workspace

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestDiskUsageFollowsNoLink counts a workspace's allocated blocks and no
// host tree a symlink points at.
func TestDiskUsageFollowsNoLink(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755)
	for _, f := range []string{"one", "a/two", "a/b/three"} {
		if err := os.WriteFile(filepath.Join(dir, f), bytes.Repeat([]byte("x"), 64<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("/usr", filepath.Join(dir, "a", "usr"))
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := DiskUsage(f)
	if again := DiskUsage(f); again != n {
		t.Fatalf("DiskUsage twice = %d, then %d", n, again)
	}
	if n < 3*64<<10 || n > 4<<20 {
		t.Fatalf("DiskUsage = %d, want the three files' 192 KiB and their directories", n)
	}
}
