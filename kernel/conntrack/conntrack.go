// Package conntrack creates the kernel's connection-tracking entries of
// source-NATed IPVS connections over netlink (ctnetlink), so that a node
// that takes a VIP over from a peer translates the connections the peer
// synchronized as the peer did.
//
// A one-arm (SNAT) service's traffic reaches its backends from the
// high-availability pair's floating SNAT address, and the backends answer
// that address. IPVS's connection synchronization gives the new master
// each established connection, but not the connection-tracking entry
// that holds its address translation: without one, the backend's answer
// to the floating address meets a node that tracks nothing (it is
// dropped as unsolicited, or answered with a reset), and a client's FIN
// or RST, which connection tracking never picks up from the middle of a
// connection, leaves the node untranslated and reaches the backend from
// the wrong address. An entry made from the IPVS connection (client to
// VIP; backend to the floating address at the client's port) is what the
// peer's kernel holds, so every packet of the connection is translated
// on the new master from the first.
package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/lb"
)

// TCPState is connection tracking's state of a TCP connection
// (enum tcp_conntrack).
type TCPState uint8

// The TCP states a connection taken over can be in.
const (
	TCPSynSent     TCPState = 1
	TCPSynRecv     TCPState = 2
	TCPEstablished TCPState = 3
	TCPFinWait     TCPState = 4
	TCPLastAck     TCPState = 6
)

// TCPStateOf returns the connection-tracking state of a TCP connection
// that IPVS lists in state (ipvs.Connection.State), and false for a state
// with nothing left to take over (closed, in TIME_WAIT, a template). Both
// of IPVS's closing states become FIN_WAIT, connection tracking's state
// after a first FIN from either side: the next packets move it on.
func TCPStateOf(state string) (TCPState, bool) {
	switch state {
	case "ESTABLISHED":
		return TCPEstablished, true
	case "SYN_RECV":
		// IPVS received the client's SYN: connection tracking saw it
		// leave towards the backend.
		return TCPSynSent, true
	case "SYNACK":
		return TCPSynRecv, true
	case "FIN_WAIT", "CLOSE_WAIT":
		return TCPFinWait, true
	case "LAST_ACK":
		return TCPLastAck, true
	}
	return 0, false
}

// Flow is one source-NATed IPVS connection to track.
type Flow struct {
	Proto lb.Proto
	// Client, Virtual and Backend are the connection's addresses, as
	// IPVS lists them (ipvs.Connection).
	Client, Virtual, Backend netip.AddrPort
	// Source is the SNAT source the backend sees the connection come
	// from, at the client's port.
	Source netip.Addr
	// State is the TCP state (TCP only).
	State TCPState
	// Timeout is how long the entry lives without a packet; the first
	// packet sets the timeout of its state.
	Timeout time.Duration
}

// FlowOf returns the flow of an IPVS connection source-NATed to src, and
// false when there is nothing to track: a protocol other than TCP and
// UDP, a TCP state with nothing to take over, or addresses of different
// families.
func FlowOf(c ipvs.Connection, src netip.Addr) (Flow, bool) {
	f := Flow{Proto: c.Proto, Client: c.Client, Virtual: c.Virtual, Backend: c.Backend, Source: src, Timeout: max(c.Expires, minTimeout)}
	switch c.Proto {
	case lb.TCP:
		s, ok := TCPStateOf(c.State)
		if !ok {
			return Flow{}, false
		}
		f.State = s
	case lb.UDP:
	default:
		return Flow{}, false
	}
	a := c.Client.Addr()
	if !src.IsValid() || a.Is4() != c.Virtual.Addr().Is4() || a.Is4() != c.Backend.Addr().Is4() || a.Is4() != src.Is4() {
		return Flow{}, false
	}
	return f, true
}

// minTimeout is the shortest life of an entry made for a connection: time
// for its next packet, which sets the timeout of its state.
const minTimeout = time.Minute

// Netlink's values (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctMsgNew    = 0 // IPCTNL_MSG_CT_NEW
	ctMsgDelete = 2 // IPCTNL_MSG_CT_DELETE

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaProtoinfo  = 4
	ctaNATSrc     = 6
	ctaTimeout    = 7

	ctaTupleIP    = 1
	ctaTupleProto = 2

	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3

	ctaNATv4MinIP = 1
	ctaNATv4MaxIP = 2
	ctaNATProto   = 3
	ctaNATv6MinIP = 4
	ctaNATv6MaxIP = 5

	ctaProtoNATPortMin = 1
	ctaProtoNATPortMax = 2

	ctaProtoinfoTCP              = 1
	ctaProtoinfoTCPState         = 1
	ctaProtoinfoTCPFlagsOriginal = 4
	ctaProtoinfoTCPFlagsReply    = 5

	// tcpFlagBeLiberal (IP_CT_TCP_FLAG_BE_LIBERAL) accepts every packet
	// of the direction whatever its window: the entry starts with no
	// record of the windows the peer's kernel tracked.
	tcpFlagBeLiberal = 0x08

	// statusSeenReply and statusAssured (IPS_SEEN_REPLY, IPS_ASSURED):
	// the connection has seen both directions and is not the first
	// entry dropped when the table is full. statusConfirmed
	// (IPS_CONFIRMED) is set by the kernel before it reads the status,
	// which must keep it.
	statusSeenReply = 1 << 1
	statusAssured   = 1 << 2
	statusConfirmed = 1 << 3
)

