package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"sandboxd/server/client"
)

// remote is SESSION:/path.
type remote struct {
	Session, Path string
}

// parseRemote reads SESSION:PATH. A relative PATH is under /workspace.
// Local paths with a colon can be written ./a:b.
func parseRemote(s string) (remote, bool) {
	id, p, ok := strings.Cut(s, ":")
	if !ok || !sessionIDRe.MatchString(id) || strings.ContainsAny(id, "/") {
		return remote{}, false
	}
	if !strings.HasPrefix(p, "/") {
		p = "/workspace/" + p
	}
	trailing := strings.HasSuffix(p, "/")
	p = path.Clean(p)
	if trailing && p != "/" {
		p += "/"
	}
	return remote{Session: id, Path: p}, true
}

func (a *app) cpCmd() *cobra.Command {
	var progress bool
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a sandbox (one side is SESSION:/path)",
		Long: `cp copies one file between this machine and a sandbox's workspace. The remote
side is SESSION:/workspace/path (or SESSION:path, relative to /workspace). A
remote path ending in / or naming a directory gets the local file's name; a
local directory gets the remote file's name. '-' is standard input or output.

Uploads replace the file atomically (up to 256 MiB); downloads are the file's
bytes after the session's secret scrubber. A progress bar shows for files over
1 MiB when stderr is a terminal, or always with --progress.`,
		Example: `  sbx cp data.csv demo-1:/workspace/in/
  sbx cp demo-1:out/report.pdf .
  tar cz src | sbx cp - demo-1:src.tgz`,
		Args: args(2, 2, "SRC DST"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			src, srcRemote := parseRemote(argv[0])
			dst, dstRemote := parseRemote(argv[1])
			c, err := a.client()
			if err != nil {
				return err
			}
			switch {
			case srcRemote && dstRemote:
				return usagef("cp: one side must be local")
			case !srcRemote && !dstRemote:
				return usagef("cp: one side must be SESSION:/path")
			case dstRemote:
				return a.upload(cmd, c, argv[0], dst, progress)
			default:
				return a.download(cmd, c, src, argv[1], progress)
			}
		},
	}
	cmd.Flags().BoolVar(&progress, "progress", false, "show a progress bar even when stderr is not a terminal")
	return cmd
}

func (a *app) upload(cmd *cobra.Command, c *client.Client, local string, dst remote, progress bool) error {
	var (
		r    io.Reader
		size int64 = -1
		name string
	)
	if local == "-" {
		r = a.stdin
	} else {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if st.IsDir() {
			return usagef("cp: %s is a directory; copy files one at a time (or a tar archive)", local)
		}
		if st.Mode().IsRegular() {
			size = st.Size()
		}
		r, name = f, filepath.Base(local)
	}
	target := dst.Path
	if strings.HasSuffix(target, "/") || a.remoteIsDir(cmd, c, dst) {
		if name == "" {
			return usagef("cp: %s:%s is a directory: name the file to write from standard input", dst.Session, dst.Path)
		}
		target = path.Join(target, name)
	}
	update, done := a.transferBar("upload "+path.Base(target), size, progress)
	res, err := c.Upload(cmd.Context(), dst.Session, target, r, size, update)
	done()
	if err != nil {
		return err
	}
	if a.jsonOut {
		return a.printJSON(res.Raw)
	}
	verb := "replaced"
	if res.Created {
		verb = "created"
	}
	fmt.Fprintf(a.stderr, "%s:%s %s (%s)\n", dst.Session, res.Entry.Path, verb, humanBytes(res.Entry.Size))
	return nil
}

// remoteIsDir reports whether a remote path is an existing directory, from
// its parent's listing (a GET of the path itself would download a file).
func (a *app) remoteIsDir(cmd *cobra.Command, c *client.Client, r remote) bool {
	if r.Path == "/workspace" {
		return true
	}
	l, err := c.ListDir(cmd.Context(), r.Session, path.Dir(r.Path))
	if err != nil {
		return false
	}
	for _, e := range l.Entries {
		if e.Name == path.Base(r.Path) {
			return e.Type == "dir"
		}
	}
	return false
}

// remoteSize is a remote file's stored size from its parent's listing, -1
// when unknown (for a progress bar).
func remoteSize(cmd *cobra.Command, c *client.Client, r remote) int64 {
	l, err := c.ListDir(cmd.Context(), r.Session, path.Dir(r.Path))
	if err != nil {
		return -1
	}
	for _, e := range l.Entries {
		if e.Name == path.Base(r.Path) && e.Type == "file" {
			return e.Size
		}
	}
	return -1
}

