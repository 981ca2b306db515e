package ipvs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"syscall"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

// The IPVS generic netlink interface (include/uapi/linux/ip_vs.h). moby/ipvs
// v1.1.0 neither sends nor reads a destination's tunnel type, port and
// flags, and sends no address family (so it cannot add or delete an IPv6
// real server of an IPv4 tunnel service); the adapter encodes destination
// commands itself, and service commands too when it sends them in batches.
const (
	ipvsGenlName    = "IPVS"
	ipvsGenlVersion = 1

	cmdNewService = 1
	cmdSetService = 2
	cmdDelService = 3
	cmdGetService = 4
	cmdNewDest    = 5
	cmdSetDest    = 6
	cmdDelDest    = 7
	cmdGetDest    = 8

	cmdAttrService = 1
	cmdAttrDest    = 2

	svcAttrAF        = 1
	svcAttrProtocol  = 2
	svcAttrAddr      = 3
	svcAttrPort      = 4
	svcAttrFWMark    = 5
	svcAttrSchedName = 6
	svcAttrFlags     = 7
	svcAttrTimeout   = 8
	svcAttrNetmask   = 9
	svcAttrStats     = 10
	svcAttrPEName    = 11
	svcAttrStats64   = 12

	destAttrAddr         = 1
	destAttrPort         = 2
	destAttrFwdMethod    = 3
	destAttrWeight       = 4
	destAttrUThresh      = 5
	destAttrLThresh      = 6
	destAttrActiveConns  = 7
	destAttrInactConns   = 8
	destAttrPersistConns = 9
	destAttrStats        = 10
	destAttrAddrFamily   = 11
	destAttrStats64      = 12
	destAttrTunType      = 13
	destAttrTunPort      = 14
	destAttrTunFlags     = 15

	// Counters and rates in a stats attribute: 32-bit (64-bit bytes) in
	// IPVS_*_ATTR_STATS, all 64-bit in IPVS_*_ATTR_STATS64 (Linux 4.1).
	statsConns    = 1
	statsInPkts   = 2
	statsOutPkts  = 3
	statsInBytes  = 4
	statsOutBytes = 5
	statsCPS      = 6
	statsInPPS    = 7
	statsOutPPS   = 8
	statsInBPS    = 9
	statsOutBPS   = 10
)

// nlaTypeMask strips the nested and byte-order bits of an attribute type.
const nlaTypeMask = 0x3fff

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// keyAttr encodes a service key as the IPVS_CMD_ATTR_SERVICE attribute
// that names a service in destination commands.
func keyAttr(k kernelKey) *nl.RtAttr {
	a := nl.NewRtAttr(cmdAttrService, nil)
	a.AddRtAttr(svcAttrAF, nl.Uint16Attr(k.family))
	if k.fwmark != 0 {
		a.AddRtAttr(svcAttrFWMark, nl.Uint32Attr(k.fwmark))
		return a
	}
	a.AddRtAttr(svcAttrProtocol, nl.Uint16Attr(k.proto))
	a.AddRtAttr(svcAttrAddr, k.addr.AsSlice())
	a.AddRtAttr(svcAttrPort, be16(k.port))
	return a
}

// serviceAttr encodes a service with its settings as the
// IPVS_CMD_ATTR_SERVICE attribute of add and update commands, as moby/ipvs
// does: the key, then scheduler, flags (with a mask of all ones, so that
// every flag is set or cleared), timeout and netmask.
func serviceAttr(k kernelKey, ms *mobyipvs.Service) *nl.RtAttr {
	a := keyAttr(k)
	a.AddRtAttr(svcAttrSchedName, nl.ZeroTerminated(ms.SchedName))
	if ms.PEName != "" {
		a.AddRtAttr(svcAttrPEName, nl.ZeroTerminated(ms.PEName))
	}
	flags := make([]byte, 8)
	binary.NativeEndian.PutUint32(flags[0:4], ms.Flags)
	binary.NativeEndian.PutUint32(flags[4:8], 0xffffffff)
	a.AddRtAttr(svcAttrFlags, flags)
	a.AddRtAttr(svcAttrTimeout, nl.Uint32Attr(ms.Timeout))
	a.AddRtAttr(svcAttrNetmask, nl.Uint32Attr(ms.Netmask))
	return a
}

