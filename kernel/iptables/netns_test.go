package iptables

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// addRoute routes dst through gw.
func addRoute(dst, gw string) error {
	_, n, err := net.ParseCIDR(dst)
	if err != nil {
		return err
	}
	if err := netlink.RouteAdd(&netlink.Route{Dst: n, Gw: net.ParseIP(gw)}); err != nil {
		return fmt.Errorf("route %s via %s: %w", dst, gw, err)
	}
	return nil
}

// ping sends one ICMP echo request to addr and reports whether a reply
// came back within timeout.
func ping(addr netip.Addr, timeout time.Duration) (bool, error) {
	network, laddr, proto := "ip4:icmp", "0.0.0.0", 1
	var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if addr.Is6() {
		network, laddr, proto = "ip6:ipv6-icmp", "::", 58
		typ, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err != nil {
		return false, err
	}
	defer c.Close()
	msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: 0x7d, Seq: 1, Data: []byte("vipd")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return false, err
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: addr.AsSlice()}); err != nil {
		return false, err
	}
	c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return false, nil
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err == nil && m.Type == reply && from.(*net.IPAddr).IP.Equal(addr.AsSlice()) {
			return true, nil
		}
	}
}
