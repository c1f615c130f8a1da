package server

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sandboxd/server/workspace"
)

// openapiDoc is the part of the OpenAPI document the tests look at.
type openapiDoc struct {
	OpenAPI  string                          `json:"openapi"`
	Info     struct{ Title, Version string } `json:"info"`
	Security []map[string][]string           `json:"security"`
	Paths    map[string]map[string]openapiOp `json:"paths"`
	Comps    struct {
		Schemas         map[string]openapiSchema `json:"schemas"`
		SecuritySchemes map[string]struct {
			Type   string `json:"type"`
			Scheme string `json:"scheme"`
		} `json:"securitySchemes"`
	} `json:"components"`
}

type openapiOp struct {
	Summary   string                 `json:"summary"`
	Security  *[]map[string][]string `json:"security"`
	Responses map[string]struct {
		Content map[string]struct {
			Schema map[string]any `json:"schema"`
		} `json:"content"`
	} `json:"responses"`
}

type openapiSchema struct {
	Properties map[string]any `json:"properties"`
}

func loadOpenAPI(t *testing.T) openapiDoc {
	t.Helper()
	var doc openapiDoc
	if err := json.Unmarshal(openapiJSON, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	return doc
}

// ginParam matches a route parameter, named (:id) or catch-all (*path).
var ginParam = regexp.MustCompile(`[:*]([A-Za-z0-9_]+)`)

// TestOpenAPIMatchesRoutes keeps the document and routes() in step: every
// registered route is documented and every documented operation is routed.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	if doc.OpenAPI != "3.0.3" {
		t.Fatalf("openapi = %q, want 3.0.3", doc.OpenAPI)
	}
	if doc.Info.Title != "sandboxd" || doc.Info.Version == "" {
		t.Errorf("info = %+v", doc.Info)
	}
	e := newAPIEnv(t)
	routes := map[string]bool{}
	for _, r := range e.s.engine.Routes() {
		routes[strings.ToUpper(r.Method)+" "+ginParam.ReplaceAllString(r.Path, "{$1}")] = true
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			switch method {
			case "parameters", "summary", "description", "servers":
				continue // path-level fields, not operations
			}
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	if missing, extra := setDiff(routes, documented), setDiff(documented, routes); len(missing)+len(extra) > 0 {
		t.Errorf("openapi.json is out of step with routes():\n  routed but not documented: %v\n  documented but not routed: %v", missing, extra)
	}
}

func setDiff(a, b map[string]bool) []string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// TestOpenAPIOperations checks each operation's shape, security and error
// bodies.
func TestOpenAPIOperations(t *testing.T) {
	doc := loadOpenAPI(t)
	if s := doc.Comps.SecuritySchemes["bearerAuth"]; s.Type != "http" || s.Scheme != "bearer" {
		t.Errorf("bearerAuth = %+v", s)
	}
	if len(doc.Security) != 1 || doc.Security[0]["bearerAuth"] == nil {
		t.Errorf("global security = %v, want bearerAuth", doc.Security)
	}
	public := map[string]bool{"/healthz": true, "/v1/openapi.json": true, "/metrics": true, "/": true, "/assets/{file}": true}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			name := strings.ToUpper(method) + " " + path
			if op.Summary == "" {
				t.Errorf("%s: no summary", name)
			}
			if public[path] != (op.Security != nil && len(*op.Security) == 0) {
				t.Errorf("%s: security override %v; only /healthz, /metrics, /v1/openapi.json and the console are public", name, op.Security)
			}
			success := 0
			for code, resp := range op.Responses {
				switch {
				case strings.HasPrefix(code, "2"), code == "101":
					success++
				case code[0] == '4' || code[0] == '5':
					ref, _ := resp.Content["application/json"].Schema["$ref"].(string)
					if ref != "#/components/schemas/Error" {
						t.Errorf("%s %s: error schema %v, want Error", name, code, resp.Content)
					}
				}
			}
			if success != 1 {
				t.Errorf("%s: %d success responses, want 1", name, success)
			}
			if !public[path] && op.Responses["401"].Content == nil {
				t.Errorf("%s: no 401 response", name)
			}
		}
	}
}

