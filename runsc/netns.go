package runsc

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

const netnsDir = "/var/run/netns"

func netnsPath(name string) string { return filepath.Join(netnsDir, name) }

// createNetns makes a named, empty network namespace (only a loopback
// device, so no route anywhere).
func createNetns(name string) error {
	// NewNamed creates the namespace and moves the thread into it.
	err := inNetns(func() (netns.NsHandle, error) { return netns.NewNamed(name) },
		// gVisor's netstack takes over the namespace's interfaces:
		// loopback must be up for 127.0.0.1 to work inside.
		loopbackUp)
	if err != nil {
		deleteNetns(name)
		return fmt.Errorf("create netns: %w", err)
	}
	return nil
}

// inNetns runs fn on an OS thread that enter has moved into a namespace,
// then moves the thread back. If moving back fails, the thread stays
// locked and is thrown away with its goroutine instead of being reused.
func inNetns(enter func() (netns.NsHandle, error), fn func(netns.NsHandle) error) error {
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
		h, err := enter()
		if err == nil {
			err = fn(h)
			h.Close()
		}
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("restore netns: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
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

// The sandbox network: every sandbox gets two namespaces joined by a veth
// pair. The sandbox's namespace (named <id>) holds lo and eth0 (SandboxAddr);
// a private one (named <id>-px) holds the other end (ProxyAddr), where the
// only socket is the egress proxy's listener for that sandbox. The proxy
// namespace has no other interface and forwards nothing, so from inside the
// sandbox nothing else exists: no host port, no other sandbox, no route to
// the internet (there is no default route: direct connections fail at once
// with "network unreachable"). The pair is IPv4 only: IPv6 is off on both
// ends, so neither gets a link-local address (the sandbox would otherwise
// reach the proxy namespace's kernel over fe80::/64). The same addresses
// are used in every pair; the namespaces keep them apart. The host's own
// namespace and firewall are never touched.
const (
	ProxyAddr   = "10.200.0.1"
	SandboxAddr = "10.200.0.2"
	ProxyPort   = 3128
	netPrefix   = 30
	proxySuffix = "-px"
	// Large frames: fewer packets through gVisor's netstack per byte.
	vethMTU = 65000
)

// ProxyURL is the egress proxy as seen from inside every sandbox.
var ProxyURL = "http://" + ProxyAddr + ":" + strconv.Itoa(ProxyPort)

// ProxyEnv is the environment that points the usual tools (curl, pip, npm,
// git, apt, Go, Node) at the egress proxy, in both letter cases.
func ProxyEnv() map[string]string {
	const noProxy = "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTP_PROXY": ProxyURL, "HTTPS_PROXY": ProxyURL, "NO_PROXY": noProxy,
		"http_proxy": ProxyURL, "https_proxy": ProxyURL, "no_proxy": noProxy,
	}
}

func proxyNetnsName(id string) string { return id + proxySuffix }

// createSandboxNet makes both namespaces and the veth pair between them.
// On error nothing is left.
func createSandboxNet(id string) (err error) {
	if err := createNetns(id); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			deleteSandboxNet(id)
		}
	}()
	if err := createNetns(proxyNetnsName(id)); err != nil {
		return err
	}
	sb, err := netns.GetFromName(id)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer sb.Close()
	px, err := netns.GetFromName(proxyNetnsName(id))
	if err != nil {
		return fmt.Errorf("open proxy netns: %w", err)
	}
	defer px.Close()
	ph, err := netlink.NewHandleAt(px)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer ph.Close()
	// Made inside the proxy namespace with its peer inside the sandbox's:
	// neither end ever exists in the host's namespace.
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: "px0", MTU: vethMTU},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(sb)),
	}
	if err := ph.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth: %w", err)
	}
	// Before the links are up, when a link-local address would be made.
	if err := disableIPv6(proxyNetnsName(id), "px0"); err != nil {
		return err
	}
	if err := disableIPv6(id, "eth0"); err != nil {
		return err
	}
	if err := addrUp(ph, "px0", ProxyAddr); err != nil {
		return err
	}
	sh, err := netlink.NewHandleAt(sb)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer sh.Close()
	return addrUp(sh, "eth0", SandboxAddr)
}

func addrUp(h *netlink.Handle, name, ip string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	a, err := netlink.ParseAddr(fmt.Sprintf("%s/%d", ip, netPrefix))
	if err != nil {
		return err
	}
	if err := h.AddrAdd(l, a); err != nil {
		return fmt.Errorf("address %s: %w", name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("up %s: %w", name, err)
	}
	return nil
}

// enterNamed moves the calling thread into the named namespace (inNetns's
// enter).
func enterNamed(name string) func() (netns.NsHandle, error) {
	return func() (netns.NsHandle, error) {
		h, err := netns.GetFromName(name)
		if err != nil {
			return h, fmt.Errorf("open netns %s: %w", name, err)
		}
		if err := netns.Set(h); err != nil {
			h.Close()
			return h, fmt.Errorf("enter netns %s: %w", name, err)
		}
		return h, nil
	}
}

// disableIPv6 turns IPv6 off on link dev of the named namespace (its
// sysctl: /proc/sys/net is the calling thread's namespace's). A kernel
// without IPv6 has nothing to turn off.
func disableIPv6(ns, dev string) error {
	return inNetns(enterNamed(ns), func(netns.NsHandle) error {
		err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", dev, "disable_ipv6"), []byte("1"), 0)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("disable IPv6 on %s: %w", dev, err)
		}
		return nil
	})
}

// deleteSandboxNet removes both namespaces (the veth pair goes with them).
func deleteSandboxNet(id string) error {
	return errors.Join(deleteNetns(proxyNetnsName(id)), deleteNetns(id))
}

// ListenProxy opens the egress proxy's listener for sandbox id inside its
// proxy namespace, at ProxyAddr:ProxyPort. Only that sandbox can reach it.
// The caller serves and closes it; after a server restart it is opened
// again for each live sandbox.
func (r *Runtime) ListenProxy(id string) (net.Listener, error) {
	if !r.Owns(id) {
		return nil, fmt.Errorf("container id %q not made by this runtime", id)
	}
	var l net.Listener
	err := inNetns(enterNamed(proxyNetnsName(id)), func(netns.NsHandle) (err error) {
		// The socket belongs to the namespace it was made in.
		l, err = net.Listen("tcp4", net.JoinHostPort(ProxyAddr, strconv.Itoa(ProxyPort)))
		if err != nil {
			return fmt.Errorf("listen in proxy netns: %w", err)
		}
		return nil
	})
	if err != nil {
		if l != nil {
			l.Close()
		}
		return nil, err
	}
	return l, nil
}
