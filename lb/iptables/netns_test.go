package iptables

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// peer is a second network namespace, joined to the test's own by a veth
// pair: a client host on the uplink.
type peer struct {
	ns netns.NsHandle
}

// newPeer creates a namespace and a veth pair between it and the test's
// namespace: local in the test's, remote in the peer's, both up. Both are
// removed when t ends.
func newPeer(t *testing.T, local, remote string) *peer {
	t.Helper()
	nsc := make(chan netns.NsHandle, 1)
	errc := make(chan error, 1)
	go func() {
		// The thread switches namespaces and is never unlocked, so it
		// dies with the goroutine instead of serving others.
		runtime.LockOSThread()
		ns, err := netns.New()
		if err != nil {
			errc <- err
			return
		}
		nsc <- ns
	}()
	var p peer
	select {
	case p.ns = <-nsc:
	case err := <-errc:
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() { p.ns.Close() })
	// New links skip duplicate address detection, so that link-local
	// addresses are usable at once.
	p.do(t, func() error { return sysctl("net/ipv6/conf/default/accept_dad", "0") })
	if err := sysctl("net/ipv6/conf/default/accept_dad", "0"); err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: local}, PeerName: remote, PeerNamespace: netlink.NsFd(int(p.ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s/%s: %v", local, remote, err)
	}
	t.Cleanup(func() { netlink.LinkDel(veth) })
	if err := linkUp(local); err != nil {
		t.Fatal(err)
	}
	p.do(t, func() error {
		if err := linkUp("lo"); err != nil {
			return err
		}
		return linkUp(remote)
	})
	return &p
}

// do runs f on a thread in the peer's namespace, failing t on error.
func (p *peer) do(t *testing.T, f func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(p.ns); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// addAddr adds a prefix to a link; IPv6 addresses skip duplicate address
// detection so they are usable at once.
func addAddr(link, prefix string) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(prefix)
	if err != nil {
		return err
	}
	if a.IP.To4() == nil {
		a.Flags |= 0x02 // IFA_F_NODAD
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add %s to %s: %w", prefix, link, err)
	}
	return nil
}

// addRoute routes dst through gw.
func addRoute(dst, gw string) error {
	_, n, err := net.ParseCIDR(dst)
	if err != nil {
		return err
	}
	if err := netlink.RouteAdd(&netlink.Route{Dst: n, Gw: net.ParseIP(gw)}); err != nil {
		return fmt.Errorf("route %s via %s: %w", dst, gw, err)
	}
	return nil
}

func sysctl(path, value string) error {
	return os.WriteFile("/proc/sys/"+path, []byte(value), 0o644)
}

// ping sends one ICMP echo request to addr and reports whether a reply
// came back within timeout.
func ping(addr netip.Addr, timeout time.Duration) (bool, error) {
	network, laddr, proto := "ip4:icmp", "0.0.0.0", 1
	var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if addr.Is6() {
		network, laddr, proto = "ip6:ipv6-icmp", "::", 58
		typ, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err != nil {
		return false, err
	}
	defer c.Close()
	msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: 0x7d, Seq: 1, Data: []byte("vipd")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return false, err
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: addr.AsSlice()}); err != nil {
		return false, err
	}
	c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return false, nil
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err == nil && m.Type == reply && from.(*net.IPAddr).IP.Equal(addr.AsSlice()) {
			return true, nil
		}
	}
}