func (a *app) download(cmd *cobra.Command, c *client.Client, src remote, local string, progress bool) error {
	if strings.HasSuffix(src.Path, "/") {
		return usagef("cp: %s:%s is a directory; copy files one at a time", src.Session, src.Path)
	}
	var size int64 = -1
	if progress || isTerminal(a.stderr) {
		size = remoteSize(cmd, c, src)
	}
	get := func(w io.Writer, update client.Progress) (int64, error) {
		return c.Download(cmd.Context(), src.Session, src.Path, w, update)
	}
	n, err := a.saveTo(local, path.Base(src.Path), size, progress, get)
	if errors.Is(err, client.ErrIsDirectory) {
		return usagef("cp: %s:%s is a directory; copy files one at a time", src.Session, src.Path)
	}
	if err != nil {
		return err
	}
	if a.jsonOut && local != "-" { // on stdout the file's bytes are the answer
		return a.printValue(map[string]any{"sessionId": src.Session, "path": src.Path, "local": local, "bytes": n})
	}
	return nil
}

// saveTo writes a download to local ("-": stdout; a directory: name in it)
// through a temporary file renamed into place, so a failed transfer leaves
// no partial file; a local path that is neither a file nor a directory is
// written into.
func (a *app) saveTo(local, name string, size int64, progress bool, get func(io.Writer, client.Progress) (int64, error)) (int64, error) {
	if local == "-" {
		update, done := a.transferBar("download "+name, size, progress)
		n, err := get(a.stdout, update)
		done()
		return n, err
	}
	if st, err := os.Stat(local); err == nil && st.IsDir() || strings.HasSuffix(local, string(os.PathSeparator)) {
		local = filepath.Join(local, name)
	}
	if st, err := os.Stat(local); err == nil && !st.Mode().IsRegular() {
		// A FIFO, a device, a terminal: written through as cp does, never
		// replaced by a regular file (sudo sbx cp s:log /dev/null).
		f, err := os.OpenFile(local, os.O_WRONLY, 0)
		if err != nil {
			return 0, err
		}
		update, done := a.transferBar("download "+name, size, progress)
		n, err := get(f, update)
		done()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return n, err
	}
	f, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".sbx-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	update, done := a.transferBar("download "+name, size, progress)
	n, err := get(f, update)
	done()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, err
	}
	mode := os.FileMode(0o644)
	if st, err := os.Stat(local); err == nil && st.Mode().IsRegular() {
		mode = st.Mode().Perm()
	}
	os.Chmod(f.Name(), mode)
	if err := os.Rename(f.Name(), local); err != nil {
		return n, err
	}
	if !a.jsonOut {
		fmt.Fprintf(a.stderr, "%s (%s)\n", local, humanBytes(n))
	}
	return n, nil
}

// printable is a name the sandbox chose, safe for a terminal: as it is
// when it is plain UTF-8 text, else quoted with its control characters
// escaped (as ls -b does), so no escape sequence or line break of the
// sandbox's reaches the user's terminal or forges a row.
func printable(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Bidi_Control, r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func (a *app) artifactsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "artifacts SESSION",
		Short: "List a session's artifacts (the files of /workspace), also after teardown",
		Args:  args(1, 1, "SESSION"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := checkSession(argv[0]); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.Artifacts(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if a.jsonOut {
				return a.printJSON(l.Raw)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PATH\tSIZE\tMODIFIED\tSHA256")
			for _, f := range l.Artifacts {
				sum := f.SHA256
				if len(sum) > 12 {
					sum = sum[:12]
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", printable(f.Path), f.Size, f.ModifiedAt.Local().Format(time.DateTime), sum)
			}
			tw.Flush()
			if len(l.Truncated) > 0 {
				fmt.Fprintf(a.stderr, "sbx: the listing was cut by the server (%s)\n", strings.Join(l.Truncated, ", "))
			}
			return nil
		},
	}
	cmd.AddCommand(a.artifactGetCmd())
	return cmd
}

func (a *app) artifactGetCmd() *cobra.Command {
	var (
		out      string
		progress bool
	)
	cmd := &cobra.Command{
		Use:   "get SESSION PATH [-o FILE]",
		Short: "Download an artifact (PATH relative to /workspace)",
		Args:  args(2, 2, "SESSION PATH"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, p := argv[0], argv[1]
			if err := checkSession(id); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if out == "" {
				out = path.Base(p)
			}
			var size int64 = -1
			if progress || isTerminal(a.stderr) {
				size = remoteSize(cmd, c, remote{Session: id, Path: path.Join("/workspace", strings.TrimPrefix(p, "/workspace/"))})
			}
			n, err := a.saveTo(out, path.Base(p), size, progress, func(w io.Writer, update client.Progress) (int64, error) {
				return c.DownloadArtifact(cmd.Context(), id, p, w, update)
			})
			if err != nil {
				return err
			}
			if a.jsonOut && out != "-" {
				return a.printValue(map[string]any{"sessionId": id, "path": p, "local": out, "bytes": n})
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write ('-': standard output; default: the artifact's name)")
	cmd.Flags().BoolVar(&progress, "progress", false, "show a progress bar even when stderr is not a terminal")
	return cmd
}
