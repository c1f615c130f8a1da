package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// make install's files, staged in a DESTDIR: the binaries in place and
// runnable through the PATH link, the sample config accepted by the strict
// loader, the unit valid for systemd, an operator's edited config kept.
func TestInstallFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make (not in -short)")
	}
	bin := os.Getenv("SANDBOXD_BIN")
	if bin == "" {
		bin, _ = filepath.Abs("../../bin")
	}
	if _, err := os.Stat(filepath.Join(bin, "runsc")); err != nil {
		t.Skipf("no build in %s: run `make build`", bin)
	}
	dest := t.TempDir()
	install := func() string {
		t.Helper()
		out, err := exec.Command("make", "-s", "-C", "../..", "install-files", "DESTDIR="+dest, "BIN="+bin).CombinedOutput()
		if err != nil {
			t.Fatalf("make install-files: %v\n%s", err, out)
		}
		return string(out)
	}
	install()
	lib := filepath.Join(dest, "usr/local/lib/sandboxd")
	for _, f := range []string{lib + "/sandboxd", lib + "/runsc", lib + "/sandboxd-agent", dest + "/usr/local/bin/sbx"} {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o755 {
			t.Fatalf("%s: %v %v", f, st, err)
		}
	}
	cfg := filepath.Join(dest, "etc/sandboxd/sandboxd.yaml")
	out, err := exec.Command(filepath.Join(dest, "usr/local/bin/sandboxd"), "plan", "list", "--config", cfg).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "free (default)") {
		t.Fatalf("sandboxd through its PATH link, with the sample config: %v\n%s", err, out)
	}
	unit, err := os.ReadFile(filepath.Join(dest, "etc/systemd/system/sandboxd.service"))
	if err != nil || !strings.Contains(string(unit), "ExecStart=/usr/local/lib/sandboxd/sandboxd serve --config /etc/sandboxd/sandboxd.yaml") ||
		!strings.Contains(string(unit), "KillMode=process") || !strings.Contains(string(unit), "Delegate=yes") {
		t.Fatalf("unit: %v\n%s", err, unit)
	}
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		// Verify a copy that points at the staged binary (the real path
		// does not exist on a test machine).
		staged := filepath.Join(t.TempDir(), "sandboxd.service")
		os.WriteFile(staged, []byte(strings.ReplaceAll(string(unit), "/usr/local/lib/sandboxd/", lib+"/")), 0o644)
		if out, err := exec.Command("systemd-analyze", "verify", staged).CombinedOutput(); err != nil {
			t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
		}
	}
	os.WriteFile(cfg, []byte("listen: 127.0.0.1:9999\n"), 0o644)
	if out := install(); !strings.Contains(out, "kept") {
		t.Fatalf("second install: %s", out)
	}
	if b, _ := os.ReadFile(cfg); string(b) != "listen: 127.0.0.1:9999\n" {
		t.Fatalf("install replaced an edited config: %q", b)
	}
}
