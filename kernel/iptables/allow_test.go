package iptables

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// TestAllowTraffic sends real connections from two client namespaces, an
// admitted and a refused one, to a listener on a VIP, IPv4 and IPv6: a
// restricted port admits only the sources its allowed entries list,
// another port of the VIP stays open to both, and changing the entries
// (adding the new source before deleting the old one) keeps the old
// source's established connection while its new ones are refused. The
// rule works with and without the VIP filter.
func TestAllowTraffic(t *testing.T) {
	nstest.Need(t)
	a := nstest.NewPeer(t, "vipd-upa", "vipd-pa")
	b := nstest.NewPeer(t, "vipd-upb", "vipd-pb")
	for _, s := range []string{"192.0.2.1/24", "2001:db8:a::1/64"} {
		if err := nstest.AddAddr("vipd-upa", s); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"203.0.113.1/24", "2001:db8:b::1/64"} {
		if err := nstest.AddAddr("vipd-upb", s); err != nil {
			t.Fatal(err)
		}
	}
	// VIPs of their own, removed at the end: the namespace's other
	// tests put theirs on lo too.
	for _, s := range []string{"198.51.100.30/32", "2001:db8:100::30/128"} {
		nstest.AddAddrFor(t, "lo", s)
	}
	peerSetup := func(link, v4, gw4, v6, gw6 string) func() error {
		return func() error {
			for _, s := range []string{v4, v6} {
				if err := nstest.AddAddr(link, s); err != nil {
					return err
				}
			}
			if err := addRoute("198.51.100.0/24", gw4); err != nil {
				return err
			}
			return addRoute("2001:db8:100::/64", gw6)
		}
	}
	a.Do(t, peerSetup("vipd-pa", "192.0.2.2/24", "192.0.2.1", "2001:db8:a::2/64", "2001:db8:a::1"))
	b.Do(t, peerSetup("vipd-pb", "203.0.113.2/24", "203.0.113.1", "2001:db8:b::2/64", "2001:db8:b::1"))
	nets := map[*nstest.Peer][2]netip.Prefix{
		a: {netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8:a::/64")},
		b: {netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:b::/64")},
	}
	vips := []netip.Addr{netip.MustParseAddr("198.51.100.30"), netip.MustParseAddr("2001:db8:100::30")}
	const restricted, open = 8080, 8082
	for _, v := range vips {
		echoAll(t, netip.AddrPortFrom(v, restricted))
		acceptAll(t, netip.AddrPortFrom(v, open))
	}
	const connects, drops = 2 * time.Second, 300 * time.Millisecond
	// Neighbours resolve before anything is filtered.
	for _, p := range []*nstest.Peer{a, b} {
		for _, v := range vips {
			ap := netip.AddrPortFrom(v, open)
			err := dialFrom(t, p, ap, connects)
			for i := 0; err != nil && i < 3; i++ {
				err = dialFrom(t, p, ap, connects)
			}
			if err != nil {
				t.Fatalf("before filtering, connect %s: %v", ap, err)
			}
		}
	}
	entry := func(set lb.SetKind, vip netip.Addr, n netip.Prefix) lb.SetEntry {
		return lb.SetEntry{Set: set, Addr: vip, Proto: lb.TCP, Port: restricted, Net: n}
	}
	fam := func(v netip.Addr) int {
		if v.Is4() {
			return 0
		}
		return 1
	}
	expect := func(t *testing.T, stage string, p *nstest.Peer, name string, admit bool) {
		t.Helper()
		for _, v := range vips {
			ap := netip.AddrPortFrom(v, restricted)
			if admit {
				if err := dialFrom(t, p, ap, connects); err != nil {
					t.Errorf("%s: %s connects to %s: %v, want admitted", stage, name, ap, err)
				}
			} else if err := dialFrom(t, p, ap, drops); !dropped(err) {
				t.Errorf("%s: %s connects to %s: %v, want dropped", stage, name, ap, err)
			}
			if err := dialFrom(t, p, netip.AddrPortFrom(v, open), connects); err != nil {
				t.Errorf("%s: %s connects to the open port of %s: %v", stage, name, v, err)
			}
		}
	}

	for _, bk := range backends(t) {
		for _, filter := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/filter-vips=%t", bk, filter), func(t *testing.T) {
				tb := newTables(t, Options{Backend: bk, NoIPVSMatch: true})
				p := testPolicy
				p.FilterVIPs = filter
				if err := tb.SyncChains(p); err != nil {
					t.Fatal(err)
				}
				add := func(es ...lb.SetEntry) {
					t.Helper()
					for _, e := range es {
						if err := tb.AddEntry(e); err != nil {
							t.Fatal(err)
						}
					}
				}
				del := func(es ...lb.SetEntry) {
					t.Helper()
					for _, e := range es {
						if err := tb.DelEntry(e); err != nil {
							t.Fatal(err)
						}
					}
				}
				for _, v := range vips {
					add(lb.SetEntry{Set: lb.SetVIPs, Addr: v},
						lb.SetEntry{Set: lb.SetServed, Addr: v, Proto: lb.TCP, Port: restricted},
						lb.SetEntry{Set: lb.SetServed, Addr: v, Proto: lb.TCP, Port: open})
				}
				expect(t, "unrestricted", a, "a", true)
				expect(t, "unrestricted", b, "b", true)

				// Restrict to a's networks: sources first, then the
				// restriction.
				for _, v := range vips {
					add(entry(lb.SetAllowed, v, nets[a][fam(v)]), entry(lb.SetRestricted, v, netip.Prefix{}))
				}
				expect(t, "allow a", a, "a", true)
				expect(t, "allow a", b, "b", false)

				// a holds connections open across the change to b.
				var held []*bufio.ReadWriter
				for _, v := range vips {
					rw := dialHeld(t, a, netip.AddrPortFrom(v, restricted))
					echo(t, rw, "before")
					held = append(held, rw)
				}
				for _, v := range vips {
					add(entry(lb.SetAllowed, v, nets[b][fam(v)]))
					del(entry(lb.SetAllowed, v, nets[a][fam(v)]))
				}
				expect(t, "allow b", a, "a", false)
				expect(t, "allow b", b, "b", true)
				for _, rw := range held {
					echo(t, rw, "after the change")
				}

				// Lifting the restriction: the restriction first.
				for _, v := range vips {
					del(entry(lb.SetRestricted, v, netip.Prefix{}), entry(lb.SetAllowed, v, nets[b][fam(v)]))
				}
				expect(t, "lifted", a, "a", true)
				expect(t, "lifted", b, "b", true)
			})
		}
	}
}

