package runsc

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// cgroupLayout knows where this process's cgroups live, so the sandboxes'
// cgroups (runsc nests a relative cgroupsPath under the caller's own) can be
// read and removed without touching anything else.
type cgroupLayout struct {
	v2     bool
	dirs   []string // the server's own cgroup directory in each hierarchy
	memory string   // the server's own memory cgroup directory
	cpuset string   // the server's own cpuset cgroup directory ("" if none)
	// ctrls maps each controller found to the server's own directory of
	// its hierarchy (v2: the controllers in its cgroup.controllers).
	ctrls map[string]string
	// roots are the mount points of every cgroup hierarchy; with
	// anywhere, sandboxes' cgroups are looked for (and removed) in all of
	// them, not only under dirs (see Config.CgroupsAnywhere).
	roots    []string
	anywhere bool
}

func loadCgroupLayout() (cgroupLayout, error) {
	own := map[string]string{} // hierarchy controllers ("" for v2) -> path
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return cgroupLayout{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 {
			own[parts[1]] = parts[2]
		}
	}
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return cgroupLayout{}, err
	}
	defer mi.Close()
	l := cgroupLayout{ctrls: map[string]string{}}
	var v2dir string
	sc = bufio.NewScanner(mi)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts... - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+3 >= len(fields)+1 || len(fields) < sep+3 {
			continue
		}
		root, mnt, fstype := fields[3], fields[4], fields[sep+1]
		if fstype == "cgroup" || fstype == "cgroup2" {
			l.roots = append(l.roots, mnt)
		}
		switch fstype {
		case "cgroup":
			var opts []string
			if sep+3 < len(fields) {
				opts = strings.Split(fields[sep+3], ",")
			}
			for key, path := range own {
				if key == "" {
					continue
				}
				if sameControllers(strings.Split(key, ","), opts) {
					dir := filepath.Join(mnt, strings.TrimPrefix(path, root))
					l.dirs = append(l.dirs, dir)
					for _, c := range strings.Split(key, ",") {
						if !strings.HasPrefix(c, "name=") {
							l.ctrls[c] = dir
						}
						switch c {
						case "memory":
							l.memory = dir
						case "cpuset":
							l.cpuset = dir
						}
					}
				}
			}
		case "cgroup2":
			if path, ok := own[""]; ok {
				v2dir = filepath.Join(mnt, strings.TrimPrefix(path, root))
			}
		}
	}
	if l.memory == "" {
		if v2dir == "" {
			return l, errors.New("no memory cgroup found")
		}
		l = cgroupLayout{v2: true, dirs: []string{v2dir}, memory: v2dir, cpuset: v2dir, ctrls: map[string]string{}, roots: l.roots}
		b, _ := os.ReadFile(filepath.Join(v2dir, "cgroup.controllers"))
		for _, c := range strings.Fields(string(b)) {
			l.ctrls[c] = v2dir
		}
	}
	return l, nil
}

// sameControllers reports whether every controller of a /proc/self/cgroup
// line appears in a cgroup mount's options ("name=systemd" included).
func sameControllers(ctrls, opts []string) bool {
	set := map[string]bool{}
	for _, o := range opts {
		set[o] = true
	}
	for _, c := range ctrls {
		if !set[c] {
			return false
		}
	}
	return len(ctrls) > 0
}

// oomKills returns the sandbox cgroup's count of OOM kills (0 if unknown).
func (l cgroupLayout) oomKills(name string) int64 {
	file := "memory.oom_control"
	if l.v2 {
		file = "memory.events"
	}
	return max(0, statField(filepath.Join(l.memory, name), file, "oom_kill"))
}

// remove deletes the sandbox's (empty) cgroup directories that runsc left.
func (l cgroupLayout) remove(name string) error {
	var paths []string
	if l.anywhere {
		for _, p := range l.find(name) {
			if filepath.Base(p) == name {
				paths = append(paths, p)
			}
		}
	} else {
		for _, d := range l.dirs {
			paths = append(paths, filepath.Join(d, name))
		}
	}
	var errs []error
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
		}
	}
	return errors.Join(errs...)
}

// list returns the names of child cgroups starting with prefix.
func (l cgroupLayout) list(prefix string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range l.find(prefix) {
		if n := filepath.Base(p); !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// maxCgroupDepth bounds the walk of a hierarchy with anywhere.
const maxCgroupDepth = 16

// find returns the cgroup directories whose names start with prefix: the
// children of the server's own cgroup in each hierarchy, or with anywhere
// every directory so named in every hierarchy (not below one: a sandbox's
// cgroup is not searched for others).
func (l cgroupLayout) find(prefix string) []string {
	var out []string
	if !l.anywhere {
		for _, d := range l.dirs {
			ents, _ := os.ReadDir(d)
			for _, e := range ents {
				if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
					out = append(out, filepath.Join(d, e.Name()))
				}
			}
		}
		return out
	}
	for _, root := range l.roots {
		filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			if p == root {
				return nil
			}
			if strings.HasPrefix(e.Name(), prefix) {
				out = append(out, p)
				return filepath.SkipDir
			}
			if strings.Count(p[len(root):], "/") >= maxCgroupDepth {
				return filepath.SkipDir
			}
			return nil
		})
	}
	return out
}
