package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
)

func TestParsePackages(t *testing.T) {
	got := ParsePackages("# comment\nbash\n\n  python3  # trailing\ncurl\n")
	if want := []string{"bash", "python3", "curl"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
}

func TestKeyCoversRecipe(t *testing.T) {
	files := func(kv ...string) map[string][]byte {
		m := map[string][]byte{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = []byte(kv[i+1])
		}
		return m
	}
	base := Recipe{Suite: "bookworm", Mirror: "http://m/debian", NPMRegistry: "https://r/",
		Packages: []string{"a", "b"}, Build: []byte("b"), Setup: []byte("s"),
		Files: files("editor.sh", "e", "services/x", "x")}
	k := base.Key()
	for i := 0; i < 20; i++ { // map order must not matter
		if k != base.Key() {
			t.Fatal("key not deterministic")
		}
	}
	variants := []Recipe{base, base, base, base, base, base, base, base, base, base}
	variants[0].Packages = []string{"a", "c"}
	variants[1].Build = []byte("b2")
	variants[2].Setup = []byte("s2")
	variants[3].Mirror = "http://other/debian"
	variants[4].Suite = "trixie"
	variants[5].NPMRegistry = "https://other/"
	variants[6].Files = files("editor.sh", "e2", "services/x", "x")
	variants[7].Files = files("editor.sh", "e", "services/y", "x")
	variants[8].Files = files("editor.sh", "e", "services/x", "x", "more", "")
	// Content moved from one file to the next is a different recipe.
	variants[9].Files = files("editor.sh", "es", "services/x", "")
	seen := map[string]bool{k: true}
	for i, v := range variants {
		if seen[v.Key()] {
			t.Fatalf("variant %d has a key already seen", i)
		}
		seen[v.Key()] = true
	}
}

func TestWriteFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "recipe")
	if err := writeFiles(dir, map[string][]byte{"editor.sh": []byte("e"), "services/a": []byte("a")}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "services", "a")); err != nil || string(b) != "a" {
		t.Fatalf("services/a: %q %v", b, err)
	}
	for _, bad := range []string{"../x", "/etc/x", "a/../../x", ""} {
		if err := writeFiles(dir, map[string][]byte{bad: nil}); err == nil {
			t.Errorf("%q: written outside the recipe", bad)
		}
	}
}

// Ensure finds a complete image without building, and never treats a
// directory without COMPLETE (an interrupted build) as an image.
func TestEnsureUsesCache(t *testing.T) {
	cache := t.TempDir()
	r := Recipe{Suite: "bookworm", Mirror: "http://m/debian", Packages: []string{"a"}, Build: []byte("exit 1"), Setup: []byte("")}
	if _, err := Ensure(context.Background(), cache, r, false, nil); !errors.Is(err, ErrMissing) {
		t.Fatalf("missing image: %v", err)
	}
	dir := filepath.Join(cache, r.Key())
	os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755)
	if _, err := Ensure(context.Background(), cache, r, false, nil); !errors.Is(err, ErrMissing) {
		t.Fatalf("incomplete image accepted: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "COMPLETE"), []byte(r.Key()), 0o644)
	// build=true must not run the (failing) build script when complete.
	p, err := Ensure(context.Background(), cache, r, true, nil)
	if err != nil || p != filepath.Join(dir, "rootfs") {
		t.Fatalf("cached image: %q %v", p, err)
	}
}

func TestRemoveBuildDirRefusesMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	dir := t.TempDir()
	inner := filepath.Join(dir, "rootfs", "proc")
	os.MkdirAll(inner, 0o755)
	if err := syscall.Mount("proc", inner, "proc", 0, ""); err != nil {
		t.Skip("cannot mount proc here:", err)
	}
	if err := removeBuildDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("build dir not removed")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Fatal("host /proc damaged")
	}
}

// Find and Building answer without changing the cache (doctor's use).
func TestFindAndBuilding(t *testing.T) {
	dir := t.TempDir()
	r := Recipe{Suite: "bookworm"}
	if p, built := Find(dir, r); built || p != Path(dir, r) {
		t.Fatalf("empty cache: %s %v", p, built)
	}
	if Building(dir) {
		t.Fatal("building without a lock file")
	}
	os.MkdirAll(Path(dir, r), 0o755)
	if _, built := Find(dir, r); built {
		t.Fatal("built without COMPLETE")
	}
	os.WriteFile(filepath.Join(dir, r.Key(), "COMPLETE"), []byte(r.Key()+"\n"), 0o644)
	if p, built := Find(dir, r); !built || p != Path(dir, r) {
		t.Fatalf("complete image: %s %v", p, built)
	}
	st, _ := os.Stat(dir)
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if Building(dir) {
		t.Fatal("building with an unlocked lock file")
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if !Building(dir) {
		t.Fatal("not building while the lock is held")
	}
	syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if Building(dir) {
		t.Fatal("building after the lock was released")
	}
	if st2, _ := os.Stat(dir); st2.Mode() != st.Mode() {
		t.Errorf("cache dir mode changed: %v -> %v", st.Mode(), st2.Mode())
	}
}
