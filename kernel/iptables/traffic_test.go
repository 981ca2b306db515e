package iptables

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/lb/lbtest/nstest"

	"github.com/vipd/vipd/lb"
)

// TestFilterTraffic sends real packets from a peer namespace to VIPs in
// the test's namespace: with the filter chain, a served port accepts
// connections, an unserved port of a VIP drops them silently, ICMP still
// passes, and addresses that are not VIPs are left alone.
func TestFilterTraffic(t *testing.T) {
	nstest.Need(t)
	p := nstest.NewPeer(t, "vipd-up0", "vipd-peer0")
	for _, s := range []string{"192.0.2.1/24", "2001:db8::1/64"} {
		if err := nstest.AddAddr("vipd-up0", s); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"198.51.100.10/32", "2001:db8:100::10/128"} {
		nstest.AddAddrFor(t, "lo", s)
	}
	p.Do(t, func() error {
		for _, s := range []string{"192.0.2.2/24", "2001:db8::2/64"} {
			if err := nstest.AddAddr("vipd-peer0", s); err != nil {
				return err
			}
		}
		if err := addRoute("198.51.100.0/24", "192.0.2.1"); err != nil {
			return err
		}
		return addRoute("2001:db8:100::/64", "2001:db8::1")
	})

	vips := []netip.Addr{netip.MustParseAddr("198.51.100.10"), netip.MustParseAddr("2001:db8:100::10")}
	const served, unserved = 8080, 8081
	var targets []netip.AddrPort
	for _, a := range append(vips, netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")) {
		for _, port := range []uint16{served, unserved} {
			ap := netip.AddrPortFrom(a, port)
			acceptAll(t, ap)
			targets = append(targets, ap)
		}
	}
	isVIP := func(a netip.Addr) bool { return a == vips[0] || a == vips[1] }

	// connect dials ap from the peer with a timeout: nil when it
	// connects, a timeout error when the SYN is dropped. Expected drops
	// use a short timeout, expected connections a generous one.
	connect := func(ap netip.AddrPort, timeout time.Duration) error { return dialFrom(t, p, ap, timeout) }
	const connects, drops = 2 * time.Second, 300 * time.Millisecond
	pings := func(a netip.Addr) bool {
		var ok bool
		p.Do(t, func() error {
			var err error
			ok, err = ping(a, time.Second)
			return err
		})
		return ok
	}

	// Before filtering everything connects, once the peer has resolved
	// its neighbours.
	for _, ap := range targets {
		err := connect(ap, connects)
		for i := 0; err != nil && i < 3; i++ {
			err = connect(ap, connects)
		}
		if err != nil {
			t.Fatalf("before filtering, connect %s: %v", ap, err)
		}
	}

	for _, b := range backends(t) {
		t.Run(b, func(t *testing.T) {
			tb := newTables(t, Options{Backend: b, NoIPVSMatch: true})
			if err := tb.SyncChains(testPolicy); err != nil {
				t.Fatal(err)
			}
			for _, a := range vips {
				for _, e := range []lb.SetEntry{{Set: lb.SetVIPs, Addr: a}, {Set: lb.SetServed, Addr: a, Proto: lb.TCP, Port: served}} {
					if err := tb.AddEntry(e); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, ap := range targets {
				drop := isVIP(ap.Addr()) && ap.Port() == unserved
				timeout := connects
				if drop {
					timeout = drops
				}
				err := connect(ap, timeout)
				switch {
				case drop:
					if !dropped(err) {
						t.Errorf("connect %s (vip, unserved port): %v, want dropped", ap, err)
					}
				case err != nil:
					t.Errorf("connect %s: %v, want connected", ap, err)
				}
			}
			for _, a := range vips {
				if !pings(a) {
					t.Errorf("ping %s: no reply; ICMP must pass the filter", a)
				}
			}

			// Entries take effect one at a time, without touching chains.
			gone := lb.SetEntry{Set: lb.SetServed, Addr: vips[0], Proto: lb.TCP, Port: served}
			if err := tb.DelEntry(gone); err != nil {
				t.Fatal(err)
			}
			if err := connect(netip.AddrPortFrom(vips[0], served), drops); !dropped(err) {
				t.Errorf("after deleting %s: connect: %v, want dropped", gone, err)
			}
			if err := tb.AddEntry(gone); err != nil {
				t.Fatal(err)
			}
			if err := connect(netip.AddrPortFrom(vips[0], served), connects); err != nil {
				t.Errorf("after re-adding %s: connect: %v", gone, err)
			}

			// Without the filter every port answers again.
			off := testPolicy
			off.FilterVIPs = false
			if err := tb.SyncChains(off); err != nil {
				t.Fatal(err)
			}
			for _, ap := range targets {
				if err := connect(ap, connects); err != nil {
					t.Errorf("filter off: connect %s: %v", ap, err)
				}
			}
		})
	}
}

// acceptAll listens on ap and closes every connection it accepts, until
// the test ends.
func acceptAll(t *testing.T, ap netip.AddrPort) {
	t.Helper()
	l, err := net.Listen("tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// dialFrom connects to ap from the peer p within timeout: nil when it
// connects, a timeout error when the SYN is dropped.
func dialFrom(t *testing.T, p *nstest.Peer, ap netip.AddrPort, timeout time.Duration) error {
	var err error
	p.Do(t, func() error {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", ap.String(), timeout); err == nil {
			c.Close()
		}
		return nil
	})
	return err
}

// dropped says whether err is that of a connection whose SYN was
// dropped: a timeout, not a refusal.
func dropped(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, syscall.ECONNREFUSED)
}
