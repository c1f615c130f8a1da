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
// a problem with a fix.
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConf(t, bin)
			if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, c.DataDir)
			d := runDoctor(t, bin, "--config", c.write(t))
			if d.code != 1 || !strings.Contains(d.text, "PROBLEM") || !strings.Contains(d.text, tc.want) {
				t.Fatalf("doctor exit %d on a data dir the server cannot start on (%s):\n%s", d.code, tc.name, d.text)
			}
		})
	}
}
