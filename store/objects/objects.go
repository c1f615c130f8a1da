// Package objects is the organizations' storage: named objects (a saved
// workspace is one) kept per organization behind a small Backend interface.
// Dir, a directory per organization under the data dir, is the one
// implementation today; an S3-compatible backend is a second one (see
// docs/ARCHITECTURE.md, "Storage"): Put is a multipart upload whose
// checksum is computed while streaming and checked by the service, Get a
// ranged GET verified at EOF, List a prefix listing, and leftover uploads
// are aborted by a lifecycle rule instead of Dir's sweep at open.
//
// Guarantees every Backend gives: Put is atomic (readers see the old object
// or the complete new one, never a part, also across a crash or kill -9 of
// the process) and durable when it returns; the Info it returns carries the
// object's size and SHA-256, computed from the bytes written; Get's reader
// fails at EOF (never silently) when the bytes read do not match the
// recorded checksum or size. Names are validated: relative, slash-separated
// segments of [A-Za-z0-9._-], no "." or "..", so no name reaches outside
// its organization.
//
// Concurrency: a Backend is safe for concurrent use. Concurrent Puts of the
// same name are each atomic; the last rename wins. Callers serialise what
// must be (the Manager holds the session's lock around a save).
package objects

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"
)

// Info describes a stored object.
type Info struct {
	Name    string
	Size    int64
	SHA256  string // hex
	ModTime time.Time
	// Damaged: List found the object unreadable (its header or size
	// wrong); Size is then what it takes, SHA256 is empty, and Get fails
	// with ErrCorrupt.
	Damaged bool
}

// Backend stores an organization's objects.
type Backend interface {
	// Put stores r's bytes under name, atomically, replacing an existing
	// object only once the new one is complete and durable. A reader error
	// (or ctx's end) aborts it and leaves no trace.
	Put(ctx context.Context, org, name string, r io.Reader) (Info, error)
	// Get opens an object; the reader's Read returns ErrCorrupt instead of
	// io.EOF if the bytes do not match the object's checksum.
	Get(ctx context.Context, org, name string) (io.ReadCloser, Info, error)
	// Stat describes an object; ErrNotFound if there is none.
	Stat(ctx context.Context, org, name string) (Info, error)
	// Delete removes an object; deleting a missing one is not an error.
	Delete(ctx context.Context, org, name string) error
	// List describes an organization's objects whose names start with
	// prefix ("" for all), sorted by name; a damaged one is listed as such
	// (Info.Damaged), never an error.
	List(ctx context.Context, org, prefix string) ([]Info, error)
}

var (
	// ErrNotFound: no such object.
	ErrNotFound = errors.New("objects: no such object")
	// ErrCorrupt: an object's bytes do not match its checksum.
	ErrCorrupt = errors.New("objects: object does not match its checksum")
	// ErrInvalidName: a name or organization id that is not allowed.
	ErrInvalidName = errors.New("objects: invalid name")
)

// Used is the bytes an organization's objects take (the sum of their sizes).
func Used(ctx context.Context, b Backend, org string) (int64, error) {
	list, err := b.List(ctx, org, "")
	if err != nil {
		return 0, err
	}
	var n int64
	for _, o := range list {
		n += o.Size
	}
	return n, nil
}

// ValidName reports whether name is a valid object name: 1-512 bytes of
// slash-separated segments of [A-Za-z0-9._-], none empty, "." or "..", none
// starting with ".tmp-" (Dir's temporary files).
func ValidName(name string) bool {
	if name == "" || len(name) > 512 {
		return false
	}
	for _, seg := range strings.Split(name, "/") {
		if !validSegment(seg) || strings.HasPrefix(seg, tmpPrefix) {
			return false
		}
	}
	return true
}

func validSegment(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
