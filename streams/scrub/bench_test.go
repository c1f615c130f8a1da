package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b64ch = alnum + "+/"
)

// benchSet is the full rule set plus 100 registered values.
func benchSet(tb testing.TB, rnd *rand.Rand) (*Set, []string) {
	vals := map[string]string{}
	var list []string
	for i := range 100 {
		var v string
		switch i % 4 {
		case 0:
			v = randString(rnd, alnum, 16+rnd.IntN(25))
		case 1:
			v = randString(rnd, b64ch, 40)
		case 2:
			v = randString(rnd, "0123456789abcdef", 32)
		default:
			v = randString(rnd, alnum+"!@#$%^&*()-_=+", 12+rnd.IntN(12))
		}
		vals[fmt.Sprintf("secret_%02d", i)] = v
		list = append(list, v)
	}
	return withValues(tb, ruleSet(tb), vals), list
}

var logWords = []string{"Compiling", "Building", "CXX", "object", "src/server/handler.cc.o", "Linking", "warning:",
	"unused", "variable", "go:", "downloading", "github.com/gin-gonic/gin", "v1.12.0", "npm", "WARN", "deprecated",
	"Step", "RUN", "apt-get", "install", "-y", "curl", "ca-certificates", "Collecting", "requests==2.32.3",
	"Successfully", "installed", "ok", "PASS", "FAIL", "---", "=== RUN", "TestHandler/create", "(0.01s)", "[INFO]",
	"tokenizer", "secrets", "module", "cache", "hit", "layer", "sha256:", "done", "error", "retrying", "in", "2s"}

// cleanCorpus: build-log lines, JSON log lines and base64 blobs.
func cleanCorpus(rnd *rand.Rand, size int) []byte {
	var b bytes.Buffer
	for b.Len() < size {
		switch rnd.IntN(10) {
		case 0, 1, 2, 3, 4:
			fmt.Fprintf(&b, "[%3d%%] ", rnd.IntN(101))
			for range 4 + rnd.IntN(10) {
				b.WriteString(logWords[rnd.IntN(len(logWords))])
				b.WriteByte(' ')
			}
			b.WriteString("\n")
		case 5, 6, 7:
			fmt.Fprintf(&b, `{"level":"info","ts":%d.%03d,"caller":"server/api.go:%d","msg":"request served","method":"GET","path":"/api/v1/sessions/%x","status":%d,"bytes":%d,"duration_ms":%.3f,"user_agent":"curl/8.5.0"}`+"\n",
				1700000000+rnd.IntN(1e6), rnd.IntN(1000), rnd.IntN(900), rnd.Uint64(), 200+rnd.IntN(4)*100, rnd.IntN(1e5), rnd.Float64()*100)
		default:
			raw := make([]byte, 300+rnd.IntN(3000))
			for i := range raw {
				raw[i] = byte(rnd.UintN(256))
			}
			enc := base64.StdEncoding.EncodeToString(raw)
			for len(enc) > 76 {
				b.WriteString(enc[:76])
				b.WriteByte('\n')
				enc = enc[76:]
			}
			b.WriteString(enc + "\n")
		}
	}
	return b.Bytes()
}

// denseCorpus: short lines, nearly each with a pattern secret or a known
// value (plain or base64), about one match per 60 bytes.
func denseCorpus(rnd *rand.Rand, values []string, size int) []byte {
	var b bytes.Buffer
	for b.Len() < size {
		v := values[rnd.IntN(len(values))]
		switch rnd.IntN(9) {
		case 0:
			fmt.Fprintf(&b, "export GITHUB_TOKEN=ghp_%s\n", randString(rnd, alnum, 36))
		case 1:
			fmt.Fprintf(&b, "key AKIA%s ok\n", randString(rnd, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 16))
		case 2:
			fmt.Fprintf(&b, "password=%s\n", randString(rnd, alnum, 14))
		case 3:
			fmt.Fprintf(&b, "using %s for auth\n", v)
		case 4:
			fmt.Fprintf(&b, "Authorization: Basic %s\n", base64.StdEncoding.EncodeToString([]byte("user:"+v)))
		case 5:
			fmt.Fprintf(&b, "url postgres://app:%s@db:5432/x\n", randString(rnd, alnum, 12))
		case 6:
			fmt.Fprintf(&b, "OPENAI_API_KEY=sk-proj-%s\n", randString(rnd, alnum, 48))
		case 7:
			fmt.Fprintf(&b, "jwt eyJhbGciOiJIUzI1NiJ9.eyJ%s.%s\n", randString(rnd, alnum, 40), randString(rnd, alnum, 43))
		default:
			fmt.Fprintf(&b, "ok %d %s\n", rnd.IntN(1000), v)
		}
	}
	return b.Bytes()
}

