package server

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/store/objects"
)

// oddTreeScript makes, as the sandbox user, a tree with thousands of files,
// odd names (newline, non-UTF-8, spaces, quotes), modes (setuid, 0),
// symlinks (relative, absolute, dangling), a hard link, a big file,
// a deleted file of the image (an overlay whiteout: ~/.bashrc) and a file
// in home (the root layer). No FIFO: gVisor keeps named pipes made inside
// the sandbox in its own memory (synthetic), never on the disk.
const oddTreeScript = `
import os, stat
w = '/workspace/tree'
os.makedirs(w + '/deep/a/b/c', exist_ok=True)
for d in range(30):
    os.makedirs(f'{w}/many/d{d:02d}', exist_ok=True)
    for f in range(100):
        with open(f'{w}/many/d{d:02d}/f{f:03d}.txt', 'w') as fh:
            fh.write(f'file {d} {f}\n' * (f % 7 + 1))
for name in ['new\nline', ' spaces and \'quotes\' "', 'x' * 200]:
    open(os.path.join(w, name), 'w').write(name)
open(os.fsencode(w) + b'/bad\xff\xfeutf8', 'w').write('bytes')
open(w + '/setuid', 'w').write('#!/bin/sh\n'); os.chmod(w + '/setuid', 0o4755)
open(w + '/nomode', 'w').write('x'); os.chmod(w + '/nomode', 0)
open(w + '/exec', 'w').write('x'); os.chmod(w + '/exec', 0o751)
os.symlink('../tree/exec', w + '/deep/rel')
os.symlink('/etc/shadow', w + '/abs')
os.symlink('nowhere/x', w + '/dangling')
os.link(w + '/exec', w + '/deep/hard')
os.utime(w + '/exec', ns=(1577934245123456789, 1577934245123456789))
os.chmod(w + '/deep/a', 0o700)
open(os.path.expanduser('~/home-note'), 'w').write('home\n')
os.remove(os.path.expanduser('~/.bashrc'))
`

// manifestScript prints one line per entry of /workspace and the home dir:
// type, mode, owner, size, mtime, content digest, link target, inode group.
// Not the mtimes of files in home: gVisor answers its own cached times for
// files it wrote through the root overlay, microseconds off the host's
// (seen even on a resume from the untouched disk).
const manifestScript = `
import os, hashlib, stat, sys
out = []
for top in ['/workspace', os.path.expanduser('~')]:
    inodes = {}
    for root, dirs, files in os.walk(os.fsencode(top)):
        for n in sorted(dirs + files):
            p = os.path.join(root, n)
            st = os.lstat(p)
            line = [p.hex(), oct(st.st_mode), str(st.st_uid), str(st.st_gid)]
            if stat.S_ISREG(st.st_mode):
                line += [str(st.st_size), str(st.st_mtime_ns) if top == '/workspace' else '']
                if st.st_mode & 0o444 and os.access(p, os.R_OK):
                    line.append(hashlib.sha256(open(p, 'rb').read()).hexdigest())
                if st.st_nlink > 1:
                    line.append('ino:' + inodes.setdefault(st.st_ino, p.hex()))
            elif stat.S_ISLNK(st.st_mode):
                line.append(os.readlink(p).hex())
            elif not stat.S_ISDIR(st.st_mode):
                line.append(str(st.st_mtime_ns))
            out.append(' '.join(line))
out.sort()
if os.environ.get('FULL'):
    print('\n'.join(bytes.fromhex(l.split(' ')[0]).decode(errors='replace') + ' ' + l for l in out))
print(len(out), hashlib.sha256('\n'.join(out).encode()).hexdigest())
print(os.path.exists(os.path.expanduser('~/.bashrc')))
`

func (h *harness) manifest(id string) string {
	h.t.Helper()
	r := h.exec(id, map[string]any{"command": "python3 -c \"$S\"", "env": map[string]string{"S": manifestScript}, "timeoutMs": 120000})
	if r.ExitCode != 0 || !strings.HasSuffix(r.Stdout, "False\n") {
		h.t.Fatalf("manifest: %+v", r)
	}
	return r.Stdout
}

func (h *harness) storage() *objects.Dir {
	h.t.Helper()
	d, err := objects.NewDir(config.StorageDir(h.cfg.DataDir))
	if err != nil {
		h.t.Fatal(err)
	}
	return d
}

func (h *harness) teardownOK(id string) sandboxObject {
	h.t.Helper()
	code, b := h.call(h.token, "POST", "/v1/sandbox/"+id+"/teardown", nil)
	var o sandboxObject
	json.Unmarshal(b, &o)
	if code != 200 || o.Status != "stopped" {
		h.t.Fatalf("teardown %s: %d %s", id, code, b)
	}
	return o
}

func (h *harness) resumeOK(id string) sandboxObject {
	h.t.Helper()
	code, b := h.call(h.token, "POST", "/v1/sandbox/"+id+"/resume", nil)
	var o sandboxObject
	json.Unmarshal(b, &o)
	if code != 200 || o.Status != "running" {
		h.t.Fatalf("resume %s: %d %s", id, code, b)
	}
	return o
}

