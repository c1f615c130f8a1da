package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandboxd/server/config"
	"sandboxd/server/credits"
	"sandboxd/server/sandbox"
	"sandboxd/store"
)

// Operator commands on the data dir's database. What changes an
// organization's plan or credits is audited in that organization's log,
// as the API's operator routes are, with "via": "cli" and the host user.

// hostUser names who ran the command on the host (sudo's caller first).
func hostUser() string {
	if u := os.Getenv("SUDO_USER"); u != "" {
		return u
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return fmt.Sprint(os.Geteuid())
}

// audit records an operator command in org's audit log.
func audit(db *store.DB, orgID, action string, details map[string]any) {
	details["via"] = "cli"
	details["hostUser"] = hostUser()
	db.Audit(store.AuditRecord{OrgID: orgID, Action: action, Outcome: "ok", Status: 200, RemoteAddr: "local", Details: details})
}

// findOrg resolves an organization's id or name with a message that says
// what to do.
func findOrg(ctx context.Context, db *store.DB, idOrName string) (store.Org, error) {
	o, err := db.FindOrg(ctx, idOrName)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return o, fmt.Errorf("no organization %q (by id or name): see 'sandboxd org list'", idOrName)
	case errors.Is(err, store.ErrConflict):
		return o, fmt.Errorf("more than one organization is named %q: give its id (see 'sandboxd org list')", idOrName)
	}
	return o, err
}

// openOrg opens the data dir's database and finds the organization
// idOrName; the caller closes db.
func (c *cli) openOrg(ctx context.Context, idOrName string) (*config.Config, *store.DB, store.Org, error) {
	cfg, db, err := c.openDB(false)
	if err != nil {
		return nil, nil, store.Org{}, err
	}
	org, err := findOrg(ctx, db, idOrName)
	if err != nil {
		db.Close()
		return nil, nil, store.Org{}, err
	}
	return cfg, db, org, nil
}

func (c *cli) orgCmd() *cobra.Command {
	org := &cobra.Command{Use: "org", Short: "Organizations"}
	var plan string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an organization with an owner; prints the owner's token once",
		Args:  exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := store.ValidName(args[0]); err != nil {
				return usagef("organization name: %v", err)
			}
			cfg, db, err := c.openDB(true)
			if err != nil {
				return err
			}
			defer db.Close()
			if plan != "" {
				if _, ok := cfg.Plans.Get(plan); !ok {
					return usagef("--plan: one of %v", cfg.Plans.Names())
				}
			}
			p, token, err := db.CreateOrg(cmd.Context(), args[0], "owner")
			if err != nil {
				return err
			}
			if plan != "" {
				if err := db.SetPlan(cmd.Context(), p.Org.ID, plan); err != nil {
					return err
				}
			}
			pl, _ := cfg.Plans.Get(plan)
			audit(db, p.Org.ID, "org.create", map[string]any{"orgId": p.Org.ID, "name": args[0], "plan": pl.Name})
			fmt.Fprintf(c.stderr, "organization %s (%s) created on the %s plan; owner token (shown once):\n", args[0], p.Org.ID, pl.Name)
			fmt.Fprintln(c.stdout, token)
			return nil
		},
	}
	create.Flags().StringVar(&plan, "plan", "", "its plan (default: plans.default)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List organizations with their plan and this period's credits",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, db, err := c.openDB(false)
			if err != nil {
				return err
			}
			defer db.Close()
			orgs, err := db.ListOrgs(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tPLAN\tPERIOD\tUSED\tREMAINING")
			for _, o := range orgs {
				u, err := sandbox.UsageAt(cmd.Context(), db, cfg.Plans, o.ID, openUntil(cfg.DataDir), time.Now(), quietLog())
				if err != nil {
					return err
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s..%s\t%s\t%s\n", o.ID, o.Name, u.Plan.Name, u.Period.Start.Format("2006-01-02"),
					u.Period.End.Format("2006-01-02"), u.Used(), u.Remaining())
			}
			return tw.Flush()
		},
	}
	org.AddCommand(create, list)
	return org
}

