package runsc

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// DiskUse sees what is written into a mounted disk at once (pending, in
// the page cache) and on the host once it is written back; a disk that is
// not mounted is its image's blocks.
func TestRealDiskUse(t *testing.T) {
	r, img := realRuntime(t)
	id := r.ContainerID("org", "diskuse")
	if u := r.DiskUse(id); u != (DiskUse{}) {
		t.Fatalf("no disk: %+v", u)
	}
	if err := os.MkdirAll(r.dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := r.mountDisk(id, img, 256); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.unmountDisk(id); err != nil {
			t.Error(err)
		}
		os.RemoveAll(r.dir(id))
	})
	u0 := r.DiskUse(id)
	if u0.Host <= 0 || u0.Host > 32<<20 {
		t.Fatalf("fresh disk: %+v", u0)
	}
	const n = 64 << 20
	if err := os.WriteFile(filepath.Join(r.dir(id), "disk", "workspace", "f"), bytes.Repeat([]byte{1}, n), 0o600); err != nil {
		t.Fatal(err)
	}
	u1 := r.DiskUse(id)
	t.Logf("fresh %+v, written %+v", u0, u1)
	if u1.Host+u1.Pending < u0.Host+n {
		t.Fatalf("64 MiB written, not seen: %+v then %+v", u0, u1)
	}
	f, err := os.Open(filepath.Join(r.dir(id), "disk"))
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Syncfs(int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	u2 := r.DiskUse(id)
	t.Logf("synced %+v", u2)
	if u2.Pending != 0 || u2.Host < u0.Host+n {
		t.Fatalf("after a sync: %+v", u2)
	}
	if err := r.unmountDisk(id); err != nil {
		t.Fatal(err)
	}
	if u3 := r.DiskUse(id); u3.Pending != 0 || u3.Host != u2.Host {
		t.Fatalf("unmounted: %+v, mounted %+v", u3, u2)
	}
}
