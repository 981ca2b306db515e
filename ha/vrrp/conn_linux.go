package vrrp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// The multicast groups of RFC 5798 section 5.1.
var (
	Group4 = netip.MustParseAddr("224.0.0.18")
	Group6 = netip.MustParseAddr("ff02::12")
)

// ttl is the TTL or hop limit that VRRP packets are sent with and, from
// the multicast group, must arrive with (RFC 5798 section 5.1.1.3).
const ttl = 255

// conn sends and receives VRRP messages on one interface.
type conn interface {
	// Recv reads one message and the addresses and TTL (hop limit) of the
	// IP packet that carried it.
	Recv(b []byte) (n int, src, dst netip.Addr, ttl int, err error)
	// Send sends a message from src to dst.
	Send(b []byte, src, dst netip.Addr) error
	Close() error
}

// listen opens a raw socket for IP protocol 112 bound to the interface,
// in the network namespace of the calling thread, and joins the family's
// VRRP group on it.
func listen(ifi *net.Interface, v6 bool) (conn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifi.Name)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	network, any := "ip4:112", "0.0.0.0"
	if v6 {
		network, any = "ip6:112", "::"
	}
	pc, err := lc.ListenPacket(context.Background(), network, any)
	if err != nil {
		return nil, fmt.Errorf("listen %s on %s: %w", network, ifi.Name, err)
	}
	var c conn
	if v6 {
		c, err = setup6(pc, ifi)
	} else {
		c, err = setup4(pc, ifi)
	}
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("set up %s on %s: %w", network, ifi.Name, err)
	}
	return c, nil
}

type conn4 struct {
	pc  *ipv4.PacketConn
	ifi *net.Interface
}

func setup4(pc net.PacketConn, ifi *net.Interface) (conn, error) {
	p := ipv4.NewPacketConn(pc)
	for _, f := range []func() error{
		func() error { return p.JoinGroup(ifi, &net.IPAddr{IP: Group4.AsSlice()}) },
		func() error { return p.SetMulticastInterface(ifi) },
		func() error { return p.SetMulticastTTL(ttl) },
		func() error { return p.SetTTL(ttl) },
		func() error { return p.SetMulticastLoopback(false) },
		func() error { return p.SetControlMessage(ipv4.FlagTTL|ipv4.FlagDst|ipv4.FlagInterface, true) },
	} {
		if err := f(); err != nil {
			return nil, err
		}
	}
	return &conn4{pc: p, ifi: ifi}, nil
}

func (c *conn4) Recv(b []byte) (int, netip.Addr, netip.Addr, int, error) {
	for {
		n, cm, src, err := c.pc.ReadFrom(b)
		if err != nil {
			return 0, netip.Addr{}, netip.Addr{}, 0, err
		}
		if cm == nil || cm.IfIndex != c.ifi.Index {
			continue
		}
		s, _ := netip.AddrFromSlice(src.(*net.IPAddr).IP)
		d, _ := netip.AddrFromSlice(cm.Dst)
		return n, s.Unmap(), d.Unmap(), cm.TTL, nil
	}
}

func (c *conn4) Send(b []byte, src, dst netip.Addr) error {
	cm := &ipv4.ControlMessage{IfIndex: c.ifi.Index, Src: src.AsSlice()}
	_, err := c.pc.WriteTo(b, cm, &net.IPAddr{IP: dst.AsSlice()})
	return err
}

func (c *conn4) Close() error { return c.pc.Close() }

type conn6 struct {
	pc  *ipv6.PacketConn
	ifi *net.Interface
}

func setup6(pc net.PacketConn, ifi *net.Interface) (conn, error) {
	p := ipv6.NewPacketConn(pc)
	for _, f := range []func() error{
		func() error { return p.JoinGroup(ifi, &net.IPAddr{IP: Group6.AsSlice()}) },
		func() error { return p.SetMulticastInterface(ifi) },
		func() error { return p.SetMulticastHopLimit(ttl) },
		func() error { return p.SetHopLimit(ttl) },
		func() error { return p.SetMulticastLoopback(false) },
		func() error {
			return p.SetControlMessage(ipv6.FlagHopLimit|ipv6.FlagDst|ipv6.FlagInterface, true)
		},
	} {
		if err := f(); err != nil {
			return nil, err
		}
	}
	return &conn6{pc: p, ifi: ifi}, nil
}

func (c *conn6) Recv(b []byte) (int, netip.Addr, netip.Addr, int, error) {
	for {
		n, cm, src, err := c.pc.ReadFrom(b)
		if err != nil {
			return 0, netip.Addr{}, netip.Addr{}, 0, err
		}
		if cm == nil || cm.IfIndex != c.ifi.Index {
			continue
		}
		s, _ := netip.AddrFromSlice(src.(*net.IPAddr).IP)
		d, _ := netip.AddrFromSlice(cm.Dst)
		return n, s, d, cm.HopLimit, nil
	}
}

func (c *conn6) Send(b []byte, src, dst netip.Addr) error {
	cm := &ipv6.ControlMessage{IfIndex: c.ifi.Index, Src: src.AsSlice(), HopLimit: ttl}
	to := &net.IPAddr{IP: dst.AsSlice()}
	if dst.IsLinkLocalUnicast() || dst.IsLinkLocalMulticast() {
		to.Zone = c.ifi.Name
	}
	_, err := c.pc.WriteTo(b, cm, to)
	return err
}

func (c *conn6) Close() error { return c.pc.Close() }

// primaryAddr is the interface's first address of the family: for IPv4
// its first address, for IPv6 its link-local one (RFC 5798 section
// 5.1.2.1).
func primaryAddr(ifi *net.Interface, v6 bool) (netip.Addr, error) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("addresses of %s: %w", ifi.Name, err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if !v6 && ip.Is4() || v6 && ip.Is6() && ip.IsLinkLocalUnicast() {
			return ip, nil
		}
	}
	fam := "IPv4 address"
	if v6 {
		fam = "IPv6 link-local address"
	}
	return netip.Addr{}, fmt.Errorf("no %s on %s", fam, ifi.Name)
}
