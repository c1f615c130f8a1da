package runsc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sandboxd/runsc/archive"
)

// Saving a sandbox's disk to storage and getting it back. The driver packs
// and unpacks; where the bytes go (the organization's storage) is the
// caller's. Files in the sandbox dir:
//
//	disk.img          the disk (kept by Destroy with KeepDisk: a cache)
//	disk.saved        the SHA-256 of the save the disk is exactly a copy of;
//	                  absent: the disk ran since (newer than any save)
//	disk.restore.img  a restore in progress (removed by Destroy)
//	restore/          its mount point (unmounted by Destroy)

const (
	markerName     = "disk.saved"
	restoreImgName = "disk.restore.img"
	restoreMnt     = "restore"
)

// savedTop are the disk's entries a save holds: the root filesystem's
// writable layer, /workspace and /tmp (not overlayfs's work dir, nor
// lost+found).
var savedTop = []string{"upper", "workspace", "tmp"}

// restoreOptions: whiteouts and trusted.overlay.* only in the upper layer.
var restoreOptions = archive.Options{
	Overlay: func(n string) bool { return n == "upper" || strings.HasPrefix(n, "upper/") },
	Fifos:   true,
}

// Freeze stops every task of a running sandbox (runsc pause), so its disk
// does not change while it is saved; Thaw lets it run on.
func (r *Runtime) Freeze(ctx context.Context, id string) error {
	if !r.Owns(id) {
		return fmt.Errorf("container id %q not made by this runtime", id)
	}
	_, err := r.run(ctx, "pause", id)
	return err
}

// Thaw undoes Freeze.
func (r *Runtime) Thaw(ctx context.Context, id string) error {
	if !r.Owns(id) {
		return fmt.Errorf("container id %q not made by this runtime", id)
	}
	_, err := r.run(ctx, "resume", id)
	return err
}

// SaveDisk packs a sandbox's disk (see savedTop) into w: from its mount
// while the sandbox exists (the caller has frozen it), else from disk.img
// mounted read-only for the call. ErrNoDisk: there is none. The caller
// holds the session's lock.
func (r *Runtime) SaveDisk(ctx context.Context, id string, w io.Writer) (archive.Stats, error) {
	if !r.Owns(id) {
		return archive.Stats{}, fmt.Errorf("container id %q not made by this runtime", id)
	}
	release, err := r.mountWorkspaceReadOnly(id)
	if err != nil {
		return archive.Stats{}, err
	}
	st, err := archive.Pack(ctx, filepath.Join(r.dir(id), "disk"), savedTop, w)
	if rerr := release(); rerr != nil && err == nil {
		err = rerr
	}
	return st, err
}

// DiskCache reports whether the sandbox has a local disk and, if that disk
// is an unchanged copy of a save, that save's SHA-256 ("": it ran since).
func (r *Runtime) DiskCache(id string) (present bool, savedSHA256 string) {
	d := r.dir(id)
	if st, err := os.Lstat(filepath.Join(d, "disk.img")); err != nil || !st.Mode().IsRegular() {
		return false, ""
	}
	b, err := os.ReadFile(filepath.Join(d, markerName))
	if err != nil {
		return true, ""
	}
	return true, strings.TrimSpace(string(b))
}

// MarkSaved records that the (stopped) sandbox's disk is an exact copy of
// the save with this SHA-256.
func (r *Runtime) MarkSaved(id, sha256 string) error {
	if !r.Owns(id) {
		return fmt.Errorf("container id %q not made by this runtime", id)
	}
	return writeFileSync(r.dir(id), markerName, []byte(sha256+"\n"))
}

// unmarkSaved removes the marker before a disk is mounted read-write.
func (r *Runtime) unmarkSaved(id string) error {
	err := os.Remove(filepath.Join(r.dir(id), markerName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return syncDir(r.dir(id))
}

// DropDisk removes a stopped sandbox's local disk (its cache of a save);
// the next resume restores it from storage.
func (r *Runtime) DropDisk(id string) error {
	if !r.Owns(id) {
		return fmt.Errorf("container id %q not made by this runtime", id)
	}
	return r.Destroy(context.Background(), id, DestroyOpts{})
}

// RestoreDisk makes the sandbox's disk anew from a save: a fresh image of
// diskMiB, mounted at restore/, src unpacked into it (safely: see
// archive.Unpack; src's own error, a checksum mismatch, fails it), synced,
// then renamed over disk.img and marked as a copy of the save sha256. Until
// that rename the old disk.img, if any, is untouched; a crash leaves a
// disk.restore.img that Destroy removes.
func (r *Runtime) RestoreDisk(ctx context.Context, id string, diskMiB int64, src io.Reader, sha256 string) (_ archive.Stats, err error) {
	if !r.Owns(id) {
		return archive.Stats{}, fmt.Errorf("container id %q not made by this runtime", id)
	}
	d := r.dir(id)
	if isMountPoint(filepath.Join(d, "disk")) {
		return archive.Stats{}, errors.New("restore: the sandbox's disk is in use")
	}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return archive.Stats{}, err
	}
	img, mnt := filepath.Join(d, restoreImgName), filepath.Join(d, restoreMnt)
	if err := unmount(mnt); err != nil {
		return archive.Stats{}, err
	}
	os.Remove(img)
	defer func() {
		if err != nil {
			unmount(mnt)
			os.Remove(mnt)
			os.Remove(img)
		}
	}()
	if err := makeDisk(img, diskMiB); err != nil {
		return archive.Stats{}, err
	}
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return archive.Stats{}, err
	}
	if out, err := exec.Command("mount", "-t", "ext4", "-o", loopOption()+",nosuid,nodev,noexec", img, mnt).CombinedOutput(); err != nil {
		return archive.Stats{}, loopMountError("mount restore disk", err, out)
	}
	st, err := archive.Unpack(ctx, src, mnt, restoreOptions)
	if err != nil {
		return st, fmt.Errorf("restore: %w", err)
	}
	if err := unmount(mnt); err != nil {
		return st, err
	}
	os.Remove(mnt)
	f, err := os.Open(img)
	if err != nil {
		return st, err
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return st, fmt.Errorf("restore: sync: %w", err)
	}
	if err := r.unmarkSaved(id); err != nil {
		return st, err
	}
	if err := os.Rename(img, filepath.Join(d, "disk.img")); err != nil {
		return st, err
	}
	if err := syncDir(d); err != nil {
		return st, err
	}
	return st, r.MarkSaved(id, sha256)
}

func writeFileSync(dir, name string, b []byte) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

func syncDir(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
