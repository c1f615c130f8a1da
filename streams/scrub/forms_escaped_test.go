package scrub

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// The forms of issue 15's security review that leaked: Python's
// urllib.parse.quote with its default safe='/' ('/' raw, '+' as %2B) and
// JSON with '/' escaped as \/ (PHP's json_encode). As in forms_test.go,
// each check rebuilds the form here, independently of kvforms.go.

// pyQuoteByte is urllib.parse.quote(safe='/') of one byte.
func pyQuoteByte(c byte) string {
	if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_.-~/", c) >= 0 {
		return string(c)
	}
	return fmt.Sprintf("%%%02X", c)
}

// printPyQuote: quote(v) (hex in upper case as Python writes it, or in
// lower case).
func printPyQuote(rnd *rand.Rand, v string) (string, bool) {
	s := strings.Join(perByteOf(v, pyQuoteByte), "")
	if rnd != nil && rnd.IntN(2) == 0 {
		s = strings.ToLower(s)
	}
	return s, true
}

func pyQuoteLeak(out []byte, v string) bool {
	return piecesLeak(leakView(out, true), perByteOf(v, pyQuoteByte), "", KnownRun(len(v)))
}

// jsonSlashBody is a JSON string's body with '/' as \/ (PHP's
// json_encode with JSON_UNESCAPED_UNICODE).
func jsonSlashBody(s string) string {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(s); err != nil {
		panic(err)
	}
	j := strings.TrimSuffix(b.String(), "\n")
	return strings.ReplaceAll(j[1:len(j)-1], "/", `\/`)
}

func printJSONSlash(_ *rand.Rand, v string) (string, bool) {
	if !utf8.ValidString(v) {
		return "", false
	}
	return `"` + jsonSlashBody(v) + `"`, true
}

func jsonSlashLeak(out []byte, v string) bool {
	return piecesLeak(leakView(out, true), perRuneOf(v, func(_ rune, b string) string { return jsonSlashBody(b) }), "", KnownRun(len(v)))
}

var escapedForms = []printedForm{
	{"url-python", printPyQuote, pyQuoteLeak},
	{"json-slash", printJSONSlash, jsonSlashLeak},
}

// escapedValues: the review's value, a value of slashes, one with
// non-ASCII text (%XX of its UTF-8 bytes; raw in the JSON) and formsSet's
// value with punctuation, quotes and a backslash.
var escapedValues = map[string]string{
	"review":  "Tok/en+Ab/Cd+Ef/Gh+Ij/Kl+Mn/Op",
	"slashes": "a/b/c/d/e/f/g/h/i/j/k/l/m",
	"unicode": "pässwörd/ünïcode+gëheim/ß",
}

func escapedSet(t *testing.T) (*Set, map[string]string) {
	t.Helper()
	s, values := formsSet(t)
	s = withValues(t, s, escapedValues)
	all := map[string]string{"punct": values["punct"]}
	for n, v := range escapedValues {
		all[n] = v
	}
	return s, all
}

// TestEscapedFormsRedacted: each value in Python's quote and in JSON with
// '/' escaped, alone, in a URL and in a JSON object, amid other output, is
// redacted with the value's label and shows no run of k value bytes in
// that form or plainly; written in two writes split at every point the
// output equals Redact of the whole, and flushed after each write it
// differs only as Flush may and leaks nothing. Without the two forms the
// review's value passed whole.
func TestEscapedFormsRedacted(t *testing.T) {
	rnd := rand.New(rand.NewPCG(15, 20))
	s, values := escapedSet(t)
	for _, name := range []string{"review", "slashes", "unicode", "punct"} {
		v := values[name]
		label := []byte("[REDACTED:" + name + "]")
		for _, f := range escapedForms {
			text := mustPrint(f.print, rnd, v)
			if !f.leak([]byte(text), v) {
				t.Fatalf("%s %s: the check misses the form itself: %q", name, f.name, text)
			}
			for _, in := range []string{
				"$ ./show\n" + text + "\n$ ",
				"GET /api?redirect=" + text + "&x=1 HTTP/1.1\n",
				`{"token":` + text + `,"user":"a"}` + "\n",
			} {
				in := []byte(in)
				whole := s.Redact(in)
				if !bytes.Contains(whole, label) || f.leak(whole, v) || plainLeak(whole, v) {
					t.Errorf("%s %s: %q -> %q", name, f.name, in, whole)
					continue
				}
				for i := 1; i < len(in); i++ {
					if got := stream(t, s, in, []int{i, len(in) - i}, false); !bytes.Equal(got, whole) {
						t.Errorf("%s %s split at %d: %q, whole %q", name, f.name, i, got, whole)
						break
					}
					got := stream(t, s, in, []int{i, len(in) - i}, true)
					if err := flushEquivalent(s, in, got); err != nil {
						t.Errorf("%s %s split at %d, flushed: %q: %v", name, f.name, i, got, err)
						break
					}
					if f.leak(got, v) || plainLeak(got, v) {
						t.Errorf("%s %s split at %d, flushed: leaks %q", name, f.name, i, got)
						break
					}
				}
			}
		}
	}
}

