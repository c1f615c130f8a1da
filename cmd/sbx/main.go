// Command sbx is the command line of sandboxd for people and scripts: log
// in once, then provision sandboxes, run commands and code in them, open
// an interactive shell, copy files in and out, read logs and artifacts,
// and pause, resume, tear down or delete them.
//
//	sbx login --token T [--server URL]
//	sbx provision demo-1 --size standard-2
//	sbx exec demo-1 -- python --version
//	sbx shell demo-1
//	sbx cp ./data.csv demo-1:/workspace/data.csv
//	sbx teardown demo-1
//	sbx usage --period previous
//
// Every command talks to the server through package sandboxd/server/client,
// which retries a call the server's rate limits refused (429 with
// Retry-After) after the wait asked for, up to 3 times; each wait is told
// on stderr ("sbx: rate limited: retrying in 1s"), except with --json.
// With --json a command prints the API's JSON answer instead of text.
// Errors go to stderr as "sbx: <message> (<code>, request <id>)", then the
// error's details when the server gives any (the numbers of a 402
// insufficient_credits), with exit status 1, usage errors with 2; exec and shell exit with the remote
// command's status, and 255 when sbx itself failed (as ssh does).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"sandboxd/server/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	a := newApp(os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	err := a.root().ExecuteContext(ctx)
	stop()
	os.Exit(report(a.stderr, err))
}

// usageError is a mistake on the command line (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// exitStatus ends sbx with a status and no message of its own (exec and
// shell pass the remote command's status on).
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// ownFailure marks a failure of sbx itself in a command whose exit status
// is otherwise the remote command's (exec, shell): it exits 255, as ssh
// does, so a script tells "the command never ran" (a paused session, the
// network) from the command's own status 1. Usage errors stay 2.
type ownFailure struct{ err error }

func (e ownFailure) Error() string { return e.err.Error() }
func (e ownFailure) Unwrap() error { return e.err }

// remoteStatus wraps a command's RunE so its own failures are ownFailure.
func remoteStatus(run func(*cobra.Command, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, argv []string) error {
		err := run(cmd, argv)
		var st exitStatus
		var ue usageError
		if err == nil || errors.As(err, &st) || errors.As(err, &ue) || errors.Is(err, context.Canceled) {
			return err
		}
		return ownFailure{err}
	}
}

// report prints err the way sbx reports errors and returns the exit status.
func report(w io.Writer, err error) int {
	var of ownFailure
	if errors.As(err, &of) {
		if code := report(w, of.err); code == 1 {
			return 255
		} else {
			return code
		}
	}
	var (
		st  exitStatus
		ue  usageError
		ae  *client.Error
		ue2 *url.Error
		msg string
	)
	switch {
	case err == nil:
		return 0
	case errors.As(err, &st):
		return int(st)
	case errors.As(err, &ue):
		fmt.Fprintf(w, "sbx: %v\nRun 'sbx --help' for usage.\n", ue.err)
		return 2
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(w, "sbx: interrupted")
		return 130
	case errors.As(err, &ae):
		msg = err.Error() // "<message> (<code>, request <id>)", with any context before it
		if len(ae.Details) > 0 {
			msg += "\n  " + formatDetails(ae.Details)
		}
	case errors.As(err, &ue2):
		msg = fmt.Sprintf("cannot reach the server (%s %s): %v", strings.ToUpper(ue2.Op), ue2.URL, ue2.Err)
	default:
		msg = err.Error()
	}
	fmt.Fprintf(w, "sbx: %s\n", msg)
	return 1
}
