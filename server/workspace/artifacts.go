package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"path"
	"sort"
	"sync"
	"time"
	"weak"

	"golang.org/x/sys/unix"

	"sandboxd/streams/scrub"
)

// Artifact is one regular file of the workspace; Size and SHA256 describe
// the bytes a download delivers (after the scrubber), Path is redacted.
type Artifact struct {
	Path       string    `json:"path"`
	Size       int64     `json:"size"`
	ModifiedAt time.Time `json:"modifiedAt"`
	SHA256     string    `json:"sha256"`
}

// Artifacts lists every regular file under the workspace (recursively,
// symlinks not followed), sorted by path. cut says why the list is
// incomplete ("bytes", "depth", "entries", "size", "time"), sorted.
func (d *Dir) Artifacts() (out []Artifact, cut []string, err error) {
	w := &artifactWalk{d: d, deadline: time.Now().Add(maxHashTime), budget: maxHashBytes, cut: map[string]bool{}}
	fd, err := openDir(d.fd, ".") // its own offset: a dup would share d's
	if err != nil {
		return nil, nil, fsError(err)
	}
	if err := w.walk(fd, "", 1); err != nil {
		return nil, nil, fsError(err)
	}
	sort.Slice(w.out, func(i, j int) bool { return w.out[i].Path < w.out[j].Path })
	for k := range w.cut {
		cut = append(cut, k)
	}
	sort.Strings(cut)
	if w.out == nil {
		w.out = []Artifact{}
	}
	return w.out, cut, nil
}

type artifactWalk struct {
	d        *Dir
	entries  int
	size     int // estimated bytes of the JSON answer
	budget   int64
	deadline time.Time
	cut      map[string]bool // why the listing is incomplete
	out      []Artifact
}

// walk lists the directory fd (which it closes) at rel, depth levels below
// the workspace.
func (w *artifactWalk) walk(fd int, rel string, depth int) error {
	defer unix.Close(fd)
	left := MaxListEntries - w.entries
	if w.cut["size"] {
		return nil
	}
	if left <= 0 {
		w.cut["entries"] = true
		return nil
	}
	names, more, err := readNames(fd, left)
	if err != nil {
		return err
	}
	if more {
		w.cut["entries"] = true
	}
	w.entries += len(names)
	sort.Strings(names)
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		p := path.Join(rel, n)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if depth >= maxWalkDepth {
				w.cut["depth"] = true
				continue
			}
			sub, err := openDir(fd, n)
			if err != nil {
				continue // swapped for something else meanwhile
			}
			if err := w.walk(sub, p, depth+1); err != nil {
				return err
			}
		case unix.S_IFREG:
			if w.size += jsonSize(p) + 160; w.size > MaxListBytes {
				w.cut["size"] = true
				return nil
			}
			a, ok := w.digest(fd, n, &st)
			if ok {
				a.Path = w.d.set.RedactString(p)
				w.out = append(w.out, a)
			}
		}
	}
	return nil
}

// digest computes the size and sha256 of a file's scrubbed bytes, from the
// cache when the file is unchanged.
func (w *artifactWalk) digest(dirfd int, name string, lst *unix.Stat_t) (Artifact, bool) {
	cache := w.d.fs.digests
	key := digestKey{session: w.d.session, set: weak.Make(w.d.set), dev: lst.Dev, ino: lst.Ino, size: lst.Size, mtime: lst.Mtim, ctime: lst.Ctim}
	if d, ok := cache.get(key); ok {
		return Artifact{Size: d.size, SHA256: d.sum, ModifiedAt: mtime(lst)}, true
	}
	if lst.Size > w.budget {
		w.cut["bytes"] = true
		return Artifact{}, false
	}
	if time.Now().After(w.deadline) {
		w.cut["time"] = true
		return Artifact{}, false
	}
	fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return Artifact{}, false
	}
	f := osFile(fd, "artifact")
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return Artifact{}, false
	}
	h := sha256.New()
	cw := &countWriter{w: h}
	sw := w.d.set.NewWriter(cw)
	// A file that grows while it is read is cut at the budget.
	n, rerr, _ := CopyFile(sw, io.LimitReader(f, w.budget+1))
	sw.Close()
	w.budget -= n
	if rerr != nil {
		return Artifact{}, false
	}
	if w.budget < 0 {
		w.cut["bytes"] = true
		return Artifact{}, false
	}
	d := digestVal{size: cw.n, sum: hex.EncodeToString(h.Sum(nil))}
	var after unix.Stat_t
	if unix.Fstat(fd, &after) == nil && after.Size == st.Size && after.Mtim == st.Mtim && after.Ctim == st.Ctim {
		key = digestKey{session: w.d.session, set: weak.Make(w.d.set), dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
		cache.put(key, d)
	}
	return Artifact{Size: d.size, SHA256: d.sum, ModifiedAt: mtime(&st)}, true
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// digestCache keeps artifact digests of files that did not change, so
// listing a workspace again does not read it again. A file counts as
// unchanged while its inode, size, mtime and ctime are (the sandbox cannot
// set ctime, and a file whose ctime is within the last two seconds is not
// cached: a write in the same clock tick would not change it). The
// scrubber is part of the key: digests describe scrubbed bytes. It is
// held weakly: a scrubber the session manager evicted (a stopped session's)
// is not kept alive by the digests made with it.
type digestCache struct {
	mu  sync.Mutex
	m   map[digestKey]digestVal
	now func() time.Time
}

const maxDigests = 100000

type digestKey struct {
	session      string
	set          weak.Pointer[scrub.Set]
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

type digestVal struct {
	size int64
	sum  string
}

func (d *digestCache) get(k digestKey) (digestVal, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.m[k]
	return v, ok
}

func (d *digestCache) put(k digestKey, v digestVal) {
	if d.now().Sub(time.Unix(k.ctime.Sec, k.ctime.Nsec)) < 2*time.Second {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.m) >= maxDigests {
		clear(d.m)
	}
	d.m[k] = v
}

// forget drops a session's entries.
func (d *digestCache) forget(session string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range d.m {
		if k.session == session {
			delete(d.m, k)
		}
	}
}
