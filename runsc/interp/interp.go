// Package interp holds the interpreters that keep a code context alive
// inside a sandbox (python.py, node.js) and the framing of their output.
//
// Protocol: the server writes a nonce line, then one JSON Request line per
// run, to the program's stdin. For each run the program writes the run's
// output on stdout and stderr, then Mark(nonce) followed by a JSON Result
// and "\n" on stdout, and Mark(nonce) followed by the request's Seq and
// "\n" on stderr. Bytes before the marks are the run's output, child processes'
// included; a program that prints something mark-like without the nonce
// only prints text.
package interp

import (
	_ "embed"
	"fmt"
)

//go:embed python.py
var pythonSource string

//go:embed node.js
var nodeSource string

// Languages are the languages with an interpreter, by the name used in routes.
var Languages = []string{"python", "node"}

// Args returns the command line that starts lang's interpreter in the sandbox.
func Args(lang string) ([]string, error) {
	switch lang {
	case "python":
		return []string{"/usr/bin/python3", "-u", "-c", pythonSource}, nil
	case "node":
		// Node cannot move its stdin aside itself: the shell gives it the
		// requests on fd 3 and /dev/null on fd 0.
		return []string{"/bin/sh", "-c", `exec 3<&0 </dev/null; exec /usr/bin/node -e "$1"`, "sandboxd-node", nodeSource}, nil
	}
	return nil, fmt.Errorf("interp: no language %q", lang)
}

// Mark is what precedes a run's result frame on stdout and its end on stderr.
func Mark(nonce string) []byte { return []byte("\x1e" + nonce + "\x1f") }

// MaxDisplayBytes bounds a run's rich output; an interpreter drops what is over.
const MaxDisplayBytes = 8 << 20

// Request is one run, as a line on the interpreter's stdin. MaxResult (in
// characters) and MaxDisplay (in bytes) bound the result frame.
type Request struct {
	Code       string `json:"code"`
	Seq        uint64 `json:"seq"`
	MaxResult  int    `json:"maxResult"`
	MaxDisplay int    `json:"maxDisplay"`
}

// Result is a run's outcome as the interpreter reports it, for request Seq.
type Result struct {
	Seq       uint64    `json:"seq"`
	Result    *string   `json:"result"`
	Error     *Error    `json:"error"`
	Display   []Display `json:"display"`
	Truncated bool      `json:"truncated"`
}

// Error is an exception that ended a run.
type Error struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Display is one rich output: a MIME type and its data (base64 for binary
// types such as image/png).
type Display struct {
	Mime string `json:"mime"`
	Data string `json:"data"`
}
