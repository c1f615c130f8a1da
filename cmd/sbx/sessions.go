package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandboxd/server/client"
)

func (a *app) loginCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "login (--token T | --token-file F | $SBX_TOKEN) [--server URL]",
		Short: "Check a token with the server and save both for later commands",
		Long: `login checks the token (GET /v1/me) and saves the server and token in
$XDG_CONFIG_HOME/sbx/config.json (~/.config/sbx/config.json), mode 0600.`,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := configPath(a.getenv)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			// The saved token is not a source here: login saves a new one.
			cred, err := resolve(a.server, a.token, a.tokenFile, a.getenv, a.stdin, fileConfig{Server: cfg.Server})
			if err != nil {
				return err
			}
			if cred.Token == "" {
				return usagef("login needs a token: --token T, --token-file F or $SBX_TOKEN")
			}
			c, err := a.newClient(cred.Server, cred.Token)
			if err != nil {
				return usageError{err}
			}
			me, err := c.Me(cmd.Context())
			if err != nil {
				return err
			}
			if err := saveConfig(path, fileConfig{Server: cred.Server, Token: cred.Token}); err != nil {
				return err
			}
			if a.jsonOut {
				return a.printJSON(me.Raw)
			}
			fmt.Fprintf(a.stdout, "Logged in to %s as %s (organization %s, role %s); saved in %s\n",
				cred.Server, me.User.Name, me.Organization.Name, me.Role, path)
			return nil
		},
	}
}

func (a *app) provisionCmd() *cobra.Command {
	var (
		req                client.ProvisionRequest
		secrets, env       []string
		idleTimeout        time.Duration
		idleTimeoutGiven   bool
		idleAction         string
		size, repo, branch string
	)
	cmd := &cobra.Command{
		Use:   "provision SESSION",
		Short: "Create and start a sandbox for a new session id",
		Long: `provision creates a sandbox and waits until it runs.

Secrets are given to commands as environment variables and redacted from all
output; their values never go on the command line:
  --secret NAME         the value of the environment variable NAME
  --secret NAME=@FILE   the contents of FILE (one trailing newline dropped)`,
		Example: `  sbx provision demo-1
  sbx provision fix-1 --size standard-2 --repo octo/app --branch main
  OPENAI_API_KEY=... sbx provision agent-7 --secret OPENAI_API_KEY --env MODE=test --idle-timeout 10m --idle-action pause`,
		Args: args(1, 1, "SESSION"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := checkSession(argv[0]); err != nil {
				return err
			}
			req.SessionID, req.Size, req.GitRepo, req.GitBranch = argv[0], size, repo, branch
			if branch != "" && repo == "" {
				return usagef("--branch needs --repo")
			}
			var err error
			if req.Env, err = parseKV("--env", env); err != nil {
				return err
			}
			if req.Secrets, err = a.parseSecrets(secrets); err != nil {
				return err
			}
			if idleTimeoutGiven = cmd.Flags().Changed("idle-timeout"); idleTimeoutGiven {
				if idleTimeout < 0 || idleTimeout%time.Second != 0 {
					return usagef("--idle-timeout: a whole number of seconds, 0 or more (e.g. 10m, 90s; 0 turns it off)")
				}
				s := int(idleTimeout / time.Second)
				req.IdleTimeoutSeconds = &s
			}
			switch idleAction {
			case "", "pause", "teardown":
				req.IdleAction = idleAction
			default:
				return usagef("--idle-action: pause or teardown")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			stop := a.spinner("Provisioning " + req.SessionID)
			sb, err := c.Provision(cmd.Context(), req)
			stop()
			if err != nil {
				return err
			}
			if a.jsonOut {
				return a.printJSON(sb.Raw)
			}
			fmt.Fprintf(a.stdout, "%s %s (%s: %d vCPU, %s memory, %s disk)\n", sb.SessionID, sb.Status, sb.Size,
				sb.Resources.VCPUs, humanBytes(int64(sb.Resources.MemoryMiB)<<20), humanBytes(int64(sb.Resources.DiskMiB)<<20))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&size, "size", "", "size: standard-1 ... standard-5 (default: the server's)")
	f.StringVar(&repo, "repo", "", "Git repository owner/name to clone into /workspace")
	f.StringVar(&branch, "branch", "", "branch of --repo")
	f.StringVar(&req.ProjectID, "project", "", "project id (default: the token's)")
	f.StringArrayVar(&secrets, "secret", nil, "secret NAME (value from $NAME) or NAME=@FILE; repeatable")
	f.StringArrayVar(&env, "env", nil, "environment variable K=V for commands; repeatable")
	f.DurationVar(&idleTimeout, "idle-timeout", 0, "tear down (or pause) after this long unused, e.g. 10m; 0 turns it off")
	f.StringVar(&idleAction, "idle-action", "", "what the idle timeout does: pause or teardown")
	return cmd
}

// parseKV reads K=V pairs.
func parseKV(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("%s %q: expected K=V", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

// parseSecrets reads --secret NAME (from the environment) and NAME=@FILE.
// A literal value is refused: it would show in the process list and the
// shell's history.
func (a *app) parseSecrets(specs []string) (map[string]string, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, s := range specs {
		name, val, hasVal := strings.Cut(s, "=")
		if name == "" {
			return nil, usagef("--secret %q: expected NAME or NAME=@FILE", s)
		}
		switch {
		case !hasVal:
			v := a.getenv(name)
			if v == "" {
				return nil, usagef("--secret %s: the environment variable %s is not set (or use --secret %s=@FILE)", name, name, name)
			}
			m[name] = v
		case strings.HasPrefix(val, "@"):
			b, err := os.ReadFile(val[1:])
			if err != nil {
				return nil, fmt.Errorf("--secret %s: %w", name, err)
			}
			v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
			if v == "" {
				return nil, usagef("--secret %s: %s is empty", name, val[1:])
			}
			m[name] = v
		default:
			return nil, usagef("--secret %s=...: a value on the command line would show in the process list; use --secret %s (from the environment) or --secret %s=@FILE", name, name, name)
		}
	}
	return m, nil
}

func (a *app) lsCmd() *cobra.Command {
	var status string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the organization's sessions, newest first",
		Args:    args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			l, err := c.List(cmd.Context(), status)
			if err != nil {
				return err
			}
			if a.jsonOut {
				return a.printJSON(l.Raw)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tSTATUS\tSIZE\tCREATED\tCREDITS")
			for _, s := range l.Sandboxes {
				st := s.Status
				if s.StatusReason != nil && *s.StatusReason != "" {
					st += " (" + *s.StatusReason + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.SessionID, st, s.Size, ago(s.CreatedAt), milli(s.Credits.UsedMilli))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&status, "status", "", "only sessions with this status (running, paused, stopped, failed, ...)")
	return cmd
}

// ago formats a time as how long ago it was.
func ago(t time.Time) string {
	d := time.Since(t).Round(time.Second)
	switch {
	case t.IsZero():
		return "-"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	default:
		return t.Local().Format("2006-01-02")
	}
}

func (a *app) getCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get SESSION",
		Short: "Show one session",
		Args:  args(1, 1, "SESSION"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := checkSession(argv[0]); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), argv[0])
			if err != nil {
				return err
			}
			if a.jsonOut {
				return a.printJSON(sb.Raw)
			}
			a.describe(sb)
			return nil
		},
	}
}

// describe prints a session for people.
func (a *app) describe(sb *client.Sandbox) {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	st := sb.Status
	if sb.StatusReason != nil && *sb.StatusReason != "" {
		st += " (" + *sb.StatusReason + ")"
	}
	fmt.Fprintf(tw, "session:\t%s\n", sb.SessionID)
	fmt.Fprintf(tw, "status:\t%s\n", st)
	fmt.Fprintf(tw, "size:\t%s (%d vCPU, %s memory, %s disk)\n", sb.Size, sb.Resources.VCPUs,
		humanBytes(int64(sb.Resources.MemoryMiB)<<20), humanBytes(int64(sb.Resources.DiskMiB)<<20))
	if sb.GitRepo != nil {
		b := ""
		if sb.GitBranch != nil {
			b = " (" + *sb.GitBranch + ")"
		}
		fmt.Fprintf(tw, "git:\t%s%s\n", *sb.GitRepo, b)
	}
	fmt.Fprintf(tw, "created:\t%s\n", sb.CreatedAt.Local().Format(time.RFC3339))
	fmt.Fprintf(tw, "credits used:\t%s\n", milli(sb.Credits.UsedMilli))
	fmt.Fprintf(tw, "egress:\t%s of %s\n", humanBytes(sb.Egress.BytesUsed), humanBytes(sb.Egress.BytesLimit))
	if sb.Storage.SavedBytes > 0 {
		fmt.Fprintf(tw, "saved:\t%s\n", humanBytes(sb.Storage.SavedBytes))
	}
	keys := make([]string, 0, len(sb.URLs))
	for k := range sb.URLs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, "%s:\t%s\n", k, sb.URLs[k])
	}
	tw.Flush()
}