// openUntil is how far open runs count: up to now while a server runs
// (it sees them alive), else up to where it last saw them (zero time),
// which is what its next start charges: downtime is never counted.
func openUntil(dataDir string) time.Time {
	if serverRunning(dataDir) {
		return time.Now()
	}
	return time.Time{}
}

func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

func (c *cli) userCmd() *cobra.Command {
	u := &cobra.Command{Use: "user", Short: "Members of organizations"}
	var role string
	var operator bool
	add := &cobra.Command{
		Use:   "add ORG NAME",
		Short: "Add a user to an organization with a role; prints their token once",
		Long: `Adds a new user NAME to the organization ORG (its id or name) with --role
(owner, admin, developer or viewer) and prints the user's first token once, alone
on stdout. --operator also lets the user change any organization's plan and
grant credits (PUT /v1/orgs/:orgId/plan, POST /v1/orgs/:orgId/credits).`,
		Args: exactArgs("ORG", "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !store.ValidRole(role) {
				return usagef("--role: one of owner, admin, developer, viewer")
			}
			if err := store.ValidName(args[1]); err != nil {
				return usagef("user name: %v", err)
			}
			_, db, org, err := c.openOrg(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer db.Close()
			usr, _, token, err := db.AddMember(cmd.Context(), org.ID, args[1], role)
			if err != nil {
				return err
			}
			if operator {
				if err := db.SetOperator(cmd.Context(), usr.ID, true); err != nil {
					return err
				}
			}
			audit(db, org.ID, "member.add", map[string]any{"userId": usr.ID, "name": usr.Name, "role": role, "operator": operator})
			what := ""
			if operator {
				what = ", an operator of this installation"
			}
			fmt.Fprintf(c.stderr, "user %s (%s) added to %s as %s%s; token (shown once):\n", usr.Name, usr.ID, org.Name, role, what)
			fmt.Fprintln(c.stdout, token)
			return nil
		},
	}
	add.Flags().StringVar(&role, "role", store.RoleDeveloper, "owner, admin, developer or viewer")
	add.Flags().BoolVar(&operator, "operator", false, "may change plans and grant credits of every organization")
	u.AddCommand(add)
	return u
}

