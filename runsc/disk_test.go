package runsc

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// A clean disk is not touched before a mount; one that recorded errors is
// checked and repaired by e2fsck, and clean afterwards.
func TestRepairDisk(t *testing.T) {
	if _, err := exec.LookPath("e2fsck"); err != nil {
		t.Skip("no e2fsck")
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := makeDisk(img, 64); err != nil {
		t.Fatal(err)
	}
	clean, err := diskClean(img)
	if err != nil || !clean {
		t.Fatalf("fresh disk: clean %v, %v", clean, err)
	}
	st0, _ := os.Stat(img)
	if err := repairDisk(img); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(img); !st.ModTime().Equal(st0.ModTime()) {
		t.Fatal("a clean disk was written")
	}
	// What ext4 records when it meets an error: the state's error bit.
	if out, err := exec.Command("tune2fs", "-E", "force_fsck", img).CombinedOutput(); err != nil {
		t.Fatalf("tune2fs: %v %s", err, out)
	}
	if clean, _ := diskClean(img); clean {
		t.Fatal("a disk with errors reads as clean")
	}
	if err := repairDisk(img); err != nil {
		t.Fatal(err)
	}
	if clean, err := diskClean(img); err != nil || !clean {
		t.Fatalf("after the repair: clean %v, %v", clean, err)
	}
	// Not ext4 at all: e2fsck says so, and the start fails.
	os.WriteFile(img, make([]byte, 4096), 0o600)
	if err := repairDisk(img); err == nil {
		t.Fatal("a disk that is not ext4 passed")
	}
}
