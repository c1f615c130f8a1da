package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"sandboxd/server/client"
)

// maxStdin bounds what exec and run read from standard input (the API
// carries it inside a JSON body, which the server's limits.maxBodyBytes
// bounds again).
const maxStdin = 8 << 20

func (a *app) execCmd() *cobra.Command {
	var (
		req     client.ExecRequest
		env     []string
		timeout time.Duration
		noStdin bool
	)
	cmd := &cobra.Command{
		Use:   "exec SESSION -- COMMAND...",
		Short: "Run a command in a sandbox; its exit status becomes sbx's",
		Long: `exec runs COMMAND with /bin/bash -lc as the sandbox's user (in /workspace
unless --cwd), like ssh: the words after -- are joined with spaces into one
command line, so quote what the remote shell should see as one word.

Its standard output and error are printed when it ends, and sbx exits with its
status (124 when it timed out; 255 when sbx itself failed). Standard input is
sent along when it is not a terminal, as text inside the request, so at most
what the server takes in one request (limits.maxBodyBytes, 1 MiB by default;
copy larger input in with 'sbx cp'); -n sends none.`,
		Example: `  sbx exec demo-1 -- python --version
  sbx exec demo-1 --cwd /workspace/app --env CI=1 -- 'make test 2>&1 | tail -5'
  echo hello | sbx exec demo-1 -- wc -c`,
		Args: func(cmd *cobra.Command, argv []string) error {
			if len(argv) < 2 {
				return usagef("%s: expected SESSION -- COMMAND...", cmdName(cmd))
			}
			if n := cmd.ArgsLenAtDash(); n != -1 && n != 1 {
				return usagef("%s: expected SESSION -- COMMAND...", cmdName(cmd))
			}
			return nil
		},
		RunE: remoteStatus(func(cmd *cobra.Command, argv []string) error {
			id := argv[0]
			if err := checkSession(id); err != nil {
				return err
			}
			req.Command = strings.Join(argv[1:], " ")
			var err error
			if req.Env, err = parseKV("--env", env); err != nil {
				return err
			}
			if timeout < 0 || (timeout > 0 && timeout < time.Millisecond) {
				return usagef("--timeout: a positive duration, e.g. 30s or 10m")
			}
			req.TimeoutMs = timeout.Milliseconds()
			if !noStdin && !isTerminal(a.stdin) {
				in, err := readText(a.stdin, "standard input")
				if err != nil {
					return err
				}
				req.Stdin = &in
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.Exec(cmd.Context(), id, req)
			if err != nil && req.Stdin != nil && client.IsCode(err, "too_large") {
				return fmt.Errorf("standard input (%s) is more than the server takes in one request: %w; "+
					"copy it in with 'sbx cp FILE %s:in.txt' and run the command with '< in.txt'", humanBytes(int64(len(*req.Stdin))), err, id)
			}
			if err != nil {
				return err
			}
			if a.jsonOut {
				if err := a.printJSON(res.Raw); err != nil {
					return err
				}
			} else {
				io.WriteString(a.stdout, res.Stdout)
				io.WriteString(a.stderr, res.Stderr)
				switch {
				case res.OOM:
					fmt.Fprintln(a.stderr, "sbx: the sandbox ran out of memory (the session failed)")
				case res.TimedOut:
					fmt.Fprintf(a.stderr, "sbx: the command timed out after %s and was killed\n", time.Duration(res.DurationMs)*time.Millisecond)
				}
				if res.StoppedForOutput {
					fmt.Fprintln(a.stderr, "sbx: the command was stopped: it went on writing far past the server's output limit")
				}
				if res.Truncated {
					fmt.Fprintln(a.stderr, "sbx: the output was cut at the server's limit"+dropped(res.StdoutDropped, res.StderrDropped))
				}
			}
			if res.ExitCode != 0 {
				return exitStatus(res.ExitCode)
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&req.Cwd, "cwd", "", "working directory (default /workspace)")
	f.StringArrayVar(&env, "env", nil, "environment variable K=V; repeatable")
	f.DurationVar(&timeout, "timeout", 0, "kill the command after this long (default: the server's limits.execDefaultTimeoutMs)")
	f.BoolVarP(&noStdin, "no-stdin", "n", false, "send no standard input")
	return cmd
}

// readText reads at most maxStdin bytes of UTF-8 text.
func readText(r io.Reader, what string) (string, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxStdin+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", what, err)
	}
	if len(b) > maxStdin {
		return "", usagef("%s is larger than %s: copy it in with 'sbx cp' instead", what, humanBytes(maxStdin))
	}
	if !utf8.Valid(b) {
		return "", usagef("%s is not UTF-8 text: copy binary data in with 'sbx cp' instead", what)
	}
	return string(b), nil
}

func (a *app) runCmd() *cobra.Command {
	run := &cobra.Command{
		Use:   "run (python|node) SESSION [FILE|-]",
		Short: "Run code in a sandbox's Python or Node.js context",
		Args:  args(1, -1, "python or node"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return usagef("unknown language %q: python or node", argv[0])
		},
	}
	for _, lang := range []string{client.Python, client.Node} {
		run.AddCommand(a.runLangCmd(lang))
	}
	return run
}

func (a *app) runLangCmd(lang string) *cobra.Command {
	var (
		req     client.CodeRequest
		timeout time.Duration
		outDir  string
	)
	cmd := &cobra.Command{
		Use:   lang + " SESSION [FILE|-]",
		Short: "Run a file (or standard input) in the session's " + lang + " context",
		Long: `The code runs in a context whose state (variables, imports) persists between
runs with the same --context. Its output is printed, then the value of its last
expression. Images and other rich output are saved as files in --out-dir and
their paths printed. An exception is printed to stderr and sbx exits with 1.`,
		Example: "  sbx run " + lang + " demo-1 script." + map[string]string{"python": "py", "node": "js"}[lang] +
			"\n  echo '1 + 1' | sbx run " + lang + " demo-1 --context calc",
		Args: args(1, 2, "SESSION [FILE|-]"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id := argv[0]
			if err := checkSession(id); err != nil {
				return err
			}
			var err error
			if len(argv) == 1 || argv[1] == "-" {
				req.Code, err = readText(a.stdin, "standard input")
			} else {
				var f *os.File
				if f, err = os.Open(argv[1]); err == nil {
					req.Code, err = readText(f, argv[1])
					f.Close()
				}
			}
			if err != nil {
				return err
			}
			if strings.TrimSpace(req.Code) == "" {
				return usagef("no code to run")
			}
			if timeout < 0 {
				return usagef("--timeout: a positive duration")
			}
			req.TimeoutMs = timeout.Milliseconds()
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.RunCode(cmd.Context(), id, lang, req)
			if err != nil {
				return err
			}
			if a.jsonOut {
				if err := a.printJSON(res.Raw); err != nil {
					return err
				}
			} else if err := a.printCodeResult(res, outDir); err != nil {
				return err
			}
			if res.Error != nil {
				return exitStatus(1)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.ContextID, "context", "", "code context id (default: the session's default context)")
	f.DurationVar(&timeout, "timeout", 0, "interrupt the run after this long (default 30s)")
	f.StringVar(&outDir, "out-dir", ".", "where images and other rich output are saved")
	return cmd
}

// printCodeResult prints a run for people: its output, the value of its
// last expression, rich output saved to files, and its error.
func (a *app) printCodeResult(res *client.CodeResult, outDir string) error {
	io.WriteString(a.stdout, res.Stdout)
	io.WriteString(a.stderr, res.Stderr)
	if res.Result != nil {
		fmt.Fprintln(a.stdout, *res.Result)
	}
	for i, d := range res.Display {
		mt, _, _ := mime.ParseMediaType(d.Mime)
		if mt == "text/plain" {
			fmt.Fprintln(a.stdout, d.Data)
			continue
		}
		data := []byte(d.Data)
		if !strings.HasPrefix(mt, "text/") && mt != "application/json" && mt != "image/svg+xml" {
			b, err := base64.StdEncoding.DecodeString(d.Data)
			if err != nil {
				fmt.Fprintf(a.stderr, "sbx: display %d (%s): not base64; skipped\n", i, d.Mime)
				continue
			}
			data = b
		}
		if err := os.MkdirAll(outDir, 0o755); err != nil {
			return err
		}
		f, err := os.CreateTemp(outDir, fmt.Sprintf("sbx-%s-*%s", res.ContextID, extension(mt)))
		if err != nil {
			return err
		}
		_, werr := f.Write(data)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return werr
		}
		os.Chmod(f.Name(), 0o644)
		fmt.Fprintf(a.stdout, "[%s saved to %s]\n", mt, filepath.Clean(f.Name()))
	}
	if e := res.Error; e != nil {
		if e.Traceback != "" {
			fmt.Fprintln(a.stderr, strings.TrimRight(e.Traceback, "\n"))
		} else {
			fmt.Fprintf(a.stderr, "%s: %s\n", e.Name, e.Value)
		}
	}
	if res.StoppedForOutput {
		fmt.Fprintln(a.stderr, "sbx: the run was interrupted: it went on writing far past the server's output limit")
	}
	if res.Truncated {
		fmt.Fprintln(a.stderr, "sbx: the output was cut at the server's limit"+dropped(res.StdoutDropped, res.StderrDropped))
	}
	return nil
}

// dropped says what the cut left out, or "".
func dropped(stdout, stderr int64) string {
	if stdout == 0 && stderr == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d bytes of stdout and %d of stderr left out)", stdout, stderr)
}

// extension is a file name extension for a MIME type.
func extension(mt string) string {
	switch mt {
	case "image/png":
		return ".png"
	case "image/jpeg":
		return ".jpg"
	case "image/svg+xml":
		return ".svg"
	case "image/gif":
		return ".gif"
	case "text/html":
		return ".html"
	case "application/json":
		return ".json"
	case "application/pdf":
		return ".pdf"
	}
	if exts, _ := mime.ExtensionsByType(mt); len(exts) > 0 {
		return exts[0]
	}
	return ".bin"
}
