// Package egress owns the sandboxes' only way out: a per-session HTTP
// forward proxy (plain requests through elazarl/goproxy, CONNECT tunnels
// handled here), the allowlist policy it decides with, the guarded dialer,
// and each session's byte quota and per-destination counters. A session
// is named by its key, the caller's choice (sandboxd passes the store's
// primary key of the session, never the client's sessionId).
//
// # Deciding
//
// Every plain request and every CONNECT is decided on its normalized host
// (Policy.Decide): lowercase, trailing dot dropped, IDNA to ASCII (invalid
// names refused); IP literals in any spelling — brackets, IPv4-mapped IPv6,
// and the numeric IPv4 forms 2130706433, 0x7f000001, 0177.0.0.1, 127.1 —
// become their address, and an address is allowed only if a rule names it.
// A missing port is 80 for requests and 443 for CONNECT. Only http:// is
// proxied as a request; https goes through CONNECT and the proxy
// terminates no TLS, with one exception below.
//
// # The paired Git host
//
// A session may be paired with one repository of one Git host
// (SessionOptions.Git). Its CONNECTs to that host:port are allowed by the
// pairing and terminated: the proxy answers with a certificate of the
// installation's CA (CA: name-constrained to that host, key on the server
// only; sandboxes trust it), reads each HTTP/1.1 request, and sends it on
// its own TLS connection, verified against GitRoots. Requests to the
// repository's smart-HTTP endpoints (info/refs, git-upload-pack,
// git-receive-pack) get the credential as HTTP Basic; every other request
// passes as the sandbox sent it. A receive-pack's ref-update commands are
// read before anything is forwarded: only updates and creations of the
// paired branch pass (ReasonGitPush otherwise). The sandbox never holds
// the credential, so it can use it only through the proxy, only for that
// repository. Other sessions and other hosts are not terminated. Requests the
// net/http server cannot parse (e.g. "CONNECT [a.test]:443") are answered
// 400 by it without an event.
//
// The dialer resolves names itself and refuses a name if any of its
// addresses is loopback, private, link-local (cloud metadata included),
// CGNAT, multicast, reserved or documentation space unless
// Config.AllowNetworks covers it; it dials the checked address, and
// net.Dialer.Control checks the socket's address again. Every connection
// resolves anew, so DNS rebinding gains nothing. Host proxy environment
// variables are never consulted.
//
// Inside a tunnel the client's first message is checked before anything
// is forwarded: to port 443 it must be a TLS ClientHello whose SNI equals
// the CONNECT host (reassembled across records; a missing SNI is refused;
// to an allowlisted IP the SNI, if any, must itself be allowed); to port
// 80 it must be a strict HTTP/1 request in origin form. On other ports TLS
// gets the SNI rule; otherwise the first non-blank line decides, since
// servers are lenient about request lines (Python's takes any whitespace,
// a leading blank line, version-less HTTP/0.9 lines whose headers it still
// reads; Node's takes RTSP/ and ICE/ versions): a line shaped like a
// request line (a token, whitespace, anything) must be a strict HTTP/1.x
// request line and makes the stream HTTP, so text protocols whose client
// speaks first in that shape (SMTP's EHLO, Redis commands with arguments)
// are refused on such ports; anything else (an SSH banner, a binary
// protocol) passes opaque, and the server's bytes flow meanwhile. A
// partial first line may reach the upstream before it is decided, never a
// whole request head. HTTP is relayed request
// by request: every request (keep-alive, pipelined) must parse strictly
// and name the CONNECT host exactly (ASCII case aside; no trailing dot, no
// other port); bodies are framed strictly (one Content-Length, or chunked,
// never both, no chunked on HTTP/1.0, none on GET, HEAD, DELETE, OPTIONS,
// TRACE, whose bodies servers may ignore and read as a request; chunk
// sizes in hex digits only, trailers only as fields; CRLF line ends only;
// no folded header lines; no "//host" targets), so a request hidden in a body stays data; and nothing goes
// opaque after an upgrade request, since the proxy does not see whether
// the upstream switched (WebSocket in a tunnel works as wss://). Plain
// HTTP refuses bodies on the same methods. Not covered: an upstream
// handler that answers a POST without reading its body (Python's
// http.server then reads the body as the next request); inside TLS
// nothing is seen (HTTP/2 authorities, ECH inner names, a Host behind the
// right SNI): those reach the same allowed destination.
//
// # Counting
//
// A session's bytes are counted on its accepted connections, both ways, in
// the data path: request and response heads, bodies, tunnel payloads,
// keep-alive, pipelining and upgrades alike. Bytes are claimed from the
// quota atomically before they are forwarded (client bytes read past it are
// dropped), so no number of parallel connections passes the limit; spliced
// downloads take reservations that stay clear of it. When the count reaches the limit
// every connection of the session is cut and Events.QuotaExceeded is
// called once; later connections get 403 "Egress quota exceeded" (the
// proxy's own refusals are not counted). Usage and Destinations
// report counts for the caller to persist; Serve takes the bytes already
// used, so a restarted session keeps its count.
//
// Every refusal calls Events.Denied and increments
// sandboxd_egress_denied_total{reason}. Nothing logs payloads or URLs.
//
// # Concurrency
//
// Policy is immutable. A Proxy is safe for concurrent use: each Serve call
// runs one session on the caller's goroutine and returns after Close,
// Shutdown or a listener failure; net/http gives each client connection a
// goroutine, and a tunnel adds one for its upstream-to-client half, which
// the connection's goroutine waits for. Close cuts a session without
// waiting; Shutdown cuts all and waits for every Serve and handler. Events
// are called synchronously from connection goroutines.
package egress
