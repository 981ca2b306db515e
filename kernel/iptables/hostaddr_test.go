package iptables

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/kernel/link"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// hostAddrs is the fake kernel's VIPs with the host's real addresses.
type hostAddrs struct {
	fake lb.VIPs
	real *link.Dummy
}

func (h hostAddrs) VIPs() ([]netip.Addr, error)                 { return h.fake.VIPs() }
func (h hostAddrs) Bind(a netip.Addr) error                     { return h.fake.Bind(a) }
func (h hostAddrs) Unbind(a netip.Addr) error                   { return h.fake.Unbind(a) }
func (h hostAddrs) HostAddrs() (map[string][]netip.Addr, error) { return h.real.HostAddrs() }

// TestFilterSparesHostAddresses runs the reconciler with the real
// iptables rules and the host's real addresses, on a configuration whose
// VIP is the uplink's own address: the filter still drops unserved ports
// of a true VIP, and never those of the host's address (an SSH port, say).
func TestFilterSparesHostAddresses(t *testing.T) {
	nstest.Need(t)
	p := nstest.NewPeer(t, "vipd-up1", "vipd-peer1")
	// vipdvip0 stands in for vipd's dummy interface, which this kernel
	// may not have: its addresses are VIPs, not host addresses.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vipdvip0"}, PeerName: "vipdvip1"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName("vipdvip0"); err == nil {
			netlink.LinkDel(l)
		}
	})
	for _, l := range []string{"vipdvip0", "vipdvip1"} {
		if err := nstest.LinkUp(l); err != nil {
			t.Fatal(err)
		}
	}
	for link, s := range map[string]string{"vipd-up1": "192.0.2.1/24", "vipdvip0": "198.51.100.10/32"} {
		if err := nstest.AddAddr(link, s); err != nil {
			t.Fatal(err)
		}
	}
	p.Do(t, func() error {
		if err := nstest.AddAddr("vipd-peer1", "192.0.2.2/24"); err != nil {
			return err
		}
		return addRoute("198.51.100.0/24", "192.0.2.1")
	})
	uplink, vip := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.10")
	const served, ssh = 8080, 2222
	for _, a := range []netip.Addr{uplink, vip} {
		for _, port := range []uint16{served, ssh} {
			acceptAll(t, netip.AddrPortFrom(a, port))
		}
	}
	connect := func(ap netip.AddrPort, timeout time.Duration) error { return dialFrom(t, p, ap, timeout) }
	for _, ap := range []netip.AddrPort{netip.AddrPortFrom(uplink, ssh), netip.AddrPortFrom(vip, ssh)} {
		err := connect(ap, 2*time.Second)
		for i := 0; err != nil && i < 3; i++ {
			err = connect(ap, 2*time.Second)
		}
		if err != nil {
			t.Fatalf("before vipd, connect %s: %v", ap, err)
		}
	}

	real, err := link.New(link.Options{Interface: "vipdvip0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { real.Close() })
	svc := func(name string, addr netip.Addr) lb.VirtualService {
		return lb.VirtualService{
			Name:     name,
			VIP:      addr,
			Service:  lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: addr, Port: served}, Scheduler: "rr"},
			Backends: []lb.Destination{{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Weight: 1}},
		}
	}
	spec := &lb.Spec{Rules: testPolicy, Services: []lb.VirtualService{svc("vip", vip), svc("uplink", uplink)}}
	for _, b := range backends(t) {
		t.Run(b, func(t *testing.T) {
			fake := lbtest.New()
			k := fake.Interface()
			k.VIPs = hostAddrs{fake: fake, real: real}
			k.Rules = newTables(t, Options{Backend: b, NoIPVSMatch: true})
			r := lb.NewReconciler(lb.Options{Kernel: k, Dummy: "vipdvip0"})
			res, err := r.Reconcile(context.Background(), spec)
			if err != nil || len(res.Failed) > 0 {
				t.Fatalf("reconcile: %v %v", err, res.Failed)
			}
			if err := connect(netip.AddrPortFrom(vip, ssh), 300*time.Millisecond); !dropped(err) {
				t.Errorf("connect to an unserved port of the VIP: %v, want dropped", err)
			}
			if err := connect(netip.AddrPortFrom(uplink, ssh), 2*time.Second); err != nil {
				t.Errorf("connect to the uplink's ssh port, whose address a service names as its VIP: %v, want connected", err)
			}
			found, err := r.HostVIPs(spec.Services)
			if err != nil || len(found) != 1 || found[0] != (lb.HostVIP{Service: "uplink", VIP: uplink, Interface: "vipd-up1"}) {
				t.Errorf("HostVIPs = %v %v, want the uplink service on vipd-up1", found, err)
			}
			// Empty: the next backend starts from no rules.
			if _, err := r.Reconcile(context.Background(), &lb.Spec{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
