package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Review 4: doctor says "no problems" about a data dir reached through a
// symlink (the data dir itself, or a parent such as /var/lib moved to a
// bigger disk and linked back), yet every provision on it fails: runsc's
// gofer mounts /tmp and /workspace into <data-dir>/sandboxes/<id>/rootfs
// only if the path it opens is the path it was given ("failed to safely
// mount: expected to open /d/sandboxes/<id>/rootfs/tmp, but found
// /real/sandboxes/<id>/rootfs/tmp"), so the API answers 503 "the sandbox
// could not be started" for every sandbox. The server also leaves
// runsc's null-netns mounted when it stops (and gc says "nothing to
// remove"): both look for the mount in mountinfo by the unresolved path.
// Doctor must make this a problem (with its fix: the resolved path), or
// serve must resolve the data dir. Fixed: the configuration resolves the
// data dir's symlinks (config.Load), so the server, doctor and gc all use
// the real path, and doctor shows it.
func TestReview4DoctorSymlinkedDataDir(t *testing.T) {
	bin := doctorBinDir(t)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, c *doctorConf)
	}{
		{"data dir is a symlink", func(t *testing.T, c *doctorConf) {
			real := filepath.Join(filepath.Dir(c.DataDir), "real")
			if err := os.MkdirAll(real, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(real, c.DataDir); err != nil {
				t.Fatal(err)
			}
		}},
		{"a parent of the data dir is a symlink", func(t *testing.T, c *doctorConf) {
			parent := filepath.Dir(c.DataDir)
			real := filepath.Join(parent, "r")
			if err := os.MkdirAll(real, 0o700); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(parent, "l")
			if err := os.Symlink(real, link); err != nil {
				t.Fatal(err)
			}
			c.DataDir = filepath.Join(link, "d") // made by the server at its first start
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConf(t, bin)
			tc.plant(t, &c)
			d := runDoctor(t, bin, "--config", c.write(t))
			f, _ := d.report.find("data dir")
			real, err := filepath.EvalSymlinks(c.DataDir)
			if err != nil {
				real, _ = filepath.EvalSymlinks(filepath.Dir(c.DataDir))
				real = filepath.Join(real, filepath.Base(c.DataDir))
			}
			if real == c.DataDir || !strings.Contains(f.Seen, real) || f.Status != "ok" {
				t.Fatalf("doctor exit %d, data dir: %+v; want the resolved path %s:\n%s", d.code, f, real, d.text)
			}
		})
	}
}
