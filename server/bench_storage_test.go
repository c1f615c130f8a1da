package server

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sandboxd/runsc"
	"sandboxd/server/config"
)

// makeStorageTree writes the benchmark trees on the host: "100MB" is 90 MB
// of random data and 10 MB of text in two files, "20k-files" is 20,000
// text files of 1-4 KiB in 200 directories.
func makeStorageTree(b *testing.B, dir, kind string) int64 {
	var total int64
	switch kind {
	case "100MB":
		rnd := make([]byte, 90<<20)
		rand.Read(rnd)
		text := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog 0123456789\n", 10<<20/55))
		os.WriteFile(filepath.Join(dir, "random.bin"), rnd, 0o644)
		os.WriteFile(filepath.Join(dir, "text.txt"), text, 0o644)
		total = int64(len(rnd) + len(text))
	case "20k-files":
		for d := range 200 {
			sub := filepath.Join(dir, fmt.Sprintf("dir%03d", d))
			os.Mkdir(sub, 0o755)
			for f := range 100 {
				body := []byte(strings.Repeat(fmt.Sprintf("line %d of file %d in %d\n", f, f, d), 40+(f%3)*40))
				os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%03d.txt", f)), body, 0o644)
				total += int64(len(body))
			}
		}
	}
	return total
}

// eventMs is the "ms" of the session's latest event of kind.
func eventMs(b *testing.B, h *harness, id, kind string) time.Duration {
	var ms int64 = -1
	for _, line := range strings.Split(h.logsText(id), "\n") {
		var e struct {
			Kind string `json:"kind"`
			Ms   int64  `json:"ms"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Kind == kind {
			ms = e.Ms
		}
	}
	if ms < 0 {
		b.Fatalf("no %s event", kind)
	}
	return time.Duration(ms) * time.Millisecond
}

func shell(b *testing.B, script string, args ...string) time.Duration {
	t0 := time.Now()
	if out, err := osexec.Command("sh", append([]string{"-c", script, "sh"}, args...)...).CombinedOutput(); err != nil {
		b.Fatalf("%s: %v %s", script, err, out)
	}
	return time.Since(t0)
}

// BenchmarkStorage: teardown (save to storage) and resume (restore from
// storage, the node's copy dropped first) of a session holding the tree,
// against tar | zstd -T0 -3 of the same tree into a file, fsynced (sync
// FILE), and zstd -d | tar -x of that into a fresh directory, in the same
// run. The extraction baseline is not synced (syncfs would flush every
// other writer of the host's file system too); ours is: a restore ends
// with the new disk image unmounted and fsynced.
// Ratios are throughputs, ours / baseline: the save and restore steps
// alone, and the whole teardown and resume (which also stop and start the
// sandbox).
func BenchmarkStorage(b *testing.B) {
	cfg := realConfig(b)
	if _, err := osexec.LookPath("zstd"); err != nil {
		b.Skip("zstd missing (configs/host/packages.txt)")
	}
	cfg.Sizes.List = append(cfg.Sizes.List, config.Size{Name: "bench-disk", VCPUs: 1, MemoryMiB: 512, DiskMiB: 1024, Pids: 512, CreditsPerHour: 1})
	h := startServer(b, cfg)
	runs := 0
	for _, kind := range []string{"100MB", "20k-files"} {
		b.Run(kind, func(b *testing.B) {
			runs++ // b.Run may run the function more than once: a new session each time
			id := fmt.Sprintf("bench%d", runs)
			o := h.provision(id, "bench-disk")
			cid := h.s.rt.ContainerID(o.OrgID, id)
			rt := h.s.rt.(*runsc.Runtime)
			host := b.TempDir()
			src := filepath.Join(host, "workspace", "tree")
			os.MkdirAll(src, 0o755)
			size := makeStorageTree(b, src, kind)
			// The same tree in the sandbox's workspace.
			shell(b, `cp -a "$1" "$2" && chown -R 1000:1000 "$2"`, src, filepath.Join(cfg.DataDir, "sandboxes", cid, "disk", "workspace", "tree"))
			out := filepath.Join(host, "base.tar.zst")
			var save, teardown, restore, resume, tarZstd, unZstd time.Duration
			for range b.N {
				tarZstd += shell(b, `tar -C "$1" -cf - workspace | zstd -q -T0 -3 > "$2" && sync "$2"`, host, out)
				dst := filepath.Join(host, "x")
				unZstd += shell(b, `mkdir "$1" && zstd -q -d -c "$2" | tar -C "$1" -xf -`, dst, out)
				os.RemoveAll(dst)

				t0 := time.Now()
				h.teardownOK(id)
				teardown += time.Since(t0)
				save += eventMs(b, h, id, "saved")
				if err := rt.DropDisk(cid); err != nil {
					b.Fatal(err)
				}
				t0 = time.Now()
				h.resumeOK(id)
				resume += time.Since(t0)
				restore += eventMs(b, h, id, "restored")
			}
			mbs := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / 1e6 }
			b.ReportMetric(mbs(save), "save-MB/s")
			b.ReportMetric(mbs(tarZstd), "tar+zstd-MB/s")
			b.ReportMetric(mbs(restore), "restore-MB/s")
			b.ReportMetric(mbs(unZstd), "unzstd+tar-MB/s")
			b.ReportMetric(tarZstd.Seconds()/save.Seconds(), "save-ratio")
			b.ReportMetric(unZstd.Seconds()/restore.Seconds(), "restore-ratio")
			fmt.Printf("storage %s (n=%d, %.0f MB): save %.0f ms (%.2fx tar|zstd %.0f ms), teardown %.0f ms (%.2fx) | "+
				"restore %.0f ms (%.2fx zstd -d|tar -x %.0f ms), resume %.0f ms (%.2fx)\n",
				kind, b.N, float64(size)/1e6,
				ms(save)/float64(b.N), tarZstd.Seconds()/save.Seconds(), ms(tarZstd)/float64(b.N),
				ms(teardown)/float64(b.N), tarZstd.Seconds()/teardown.Seconds(),
				ms(restore)/float64(b.N), unZstd.Seconds()/restore.Seconds(), ms(unZstd)/float64(b.N),
				ms(resume)/float64(b.N), unZstd.Seconds()/resume.Seconds())
			if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 {
				b.Fatal("delete")
			}
		})
	}
}
