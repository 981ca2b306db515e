package arp

import (
	"bytes"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

var (
	vip4  = netip.MustParseAddr("198.51.100.10")
	vip4b = netip.MustParseAddr("198.51.100.11")
	vip6  = netip.MustParseAddr("2001:db8:100::10")
	peer4 = netip.MustParseAddr("192.0.2.2")
	peerM = net.HardwareAddr{0x02, 0xaa, 0, 0, 0, 1}
)

func newTest(t *testing.T, links *fakeLinks, opts Options) *Announcer {
	t.Helper()
	if opts.Uplinks == nil {
		opts.Uplinks = []string{"eth0", "eth1"}
	}
	opts.Links = links
	a, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func TestNewRejects(t *testing.T) {
	for _, opts := range []Options{
		{},
		{Uplinks: []string{"eth0", "vipd0"}, Dummy: "vipd0"},
		{Uplinks: []string{"eth0", "eth0"}},
		{Uplinks: []string{""}},
		{Uplinks: []string{"eth0"}, Count: -1},
	} {
		if _, err := New(opts); err == nil {
			t.Errorf("New(%+v) succeeded", opts)
		}
	}
}

func TestBurstIPv4(t *testing.T) {
	links := newFakeLinks("eth0", "eth1")
	const interval = 200 * time.Millisecond
	a := newTest(t, links, Options{Count: 3, Interval: interval})
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"eth0", "eth1"} {
		// The first announcement is out when Announce returns, and the
		// rest of the burst is not: it goes on in the background.
		if n := links.arp(t, name).count(); n != 2 {
			t.Errorf("%s: %d packets sent at once, want 2", name, n)
		}
	}
	if got := a.Announced(); !slices.Equal(got, []netip.Addr{vip4}) {
		t.Errorf("Announced = %v", got)
	}
	for _, name := range []string{"eth0", "eth1"} {
		c := links.arp(t, name)
		eventually(t, "burst on "+name, func() bool { return c.count() >= 6 })
		time.Sleep(2 * interval)
		sent := c.take()
		if len(sent) != 6 {
			t.Fatalf("%s: %d packets sent, want 6", name, len(sent))
		}
		mac := links.ifaces[name].HardwareAddr
		for i, s := range sent {
			p := s.p
			wantOp, wantTHA := arp.OperationRequest, net.HardwareAddr{0, 0, 0, 0, 0, 0}
			if i%2 == 1 {
				wantOp, wantTHA = arp.OperationReply, mac
			}
			if p.Operation != wantOp || !bytes.Equal(p.SenderHardwareAddr, mac) || p.SenderIP != vip4 ||
				p.TargetIP != vip4 || !bytes.Equal(p.TargetHardwareAddr, wantTHA) || !bytes.Equal(s.dst, ethernet.Broadcast) {
				t.Errorf("%s packet %d: %v %s/%s -> %s/%s to %s", name, i, p.Operation, p.SenderHardwareAddr, p.SenderIP, p.TargetHardwareAddr, p.TargetIP, s.dst)
			}
		}
		for i := 2; i < len(sent); i += 2 {
			if gap := sent[i].at.Sub(sent[i-2].at); gap < interval-5*time.Millisecond {
				t.Errorf("%s: announcements %d and %d %s apart, want %s", name, i/2-1, i/2, gap, interval)
			}
		}
	}
	if s := a.Stats(); s.Announcements != 12 || s.Errors != 0 {
		t.Errorf("Stats = %+v, want 12 announcements", s)
	}
	// Announcing again sends nothing: the VIP is announced everywhere.
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	if n := links.arp(t, "eth0").count(); n != 0 {
		t.Errorf("re-announcing sent %d packets", n)
	}
}

func TestBurstIPv6(t *testing.T) {
	links := newFakeLinks("eth0")
	a := newTest(t, links, Options{Uplinks: []string{"eth0"}, Count: 2, Interval: 10 * time.Millisecond})
	if err := a.Announce(vip6); err != nil {
		t.Fatal(err)
	}
	c := links.ndp(t, "eth0")
	snm, _ := ndp.SolicitedNodeMulticast(vip6)
	if !c.joined(snm) {
		t.Errorf("solicited-node group %s not joined", snm)
	}
	eventually(t, "second advertisement", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.sent) == 2 })
	for _, s := range c.take() {
		na, ok := s.m.(*ndp.NeighborAdvertisement)
		if !ok {
			t.Fatalf("sent %T", s.m)
		}
		if na.Solicited || !na.Override || na.Router || na.TargetAddress != vip6 || s.dst != netip.MustParseAddr("ff02::1") {
			t.Errorf("advertisement %+v to %s", na, s.dst)
		}
		if len(na.Options) != 1 || !bytes.Equal(na.Options[0].(*ndp.LinkLayerAddress).Addr, links.ifaces["eth0"].HardwareAddr) ||
			na.Options[0].(*ndp.LinkLayerAddress).Direction != ndp.Target {
			t.Errorf("advertisement options %v", na.Options)
		}
	}
	if err := a.Withdraw(vip6); err != nil {
		t.Fatal(err)
	}
	if c.joined(snm) {
		t.Errorf("group %s still joined after withdraw", snm)
	}
}

