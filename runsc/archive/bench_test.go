package archive

import (
	"context"
	"crypto/rand"
	"fmt"

	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// MakeBenchTree writes the benchmarks' trees: "big" is 100 MB (90 MB of
// random data and 10 MB of text), "small" 20,000 files of 1-4 KiB text in
// 200 directories.
func makeBenchTree(b testing.TB, dir, kind string) int64 {
	ws := filepath.Join(dir, "workspace")
	must(b, os.MkdirAll(ws, 0o755))
	var total int64
	switch kind {
	case "big":
		rnd := make([]byte, 90<<20)
		rand.Read(rnd)
		must(b, os.WriteFile(filepath.Join(ws, "random.bin"), rnd, 0o644))
		text := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog 0123456789\n", 10<<20/55))
		must(b, os.WriteFile(filepath.Join(ws, "text.txt"), text, 0o644))
		total = int64(len(rnd) + len(text))
	case "small":
		for d := range 200 {
			sub := filepath.Join(ws, fmt.Sprintf("dir%03d", d))
			must(b, os.Mkdir(sub, 0o755))
			for f := range 100 {
				body := []byte(strings.Repeat(fmt.Sprintf("line %d of file %d in %d\n", f, f, d), 40+(f%3)*40))
				must(b, os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d.txt", f)), body, 0o644))
				total += int64(len(body))
			}
		}
	}
	return total
}

func dropCaches() { os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0) }

// BenchmarkArchive compares Pack and Unpack with tar and zstd -T0 -3 of
// the same tree in the same run (the throughput ratios are reported as
// metrics: ours / theirs, >= 0.8 is the target).
func BenchmarkArchive(b *testing.B) {
	needRoot(b)
	if _, err := exec.LookPath("zstd"); err != nil {
		b.Skip("zstd missing")
	}
	for _, kind := range []string{"big", "small"} {
		b.Run(kind, func(b *testing.B) {
			src := b.TempDir()
			size := makeBenchTree(b, src, kind)
			out := filepath.Join(b.TempDir(), "a.tar.zst")
			var ours, theirs, oursX, theirsX time.Duration
			for range b.N {
				f, _ := os.Create(out)
				t0 := time.Now()
				_, err := Pack(context.Background(), src, []string{"workspace"}, f)
				must(b, err)
				must(b, f.Sync())
				ours += time.Since(t0)
				f.Close()
				dst := b.TempDir()
				t0 = time.Now()
				f, _ = os.Open(out)
				_, err = Unpack(context.Background(), f, dst, Options{})
				must(b, err)
				syncFS(dst)
				oursX += time.Since(t0)
				f.Close()

				t0 = time.Now()
				cmd := exec.Command("sh", "-c", "tar -C \"$1\" -cf - workspace | zstd -q -T0 -3 > \"$2\" && sync -f \"$2\"", "sh", src, out)
				if o, err := cmd.CombinedOutput(); err != nil {
					b.Fatal(err, string(o))
				}
				theirs += time.Since(t0)
				dst2 := b.TempDir()
				t0 = time.Now()
				cmd = exec.Command("sh", "-c", "zstd -q -d -c \"$2\" | tar -C \"$1\" -xf - && sync -f \"$1\"", "sh", dst2, out)
				if o, err := cmd.CombinedOutput(); err != nil {
					b.Fatal(err, string(o))
				}
				theirsX += time.Since(t0)
			}
			mbs := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / 1e6 }
			b.ReportMetric(mbs(ours), "pack-MB/s")
			b.ReportMetric(mbs(theirs), "tar+zstd-MB/s")
			b.ReportMetric(mbs(oursX), "unpack-MB/s")
			b.ReportMetric(mbs(theirsX), "zstd+untar-MB/s")
			b.ReportMetric(theirs.Seconds()/ours.Seconds(), "pack-ratio")
			b.ReportMetric(theirsX.Seconds()/oursX.Seconds(), "unpack-ratio")
		})
	}
}

func syncFS(dir string) {
	f, err := os.Open(dir)
	if err == nil {
		defer f.Close()
		syncfs(f)
	}
}

func syncfs(f *os.File) { unixSyncfs(int(f.Fd())) }
