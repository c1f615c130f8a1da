// Package image builds the default sandbox root filesystem (Debian, via
// debootstrap) once into a cache directory, keyed by a hash of its recipe,
// and shares it read-only with every sandbox.
//
// A build happens in a temporary directory next to its final place and is
// renamed into place only when complete, under an exclusive lock, so that
// concurrent servers never see a partial image and never build twice.
package image

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Recipe is everything an image is built from; all of it is in the key.
type Recipe struct {
	Suite  string
	Mirror string
	// NPMRegistry is the npm registry the build installs npm packages
	// (code-server and its Node runtime) from.
	NPMRegistry string
	Packages    []string
	Build       []byte // build.sh
	Setup       []byte // setup.sh, run inside the new root filesystem
	// Files are the recipe's other files (editor.sh, service launchers) by
	// path relative to the recipe; build.sh finds them under $RECIPE.
	Files map[string][]byte
}

// ParsePackages reads a package list: one name per line, # comments.
func ParsePackages(text string) []string {
	var pkgs []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line != "" {
			pkgs = append(pkgs, line)
		}
	}
	return pkgs
}

// Key is a short hash of the recipe; a changed recipe is a new image.
func (r Recipe) Key() string {
	h := sha256.New()
	fmt.Fprintf(h, "suite=%s\nmirror=%s\nnpmRegistry=%s\npackages=%s\n", r.Suite, r.Mirror, r.NPMRegistry, strings.Join(r.Packages, " "))
	h.Write([]byte("build.sh\n"))
	h.Write(r.Build)
	h.Write([]byte("setup.sh\n"))
	h.Write(r.Setup)
	names := make([]string, 0, len(r.Files))
	for name := range r.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		// The length keeps a file's end from reading as the next one's start.
		fmt.Fprintf(h, "file %q %d\n", name, len(r.Files[name]))
		h.Write(r.Files[name])
	}
	return "debian-" + r.Suite + "-" + hex.EncodeToString(h.Sum(nil))[:16]
}

// Path is where the recipe's root filesystem lives once built.
func Path(cacheDir string, r Recipe) string { return filepath.Join(cacheDir, r.Key(), "rootfs") }

// Find returns where the recipe's root filesystem is and whether it is
// built (complete), changing nothing: what Ensure with build=false would
// find, for checks that must not touch the cache.
func Find(cacheDir string, r Recipe) (rootfs string, built bool) {
	return Path(cacheDir, r), complete(filepath.Join(cacheDir, r.Key()))
}

// Building reports whether a build (Ensure, in any process) holds the
// cache's lock right now.
func Building(cacheDir string) bool {
	lock, err := os.Open(filepath.Join(cacheDir, ".lock"))
	if err != nil {
		return false
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	return false
}

// Builder is the host command a build needs besides bash (its Debian
// package has the same name).
const Builder = "debootstrap"

// ErrMissing is returned by Ensure with build=false when the image is not built.
var ErrMissing = errors.New("image not built")

// Ensure returns the root filesystem of the recipe, building it first if it
// is missing and build is true. Build output goes to progress.
func Ensure(ctx context.Context, cacheDir string, r Recipe, build bool, progress io.Writer) (string, error) {
	final := filepath.Join(cacheDir, r.Key())
	rootfs := filepath.Join(final, "rootfs")
	if complete(final) {
		return rootfs, lockDown(cacheDir, final)
	}
	if !build {
		return "", ErrMissing
	}
	if os.Geteuid() != 0 {
		return "", errors.New("building the image needs root")
	}
	if _, err := exec.LookPath(Builder); err != nil {
		return "", errors.New("building the image needs " + Builder + " (apt-get install -y " + Builder + ")")
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(cacheDir, 0o700); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(cacheDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock image cache: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if complete(final) { // built by someone else while we waited
		return rootfs, lockDown(cacheDir, final)
	}
	tmp, err := os.MkdirTemp(cacheDir, ".build-"+r.Key()+"-")
	if err != nil {
		return "", err
	}
	defer removeBuildDir(tmp)
	if err := os.Chmod(tmp, 0o700); err != nil {
		return "", err
	}
	script := filepath.Join(tmp, "build.sh")
	setup := filepath.Join(tmp, "setup.sh")
	files := filepath.Join(tmp, "recipe")
	if err := os.WriteFile(script, r.Build, 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(setup, r.Setup, 0o700); err != nil {
		return "", err
	}
	if err := writeFiles(files, r.Files); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "/bin/bash", script)
	// On cancel, SIGTERM lets the script's trap unmount what it mounted.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Env = append(os.Environ(),
		"ROOTFS="+filepath.Join(tmp, "rootfs"), "MIRROR="+r.Mirror, "SUITE="+r.Suite,
		"PACKAGES="+strings.Join(r.Packages, " "), "SETUP="+setup,
		"RECIPE="+files, "NPM_REGISTRY="+r.NPMRegistry)
	if progress == nil {
		progress = io.Discard
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	go prefixLines(pr, progress)
	err = cmd.Run()
	pw.Close()
	if err != nil {
		return "", fmt.Errorf("build image %s: %w", r.Key(), err)
	}
	os.Remove(script)
	os.Remove(setup)
	os.RemoveAll(files)
	if err := os.WriteFile(filepath.Join(tmp, "COMPLETE"), []byte(r.Key()+"\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("install image: %w", err)
	}
	return rootfs, lockDown(cacheDir, final)
}

// writeFiles writes a recipe's files under dir, refusing a name that would
// land outside it.
func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, b := range files {
		if !filepath.IsLocal(name) {
			return fmt.Errorf("recipe file %q: not a relative path inside the recipe", name)
		}
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// lockDown makes the cache and the image reachable by root only. Files in
// the image belong to the image's users (uid 1000 is the sandbox user), and
// a host account with the same uid must not be able to reach, let alone
// change, what every sandbox runs.
func lockDown(dirs ...string) error {
	for _, d := range dirs {
		if err := os.Chmod(d, 0o700); err != nil {
			return fmt.Errorf("image permissions: %w", err)
		}
	}
	return nil
}

func complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "COMPLETE"))
	return err == nil
}

// removeBuildDir deletes a build directory, first detaching any mount the
// build left inside it (proc, a bind of /dev): deleting through a bind mount
// of /dev would delete the host's device nodes.
func removeBuildDir(dir string) error {
	for i := 0; i < 3; i++ {
		mounts := mountsUnder(dir)
		if len(mounts) == 0 {
			return os.RemoveAll(dir)
		}
		for j := len(mounts) - 1; j >= 0; j-- {
			syscall.Unmount(mounts[j], syscall.MNT_DETACH)
		}
	}
	return fmt.Errorf("build dir %s still has mounts; not removed", dir)
}

func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{dir + "/?"} // unknown: be safe
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// prefixLines copies build output line by line so that a long build shows
// its progress as it goes.
func prefixLines(r io.Reader, w io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fmt.Fprintf(w, "image: %s\n", sc.Text())
	}
	io.Copy(io.Discard, r)
}
