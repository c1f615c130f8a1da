package server

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// The package graph stays the shape docs/ARCHITECTURE.md draws: leaves
// import no project package outside their own subtree, the domain knows no
// HTTP framework, and reading the configuration pulls in no framework,
// driver or database.
func TestPackageGraph(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil { // sudo's PATH: the go that built this test
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goBin, "list", "-deps=false", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}|{{join .Deps \" \"}}", "sandboxd/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	imports, deps := map[string][]string{}, map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		imports[f[0]], deps[f[0]] = strings.Fields(f[1]), strings.Fields(f[2])
	}
	within := func(pkg, root string) bool { return pkg == root || strings.HasPrefix(pkg, root+"/") }
	for _, leaf := range []string{"sandboxd/runsc", "sandboxd/egress", "sandboxd/store", "sandboxd/streams", "sandboxd/web", "sandboxd/configs"} {
		for pkg, imps := range imports {
			if !within(pkg, leaf) {
				continue
			}
			for _, imp := range imps {
				if strings.HasPrefix(imp, "sandboxd/") && !within(imp, leaf) {
					t.Errorf("leaf %s imports %s", pkg, imp)
				}
			}
		}
	}
	// Not even indirectly.
	forbidDeps := map[string][]string{
		// The domain and its parts: no HTTP framework, not the edge.
		"sandboxd/server/sandbox":    {"github.com/gin-gonic/gin", "sandboxd/server"},
		"sandboxd/server/workspace":  {"github.com/gin-gonic/gin", "sandboxd/server"},
		"sandboxd/server/procs":      {"github.com/gin-gonic/gin", "sandboxd/server", "sandboxd/server/sandbox"},
		"sandboxd/server/sessionlog": {"github.com/gin-gonic/gin", "sandboxd/server"},
		// The portal proxies; who may is the edge's business.
		"sandboxd/server/portal": {"github.com/gin-gonic/gin", "sandboxd/server", "sandboxd/server/sandbox", "sandboxd/store"},
		// Reading the configuration: no framework, driver or database.
		"sandboxd/server/config": {"github.com/gin-gonic/gin", "sandboxd/runsc", "sandboxd/store", "modernc.org/sqlite"},
	}
	// Not directly: HTTP status codes are the edge's (server.statusOf).
	forbidImports := map[string][]string{
		"sandboxd/server/sandbox":    {"net/http"},
		"sandboxd/server/workspace":  {"net/http"},
		"sandboxd/server/sessionlog": {"net/http"},
		"sandboxd/server/procs":      {"net/http"},
		"sandboxd/server/errdefs":    {"net/http"},
	}
	for _, c := range []struct {
		rules map[string][]string
		of    map[string][]string
	}{{forbidDeps, deps}, {forbidImports, imports}} {
		for pkg, bad := range c.rules {
			if _, ok := imports[pkg]; !ok {
				t.Errorf("package %s not found", pkg)
				continue
			}
			for _, b := range bad {
				if slices.Contains(c.of[pkg], b) {
					t.Errorf("%s depends on %s", pkg, b)
				}
			}
		}
	}
	for _, pkg := range []string{"sandboxd/server/errdefs"} {
		for _, d := range deps[pkg] {
			if strings.HasPrefix(d, "sandboxd/") {
				t.Errorf("%s depends on %s", pkg, d)
			}
		}
	}
}
