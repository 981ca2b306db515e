package arp

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// addOnLinkRoute routes dst directly out of link, so that the kernel
// resolves addresses in dst with ARP or neighbour solicitations there.
func addOnLinkRoute(dst, link string) error {
	_, n, err := net.ParseCIDR(dst)
	if err != nil {
		return err
	}
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	if err := netlink.RouteAdd(&netlink.Route{Dst: n, LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("route %s dev %s: %w", dst, link, err)
	}
	return nil
}
