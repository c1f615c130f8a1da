package runsc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A sandbox's disk is a sparse ext4 image (disk.img, DiskMiB large) mounted
// at disk/. It holds the writable layer of the root filesystem (upper/,
// work/), /tmp and /workspace, so writing past its size fails with ENOSPC
// inside the sandbox and the host is unaffected. The root filesystem the
// sandbox sees is a host overlay (rootfs/) of the shared read-only image and
// disk/upper; runsc runs with --overlay2=none so every write reaches the disk.
// Teardown keeps disk.img: the whole writable state survives.

func (r *Runtime) paths(id string) sandboxPaths {
	d := r.dir(id)
	return sandboxPaths{
		Rootfs:    filepath.Join(d, "rootfs"),
		Workspace: filepath.Join(d, "disk", "workspace"),
		Tmp:       filepath.Join(d, "disk", "tmp"),
		Agent:     r.cfg.Agent,
		Trust:     r.cfg.TrustBundle,
		Run:       filepath.Join(d, "run"),
		Netns:     netnsPath(id),
	}
}

// mountDisk creates the disk image if it does not exist yet, mounts it and
// the root overlay. It returns whether the image was new.
func (r *Runtime) mountDisk(id, image string, diskMiB int64) (created bool, err error) {
	d := r.dir(id)
	img := filepath.Join(d, "disk.img")
	if strings.ContainsAny(image, ",:") {
		return false, fmt.Errorf("image path %q not usable as overlay lower dir", image)
	}
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if err := makeDisk(img, diskMiB); err != nil {
			os.Remove(img)
			return false, err
		}
		created = true
	} else if err := repairDisk(img); err != nil {
		return false, err
	}
	mnt := filepath.Join(d, "disk")
	rootfs := filepath.Join(d, "rootfs")
	for _, p := range []string{mnt, rootfs} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return created, err
		}
	}
	// mount(8) sets up the loop device with autoclear, so unmounting frees it.
	// discard: blocks the sandbox frees are punched out of the sparse
	// disk.img, so deleting a file gives its space back to the host too.
	// noatime: reading writes nothing, so a sandbox that only reads is not
	// hurt when the host's disk is full (an access time update that
	// cannot be written aborts the disk's journal: it turns read-only).
	if out, err := exec.Command("mount", "-t", "ext4", "-o", loopOption()+",nosuid,nodev,discard,noatime", img, mnt).CombinedOutput(); err != nil {
		return created, loopMountError("mount disk", err, out)
	}
	ok := false
	defer func() {
		if !ok {
			unmount(rootfs)
			unmount(mnt)
		}
	}()
	for _, dir := range []struct {
		name string
		mode os.FileMode
		uid  int
	}{{"upper", 0o755, 0}, {"work", 0o700, 0}, {"tmp", 0o1777, 0}, {"workspace", 0o755, UserUID}} {
		p := filepath.Join(mnt, dir.name)
		if err := os.Mkdir(p, dir.mode); err != nil {
			if errors.Is(err, fs.ErrExist) {
				continue
			}
			return created, fmt.Errorf("disk layout: %w", err)
		}
		if err := os.Chmod(p, dir.mode); err != nil {
			return created, err
		}
		if err := os.Chown(p, dir.uid, dir.uid); err != nil {
			return created, err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", image, filepath.Join(mnt, "upper"), filepath.Join(mnt, "work"))
	if err := unix.Mount("overlay", rootfs, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return created, fmt.Errorf("mount root overlay: %w", err)
	}
	ok = true
	return created, nil
}

func makeDisk(img string, diskMiB int64) error {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create disk: %w", err)
	}
	err = f.Truncate(diskMiB << 20)
	f.Close()
	if err != nil {
		return fmt.Errorf("size disk: %w", err)
	}
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", img).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No space left on device") {
			err = syscall.ENOSPC // the host's disk is full
		}
		return fmt.Errorf("mkfs disk: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// repairDisk checks an existing disk image before it is mounted
// read-write. A disk unmounted cleanly is not touched (its superblock says
// so); one whose journal aborted (a write to it failed: the host's disk
// was full), that recorded errors, or that a host crash left unclean is
// replayed and repaired by e2fsck -p, as far as is safe without
// questions; what e2fsck cannot repair alone fails the start.
func repairDisk(img string) error {
	if clean, err := diskClean(img); err != nil || clean {
		return err
	}
	out, err := exec.Command("e2fsck", "-p", img).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() < 4 { // 1, 2: errors corrected
		return nil
	}
	if err != nil {
		return fmt.Errorf("check disk: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// diskClean reads an ext4 image's superblock (1024 bytes at 1024): clean
// is its state valid without errors, no journal to recover and no error
// recorded. Anything else, or not ext4, is for e2fsck to judge.
func diskClean(img string) (bool, error) {
	f, err := os.Open(img)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return false, nil
	}
	le16 := func(o int) uint16 { return uint16(sb[o]) | uint16(sb[o+1])<<8 }
	le32 := func(o int) uint32 { return uint32(le16(o)) | uint32(le16(o+2))<<16 }
	const (
		magic      = 0xEF53
		validFS    = 0x1 // s_state
		errorFS    = 0x2
		recoverFS  = 0x4 // s_feature_incompat: the journal needs replaying
		offMagic   = 0x38
		offState   = 0x3A
		offIncompt = 0x60
		offErrors  = 0x194 // s_error_count
	)
	state := le16(offState)
	return le16(offMagic) == magic && state&validFS != 0 && state&errorFS == 0 &&
		le32(offIncompt)&recoverFS == 0 && le32(offErrors) == 0, nil
}

// diskFailed reports whether a sandbox's mounted disk failed: ext4
// recorded an error on it (errors_count in sysfs: its journal aborted
// after a failed write, it found corruption), or it is read-only (a
// running sandbox's disk is mounted read-write, so the kernel turned it;
// kernels since 6.x mark an aborted ext4 emergency_ro instead, which
// statfs does not show). A few syscalls: the monitor asks it of every
// running sandbox every few seconds. See State.DiskFailed.
func (r *Runtime) diskFailed(id string) bool {
	mnt := filepath.Join(r.dir(id), "disk")
	ext4, ok := mountedExt4(mnt)
	if !ok {
		return false // not mounted
	}
	var sfs unix.Statfs_t
	if unix.Statfs(mnt, &sfs) == nil && sfs.Flags&unix.ST_RDONLY != 0 {
		return true
	}
	n, err := readSysInt(ext4, "errors_count")
	return err == nil && n > 0
}

// mountedExt4 returns the sysfs directory (/sys/fs/ext4/<device>) of the
// ext4 file system mounted at mnt; ok is false when nothing is mounted
// there.
func mountedExt4(mnt string) (dir string, ok bool) {
	var st, parent unix.Stat_t
	if unix.Stat(mnt, &st) != nil || unix.Stat(filepath.Dir(mnt), &parent) != nil || st.Dev == parent.Dev {
		return "", false
	}
	dev, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return "", true
	}
	return filepath.Join("/sys/fs/ext4", filepath.Base(dev)), true
}

// readSysInt reads a sysfs file holding one integer.
func readSysInt(dir, file string) (int64, error) {
	if dir == "" {
		return 0, fs.ErrNotExist
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// DiskUse is what a sandbox's disk takes of the host's data dir.
type DiskUse struct {
	// Host is the space disk.img holds on the host (its allocated
	// blocks: the image is sparse, so it grows as the sandbox writes).
	Host int64
	// Pending is what the sandbox wrote that has not reached disk.img
	// yet: the mounted disk's delayed allocations (data in the host's page
	// cache that takes host space when it is written back, within about
	// 30 s; a busy writer has a GiB or more on its way). 0 when the disk
	// is not mounted.
	Pending int64
}

// DiskUse reads what a sandbox's disk takes on the host, and what is on
// its way there. A few syscalls, no lock: the server's disk watcher
// polls it for every running sandbox while the data dir is low on space.
// A disk that is missing takes nothing.
func (r *Runtime) DiskUse(id string) DiskUse {
	var u DiskUse
	if !r.Owns(id) {
		return u
	}
	d := r.dir(id)
	var st unix.Stat_t
	if unix.Stat(filepath.Join(d, "disk.img"), &st) == nil {
		u.Host = st.Blocks * 512
	}
	mnt := filepath.Join(d, "disk")
	if ext4, ok := mountedExt4(mnt); ok {
		var sfs unix.Statfs_t
		if n, err := readSysInt(ext4, "delayed_allocation_blocks"); err == nil && n > 0 && unix.Statfs(mnt, &sfs) == nil {
			u.Pending = n * sfs.Bsize
		}
	}
	return u
}

// unmountDisk unmounts the root overlay and the disk. It fails (and the
// caller must not delete anything) if either is still mounted.
func (r *Runtime) unmountDisk(id string) error {
	d := r.dir(id)
	return errors.Join(unmount(filepath.Join(d, "rootfs")), unmount(filepath.Join(d, "disk")))
}

// unmount unmounts p, never through a symlink (UMOUNT_NOFOLLOW: a link
// planted at p must not unmount what it points to).
func unmount(p string) error {
	for i := 0; i < 2; i++ {
		err := unix.Unmount(p, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue // stacked mounts: unmount until none is left
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more)
		case errors.Is(err, unix.EBUSY):
			if err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmount: %w", err)
			}
			return nil
		default:
			return fmt.Errorf("unmount: %w", err)
		}
	}
	if isMountPoint(p) {
		return fmt.Errorf("unmount %s: still mounted", filepath.Base(p))
	}
	return nil
}

// mountPoints lists the mount points of mountinfo, unescaped (the kernel
// writes space, tab, newline and backslash as \040, \011, \012, \134).
func mountPoints() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			out = append(out, unescapeMountinfo(f[4]))
		}
	}
	return out
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// isMountPoint reports whether p appears as a mount point in mountinfo.
func isMountPoint(p string) bool {
	return slices.Contains(mountPoints(), p)
}

