package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// ExecRequest is a one-shot command (POST /v1/sandbox/terminal/:id with
// action "exec"). Command runs under /bin/bash -lc as the sandbox's
// unprivileged user.
type ExecRequest struct {
	Command string            `json:"command"`
	Cwd     string            `json:"cwd,omitempty"` // default /workspace
	Env     map[string]string `json:"env,omitempty"`
	// TimeoutMs bounds the run (0: the server's default); on expiry the
	// process group is killed and the result says TimedOut, exit code 124.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// Stdin is the command's standard input (text: JSON carries UTF-8).
	Stdin *string `json:"stdin,omitempty"`
}

// ExecResult is a finished command.
type ExecResult struct {
	ExitCode   int    `json:"exitCode"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMs int64  `json:"durationMs"`
	TimedOut   bool   `json:"timedOut"`
	// Truncated: the output passed the server's cap and was cut.
	Truncated bool `json:"truncated"`
	OOM       bool `json:"oom"`
	// StdoutDropped and StderrDropped count the bytes of each stream the
	// answer does not hold.
	StdoutDropped int64 `json:"stdoutDropped"`
	StderrDropped int64 `json:"stderrDropped"`
	// StoppedForOutput: the command went on writing far past the cap
	// (the server's limits.execMaxDroppedBytes) and its process group was
	// killed; ExitCode is 141.
	StoppedForOutput bool            `json:"stoppedForOutput"`
	Raw              json.RawMessage `json:"-"`
}

// Exec runs one command and returns its output and exit code. A command
// that fails is not an error: see ExitCode.
func (c *Client) Exec(ctx context.Context, sessionID string, req ExecRequest) (*ExecResult, error) {
	body := struct {
		Action string `json:"action"`
		ExecRequest
	}{"exec", req}
	var r ExecResult
	raw, _, err := c.doJSON(ctx, http.MethodPost, "/v1/sandbox/terminal/"+seg(sessionID), nil, body, &r)
	if err != nil {
		return nil, err
	}
	r.Raw = raw
	return &r, nil
}

// KillResult answers Kill: Killed is true when no process of the sandbox
// user is left; otherwise Survivors says how many the server still saw
// after trying for 10 s, and Unknown that it could not read the process
// list.
type KillResult struct {
	Killed    bool            `json:"killed"`
	Survivors int             `json:"survivors"`
	Unknown   bool            `json:"unknown,omitempty"`
	Raw       json.RawMessage `json:"-"`
}

// Kill stops every process of the sandbox user (action "kill").
func (c *Client) Kill(ctx context.Context, sessionID string) (*KillResult, error) {
	var r KillResult
	raw, _, err := c.doJSON(ctx, http.MethodPost, "/v1/sandbox/terminal/"+seg(sessionID), nil, map[string]string{"action": "kill"}, &r)
	if err != nil {
		return nil, err
	}
	r.Raw = raw
	return &r, nil
}

// Code languages.
const (
	Python = "python"
	Node   = "node"
)

// CodeRequest runs code in a code context (POST /v1/sandbox/python/:id or
// /node/:id). State persists between runs with the same ContextID (empty:
// the session's default context).
type CodeRequest struct {
	Code      string `json:"code"`
	ContextID string `json:"contextId,omitempty"`
	TimeoutMs int64  `json:"timeoutMs,omitempty"`
}

// CodeResult is a finished run.
type CodeResult struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Result is the last expression's value as text, nil when there is none.
	Result *string `json:"result"`
	// Error is the exception that ended the run, nil when it succeeded.
	Error      *CodeError `json:"error"`
	Display    []Display  `json:"display"`
	ContextID  string     `json:"contextId"`
	DurationMs int64      `json:"durationMs"`
	TimedOut   bool       `json:"timedOut"`
	Truncated  bool       `json:"truncated"`
	// As in ExecResult; a run stopped for its output was interrupted.
	StdoutDropped    int64           `json:"stdoutDropped"`
	StderrDropped    int64           `json:"stderrDropped"`
	StoppedForOutput bool            `json:"stoppedForOutput"`
	Raw              json.RawMessage `json:"-"`
}

// CodeError is an exception of a code run.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Display is one rich output (an image, HTML): Data is base64 for binary
// MIME types.
type Display struct {
	Mime string `json:"mime"`
	Data string `json:"data"`
}

// RunCode runs code in lang (Python or Node). An exception in the code is
// not an error: see CodeResult.Error.
func (c *Client) RunCode(ctx context.Context, sessionID, lang string, req CodeRequest) (*CodeResult, error) {
	if lang != Python && lang != Node {
		return nil, fmt.Errorf("language %q: must be %s or %s", lang, Python, Node)
	}
	var r CodeResult
	raw, _, err := c.doJSON(ctx, http.MethodPost, "/v1/sandbox/"+lang+"/"+seg(sessionID), nil, req, &r)
	if err != nil {
		return nil, err
	}
	r.Raw = raw
	return &r, nil
}

// decodeMap decodes a JSON object keeping numbers exact.
func decodeMap(raw []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}