// request returns the netlink request that creates f's entry: the
// original direction from the client to the VIP; the reply from the
// backend to the client as IPVS leaves it, which the kernel then
// translates to the SNAT source at the client's port, as the nat table's
// SNAT rule did on the peer.
func (f Flow) request() *nl.NetlinkRequest {
	family := unix.AF_INET
	if f.Client.Addr().Is6() {
		family = unix.AF_INET6
	}
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|ctMsgNew, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(family), Version: nl.NFNETLINK_V0})
	proto := protoNumber(f.Proto)
	req.AddData(tuple(ctaTupleOrig, proto, f.Client, f.Virtual))
	req.AddData(tuple(ctaTupleReply, proto, f.Backend, f.Client))
	req.AddData(nl.NewRtAttr(ctaStatus, nl.BEUint32Attr(statusSeenReply|statusAssured|statusConfirmed)))
	if f.Proto == lb.TCP {
		info := nl.NewRtAttr(unix.NLA_F_NESTED|ctaProtoinfo, nil)
		tcp := info.AddRtAttr(unix.NLA_F_NESTED|ctaProtoinfoTCP, nil)
		tcp.AddRtAttr(ctaProtoinfoTCPState, []byte{byte(f.State)})
		tcp.AddRtAttr(ctaProtoinfoTCPFlagsOriginal, []byte{tcpFlagBeLiberal, tcpFlagBeLiberal})
		tcp.AddRtAttr(ctaProtoinfoTCPFlagsReply, []byte{tcpFlagBeLiberal, tcpFlagBeLiberal})
		req.AddData(info)
	}
	nat := nl.NewRtAttr(unix.NLA_F_NESTED|ctaNATSrc, nil)
	minIP, maxIP := ctaNATv4MinIP, ctaNATv4MaxIP
	if f.Source.Is6() {
		minIP, maxIP = ctaNATv6MinIP, ctaNATv6MaxIP
	}
	nat.AddRtAttr(minIP, f.Source.AsSlice())
	nat.AddRtAttr(maxIP, f.Source.AsSlice())
	ports := nat.AddRtAttr(unix.NLA_F_NESTED|ctaNATProto, nil)
	ports.AddRtAttr(ctaProtoNATPortMin, nl.BEUint16Attr(f.Client.Port()))
	ports.AddRtAttr(ctaProtoNATPortMax, nl.BEUint16Attr(f.Client.Port()))
	req.AddData(nat)
	req.AddData(nl.NewRtAttr(ctaTimeout, nl.BEUint32Attr(uint32(min(f.Timeout/time.Second, 1<<31)))))
	return req
}

// deleteRequest returns the netlink request that deletes f's entry,
// found by its original direction.
func (f Flow) deleteRequest() *nl.NetlinkRequest {
	family := unix.AF_INET
	if f.Client.Addr().Is6() {
		family = unix.AF_INET6
	}
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|ctMsgDelete, unix.NLM_F_ACK)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(family), Version: nl.NFNETLINK_V0})
	req.AddData(tuple(ctaTupleOrig, protoNumber(f.Proto), f.Client, f.Virtual))
	return req
}

// tuple returns a tuple attribute of type typ from src to dst.
func tuple(typ int, proto uint8, src, dst netip.AddrPort) *nl.RtAttr {
	t := nl.NewRtAttr(unix.NLA_F_NESTED|typ, nil)
	ip := t.AddRtAttr(unix.NLA_F_NESTED|ctaTupleIP, nil)
	srcType, dstType := ctaIPv4Src, ctaIPv4Dst
	if src.Addr().Is6() {
		srcType, dstType = ctaIPv6Src, ctaIPv6Dst
	}
	ip.AddRtAttr(srcType, src.Addr().AsSlice())
	ip.AddRtAttr(dstType, dst.Addr().AsSlice())
	p := t.AddRtAttr(unix.NLA_F_NESTED|ctaTupleProto, nil)
	p.AddRtAttr(ctaProtoNum, []byte{proto})
	p.AddRtAttr(ctaProtoSrcPort, nl.BEUint16Attr(src.Port()))
	p.AddRtAttr(ctaProtoDstPort, nl.BEUint16Attr(dst.Port()))
	return t
}

func protoNumber(p lb.Proto) uint8 {
	switch p {
	case lb.UDP:
		return unix.IPPROTO_UDP
	case lb.SCTP:
		return unix.IPPROTO_SCTP
	}
	return unix.IPPROTO_TCP
}

// Result counts what Track did.
type Result struct {
	// Created counts the entries made; Existing those the kernel had
	// already (a packet of the connection came first, or a previous
	// takeover made it) and kept; Replaced those it had and made again
	// (Replace); Failed those it refused.
	Created, Existing, Replaced, Failed int
}

// maxErrors bounds the errors Track returns: the first ones say what
// went wrong, the count says how often.
const maxErrors = 3

