package workspace

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

const (
	usageEntries = 1 << 20
	usageTime    = 10 * time.Second
)

// DiskUsage sums the disk space used by the files under dir (allocated
// blocks, so sparse files count what they use). The sandbox may still run
// and swap a directory for a symlink to the host meanwhile, so the walk
// goes by descriptors and follows no link, and stops after a million
// entries or ten seconds.
func DiskUsage(dir *os.File) int64 {
	fd, err := openDir(int(dir.Fd()), ".") // its own offset: a dup would share dir's
	if err != nil {
		return 0
	}
	w := usageWalk{deadline: time.Now().Add(usageTime), left: usageEntries}
	w.walk(fd, 0)
	return w.n
}

type usageWalk struct {
	n        int64
	left     int
	deadline time.Time
}

// walk adds up the directory fd (which it closes).
func (w *usageWalk) walk(fd, depth int) {
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil {
		w.n += st.Blocks * 512
	}
	if w.left <= 0 {
		return
	}
	names, _, err := readNames(fd, w.left)
	if err != nil {
		return
	}
	w.left -= len(names)
	for _, name := range names {
		if time.Now().After(w.deadline) {
			return
		}
		if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			w.n += st.Blocks * 512
			continue
		}
		if depth < maxDeleteDepth {
			if sub, err := openDir(fd, name); err == nil {
				w.walk(sub, depth+1)
			}
		}
	}
}