// appendRequest appends one generic netlink request to b: a netlink
// header (NLM_F_REQUEST is added to flags), the genl header for cmd, and
// the attributes.
func appendRequest(b []byte, family, flags uint16, seq uint32, cmd uint8, attrs ...*nl.RtAttr) []byte {
	start := len(b)
	b = append(b, make([]byte, unix.NLMSG_HDRLEN)...)
	b = append(b, cmd, ipvsGenlVersion, 0, 0)
	for _, a := range attrs {
		b = append(b, a.Serialize()...)
	}
	h := b[start:]
	binary.NativeEndian.PutUint32(h[0:4], uint32(len(h)))
	binary.NativeEndian.PutUint16(h[4:6], family)
	binary.NativeEndian.PutUint16(h[6:8], flags|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(h[8:12], seq)
	binary.NativeEndian.PutUint32(h[12:16], 0)
	return b
}

// parseStats decodes a stats attribute of either width: each counter is
// read by its length, so IPVS_*_ATTR_STATS64 gives the full counters and
// IPVS_*_ATTR_STATS their low 32 bits.
func parseStats(b []byte) (lb.Stats, error) {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return lb.Stats{}, fmt.Errorf("stats: %w", err)
	}
	var st lb.Stats
	for _, a := range attrs {
		var v uint64
		switch len(a.Value) {
		case 4:
			v = uint64(nl.NativeEndian().Uint32(a.Value))
		case 8:
			v = nl.NativeEndian().Uint64(a.Value)
		default:
			continue // padding and unknown attributes
		}
		switch a.Attr.Type & nlaTypeMask {
		case statsConns:
			st.Conns = v
		case statsInPkts:
			st.InPkts = v
		case statsOutPkts:
			st.OutPkts = v
		case statsInBytes:
			st.InBytes = v
		case statsOutBytes:
			st.OutBytes = v
		case statsCPS:
			st.CPS = v
		case statsInPPS:
			st.InPPS = v
		case statsOutPPS:
			st.OutPPS = v
		case statsInBPS:
			st.InBPS = v
		case statsOutBPS:
			st.OutBPS = v
		}
	}
	return st, nil
}

// parseServiceMsg decodes one message of a service dump (or the answer to
// a service query): a generic netlink header and an IPVS_CMD_ATTR_SERVICE
// attribute, into moby's service type (as moby reads it) and its stats,
// 64-bit when the kernel sends them.
func parseServiceMsg(msg []byte) (*mobyipvs.Service, lb.Stats, error) {
	if len(msg) < nl.SizeofGenlmsg {
		return nil, lb.Stats{}, fmt.Errorf("short message (%d bytes)", len(msg))
	}
	top, err := nl.ParseRouteAttr(msg[nl.SizeofGenlmsg:])
	if err != nil {
		return nil, lb.Stats{}, err
	}
	for _, t := range top {
		if t.Attr.Type&nlaTypeMask == cmdAttrService {
			return parseServiceAttrs(t.Value)
		}
	}
	return nil, lb.Stats{}, fmt.Errorf("no service attribute in message")
}

