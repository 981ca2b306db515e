package vrrp

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
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

// state returns the interface's index and whether it is up.
func (l *ifaceLink) state() (index int, up bool, err error) {
	link, err := l.h.LinkByName(l.name)
	if err != nil {
		return 0, false, fmt.Errorf("interface %s: %w", l.name, err)
	}
	a := link.Attrs()
	return a.Index, a.Flags&net.FlagUp != 0, nil
}

// open opens a socket on the interface as it is now, and returns it with
// the interface's index and, unless it was configured, its primary
// address (invalid when configured).
func (l *ifaceLink) open() (c conn, index int, src netip.Addr, err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread may end in another namespace: it is never
		// unlocked, so it dies with the goroutine.
		runtime.LockOSThread()
		if err = netns.Set(l.ns); err != nil {
			err = fmt.Errorf("enter the network namespace: %w", err)
			return
		}
		var ifi *net.Interface
		if ifi, err = net.InterfaceByName(l.name); err != nil {
			err = fmt.Errorf("interface %q: %w", l.name, err)
			return
		}
		if l.source {
			if src, err = primaryAddr(ifi, l.v6); err != nil {
				return
			}
		}
		index = ifi.Index
		c, err = listen(ifi, l.v6)
	}()
	<-done
	return c, index, src, err
}

func (l *ifaceLink) Close() {
	l.h.Close()
	l.ns.Close()
}