func TestRefreshAndWithdraw(t *testing.T) {
	links := newFakeLinks("eth0")
	a := newTest(t, links, Options{Uplinks: []string{"eth0"}, Count: 1, Interval: time.Millisecond, Refresh: 15 * time.Millisecond})
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	c := links.arp(t, "eth0")
	eventually(t, "refreshes", func() bool { return c.count() >= 6 })
	if err := a.Withdraw(vip4); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	c.take()
	time.Sleep(50 * time.Millisecond)
	if n := c.count(); n != 0 {
		t.Errorf("%d packets sent after withdraw", n)
	}
	if got := a.Announced(); len(got) != 0 {
		t.Errorf("Announced after withdraw = %v", got)
	}
	if err := a.Withdraw(vip4); err != nil {
		t.Errorf("withdrawing twice: %v", err)
	}
}

// request builds an ARP request from the peer for target.
func request(t *testing.T, sender netip.Addr, senderMAC net.HardwareAddr, target netip.Addr) *arp.Packet {
	t.Helper()
	p, err := arp.NewPacket(arp.OperationRequest, senderMAC, sender, net.HardwareAddr{0, 0, 0, 0, 0, 0}, target)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAnswerARP(t *testing.T) {
	links := newFakeLinks("eth0")
	a := newTest(t, links, Options{Uplinks: []string{"eth0"}, Count: 0})
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	c := links.arp(t, "eth0")
	mac := links.ifaces["eth0"].HardwareAddr
	if n := c.count(); n != 0 {
		t.Fatalf("Count 0 sent %d packets", n)
	}

	c.in <- inARP{request(t, peer4, peerM, vip4), ethernet.Broadcast}
	eventually(t, "reply", func() bool { return c.count() == 1 })
	s := c.take()[0]
	if s.p.Operation != arp.OperationReply || !bytes.Equal(s.p.SenderHardwareAddr, mac) || s.p.SenderIP != vip4 ||
		!bytes.Equal(s.p.TargetHardwareAddr, peerM) || s.p.TargetIP != peer4 || !bytes.Equal(s.dst, peerM) {
		t.Errorf("reply %v %s/%s -> %s/%s to %s", s.p.Operation, s.p.SenderHardwareAddr, s.p.SenderIP, s.p.TargetHardwareAddr, s.p.TargetIP, s.dst)
	}

	// Unicast to us is answered too (a neighbour confirming its entry).
	c.in <- inARP{request(t, peer4, peerM, vip4), mac}
	eventually(t, "reply to unicast", func() bool { return c.count() == 1 })
	c.take()

	// Not answered: other addresses, other destinations, our own
	// packets, gratuitous announcements, replies.
	own := request(t, vip4, mac, vip4)
	reply := request(t, peer4, peerM, vip4)
	reply.Operation = arp.OperationReply
	for _, in := range []inARP{
		{request(t, peer4, peerM, vip4b), ethernet.Broadcast},
		{request(t, peer4, peerM, vip4), net.HardwareAddr{0x02, 0xbb, 0, 0, 0, 9}},
		{request(t, peer4, mac, vip4), ethernet.Broadcast},
		{own, ethernet.Broadcast},
		{request(t, vip4, peerM, vip4), ethernet.Broadcast},
		{reply, ethernet.Broadcast},
	} {
		c.in <- in
	}
	// A request answered after them proves they were all processed.
	c.in <- inARP{request(t, peer4, peerM, vip4), ethernet.Broadcast}
	eventually(t, "final reply", func() bool { return c.count() >= 1 })
	time.Sleep(10 * time.Millisecond)
	if sent := c.take(); len(sent) != 1 || sent[0].p.TargetIP != peer4 {
		t.Errorf("answered %d packets that must be ignored", len(sent)-1)
	}

	if err := a.Withdraw(vip4); err != nil {
		t.Fatal(err)
	}
	c.in <- inARP{request(t, peer4, peerM, vip4), ethernet.Broadcast}
	time.Sleep(20 * time.Millisecond)
	if n := c.count(); n != 0 {
		t.Errorf("answered for a withdrawn vip")
	}
	if s := a.Stats(); s.Replies != 3 {
		t.Errorf("Stats = %+v, want 3 replies", s)
	}
}

func TestAnswerNDP(t *testing.T) {
	links := newFakeLinks("eth0")
	a := newTest(t, links, Options{Uplinks: []string{"eth0"}})
	if err := a.Announce(vip6); err != nil {
		t.Fatal(err)
	}
	c := links.ndp(t, "eth0")
	mac := links.ifaces["eth0"].HardwareAddr
	peer := netip.MustParseAddr("fe80::aa:1")
	ns := func(target netip.Addr) *ndp.NeighborSolicitation {
		return &ndp.NeighborSolicitation{TargetAddress: target, Options: []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: peerM}}}
	}
	c.in <- inNDP{ns(netip.MustParseAddr("2001:db8:100::99")), peer}
	c.in <- inNDP{&ndp.RouterSolicitation{}, peer}
	c.in <- inNDP{ns(vip6), peer}
	c.in <- inNDP{ns(vip6), netip.IPv6Unspecified()}
	eventually(t, "two advertisements", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.sent) == 2 })
	sent := c.take()
	for i, want := range []struct {
		solicited bool
		dst       netip.Addr
	}{{true, peer}, {false, netip.MustParseAddr("ff02::1")}} {
		na := sent[i].m.(*ndp.NeighborAdvertisement)
		if na.Solicited != want.solicited || !na.Override || na.TargetAddress != vip6 || sent[i].dst != want.dst ||
			!bytes.Equal(na.Options[0].(*ndp.LinkLayerAddress).Addr, mac) {
			t.Errorf("advertisement %d: %+v to %s", i, na, sent[i].dst)
		}
	}
}

