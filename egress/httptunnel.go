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
// lines: Python's takes any whitespace, a leading blank line and version-less
// (HTTP/0.9) lines whose headers it still reads; Node's takes RTSP/ and ICE/
// versions. So the first non-blank line counts as a request line when it is
// shaped like one: a token, whitespace, then anything. Such a line must turn
// out a strict HTTP/1 request, whose head, like every request after it, then
// passes relayHTTP's checks; any other line (SSH's banner, binary protocols)
// makes the rest opaque. Until the line is decided its bytes flow, so a
// protocol that sends a few bytes and waits is not held up; once it is
// shaped like a request line (a token, whitespace, more) the rest of it is
// held until it ends, so no server sees a partial one (Python's serves one
// at EOF).
func (t *tunnel) relaySniffed(dst io.Writer, br *bufio.Reader) (reason string, err error) {
	const (
		lead   = iota // whitespace before the first token (a blank line if it ends)
		token         // the method token
		gap           // whitespace after it
		shaped        // a request line: held back until it ends and is checked
	)
	state := lead
	var sent []byte // the current line's bytes already forwarded (up to inspectBufSize)
	var tok []byte  // the token's first bytes (to tell an SSH banner)
	lineLen, held := 0, 0
read:
	for {
		if _, err := br.Peek(held + 1); err != nil {
			switch {
			case errors.Is(err, bufio.ErrBufferFull): // a request line longer than any head we take
				return ReasonBadHello, nil
			case errors.Is(err, io.EOF): // what is held is dropped: a partial request line is never sent
				return "", nil
			}
			return "", err
		}
		b, _ := br.Peek(br.Buffered())
		for i := held; i < len(b); i++ {
			c := b[i]
			switch {
			case c == '\n' && state == shaped:
				line := append(bytes.Clone(sent), b[:i+1]...)
				if !strictRequestLine(line) {
					if bytes.HasPrefix(tok, []byte("SSH-")) && !bytes.Contains(line, []byte("HTTP/")) {
						return "", t.pipe(dst, br) // an SSH banner with a comment
					}
					return ReasonNotHTTP, nil
				}
				if len(sent) == 0 {
					return t.relayHTTP(dst, br, 0)
				}
				// The line's start went out while undecided: check the
				// whole head, forwarding only the rest.
				whole := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(sent)), br), 2*inspectBufSize)
				return t.relayHTTP(dst, whole, len(sent))
			case c == '\n' && state == lead: // a blank line, which servers skip
				if err := t.forward(dst, br, i+1); err != nil {
					return "", err
				}
				sent, lineLen = sent[:0], 0
				continue read
			case c == '\n':
				return "", t.pipe(dst, br) // a single token: not a request line
			case state == lead && isSpace(c):
			case state == lead && isTokenChar(c):
				state, tok = token, append(tok, c)
			case state == token && isTokenChar(c):
				if len(tok) < 4 {
					tok = append(tok, c)
				}
			case state == token && isSpace(c):
				state = gap
			case state == gap && isSpace(c):
			case state == gap:
				// Shaped like a request line: what came before may go (a
				// token and spaces are no request to any server), the rest
				// waits for the line's end.
				state = shaped
				if lineLen += i; lineLen <= inspectBufSize {
					sent = append(sent, b[:i]...)
				}
				if err := t.forward(dst, br, i); err != nil {
					return "", err
				}
				held = 1
				continue read
			case state == shaped:
			default: // a byte no request line has here
				return "", t.pipe(dst, br)
			}
		}
		if state == shaped {
			held = len(b)
			continue
		}
		// Undecided: forward what is here, so a protocol that sends a few
		// bytes and waits is not held up.
		if lineLen += len(b); lineLen <= inspectBufSize {
			sent = append(sent, b...)
		}
		if err := t.forward(dst, br, len(b)); err != nil {
			return "", err
		}
		if lineLen > maxRequestLine { // longer than any server's request line
			return "", t.pipe(dst, br)
		}
	}
}

// strictRequestLine: "METHOD SP target SP HTTP/1.x CRLF" and nothing else.
func strictRequestLine(l []byte) bool {
	l, ok := bytes.CutSuffix(l, []byte("\r\n"))
	if !ok {
		return false
	}
	method, rest, ok := bytes.Cut(l, []byte(" "))
	if !ok || len(method) == 0 || bytes.ContainsFunc(method, func(r rune) bool { return r > 0x7f || !isTokenChar(byte(r)) }) {
		return false
	}
	target, version, ok := bytes.Cut(rest, []byte(" "))
	if !ok || len(target) == 0 || bytes.ContainsFunc(target, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return false
	}
	return string(version) == "HTTP/1.1" || string(version) == "HTTP/1.0"
}

// forward writes the next n buffered bytes of br to dst.
func (t *tunnel) forward(dst io.Writer, br *bufio.Reader, n int) error {
	b, _ := br.Peek(n)
	if _, err := dst.Write(b); err != nil {
		return err
	}
	_, _ = br.Discard(n)
	t.touch()
	return nil
}

// isSpace: what Python's str.split takes for whitespace (on a latin-1
// line), a superset of what other servers do.
func isSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0:
		return true
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
	if req.URL.IsAbs() || req.URL.Host != "" || strings.HasPrefix(req.RequestURI, "//") {
		return ReasonAbsoluteForm // "//host/path" too: a URL resolved against a base takes its host
	}
	h, p, err := splitHostPort(req.Host, port)
	if err != nil || p != port || !strings.EqualFold(h, host) {
		return ReasonHostMismatch
	}
	return ""
}

// framing reads a request head's body framing the strict way, so that the
// proxy and any server agree on where the body ends: one Content-Length of
// digits, or Transfer-Encoding exactly "chunked", never both. A folded
// header line (obs-fold: one starting with a space or tab) is refused too:
// servers read it as part of the line before, as a header of its own
// ("Host", say) or not at all.
func framing(head []byte) (chunked bool, length int64, ok bool) {
	lines := bytes.Split(head, []byte("\r\n"))
	nCL, nTE := 0, 0
	for _, l := range lines[1:] {
		if len(l) > 0 && (l[0] == ' ' || l[0] == '\t') {
			return false, 0, false
		}
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
		// Hex digits only (no sign, no spaces), then optional extensions:
		// the strictest reading, which every server shares.
		sizeText, _, _ := bytes.Cut(line[:len(line)-2], []byte(";"))
		if len(sizeText) == 0 || len(sizeText) > 15 || bytes.ContainsFunc(sizeText, func(r rune) bool {
			return !('0' <= r && r <= '9' || 'a' <= r && r <= 'f' || 'A' <= r && r <= 'F')
		}) {
			return errFraming
		}
		size, err := strconv.ParseInt(string(sizeText), 16, 64)
		if err != nil {
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
		// Each must be a field ("name: value"): a server that skips
		// trailers by lines must not find a request among them.
		if len(line) > 2 {
			name, _, ok := bytes.Cut(line, []byte(":"))
			if !ok || len(name) == 0 || bytes.ContainsFunc(name, func(r rune) bool { return r > 0x7f || !isTokenChar(byte(r)) }) {
				return errFraming
			}
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
