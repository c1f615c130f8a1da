package runsc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

const netnsDir = "/var/run/netns"

func netnsPath(name string) string { return filepath.Join(netnsDir, name) }

// createNetns makes a named, empty network namespace (only a loopback
// device, so no route anywhere). The calling thread enters the new namespace
// to create it; it is switched back, and if that fails the thread is thrown
// away with its goroutine instead of being reused.
func createNetns(name string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get netns: %w", err)
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err == nil {
			// gVisor's netstack takes over the namespace's interfaces:
			// loopback must be up for 127.0.0.1 to work inside.
			err = loopbackUp(h)
			h.Close()
		}
		if serr := netns.Set(orig); serr != nil {
			// Leave the thread locked: it exits with this goroutine.
			errc <- errors.Join(err, fmt.Errorf("restore netns: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		if err != nil {
			deleteNetns(name)
			errc <- fmt.Errorf("create netns: %w", err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

func loopbackUp(h netns.NsHandle) error {
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := nh.LinkSetUp(lo); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// deleteNetns removes a named namespace; a missing one is not an error.
func deleteNetns(name string) error {
	if _, err := os.Stat(netnsPath(name)); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete netns: %w", err)
	}
	return nil
}

// listNetns returns named namespaces whose name starts with prefix.
func listNetns(prefix string) []string {
	ents, _ := os.ReadDir(netnsDir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}