const chunk = 32 << 10

// baseline is the floor we compare against: one bytes.Index per chunk and
// a copy of the chunk.
func baseline(data, dst []byte) int {
	n := 0
	for off := 0; off < len(data); off += chunk {
		c := data[off:min(off+chunk, len(data))]
		n += bytes.Index(c, []byte("ghp_"))
		n += copy(dst, c)
	}
	return n
}

func benchScrub(b *testing.B, data []byte, s *Set) {
	dst := make([]byte, chunk)
	iters := 0
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		baseline(data, dst)
		iters++
	}
	baseMBs := float64(len(data)) * float64(iters) / time.Since(start).Seconds() / 1e6
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	cpu0 := benchCPU()
	for b.Loop() {
		w := s.NewWriter(io.Discard)
		for off := 0; off < len(data); off += chunk {
			w.Write(data[off:min(off+chunk, len(data))])
		}
		w.Close()
	}
	mbs := float64(len(data)) * float64(b.N) / b.Elapsed().Seconds() / 1e6
	b.ReportMetric(baseMBs, "baseline-MB/s")
	b.ReportMetric(mbs/baseMBs, "ratio")
	b.ReportMetric(float64(len(data))*float64(b.N)/(benchCPU()-cpu0).Seconds()/1e6, "cpu-MB/s")
}

func BenchmarkScrubClean(b *testing.B) {
	rnd := rand.New(rand.NewPCG(1, 2))
	s, _ := benchSet(b, rnd)
	data := cleanCorpus(rnd, 8<<20)
	if out := s.Redact(data); !bytes.Equal(out, data) {
		b.Fatal("clean corpus is not clean")
	}
	benchScrub(b, data, s)
}

// BenchmarkScrubBudgetOverhead: the clean corpus through a Writer with a
// budget that never holds it back (each write measured by the thread's CPU
// clock: a system call at each end) against one without, in terminal-sized
// and exec-stream-sized writes.
func BenchmarkScrubBudgetOverhead(b *testing.B) {
	rnd := rand.New(rand.NewPCG(1, 2))
	s, _ := benchSet(b, rnd)
	data := cleanCorpus(rnd, 4<<20)
	for _, size := range []int{4 << 10, 32 << 10} {
		for _, budget := range []bool{false, true} {
			set := s
			if budget {
				set = s.WithBudget(NewBudgets(BudgetConfig{Cores: 64, Burst: time.Hour}, nil).New("b"))
			}
			b.Run(fmt.Sprintf("writes=%dKiB/budget=%v", size>>10, budget), func(b *testing.B) {
				b.SetBytes(int64(len(data)))
				for b.Loop() {
					w := set.NewWriter(io.Discard)
					for off := 0; off < len(data); off += size {
						w.Write(data[off:min(off+size, len(data))])
					}
					w.Close()
				}
			})
		}
	}
}

func BenchmarkScrubDense(b *testing.B) {
	rnd := rand.New(rand.NewPCG(3, 4))
	s, values := benchSet(b, rnd)
	data := denseCorpus(rnd, values, 4<<20)
	benchScrub(b, data, s)
	b.ReportMetric(float64(bytes.Count(data, []byte("\n"))), "lines")
}

// BenchmarkScrubCeiling measures, on the clean corpus with the same Set,
// the parts no scrubber of this design can skip: the keyword prefilter's
// scan alone, the known-value sampling loop alone (an 8-byte load, the
// gram's bitmap test, at the stride the shortest match allows; no gathering
// around separators, no verification), and the two together. The
// scrubber's figure divided by "both" is how far it is from its own floor.
func BenchmarkScrubCeiling(b *testing.B) {
	rnd := rand.New(rand.NewPCG(1, 2))
	s, _ := benchSet(b, rnd)
	data := cleanCorpus(rnd, 8<<20)
	kv := s.kv
	sample := func(c []byte) int {
		hits, cnt := 0, 0
		for p := 0; p+8 <= len(c); p += kv.stride {
			long := cnt == 0
			if cnt++; cnt == kv.every {
				cnt = 0
			}
			w := binary.LittleEndian.Uint64(c[p:])
			if kv.test(uint32(w)|fold4, long) {
				hits++
			}
		}
		return hits
	}
	var hits []int
	for _, part := range []string{"prefilter", "sampling", "both"} {
		b.Run(part, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				n := 0
				for off := 0; off < len(data); off += chunk {
					c := data[off:min(off+chunk, len(data))]
					if part != "sampling" {
						hits = s.pf.scan(c, hits[:0])
					}
					if part != "prefilter" {
						n += sample(c)
					}
				}
				b.ReportMetric(float64(n), "kv-hits")
			}
			b.ReportMetric(float64(kv.stride), "stride")
		})
	}
}

