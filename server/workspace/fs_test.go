package workspace

import (
	"errors"
	"strings"
	"testing"

	"sandboxd/server/errdefs"
)

func TestWorkspaceRel(t *testing.T) {
	for p, want := range map[string]string{
		"/workspace":               "",
		"/workspace/":              "",
		"/workspace/a.txt":         "a.txt",
		"/workspace/out/r.pdf":     "out/r.pdf",
		"/workspace/dir/":          "dir",
		"/workspace/%2e%2e":        "%2e%2e", // a literal name, not a parent
		"/workspace/..a/b..":       "..a/b..",
		"/workspace/with space/ü":  "with space/ü",
		"/workspace/a\r\nb":        "a\r\nb",
		"/workspace/" + longName(): longName(),
	} {
		got, err := Rel(p)
		if err != nil || got != want {
			t.Errorf("Rel(%q) = %q, %v; want %q", p, got, err, want)
		}
	}
	for _, p := range []string{
		"", "workspace", "workspace/a", "/", "/etc/passwd", "/workspacex", "/workspacex/a",
		"/workspace/..", "/workspace/../etc/passwd", "/workspace/a/../../etc", "/workspace/./a",
		"/workspace//a", "/workspace/a//", "/workspace/a/.", "/workspace/a\x00b", "/workspace/\x00",
		"/workspace/" + longName() + "x", "/workspace/" + strings.Repeat("a/", 2100),
		"/../workspace/a", "//workspace/a",
	} {
		got, err := Rel(p)
		if pe, ok := errdefs.Public(err); !ok || pe.Code() != "invalid_path" || !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Rel(%q) = %q, %v; want invalid_path", p, got, err)
		}
	}
}

func longName() string { return strings.Repeat("n", maxNameBytes) }