// echoAll listens on ap and echoes each line of every connection back,
// until the test ends.
func echoAll(t *testing.T, ap netip.AddrPort) {
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
			go func() {
				defer c.Close()
				rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
				for {
					line, err := rw.ReadString('\n')
					if err != nil {
						return
					}
					rw.WriteString(line)
					if rw.Flush() != nil {
						return
					}
				}
			}()
		}
	}()
}

// dialHeld opens a connection from p to ap that stays open until the
// test ends.
func dialHeld(t *testing.T, p *nstest.Peer, ap netip.AddrPort) *bufio.ReadWriter {
	t.Helper()
	var c net.Conn
	p.Do(t, func() error {
		var err error
		c, err = net.DialTimeout("tcp", ap.String(), 2*time.Second)
		return err
	})
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
}

// echo sends a line on rw and expects it back.
func echo(t *testing.T, rw *bufio.ReadWriter, msg string) {
	t.Helper()
	if _, err := rw.WriteString(msg + "\n"); err != nil {
		t.Fatalf("held connection, %s: %v", msg, err)
	}
	if err := rw.Flush(); err != nil {
		t.Fatalf("held connection, %s: %v", msg, err)
	}
	got, err := rw.ReadString('\n')
	if err != nil || got != msg+"\n" {
		t.Errorf("held connection, %s: read %q, %v", msg, got, err)
	}
}
