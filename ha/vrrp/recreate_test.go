package vrrp

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// vlan is a macvlan interface on either end of a link: vv<i> in the
// test's namespace (10.29.<i>.1/24, fd29:0:0:<i>::1/64) and vv in the
// peer's (.2, ::2), each with a fixed MAC address, as a VLAN has its
// parent's. It stands for the VLAN or bond that ifdown/ifup deletes and
// creates again (the host has no 8021q module).
type vlan struct {
	l    *link
	name string
}

func newVLAN(t *testing.T, l *link) *vlan {
	t.Helper()
	v := &vlan{l: l, name: fmt.Sprintf("vv%d", l.i)}
	if err := v.add(l.name, v.name, 1); err != nil {
		t.Fatal(err)
	}
	l.peer.Do(t, func() error { return v.add("vp", "vv", 2) })
	return v
}

// add creates the macvlan interface name on parent, up, with the
// addresses of host.
func (v *vlan) add(parent, name string, host int) error {
	p, err := netlink.LinkByName(parent)
	if err != nil {
		return err
	}
	mac := net.HardwareAddr{0x02, 0x29, 0, 0, byte(v.l.i), byte(host)}
	ml := &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: name, ParentIndex: p.Attrs().Index, HardwareAddr: mac}, Mode: netlink.MACVLAN_MODE_BRIDGE}
	if err := netlink.LinkAdd(ml); err != nil {
		return fmt.Errorf("add macvlan %s on %s: %w", name, parent, err)
	}
	for _, v6 := range []bool{false, true} {
		if err := nstest.AddAddr(name, v.l.prefix(v.addr(v6, host))); err != nil {
			return err
		}
	}
	return nstest.LinkUp(name)
}

// del deletes the test's end of the VLAN.
func (v *vlan) del(t *testing.T) {
	t.Helper()
	l, err := netlink.LinkByName(v.name)
	if err == nil {
		err = netlink.LinkDel(l)
	}
	if err != nil {
		t.Fatalf("delete %s: %v", v.name, err)
	}
}

func (v *vlan) addr(v6 bool, host int) netip.Addr {
	if v6 {
		return netip.MustParseAddr(fmt.Sprintf("fd29:0:0:%d::%d", v.l.i, host))
	}
	return netip.MustParseAddr(fmt.Sprintf("10.29.%d.%d", v.l.i, host))
}

// TestNetnsInterfaceRecreated is the reproduction: the router's
// socket was bound to the interface's index once, so that after the
// interface was deleted and created again (a VLAN or bond re-made by
// ifdown/ifup) a master stayed master while every advertisement failed,
// and never heard a peer of higher priority. Now the router stands back
// (Init: the node releases its VIPs) while the interface is missing,
// opens its socket again on the new interface, and takes part in the
// election again: it hears the peer's advertisements and is its backup.
func TestNetnsInterfaceRecreated(t *testing.T) {
	nstest.Need(t)
	eachMode(t, func(t *testing.T, l *link, f family, unicast bool) {
		v := newVLAN(t, l)
		base := Options{VRID: 19, Interval: iv, Preempt: true, Addrs: f.vips}
		a, b := base, base
		a.Interface, a.Priority = v.name, 100
		b.Interface, b.Priority = "vv", 200
		if unicast {
			a.Source, a.Peers = v.addr(f.v6, 1), []netip.Addr{v.addr(f.v6, 2)}
			b.Source, b.Peers = v.addr(f.v6, 2), []netip.Addr{v.addr(f.v6, 1)}
		}
		na := startLive(t, nil, a)
		na.await(Backup, time.Second)
		na.await(Master, 3*time.Second)

		// ifdown: the interface is gone. The router stands back
		// within a second or two, and stays out while it is gone.
		deleted := time.Now()
		v.del(t)
		e := na.awaitSince(deleted, Init, 2*time.Second+slack)
		t.Logf("stood back %v after the interface was deleted: %s", e.at.Sub(deleted), e.tr.Reason)
		time.Sleep(time.Second)
		if st := na.r.Status(); st.Role == Master {
			t.Fatalf("master while its interface is gone: %+v", st)
		}

		// ifup: the interface is back, with a new index; a peer of
		// higher priority is master on it.
		if err := v.add(l.name, v.name, 1); err != nil {
			t.Fatal(err)
		}
		nb := startLive(t, l.peer, b)
		nb.await(Backup, time.Second)
		nb.await(Master, 3*time.Second)
		na.awaitSince(deleted, Backup, 3*time.Second)
		na.awaitMaster(nb.r.Source(), 200)
		// Its advertisements go out again: b stays master.
		time.Sleep(time.Second)
		if st := nb.r.Status(); st.Role != Master || st.Received != 0 && st.MasterPriority != 200 {
			t.Errorf("b: %+v", st)
		}
		if st := na.r.Status(); st.Role != Backup || st.Master != nb.r.Source() {
			t.Errorf("a: %+v", st)
		}
	})
}
