// Package web owns the browser console: its sources (src/, bundled from
// the locked npm packages by build.mjs into dist/) and the handler that
// serves the built files from the binary with the console's security
// headers. It imports no other sandboxd package; the console talks to the
// server only through the public API.
//
// Concurrency: the handler is read-only after init and safe for concurrent
// use.
package web
