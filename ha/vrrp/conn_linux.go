package vrrp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
	"unsafe"

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
	// Recv reads one message into b: the message (p.b, within b), the
	// addresses and TTL (hop limit) of the IP packet that carried it,
	// and when the kernel received it (p.at, wall clock; zero when it
	// does not say).
	Recv(b []byte) (p received, err error)
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
			if serr == nil {
				// The kernel's time of arrival: a backup counts its
				// master down timer from it, not from when its
				// loop got to the packet.
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
			}
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
	ipc *net.IPConn
	ifi *net.Interface
	// hdr receives the IP header and the message; oob the control
	// messages.
	hdr [1500]byte
	oob [256]byte
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
	ipc, ok := pc.(*net.IPConn)
	if !ok {
		return nil, fmt.Errorf("a %T is no raw IP socket", pc)
	}
	return &conn4{pc: p, ipc: ipc, ifi: ifi}, nil
}

// Recv reads a packet with its control messages: an IPv4 raw socket
// reads the IP header too, which it strips.
func (c *conn4) Recv(b []byte) (received, error) {
	for {
		n, oobn, _, src, err := c.ipc.ReadMsgIP(c.hdr[:], c.oob[:])
		if err != nil {
			return received{}, err
		}
		if n < 20 || c.hdr[0]>>4 != 4 || int(c.hdr[0]&0xf)*4 > n {
			continue
		}
		cm, err := parseControl(c.oob[:oobn])
		if err != nil || cm.ifindex != c.ifi.Index {
			continue
		}
		s, _ := netip.AddrFromSlice(src.IP)
		m := copy(b, c.hdr[int(c.hdr[0]&0xf)*4:n])
		return received{b: b[:m], src: s.Unmap(), dst: cm.dst.Unmap(), ttl: cm.ttl, at: cm.at}, nil
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
	ipc *net.IPConn
	ifi *net.Interface
	oob [256]byte
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
	ipc, ok := pc.(*net.IPConn)
	if !ok {
		return nil, fmt.Errorf("a %T is no raw IP socket", pc)
	}
	return &conn6{pc: p, ipc: ipc, ifi: ifi}, nil
}

// Recv reads a message with its control messages (an IPv6 raw socket
// reads no IP header).
func (c *conn6) Recv(b []byte) (received, error) {
	for {
		n, oobn, _, src, err := c.ipc.ReadMsgIP(b, c.oob[:])
		if err != nil {
			return received{}, err
		}
		cm, err := parseControl(c.oob[:oobn])
		if err != nil || cm.ifindex != c.ifi.Index {
			continue
		}
		s, _ := netip.AddrFromSlice(src.IP)
		return received{b: b[:n], src: s, dst: cm.dst, ttl: cm.ttl, at: cm.at}, nil
	}
}

// control is what a received packet's control messages say.
type control struct {
	ifindex int
	dst     netip.Addr
	ttl     int
	at      time.Time
}

// parseControl reads the control messages the sockets ask for: the
// packet's interface and destination (IP_PKTINFO, IPV6_PKTINFO), its TTL
// or hop limit, and the kernel's time of arrival (SO_TIMESTAMPNS).
func parseControl(oob []byte) (control, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return control{}, err
	}
	var cm control
	for _, m := range msgs {
		h, d := m.Header, m.Data
		switch {
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_TIMESTAMPNS && len(d) >= int(unsafe.Sizeof(unix.Timespec{})):
			ts := (*unix.Timespec)(unsafe.Pointer(&d[0]))
			cm.at = time.Unix(ts.Unix())
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(d) >= unix.SizeofInet4Pktinfo:
			pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&d[0]))
			cm.ifindex, cm.dst = int(pi.Ifindex), netip.AddrFrom4(pi.Addr)
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TTL && len(d) >= 4:
			cm.ttl = int(int32(binary.NativeEndian.Uint32(d)))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(d) >= unix.SizeofInet6Pktinfo:
			pi := (*unix.Inet6Pktinfo)(unsafe.Pointer(&d[0]))
			cm.ifindex, cm.dst = int(pi.Ifindex), netip.AddrFrom16(pi.Addr)
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_HOPLIMIT && len(d) >= 4:
			cm.ttl = int(int32(binary.NativeEndian.Uint32(d)))
		}
	}
	if !cm.dst.IsValid() {
		return control{}, errors.New("no packet information")
	}
	return cm, nil
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
