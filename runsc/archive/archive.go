// Package archive packs a sandbox's disk tree (the writable root layer,
// /workspace, /tmp) into a stream and unpacks it again: tar (PAX) inside
// zstd. It keeps regular files, directories, symlinks, hard links within
// the tree, FIFOs, overlay whiteouts (character devices 0:0), modes with
// setuid/setgid/sticky bits, numeric owners, nanosecond mtimes, extended
// attributes (trusted.overlay.* included, so opaque directories survive)
// and names of any bytes but NUL and '/' (newlines, non-UTF-8) up to
// MaxName bytes of path, deeper than PATH_MAX included.
//
// Holes: a regular file with fewer blocks than its size is listed with
// SEEK_DATA/SEEK_HOLE. Up to 256 MiB of holes in all (denseHoles) are
// packed as zeros, so small sparse files extract with any tar; beyond, a
// file with holes is written as a sparse entry of our own: a PAX record SANDBOXD.sparse.size=<real size>, and entry data
// made of segments, each a 16-byte header (offset, length: big-endian
// uint64) and that many bytes of the file, in increasing order. Packing a
// 2 TiB file of holes then costs two lseeks, not 2 TiB of zeros; no cap on
// segments is needed, as Unpack reads them one at a time. (Other tar
// readers extract such an entry as its raw segments.) Unpack truncates the
// file to the real size and writes each segment at its offset after
// checking it: in order, not overlapping, non-empty, within the real size,
// the segments filling the entry's data exactly. Either way Unpack writes
// no 4 KiB block (file system block) that is all zeros, so a restored file
// takes no more space than the one packed. Pack checks for cancellation
// while copying a file's data, not only between entries.
//
// Extended attributes whose name a PAX record cannot carry (with '=') are
// left out by Pack, counted in Stats.XattrsSkipped, rather than fail the
// save. Stats.Bytes counts data, not holes.
//
// Pack reads a tree nobody changes meanwhile (a frozen or stopped sandbox)
// without following a symlink: every step is relative to an opened
// directory, files are opened O_NOFOLLOW and checked to be what was listed.
// Sockets, block devices and character devices other than 0:0 are skipped
// (counted in Stats.Skipped): they cannot be made on the sandbox's nodev
// disk by its unprivileged user anyway.
//
// Unpack is safe by construction on hostile input: every entry's parent is
// opened with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV) from the destination's descriptor
// (a parent name longer than PATH_MAX a run of whole components at a
// time, each run opened so beneath the directory the previous one opened)
// and the entry is created relative to it with O_EXCL/O_NOFOLLOW (or
// mkdirat, symlinkat, mknodat, linkat without following), so absolute
// names, "..", writing through a symlink, leaving the mount, duplicate
// names, hard links to anything but a regular file this same archive made,
// devices other than whiteouts where Options allow them, and unknown
// extended attribute namespaces are rejected with an error before anything
// is written for that entry. A rejected archive leaves a partial tree: the
// caller unpacks into a scratch place and discards it on error.
//
// Concurrency: Pack and Unpack are safe to call concurrently on different
// trees; each runs the zstd codec's own goroutines, which end when the call
// returns.
package archive

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// Stats counts what a Pack or Unpack handled.
type Stats struct {
	Files, Dirs, Symlinks, HardLinks, Whiteouts, Fifos int64
	// Bytes is the regular files' data.
	Bytes int64
	// Skipped counts sockets and devices Pack left out.
	Skipped int64
	// XattrsSkipped (Pack only) counts extended attributes left out
	// because the format cannot carry them (a name with '=').
	XattrsSkipped int64
	// Usage (Pack only) is the disk space (allocated blocks) of each
	// top-level entry and everything below it, as du counts it but hard
	// links each time: what a second walk of the tree would add up.
	Usage map[string]int64
}

// Options say what Unpack accepts beyond plain files, directories and
// symlinks.
type Options struct {
	// Overlay reports whether name (slash-separated, relative) lies in an
	// overlay upper layer, where whiteouts (character devices 0:0) and
	// trusted.overlay.* attributes are allowed. nil: nowhere.
	Overlay func(name string) bool
	// Fifos allows named pipes.
	Fifos bool
}

// ErrUnsafe is the class of every entry Unpack rejects.
var ErrUnsafe = errors.New("archive: unsafe entry")

func unsafeEntry(name, format string, args ...any) error {
	return fmt.Errorf("%w %q: %s", ErrUnsafe, name, fmt.Sprintf(format, args...))
}

