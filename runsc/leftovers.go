package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Leftover is what exists on the host for one sandbox id of this
// runtime's prefix: each kind of resource a sandbox has, found by listing
// the host (runsc's state root, named netns, cgroups, mountinfo, the
// sandboxes directory), not by asking the store.
type Leftover struct {
	ID         string
	Container  bool     // runsc knows the container (its state root holds it)
	Netns      bool     // netns <id>
	ProxyNetns bool     // netns <id>-px
	Cgroups    []string // cgroup directories named <id>
	Mounts     []string // mount points under the sandbox dir
	Dir        bool     // <state-dir>/sandboxes/<id> exists (bundle, logs, run dir, disk)
	Disk       bool     // the dir holds disk.img
	// Modified is the newest modification time of any of them: the
	// sandbox dir and its entries, the netns files, the cgroup
	// directories and runsc's state files.
	Modified time.Time
}

// Live reports whether l holds anything but its sandbox dir: a runsc
// container, netns, cgroups or mounts, which only a live sandbox needs.
func (l Leftover) Live() bool {
	return l.Container || l.Netns || l.ProxyNetns || len(l.Cgroups) > 0 || len(l.Mounts) > 0
}

// Leftovers lists every sandbox id of this runtime's prefix that is not in
// keep and has anything on the host, sorted by id. Nothing of another
// prefix and nothing without one is listed. An error (runsc list failed)
// comes with what the other listings found.
func (r *Runtime) Leftovers(ctx context.Context, keep map[string]bool) ([]Leftover, error) {
	byID := map[string]*Leftover{}
	get := func(id string) *Leftover {
		if keep[id] || !r.Owns(id) {
			return nil
		}
		l := byID[id]
		if l == nil {
			l = &Leftover{ID: id}
			byID[id] = l
		}
		return l
	}
	var errs []error
	sts, err := r.List(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list runsc containers: %w", err))
	}
	for _, s := range sts {
		if l := get(s.ID); l != nil {
			l.Container = true
		}
	}
	for _, n := range listNetns(r.cfg.Prefix + "-") {
		if id, ok := strings.CutSuffix(n, proxySuffix); ok {
			if l := get(id); l != nil {
				l.ProxyNetns = true
			}
		} else if l := get(n); l != nil {
			l.Netns = true
		}
	}
	for _, p := range r.cg.find(r.cfg.Prefix + "-") {
		if l := get(filepath.Base(p)); l != nil {
			l.Cgroups = append(l.Cgroups, p)
		}
	}
	sandboxes := filepath.Join(r.cfg.StateDir, "sandboxes")
	for _, m := range mountsUnder(sandboxes) {
		rel, _ := filepath.Rel(sandboxes, m)
		if l := get(strings.SplitN(rel, "/", 2)[0]); l != nil {
			l.Mounts = append(l.Mounts, m)
		}
	}
	ents, err := os.ReadDir(sandboxes)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list sandbox dirs: %w", err))
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if l := get(e.Name()); l != nil {
			l.Dir = true
			st, err := os.Lstat(filepath.Join(sandboxes, e.Name(), "disk.img"))
			l.Disk = err == nil && st.Mode().IsRegular()
		}
	}
	out := make([]Leftover, 0, len(byID))
	for _, l := range byID {
		l.Modified = r.LastModified(l.ID)
		out = append(out, *l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, errors.Join(errs...)
}

// LastModified returns the newest modification time of what the host
// holds for sandbox id (zero if nothing): its sandbox dir and the dir's
// entries, its netns files, cgroup directories and runsc state files.
// Something being created right now is recent.
func (r *Runtime) LastModified(id string) time.Time {
	var newest time.Time
	note := func(p string) {
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return
		}
		if t := time.Unix(st.Mtim.Unix()); t.After(newest) {
			newest = t
		}
		if t := time.Unix(st.Ctim.Unix()); t.After(newest) {
			newest = t
		}
	}
	d := r.dir(id)
	note(d)
	if ents, err := os.ReadDir(d); err == nil {
		for _, e := range ents {
			note(filepath.Join(d, e.Name()))
		}
	}
	note(netnsPath(id))
	note(netnsPath(proxyNetnsName(id)))
	for _, p := range r.cg.find(id) {
		note(p)
	}
	// runsc's state files: <id>_sandbox:<sandbox id>.state and .lock.
	if ms, err := filepath.Glob(filepath.Join(r.cfg.StateDir, "runsc", id+"_sandbox:*")); err == nil {
		for _, m := range ms {
			note(m)
		}
	}
	return newest
}

// NullNetns returns the path of the "null-netns" bind mount runsc pins in
// its state root and whether it is mounted (ReleaseIdle removes it once no
// sandbox is left).
func (r *Runtime) NullNetns() (path string, mounted bool) {
	p := filepath.Join(r.cfg.StateDir, "runsc", "null-netns")
	return p, isMountPoint(p)
}
