package scrub

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// The clean corpus (testdata/corpus, made by collect.sh there): ordinary
// output of real tools. The shape rules must redact none of it.

type corpusFile struct {
	name string
	data []byte
}

var (
	corpusOnce  sync.Once
	corpusFiles []corpusFile
	corpusErr   error

	corpusSetOnce sync.Once
	corpusRules   *Set
)

// corpusSet is the shape rules (every rule with a family that is not
// context-*), built once for the corpus tests (building it takes seconds
// under the race detector). Context rules (a keyword such as "token" and
// an assignment) are measured by TestCorpusContextRules: in minified
// JavaScript every "this._token=setTimeout(" looks like one.
func corpusSet(tb testing.TB) *Set {
	tb.Helper()
	corpusSetOnce.Do(func() {
		var shapes []Rule
		for _, r := range loadRules(tb) {
			if !isContextRule(r) {
				shapes = append(shapes, r)
			}
		}
		s, err := NewSet(shapes)
		if err != nil {
			tb.Fatal(err)
		}
		corpusRules = s
	})
	if corpusRules == nil {
		tb.Fatal("rule set failed to build")
	}
	return corpusRules
}

func isContextRule(r Rule) bool {
	for _, f := range r.Families {
		if !strings.HasPrefix(f, "context-") {
			return false
		}
	}
	return true
}

// TestCorpusContextRules reports what the context rules redact in the
// corpus (all of it code: minified JavaScript and this repository's own
// bundle in git.log) and holds the count to what it was when measured, so
// a rule change that adds collateral damage fails here.
func TestCorpusContextRules(t *testing.T) {
	if raceEnabled {
		t.Skip("whole corpus; run without -race")
	}
	s := ruleSet(t)
	total := 0
	per := map[string]int{}
	for _, f := range loadCorpus(t) {
		var sc scratch
		s.scan(&sc, f.data, -1, true, false)
		for _, r := range sc.regs {
			per[f.name+" "+r.lab.key]++
			total++
		}
	}
	t.Logf("context-rule redactions in %d MB of clean output: %d %v", 40, total, per)
	for k, n := range per {
		if !strings.HasPrefix(k, "js.min.txt ") && !strings.HasPrefix(k, "git.log ") {
			t.Errorf("%s: %d redactions outside minified code", k, n)
		}
	}
	if total > 150 {
		t.Errorf("%d context-rule redactions in the corpus (was 136 when measured)", total)
	}
}

func loadCorpus(tb testing.TB) []corpusFile {
	tb.Helper()
	corpusOnce.Do(func() {
		names, err := filepath.Glob("testdata/corpus/*.gz")
		if err != nil || len(names) == 0 {
			corpusErr = fmt.Errorf("no corpus files (%v)", err)
			return
		}
		for _, n := range names {
			data, err := gunzip(n)
			if err != nil {
				corpusErr = fmt.Errorf("%s: %w", n, err)
				return
			}
			corpusFiles = append(corpusFiles, corpusFile{strings.TrimSuffix(filepath.Base(n), ".gz"), data})
		}
	})
	if corpusErr != nil {
		tb.Fatal(corpusErr)
	}
	return corpusFiles
}

// gunzip reads a corpus file: all of it, or under the race detector (which
// slows decompression and scanning some 10x) its first raceCorpusPrefix
// bytes.
func gunzip(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	if raceEnabled {
		return io.ReadAll(io.LimitReader(z, raceCorpusPrefix))
	}
	return io.ReadAll(z)
}

const raceCorpusPrefix = 1 << 20

// corpusHits counts the redactions the rules make in data and describes
// up to limit of them: rule id, offset and the match (between » and «)
// with 40 bytes of context either side, so a rule author sees what the
// rule took.
func corpusHits(s *Set, data []byte, limit int) (n int, hits []string) {
	var sc scratch
	s.scan(&sc, data, -1, true, false)
	for _, r := range sc.regs {
		if len(hits) < limit {
			lo, hi := max(r.start-40, 0), min(r.end+40, len(data))
			hits = append(hits, fmt.Sprintf("%s at %d: %q", r.lab.key, r.start,
				string(data[lo:r.start])+"»"+string(data[r.start:r.end])+"«"+string(data[r.end:hi])))
		}
	}
	return len(sc.regs), hits
}

func TestCorpusClean(t *testing.T) {
	s := corpusSet(t)
	files := loadCorpus(t)
	total := 0
	for _, f := range files {
		total += len(f.data)
	}
	// The corpus is tens of MB; a truncated or missing file should not pass quietly.
	if !raceEnabled && (total < 30<<20 || len(files) < 8) {
		t.Errorf("corpus is %d bytes in %d files; want at least 30 MiB in 8", total, len(files))
	}
	for i, f := range files {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			data := corpusSample(f.data, i)
			if n, hits := corpusHits(s, data, 20); n > 0 {
				t.Errorf("%d redactions in %s (first %d):\n%s", n, f.name, len(hits), strings.Join(hits, "\n"))
			}
			if out := s.Redact(data); !bytes.Equal(out, data) {
				t.Errorf("Redact changed %s", f.name)
			}
			// Through a Writer in random write sizes, as a stream sees it.
			rnd := rand.New(rand.NewPCG(uint64(i), 14))
			if out := stream(t, s, data, randomSizes(rnd, len(data)), false); !bytes.Equal(out, data) {
				p := 0
				for p < len(out) && p < len(data) && out[p] == data[p] {
					p++
				}
				t.Errorf("Writer changed %s at offset %d: got %q, want %q", f.name, p, head(out[p:]), head(data[p:]))
			}
		})
	}
}

