// Package egress will own the per-session forward proxy (elazarl/goproxy):
// the registry allowlist, the guarded dialer and the byte quota (issue 5).
// Today every sandbox has a network namespace with only a loopback device:
// no outbound network at all.
package egress
