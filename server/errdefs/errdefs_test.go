package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorClassCodeAndCause(t *testing.T) {
	cause := errors.New("runsc: /host/path exploded")
	e := Invalid("path: %s", "bad").WithCode("invalid_path").WithCause(cause)
	wrapped := fmt.Errorf("put: %w", e)
	if !errors.Is(wrapped, ErrInvalid) || errors.Is(wrapped, ErrNotFound) || !errors.Is(wrapped, cause) {
		t.Fatal("class or cause not found through wrapping")
	}
	pe, ok := Public(wrapped)
	if !ok || pe.Code() != "invalid_path" || pe.Message() != "path: bad" || pe.Cause() != cause || pe.Class() != ErrInvalid {
		t.Fatalf("Public = %+v %v", pe, ok)
	}
	// The copies leave the original alone.
	base := Conflict("x")
	_ = base.WithCode("y").WithCause(cause)
	if base.Code() != "" || base.Cause() != nil || base.Error() != "x" {
		t.Fatalf("With* changed the original: %+v", base)
	}
	if _, ok := Public(errors.New("plain")); ok {
		t.Fatal("a plain error is public")
	}
}
