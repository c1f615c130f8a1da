package portal

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]struct {
		port        int
		mount       string
		path, redir string
	}{
		"/port/8000/":                    {8000, "/port/8000", "/", ""},
		"/port/8000":                     {8000, "/port/8000", "/", "/port/8000/"},
		"/port/8000/a/b.txt":             {8000, "/port/8000", "/a/b.txt", ""},
		"/port/8000/a/../b":              {8000, "/port/8000", "/b", ""},
		"/port/8000/../../port/22/":      {8000, "/port/8000", "/port/22/", ""},
		"/port/8000/%2e%2e/%2E%2E/x":     {8000, "/port/8000", "/x", ""},
		"/port/8000/..%2f..%2fport%2f22": {8000, "/port/8000", "/..%2f..%2fport%2f22", ""},
		"/port/8000/%252e%252e/x":        {8000, "/port/8000", "/%252e%252e/x", ""},
		"/port/8000/a/./b/":              {8000, "/port/8000", "/a/b/", ""},
		"/port/8000/a/..":                {8000, "/port/8000", "/", ""},
		"/editor":                        {13337, "/editor", "/", "/editor/"},
		"/editor/":                       {13337, "/editor", "/", ""},
		"/editor/stable-x/static/a.js":   {13337, "/editor", "/stable-x/static/a.js", ""},
		"/editor/../port/22/":            {13337, "/editor", "/port/22/", ""},
		"/notebook/tree":                 {13338, "", "/notebook/tree", ""},
		"/notebook/../../x":              {13338, "", "/notebook/x", ""},
		"/display/":                      {13339, "/display", "/", ""},
		"/display/websockify":            {13339, "/display", "/websockify", ""},
		"/browser/json/version":          {13340, "/browser", "/json/version", ""},
	} {
		got, err := Parse(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got.Port != want.port || got.Mount != want.mount || got.Path != want.path || got.Redirect != want.redir {
			t.Errorf("%s: port %d mount %q path %q redirect %q; want %+v", in, got.Port, got.Mount, got.Path, got.Redirect, want)
		}
	}
	for _, in := range []string{
		"", "x", "/", "/ports/80/", "/port/", "/port//", "/port/0/", "/port/65536/", "/port/080/",
		"/port/%38%30/", "/port/80%2f..%2f22/", "/port/+80/", "/port/-1/", "/Editor/", "/%65ditor/",
		"/port/8000%2f..%2f..%2fport%2f13337/", "/../editor/", "/./port/22/", "/v1/sandbox",
	} {
		if got, err := Parse(in); err == nil {
			t.Errorf("%q: parsed as %+v", in, got)
		}
	}
}

// Whatever the rest of the path, the target never changes.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"/port/8000/../../a", "/editor/%2e%2e/", "/notebook/..%2f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rest string) {
		for _, base := range []string{"/port/8000/", "/editor/", "/notebook/"} {
			tg, err := Parse(base + rest)
			if err != nil {
				t.Fatalf("%q: %v", base+rest, err)
			}
			if want := map[string]int{"/port/8000/": 8000, "/editor/": 13337, "/notebook/": 13338}[base]; tg.Port != want {
				t.Fatalf("%q reached port %d", base+rest, tg.Port)
			}
			if base == "/notebook/" && !strings.HasPrefix(tg.Path, "/notebook/") && tg.Path != "/notebook" {
				t.Fatalf("%q left the notebook's prefix: %q", base+rest, tg.Path)
			}
			for _, seg := range strings.Split(tg.Path, "/") {
				if dotSegment(seg) != 0 {
					t.Fatalf("%q kept a dot segment: %q", base+rest, tg.Path)
				}
			}
		}
	})
}
