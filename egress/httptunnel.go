package egress

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// maxChunkLine bounds a chunk-size line (size, extensions) or trailer line.
const maxChunkLine = 4 << 10

// errFraming: a request body that does not follow its declared framing.
var errFraming = errors.New("egress: malformed request body framing")

// relayHTTP forwards the client's side of a tunnel that carries HTTP/1:
// request after request (keep-alive, pipelining), each with its Host
// checked against the tunnel's host and its body framed so the next
// request is found; a virtual host other than the decided one cannot be
// reached on the same connection. After a request asking to upgrade, a
// stream that goes on with a client WebSocket frame is relayed opaque;
// anything else must again be a request. It returns a Reason when a
// request is refused, or the relay's error; ("", nil) at the client's EOF.
func (t *tunnel) relayHTTP(dst io.Writer, br *bufio.Reader, host string) (reason string, err error) {
	upgrade := false
	for {
		b, err := br.Peek(1)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return "", nil
			}
			return "", err
		}
		if upgrade {
			if b, err = br.Peek(2); err == nil && isClientWSFrame(b) {
				return "", t.pipe(dst, br)
			}
		}
		req, n, reason, err := checkHead(br, host)
		if err != nil {
			return "", nil // EOF before another request
		}
		if reason != "" {
			return reason, nil
		}
		head, _ := br.Peek(n)
		chunked, length, _ := framing(head)
		if _, err := dst.Write(head); err != nil {
			return "", err
		}
		_, _ = br.Discard(n)
		t.touch()
		switch {
		case chunked:
			err = t.relayChunked(dst, br)
		case length > 0:
			err = t.copyN(dst, br, length)
		}
		if errors.Is(err, errFraming) {
			return ReasonHTTPFraming, nil
		}
		if err != nil {
			return "", err
		}
		upgrade = req.Header.Get("Upgrade") != ""
	}
}

// isClientWSFrame: a WebSocket frame from a client has a known opcode and,
// always, the mask bit, which no byte of an HTTP method token has.
func isClientWSFrame(b []byte) bool {
	switch b[0] & 0x0f {
	case 0x0, 0x1, 0x2, 0x8, 0x9, 0xa:
		return b[1]&0x80 != 0
	}
	return false
}

// checkHead peeks the next request head and checks it: the Host rule and
// unambiguous framing. err is set only at a clean EOF before any byte.
func checkHead(br *bufio.Reader, host string) (req *http.Request, n int, reason string, err error) {
	req, n, err = readHTTPHead(br)
	if n > 0 {
		head, _ := br.Peek(n)
		if _, _, ok := framing(head); !ok {
			return nil, 0, ReasonHTTPFraming, nil
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) && br.Buffered() == 0 {
			return nil, 0, "", err
		}
		return nil, 0, ReasonNotHTTP, nil
	}
	return req, n, checkRequest(req, host), nil
}

// checkRequest applies the Host rule to one request in a tunnel: no proxy
// (absolute-form) request, and a Host naming the CONNECT host.
func checkRequest(req *http.Request, host string) string {
	if req.URL.IsAbs() || req.URL.Host != "" {
		return ReasonAbsoluteForm
	}
	h, _, err := splitHostPort(req.Host, 80)
	if err != nil {
		return ReasonHostMismatch
	}
	norm, _, err := normalizeHost(h)
	if err != nil || norm != host {
		return ReasonHostMismatch
	}
	return ""
}

// framing reads a request head's body framing the strict way, so that the
// proxy and any server agree on where the body ends: one Content-Length of
// digits, or Transfer-Encoding exactly "chunked", never both.
func framing(head []byte) (chunked bool, length int64, ok bool) {
	lines := bytes.Split(head, []byte("\r\n"))
	nCL, nTE := 0, 0
	for _, l := range lines[1:] {
		name, value, found := bytes.Cut(l, []byte(":"))
		if !found {
			continue
		}
		v := strings.TrimSpace(string(value))
		switch strings.ToLower(string(name)) {
		case "content-length":
			nCL++
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || strings.TrimLeft(v, "0123456789") != "" {
				return false, 0, false
			}
			length = n
		case "transfer-encoding":
			nTE++
			if !strings.EqualFold(v, "chunked") {
				return false, 0, false
			}
			chunked = true
		}
	}
	if nCL > 1 || nTE > 1 || (nCL > 0 && nTE > 0) {
		return false, 0, false
	}
	return chunked, length, true
}

// copyN forwards exactly n body bytes.
func (t *tunnel) copyN(dst io.Writer, src io.Reader, n int64) error {
	lr := &io.LimitedReader{R: src, N: n}
	err := t.pipe(dst, lr)
	if err == nil && lr.N > 0 {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// relayChunked forwards a chunked body as it is: size lines, data, the
// last chunk and the trailer section.
func (t *tunnel) relayChunked(dst io.Writer, br *bufio.Reader) error {
	for {
		line, err := readLine(br)
		if err != nil {
			return err
		}
		sizeText, _, _ := bytes.Cut(line[:len(line)-2], []byte(";"))
		size, err := strconv.ParseInt(strings.TrimSpace(string(sizeText)), 16, 64)
		if err != nil || size < 0 {
			return errFraming
		}
		if _, err := dst.Write(line); err != nil {
			return err
		}
		if size == 0 {
			break
		}
		if err := t.copyN(dst, br, size); err != nil {
			return err
		}
		crlf, err := readLine(br)
		if err != nil {
			return err
		}
		if len(crlf) != 2 {
			return errFraming
		}
		if _, err := dst.Write(crlf); err != nil {
			return err
		}
	}
	for { // trailer fields, then the empty line
		line, err := readLine(br)
		if err != nil {
			return err
		}
		if _, err := dst.Write(line); err != nil {
			return err
		}
		if len(line) == 2 {
			return nil
		}
	}
}

// readLine reads one CRLF-ended line (CRLF included) of at most
// maxChunkLine bytes; a bare LF or CR is errFraming.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		b, err := br.ReadSlice('\n')
		line = append(line, b...)
		if len(line) > maxChunkLine {
			return nil, errFraming
		}
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	if !crlfOnly(line, 0, false) {
		return nil, errFraming
	}
	return line, nil
}
