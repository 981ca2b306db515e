package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The IPVS generic netlink interface (include/uapi/linux/ip_vs.h), as far
// as the destination commands need it. moby/ipvs v1.1.0 neither sends nor
// reads a destination's tunnel type, port and flags, and sends no address
// family (so it cannot add or delete an IPv6 real server of an IPv4
// tunnel service); the adapter encodes destination commands itself.
const (
	ipvsGenlName    = "IPVS"
	ipvsGenlVersion = 1

	cmdNewDest = 5
	cmdSetDest = 6
	cmdDelDest = 7
	cmdGetDest = 8

	cmdAttrService = 1
	cmdAttrDest    = 2

	svcAttrAF       = 1
	svcAttrProtocol = 2
	svcAttrAddr     = 3
	svcAttrPort     = 4
	svcAttrFWMark   = 5

	destAttrAddr         = 1
	destAttrPort         = 2
	destAttrFwdMethod    = 3
	destAttrWeight       = 4
	destAttrUThresh      = 5
	destAttrLThresh      = 6
	destAttrActiveConns  = 7
	destAttrInactConns   = 8
	destAttrPersistConns = 9
	destAttrAddrFamily   = 11
	destAttrTunType      = 13
	destAttrTunPort      = 14
	destAttrTunFlags     = 15
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
	var addr []byte
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

// dests dumps the destinations of the service k.
func (g *genl) dests(k kernelKey) ([]kernelDest, error) {
	var msgs [][]byte
	var err error
	for range 5 {
		msgs, err = g.request(cmdGetDest, unix.NLM_F_DUMP, keyAttr(k)).Execute(unix.NETLINK_GENERIC, 0)
		if !errors.Is(err, nl.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	out := make([]kernelDest, 0, len(msgs))
	for _, m := range msgs {
		d, err := parseDestMsg(m, k.family)
		if err != nil {
			return nil, fmt.Errorf("parse destination: %w", err)
		}
		out = append(out, d)
	}
	return out, nil
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
