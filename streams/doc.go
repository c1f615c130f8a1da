// Package streams owns output fan-out: Hub (one stream to many viewers,
// with replay and per-viewer bounded queues), WSConn (one WebSocket's single
// writer with pings and deadlines, and its reader's deadline) and, in
// streams/scrub, the streaming secret scrubber every output path passes
// through. Each type states its own concurrency contract.
package streams
