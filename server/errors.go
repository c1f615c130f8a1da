package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"sandboxd/server/errdefs"
	"sandboxd/store"
)

// statusOf is the one map from error classes (errdefs) to HTTP: the status
// and the contract code of the error body. An error without a public class
// is internal (500, logged with the request id, never shown).
func statusOf(err error) (status int, code, msg string) {
	pe, ok := errdefs.Public(err)
	if !ok && store.IsDiskFull(err) {
		// The database (or a file beside it) could not be written.
		pe, ok = errdefs.Unavailable("this server's disk is full; retry later"), true
	}
	if !ok {
		return http.StatusInternalServerError, "internal", "internal error; see the server log with this request id"
	}
	for _, c := range classes {
		if errors.Is(pe.Class(), c.class) {
			code = c.code
			if pe.Code() != "" {
				code = pe.Code()
			}
			return c.status, code, pe.Message()
		}
	}
	return http.StatusInternalServerError, "internal", "internal error; see the server log with this request id"
}

var classes = []struct {
	class  error
	status int
	code   string
}{
	{errdefs.ErrInvalid, http.StatusBadRequest, "invalid_request"},
	{errdefs.ErrUnauthenticated, http.StatusUnauthorized, "unauthenticated"},
	{errdefs.ErrNoCredits, http.StatusPaymentRequired, "insufficient_credits"},
	{errdefs.ErrForbidden, http.StatusForbidden, "forbidden"},
	{errdefs.ErrNotFound, http.StatusNotFound, "not_found"},
	{errdefs.ErrMethod, http.StatusMethodNotAllowed, "method_not_allowed"},
	{errdefs.ErrConflict, http.StatusConflict, "conflict"},
	{errdefs.ErrPrecondition, http.StatusPreconditionFailed, "precondition_failed"},
	{errdefs.ErrTooLarge, http.StatusRequestEntityTooLarge, "too_large"},
	{errdefs.ErrUnprocessable, http.StatusUnprocessableEntity, "unprocessable"},
	{errdefs.ErrRateLimited, http.StatusTooManyRequests, "rate_limited"},
	{errdefs.ErrNoSpace, http.StatusInsufficientStorage, "insufficient_storage"},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
	{errdefs.ErrBadGateway, http.StatusBadGateway, "bad_gateway"},
}

// Errors of the edge itself.
var (
	errUnauthenticated  = errdefs.New(errdefs.ErrUnauthenticated, "missing, unknown or revoked bearer token")
	errNotFound         = errdefs.NotFound("no such session")
	errInvalidSessionID = errdefs.Invalid("sessionId: 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit").
				WithCode("invalid_session_id")
)

// tooLarge is a request body over limit bytes (413).
func tooLarge(limit int64) error {
	return errdefs.New(errdefs.ErrTooLarge, "request body is too large: this request takes at most %s", humanSize(limit))
}

// humanSize prints a byte count in the largest binary unit that divides it.
func humanSize(n int64) string {
	for _, u := range []struct {
		div  int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n >= u.div && n%u.div == 0 {
			return fmt.Sprintf("%d %s", n/u.div, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

func badRequest(format string, args ...any) error { return errdefs.Invalid(format, args...) }

func forbidden(perm string) error {
	return errdefs.Forbidden("your role lacks the %s permission", perm)
}

type errorBody struct {
	Error struct {
		Code      string         `json:"code"`
		Message   string         `json:"message"`
		RequestID string         `json:"requestId"`
		Details   map[string]any `json:"details,omitempty"`
	} `json:"error"`
}

// writeError answers err as the contract's error body. Errors without a
// public class are logged with the request id and answered with a generic
// 500; a public error's cause is logged too.
func (s *Server) writeError(c *gin.Context, err error) {
	status, code, msg := statusOf(err)
	s.logFailure("request failed", err, c.GetString(ctxSessionPK), "requestId", requestID(c), "path", c.FullPath(), "code", code)
	var details map[string]any
	if pe, ok := errdefs.Public(err); ok {
		details = pe.Details()
		if s := pe.RetryAfter(); s > 0 {
			c.Header("Retry-After", strconv.Itoa(s))
		}
	}
	answerErrorDetails(c, status, code, msg, details)
}

// logFailure logs why a request failed: an error without a public class
// as an error, a public one's cause (if any) as a warning. A cause may
// quote what a sandbox sent (a malformed answer through the portal), and
// the logger's own scrubbing knows the rules only: with the session known
// (pk), its secrets are redacted from the text too.
func (s *Server) logFailure(msg string, err error, pk string, attrs ...any) {
	level, cause := slog.LevelError, err
	if pe, ok := errdefs.Public(err); ok {
		if pe.Cause() == nil {
			return
		}
		level, cause = slog.LevelWarn, pe.Cause()
	}
	var text any = cause
	if pk != "" {
		if set, err := s.sessions.Scrubber(pk); err == nil {
			text = set.RedactString(cause.Error())
		} else {
			text = "(withheld: the session's secrets could not be read to redact it)"
		}
	}
	s.log.Log(context.Background(), level, msg, append(attrs, "err", text)...)
}

// answerError writes the contract's error body.
func answerError(c *gin.Context, status int, code, msg string) {
	answerErrorDetails(c, status, code, msg, nil)
}

func answerErrorDetails(c *gin.Context, status int, code, msg string, details map[string]any) {
	var body errorBody
	body.Error.Details = details
	body.Error.Code = code
	body.Error.Message = msg
	body.Error.RequestID = requestID(c)
	c.Set(ctxOutcomeErr, code)
	c.AbortWithStatusJSON(status, body)
}