// TestEscapedFormsOfExactlyK: k = KnownRun(len) consecutive bytes of a
// value, at every offset (JSON: whole characters), printed on their own
// in either form, are redacted: the leak threshold holds in the new forms.
func TestEscapedFormsOfExactlyK(t *testing.T) {
	s, values := escapedSet(t)
	for _, name := range []string{"review", "slashes", "unicode", "punct"} {
		v := values[name]
		k := KnownRun(len(v))
		for _, f := range escapedForms {
			for i := 0; i+k <= len(v); i++ {
				text, ok := f.print(nil, v[i:i+k])
				if !ok {
					continue // cuts a character: not JSON
				}
				out := s.RedactString("x = " + text + "\n")
				if !strings.Contains(out, "[REDACTED:"+name+"]") || f.leak([]byte(out), v) {
					t.Errorf("%s %s [%d:%d]: %q", name, f.name, i, i+k, out)
				}
			}
		}
	}
}

// TestEscapedFormsLeakChecks: the checks find a run of exactly k value
// bytes in their form and nothing in k-1, so the tests above can fail.
func TestEscapedFormsLeakChecks(t *testing.T) {
	v := escapedValues["review"]
	k := KnownRun(len(v))
	for _, f := range escapedForms {
		for _, n := range []int{k, k - 1} {
			for i := 0; i+n <= len(v); i++ {
				text := mustPrint(f.print, nil, v[i:i+n])
				if got := f.leak([]byte("x "+text+" y"), v); got != (n == k) {
					t.Errorf("%s: %d bytes %q: leak %v", f.name, n, text, got)
				}
			}
		}
	}
}

// TestEscapedFormsOtherValuePass: the new forms of other values of the
// same kinds pass unchanged.
func TestEscapedFormsOtherValuePass(t *testing.T) {
	rnd := rand.New(rand.NewPCG(15, 21))
	s, _ := escapedSet(t)
	for _, w := range []string{
		randString(rnd, alnum+"/+", 30),
		randString(rnd, alnum+"/", 23),
		randString(rnd, alnum+`#'"\&()+;/=`, 30),
		"päss/wörd+" + randString(rnd, alnum+"/+", 16),
	} {
		for _, f := range escapedForms {
			passes(t, s, rnd, f.name+" of "+w, []byte("$ ./show\n"+mustPrint(f.print, rnd, w)+"\n$ "))
		}
	}
}

// TestEscapedFormsIndexedOnce: for a value without '/' (and none of
// "!*'()") the new forms are url-js and json-nohtml themselves, and the
// index holds each form's string once: they cost no memory. With '/' they
// differ and are indexed.
func TestEscapedFormsIndexedOnce(t *testing.T) {
	base, err := NewSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	norm := func(v string) map[string]string {
		m := map[string]string{}
		for _, f := range valueForms([]byte(v)) {
			m[f.name] = string(normForm(strings.Join(f.pieces, "")))
		}
		return m
	}
	for _, c := range []struct {
		v    string
		same bool
	}{
		{"Zq9vX2pLmN4t+x\"&<=q", true},
		{"Tok/en+Ab/Cd+Ef/Gh+Ij/Kl+Mn/Op", false},
	} {
		f := norm(c.v)
		if (f["url-python"] == f["url-js"]) != c.same || (f["json-slash"] == f["json-nohtml"]) != c.same {
			t.Errorf("%q: url-python %q url-js %q json-slash %q json-nohtml %q", c.v, f["url-python"], f["url-js"], f["json-slash"], f["json-nohtml"])
		}
		s := withValues(t, base, map[string]string{"v": c.v})
		seen := map[string]bool{}
		for _, kf := range s.kv.forms {
			if seen[string(kf.s)] {
				t.Errorf("%q: form %q indexed twice", c.v, kf.s)
			}
			seen[string(kf.s)] = true
		}
		for _, name := range []string{"url-python", "json-slash"} {
			if !seen[f[name]] {
				t.Errorf("%q: %s %q not indexed", c.v, name, f[name])
			}
		}
	}
}
