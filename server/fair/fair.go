// Package fair keeps one client of the API from taking what all clients
// share. Conns caps the connections one client (an address) holds open,
// and when the server's own cap is reached it closes an idle connection of
// the heaviest client to make room, never an active one. Requests gives
// each key (an address, or a token) a request rate (a token bucket) and a
// cap on requests in flight. The package knows keys and counts, not HTTP:
// server/listen.go and server/fair.go say who a client is and answer 429.
//
// Concurrency: Conns and Requests are safe for concurrent use. Each guards
// its state with one mutex, held for bookkeeping only (never across I/O:
// a connection to close is handed back to the caller).
package fair

import (
	"net/netip"
)

// AddrKey is the client key of an address: the address itself, except
// that an IPv6 address stands for its /64 (one host usually has a whole
// /64, so counting addresses would not count clients). IPv4-mapped
// addresses are IPv4.
func AddrKey(a netip.Addr) string {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.WithZone("").Prefix(64)
		return p.String()
	}
	return a.String()
}
