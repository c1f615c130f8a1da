package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"sandboxd/runsc"
	"sandboxd/server"
	"sandboxd/server/config"
	"sandboxd/store"
)

const gcLong = `Lists this installation's leftovers on the host that no session claims: runsc
containers, netns (<id> and <id>-px), cgroups, mounts and sandbox dirs (bundle,
logs, disk) under <data-dir>/sandboxes/, per container id. A dry run by default:
nothing changes until --apply, which removes exactly what it lists.

Only resources named with this data dir's prefix (sbx + 6 hex of the hash of its
absolute path: give the data dir as the server is given it) are considered:
never another data dir's, never anything without the prefix. runsc's state
root is <data-dir>/runsc; cgroups are looked for in every hierarchy, not only
under gc's own cgroup (the server's sandboxes nest under the server's).

What a session row claims of its container id:
  provisioning, running, paused, stopping   everything (a paused one keeps its
                                            checkpoint and disk; a resume may be
                                            starting its container)
  stopped, failed                           its sandbox dir and disk (its saved
                                            state); a container, netns, cgroups
                                            or mounts of it are removed
  deleted, or no row at all                 nothing: the whole sandbox dir goes,
                                            disk included
A status this build does not know claims everything.

The dry run works with the server stopped or running (while it runs, a sandbox
whose files changed in the last 60 s is marked as skipped: it may be starting).
--apply needs the server stopped, and holds the data dir's lock while it
removes, so no server can start meanwhile: a running server changes sandboxes
under its own session locks, which gc cannot take, and it removes what no
session claims itself at every start. Stopping it leaves sandboxes running
(systemctl stop sandboxd; the next start adopts them). The host is listed
first, then the rows are read. gc unmounts runsc's null-netns once no runsc
container is left. A directory that is still a mount point is never deleted,
and nothing is followed through a symlink out of the sandboxes dir.

Exit status 0 when done (nothing found included), 1 if anything failed.`