func TestMissingAndDownUplinks(t *testing.T) {
	links := newFakeLinks("eth0", "eth1")
	links.remove("eth1")
	a := newTest(t, links, Options{Count: 2, Interval: 5 * time.Millisecond})
	err := a.Announce(vip4)
	if err == nil || !strings.Contains(err.Error(), "uplink eth1") || !strings.Contains(err.Error(), "198.51.100.10") {
		t.Fatalf("Announce with a missing uplink: %v", err)
	}
	if got := a.Announced(); len(got) != 0 {
		t.Errorf("Announced = %v; a vip missing an uplink is not announced", got)
	}
	eth0 := links.arp(t, "eth0")
	eventually(t, "burst on eth0", func() bool { return eth0.count() == 4 })
	eth0.take()

	// The uplink appears, down at first.
	links.add("eth1")
	links.setUp("eth1", false)
	if err := a.Announce(vip4); err == nil || !strings.Contains(err.Error(), "uplink eth1 is down") {
		t.Fatalf("Announce with a down uplink: %v", err)
	}
	links.setUp("eth1", true)
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	if got := a.Announced(); !slices.Equal(got, []netip.Addr{vip4}) {
		t.Errorf("Announced = %v", got)
	}
	eth1 := links.arp(t, "eth1")
	eventually(t, "burst on eth1", func() bool { return eth1.count() == 4 })
	time.Sleep(20 * time.Millisecond)
	if n := eth0.count(); n != 0 {
		t.Errorf("recovery re-sent %d packets on the healthy uplink", n)
	}
}