// Tracker creates connection-tracking entries in the network namespace
// of the calling thread.
type Tracker struct{}

// Connections calls fn for each connection of the kernel's IPVS table
// (ipvs.Connections).
func (Tracker) Connections(fn func(ipvs.Connection) bool) error {
	return ipvs.Connections(fn)
}

// window bounds the requests Track sends in one message to the kernel:
// few enough that the answers of a batch that fails whole fit the
// socket's receive buffer.
const window = 128

// Existing says what Track does with a flow that has an entry already.
type Existing int

const (
	// Keep leaves the entry as it is: the node's own, live.
	Keep Existing = iota
	// Replace deletes the entry and makes the flow's: on a node about
	// to take a VIP over, an entry of the flow is a leftover of its last
	// turn as master, or of a handshake that straddled the last change
	// of master (its state stuck in SYN_SENT while the peer's went on),
	// and the peer's synchronized connection is the truth. A leftover
	// kept in the wrong state makes connection tracking refuse the
	// connection's next packets, which then leave untranslated.
	Replace
)

// op is one request of Track: make flow's entry, or delete it.
type op struct {
	flow   int
	delete bool
	// again says the entry is made a second time, after its delete.
	again bool
}

// Track makes an entry for each flow, doing what existing says with
// those that have one, and goes on after a failure: it returns what it
// did, and the first errors. It sends its requests in batches of up to
// window in one message to the kernel, which handles them in order and
// answers only the failures and the last of a batch: a takeover pays two
// system calls per batch, not two per connection.
func (Tracker) Track(flows []Flow, existing Existing) (Result, error) {
	var r Result
	if len(flows) == 0 {
		return r, nil
	}
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		return r, fmt.Errorf("conntrack: open netlink socket: %w", err)
	}
	defer s.Close()
	// The kernel answers the last request of every batch; the timeout
	// is for a kernel that would not, so that a takeover cannot hang.
	if err := s.SetReceiveTimeout(&unix.Timeval{Sec: 5}); err != nil {
		return r, fmt.Errorf("conntrack: netlink socket: %w", err)
	}
	var errs []error
	failed := map[int]bool{}
	fail := func(o op, err error) {
		if failed[o.flow] {
			return
		}
		failed[o.flow] = true
		r.Failed++
		if len(errs) < maxErrors {
			f, what := flows[o.flow], "track"
			if o.delete {
				what = "delete the entry of"
			}
			errs = append(errs, fmt.Errorf("conntrack: %s %s %s -> %s via %s from %s: %w", what, f.Proto, f.Client, f.Virtual, f.Backend, f.Source, err))
		}
	}
	queue := make([]op, len(flows))
	for i := range queue {
		queue[i] = op{flow: i}
	}
	for len(queue) > 0 {
		batch := queue[:min(window, len(queue))]
		queue = queue[len(batch):]
		sent := make(map[uint32]op, len(batch))
		var buf []byte
		var last uint32
		for i, o := range batch {
			req := flows[o.flow].request()
			if o.delete {
				req = flows[o.flow].deleteRequest()
			}
			if i < len(batch)-1 {
				req.Flags &^= unix.NLM_F_ACK // answered only if it fails
			}
			sent[req.Seq], last = o, req.Seq
			buf = append(buf, req.Serialize()...)
		}
		answers, err := exchange(s, buf, last)
		if err != nil {
			for _, o := range batch {
				fail(o, err)
			}
			for _, o := range queue {
				fail(o, fmt.Errorf("not tried: %w", err))
			}
			break
		}
		for seq, o := range sent {
			errno := answers[seq] // 0 when it succeeded: no answer, or the last one's
			switch {
			case failed[o.flow]:
			case o.delete:
				// ENOENT: the entry went meanwhile; the flow's is made
				// next all the same.
				if errno != 0 && errno != unix.ENOENT {
					fail(o, errno)
				}
			case errno == 0 && o.again:
				r.Replaced++
			case errno == 0:
				r.Created++
			case errno == unix.EEXIST && existing == Replace && !o.again:
				// The delete and the second make go out in this order in
				// one message, which the kernel handles in order.
				queue = append(queue, op{flow: o.flow, delete: true}, op{flow: o.flow, again: true})
			case errno == unix.EEXIST:
				r.Existing++
			default:
				fail(o, errno)
			}
		}
	}
	return r, errors.Join(errs...)
}

// exchange sends buf, requests the kernel handles in order, and reads
// the answers up to that of the request numbered last: the errors of the
// requests that failed, by sequence number.
func exchange(s *nl.NetlinkSocket, buf []byte, last uint32) (map[uint32]unix.Errno, error) {
	if err := unix.Sendto(s.GetFd(), buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	answers := map[uint32]unix.Errno{}
	for {
		msgs, _, err := s.Receive()
		if err != nil {
			return nil, fmt.Errorf("read the answers: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if errno := unix.Errno(-int32(nl.NativeEndian().Uint32(m.Data[:4]))); errno != 0 {
				answers[m.Header.Seq] = errno
			}
			if m.Header.Seq == last {
				return answers, nil
			}
		}
	}
}
