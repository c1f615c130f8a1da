package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"sandboxd/server/client"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

// app holds what every command shares: the standard streams, the
// environment and the global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string

	server, token, tokenFile string
	jsonOut                  bool

	// eol ends the lines sbx prints between a command's output: "\r\n"
	// while a shell holds the terminal in raw mode.
	eol string
}

func newApp(stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) *app {
	return &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv, eol: "\n"}
}

// root builds the command tree.
func (a *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "sbx",
		Short: "Command line of sandboxd: disposable gVisor sandboxes",
		Long: `sbx drives a sandboxd server: provision sandboxes, run commands and code
in them, open a shell, copy files, read logs and artifacts, pause, resume,
tear down and delete them.

The server is --server, else $SBX_SERVER, else the one saved by 'sbx login',
else ` + DefaultServer + `. The token is --token or --token-file, else
$SBX_TOKEN, else the one 'sbx login' saved for that server.`,
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q", args[0])
			}
			cmd.SetOut(a.stderr)
			cmd.Help()
			return usagef("a command is required")
		},
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.server, "server", "", "server URL (default $SBX_SERVER, the saved one, or "+DefaultServer+")")
	pf.StringVar(&a.token, "token", "", "API token (default $SBX_TOKEN or the saved one)")
	pf.StringVar(&a.tokenFile, "token-file", "", "read the API token from this file ('-': standard input)")
	pf.BoolVar(&a.jsonOut, "json", false, "print the API's JSON answer instead of text")
	root.AddCommand(
		a.loginCmd(), a.provisionCmd(), a.lsCmd(), a.getCmd(), a.execCmd(), a.shellCmd(), a.runCmd(),
		a.cpCmd(), a.artifactsCmd(), a.logsCmd(),
		a.lifecycleCmd("teardown", "Save the workspace, stop the sandbox and release its compute", "Tearing down"),
		a.lifecycleCmd("resume", "Restart a stopped or paused session with its workspace", "Resuming"),
		a.lifecycleCmd("pause", "Pause a session with its memory and processes", "Pausing"),
		a.deleteCmd(), a.usageCmd(),
	)
	return root
}

// args validates the positional arguments: between min and max (max < 0:
// any number).
func args(min, max int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || (max >= 0 && len(args) > max) {
			return usagef("%s: expected %s", cmdName(cmd), names)
		}
		return nil
	}
}

// cmdName is a command's path without "sbx ".
func cmdName(cmd *cobra.Command) string { return strings.TrimPrefix(cmd.CommandPath(), "sbx ") }

var sessionIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// checkSession refuses a session id the server would refuse, before any
// call.
func checkSession(id string) error {
	if !sessionIDRe.MatchString(id) {
		return usagef("session id %q: 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit", id)
	}
	return nil
}

// credentials resolves the server and token of this invocation.
func (a *app) credentials() (credentials, string, error) {
	path, err := configPath(a.getenv)
	if err != nil {
		return credentials{}, "", err
	}
	cfg, err := loadConfig(path)
	if err != nil {
		return credentials{}, path, err
	}
	c, err := resolve(a.server, a.token, a.tokenFile, a.getenv, a.stdin, cfg)
	return c, path, err
}

// client returns an API client with the resolved server and token.
func (a *app) client() (*client.Client, error) {
	cred, _, err := a.credentials()
	if err != nil {
		return nil, err
	}
	if cred.Token == "" {
		return nil, errors.New("no API token: run 'sbx login --token T', or pass --token or $SBX_TOKEN")
	}
	return a.newClient(cred.Server, cred.Token)
}

// newClient is an API client as every command uses it: a call refused by
// the server's rate limits is retried after the wait the server asks for
// (server/client), and each wait is told on stderr unless --json.
func (a *app) newClient(server, token string) (*client.Client, error) {
	return client.New(server, token, client.WithUserAgent("sbx/"+version), client.WithRetryNotify(a.retryNotice))
}

func (a *app) retryNotice(r client.Retry) {
	if a.jsonOut {
		return
	}
	why := "rate limited"
	if r.Err.Status != http.StatusTooManyRequests {
		why = "the server is unavailable"
	}
	when := "now"
	switch {
	case r.Wait >= time.Second:
		when = "in " + r.Wait.Round(time.Second).String()
	case r.Wait >= 100*time.Millisecond:
		when = "in " + r.Wait.Round(100*time.Millisecond).String()
	}
	fmt.Fprintf(a.stderr, "sbx: %s: retrying %s%s", why, when, a.eol)
}

// printJSON writes a raw API answer, indented, to stdout.
func (a *app) printJSON(raw []byte) error {
	var buf bytes.Buffer
	if len(raw) == 0 {
		raw = []byte("null")
	}
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		buf.Reset()
		buf.Write(raw)
	}
	buf.WriteByte('\n')
	_, err := a.stdout.Write(buf.Bytes())
	return err
}

// printValue writes v as indented JSON (answers sbx puts together itself).
func (a *app) printValue(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return a.printJSON(b)
}

// isTerminal reports whether w is a terminal.
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// spinner shows "desc" with a spinner and the elapsed time on stderr while
// a long operation runs, when stderr is a terminal. Its stop clears it.
func (a *app) spinner(desc string) (stop func()) {
	if !isTerminal(a.stderr) {
		return func() {}
	}
	bar := progressbar.NewOptions64(-1,
		progressbar.OptionSetWriter(a.stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionThrottle(100*time.Millisecond),
	)
	return func() { bar.Finish() }
}

// transferBar is a progress bar for total bytes (-1: unknown) on stderr,
// shown when force is set, or when stderr is a terminal and the transfer
// is large. Its update is a client.Progress; done clears it.
func (a *app) transferBar(desc string, total int64, force bool) (update client.Progress, done func()) {
	const large = 1 << 20
	if !force && (!isTerminal(a.stderr) || (total >= 0 && total < large)) {
		return nil, func() {}
	}
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(a.stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionSpinnerType(14),
	)
	return func(n, _ int64) { bar.Set64(n) }, func() { bar.Finish() }
}

// humanBytes formats a byte count with binary units.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