// lifecycleCmd is teardown, resume or pause.
func (a *app) lifecycleCmd(name, short, doing string) *cobra.Command {
	return &cobra.Command{
		Use:   name + " SESSION",
		Short: short,
		Args:  args(1, 1, "SESSION"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id := argv[0]
			if err := checkSession(id); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			op := map[string]func(context.Context, string) (*client.Sandbox, error){
				"teardown": c.Teardown, "resume": c.Resume, "pause": c.Pause}[name]
			stop := a.spinner(doing + " " + id)
			sb, err := op(cmd.Context(), id)
			stop()
			if err != nil {
				return err
			}
			if a.jsonOut {
				return a.printJSON(sb.Raw)
			}
			line := sb.SessionID + " " + sb.Status
			if t := sb.Teardown; t != nil {
				line += fmt.Sprintf(" (workspace %s, saved %s", humanBytes(t.WorkspaceBytes), humanBytes(t.SavedBytes))
				switch {
				case t.GitPushed:
					line += fmt.Sprintf(", pushed %d commit(s)", len(t.GitCommits))
				case t.GitError != nil:
					line += ", git push failed: " + *t.GitError
				}
				line += ")"
			}
			fmt.Fprintln(a.stdout, line)
			return nil
		},
	}
}

func (a *app) deleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "delete SESSION",
		Short: "Tear down a session if needed and delete its saved workspace",
		Args:  args(1, 1, "SESSION"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id := argv[0]
			if err := checkSession(id); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			stop := a.spinner("Deleting " + id)
			err = c.Delete(cmd.Context(), id)
			stop()
			if err != nil {
				return err
			}
			if a.jsonOut {
				return a.printValue(map[string]any{"sessionId": id, "deleted": true})
			}
			fmt.Fprintf(a.stdout, "%s deleted\n", id)
			return nil
		},
	}
}
