package arp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// Conn sends and receives ARP packets on one interface.
type Conn interface {
	// ReadFrom returns the next ARP packet received or sent on the
	// interface, with the Ethernet destination of its frame.
	ReadFrom() (*arp.Packet, net.HardwareAddr, error)
	// WriteTo sends p in an Ethernet frame to dst.
	WriteTo(p *arp.Packet, dst net.HardwareAddr) error
	// Close closes the connection; a blocked ReadFrom returns an error.
	Close() error
}

// NDPConn sends and receives IPv6 neighbour discovery messages on one
// interface.
type NDPConn interface {
	// ReadFrom returns the next message received and its source address.
	ReadFrom() (ndp.Message, netip.Addr, error)
	// WriteTo sends m to dst.
	WriteTo(m ndp.Message, dst netip.Addr) error
	// JoinGroup joins a multicast group, so that neighbour solicitations
	// sent to it arrive.
	JoinGroup(group netip.Addr) error
	// LeaveGroup leaves a multicast group.
	LeaveGroup(group netip.Addr) error
	// Close closes the connection; a blocked ReadFrom returns an error.
	Close() error
}

// Links finds network interfaces and opens packet connections on them.
// Options.Links defaults to the kernel's; tests substitute a fake.
type Links interface {
	// Interface returns the interface named name.
	Interface(name string) (*net.Interface, error)
	// ListenARP opens an ARP connection on ifi.
	ListenARP(ifi *net.Interface) (Conn, error)
	// ListenNDP opens a neighbour discovery connection on ifi.
	ListenNDP(ifi *net.Interface) (NDPConn, error)
}

// KernelLinks are the kernel's interfaces and sockets: AF_PACKET sockets
// for ARP and ICMPv6 sockets bound to the interface, sending from its
// link-local address, for neighbour discovery. Both need CAP_NET_RAW.
type KernelLinks struct{}

var _ Links = KernelLinks{}

// Interface implements Links.
func (KernelLinks) Interface(name string) (*net.Interface, error) {
	return net.InterfaceByName(name)
}

// ListenARP implements Links. Unlike mdlayher/arp's Dial it needs no IPv4
// address on the interface: vipd writes every field of its packets.
func (KernelLinks) ListenARP(ifi *net.Interface) (Conn, error) {
	pc, err := packet.Listen(ifi, packet.Raw, int(ethernet.EtherTypeARP), nil)
	if err != nil {
		return nil, err
	}
	return &packetConn{ifi: ifi, pc: pc}, nil
}

// ListenNDP implements Links. The connection is an ICMPv6 socket bound
// to ifi by index (SO_BINDTODEVICE), sending from ifi's link-local
// address with hop limit 255 and receiving neighbour solicitations only,
// and only those that arrive with hop limit 255.
// It does not use ndp.Listen, which names the interface by an IPv6 zone
// that Go's zone cache may map to a stale index for up to a minute after
// an interface is replaced.
func (KernelLinks) ListenNDP(ifi *net.Interface) (NDPConn, error) {
	src, err := linkLocal(ifi)
	if err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), ifi.Name) }); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("bind to device: %w", serr)
		}
		return nil
	}}
	c, err := lc.ListenPacket(context.Background(), "ip6:ipv6-icmp", "::")
	if err != nil {
		return nil, err
	}
	pc := ipv6.NewPacketConn(c)
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeNeighborSolicitation)
	for _, set := range []func() error{
		func() error { return pc.SetHopLimit(ndp.HopLimit) },
		func() error { return pc.SetMulticastHopLimit(ndp.HopLimit) },
		func() error { return pc.SetMulticastLoopback(false) },
		func() error { return pc.SetChecksum(true, 2) },
		func() error { return pc.SetICMPFilter(&f) },
		func() error { return pc.SetControlMessage(ipv6.FlagHopLimit, true) },
	} {
		if err := set(); err != nil {
			pc.Close()
			return nil, fmt.Errorf("set up icmpv6 socket: %w", err)
		}
	}
	return &ndpConn{pc: pc, ifi: ifi, src: src, cm: &ipv6.ControlMessage{HopLimit: ndp.HopLimit, Src: src.AsSlice(), IfIndex: ifi.Index}}, nil
}

// linkLocal returns the first IPv6 link-local address of ifi.
func linkLocal(ifi *net.Interface) (netip.Addr, error) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Is6() && ip.IsLinkLocalUnicast() {
				return ip, nil
			}
		}
	}
	return netip.Addr{}, errors.New("no ipv6 link-local address")
}

// packetConn is an ARP Conn on an AF_PACKET socket.
type packetConn struct {
	ifi *net.Interface
	pc  *packet.Conn
}

func (c *packetConn) ReadFrom() (*arp.Packet, net.HardwareAddr, error) {
	buf := make([]byte, 1514)
	for {
		n, _, err := c.pc.ReadFrom(buf)
		if err != nil {
			return nil, nil, err
		}
		var f ethernet.Frame
		if err := f.UnmarshalBinary(buf[:n]); err != nil || f.EtherType != ethernet.EtherTypeARP {
			continue
		}
		p := new(arp.Packet)
		if err := p.UnmarshalBinary(f.Payload); err != nil {
			continue
		}
		return p, f.Destination, nil
	}
}

func (c *packetConn) WriteTo(p *arp.Packet, dst net.HardwareAddr) error {
	pb, err := p.MarshalBinary()
	if err != nil {
		return err
	}
	f := &ethernet.Frame{
		Destination: dst,
		Source:      c.ifi.HardwareAddr,
		EtherType:   ethernet.EtherTypeARP,
		Payload:     pb,
	}
	fb, err := f.MarshalBinary()
	if err != nil {
		return err
	}
	_, err = c.pc.WriteTo(fb, &packet.Addr{HardwareAddr: dst})
	return err
}

func (c *packetConn) Close() error { return c.pc.Close() }

// ndpConn is an NDPConn on an ICMPv6 socket bound to one interface.
type ndpConn struct {
	pc  *ipv6.PacketConn
	ifi *net.Interface
	src netip.Addr
	cm  *ipv6.ControlMessage
}

func (c *ndpConn) ReadFrom() (ndp.Message, netip.Addr, error) {
	buf := make([]byte, c.ifi.MTU)
	for {
		n, cm, from, err := c.pc.ReadFrom(buf)
		if err != nil {
			return nil, netip.Addr{}, err
		}
		if cm == nil || cm.HopLimit != ndp.HopLimit {
			// RFC 4861 section 7.1.1: a solicitation that crossed a
			// router (or claims to have) is not from the link.
			continue
		}
		ip, ok := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		if !ok || ip == c.src {
			continue
		}
		m, err := ndp.ParseMessage(buf[:n])
		if err != nil {
			continue
		}
		return m, ip, nil
	}
}

func (c *ndpConn) WriteTo(m ndp.Message, dst netip.Addr) error {
	b, err := ndp.MarshalMessage(m)
	if err != nil {
		return err
	}
	_, err = c.pc.WriteTo(b, c.cm, &net.IPAddr{IP: dst.AsSlice()})
	return err
}

func (c *ndpConn) JoinGroup(g netip.Addr) error {
	return c.pc.JoinGroup(c.ifi, &net.IPAddr{IP: g.AsSlice()})
}

func (c *ndpConn) LeaveGroup(g netip.Addr) error {
	return c.pc.LeaveGroup(c.ifi, &net.IPAddr{IP: g.AsSlice()})
}

func (c *ndpConn) Close() error { return c.pc.Close() }

// errClosed is returned by an Announcer's methods after Close.
var errClosed = errors.New("announcer is closed")