func (c *cli) gcCmd() *cobra.Command {
	var apply, asJSON bool
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "List (with --apply remove) this installation's leftovers no session claims",
		Long:  gcLong,
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.gc(cmd.Context(), apply, asJSON)
		},
	}
	cmd.Flags().BoolVar(&apply, "apply", false, "remove what is listed (default: a dry run)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

// gcRecent is how recently a leftover may have changed for gc to leave it
// alone while the server runs.
const gcRecent = 60 * time.Second

// claim is what a session row claims of its container id's resources.
type claim int

const (
	claimNothing claim = iota // deleted, or no row
	claimSaved                // the sandbox dir and disk (stopped, failed)
	claimAll                  // everything (live: provisioning, running, paused, stopping)
)

// claimOf is what a row in status claims. A status this build does not
// know claims everything.
func claimOf(status string) claim {
	switch status {
	case store.StatusDeleted:
		return claimNothing
	case store.StatusStopped, store.StatusFailed:
		return claimSaved
	}
	return claimAll
}

// rowClaim is the claim of the rows of container id (none: claimNothing)
// and the row that makes it.
func rowClaim(rows []store.SessionContainer, id string) (claim, store.SessionContainer) {
	c, row := claimNothing, store.SessionContainer{}
	for _, r := range rows {
		if r.ContainerID == id && (row.ID == "" || claimOf(r.Status) > c) {
			c, row = claimOf(r.Status), r
		}
	}
	return c, row
}

type gcItem struct {
	Kind string `json:"kind"` // runsc container, netns, cgroup, mount, sandbox dir, disk
	Name string `json:"name"`
}

// gcEntry is what gc removes (or removed) of one container id.
type gcEntry struct {
	ID       string   `json:"id"`
	Session  string   `json:"session,omitempty"` // the row's key (pk), if there is a row
	Status   string   `json:"status,omitempty"`  // the row's status
	KeepDisk bool     `json:"keepDisk"`          // the row claims the sandbox dir and disk
	Items    []gcItem `json:"items"`
	Skipped  string   `json:"skipped,omitempty"` // why nothing of it is removed (now)
	Removed  bool     `json:"removed"`
	Error    string   `json:"error,omitempty"`
}

// gcPlan decides what gc removes from what the host holds (ls, listed
// first, with every id of the prefix) and the session rows (read after
// it). sandboxes is <data-dir>/sandboxes. While the server runs, a
// leftover modified less than gcRecent before now is skipped.
func gcPlan(ls []runsc.Leftover, rows []store.SessionContainer, sandboxes string, serverRunning bool, now time.Time) []gcEntry {
	out := []gcEntry{}
	for _, l := range ls {
		c, row := rowClaim(rows, l.ID)
		e := gcEntry{ID: l.ID, Session: row.ID, Status: row.Status, KeepDisk: c == claimSaved}
		switch c {
		case claimAll:
			continue
		case claimSaved:
			if !l.Live() {
				continue // its saved state, nothing else
			}
		}
		if l.Container {
			e.Items = append(e.Items, gcItem{"runsc container", l.ID})
		}
		if l.Netns {
			e.Items = append(e.Items, gcItem{"netns", l.ID})
		}
		if l.ProxyNetns {
			e.Items = append(e.Items, gcItem{"netns", l.ID + "-px"})
		}
		for _, p := range l.Cgroups {
			e.Items = append(e.Items, gcItem{"cgroup", p})
		}
		for _, m := range l.Mounts {
			e.Items = append(e.Items, gcItem{"mount", m})
		}
		if c == claimNothing && l.Dir {
			d := filepath.Join(sandboxes, l.ID)
			e.Items = append(e.Items, gcItem{"sandbox dir", d})
			if l.Disk {
				e.Items = append(e.Items, gcItem{"disk", filepath.Join(d, "disk.img")})
			}
		}
		if len(e.Items) == 0 {
			continue
		}
		if serverRunning {
			e.Skipped = recentSkip(l.Modified, now)
		}
		out = append(out, e)
	}
	return out
}

// recentSkip says why a leftover changed at modified is skipped while the
// server runs ("" if it is not recent).
func recentSkip(modified, now time.Time) string {
	if age := now.Sub(modified); age < gcRecent {
		return fmt.Sprintf("changed %s ago while the server runs (it may be starting): run gc again later", age.Round(time.Second))
	}
	return ""
}

// gcReport is gc's result (--json).
type gcReport struct {
	DataDir       string    `json:"dataDir"`
	Prefix        string    `json:"prefix"`
	ServerRunning bool      `json:"serverRunning"`
	Applied       bool      `json:"applied"`
	Sandboxes     []gcEntry `json:"sandboxes"`
	// NullNetns is runsc's null-netns mount when gc removes (removed)
	// it: with the server stopped, once no runsc container is left.
	NullNetns *gcNullNetns `json:"nullNetns,omitempty"`
	Errors    int          `json:"errors"`
}

type gcNullNetns struct {
	Path    string `json:"path"`
	Removed bool   `json:"removed"`
	Error   string `json:"error,omitempty"`
}

func (c *cli) gc(ctx context.Context, apply, asJSON bool) error {
	if err := requireRoot(); err != nil {
		return err
	}
	cfg, db, err := c.openDB(false)
	if err != nil {
		return err
	}
	defer db.Close()
	running := serverRunning(cfg.DataDir)
	if apply {
		unlock, err := lockDataDir(cfg.DataDir)
		if err != nil {
			return errors.New("a server runs on this data dir: gc --apply needs it stopped (it removes unclaimed leftovers itself at each start); " +
				"stop it (its sandboxes keep running, and its next start adopts them) and run gc --apply again; a dry run works beside it")
		}
		defer unlock()
		running = false
	}
	rc := server.RuntimeConfig(cfg, slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	// gc runs in a cgroup of its own, not the server's.
	rc.CgroupsAnywhere = true
	rt, err := runsc.New(rc)
	if err != nil {
		return err
	}
	// The host first, then the rows: what was being created when the host
	// was listed has its row by the time the rows are read.
	ls, err := rt.Leftovers(ctx, nil)
	if err != nil {
		return fmt.Errorf("%w (nothing removed)", err)
	}
	rows, err := db.ListSessionContainers(ctx)
	if err != nil {
		return err
	}
	sandboxes := filepath.Join(cfg.DataDir, "sandboxes")
	rep := gcReport{DataDir: cfg.DataDir, Prefix: config.ResourcePrefix(cfg.DataDir), ServerRunning: running, Applied: apply,
		Sandboxes: gcPlan(ls, rows, sandboxes, running, time.Now())}
	if apply {
		for i := range rep.Sandboxes {
			e := &rep.Sandboxes[i]
			if e.Skipped != "" {
				continue
			}
			if ctx.Err() != nil {
				e.Skipped = "interrupted"
				continue
			}
			if err := rt.Destroy(ctx, e.ID, runsc.DestroyOpts{KeepDisk: e.KeepDisk}); err != nil {
				e.Error = err.Error()
				continue
			}
			e.Removed = true
		}
	}
	// runsc's null-netns: the server releases it itself when it stops.
	if p, mounted := rt.NullNetns(); mounted && !running && !containersLeft(ls, rep.Sandboxes) {
		rep.NullNetns = &gcNullNetns{Path: p}
		if apply {
			rt.ReleaseIdle()
			if _, still := rt.NullNetns(); still {
				rep.NullNetns.Error = "still mounted"
			} else {
				rep.NullNetns.Removed = true
			}
		}
	}
	for _, e := range rep.Sandboxes {
		if e.Error != "" {
			rep.Errors++
		}
	}
	if rep.NullNetns != nil && rep.NullNetns.Error != "" {
		rep.Errors++
	}
	if asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printGC(c.stdout, rep)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if rep.Errors > 0 {
		fmt.Fprintf(c.stderr, "sandboxd gc: %d failed\n", rep.Errors)
		return exitCode(1)
	}
	return nil
}

// containersLeft reports whether a runsc container of ls stays: claimed,
// skipped, or not removed.
func containersLeft(ls []runsc.Leftover, es []gcEntry) bool {
	goes := map[string]bool{}
	for _, e := range es {
		if e.Skipped == "" && e.Error == "" && len(e.Items) > 0 {
			goes[e.ID] = true
		}
	}
	for _, l := range ls {
		if l.Container && !goes[l.ID] {
			return true
		}
	}
	return false
}

func printGC(w io.Writer, rep gcReport) {
	state := "stopped"
	if rep.ServerRunning {
		state = "running"
	}
	fmt.Fprintf(w, "data dir %s (prefix %s), server %s\n", rep.DataDir, rep.Prefix, state)
	if len(rep.Sandboxes) == 0 && rep.NullNetns == nil {
		fmt.Fprintln(w, "nothing to remove: no leftovers of this installation")
		return
	}
	removed, skipped := 0, 0
	for _, e := range rep.Sandboxes {
		why := "no session row: everything goes"
		switch {
		case e.KeepDisk:
			why = fmt.Sprintf("session %s is %s: its sandbox dir and disk stay", e.Session, e.Status)
		case e.Session != "":
			why = fmt.Sprintf("session %s is %s: everything goes", e.Session, e.Status)
		}
		switch {
		case e.Skipped != "":
			why = "skipped: " + e.Skipped
			skipped++
		case e.Error != "":
			why += "; FAILED: " + e.Error
		case e.Removed:
			why += "; removed"
			removed++
		}
		fmt.Fprintf(w, "\n%s  %s\n", e.ID, why)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, it := range e.Items {
			fmt.Fprintf(tw, "  %s\t%s\n", it.Kind, it.Name)
		}
		tw.Flush()
	}
	if n := rep.NullNetns; n != nil {
		what := "\nrunsc null-netns mount  " + n.Path
		switch {
		case n.Error != "":
			what += "  FAILED: " + n.Error
		case n.Removed:
			what += "  removed"
		}
		fmt.Fprintln(w, what)
	}
	fmt.Fprintln(w)
	if !rep.Applied {
		fmt.Fprintf(w, "dry run: nothing changed; the leftovers of %s would be removed (%d skipped); run with --apply to remove them\n",
			nSandboxes(len(rep.Sandboxes)-skipped), skipped)
		return
	}
	fmt.Fprintf(w, "removed the leftovers of %s (%d skipped, %d failed)\n", nSandboxes(removed), skipped, rep.Errors)
}

func nSandboxes(n int) string {
	if n == 1 {
		return "1 sandbox"
	}
	return fmt.Sprintf("%d sandboxes", n)
}
