package archive

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
)

// tarWriter writes the tar stream Pack makes: POSIX ustar headers with a
// PAX extended header only for what ustar cannot hold (nanosecond mtimes,
// long or non-ASCII names, large ids and sizes, extended attributes). It
// is what archive/tar.Writer writes for FormatPAX, without its per-header
// cost (format negotiation, maps, sorting, allocations: about 5 µs a
// file, a quarter of packing a small file). GNU tar, bsdtar and
// archive/tar read it; TestTarWriterMatchesArchiveTar checks the last.
type tarWriter struct {
	w   io.Writer
	buf *bufio.Writer // nil: w buffers itself
	blk [blockSize]byte
	pax []byte // the records of the entry being written
	err error
}

const blockSize = 512

// tarEntry is one header. Names are slash-separated, relative.
type tarEntry struct {
	name, linkname string
	typeflag       byte
	mode           int64
	uid, gid       int64
	size           int64
	mtimeSec       int64
	mtimeNsec      int64
	xattrs         []xattr // sorted by key
	// sparse: the data is segments (see sparseKey) of a file of
	// realSize bytes.
	sparse   bool
	realSize int64
}

type xattr struct{ key, value string }

// newTarWriter writes to w, through a buffer unless w has its own (a zstd
// encoder copies into its blocks anyway: another copy would cost more than
// the small writes it saves).
func newTarWriter(w io.Writer, buffered bool) *tarWriter {
	if !buffered {
		return &tarWriter{w: w}
	}
	b := bufio.NewWriterSize(w, 256<<10)
	return &tarWriter{w: b, buf: b}
}

const (
	maxOctal7  = 1<<21 - 1 // 7 octal digits: mode, uid, gid
	maxOctal11 = 1<<33 - 1 // 11 octal digits: size, mtime
)

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 || s[i] == 0 {
			return false
		}
	}
	return true
}

// paxRecord appends "len key=value\n", len counting itself.
func paxRecord(b []byte, key, value string) []byte {
	n := len(key) + len(value) + 3 // ' ', '=', '\n'
	l := n + len(strconv.Itoa(n))
	if len(strconv.Itoa(l)) != len(strconv.Itoa(n)) {
		l++
	}
	b = strconv.AppendInt(b, int64(l), 10)
	b = append(b, ' ')
	b = append(b, key...)
	b = append(b, '=')
	b = append(b, value...)
	return append(b, '\n')
}

// header writes e's header (and its PAX header before it when needed).
// The caller then writes exactly e.size bytes of data with write and ends
// the entry with pad.
func (t *tarWriter) header(e *tarEntry) error {
	if t.err != nil {
		return t.err
	}
	pax := t.pax[:0]
	name, link := e.name, e.linkname
	if len(name) > 100 || !isASCII(name) {
		pax = paxRecord(pax, "path", name)
		name = asciiPrefix(name, 100)
	}
	if len(link) > 100 || !isASCII(link) {
		pax = paxRecord(pax, "linkpath", link)
		link = asciiPrefix(link, 100)
	}
	uid, gid, size, mtime := e.uid, e.gid, e.size, e.mtimeSec
	if uid < 0 || uid > maxOctal7 {
		pax = paxRecord(pax, "uid", strconv.FormatInt(uid, 10))
		uid = 0
	}
	if gid < 0 || gid > maxOctal7 {
		pax = paxRecord(pax, "gid", strconv.FormatInt(gid, 10))
		gid = 0
	}
	if size > maxOctal11 {
		pax = paxRecord(pax, "size", strconv.FormatInt(size, 10))
		size = 0
	}
	if e.mtimeNsec != 0 || mtime < 0 || mtime > maxOctal11 {
		pax = paxRecord(pax, "mtime", formatPAXTime(e.mtimeSec, e.mtimeNsec))
		mtime = min(max(mtime, 0), maxOctal11)
	}
	if e.sparse {
		pax = paxRecord(pax, sparseKey, strconv.FormatInt(e.realSize, 10))
	}
	for _, x := range e.xattrs {
		pax = paxRecord(pax, xattrPrefix+x.key, x.value)
	}
	t.pax = pax
	if len(pax) > maxSpecial { // a reader refuses it: fail now, not at restore
		t.err = fmt.Errorf("pack: %q: name and extended attributes take %d bytes, more than the %d a restore accepts", e.name, len(pax), maxSpecial)
		return t.err
	}
	if len(pax) > 0 {
		t.block("././@PaxHeader", "", 'x', 0o644, 0, 0, int64(len(pax)), mtime)
		t.write(pax)
		t.pad(int64(len(pax)))
	}
	t.block(name, link, e.typeflag, e.mode, uid, gid, size, mtime)
	return t.err
}