func parseServiceAttrs(b []byte) (*mobyipvs.Service, lb.Stats, error) {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return nil, lb.Stats{}, err
	}
	ms := &mobyipvs.Service{}
	var addr, stats, stats64 []byte
	for _, a := range attrs {
		v := a.Value
		var bad bool
		switch a.Attr.Type & nlaTypeMask {
		case svcAttrAF:
			ms.AddressFamily, bad = u16(v)
		case svcAttrProtocol:
			ms.Protocol, bad = u16(v)
		case svcAttrAddr:
			addr = v
		case svcAttrPort:
			bad = len(v) < 2
			if !bad {
				ms.Port = binary.BigEndian.Uint16(v)
			}
		case svcAttrFWMark:
			ms.FWMark, bad = u32(v)
		case svcAttrSchedName:
			ms.SchedName = cString(v)
		case svcAttrPEName:
			ms.PEName = cString(v)
		case svcAttrFlags:
			ms.Flags, bad = u32(v) // struct ip_vs_flags: flags, then mask
		case svcAttrTimeout:
			ms.Timeout, bad = u32(v)
		case svcAttrNetmask:
			ms.Netmask, bad = u32(v)
		case svcAttrStats:
			stats = v
		case svcAttrStats64:
			stats64 = v
		}
		if bad {
			return nil, lb.Stats{}, fmt.Errorf("service attribute %d: bad length %d", a.Attr.Type&nlaTypeMask, len(v))
		}
	}
	if addr != nil {
		a, err := addrOf(addr, ms.AddressFamily)
		if err != nil {
			return nil, lb.Stats{}, err
		}
		ms.Address = ipOf(a)
	}
	if stats64 != nil {
		stats = stats64
	}
	var st lb.Stats
	if stats != nil {
		if st, err = parseStats(stats); err != nil {
			return nil, lb.Stats{}, err
		}
	}
	return ms, st, nil
}

// cString returns the string before the first NUL of b.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// destAttr encodes a destination as the IPVS_CMD_ATTR_DEST attribute. A
// full attribute (for adding and updating) carries the settings; deleting
// needs only the address, family and port.
func destAttr(d kernelDest, full bool) *nl.RtAttr {
	a := nl.NewRtAttr(cmdAttrDest, nil)
	a.AddRtAttr(destAttrAddrFamily, nl.Uint16Attr(d.family))
	a.AddRtAttr(destAttrAddr, d.addr.AsSlice())
	a.AddRtAttr(destAttrPort, be16(d.port))
	if !full {
		return a
	}
	a.AddRtAttr(destAttrFwdMethod, nl.Uint32Attr(d.fwd))
	a.AddRtAttr(destAttrWeight, nl.Uint32Attr(d.weight))
	a.AddRtAttr(destAttrUThresh, nl.Uint32Attr(d.upper))
	a.AddRtAttr(destAttrLThresh, nl.Uint32Attr(d.lower))
	if d.tunType != tunIPIP || d.tunPort != 0 || d.tunFlags != 0 {
		a.AddRtAttr(destAttrTunType, nl.Uint8Attr(d.tunType))
		a.AddRtAttr(destAttrTunPort, be16(d.tunPort))
		a.AddRtAttr(destAttrTunFlags, nl.Uint16Attr(d.tunFlags))
	}
	return a
}

// parseDestMsg decodes one message of a destination dump: a generic
// netlink header and an IPVS_CMD_ATTR_DEST attribute. svcFamily is the
// family to assume when the kernel sends none (before Linux 3.18).
func parseDestMsg(msg []byte, svcFamily uint16) (kernelDest, error) {
	if len(msg) < nl.SizeofGenlmsg {
		return kernelDest{}, fmt.Errorf("short message (%d bytes)", len(msg))
	}
	top, err := nl.ParseRouteAttr(msg[nl.SizeofGenlmsg:])
	if err != nil {
		return kernelDest{}, err
	}
	for _, t := range top {
		if t.Attr.Type&nlaTypeMask == cmdAttrDest {
			return parseDestAttrs(t.Value, svcFamily)
		}
	}
	return kernelDest{}, fmt.Errorf("no destination attribute in message")
}