// The harness itself finds and reports a secret inside corpus text.
func TestCorpusHitsReport(t *testing.T) {
	s := corpusSet(t)
	f := loadCorpus(t)[0]
	rnd := rand.New(rand.NewPCG(5, 6))
	tok := "ghp_" + randString(rnd, alnum, 36)
	text := f.data[:min(len(f.data), 64<<10)]
	mid := bytes.LastIndexByte(text[:len(text)/2], '\n') + 1
	data := append(append(append([]byte{}, text[:mid]...), tok+"\n"...), text[mid:]...)
	n, hits := corpusHits(s, data, 20)
	if n != 1 || !strings.HasPrefix(hits[0], "github-token at ") || !strings.Contains(hits[0], "»"+tok+"«") {
		t.Fatalf("got %d hits: %q", n, hits)
	}
}

// Things that look a little like secrets and must pass: each must occur in
// own too, through every rule (context rules included).
// own too.
func TestCorpusSurvivors(t *testing.T) {
	s := ruleSet(t) // all rules, context ones included
	files := map[string][]byte{}
	for _, f := range loadCorpus(t) {
		files[f.name] = f.data
	}
	for _, c := range []struct {
		file, what string
		re         *regexp.Regexp // matched against single lines
	}{
		{"maven.log", "jjwt coordinates", regexp.MustCompile(`io\.jsonwebtoken:jjwt-api:(jar:)?0\.12\.6`)},
		{"git.log", "commit hash", regexp.MustCompile(`^commit [0-9a-f]{40}$`)},
		{"blobs.txt", "sha256 checksum line", regexp.MustCompile(`^[0-9a-f]{64}  /usr/bin/\S+$`)},
		{"blobs.txt", "UUID", regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)},
		{"npm.log", "npm integrity", regexp.MustCompile(`"integrity": "sha512-[A-Za-z0-9+/]{86}=="`)},
		{"go.log", "go.sum line", regexp.MustCompile(`^\S+ v\S+ h1:[A-Za-z0-9+/]{43}=$`)},
	} {
		data, ok := files[c.file]
		if !ok {
			t.Errorf("%s: no corpus file %s", c.what, c.file)
			continue
		}
		var lines [][]byte
		for rest := data; len(rest) > 0 && len(lines) < 50; {
			l := rest
			if i := bytes.IndexByte(rest, '\n'); i >= 0 {
				l, rest = rest[:i], rest[i+1:]
			} else {
				rest = nil
			}
			if c.re.Match(l) {
				lines = append(lines, l)
			}
		}
		if len(lines) == 0 {
			if raceEnabled {
				t.Logf("%s: not in the part of %s read under -race", c.what, c.file)
				continue
			}
			t.Errorf("%s: %s has no line matching %s", c.what, c.file, c.re)
			continue
		}
		for _, l := range lines {
			if got := s.Redact(l); !bytes.Equal(got, l) {
				t.Errorf("%s: %q became %q", c.what, l, got)
			}
		}
	}
}

// corpusSample is the part of a corpus file a test run scans: all of it,
// except under the race detector: then a deterministic quarter of the
// prefix read (four windows of whole lines spread over it) keeps the run
// to a few seconds.
func corpusSample(data []byte, seed int) []byte {
	if !raceEnabled || len(data) < 256<<10 {
		return data
	}
	const parts = 4
	win := len(data) / parts / 4
	var out []byte
	rnd := rand.New(rand.NewPCG(uint64(seed), 41))
	for p := range parts {
		lo := p*len(data)/parts + rnd.IntN(len(data)/parts-win)
		if i := bytes.IndexByte(data[lo:], '\n'); i >= 0 {
			lo += i + 1
		}
		hi := min(lo+win, len(data))
		if i := bytes.LastIndexByte(data[lo:hi], '\n'); i >= 0 {
			hi = lo + i + 1
		}
		out = append(out, data[lo:hi]...)
	}
	return out
}

// BenchmarkScrubCorpus: the Writer over the whole real corpus, with the
// full rule set and 100 registered values, against the same baseline.
func BenchmarkScrubCorpus(b *testing.B) {
	rnd := rand.New(rand.NewPCG(7, 8))
	s, _ := benchSet(b, rnd)
	var data []byte
	for _, f := range loadCorpus(b) {
		data = append(data, f.data...)
	}
	if n, hits := corpusHits(s, data, 5); n > 0 {
		b.Logf("corpus not clean: %d redactions, e.g.\n%s", n, strings.Join(hits, "\n"))
	}
	benchScrub(b, data, s)
}
