package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/server/config"
)

// Review 3: doctor says "no problems" about a data dir the server cannot
// start on. `sandboxd serve` then fails at once with "file is not a
// database" or "secrets.key is not a 32-byte key" (the latter after
// creating the first organization and printing its owner token). Doctor
// looks at the data dir ("with a database") but not at what is in it: a
// database that does not open, or a secrets key of the wrong size, must be
// a problem with a fix (a world-writable data dir at least a warning).
func TestReview3DoctorBrokenDataDir(t *testing.T) {
	bin := doctorBinDir(t)
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dataDir string)
		want  string // in the problem's text
	}{
		{"database not a database", func(t *testing.T, dataDir string) {
			if err := os.WriteFile(config.DBPath(dataDir), []byte(strings.Repeat("not sqlite\n", 400)), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "database"},
		{"secrets key of 5 bytes", func(t *testing.T, dataDir string) {
			if err := os.WriteFile(filepath.Join(dataDir, "secrets.key"), []byte("short"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "secrets.key"},
		// World-writable: any local user can rename the server's 0700
		// subdirectories away and put their own in place (sandbox bundles,
		// agent sockets, storage), or delete secrets.key; the server keeps
		// it 0777. A warning at least.
		{"data dir world-writable", func(t *testing.T, dataDir string) {
			if err := os.Chmod(dataDir, 0o777); err != nil {
				t.Fatal(err)
			}
		}, "777"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConf(t, bin)
			if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, c.DataDir)
			d := runDoctor(t, bin, "--config", c.write(t))
			flagged := d.report.Problems > 0 || d.report.Warnings > 0
			if !flagged || !strings.Contains(d.text, tc.want) {
				t.Fatalf("doctor exit %d, %d problems, %d warnings, nothing about %q (%s):\n%s", d.code, d.report.Problems, d.report.Warnings, tc.want, tc.name, d.text)
			}
		})
	}
}

// A secrets key others can read is a problem with its fix.
func TestDoctorSecretsKeyMode(t *testing.T) {
	bin := doctorBinDir(t)
	c := baseConf(t, bin)
	if err := os.MkdirAll(c.DataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.DataDir, "secrets.key"), make([]byte, 32), 0o644); err != nil {
		t.Fatal(err)
	}
	d := runDoctor(t, bin, "--config", c.write(t))
	if d.code != 1 || !strings.Contains(d.text, "readable by other users") || !strings.Contains(d.text, "chmod 600") {
		t.Fatalf("doctor with a 0644 secrets.key: exit %d\n%s", d.code, d.text)
	}
}