// floodShapes are keyword floods a sandbox user can print on purpose
// (`yes 'token: '`): each shape repeated to fill the corpus.
var floodShapes = []struct{ name, unit string }{
	{"token-colon", "token:"},
	{"yes-token", "token: \n"},
	{"password-eq", "password="},
	{"auth-bearer", "Authorization: Bearer "},
	{"cookie", "Cookie: "},
	{"secret-space", "secret "},
	{"auth-key-space", "auth-key "},
	{"by-name", "MISTRAL_API_KEY:"},
	{"token-value", "token: abc123XYZ "},
	{"eyJ", "eyJ"},
	{"begin", "-----BEGIN "},
	// a keyword repeated up to a newline, coloured keywords, PEM-like
	// blocks that never end
	{"token>-run", strings.Repeat("token>", 1333) + "\n"},
	{"eyJ-run", strings.Repeat("eyJ", 2666) + "\n"},
	{"coloured", "token>\x1b[0m"},
	{"pem-blocks", "-----BEGIN RSA PRIVATE KEY-----\n" + strings.Repeat("QUJDRA", 300) + "\n"},
}

// floodCorpus repeats unit to size bytes; unit "" is every keyword of the
// rule set in turn, each followed by one of "", " ", ":", "=", ": ",
// "=v4lue ".
func floodCorpus(tb testing.TB, unit string, size int) []byte {
	if unit != "" {
		return bytes.Repeat([]byte(unit), size/len(unit)+1)[:size]
	}
	var b bytes.Buffer
	sufs := []string{"", " ", ":", "=", ": ", "=v4lue "}
	rules := loadRules(tb)
	for i := 0; b.Len() < size; i++ {
		for _, r := range rules {
			for _, k := range r.Keywords {
				b.WriteString(k + sufs[i%len(sufs)])
			}
		}
	}
	return b.Bytes()[:size]
}

// BenchmarkScrubKeywordFlood: keyword-dense output (issue 15: such a flood
// took about 7 s of CPU per MiB). Each shape in one 1 MiB write, in 32 KiB
// writes and in writes of 1-100 bytes as a stream delivers them. cpu-MB/s
// is per second of the benchmark thread's own CPU time: on a shared
// machine it moves less than the wall-clock MB/s.
func BenchmarkScrubKeywordFlood(b *testing.B) {
	rnd := rand.New(rand.NewPCG(5, 6))
	s, _ := benchSet(b, rnd)
	shapes := append(floodShapes[:len(floodShapes):len(floodShapes)], struct{ name, unit string }{"all-keywords", ""})
	small := make([]int, 0, 1<<16)
	for range cap(small) {
		small = append(small, 1+rnd.IntN(100))
	}
	for _, sh := range shapes {
		for _, mode := range []string{"whole", "32k", "small"} {
			b.Run(sh.name+"/"+mode, func(b *testing.B) {
				data := floodCorpus(b, sh.unit, 1<<20)
				b.SetBytes(int64(len(data)))
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				cpu0 := benchCPU()
				for b.Loop() {
					w := s.NewWriter(io.Discard)
					switch mode {
					case "whole":
						w.Write(data)
					case "32k":
						for off := 0; off < len(data); off += chunk {
							w.Write(data[off:min(off+chunk, len(data))])
						}
					default:
						for off, i := 0, 0; off < len(data); i++ {
							n := min(small[i%len(small)], len(data)-off)
							w.Write(data[off : off+n])
							off += n
						}
					}
					w.Close()
				}
				b.ReportMetric(float64(len(data))*float64(b.N)/(benchCPU()-cpu0).Seconds()/1e6, "cpu-MB/s")
			})
		}
	}
}

// benchCPU is the calling thread's CPU time (user and system).
func benchCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(1, &ru) // RUSAGE_THREAD
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