// mountsUnder lists mount points below dir (for collecting leftovers).
func mountsUnder(dir string) []string {
	var out []string
	for _, m := range mountPoints() {
		if strings.HasPrefix(m, dir+"/") {
			out = append(out, m)
		}
	}
	return out
}

// unmountAllUnder unmounts whatever else is mounted below dir (deepest
// first: a leftover nobody knows the purpose of) and fails if dir itself
// or anything below it is still a mount point, so nothing is deleted
// through a mount.
func unmountAllUnder(dir string) error {
	ms := mountsUnder(dir)
	sort.Slice(ms, func(i, j int) bool { return len(ms[i]) > len(ms[j]) })
	var errs []error
	for _, m := range ms {
		if err := unmount(m); err != nil {
			errs = append(errs, err)
		}
	}
	if left := mountsUnder(dir); len(left) > 0 {
		errs = append(errs, fmt.Errorf("%d mounts left under the sandbox dir", len(left)))
	}
	if isMountPoint(dir) {
		errs = append(errs, errors.New("the sandbox dir is itself a mount point"))
	}
	return errors.Join(errs...)
}

// ErrNoDisk is returned for a sandbox id without a saved disk.
var ErrNoDisk = errors.New("sandbox has no disk")

// OpenWorkspace opens the host directory that backs a sandbox's
// /workspace, for fd-relative access (the sandbox user owns everything
// below it, so callers never open a host path beneath it). With readOnly
// false the sandbox's disk must be mounted (a running sandbox); with
// readOnly true a saved disk is mounted read-only for the call (see
// mountWorkspaceReadOnly) unless it is mounted already. The file's name is
// the directory's host path. release closes it and undoes a read-only
// mount; callers hold the session's lock until release returns.
// ErrNoDisk: the sandbox has no saved disk.
func (r *Runtime) OpenWorkspace(id string, readOnly bool) (dir *os.File, release func() error, err error) {
	if !r.Owns(id) {
		return nil, nil, fmt.Errorf("container id %q not made by this runtime", id)
	}
	unmount := func() error { return nil }
	if readOnly {
		if unmount, err = r.mountWorkspaceReadOnly(id); err != nil {
			return nil, nil, err
		}
	}
	dir, err = openMountedWorkspace(filepath.Join(r.dir(id), "disk"))
	if err != nil {
		if uerr := unmount(); uerr != nil {
			r.log.Error("release read-only workspace", "id", id, "err", uerr)
		}
		return nil, nil, err
	}
	return dir, func() error {
		dir.Close()
		return unmount()
	}, nil
}

