// Package streams owns output fan-out: Hub (one stream to many viewers,
// with replay and per-viewer bounded queues) and, in streams/scrub, the
// streaming secret scrubber every output path passes through.
package streams
