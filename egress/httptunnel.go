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
// reached on the same connection. skip bytes of the first request head
// were forwarded already (see relaySniffed). Nothing after an upgrade
// request goes opaque: the proxy does not see whether the upstream
// switched protocols, so what follows must still be requests (WebSocket
// inside a CONNECT works over TLS, wss://). It returns a Reason when a
// request is refused, or the relay's error; ("", nil) at the client's EOF.
func (t *tunnel) relayHTTP(dst io.Writer, br *bufio.Reader, skip int) (reason string, err error) {
	for {
		if _, err := br.Peek(1); err != nil {
			if errors.Is(err, io.EOF) {
				return "", nil
			}
			return "", err
		}
		n, chunked, length, reason, err := checkHead(br, t.host, t.port)
		if err != nil {
			return "", nil // EOF before another request
		}
		if reason != "" {
			return reason, nil
		}
		head, _ := br.Peek(n)
		if _, err := dst.Write(head[min(skip, n):]); err != nil {
			return "", err
		}
		skip = 0
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
	}
}

// maxRequestLine: no common server takes a longer first line as a request
// line (Go's 1 MiB header limit, Node's 16 KiB, Python's 64 KiB).
const maxRequestLine = 1<<20 + 64<<10

// relaySniffed forwards the client's side of a tunnel to a port other than
// 80 and 443 that did not start with TLS. Servers are lenient about request
// lines (Python's takes any whitespace, non-ASCII targets and blank lines
// first), so the stream is taken for HTTP by what every HTTP/1 request line
// has: "HTTP/" in its first non-blank line. Until that line ends its bytes
// flow (a protocol that sends a few bytes and waits is not held up; no
// server acts on a request before its head is complete); a line with
// "HTTP/" then makes the whole head, and every request after it, go through
// relayHTTP's checks, and a line without it makes the rest opaque.
func (t *tunnel) relaySniffed(dst io.Writer, br *bufio.Reader) (reason string, err error) {
	var sent []byte // bytes of the current line already forwarded (up to inspectBufSize)
	lineLen := 0
	sawHTTP, blank := false, true
	var edge []byte // the last bytes forwarded, to find "HTTP/" across reads
	for {
		if _, err := br.Peek(1); err != nil {
			if errors.Is(err, io.EOF) {
				return "", nil
			}
			return "", err
		}
		b, _ := br.Peek(br.Buffered())
		i := bytes.IndexByte(b, '\n')
		seg := b
		if i >= 0 {
			seg = b[:i+1]
		}
		scan := append(edge, seg...)
		sawHTTP = sawHTTP || containsFold(scan, "http/")
		blank = blank && isBlankLine(seg)
		if i < 0 || blank {
			// The line goes on (or is blank, which servers skip): forward.
			if lineLen += len(seg); lineLen <= inspectBufSize {
				sent = append(sent, seg...)
			}
			edge = append(edge[:0], scan[max(0, len(scan)-4):]...)
			if _, err := dst.Write(seg); err != nil {
				return "", err
			}
			_, _ = br.Discard(len(seg))
			t.touch()
			if i >= 0 { // a blank line ended: the next one decides
				sent, lineLen, sawHTTP, edge = sent[:0], 0, false, edge[:0]
			} else if lineLen > maxRequestLine && !sawHTTP {
				return "", t.pipe(dst, br)
			}
			continue
		}
		if !sawHTTP {
			return "", t.pipe(dst, br) // not an HTTP/1 request: opaque from here
		}
		if lineLen > inspectBufSize {
			return ReasonBadHello, nil
		}
		if len(sent) == 0 {
			return t.relayHTTP(dst, br, 0)
		}
		// Part of the request line went out before it was complete: check
		// the whole head, forwarding only the rest.
		whole := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(sent)), br), 2*inspectBufSize)
		return t.relayHTTP(dst, whole, len(sent))
	}
}

func asciiLower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// isBlankLine: only characters some server (Python's str.split) takes for
// whitespace, so it skips the line before a request.
func isBlankLine(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0:
		default:
			return false
		}
	}
	return true
}

// containsFold reports whether b contains lower (ASCII lower case) in any
// ASCII case.
func containsFold(b []byte, lower string) bool {
	for i := 0; i+len(lower) <= len(b); i++ {
		j := 0
		for j < len(lower) && asciiLower(b[i+j]) == lower[j] {
			j++
		}
		if j == len(lower) {
			return true
		}
	}
	return false
}

// checkHead peeks the next request head and checks it: the Host rule and
// unambiguous framing (see framing; and no body on a method whose body
// servers commonly ignore, which would then read it as another request).
// n is the head's length; err is set only at a clean EOF before any byte.
func checkHead(br *bufio.Reader, host string, port int) (n int, chunked bool, length int64, reason string, err error) {
	req, n, err := readHTTPHead(br)
	if n > 0 {
		head, _ := br.Peek(n)
		var ok bool
		if chunked, length, ok = framing(head); !ok {
			return 0, false, 0, ReasonHTTPFraming, nil
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) && br.Buffered() == 0 {
			return 0, false, 0, "", err
		}
		return 0, false, 0, ReasonNotHTTP, nil
	}
	if chunked && !req.ProtoAtLeast(1, 1) { // HTTP/1.0 servers ignore Transfer-Encoding
		return 0, false, 0, ReasonHTTPFraming, nil
	}
	if (chunked || length > 0) && bodiless(req.Method) {
		return 0, false, 0, ReasonHTTPFraming, nil
	}
	return n, chunked, length, checkRequest(req, host, port), nil
}

// bodiless: methods whose body many servers never read.
func bodiless(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodDelete, http.MethodOptions, http.MethodTrace, http.MethodConnect:
		return true
	}
	return false
}

// checkRequest applies the Host rule to one request in a tunnel: no proxy
// (absolute-form) request, and a Host that is the CONNECT host exactly
// (ASCII case aside), with no port or the CONNECT port: forms that only
// normalize to it (a trailing dot, full-width letters) may be routed
// differently upstream.
func checkRequest(req *http.Request, host string, port int) string {
	if req.URL.IsAbs() || req.URL.Host != "" {
		return ReasonAbsoluteForm
	}
	h, p, err := splitHostPort(req.Host, port)
	if err != nil || p != port || !strings.EqualFold(h, host) {
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
