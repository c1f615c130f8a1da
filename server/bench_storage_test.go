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

// eventField is the number field of the session's latest event of kind.
func eventField(b *testing.B, h *harness, id, kind, field string) time.Duration {
	var ms float64 = -1
	for _, line := range strings.Split(h.logsText(id), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["kind"] == kind {
			if v, ok := e[field].(float64); ok {
				ms = v
			}
		}
	}
	if ms < 0 {
		b.Fatalf("no %s event with %s", kind, field)
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

// The baselines, plain tools doing the same job on the same tree in the
// same run:
//
//   - save: tar of the sandbox's own disk dir (the same three parts a save
//     holds, read from the same mounted disk) | zstd -T0 -3 into a file,
//     then sync of that file (a save ends with its object fsynced);
//   - restore: a fresh disk image made with the same mkfs.ext4 command as
//     the driver's, loop-mounted, zstd -d | tar -x into it, unmounted and
//     the image synced (a restore ends the same way).
const (
	baseSave    = `tar -C "$1" -cf - upper workspace tmp | zstd -q -T0 -3 > "$2" && sync "$2"`
	baseRestore = `truncate -s "$3"M "$1" && mkfs.ext4 -q -F -m 0 -E lazy_itable_init=1,lazy_journal_init=1 "$1" && mkdir "$2" &&
mount -t ext4 -o loop,nosuid,nodev,noexec "$1" "$2" && zstd -q -d -c "$4" | tar -C "$2" -xf - && umount "$2" && sync "$1" && rmdir "$2" && rm "$1"`
)

// BenchmarkStorage: teardown (save to storage) and resume (restore from
// storage, the node's copy dropped first) of a session holding the tree,
// against the baselines above in the same run. Ratios are throughputs,
// ours / baseline: the save and restore steps alone (the saved and
// restored events' ms), and the whole teardown and resume, which also
// stop and start the sandbox: the lines printed break those down into
// sync through the agent, freeze (runsc pause), save, stop (processes,
// sandbox, mounts, network), and restore, start. The fixed costs (all but
// the save or restore) bound the whole-operation ratio: "at par" is the
// ratio a teardown or resume would have with its save or restore exactly
// as fast as the baseline, "limit" the one with a save or restore that
// took no time at all.
func BenchmarkStorage(b *testing.B) {
	cfg := realConfig(b)
	if _, err := osexec.LookPath("zstd"); err != nil {
		b.Skip("zstd missing (configs/host/packages.txt)")
	}
	const diskMiB = 1024
	cfg.Sizes.List = append(cfg.Sizes.List, config.Size{Name: "bench-disk", VCPUs: 1, MemoryMiB: 512, DiskMiB: diskMiB, Pids: 512, CreditsPerHour: 1000})
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
			src := filepath.Join(host, "tree")
			os.MkdirAll(src, 0o755)
			size := makeStorageTree(b, src, kind)
			// The tree in the sandbox's workspace.
			disk := filepath.Join(cfg.DataDir, "sandboxes", cid, "disk")
			shell(b, `cp -a "$1" "$2" && chown -R 1000:1000 "$2" && rm -rf "$1"`, src, filepath.Join(disk, "workspace", "tree"))
			out := filepath.Join(host, "base.tar.zst")
			var save, syncFreeze, teardown, restore, resume, tarZstd, unZstd time.Duration
			for range b.N {
				// A restore leaves the tree on a new disk, out of the page
				// cache: read it once, so neither side reads it cold.
				shell(b, `tar -C "$1" -cf - upper workspace tmp | cat > /dev/null`, disk)
				tarZstd += shell(b, baseSave, disk, out)
				unZstd += shell(b, baseRestore, filepath.Join(host, "base.img"), filepath.Join(host, "mnt"), fmt.Sprint(diskMiB), out)

				t0 := time.Now()
				h.teardownOK(id)
				teardown += time.Since(t0)
				save += eventField(b, h, id, "saved", "ms")
				syncFreeze += eventField(b, h, id, "saved", "syncMs") + eventField(b, h, id, "saved", "freezeMs")
				if err := rt.DropDisk(cid); err != nil {
					b.Fatal(err)
				}
				t0 = time.Now()
				h.resumeOK(id)
				resume += time.Since(t0)
				restore += eventField(b, h, id, "restored", "ms")
			}
			mbs := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / 1e6 }
			b.ReportMetric(mbs(save), "save-MB/s")
			b.ReportMetric(mbs(tarZstd), "tar+zstd-MB/s")
			b.ReportMetric(mbs(restore), "restore-MB/s")
			b.ReportMetric(mbs(unZstd), "unzstd+tar-MB/s")
			b.ReportMetric(tarZstd.Seconds()/save.Seconds(), "save-ratio")
			b.ReportMetric(unZstd.Seconds()/restore.Seconds(), "restore-ratio")
			b.ReportMetric(tarZstd.Seconds()/teardown.Seconds(), "teardown-ratio")
			b.ReportMetric(unZstd.Seconds()/resume.Seconds(), "resume-ratio")
			n := float64(b.N)
			stop := teardown - save - syncFreeze
			start := resume - restore
			fixedT := teardown - save
			fmt.Printf("storage %s (n=%d, %.0f MB): save %.0f ms (%.2fx tar|zstd+sync %.0f ms) | "+
				"teardown %.0f ms (%.2fx; fixed: sync+freeze %.0f ms, stop %.0f ms; at par %.2fx, limit %.2fx)\n",
				kind, b.N, float64(size)/1e6,
				ms(save)/n, tarZstd.Seconds()/save.Seconds(), ms(tarZstd)/n,
				ms(teardown)/n, tarZstd.Seconds()/teardown.Seconds(), ms(syncFreeze)/n, ms(stop)/n,
				tarZstd.Seconds()/(fixedT+tarZstd).Seconds(), tarZstd.Seconds()/fixedT.Seconds())
			fmt.Printf("storage %s (n=%d, %.0f MB): restore %.0f ms (%.2fx mkfs+mount+zstd -d|tar -x+umount+sync %.0f ms) | "+
				"resume %.0f ms (%.2fx; fixed: start %.0f ms; at par %.2fx, limit %.2fx)\n",
				kind, b.N, float64(size)/1e6,
				ms(restore)/n, unZstd.Seconds()/restore.Seconds(), ms(unZstd)/n,
				ms(resume)/n, unZstd.Seconds()/resume.Seconds(), ms(start)/n,
				unZstd.Seconds()/(start+unZstd).Seconds(), unZstd.Seconds()/start.Seconds())
			if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/"+id, nil); code != 204 {
				b.Fatal("delete")
			}
		})
	}
}