// Pack writes the tree below dir, restricted to the top-level entries in
// top (all when nil), as zstd-compressed tar to w.
func Pack(ctx context.Context, dir string, top []string, w io.Writer) (Stats, error) {
	enc, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedDefault),
		zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)), zstd.WithLowerEncoderMem(false))
	if err != nil {
		return Stats{}, err
	}
	st, err := packTar(ctx, dir, top, enc, false)
	if err != nil {
		enc.Close()
		return st, err
	}
	return st, enc.Close()
}

// Unpack reads a zstd-compressed tar from r into dir (an existing
// directory), rejecting unsafe entries (see the package doc). r's own error
// (a checksum mismatch at EOF) fails the Unpack.
func Unpack(ctx context.Context, r io.Reader, dir string, o Options) (Stats, error) {
	dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)), zstd.WithDecoderLowmem(false))
	if err != nil {
		return Stats{}, err
	}
	defer dec.Close()
	st, err := UnpackTar(ctx, dec, dir, o)
	if err != nil {
		return st, err
	}
	// Drain to the end, so the source's own check (a checksum at EOF) runs.
	if _, err := io.Copy(io.Discard, dec); err != nil {
		return st, err
	}
	return st, nil
}

// checkName validates an entry name: relative, no empty, "." or ".."
// segments, no NUL, bounded lengths. A trailing slash is dropped.
func checkName(name string) (string, error) {
	n := strings.TrimSuffix(name, "/")
	switch {
	case n == "":
		return "", unsafeEntry(name, "empty name")
	case len(n) > MaxName:
		return "", unsafeEntry(name[:64], "name too long")
	case strings.HasPrefix(n, "/"):
		return "", unsafeEntry(name, "absolute name")
	case strings.IndexByte(n, 0) >= 0:
		return "", unsafeEntry(name, "NUL in name")
	}
	for _, seg := range strings.Split(n, "/") {
		switch {
		case seg == "":
			return "", unsafeEntry(name, "empty path segment")
		case seg == "." || seg == "..":
			return "", unsafeEntry(name, "%q segment", seg)
		case len(seg) > 255:
			return "", unsafeEntry(name, "segment too long")
		}
	}
	return n, nil
}

// MaxName bounds an entry's path (relative to the tree's root), for Pack
// and Unpack alike: Pack fails on a longer one (see checkPackName) rather
// than make a save Unpack would refuse. It is 8 times PATH_MAX: Unpack
// resolves longer names a run of components at a time, but keeps every
// name of the archive in memory.
const MaxName = 32 << 10

// checkPackName is Pack's side of checkName's length bound (the rest of
// checkName holds for any name a directory listing gives).
func checkPackName(path string) error {
	if len(path) > MaxName {
		return fmt.Errorf("pack: path %q... is %d bytes long, more than the %d a restore accepts: shorten that directory chain",
			path[:64], len(path), MaxName)
	}
	return nil
}

// pathMax is the longest name one system call resolves (PATH_MAX less its
// NUL).
const pathMax = 4095

func splitName(n string) (parent, base string) {
	i := strings.LastIndexByte(n, '/')
	if i < 0 {
		return "", n
	}
	return n[:i], n[i+1:]
}

// xattrPrefix is how PAX records carry extended attributes (GNU tar,
// bsdtar and Go's archive/tar read them alike).
const xattrPrefix = "SCHILY.xattr."

// sparseKey is the PAX record of a sparse regular file: its real size.
// The entry's data is then a sequence of segments, each a 16-byte header
// (offset and length, big-endian uint64) and that many bytes of data, in
// increasing order of offset, not overlapping, within the real size; the
// rest of the file is holes.
const sparseKey = "SANDBOXD.sparse.size"

// xattrEncodable reports whether the tar format can carry an attribute
// name (as a PAX record key, which cannot hold '=' or NUL).
func xattrEncodable(key string) bool {
	return key != "" && strings.IndexByte(key, '=') < 0 && strings.IndexByte(key, 0) < 0
}

func xattrAllowed(key string, overlay bool) bool {
	switch {
	case strings.HasPrefix(key, "user."), strings.HasPrefix(key, "security."),
		key == "system.posix_acl_access", key == "system.posix_acl_default":
		return true
	case strings.HasPrefix(key, "trusted.overlay."):
		return overlay
	}
	return false
}
