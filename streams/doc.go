// Package streams will own output fan-out: the streaming secret scrubber,
// ring buffers for terminal replay and the WebSocket pumps (issues 3 and 4).
// Today REST exec output is buffered and redacted in package server.
package streams
