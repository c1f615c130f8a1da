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
// Every command talks to the server through package sandboxd/server/client.
// With --json a command prints the API's JSON answer instead of text.
// Errors go to stderr as "sbx: <message> (<code>, request <id>)", then the
// error's details when the server gives any (the numbers of a 402
// insufficient_credits), with exit status 1, usage errors with 2; exec and shell exit with the remote
// command's status.
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

// report prints err the way sbx reports errors and returns the exit status.
func report(w io.Writer, err error) int {
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
