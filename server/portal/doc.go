// Package portal owns the way into a sandbox from a browser or an API
// client: a reverse proxy (HTTP, streaming bodies, WebSocket upgrades) to a
// port on a sandbox's loopback, reached only through the sandbox's agent
// (Dialer), and the on-demand services behind the convenience routes
// (editor, notebook, display, browser), which it starts through the agent,
// restarts when they crash and stops with the sandbox.
//
// It also owns what keeps content served by a sandbox off the API's origin:
// the parsing of proxy paths (a path never reaches another port or session),
// the signed portal cookie that is valid on one session's portal origin
// only, and the checks that refuse requests another origin made with it.
// Who may use a session, and which session a request names, is decided by
// the caller (server) before Serve.
//
// Concurrency: a Portal is safe for concurrent use. Each running service has
// one supervising goroutine, owned by the Portal: StopSession ends a
// session's, Close ends them all and waits. Proxied connections are owned by
// the requests that carry them.
package portal
