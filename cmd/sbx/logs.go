package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"sandboxd/server/client"
)

func (a *app) logsCmd() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs SESSION [-f]",
		Short: "Show a session's log: gVisor's kernel output and events",
		Long: `logs prints the session's retained log: lines of gVisor's kernel (warnings,
unsupported syscalls) and events (process starts and exits, terminals, oom,
egress denials, ...). With -f it goes on printing new entries until
interrupted. With --json each entry is printed as the server's JSON line.`,
		Args: args(1, 1, "SESSION"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id := argv[0]
			if err := checkSession(id); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if follow {
				err := c.FollowLogs(cmd.Context(), id, func(e client.LogEntry) error { return a.printLogEntry(e) })
				if errors.Is(err, context.Canceled) {
					return nil // interrupted: the way -f ends
				}
				return err
			}
			entries, err := c.Logs(cmd.Context(), id)
			if err != nil {
				return err
			}
			for _, e := range entries {
				if err := a.printLogEntry(e); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new entries")
	return cmd
}

// printLogEntry prints one entry: its JSON line with --json, else
// "TIME TYPE KIND/SERVICE TEXT key=value...".
func (a *app) printLogEntry(e client.LogEntry) error {
	if a.jsonOut {
		_, err := fmt.Fprintf(a.stdout, "%s\n", e.Raw)
		return err
	}
	var b strings.Builder
	b.WriteString(e.Time.Local().Format("2006-01-02 15:04:05.000"))
	b.WriteString(" " + e.Type)
	switch e.Type {
	case "kernel":
		b.WriteString(" " + e.Line)
	case "service":
		b.WriteString(" " + e.Service + ": " + e.Line)
	default:
		if e.Kind != "" {
			b.WriteString(" " + e.Kind)
		}
		keys := make([]string, 0, len(e.Fields))
		for k := range e.Fields {
			switch k {
			case "type", "time", "kind":
				continue
			}
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			b.WriteString(" " + k + "=" + logValue(e.Fields[k]))
		}
	}
	_, err := fmt.Fprintln(a.stdout, b.String())
	return err
}

// logValue formats a field: plain when it is one simple word, else JSON.
func logValue(v any) string {
	if s, ok := v.(string); ok && s != "" && !strings.ContainsAny(s, " \t\n\"=") {
		return s
	}
	if n, ok := v.(json.Number); ok {
		return n.String()
	}
	b, _ := json.Marshal(v)
	return string(b)
}
