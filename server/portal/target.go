package portal

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// Service is a program of the default image started on first use and
// reached under its own route.
type Service struct {
	Name  string // route and log name: "editor", ...
	Title string // for people: "VS Code", ...
	Port  int    // on the sandbox's loopback
	// Command is the launcher in the image; it runs in the foreground and
	// exits when any part of the service dies.
	Command string
	// KeepPrefix: the service is configured with its route as base path
	// (Jupyter's base_url), so the route is not stripped.
	KeepPrefix bool
	// Host, if set, replaces the Host header (Chromium's DevTools endpoint
	// answers only requests addressed to an IP or localhost).
	Host string
	// MinMemoryMiB is the smallest sandbox the service may start in: a
	// sandbox over its memory limit is killed whole, so a service that
	// cannot fit is refused instead.
	MinMemoryMiB int
	// MaxConns bounds the requests (WebSockets included) proxied to the
	// service at once (0: only the session's bound): websockify starts a
	// process per viewer, and a flood of them would exhaust the sandbox.
	MaxConns int
	// NoOrigin drops the Origin header (DevTools refuses WebSockets with an
	// Origin it was not told about; the portal has checked it already).
	NoOrigin bool
}

// Services are the convenience routes, by name. The launchers and ports
// are the image's (configs/image/services).
var Services = map[string]*Service{
	"editor": {Name: "editor", Title: "VS Code", Port: 13337, Command: "/opt/sandboxd/bin/service-editor",
		MinMemoryMiB: 2048},
	"notebook": {Name: "notebook", Title: "Jupyter", Port: 13338, Command: "/opt/sandboxd/bin/service-notebook", KeepPrefix: true},
	// The display's index.html opens noVNC with the WebSocket path under
	// whatever prefix it is served at.
	"display": {Name: "display", Title: "the display", Port: 13339, Command: "/opt/sandboxd/bin/service-display",
		MaxConns: 16},
	"browser": {Name: "browser", Title: "Chromium", Port: 13340, Command: "/opt/sandboxd/bin/service-browser",
		Host: "127.0.0.1:13340", NoOrigin: true},
}

// ServiceNames are the convenience routes in the order docs list them.
var ServiceNames = []string{"editor", "notebook", "display", "browser"}

// Target is where a proxy path leads inside one session.
type Target struct {
	Service *Service // nil for a plain port
	Port    int
	// Mount is the escaped external prefix the upstream does not see,
	// relative to the session's base ("/editor", "/port/8000"; "" when the
	// service keeps its prefix).
	Mount string
	// Path is the escaped path the upstream gets, always starting with "/".
	Path string
	// Redirect is set when the route's root was asked for without its
	// slash: where to send the client, relative to the session's base.
	Redirect string
}

// Errors of Parse; the caller maps them to a 404.
var (
	ErrNoRoute = errors.New("no such portal route")
	ErrBadPort = errors.New("port must be a number from 1 to 65535")
)

// Parse reads the escaped path under a session's base ("/editor/x",
// "/port/8000/y?..." without the query). The route and the port are read
// from their own escaped segments before anything else, and dot segments
// of the rest (also percent-encoded ones) are resolved within the rest, so
// no path reaches another route, port or session.
func Parse(escaped string) (Target, error) {
	if !strings.HasPrefix(escaped, "/") {
		return Target{}, ErrNoRoute
	}
	segs := strings.Split(escaped[1:], "/")
	var t Target
	var rest []string
	switch name := segs[0]; {
	case name == "port":
		if len(segs) < 2 || !plainNumber(segs[1]) {
			return Target{}, ErrBadPort
		}
		p, _ := strconv.Atoi(segs[1])
		t.Port, t.Mount, rest = p, "/port/"+segs[1], segs[2:]
		if len(segs) == 2 {
			t.Redirect = t.Mount + "/"
		}
	case Services[name] != nil:
		svc := Services[name]
		t.Service, t.Port, rest = svc, svc.Port, segs[1:]
		if !svc.KeepPrefix {
			t.Mount = "/" + name
		}
		if len(segs) == 1 {
			t.Redirect = "/" + name + "/"
		}
	default:
		return Target{}, ErrNoRoute
	}
	clean := resolveDots(rest)
	if t.Service != nil && t.Service.KeepPrefix {
		clean = "/" + t.Service.Name + clean
	}
	t.Path = clean
	return t, nil
}

// plainNumber: decimal digits only, no sign, no leading zero, no escapes.
func plainNumber(s string) bool {
	if s == "" || len(s) > 5 || s[0] == '0' {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	p, _ := strconv.Atoi(s)
	return p <= 65535
}

// resolveDots joins escaped segments into "/a/b", dropping "." and popping
// on ".." (either also percent-encoded), never above the first segment.
// A trailing slash is kept.
func resolveDots(segs []string) string {
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		last := i == len(segs)-1
		switch dotSegment(s) {
		case 1:
			if last {
				out = append(out, "")
			}
		case 2:
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/")
}

// dotSegment is 1 for ".", 2 for "..", 0 otherwise; percent-encoding is
// decoded once, as the upstream would.
func dotSegment(s string) int {
	d, err := url.PathUnescape(s)
	if err != nil {
		d = s
	}
	switch d {
	case ".":
		return 1
	case "..":
		return 2
	}
	return 0
}
