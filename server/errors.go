package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"
)

// APIError is an error with its HTTP status and contract code. Its Message
// is shown to clients, so it never holds argv, host paths or env values.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

func apiErr(status int, code, format string, args ...any) *APIError {
	return &APIError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *APIError {
	return apiErr(http.StatusBadRequest, "invalid_request", format, args...)
}

var (
	errUnauthenticated = apiErr(http.StatusUnauthorized, "unauthenticated", "missing, unknown or revoked bearer token")
	errNotFound        = apiErr(http.StatusNotFound, "not_found", "no such session")
	errTooLarge        = apiErr(http.StatusRequestEntityTooLarge, "too_large", "request body is too large")
	errInternal        = apiErr(http.StatusInternalServerError, "internal", "internal error; see the server log with this request id")
	errUnavailable     = apiErr(http.StatusServiceUnavailable, "unavailable", "the server is at capacity or shutting down; retry later")
)

func forbidden(perm string) *APIError {
	return apiErr(http.StatusForbidden, "forbidden", "your role lacks the %s permission", perm)
}

func forbiddenMsg(msg string) *APIError {
	return apiErr(http.StatusForbidden, "forbidden", "%s", msg)
}

func conflict(format string, args ...any) *APIError {
	return apiErr(http.StatusConflict, "conflict", format, args...)
}

type errorBody struct {
	Error struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		RequestID string `json:"requestId"`
	} `json:"error"`
}

// writeError maps any error to the contract's error body. Unknown errors are
// logged server-side and answered with a generic 500.
func (s *Server) writeError(c *gin.Context, err error) {
	var ae *APIError
	if !errors.As(err, &ae) {
		s.log.Error("request failed", "requestId", requestID(c), "path", c.FullPath(), "err", err)
		ae = errInternal
	}
	var body errorBody
	body.Error.Code = ae.Code
	body.Error.Message = ae.Message
	body.Error.RequestID = requestID(c)
	c.Set(ctxOutcomeErr, ae.Code)
	c.AbortWithStatusJSON(ae.Status, body)
}
