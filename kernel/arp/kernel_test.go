package arp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/lb/lbtest/nstest"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/ipv6"
)

// kernelRig is the test's namespace with an uplink veth to a peer
// namespace, strict ARP, and VIPs on lo standing in for the dummy
// interface. The peer accepts gratuitous ARP and unsolicited neighbour
// advertisements and routes the VIP prefixes straight out of its veth.
type kernelRig struct {
	peer *nstest.Peer
	mac  net.HardwareAddr // the uplink's
}

const (
	uplink   = "vipd-up0"
	peerLink = "vipd-peer0"
)

func newKernelRig(t *testing.T) *kernelRig {
	t.Helper()
	nstest.Need(t)
	for _, s := range []string{"all", "default"} {
		for k, v := range map[string]string{"arp_ignore": "1", "arp_announce": "2"} {
			if err := nstest.Sysctl("net/ipv4/conf/"+s+"/"+k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	p := nstest.NewPeer(t, uplink, peerLink)
	for _, s := range []string{"192.0.2.1/24", "2001:db8::1/64"} {
		if err := nstest.AddAddr(uplink, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"198.51.100.10/32", "2001:db8:100::10/128"} {
		nstest.AddAddrFor(t, "lo", s)
	}
	p.Do(t, func() error {
		for k, v := range map[string]string{
			"net/ipv4/conf/all/arp_accept":                       "1",
			"net/ipv4/conf/" + peerLink + "/arp_accept":          "1",
			"net/ipv6/conf/" + peerLink + "/forwarding":          "1",
			"net/ipv6/conf/" + peerLink + "/accept_untracked_na": "1",
		} {
			if err := nstest.Sysctl(k, v); err != nil {
				return err
			}
		}
		for _, s := range []string{"192.0.2.2/24", "2001:db8::2/64"} {
			if err := nstest.AddAddr(peerLink, s); err != nil {
				return err
			}
		}
		for _, s := range []string{"198.51.100.0/24", "2001:db8:100::/64"} {
			if err := addOnLinkRoute(s, peerLink); err != nil {
				return err
			}
		}
		return nil
	})
	ifi, err := net.InterfaceByName(uplink)
	if err != nil {
		t.Fatal(err)
	}
	if err := nstest.WaitLinkLocal(uplink); err != nil {
		t.Fatal(err)
	}
	return &kernelRig{peer: p, mac: ifi.HardwareAddr}
}

// neighbour returns the peer's neighbour entry for addr, or nil.
func (r *kernelRig) neighbour(t *testing.T, addr netip.Addr) *netlink.Neigh {
	t.Helper()
	var found *netlink.Neigh
	r.peer.Do(t, func() error {
		l, err := netlink.LinkByName(peerLink)
		if err != nil {
			return err
		}
		fam := netlink.FAMILY_V4
		if addr.Is6() {
			fam = netlink.FAMILY_V6
		}
		neighs, err := nstest.Dump(func() ([]netlink.Neigh, error) { return netlink.NeighList(l.Attrs().Index, fam) })
		if err != nil {
			return err
		}
		for _, n := range neighs {
			if n.IP.Equal(addr.AsSlice()) && n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) == 0 && len(n.HardwareAddr) > 0 {
				found = &n
			}
		}
		return nil
	})
	return found
}

// forget deletes the peer's neighbour entry for addr.
func (r *kernelRig) forget(t *testing.T, addr netip.Addr) {
	t.Helper()
	if n := r.neighbour(t, addr); n != nil {
		r.peer.Do(t, func() error { return netlink.NeighDel(n) })
	}
}

// waitNeighbour waits for the peer to map addr to the uplink's MAC.
func (r *kernelRig) waitNeighbour(t *testing.T, addr netip.Addr) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		n := r.neighbour(t, addr)
		if n != nil && bytes.Equal(n.HardwareAddr, r.mac) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("peer has no neighbour entry %s -> %s (have %v)", addr, r.mac, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// resolve sends an ARP request for addr from the peer, as arping does,
// and returns the MAC that answered, or an error after timeout.
func (r *kernelRig) resolve(t *testing.T, addr netip.Addr, timeout time.Duration) (net.HardwareAddr, error) {
	t.Helper()
	var mac net.HardwareAddr
	var rerr error
	r.peer.Do(t, func() error {
		ifi, err := net.InterfaceByName(peerLink)
		if err != nil {
			return err
		}
		c, err := arp.Dial(ifi)
		if err != nil {
			return fmt.Errorf("arp dial in peer: %w", err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		mac, rerr = c.Resolve(addr)
		return nil
	})
	return mac, rerr
}

func TestKernelARP(t *testing.T) {
	r := newKernelRig(t)
	vip := netip.MustParseAddr("198.51.100.10")

	// Strict ARP: the kernel itself does not answer for the VIP.
	if mac, err := r.resolve(t, vip, 300*time.Millisecond); err == nil {
		t.Fatalf("before announcing, %s answered for the vip: strict ARP is not in effect", mac)
	}

	a, err := New(Options{Uplinks: []string{uplink}, Dummy: "lo", Count: 2, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Announce(vip); err != nil {
		t.Fatal(err)
	}
	// Gratuitous ARP creates the peer's entry (arp_accept=1).
	r.waitNeighbour(t, vip)

	r.forget(t, vip)
	mac, err := r.resolve(t, vip, 2*time.Second)
	if err != nil {
		t.Fatalf("arp request for the announced vip: %v", err)
	}
	if !bytes.Equal(mac, r.mac) {
		t.Errorf("vip resolved to %s, want the uplink's %s", mac, r.mac)
	}
	// Counters follow the writes the peer may have seen first.
	waitStats(t, a, "two rounds of two announcements and a reply", func(s Stats) bool { return s.Announcements == 4 && s.Replies >= 1 })

	if err := a.Withdraw(vip); err != nil {
		t.Fatal(err)
	}
	if mac, err := r.resolve(t, vip, 300*time.Millisecond); err == nil {
		t.Errorf("after withdraw, %s answered for the vip", mac)
	}
}

func TestKernelNDP(t *testing.T) {
	r := newKernelRig(t)
	vip := netip.MustParseAddr("2001:db8:100::10")
	a, err := New(Options{Uplinks: []string{uplink}, Count: 2, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Announce(vip); err != nil {
		t.Fatal(err)
	}
	// The unsolicited advertisement creates the peer's entry
	// (accept_untracked_na=1 on a forwarding interface).
	r.waitNeighbour(t, vip)

	// A connection from the peer makes its kernel solicit the VIP; vipd
	// answers, and the VIP's own stack refuses the port. The burst's last
	// advertisement must be out first, lest it recreate the entry.
	waitStats(t, a, "the burst", func(s Stats) bool { return s.Announcements == 2 })
	time.Sleep(20 * time.Millisecond) // in flight
	r.forget(t, vip)
	r.peer.Do(t, func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(vip, 9).String(), 2*time.Second)
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial the vip from the peer: %v, want connection refused by the vip's host", err)
		}
		return nil
	})
	r.waitNeighbour(t, vip)
	waitStats(t, a, "a solicited advertisement", func(s Stats) bool { return s.Replies >= 1 })
}

// waitStats waits up to three seconds for a's counters to satisfy cond.
func waitStats(t *testing.T, a *Announcer, what string, cond func(Stats) bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond(a.Stats()) {
		if time.Now().After(deadline) {
			t.Fatalf("Stats = %+v, want %s", a.Stats(), what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKernelMissingUplink announces on an uplink that appears later.
func TestKernelMissingUplink(t *testing.T) {
	nstest.Need(t)
	a, err := New(Options{Uplinks: []string{"vipd-late0"}, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	vip := netip.MustParseAddr("198.51.100.20")
	err = a.Announce(vip)
	if err == nil {
		t.Fatal("Announce on a missing uplink succeeded")
	}
	t.Logf("missing uplink: %v", err)
	nstest.NewPeer(t, "vipd-late0", "vipd-late1")
	if err := a.Announce(vip); err != nil {
		t.Fatal(err)
	}
	if got := a.Announced(); len(got) != 1 {
		t.Errorf("Announced = %v", got)
	}
}

// TestKernelNDPHopLimit: a neighbour solicitation counts only when it
// arrives with hop limit 255 (RFC 4861 section 7.1.1), so that a host
// off the link, whose packets lost a hop on the way, gets no answer for
// a VIP. The one sent with 255 afterwards shows that the path works.
func TestKernelNDPHopLimit(t *testing.T) {
	r := newKernelRig(t)
	vip := netip.MustParseAddr("2001:db8:100::10")
	a, err := New(Options{Uplinks: []string{uplink}, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Announce(vip); err != nil {
		t.Fatal(err)
	}
	waitStats(t, a, "the announcement", func(s Stats) bool { return s.Announcements == 1 })
	l, err := netlink.LinkByName(uplink)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := nstest.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var ll netip.Addr
	for _, ad := range addrs {
		if ad.IP.IsLinkLocalUnicast() {
			ll, _ = netip.AddrFromSlice(ad.IP)
		}
	}
	if !ll.IsValid() {
		t.Fatalf("%s has no link-local address", uplink)
	}
	// The peer sends from its own link-local address, which must be
	// usable first (a fresh guest is quick to get here).
	r.peer.Do(t, func() error { return nstest.WaitLinkLocal(peerLink) })
	solicit := func(hops int) {
		t.Helper()
		r.peer.Do(t, func() error {
			ifi, err := net.InterfaceByName(peerLink)
			if err != nil {
				return err
			}
			c, err := net.ListenPacket("ip6:ipv6-icmp", "::")
			if err != nil {
				return err
			}
			defer c.Close()
			b, err := ndp.MarshalMessage(&ndp.NeighborSolicitation{
				TargetAddress: vip,
				Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}},
			})
			if err != nil {
				return err
			}
			pc := ipv6.NewPacketConn(c)
			_, err = pc.WriteTo(b, &ipv6.ControlMessage{HopLimit: hops, IfIndex: ifi.Index}, &net.IPAddr{IP: ll.AsSlice(), Zone: peerLink})
			return err
		})
	}
	before := a.Stats().Replies
	for _, hops := range []int{64, 254, 1} {
		solicit(hops)
	}
	time.Sleep(300 * time.Millisecond)
	if got := a.Stats().Replies - before; got != 0 {
		t.Errorf("%d answers to solicitations with hop limits 64, 254 and 1, want none", got)
	}
	solicit(255)
	waitStats(t, a, "an answer to the solicitation with hop limit 255", func(s Stats) bool { return s.Replies == before+1 })
}
