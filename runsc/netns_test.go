package runsc

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The sandbox network is IPv4 only: IPv6 is off on both ends of the veth,
// so neither has a link-local address (the sandbox reached the proxy
// namespace's kernel over fe80::/64 before, and gVisor copied the route).
func TestSandboxNetIPv4Only(t *testing.T) {
	if testing.Short() {
		t.Skip("makes network namespaces (not in -short)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("the kernel has no IPv6")
	}
	id := fmt.Sprintf("sbxnettest-%d", os.Getpid())
	if err := createSandboxNet(id); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := deleteSandboxNet(id); err != nil {
			t.Error(err)
		}
		if left := listNetns("sbxnettest-"); len(left) > 0 {
			t.Errorf("namespaces left: %v", left)
		}
	}()
	for _, c := range []struct{ ns, dev, v4 string }{{id, "eth0", SandboxAddr}, {proxyNetnsName(id), "px0", ProxyAddr}} {
		var disabled string
		var v4, v6 []netlink.Addr
		err := inNetns(enterNamed(c.ns), func(h netns.NsHandle) error {
			b, err := os.ReadFile(filepath.Join("/proc/sys/net/ipv6/conf", c.dev, "disable_ipv6"))
			disabled = strings.TrimSpace(string(b))
			if err != nil {
				return err
			}
			nh, err := netlink.NewHandleAt(h)
			if err != nil {
				return err
			}
			defer nh.Close()
			l, err := nh.LinkByName(c.dev)
			if err != nil {
				return err
			}
			if l.Attrs().Flags&net.FlagUp == 0 {
				return fmt.Errorf("%s is down", c.dev)
			}
			if v4, err = nh.AddrList(l, netlink.FAMILY_V4); err != nil {
				return err
			}
			v6, err = nh.AddrList(l, netlink.FAMILY_V6)
			return err
		})
		if err != nil {
			t.Fatalf("%s in %s: %v", c.dev, c.ns, err)
		}
		if disabled != "1" || len(v6) != 0 {
			t.Errorf("%s: disable_ipv6 %q, IPv6 addresses %v", c.dev, disabled, v6)
		}
		if len(v4) != 1 || v4[0].IP.String() != c.v4 {
			t.Errorf("%s: IPv4 addresses %v, want %s", c.dev, v4, c.v4)
		}
	}
}
