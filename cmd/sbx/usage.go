package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandboxd/server/client"
)

func (a *app) usageCmd() *cobra.Command {
	var opts client.UsageOptions
	cmd := &cobra.Command{
		Use:   "usage [--period current|previous|YYYY-MM-DD] [--org ID]",
		Short: "Show the organization's plan, credits and usage per session and per day",
		Long: `usage shows the organization's plan, its billing period, the period's
allowance, operators' grants, credits used and remaining (in credits, to the
thousandth), then the sessions and the days with running time in the period.
Running sandboxes draw credits at their size's rate; paused and stopped ones
draw nothing.`,
		Args: args(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			u, err := c.Usage(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if a.jsonOut {
				return a.printJSON(u.Raw)
			}
			printUsage(a.stdout, u, time.Now())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Period, "period", "", "current (default), previous, or a date (YYYY-MM-DD) in the period wanted")
	f.StringVar(&opts.OrgID, "org", "", "another organization's id (operators only)")
	return cmd
}

// printUsage prints usage for people: the totals, then a table of the
// period's sessions and one of its days.
func printUsage(w io.Writer, u *client.Usage, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	org := u.Organization.Name
	if u.Organization.ID != "" {
		org += " (" + u.Organization.ID + ")"
	}
	fmt.Fprintf(tw, "organization:\t%s\n", org)
	fmt.Fprintf(tw, "plan:\t%s\n", planSummary(u.Plan))
	fmt.Fprintf(tw, "period:\t%s\n", periodSummary(u.Period, now))
	fmt.Fprintf(tw, "allowance:\t%s credits\n", milli(u.Allowance.Milli))
	fmt.Fprintf(tw, "granted:\t%s\n", milli(u.Granted.Milli))
	fmt.Fprintf(tw, "used:\t%s\n", milli(u.Used.Milli))
	fmt.Fprintf(tw, "remaining:\t%s\n", milli(u.Remaining.Milli))
	tw.Flush()

	fmt.Fprintln(w)
	if len(u.Sessions) == 0 {
		fmt.Fprintln(w, "No session ran in this period.")
	} else {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SESSION\tSIZE\tSTATUS\tRUNNING\tCREDITS\tEGRESS\tSAVED")
		for _, s := range u.Sessions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.SessionID, orDash(s.Size), orDash(s.Status),
				seconds(s.RunningSeconds), milli(s.Credits.Milli), humanBytes(s.EgressBytes), humanBytes(s.SavedBytes))
		}
		tw.Flush()
	}
	if len(u.Days) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DAY (UTC)\tRUNNING\tCREDITS")
		for _, d := range u.Days {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", d.Date, seconds(d.RunningSeconds), milli(d.Credits.Milli))
		}
		tw.Flush()
	}
}

// planSummary is a plan's name and what it allows, on one line.
func planSummary(p client.Plan) string {
	size := "any size"
	if p.LargestSize != "" {
		size = "sizes up to " + p.LargestSize
	}
	pause := "pause"
	if !p.Pause {
		pause = "no pause"
	}
	return fmt.Sprintf("%s (%s credits a month, %s, %d sandboxes at once, %s)",
		p.Name, strconv.FormatFloat(p.MonthlyCredits, 'f', -1, 64), size, p.MaxConcurrent, pause)
}

// periodSummary is a billing period's dates, and where now is in it.
func periodSummary(p client.Period, now time.Time) string {
	s := p.Start.UTC().Format(time.DateOnly) + " to " + p.End.UTC().Format(time.DateOnly) + " UTC"
	switch {
	case p.End.IsZero():
	case now.Before(p.Start):
		s += " (not started)"
	case now.Before(p.End):
		left := p.End.Sub(now)
		if left >= 48*time.Hour {
			s += fmt.Sprintf(" (current, %d days left)", int(left.Hours()/24))
		} else {
			s += fmt.Sprintf(" (current, %s left)", left.Round(time.Minute))
		}
	default:
		s += " (ended)"
	}
	return s
}

// milli formats thousandths of a credit as credits with 3 decimals,
// exactly.
func milli(m int64) string {
	sign := ""
	if m < 0 {
		sign, m = "-", -m
	}
	return fmt.Sprintf("%s%d.%03d", sign, m/1000, m%1000)
}

// seconds formats a running time to the second.
func seconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// detailOrder is the order of the error details sbx knows (the others
// follow, sorted).
var detailOrder = []string{"remaining", "needed", "size", "creditsPerHour", "periodEnd", "plan"}

// formatDetails puts an API error's details on one line:
// "remaining: 0  needed: 0.084  size: standard-1 ...".
func formatDetails(d map[string]any) string {
	keys := make([]string, 0, len(d))
	for _, k := range detailOrder {
		if _, ok := d[k]; ok {
			keys = append(keys, k)
		}
	}
	var rest []string
	for k := range d {
		if !slices.Contains(detailOrder, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	parts := make([]string, 0, len(d))
	for _, k := range append(keys, rest...) {
		parts = append(parts, k+": "+detailValue(d[k]))
	}
	return strings.Join(parts, "  ")
}

// detailValue formats one detail: numbers as written, strings bare.
func detailValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}
