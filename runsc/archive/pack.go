package archive

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"
)

type packer struct {
	ctx   context.Context
	tw    *tarWriter
	links map[[2]uint64]string // (dev, inode) of a multiply linked file -> its first name
	buf   []byte
	xbuf  []byte
	st    Stats
	top   string // the top-level entry being packed
	holes int64  // bytes of holes packed as zeros so far
}

// denseHoles bounds the bytes of holes a Pack writes as zeros: what
// reading and compressing them may cost (about 0.4 s) to keep small sparse
// files readable by any tar.
const denseHoles = 256 << 20

// PackTar is Pack without compression.
func PackTar(ctx context.Context, dir string, top []string, w io.Writer) (Stats, error) {
	return packTar(ctx, dir, top, w, true)
}

func packTar(ctx context.Context, dir string, top []string, w io.Writer, buffered bool) (Stats, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("pack: open %s: %w", dir, err)
	}
	p := &packer{ctx: ctx, tw: newTarWriter(w, buffered), links: map[[2]uint64]string{}, st: Stats{Usage: map[string]int64{}},
		buf: make([]byte, 1<<20), xbuf: make([]byte, 64<<10)}
	err = p.dir(fd, "", top)
	if err == nil {
		err = p.tw.close()
	}
	return p.st, err
}

// dir packs the entries of the open directory fd (closed on return) whose
// archive path is rel ("" for the root); only names in only when not nil.
func (p *packer) dir(fd int, rel string, only []string) error {
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("pack: list %q: %w", rel, err)
	}
	if only != nil {
		keep := map[string]bool{}
		for _, n := range only {
			keep[n] = true
		}
		kept := names[:0]
		for _, n := range names {
			if keep[n] {
				kept = append(kept, n)
			}
		}
		names = kept
	}
	sort.Strings(names)
	for _, name := range names {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		path := name
		if rel != "" {
			path = rel + "/" + name
		} else {
			p.top = name
		}
		if err := p.entry(fd, name, path); err != nil {
			return err
		}
	}
	return nil
}

func (p *packer) entry(dfd int, name, path string) error {
	if err := checkPackName(path); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("pack: stat %q: %w", path, err)
	}
	p.st.Usage[p.top] += st.Blocks * 512
	hdr := &tarEntry{
		name: path, mode: int64(st.Mode & 0o7777), uid: int64(st.Uid), gid: int64(st.Gid),
		mtimeSec: st.Mtim.Sec, mtimeNsec: st.Mtim.Nsec,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		cfd, err := openNoatime(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
		if err != nil {
			return fmt.Errorf("pack: open %q: %w", path, err)
		}
		if err := p.checkSame(cfd, &st, path); err != nil {
			unix.Close(cfd)
			return err
		}
		hdr.typeflag = tar.TypeDir
		if err := p.xattrs(hdr, cfd, ""); err != nil {
			unix.Close(cfd)
			return err
		}
		if err := p.tw.header(hdr); err != nil {
			unix.Close(cfd)
			return err
		}
		p.st.Dirs++
		return p.dir(cfd, path, nil)
	case unix.S_IFREG:
		return p.file(dfd, name, path, hdr, &st)
	case unix.S_IFLNK:
		target := make([]byte, st.Size+1)
		n, err := unix.Readlinkat(dfd, name, target)
		if err != nil || int64(n) != st.Size {
			return fmt.Errorf("pack: readlink %q: changed or %v", path, err)
		}
		hdr.typeflag, hdr.linkname = tar.TypeSymlink, string(target[:n])
		if err := p.xattrs(hdr, -1, procPath(dfd, name)); err != nil {
			return err
		}
		p.st.Symlinks++
		return p.tw.header(hdr)
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			p.st.Skipped++
			return nil
		}
		hdr.typeflag = tar.TypeChar
		if err := p.xattrs(hdr, -1, procPath(dfd, name)); err != nil {
			return err
		}
		p.st.Whiteouts++
		return p.tw.header(hdr)
	case unix.S_IFIFO:
		hdr.typeflag = tar.TypeFifo
		p.st.Fifos++
		return p.tw.header(hdr)
	default: // sockets, block devices
		p.st.Skipped++
		return nil
	}
}

// openNoatime opens with O_NOATIME where allowed (the owner, or
// CAP_FOWNER): reading a tree for a save would otherwise dirty the inode of
// every file not read since it changed, each written back when the disk is
// unmounted.
func openNoatime(dfd int, name string, flags int) (int, error) {
	fd, err := unix.Openat(dfd, name, flags|unix.O_NOATIME, 0)
	if err == unix.EPERM {
		fd, err = unix.Openat(dfd, name, flags, 0)
	}
	return fd, err
}

// procPath names an entry of an open directory for the l*xattr calls,
// which have no *at form: the magic link is our own descriptor and the
// last component is not followed.
func procPath(dfd int, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(dfd) + "/" + name
}

func (p *packer) checkSame(fd int, want *unix.Stat_t, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Ino != want.Ino || st.Dev != want.Dev || st.Mode&unix.S_IFMT != want.Mode&unix.S_IFMT {
		return fmt.Errorf("pack: %q changed while packing", path)
	}
	return nil
}