func parseDestAttrs(b []byte, svcFamily uint16) (kernelDest, error) {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return kernelDest{}, err
	}
	d := kernelDest{family: svcFamily}
	var addr, stats, stats64 []byte
	for _, a := range attrs {
		v := a.Value
		var bad bool
		switch a.Attr.Type & nlaTypeMask {
		case destAttrAddr:
			addr = v
		case destAttrAddrFamily:
			d.family, bad = u16(v)
		case destAttrPort:
			bad = len(v) < 2
			if !bad {
				d.port = binary.BigEndian.Uint16(v)
			}
		case destAttrFwdMethod:
			d.fwd, bad = u32(v)
		case destAttrWeight:
			d.weight, bad = u32(v)
		case destAttrUThresh:
			d.upper, bad = u32(v)
		case destAttrLThresh:
			d.lower, bad = u32(v)
		case destAttrActiveConns:
			d.active, bad = u32(v)
		case destAttrInactConns:
			d.inactive, bad = u32(v)
		case destAttrPersistConns:
			d.persisted, bad = u32(v)
		case destAttrTunType:
			bad = len(v) < 1
			if !bad {
				d.tunType = v[0]
			}
		case destAttrTunPort:
			bad = len(v) < 2
			if !bad {
				d.tunPort = binary.BigEndian.Uint16(v)
			}
		case destAttrTunFlags:
			d.tunFlags, bad = u16(v)
		case destAttrStats:
			stats = v
		case destAttrStats64:
			stats64 = v
		}
		if bad {
			return kernelDest{}, fmt.Errorf("destination attribute %d: bad length %d", a.Attr.Type&nlaTypeMask, len(v))
		}
	}
	if addr == nil {
		return kernelDest{}, fmt.Errorf("destination without an address")
	}
	if d.addr, err = addrOf(addr, d.family); err != nil {
		return kernelDest{}, err
	}
	if stats64 != nil {
		stats = stats64
	}
	if stats != nil {
		if d.stats, err = parseStats(stats); err != nil {
			return kernelDest{}, err
		}
	}
	return d, nil
}

func u16(v []byte) (uint16, bool) {
	if len(v) < 2 {
		return 0, true
	}
	return nl.NativeEndian().Uint16(v), false
}

func u32(v []byte) (uint32, bool) {
	if len(v) < 4 {
		return 0, true
	}
	return nl.NativeEndian().Uint32(v), false
}

// genl sends IPVS generic netlink requests on its own socket.
type genl struct {
	family uint16
	sock   *nl.SocketHandle
}

func (g *genl) request(cmd uint8, flags int, attrs ...nl.NetlinkRequestData) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(g.family), flags)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_GENERIC: g.sock}
	req.AddData(&nl.Genlmsg{Command: cmd, Version: ipvsGenlVersion})
	for _, a := range attrs {
		req.AddData(a)
	}
	return req
}

// do runs a command and waits for the kernel's acknowledgement.
func (g *genl) do(cmd uint8, attrs ...nl.NetlinkRequestData) error {
	_, err := g.request(cmd, unix.NLM_F_ACK, attrs...).Execute(unix.NETLINK_GENERIC, 0)
	return err
}

// familyID asks the kernel for the id of the IPVS generic netlink family.
// Family ids are global, not per network namespace.
func familyID() (uint16, error) {
	req := nl.NewNetlinkRequest(nl.GENL_ID_CTRL, unix.NLM_F_ACK)
	req.AddData(&nl.Genlmsg{Command: nl.GENL_CTRL_CMD_GETFAMILY, Version: nl.GENL_CTRL_VERSION})
	req.AddData(nl.NewRtAttr(nl.GENL_CTRL_ATTR_FAMILY_NAME, nl.ZeroTerminated(ipvsGenlName)))
	msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofGenlmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofGenlmsg:])
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.Attr.Type == nl.GENL_CTRL_ATTR_FAMILY_ID {
				if id, bad := u16(a.Value); !bad {
					return id, nil
				}
			}
		}
	}
	return 0, syscall.ENOENT
}