// TestOpenAPIRefsResolve checks that every $ref names a defined schema.
func TestOpenAPIRefsResolve(t *testing.T) {
	doc := loadOpenAPI(t)
	var raw any
	if err := json.Unmarshal(openapiJSON, &raw); err != nil {
		t.Fatal(err)
	}
	n := 0
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k == "$ref" {
					n++
					ref, _ := x.(string)
					name, ok := strings.CutPrefix(ref, "#/components/schemas/")
					if _, def := doc.Comps.Schemas[name]; !ok || !def {
						t.Errorf("%s: $ref %q does not resolve", at, ref)
					}
					continue
				}
				walk(x, at+"/"+k)
			}
		case []any:
			for _, x := range v {
				walk(x, at+"[]")
			}
		}
	}
	walk(raw, "#")
	if n == 0 {
		t.Fatal("no $ref found")
	}
}

// TestOpenAPISchemasMatchTypes checks that the documented properties are
// exactly the JSON fields of the Go types the handlers encode and decode.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	doc := loadOpenAPI(t)
	for name, v := range map[string]any{
		"Sandbox":          sandboxObject{},
		"Resources":        resources{},
		"EgressUsage":      egressUsage{},
		"CreditUsage":      creditUsage{},
		"TeardownResult":   teardownResult{},
		"ProvisionRequest": provisionRequest{},
		"ExecRequest":      execRequest{},
		"ExecResponse":     execResponse{},
		"CodeResponse":     codeResponse{},
		"Token":            tokenJSON{},
		"FileEntry":        workspace.Entry{},
		"Artifact":         workspace.Artifact{},
		"Stats":            statsJSON{},
		"Size":             sizeJSON{},
	} {
		s, ok := doc.Comps.Schemas[name]
		if !ok {
			t.Errorf("schema %s missing", name)
			continue
		}
		var want, got []string
		rt := reflect.TypeOf(v)
		for i := 0; i < rt.NumField(); i++ {
			tag, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			if tag != "" && tag != "-" {
				want = append(want, tag)
			}
		}
		for p := range s.Properties {
			got = append(got, p)
		}
		sort.Strings(want)
		sort.Strings(got)
		if !reflect.DeepEqual(want, got) {
			t.Errorf("schema %s properties %v, want the JSON fields of %T: %v", name, got, v, want)
		}
	}
	var eb errorBody
	eb.Error.Code = "x"
	eb.Error.Details = map[string]any{"k": 1} // omitted when empty
	b, _ := json.Marshal(eb)
	var m map[string]map[string]any
	json.Unmarshal(b, &m)
	errProps := doc.Comps.Schemas["Error"].Properties["error"].(map[string]any)["properties"].(map[string]any)
	for k := range m["error"] {
		if _, ok := errProps[k]; !ok {
			t.Errorf("Error schema lacks %q", k)
		}
	}
	if len(errProps) != len(m["error"]) {
		t.Errorf("Error schema properties %v, body fields %v", errProps, m["error"])
	}
}

// TestOpenAPIServed checks GET /v1/openapi.json: no authentication, JSON.
func TestOpenAPIServed(t *testing.T) {
	e := newAPIEnv(t)
	rec := e.do("GET", "/v1/openapi.json", "", nil)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type = %q", ct)
	}
	if rec.Header().Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id")
	}
	if rec.Body.String() != string(openapiJSON) {
		t.Error("served document differs from openapi.json")
	}
}

// The session log's event kinds the document lists are the ones the
// server emits (read from the source: each .Event(id, "kind", ...) call).
func TestOpenAPIEventKinds(t *testing.T) {
	emitted := map[string]bool{}
	call := regexp.MustCompile(`\.Event\([^,()]+, *"([a-z_]+)"`)
	for _, root := range []string{".", "../runsc", "../egress"} {
		err := filepath.WalkDir(root, func(f string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(f, ".go") || strings.HasSuffix(f, "_test.go") {
				return err
			}
			b, err := os.ReadFile(f)
			for _, m := range call.FindAllStringSubmatch(string(b), -1) {
				emitted[m[1]] = true
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(emitted) < 10 {
		t.Fatalf("found only %d event kinds in the source: %v", len(emitted), emitted)
	}
	raw, _ := os.ReadFile("openapi.json")
	m := regexp.MustCompile(`with kind ([a-z_, ]+)\.`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("openapi.json: the logs operation does not list the event kinds (\"with kind a, b, ...\")")
	}
	listed := map[string]bool{}
	for _, k := range strings.Split(string(m[1]), ", ") {
		listed[k] = true
	}
	if d := setDiff(emitted, listed); len(d) > 0 {
		t.Errorf("events emitted but not listed in openapi.json: %v", d)
	}
	if d := setDiff(listed, emitted); len(d) > 0 {
		t.Errorf("events listed in openapi.json that nothing emits: %v", d)
	}
}