func (p *packer) file(dfd int, name, path string, hdr *tarEntry, st *unix.Stat_t) error {
	if st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := p.links[key]; ok {
			hdr.typeflag, hdr.linkname, hdr.mode = tar.TypeLink, first, 0
			p.st.HardLinks++
			return p.tw.header(hdr)
		}
		p.links[key] = path
	}
	// O_NOFOLLOW: a symlink swapped in is not followed; O_NONBLOCK: a FIFO
	// swapped in does not block (its read fails); the read must then yield
	// exactly the listed size.
	fd, err := openNoatime(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC)
	if err != nil {
		return fmt.Errorf("pack: open %q: %w", path, err)
	}
	defer unix.Close(fd)
	hdr.typeflag, hdr.size = tar.TypeReg, st.Size
	if err := p.xattrs(hdr, fd, ""); err != nil {
		return err
	}
	// Fewer blocks than the size: look for holes. Their zeros are packed
	// as data (which any tar reads; Unpack makes holes of them again) up
	// to denseHoles in all; beyond, files are sparse entries.
	if st.Blocks*512 < st.Size {
		count, data, err := segments(fd, st.Size, nil)
		if holes := st.Size - data; err == nil && holes > 0 {
			if p.holes+holes > denseHoles {
				return p.sparseFile(fd, path, hdr, st.Size, count, data)
			}
			p.holes += holes
		}
	}
	if err := p.tw.header(hdr); err != nil {
		return err
	}
	if err := p.copy(fd, path, 0, st.Size); err != nil {
		return err
	}
	p.tw.pad(st.Size)
	p.st.Files++
	p.st.Bytes += st.Size
	return nil
}

// copy writes n bytes of fd from off as the entry's data, checking for
// cancellation between reads.
func (p *packer) copy(fd int, path string, off, n int64) error {
	for n > 0 {
		if err := p.ctx.Err(); err != nil {
			return err
		}
		m, err := unix.Pread(fd, p.buf[:min(int64(len(p.buf)), n)], off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("pack: read %q: %w", path, err)
		}
		if m == 0 {
			return fmt.Errorf("pack: %q changed while packing", path)
		}
		if err := p.tw.data(p.buf[:m]); err != nil {
			return err
		}
		off += int64(m)
		n -= int64(m)
	}
	return nil
}

// sparseFile writes a file with holes as segments (see sparseKey): count
// of them, holding data bytes, as segments found.
func (p *packer) sparseFile(fd int, path string, hdr *tarEntry, size, count, data int64) error {
	hdr.sparse, hdr.realSize, hdr.size = true, size, count*segHeader+data
	if err := p.tw.header(hdr); err != nil {
		return err
	}
	left := hdr.size
	var seg [segHeader]byte
	_, _, err := segments(fd, size, func(off, n int64) error {
		if left < segHeader+n {
			return fmt.Errorf("pack: %q changed while packing", path)
		}
		binary.BigEndian.PutUint64(seg[:8], uint64(off))
		binary.BigEndian.PutUint64(seg[8:], uint64(n))
		if err := p.tw.data(seg[:]); err != nil {
			return err
		}
		left -= segHeader + n
		return p.copy(fd, path, off, n)
	})
	if err != nil {
		return err
	}
	if left != 0 {
		return fmt.Errorf("pack: %q changed while packing", path)
	}
	p.tw.pad(hdr.size)
	p.st.Files++
	p.st.Bytes += data
	return nil
}

// segHeader is the size of a sparse file's segment header.
const segHeader = 16

// segments lists the data segments of fd's first size bytes
// (SEEK_DATA/SEEK_HOLE) to fn (when not nil) and counts them and their
// bytes. Each lseek finds a segment: the listing costs a system call per
// extent, never a read of a hole.
func segments(fd int, size int64, fn func(off, n int64) error) (count, data int64, err error) {
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO { // no data past off
			break
		}
		if err != nil {
			return 0, 0, err
		}
		if d >= size {
			break
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return 0, 0, err
		}
		h = min(h, size)
		if h <= d || d < off {
			return 0, 0, fmt.Errorf("file changed while listing its holes")
		}
		if fn != nil {
			if err := fn(d, h-d); err != nil {
				return 0, 0, err
			}
		}
		count++
		data += h - d
		off = h
	}
	return count, data, nil
}

// xattrs adds the extended attributes of fd (or, with fd < 0, of the
// unfollowed path) to hdr.
func (p *packer) xattrs(hdr *tarEntry, fd int, path string) error {
	list := func(b []byte) (int, error) {
		if fd >= 0 {
			return unix.Flistxattr(fd, b)
		}
		return unix.Llistxattr(path, b)
	}
	get := func(k string, b []byte) (int, error) {
		if fd >= 0 {
			return unix.Fgetxattr(fd, k, b)
		}
		return unix.Lgetxattr(path, k, b)
	}
	n, err := list(p.xbuf)
	if err == unix.ERANGE {
		if n, err = list(nil); err == nil {
			p.xbuf = make([]byte, n*2)
			n, err = list(p.xbuf)
		}
	}
	if err == unix.ENOTSUP || (err == nil && n == 0) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pack: list attributes of %q: %w", hdr.name, err)
	}
	keys := p.xbuf[:n]
	var names []string
	for len(keys) > 0 {
		i := 0
		for i < len(keys) && keys[i] != 0 {
			i++
		}
		if i > 0 {
			names = append(names, string(keys[:i]))
		}
		if i < len(keys) {
			i++
		}
		keys = keys[i:]
	}
	for _, k := range names {
		if !xattrEncodable(k) {
			p.st.XattrsSkipped++
			continue
		}
		v := make([]byte, 4096)
		m, err := get(k, v)
		if err == unix.ERANGE {
			if m, err = get(k, nil); err == nil {
				v = make([]byte, m)
				m, err = get(k, v)
			}
		}
		if err == unix.ENODATA {
			continue
		}
		if err != nil {
			return fmt.Errorf("pack: attribute %s of %q: %w", k, hdr.name, err)
		}
		hdr.xattrs = append(hdr.xattrs, xattr{k, string(v[:m])})
	}
	sortXattrs(hdr.xattrs)
	return nil
}
