package vrrp

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// ifaceLink finds a router's interface and opens its socket there again,
// in the network namespace the router was made in: an interface deleted
// and created again (a VLAN or bond re-made by ifdown/ifup) has a new
// index, and a socket bound to the old one neither sends nor receives.
type ifaceLink struct {
	name string
	v6   bool
	// source says the primary address is the interface's own (not
	// configured): it is looked up again on each open.
	source bool
	ns     netns.NsHandle
	h      *netlink.Handle
}

// newIfaceLink returns the interface's link in the calling thread's
// network namespace.
func newIfaceLink(name string, v6, source bool) (*ifaceLink, error) {
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	// Only rtnetlink: without families the handle opens one socket per
	// family netlink knows (XFRM, netfilter…), which a kernel without
	// them refuses.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &ifaceLink{name: name, v6: v6, source: source, ns: ns, h: h}, nil
}

// state returns the interface's index, whether it is up (set up), and
// whether it runs: up with a carrier (its operational state up, or
// unknown for an interface without one). An interface just set up drops
// what is sent on it until the kernel has attached its queue, which it
// does as the operational state turns up.
func (l *ifaceLink) state() (index int, up, running bool, err error) {
	link, err := l.h.LinkByName(l.name)
	if err != nil {
		return 0, false, false, fmt.Errorf("interface %s: %w", l.name, err)
	}
	a := link.Attrs()
	up = a.Flags&net.FlagUp != 0
	running = up && (a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown)
	return a.Index, up, running, nil
}

// open opens a socket on the interface as it is now, and returns it with
// the interface's index and, unless it was configured, its primary
// address (invalid when configured).
func (l *ifaceLink) open() (c conn, index int, src netip.Addr, err error) {
	err = l.inNS(func() error {
		ifi, err := net.InterfaceByName(l.name)
		if err != nil {
			return fmt.Errorf("interface %q: %w", l.name, err)
		}
		if l.source {
			if src, err = primaryAddr(ifi, l.v6); err != nil {
				return err
			}
		}
		index = ifi.Index
		c, err = listen(ifi, l.v6)
		return err
	})
	return c, index, src, err
}

// inNS runs f on a thread of its own in the router's network namespace
// and returns its error. The thread may end in another namespace: it is
// never unlocked, so it dies with the goroutine.
func (l *ifaceLink) inNS(f func() error) error {
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if err = netns.Set(l.ns); err != nil {
			err = fmt.Errorf("enter the network namespace: %w", err)
			return
		}
		err = f()
	}()
	<-done
	return err
}

// resubscribeAfter is how long the watch waits before it subscribes to
// the link messages again, when subscribing failed or its subscription
// ended with an error (ENOBUFS: the kernel dropped messages the router
// did not read in time).
const resubscribeAfter = 100 * time.Millisecond

// watch subscribes to the link messages (RTM_NEWLINK, RTM_DELLINK) of
// the router's network namespace, and sends on changed, without
// blocking, whenever the interface may have changed: a message about a
// link of its name, or of the index it last had (renamed away), and
// each time the subscription starts, at first and again after it
// failed, since messages may have been lost. The router then looks at
// the interface (state), so that a lost message costs no more than a
// late one. done closes once stop has and the watch has ended.
func (l *ifaceLink) watch(stop <-chan struct{}, log *slog.Logger) (changed, done <-chan struct{}) {
	ch := make(chan struct{}, 1)
	fin := make(chan struct{})
	poke := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	go func() {
		defer close(fin)
		index := 0
		failing := false
		for {
			updates := make(chan netlink.LinkUpdate, 16)
			errc := make(chan error, 1)
			ns := l.ns
			err := netlink.LinkSubscribeWithOptions(updates, stop, netlink.LinkSubscribeOptions{
				Namespace: &ns,
				ErrorCallback: func(err error) {
					select {
					case errc <- err:
					default:
					}
				},
			})
			if err == nil {
				if failing {
					log.Info("vrrp: link messages received again", "interface", l.name)
					failing = false
				}
				poke()
				for u := range updates {
					a := u.Attrs()
					switch {
					case a.Name == l.name:
						index = a.Index
						poke()
					case a.Index == index:
						poke()
					}
				}
				select {
				case err = <-errc:
				default:
					err = fmt.Errorf("subscription ended")
				}
			}
			select {
			case <-stop:
				return
			default:
			}
			if !failing {
				// Once per outage: the periodic check goes on
				// meanwhile.
				log.Warn("vrrp: link messages lost; subscribing again", "interface", l.name, "error", err)
				failing = true
			}
			poke()
			select {
			case <-stop:
				return
			case <-time.After(resubscribeAfter):
			}
		}
	}()
	return ch, fin
}

// resolve sends each peer an ICMP echo request from src, on the
// interface, in the router's network namespace: to send it the kernel
// resolves the peer's link-layer address with an ARP request or a
// neighbour solicitation from src, which refreshes the peer's own entry
// for src (a solicitation the kernel sent by itself would come from the
// link-local address, and refresh nothing for a global src).
func (l *ifaceLink) resolve(src netip.Addr, peers []netip.Addr) error {
	network, typ := "ip4:icmp", icmp.Type(ipv4.ICMPTypeEcho)
	if l.v6 {
		network, typ = "ip6:ipv6-icmp", ipv6.ICMPTypeEchoRequest
	}
	zoned := func(a netip.Addr) netip.Addr {
		if a.Is6() && a.IsLinkLocalUnicast() {
			return a.WithZone(l.name)
		}
		return a
	}
	return l.inNS(func() error {
		c, err := icmp.ListenPacket(network, zoned(src).String())
		if err != nil {
			return err
		}
		defer c.Close()
		b, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: os.Getpid() & 0xffff, Seq: 1, Data: []byte("vipd vrrp")}}).Marshal(nil)
		if err != nil {
			return err
		}
		var errs []error
		for _, p := range peers {
			p = zoned(p)
			if _, werr := c.WriteTo(b, &net.IPAddr{IP: p.AsSlice(), Zone: p.Zone()}); werr != nil {
				errs = append(errs, fmt.Errorf("echo request to %v: %w", p, werr))
			}
		}
		return errors.Join(errs...)
	})
}

func (l *ifaceLink) Close() {
	l.h.Close()
	l.ns.Close()
}