func TestRefreshRetriesUplinks(t *testing.T) {
	links := newFakeLinks("eth0")
	a := newTest(t, links, Options{Uplinks: []string{"eth0", "eth1"}, Count: 1, Refresh: 10 * time.Millisecond})
	if err := a.Announce(vip4); err == nil {
		t.Fatal("Announce with a missing uplink succeeded")
	}
	links.add("eth1")
	eventually(t, "refresh to open eth1", func() bool { return len(a.Announced()) == 1 })
	eventually(t, "announcement on eth1", func() bool { return links.arp(t, "eth1").count() >= 2 })
}

func TestFailedConnectionReopens(t *testing.T) {
	links := newFakeLinks("eth0")
	a := newTest(t, links, Options{Uplinks: []string{"eth0"}, Count: 1})
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	old := links.arp(t, "eth0")
	old.fail <- net.ErrClosed // the interface went away
	eventually(t, "link dropped", func() bool { return len(a.Announced()) == 0 })
	if !old.isClosed() {
		t.Error("failed connection not closed")
	}
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	if c := links.arp(t, "eth0"); c == old || c.count() != 2 {
		t.Errorf("reopened connection: same=%t, %d packets", c == old, c.count())
	}
}

func TestReplacedInterfaceReopens(t *testing.T) {
	links := newFakeLinks("eth0")
	a := newTest(t, links, Options{Uplinks: []string{"eth0"}, Count: 1})
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	old := links.arp(t, "eth0")
	links.remove("eth0")
	links.add("eth0") // a new index
	if err := a.Withdraw(vip4); err != nil {
		t.Fatal(err)
	}
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	if !old.isClosed() || links.arp(t, "eth0") == old {
		t.Error("connection on the replaced interface kept")
	}
}

