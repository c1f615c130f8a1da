package archive

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"
)

// tarReader reads what Unpack accepts: ustar headers (also GNU's and v7's
// magic), PAX extended headers ('x') and GNU long names ('L', 'K'), into
// archive/tar.Header values as archive/tar.Reader would. It is
// archive/tar.Reader without what Unpack does not need (format detection,
// which scans every header block for non-ASCII bytes; sparse files, which
// it refuses) and so without most of its cost: about 10 µs a small file,
// half of unpacking one. FuzzTarReader compares it with archive/tar.
// Global headers ('g'), GNU sparse files and other special types come out
// as entries of their type, which Unpack refuses.
type tarReader struct {
	r    *bufio.Reader
	blk  [blockSize]byte
	left int64 // data left in the current entry
	pad  int64 // then padding to the next header
	err  error // sticky
}

var errHeader = tar.ErrHeader

// maxSpecial bounds a PAX or GNU long-name header's data (archive/tar's
// limit too).
const maxSpecial = 1 << 20

func newTarReader(r io.Reader) *tarReader {
	return &tarReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// Read reads the current entry's data.
func (t *tarReader) Read(p []byte) (int, error) {
	if t.err != nil {
		return 0, t.err
	}
	if t.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > t.left {
		p = p[:t.left]
	}
	n, err := t.r.Read(p)
	t.left -= int64(n)
	if err == io.EOF && t.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil && err != io.EOF {
		t.err = err
	}
	if err == io.EOF && t.left == 0 {
		err = nil
	}
	return n, err
}

func (t *tarReader) skip(n int64) error {
	if n <= 0 {
		return nil
	}
	m, err := t.r.Discard(int(n))
	if err == io.EOF || (err == nil && int64(m) < n) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// Next skips the rest of the current entry and reads the next header;
// io.EOF at the end of the archive.
func (t *tarReader) Next() (*tar.Header, error) {
	if t.err != nil {
		return nil, t.err
	}
	hdr, err := t.next()
	if err != nil {
		t.err = err
	}
	return hdr, err
}

func (t *tarReader) next() (*tar.Header, error) {
	if err := t.skip(t.left + t.pad); err != nil {
		return nil, err
	}
	t.left, t.pad = 0, 0
	var pax map[string]string
	var longName, longLink string
	for {
		hdr, err := t.readHeader()
		if err != nil {
			return nil, err
		}
		switch hdr.Typeflag {
		case tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
			data, err := t.readSpecial(hdr.Size)
			if err != nil {
				return nil, err
			}
			switch hdr.Typeflag {
			case tar.TypeXHeader:
				if pax, err = parsePAX(data); err != nil {
					return nil, err
				}
			case tar.TypeGNULongName:
				longName = cString(data)
			default:
				longLink = cString(data)
			}
			continue
		}
		if err := applyPAX(hdr, pax); err != nil {
			return nil, err
		}
		if longName != "" {
			hdr.Name = longName
		}
		if longLink != "" {
			hdr.Linkname = longLink
		}
		if hdr.Typeflag == tar.TypeRegA {
			if strings.HasSuffix(hdr.Name, "/") {
				hdr.Typeflag = tar.TypeDir
			} else {
				hdr.Typeflag = tar.TypeReg
			}
		}
		size := hdr.Size
		switch hdr.Typeflag {
		case tar.TypeLink, tar.TypeSymlink, tar.TypeChar, tar.TypeBlock, tar.TypeDir, tar.TypeFifo:
			size = 0
		}
		if size < 0 {
			return nil, errHeader
		}
		t.left, t.pad = size, -size&(blockSize-1)
		return hdr, nil
	}
}

// readSpecial reads a meta header's data (and its padding).
func (t *tarReader) readSpecial(size int64) ([]byte, error) {
	if size < 0 || size > maxSpecial {
		return nil, errHeader
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(t.r, b); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return b, t.skip(-size & (blockSize - 1))
}

// readHeader reads one header block; io.EOF at the end-of-archive marker
// (two zero blocks) or at a clean end.
func (t *tarReader) readHeader() (*tar.Header, error) {
	b := &t.blk
	if _, err := io.ReadFull(t.r, b[:]); err != nil {
		return nil, err // io.EOF only when nothing was read
	}
	if *b == zeroBlock {
		if _, err := io.ReadFull(t.r, b[:]); err != nil {
			return nil, err
		}
		if *b == zeroBlock {
			return nil, io.EOF
		}
		return nil, errHeader
	}
	var p numParser
	sum := p.octal(b[148:156])
	if p.err != nil {
		return nil, errHeader
	}
	if sum != checksum(b, false) && sum != checksum(b, true) {
		return nil, errHeader
	}
	hdr := &tar.Header{
		Typeflag: b[156],
		Name:     cString(b[0:100]),
		Linkname: cString(b[157:257]),
		Size:     p.numeric(b[124:136]),
		Mode:     p.numeric(b[100:108]),
		Uid:      int(p.numeric(b[108:116])),
		Gid:      int(p.numeric(b[116:124])),
		ModTime:  time.Unix(p.numeric(b[136:148]), 0),
	}
	// The formats archive/tar tells apart: ustar (and PAX), star (ustar
	// with a shorter prefix and a trailer), GNU (no prefix), v7.
	var prefix string
	magic, version := string(b[257:263]), string(b[263:265])
	ustar := magic == "ustar\x00"
	if ustar || (magic == "ustar " && version == " \x00") {
		hdr.Uname, hdr.Gname = cString(b[265:297]), cString(b[297:329])
		hdr.Devmajor, hdr.Devminor = p.numeric(b[329:337]), p.numeric(b[337:345])
	}
	switch {
	case ustar && string(b[508:512]) == "tar\x00":
		prefix = cString(b[345:476])
	case ustar:
		prefix = cString(b[345:500])
	}
	if prefix != "" {
		hdr.Name = prefix + "/" + hdr.Name
	}
	if p.err != nil {
		return nil, errHeader
	}
	return hdr, nil
}

// checksum sums a header block's bytes (unsigned, or signed as some old
// tars did), its checksum field counted as spaces.
func checksum(b *[blockSize]byte, signed bool) int64 {
	sum := int64(8 * ' ')
	for i, c := range b {
		if i >= 148 && i < 156 {
			continue
		}
		if signed {
			sum += int64(int8(c))
		} else {
			sum += int64(c)
		}
	}
	return sum
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// numParser parses tar's numeric fields as archive/tar does: octal
// (spaces and NULs around it allowed) or base-256 (high bit set).
type numParser struct{ err error }

func (p *numParser) numeric(b []byte) int64 {
	if len(b) > 0 && b[0]&0x80 != 0 {
		// Base-256, two's complement.
		var inv byte
		if b[0]&0x40 != 0 {
			inv = 0xff
		}
		var x uint64
		for i, c := range b {
			c ^= inv
			if i == 0 {
				c &= 0x7f
			}
			if x>>56 > 0 {
				p.err = errHeader
				return 0
			}
			x = x<<8 | uint64(c)
		}
		if x>>63 > 0 {
			p.err = errHeader
			return 0
		}
		if inv == 0xff {
			return ^int64(x)
		}
		return int64(x)
	}
	return p.octal(b)
}

// octal: spaces and NULs around the digits are allowed.
func (p *numParser) octal(b []byte) int64 {
	b = bytes.Trim(b, " \x00")
	if len(b) == 0 {
		return 0
	}
	if len(b) <= 21 { // < 2^63: the common case, without allocating
		var x int64
		for _, c := range b {
			if c < '0' || c > '7' {
				if c == 0 { // archive/tar stops at a NUL
					return x
				}
				p.err = errHeader
				return 0
			}
			x = x<<3 | int64(c-'0')
		}
		return x
	}
	x, err := strconv.ParseUint(cString(b), 8, 64)
	if err != nil {
		p.err = errHeader
	}
	return int64(x)
}

// parsePAX parses PAX records ("len key=value\n") as archive/tar does.
func parsePAX(b []byte) (map[string]string, error) {
	recs := map[string]string{}
	for len(b) > 0 {
		sp := bytes.IndexByte(b, ' ')
		if sp <= 0 {
			return nil, errHeader
		}
		n, err := strconv.ParseInt(string(b[:sp]), 10, 0)
		if err != nil || n < 5 || n > int64(len(b)) || n <= int64(sp)+1 {
			return nil, errHeader
		}
		rec := b[sp+1 : n]
		if rec[len(rec)-1] != '\n' {
			return nil, errHeader
		}
		rec = rec[:len(rec)-1]
		b = b[n:]
		eq := bytes.IndexByte(rec, '=')
		if eq < 0 {
			return nil, errHeader
		}
		k, v := string(rec[:eq]), string(rec[eq+1:])
		if !validPAXRecord(k, v) {
			return nil, errHeader
		}
		recs[k] = v
	}
	return recs, nil
}

func validPAXRecord(k, v string) bool {
	if k == "" || strings.IndexByte(k, '=') >= 0 {
		return false
	}
	switch k {
	case "path", "linkpath", "uname", "gname":
		return strings.IndexByte(v, 0) < 0
	}
	return strings.IndexByte(k, 0) < 0
}

var errSparse = errors.New("archive/tar: sparse files are not supported")

// applyPAX merges an extended header into hdr as archive/tar does (keys
// it knows set fields, every record is kept in PAXRecords).
func applyPAX(hdr *tar.Header, pax map[string]string) error {
	if len(pax) == 0 {
		return nil
	}
	hdr.PAXRecords = pax
	hdr.Format = tar.FormatPAX
	for k, v := range pax {
		if v == "" {
			continue // keeps the ustar value
		}
		var err error
		switch k {
		case "path":
			hdr.Name = v
		case "linkpath":
			hdr.Linkname = v
		case "uname":
			hdr.Uname = v
		case "gname":
			hdr.Gname = v
		case "uid":
			var id int64
			id, err = strconv.ParseInt(v, 10, 64)
			hdr.Uid = int(id)
		case "gid":
			var id int64
			id, err = strconv.ParseInt(v, 10, 64)
			hdr.Gid = int(id)
		case "size":
			hdr.Size, err = strconv.ParseInt(v, 10, 64)
		case "mtime":
			hdr.ModTime, err = parsePAXTime(v)
		case "atime", "ctime":
			_, err = parsePAXTime(v)
		default:
			if strings.HasPrefix(k, "GNU.sparse.") {
				return errSparse
			}
		}
		if err != nil {
			return errHeader
		}
	}
	return nil
}

// parsePAXTime parses "sec[.frac]" (a leading '-' allowed), as
// archive/tar does: fractions past nanoseconds are truncated.
func parsePAXTime(s string) (time.Time, error) {
	ss, sn, _ := strings.Cut(s, ".")
	secs, err := strconv.ParseInt(ss, 10, 64)
	if err != nil {
		return time.Time{}, errHeader
	}
	if sn == "" {
		return time.Unix(secs, 0), nil
	}
	for i := 0; i < len(sn); i++ {
		if sn[i] < '0' || sn[i] > '9' {
			return time.Time{}, errHeader
		}
	}
	if len(sn) < 9 {
		sn += strings.Repeat("0", 9-len(sn))
	}
	nsecs, _ := strconv.ParseInt(sn[:9], 10, 64)
	if len(ss) > 0 && ss[0] == '-' {
		return time.Unix(secs, -nsecs), nil
	}
	return time.Unix(secs, nsecs), nil
}
