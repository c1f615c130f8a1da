package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/store"
)

func TestGCClaimOf(t *testing.T) {
	for status, want := range map[string]claim{
		store.StatusProvisioning: claimAll,
		store.StatusRunning:      claimAll,
		store.StatusPaused:       claimAll,
		store.StatusStopping:     claimAll,
		store.StatusStopped:      claimSaved,
		store.StatusFailed:       claimSaved,
		store.StatusDeleted:      claimNothing,
		"hibernating":            claimAll, // unknown to this build: claims everything
	} {
		if got := claimOf(status); got != want {
			t.Errorf("claimOf(%q) = %d, want %d", status, got, want)
		}
	}
}

// gcPlanString shows a plan as "id status keepDisk: kinds [skipped]" lines.
func gcPlanString(es []gcEntry) string {
	var b strings.Builder
	for _, e := range es {
		var kinds []string
		for _, it := range e.Items {
			kinds = append(kinds, it.Kind)
		}
		fmt.Fprintf(&b, "%s %s %v: %s", e.ID, e.Status, e.KeepDisk, strings.Join(kinds, ","))
		if e.Skipped != "" {
			b.WriteString(" [skipped]")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestGCPlan(t *testing.T) {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	all := func(id string, mod time.Time) runsc.Leftover {
		return runsc.Leftover{ID: id, Container: true, Netns: true, ProxyNetns: true,
			Cgroups: []string{"/cg/memory/" + id}, Mounts: []string{"/d/sandboxes/" + id + "/disk"},
			Dir: true, Disk: true, Modified: mod}
	}
	dirOnly := func(id string) runsc.Leftover {
		return runsc.Leftover{ID: id, Dir: true, Disk: true, Modified: old}
	}
	ls := []runsc.Leftover{
		all("prov", old), all("run", old), all("paused", old), all("stopping", old),
		all("stopped", old), dirOnly("stoppedDir"), all("failed", old),
		all("deleted", old), dirOnly("deletedDir"), all("norow", old), dirOnly("norowDir"),
		{ID: "netnsOnly", Netns: true, Modified: old},
		all("fresh", now.Add(-10*time.Second)), all("freshStopped", now.Add(-time.Second)),
		all("twoRows", old),
	}
	row := func(pk, id, status string) store.SessionContainer {
		return store.SessionContainer{ID: pk, ContainerID: id, Status: status}
	}
	rows := []store.SessionContainer{
		row("s1", "prov", store.StatusProvisioning), row("s2", "run", store.StatusRunning),
		row("s3", "paused", store.StatusPaused), row("s4", "stopping", store.StatusStopping),
		row("s5", "stopped", store.StatusStopped), row("s6", "stoppedDir", store.StatusStopped),
		row("s7", "failed", store.StatusFailed), row("s8", "deleted", store.StatusDeleted),
		row("s9", "deletedDir", store.StatusDeleted), row("s10", "freshStopped", store.StatusStopped),
		row("s11", "twoRows", store.StatusDeleted), row("s12", "twoRows", store.StatusRunning),
		row("s13", "notOnHost", store.StatusDeleted),
	}
	live := "runsc container,netns,netns,cgroup,mount"
	stopped := fmt.Sprintf(`stopped stopped true: %[1]s
failed failed true: %[1]s
deleted deleted false: %[1]s,sandbox dir,disk
deletedDir deleted false: sandbox dir,disk
norow  false: %[1]s,sandbox dir,disk
norowDir  false: sandbox dir,disk
netnsOnly  false: netns
`, live)
	for _, c := range []struct {
		running bool
		want    string
	}{
		{false, stopped + fmt.Sprintf("fresh  false: %[1]s,sandbox dir,disk\nfreshStopped stopped true: %[1]s\n", live)},
		// The server runs: what changed in the last minute is skipped.
		{true, stopped + fmt.Sprintf("fresh  false: %[1]s,sandbox dir,disk [skipped]\nfreshStopped stopped true: %[1]s [skipped]\n", live)},
	} {
		got := gcPlanString(gcPlan(ls, rows, "/d/sandboxes", c.running, now))
		if got != c.want {
			t.Errorf("running %v:\n got:\n%s\nwant:\n%s", c.running, got, c.want)
		}
	}
	// Items name what they are.
	es := gcPlan([]runsc.Leftover{all("norow", old)}, nil, "/d/sandboxes", false, now)
	var items []string
	for _, it := range es[0].Items {
		items = append(items, it.Kind+"="+it.Name)
	}
	want := "runsc container=norow netns=norow netns=norow-px cgroup=/cg/memory/norow mount=/d/sandboxes/norow/disk " +
		"sandbox dir=/d/sandboxes/norow disk=/d/sandboxes/norow/disk.img"
	if got := strings.Join(items, " "); got != want {
		t.Errorf("items:\n got %s\nwant %s", got, want)
	}
	if es := gcPlan(nil, rows, "/d/sandboxes", true, now); len(es) != 0 {
		t.Errorf("nothing on the host: %v", es)
	}
}