func TestClose(t *testing.T) {
	links := newFakeLinks("eth0")
	a := newTest(t, links, Options{Uplinks: []string{"eth0"}, Count: 100, Interval: time.Millisecond, Refresh: time.Millisecond})
	for _, v := range []netip.Addr{vip4, vip6} {
		if err := a.Announce(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c := links.arp(t, "eth0")
	if !c.isClosed() {
		t.Error("connection open after Close")
	}
	n := c.count()
	time.Sleep(10 * time.Millisecond)
	if c.count() != n {
		t.Error("packets sent after Close")
	}
	if err := a.Announce(vip4); err == nil {
		t.Error("Announce after Close succeeded")
	}
	if got := a.Announced(); len(got) != 0 {
		t.Errorf("Announced after Close = %v", got)
	}
}

func TestMappedAddress(t *testing.T) {
	links := newFakeLinks("eth0")
	a := newTest(t, links, Options{Uplinks: []string{"eth0"}, Count: 1})
	if err := a.Announce(netip.MustParseAddr("::ffff:198.51.100.10")); err != nil {
		t.Fatal(err)
	}
	if got := a.Announced(); !slices.Equal(got, []netip.Addr{vip4}) {
		t.Errorf("Announced = %v, want %s", got, vip4)
	}
	if links.arp(t, "eth0").count() != 2 {
		t.Error("mapped address not announced by ARP")
	}
}

// TestReady checks that Ready opens the uplinks' connections without
// answering or announcing, and that Announce then uses them.
func TestReady(t *testing.T) {
	links := newFakeLinks("eth0", "eth1")
	a := newTest(t, links, Options{Count: 1})
	if err := a.Ready(vip4); err != nil {
		t.Fatal(err)
	}
	if links.opened != 2 {
		t.Fatalf("opened %d connections, want 2", links.opened)
	}
	if got := a.Announced(); len(got) != 0 {
		t.Errorf("announced %v", got)
	}
	c := links.arp(t, "eth0")
	c.in <- inARP{request(t, peer4, peerM, vip4), ethernet.Broadcast}
	time.Sleep(20 * time.Millisecond)
	if n := c.count(); n != 0 {
		t.Fatalf("a ready address was answered or announced: %d packets", n)
	}
	if err := a.Ready(vip4b); err != nil || links.opened != 2 {
		t.Errorf("second address: %v, %d opened", err, links.opened)
	}
	if err := a.Announce(vip4); err != nil {
		t.Fatal(err)
	}
	if links.opened != 2 {
		t.Errorf("Announce opened again: %d", links.opened)
	}
	if n := c.count(); n == 0 {
		t.Errorf("no announcement on eth0")
	}
	links.remove("eth1")
	if err := a.Ready(vip6); err == nil || !strings.Contains(err.Error(), "eth1") {
		t.Errorf("missing uplink: %v", err)
	}
}

// TestAnnounceAll announces several addresses with one lookup of each
// uplink, the first packets of their announcements back to back in the
// order given, on every uplink, before any second packet (the gratuitous
// ARP replies); an address it cannot take (invalid) or an uplink it
// cannot use (missing) is named in its error, and the rest is announced
// all the same.
func TestAnnounceAll(t *testing.T) {
	links := newFakeLinks("eth0", "eth1")
	a := newTest(t, links, Options{Count: 1})
	if err := a.AnnounceAll([]netip.Addr{vip4b, vip4, vip6}); err != nil {
		t.Fatal(err)
	}
	if links.lookups != 2 {
		t.Errorf("%d interface lookups for 3 addresses on 2 uplinks, want 2", links.lookups)
	}
	if got := a.Announced(); !slices.Equal(got, []netip.Addr{vip4, vip4b, vip6}) {
		t.Errorf("Announced = %v", got)
	}
	want := []string{
		"eth0 request " + vip4b.String(), "eth1 request " + vip4b.String(),
		"eth0 request " + vip4.String(), "eth1 request " + vip4.String(),
		"eth0 advertisement " + vip6.String(), "eth1 advertisement " + vip6.String(),
		"eth0 reply " + vip4b.String(), "eth1 reply " + vip4b.String(),
		"eth0 reply " + vip4.String(), "eth1 reply " + vip4.String(),
	}
	if got := links.wire.take(); !slices.Equal(got, want) {
		t.Errorf("sent, in order:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, name := range []string{"eth0", "eth1"} {
		links.arp(t, name).take()
		links.ndp(t, name).take()
	}
	links.remove("eth1")
	vip4c := netip.MustParseAddr("198.51.100.12")
	err := a.AnnounceAll([]netip.Addr{{}, vip4c})
	if err == nil || !strings.Contains(err.Error(), "invalid address") || !strings.Contains(err.Error(), "announce "+vip4c.String()+": uplink eth1") {
		t.Errorf("AnnounceAll with an invalid address and a missing uplink: %v", err)
	}
	if n := len(links.arp(t, "eth0").take()); n != 2 {
		t.Errorf("eth0: %d packets for %s, want 2", n, vip4c)
	}
	a.Close()
	if err := a.AnnounceAll([]netip.Addr{vip4}); err == nil {
		t.Error("AnnounceAll after Close succeeded")
	}
}