// openMountedWorkspace opens disk/workspace, checking that disk is a mount
// (an unmounted disk/ is an empty host directory) and following nothing.
func openMountedWorkspace(disk string) (*os.File, error) {
	pfd, err := unix.Open(disk, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open disk: %w", err)
	}
	defer unix.Close(pfd)
	var dst, pst unix.Stat_t
	if err := unix.Fstat(pfd, &dst); err != nil {
		return nil, err
	}
	if err := unix.Lstat(filepath.Dir(disk), &pst); err != nil {
		return nil, err
	}
	if dst.Dev == pst.Dev {
		return nil, errors.New("the sandbox's disk is not mounted")
	}
	fd, err := unix.Openat2(pfd, "workspace", &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(disk, "workspace")), nil
}

// mountWorkspaceReadOnly gives the server read access to the workspace of a
// sandbox that is not running (stopped or failed): it loop-mounts disk.img
// read-only (ro,noload: not even the journal is replayed; nosuid, nodev,
// noexec) at disk/, a private (0700) directory of the sandbox dir, and
// returns a release func that unmounts it again. disk/ is the mount point Destroy unmounts, so a mount
// left by a crash is removed by Collect at the next start like any other
// leftover. If the disk is mounted already (a sandbox whose teardown has not
// released it), that mount is used and release does nothing.
//
// Callers hold the session's lock from before the call until release
// returns: the image must never be mounted twice at once, and nothing else
// may mount it meanwhile.
func (r *Runtime) mountWorkspaceReadOnly(id string) (release func() error, err error) {
	d := r.dir(id)
	mnt := filepath.Join(d, "disk")
	if isMountPoint(mnt) {
		return func() error { return nil }, nil
	}
	img := filepath.Join(d, "disk.img")
	if st, err := os.Lstat(img); err != nil || !st.Mode().IsRegular() {
		return nil, ErrNoDisk
	}
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("read-only mount point: %w", err)
	}
	if err := os.Chmod(mnt, 0o700); err != nil {
		return nil, err
	}
	// mount(8) attaches a read-only loop device with autoclear: unmounting
	// frees it.
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "ro,noload,nosuid,nodev,noexec,"+loopOption(), img, mnt).CombinedOutput(); err != nil {
		os.Remove(mnt)
		return nil, loopMountError("mount disk read-only", err, out)
	}
	release = func() error {
		if err := unmount(mnt); err != nil {
			return err
		}
		if isMountPoint(mnt) {
			return fmt.Errorf("unmount %s: still mounted", filepath.Base(mnt))
		}
		os.Remove(mnt) // empty again; Create makes it when the sandbox starts
		return nil
	}
	return release, nil
}