func (c *cli) tokenCmd() *cobra.Command {
	t := &cobra.Command{Use: "token", Short: "Bearer tokens"}
	var name string
	create := &cobra.Command{
		Use:   "create ORG USER",
		Short: "Create a token for a member (user id or name) of an organization; prints it once",
		Args:  exactArgs("ORG", "USER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := store.ValidName(name); err != nil {
				return usagef("--name: %v", err)
			}
			_, db, org, err := c.openOrg(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer db.Close()
			ms, err := db.ListMembers(cmd.Context(), org.ID)
			if err != nil {
				return err
			}
			var found []store.Member
			for _, m := range ms {
				if m.UserID == args[1] || m.UserName == args[1] {
					found = append(found, m)
				}
			}
			switch {
			case len(found) == 0:
				names := make([]string, len(ms))
				for i, m := range ms {
					names[i] = m.UserName + " (" + m.UserID + ")"
				}
				return fmt.Errorf("%s has no member %q; its members: %s", org.Name, args[1], strings.Join(names, ", "))
			case len(found) > 1:
				return fmt.Errorf("%s has %d members named %q: give the user's id", org.Name, len(found), args[1])
			}
			tok, secret, err := db.CreateToken(cmd.Context(), org.ID, found[0].UserID, name)
			if err != nil {
				return err
			}
			audit(db, org.ID, "token.create", map[string]any{"tokenId": tok.ID, "userId": found[0].UserID, "name": name})
			fmt.Fprintf(c.stderr, "token %s (%s) for %s in %s (role %s; shown once):\n", name, tok.ID, found[0].UserName, org.Name, found[0].Role)
			fmt.Fprintln(c.stdout, secret)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "cli", "the token's name")
	t.AddCommand(create)
	return t
}

func (c *cli) planCmd() *cobra.Command {
	p := &cobra.Command{Use: "plan", Short: "Organizations' plans (configs/plans.yaml, or plans.configFile)"}
	set := &cobra.Command{
		Use:   "set ORG PLAN",
		Short: "Move an organization to a plan (audited)",
		Args:  exactArgs("ORG", "PLAN"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, db, org, err := c.openOrg(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer db.Close()
			pl, ok := cfg.Plans.Get(args[1])
			if args[1] == "" || !ok {
				return usagef("plan %q: one of %v", args[1], cfg.Plans.Names())
			}
			if err := db.SetPlan(cmd.Context(), org.ID, pl.Name); err != nil {
				return err
			}
			audit(db, org.ID, "org.plan_set", map[string]any{"orgId": org.ID, "plan": pl.Name})
			fmt.Fprintf(c.stdout, "%s (%s) is on the %s plan: %s credits a month, largest size %s, %d at once\n",
				org.Name, org.ID, pl.Name, pl.MonthlyCredits, orAny(pl.LargestSize), pl.MaxConcurrent)
			return nil
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the plans",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := c.config()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PLAN\tCREDITS/MONTH\tLARGEST SIZE\tAT ONCE\tEGRESS MiB\tSTORAGE MiB\tPAUSE")
			for _, pl := range cfg.Plans.List {
				def := ""
				if pl.Name == cfg.Plans.Default {
					def = " (default)"
				}
				fmt.Fprintf(tw, "%s%s\t%s\t%s\t%d\t%s\t%s\t%v\n", pl.Name, def, pl.MonthlyCredits, orAny(pl.LargestSize), pl.MaxConcurrent,
					orNone(pl.EgressMiB), orNone(pl.StorageMiB), pl.Pause)
			}
			return tw.Flush()
		},
	}
	p.AddCommand(set, list)
	return p
}

func orAny(s string) string {
	if s == "" {
		return "any"
	}
	return s
}

func orNone(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func (c *cli) creditsCmd() *cobra.Command {
	cr := &cobra.Command{Use: "credits", Short: "Usage credits"}
	var note string
	grant := &cobra.Command{
		Use:   "grant ORG AMOUNT",
		Short: "Add credits to an organization's current period (audited)",
		Long: `Adds AMOUNT credits (at most 3 decimals) to the current billing period of the
organization ORG (its id or name). A negative amount takes credits back; put it
after "--": sandboxd credits grant acme -- -5`,
		Args: exactArgs("ORG", "AMOUNT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			amt, err := credits.ParseGrant(args[1])
			if err != nil {
				return usagef("%v", err)
			}
			if len(note) > 500 {
				return usagef("--note: at most 500 bytes")
			}
			cfg, db, org, err := c.openOrg(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer db.Close()
			now := time.Now().UTC()
			g, err := db.AddCreditGrant(cmd.Context(), store.CreditGrant{OrgID: org.ID, AmountMilli: int64(amt), Time: now, GrantedBy: "cli:" + hostUser(), Note: note})
			if err != nil {
				return err
			}
			audit(db, org.ID, "org.credits_grant", map[string]any{"orgId": org.ID, "creditsMilli": int64(amt), "note": note, "grantId": g.ID})
			u, err := sandbox.UsageAt(cmd.Context(), db, cfg.Plans, org.ID, openUntil(cfg.DataDir), now, quietLog())
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "granted %s credits to %s (%s) for the period %s..%s; %s remaining\n", amt, org.Name, org.ID,
				u.Period.Start.Format("2006-01-02"), u.Period.End.Format("2006-01-02"), u.Remaining())
			return nil
		},
	}
	grant.Flags().StringVar(&note, "note", "", "why (kept with the grant)")
	cr.AddCommand(grant)
	return cr
}

var _ sandbox.UsageStore = (*store.DB)(nil)