// TestRealStorage saves a tree with thousands of files, odd names and
// modes, links, a whiteout and a 500 MB file to the organization's
// storage and brings it back, from the node's cache and from storage
// alone, compared entry by entry by digest; files of a stopped session
// whose node copy is gone are restored for reading; delete removes the
// saves; the quota refuses a teardown and the sandbox runs on.
func TestRealStorage(t *testing.T) {
	cfg := realConfig(t)
	cfg.Sizes.List = append(cfg.Sizes.List, config.Size{Name: "test-disk", VCPUs: 1, MemoryMiB: 768, DiskMiB: 2048, Pids: 512, CreditsPerHour: 1000})
	h := startServer(t, cfg)
	h.provision("st1", "test-disk")
	if r := h.exec("st1", map[string]any{"command": "python3 -c \"$S\" && head -c 500M /dev/urandom > /workspace/big.bin && sync",
		"env": map[string]string{"S": oddTreeScript}, "timeoutMs": 300000}); r.ExitCode != 0 {
		t.Fatalf("make tree: %+v", r)
	}
	// Written through a shared mapping and never synced by the program:
	// the sentry may hold it; teardown syncs before it saves.
	h.sh("st1", `python3 -c "
import mmap
f = open('/workspace/mapped', 'w+b'); f.truncate(4096)
m = mmap.mmap(f.fileno(), 4096); m[:5] = b'hello'"`)
	want := h.manifest("st1")
	t.Logf("manifest: %s", strings.SplitN(want, "\n", 2)[0])

	o := h.teardownOK("st1")
	if o.Teardown.SavedBytes < 500<<20 || o.Storage.SavedBytes != o.Teardown.SavedBytes || o.Storage.SavedAt == nil {
		t.Fatalf("teardown result: %+v %+v", o.Teardown, o.Storage)
	}
	cid := h.s.rt.ContainerID(o.OrgID, "st1")
	rt := h.s.rt.(*runsc.Runtime)
	if present, sum := rt.DiskCache(cid); !present || sum == "" {
		t.Fatalf("local disk not marked as the save: %v %q", present, sum)
	}
	list, _ := h.storage().List(context.Background(), o.OrgID, "")
	if len(list) != 1 || list[0].Size != o.Storage.SavedBytes {
		t.Fatalf("storage: %+v", list)
	}

	// From the node's cache.
	h.resumeOK("st1")
	if got := h.manifest("st1"); got != want {
		t.Fatalf("after resume from the cache:\n%s\nwant\n%s", got, want)
	}
	if r := h.sh("st1", "head -c 5 /workspace/mapped"); r.Stdout != "hello" {
		t.Fatalf("mapped file: %+v", r)
	}
	h.sh("st1", "echo second > /workspace/second.txt")
	want = h.manifest("st1")
	o = h.teardownOK("st1")
	list, _ = h.storage().List(context.Background(), o.OrgID, "")
	if len(list) != 1 || !strings.HasSuffix(list[0].Name, "disk-2.tar.zst") {
		t.Fatalf("old generation kept: %+v", list)
	}

	// The node loses its copy: files are read from a restored one, and
	// resume restores it.
	if err := rt.DropDisk(cid); err != nil {
		t.Fatal(err)
	}
	code, b := h.call(h.token, "GET", "/v1/sandbox/st1/files?path=/workspace/second.txt", nil)
	if code != 200 || string(b) != "second\n" {
		t.Fatalf("file of a stopped session without a local disk: %d %s", code, b)
	}
	if err := rt.DropDisk(cid); err != nil {
		t.Fatal(err)
	}
	h.resumeOK("st1")
	if got := h.manifest("st1"); got != want {
		t.Fatalf("after resume from storage:\n%s\nwant\n%s", got, want)
	}
	if !strings.Contains(h.logsText("st1"), `"restored"`) {
		t.Fatal("no restored event")
	}
	if left := h.storage().Leftovers(); len(left) != 0 {
		t.Fatalf("temporary objects left: %v", left)
	}
	if code, _ := h.call(h.token, "DELETE", "/v1/sandbox/st1", nil); code != 204 {
		t.Fatal("delete")
	}
	if list, _ := h.storage().List(context.Background(), o.OrgID, ""); len(list) != 0 {
		t.Fatalf("saves left after delete: %+v", list)
	}
	h.close()

	// Quota: a save that would pass it is refused; the sandbox runs on
	// with its files.
	cfg.Storage.OrgQuotaMiB = 2
	h = startServer(t, cfg)
	h.provision("q1", "test-tiny")
	h.sh("q1", "head -c 4M /dev/urandom > /workspace/r.bin; sleep 999 >/dev/null 2>&1 &")
	code, b = h.call(h.token, "POST", "/v1/sandbox/q1/teardown", nil)
	if code != 507 || errCode(b) != "insufficient_storage" {
		t.Fatalf("teardown over quota: %d %s", code, b)
	}
	if o := h.get("q1"); o.Status != "running" {
		t.Fatalf("after a refused save: %+v", o)
	}
	if r := h.sh("q1", "stat -c %s /workspace/r.bin; pgrep -c -x sleep"); r.Stdout != "4194304\n1\n" {
		t.Fatalf("sandbox after a refused save: %+v", r)
	}
	h.sh("q1", "rm /workspace/r.bin")
	if o := h.teardownOK("q1"); o.Teardown.SavedBytes == 0 || o.Teardown.SavedBytes > 2<<20 {
		t.Fatalf("teardown under quota: %+v", o.Teardown)
	}
	if left := h.storage().Leftovers(); len(left) != 0 {
		t.Fatalf("temporary objects left: %v", left)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "sandboxes", cid)); !os.IsNotExist(err) {
		t.Fatalf("deleted session's dir: %v", err)
	}
}