// formatPAXTime is sec.nsec with trailing zeros dropped, as archive/tar
// writes it.
func formatPAXTime(sec, nsec int64) string {
	if nsec == 0 {
		return strconv.FormatInt(sec, 10)
	}
	if sec < 0 && nsec != 0 { // -1.5 is sec -2, nsec 5e8
		sec, nsec = sec+1, 1e9-nsec
		s := strconv.FormatInt(sec, 10)
		if sec == 0 {
			s = "-0"
		}
		return s + "." + fracDigits(nsec)
	}
	return strconv.FormatInt(sec, 10) + "." + fracDigits(nsec)
}

func fracDigits(nsec int64) string {
	s := strconv.FormatInt(nsec+1e9, 10)[1:] // 9 digits with leading zeros
	for len(s) > 1 && s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	return s
}

// asciiPrefix is the best-effort ustar field for a name PAX carries.
func asciiPrefix(s string, n int) string {
	b := make([]byte, 0, n)
	for i := 0; i < len(s) && len(b) < n; i++ {
		if s[i] < 0x80 && s[i] != 0 {
			b = append(b, s[i])
		}
	}
	return string(b)
}

func putOctal(b []byte, v int64) {
	// len(b)-1 digits, zero-padded, then NUL.
	i := len(b) - 1
	b[i] = 0
	for i--; i >= 0; i-- {
		b[i] = byte('0' + v&7)
		v >>= 3
	}
}

func (t *tarWriter) block(name, link string, typeflag byte, mode, uid, gid, size, mtime int64) {
	b := &t.blk
	clear(b[:])
	copy(b[0:100], name)
	putOctal(b[100:108], mode)
	putOctal(b[108:116], uid)
	putOctal(b[116:124], gid)
	putOctal(b[124:136], size)
	putOctal(b[136:148], mtime)
	b[156] = typeflag
	copy(b[157:257], link)
	copy(b[257:265], "ustar\x0000")
	putOctal(b[329:337], 0) // devmajor
	putOctal(b[337:345], 0) // devminor
	// The checksum counts its own field as spaces (it is zeros here).
	sum := int64(8 * ' ')
	for _, c := range b {
		sum += int64(c)
	}
	putOctal(b[148:155], sum) // six digits and NUL
	b[155] = ' '
	t.write(b[:])
}

func (t *tarWriter) write(p []byte) {
	if t.err == nil {
		_, t.err = t.w.Write(p)
	}
}

// data writes file data (part of the size the header announced).
func (t *tarWriter) data(p []byte) error {
	t.write(p)
	return t.err
}

var zeroBlock [blockSize]byte

// pad ends an entry of size bytes of data.
func (t *tarWriter) pad(size int64) {
	if r := size % blockSize; r != 0 {
		t.write(zeroBlock[:blockSize-r])
	}
}

// close writes the two zero blocks that end the archive and flushes.
func (t *tarWriter) close() error {
	t.write(zeroBlock[:])
	t.write(zeroBlock[:])
	if t.err == nil && t.buf != nil {
		t.err = t.buf.Flush()
	}
	return t.err
}

func sortXattrs(x []xattr) {
	sort.Slice(x, func(i, j int) bool { return x[i].key < x[j].key })
}
