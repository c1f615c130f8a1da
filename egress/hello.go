package egress

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
)

// inspectBufSize bounds what the proxy reads ahead of forwarding in a
// tunnel: the whole ClientHello or HTTP request head must fit. Real
// ClientHellos are a few KB (post-quantum key shares included).
const inspectBufSize = 32 << 10

const (
	recordHandshake   = 22
	handshakeHello    = 1
	maxRecordPayload  = 1 << 14
	extServerName     = 0
	serverNameHost    = 0
	recordHeaderBytes = 5
)

var (
	errNotTLS      = errors.New("not a TLS handshake record")
	errBadHello    = errors.New("malformed ClientHello")
	errHelloTooBig = errors.New("ClientHello too large")
)

// readClientHello peeks (never consumes) TLS handshake records from br
// until the first handshake message is complete, reassembling it across
// fragmented records, and returns the SNI host name if there is one.
func readClientHello(br *bufio.Reader) (sni string, has bool, err error) {
	var msg []byte
	off := 0
	for {
		hdr, err := br.Peek(off + recordHeaderBytes)
		if err != nil {
			return "", false, peekErr(err)
		}
		h := hdr[off:]
		if h[0] != recordHandshake {
			if off == 0 {
				return "", false, errNotTLS
			}
			return "", false, errBadHello // e.g. an alert or CCS mid-hello
		}
		n := int(h[3])<<8 | int(h[4])
		if h[1] != 3 || n == 0 || n > maxRecordPayload {
			return "", false, errBadHello
		}
		rec, err := br.Peek(off + recordHeaderBytes + n)
		if err != nil {
			return "", false, peekErr(err)
		}
		msg = append(msg, rec[off+recordHeaderBytes:]...)
		off += recordHeaderBytes + n
		if len(msg) < 4 {
			continue
		}
		if msg[0] != handshakeHello {
			return "", false, errBadHello
		}
		mlen := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
		if mlen > inspectBufSize {
			return "", false, errHelloTooBig
		}
		if len(msg) >= 4+mlen {
			return parseClientHello(msg[4 : 4+mlen])
		}
	}
}

func peekErr(err error) error {
	if errors.Is(err, bufio.ErrBufferFull) {
		return errHelloTooBig
	}
	return err
}

// cursor reads big-endian fields; any overrun sets bad.
type cursor struct {
	b   []byte
	bad bool
}

func (c *cursor) bytes(n int) []byte {
	if c.bad || n < 0 || n > len(c.b) {
		c.bad = true
		return nil
	}
	v := c.b[:n]
	c.b = c.b[n:]
	return v
}

func (c *cursor) u8() int {
	v := c.bytes(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (c *cursor) u16() int {
	v := c.bytes(2)
	if v == nil {
		return 0
	}
	return int(v[0])<<8 | int(v[1])
}

// parseClientHello reads just enough of a ClientHello body (RFC 8446 4.1.2)
// to find the server_name extension (RFC 6066 3).
func parseClientHello(body []byte) (string, bool, error) {
	c := &cursor{b: body}
	c.bytes(2)  // legacy_version
	c.bytes(32) // random
	if sid := c.u8(); sid > 32 {
		return "", false, errBadHello
	} else {
		c.bytes(sid)
	}
	cs := c.u16()
	if cs < 2 || cs%2 != 0 {
		return "", false, errBadHello
	}
	c.bytes(cs)
	comp := c.u8()
	if comp < 1 {
		return "", false, errBadHello
	}
	c.bytes(comp)
	if c.bad {
		return "", false, errBadHello
	}
	if len(c.b) == 0 {
		return "", false, nil // no extensions at all
	}
	exts := &cursor{b: c.bytes(c.u16())}
	if c.bad || len(c.b) != 0 {
		return "", false, errBadHello
	}
	sni, has := "", false
	for len(exts.b) > 0 {
		typ := exts.u16()
		data := exts.bytes(exts.u16())
		if exts.bad {
			return "", false, errBadHello
		}
		if typ != extServerName {
			continue
		}
		if has {
			return "", false, errBadHello // duplicate extension
		}
		name, err := parseServerName(data)
		if err != nil {
			return "", false, err
		}
		sni, has = name, name != ""
	}
	return sni, has, nil
}

func parseServerName(data []byte) (string, error) {
	c := &cursor{b: data}
	list := &cursor{b: c.bytes(c.u16())}
	if c.bad || len(c.b) != 0 {
		return "", errBadHello
	}
	name := ""
	for len(list.b) > 0 {
		typ := list.u8()
		v := list.bytes(list.u16())
		if list.bad {
			return "", errBadHello
		}
		if typ == serverNameHost {
			if name != "" || len(v) == 0 {
				return "", errBadHello
			}
			name = string(v)
		}
	}
	return name, nil
}

// readHTTPHead peeks (never consumes) a complete HTTP/1 request head and
// parses it; n is the head's length in bytes (also when a complete head
// does not parse). It fails when the head is not
// complete within inspectBufSize, has a line not ended by CRLF (a bare CR or
// LF, which servers split differently), or does not parse as an HTTP/1
// request.
func readHTTPHead(br *bufio.Reader) (req *http.Request, n int, err error) {
	want, seen := 1, 0 // bytes already scanned, so a trickled head costs O(n)
	for {
		if _, err := br.Peek(want); err != nil { // wait for more bytes
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, 0, errBadHello
			}
			return nil, 0, err
		}
		b, _ := br.Peek(br.Buffered())
		from := max(0, seen-3)
		if end := bytes.Index(b[from:], []byte("\r\n\r\n")); end >= 0 {
			head := b[:from+end+4]
			if !crlfOnly(head, max(0, seen-1), false) {
				return nil, 0, errBadHello
			}
			req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
			if err != nil {
				return nil, len(head), err
			}
			return req, len(head), nil
		}
		if !crlfOnly(b, max(0, seen-1), true) {
			return nil, 0, errBadHello
		}
		seen = len(b)
		want = len(b) + 1
	}
}

// crlfOnly reports whether every CR and LF in b[from:] is part of a CRLF
// pair; partial allows a last CR whose LF has not arrived yet.
func crlfOnly(b []byte, from int, partial bool) bool {
	for i := from; i < len(b); i++ {
		switch b[i] {
		case '\r':
			if i+1 == len(b) {
				return partial
			}
			if b[i+1] != '\n' {
				return false
			}
		case '\n':
			if i == 0 || b[i-1] != '\r' {
				return false
			}
		}
	}
	return true
}
