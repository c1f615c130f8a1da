// Package errdefs defines the error classes that sandboxd's domain packages
// return and the HTTP edge maps to status codes (server.statusOf, the only
// place that knows HTTP). A class is a sentinel; an *Error carries one class,
// a public message (shown to clients, so never argv, host paths, env values or
// runsc output) and optionally a more specific contract code and a cause that
// is only logged.
//
// Concurrency: values are immutable once built.
package errdefs

import (
	"errors"
	"fmt"
)

// The classes. Match them with errors.Is.
var (
	ErrInvalid         = errors.New("invalid")              // the request is wrong (400)
	ErrUnauthenticated = errors.New("unauthenticated")      // no valid credential (401)
	ErrNoCredits       = errors.New("insufficient credits") // the organization's credits do not cover it (402)
	ErrForbidden       = errors.New("forbidden")            // the role may not (403)
	ErrNotFound        = errors.New("not found")            // no such thing, or another organization's (404)
	ErrMethod          = errors.New("method not allowed")   // 405
	ErrConflict        = errors.New("conflict")             // wrong state, or already used (409)
	ErrPrecondition    = errors.New("precondition failed")  // a prerequisite is missing (412)
	ErrUnprocessable   = errors.New("unprocessable")        // understood, but it could not be done with this input (422)
	ErrTooLarge        = errors.New("too large")            // a body over its limit (413)
	ErrRateLimited     = errors.New("rate limited")         // too many at once (429)
	ErrNoSpace         = errors.New("insufficient storage") // a sandbox's disk is full, a storage quota reached (507)
	ErrUnavailable     = errors.New("unavailable")          // capacity, shutdown, a failed start (503)
	ErrBadGateway      = errors.New("bad gateway")          // nothing answered inside the sandbox (502)
)

// Error is an error a client may see.
type Error struct {
	class error
	code  string // contract code when more specific than the class's
	msg   string
	cause error // logged by the edge, never shown
	// details are public facts a client can act on (the numbers of a 402).
	details map[string]any
	// retryAfter (seconds, 0 = none): the edge's Retry-After header.
	retryAfter int
}

func (e *Error) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

// Unwrap makes errors.Is see the class and the cause.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.class, e.cause}
	}
	return []error{e.class}
}

// Class is the error's class sentinel.
func (e *Error) Class() error { return e.class }

// Code is the contract code ("" means the class's own).
func (e *Error) Code() string { return e.code }

// Message is the public text.
func (e *Error) Message() string { return e.msg }

// Cause is the underlying error, for the log only.
func (e *Error) Cause() error { return e.cause }

// WithCode returns a copy with a contract code more specific than the
// class's (e.g. "invalid_path" for ErrInvalid).
func (e *Error) WithCode(code string) *Error {
	c := *e
	c.code = code
	return &c
}

// WithDetails returns a copy with public details for the error body.
func (e *Error) WithDetails(d map[string]any) *Error {
	c := *e
	c.details = d
	return &c
}

// Details are the public details (nil: none).
func (e *Error) Details() map[string]any { return e.details }

// WithRetryAfter returns a copy the edge answers with Retry-After: seconds
// (when a retry may succeed: a limit that frees as others' work ends).
func (e *Error) WithRetryAfter(seconds int) *Error {
	c := *e
	c.retryAfter = seconds
	return &c
}

// RetryAfter is the Retry-After in seconds (0: none).
func (e *Error) RetryAfter() int { return e.retryAfter }

// WithCause returns a copy that records cause for the log.
func (e *Error) WithCause(cause error) *Error {
	c := *e
	c.cause = cause
	return &c
}

// New builds an error of class with a formatted public message.
func New(class error, format string, args ...any) *Error {
	return &Error{class: class, msg: fmt.Sprintf(format, args...)}
}

// Invalid is an ErrInvalid error.
func Invalid(format string, args ...any) *Error { return New(ErrInvalid, format, args...) }

// NotFound is an ErrNotFound error.
func NotFound(format string, args ...any) *Error { return New(ErrNotFound, format, args...) }

// Conflict is an ErrConflict error.
func Conflict(format string, args ...any) *Error { return New(ErrConflict, format, args...) }

// Forbidden is an ErrForbidden error.
func Forbidden(format string, args ...any) *Error { return New(ErrForbidden, format, args...) }

// RateLimited is an ErrRateLimited error.
func RateLimited(format string, args ...any) *Error { return New(ErrRateLimited, format, args...) }

// NoSpace is an ErrNoSpace error.
func NoSpace(format string, args ...any) *Error { return New(ErrNoSpace, format, args...) }

// Unavailable is an ErrUnavailable error.
func Unavailable(format string, args ...any) *Error { return New(ErrUnavailable, format, args...) }

// Public finds the *Error in err's chain.
func Public(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
