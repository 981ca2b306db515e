package arp

import (
	"bytes"
	"net"
	"net/netip"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// serve answers ARP requests or neighbour solicitations on l until l is
// closed. When the connection fails (the interface went away), it closes
// l; the next Announce or refresh of a VIP reopens it.
func (a *Announcer) serve(l *link) {
	defer a.wg.Done()
	for {
		var err error
		if l.arp != nil {
			var p *arp.Packet
			var dst net.HardwareAddr
			if p, dst, err = l.arp.ReadFrom(); err == nil {
				a.answerARP(l, p, dst)
				continue
			}
		} else {
			var m ndp.Message
			var src netip.Addr
			if m, src, err = l.ndp.ReadFrom(); err == nil {
				a.answerNDP(l, m, src)
				continue
			}
		}
		if l.closed.Load() {
			return
		}
		a.log.Warn("uplink connection failed; reopening it on the next announcement", "uplink", l.name, "family", l.fam.String(), "err", err)
		a.mu.Lock()
		if !l.closed.Load() {
			a.closeLink(l)
		}
		a.mu.Unlock()
		return
	}
}

// answerARP replies to an ARP request for an announced VIP. It ignores
// replies, frames not for this interface, its own packets, and
// gratuitous announcements (whose sender and target address agree).
func (a *Announcer) answerARP(l *link, p *arp.Packet, dst net.HardwareAddr) {
	mac := l.ifi.HardwareAddr
	switch {
	case p.Operation != arp.OperationRequest,
		p.ProtocolType != uint16(ethernet.EtherTypeIPv4),
		p.HardwareAddrLength != 6 || p.IPLength != 4,
		!bytes.Equal(dst, ethernet.Broadcast) && !bytes.Equal(dst, mac),
		bytes.Equal(p.SenderHardwareAddr, mac),
		p.SenderIP == p.TargetIP,
		!a.announces(p.TargetIP):
		return
	}
	reply, err := arp.NewPacket(arp.OperationReply, mac, p.TargetIP, p.SenderHardwareAddr, p.SenderIP)
	if err == nil {
		err = l.arp.WriteTo(reply, p.SenderHardwareAddr)
	}
	if err != nil {
		a.errs.Add(1)
		a.log.Debug("arp reply failed", "uplink", l.name, "vip", p.TargetIP, "to", p.SenderIP, "err", err)
		return
	}
	a.replies.Add(1)
}

// answerNDP answers a neighbour solicitation for an announced VIP with a
// solicited advertisement to its sender, or, for duplicate address
// detection (unspecified sender), with an unsolicited one to all nodes.
func (a *Announcer) answerNDP(l *link, m ndp.Message, src netip.Addr) {
	ns, ok := m.(*ndp.NeighborSolicitation)
	if !ok || !a.announces(ns.TargetAddress) {
		return
	}
	na := &ndp.NeighborAdvertisement{
		Solicited:     true,
		Override:      true,
		TargetAddress: ns.TargetAddress,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: l.ifi.HardwareAddr}},
	}
	dst := src
	if src.IsUnspecified() {
		na.Solicited, dst = false, allNodes
	}
	if err := l.ndp.WriteTo(na, dst); err != nil {
		a.errs.Add(1)
		a.log.Debug("neighbour advertisement failed", "uplink", l.name, "vip", ns.TargetAddress, "to", dst, "err", err)
		return
	}
	a.replies.Add(1)
}
