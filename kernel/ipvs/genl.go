package ipvs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
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

// rawAttr is an encoded attribute; as nl.NetlinkRequestData it compares
// with vishvananda/netlink's encoding in tests.
type rawAttr []byte

func (a rawAttr) Len() int          { return len(a) }
func (a rawAttr) Serialize() []byte { return a }

// Attribute encoding straight into a buffer: the batch path encodes
// thousands of requests, and building nl.RtAttr trees for them costs more
// than the kernel's work under software emulation.

// appendAttr appends an attribute with value v, padded to 4 bytes.
func appendAttr(b []byte, typ uint16, v ...byte) []byte {
	l := unix.SizeofRtAttr + len(v)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, v...)
	for range nlaAlign(l) - l {
		b = append(b, 0)
	}
	return b
}

func appendU8(b []byte, typ uint16, v uint8) []byte { return appendAttr(b, typ, v) }

// appendString appends a NUL-terminated string attribute.
func appendString(b []byte, typ uint16, s string) []byte {
	l := unix.SizeofRtAttr + len(s) + 1
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(append(b, s...), 0)
	for range nlaAlign(l) - l {
		b = append(b, 0)
	}
	return b
}

func appendU16(b []byte, typ uint16, v uint16) []byte {
	var x [2]byte
	binary.NativeEndian.PutUint16(x[:], v)
	return appendAttr(b, typ, x[:]...)
}

func appendBE16(b []byte, typ uint16, v uint16) []byte {
	return appendAttr(b, typ, byte(v>>8), byte(v))
}

func appendU32(b []byte, typ uint16, v uint32) []byte {
	var x [4]byte
	binary.NativeEndian.PutUint32(x[:], v)
	return appendAttr(b, typ, x[:]...)
}

// appendAddr appends an address attribute: 4 bytes for IPv4, 16 for IPv6.
func appendAddr(b []byte, typ uint16, a netip.Addr) []byte {
	if a.Is4() {
		x := a.As4()
		return appendAttr(b, typ, x[:]...)
	}
	x := a.As16()
	return appendAttr(b, typ, x[:]...)
}

// beginNest appends the header of a nested attribute; endNest sets its
// length once its contents are appended.
func beginNest(b []byte, typ uint16) ([]byte, int) {
	return append(b, 0, 0, byte(typ), byte(typ>>8)), len(b)
}

func endNest(b []byte, start int) []byte {
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	return b
}

func nlaAlign(n int) int { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }

// appendKey appends a service key's attributes: the family, then the
// firewall mark or the protocol, address and port.
func appendKey(b []byte, k kernelKey) []byte {
	b = appendU16(b, svcAttrAF, k.family)
	if k.fwmark != 0 {
		return appendU32(b, svcAttrFWMark, k.fwmark)
	}
	b = appendU16(b, svcAttrProtocol, k.proto)
	b = appendAddr(b, svcAttrAddr, k.addr)
	return appendBE16(b, svcAttrPort, k.port)
}

// appendKeyAttr appends a service key as the IPVS_CMD_ATTR_SERVICE
// attribute that names a service in destination and delete commands.
func appendKeyAttr(b []byte, k kernelKey) []byte {
	b, start := beginNest(b, cmdAttrService)
	return endNest(appendKey(b, k), start)
}

// keyAttr is appendKeyAttr as an attribute of its own.
func keyAttr(k kernelKey) rawAttr { return appendKeyAttr(nil, k) }

// appendServiceAttr appends a service with its settings as the
// IPVS_CMD_ATTR_SERVICE attribute of add and update commands, as
// moby/ipvs encodes it: the key, then scheduler, flags (with a mask of
// all ones, so that every flag is set or cleared), timeout and netmask.
func appendServiceAttr(b []byte, k kernelKey, ms *mobyipvs.Service) []byte {
	b, start := beginNest(b, cmdAttrService)
	b = appendKey(b, k)
	b = appendString(b, svcAttrSchedName, ms.SchedName)
	if ms.PEName != "" {
		b = appendString(b, svcAttrPEName, ms.PEName)
	}
	var flags [8]byte
	binary.NativeEndian.PutUint32(flags[0:4], ms.Flags)
	binary.NativeEndian.PutUint32(flags[4:8], 0xffffffff)
	b = appendAttr(b, svcAttrFlags, flags[:]...)
	b = appendU32(b, svcAttrTimeout, ms.Timeout)
	b = appendU32(b, svcAttrNetmask, ms.Netmask)
	return endNest(b, start)
}

// serviceAttr is appendServiceAttr as an attribute of its own.
func serviceAttr(k kernelKey, ms *mobyipvs.Service) rawAttr { return appendServiceAttr(nil, k, ms) }

// appendDestAttr appends a destination as the IPVS_CMD_ATTR_DEST
// attribute. A full attribute (for adding and updating) carries the
// settings; deleting needs only the address, family and port.
func appendDestAttr(b []byte, d kernelDest, full bool) []byte {
	b, start := beginNest(b, cmdAttrDest)
	b = appendU16(b, destAttrAddrFamily, d.family)
	b = appendAddr(b, destAttrAddr, d.addr)
	b = appendBE16(b, destAttrPort, d.port)
	if full {
		b = appendU32(b, destAttrFwdMethod, d.fwd)
		b = appendU32(b, destAttrWeight, d.weight)
		b = appendU32(b, destAttrUThresh, d.upper)
		b = appendU32(b, destAttrLThresh, d.lower)
		if d.tunType != tunIPIP || d.tunPort != 0 || d.tunFlags != 0 {
			b = appendU8(b, destAttrTunType, d.tunType)
			b = appendBE16(b, destAttrTunPort, d.tunPort)
			b = appendU16(b, destAttrTunFlags, d.tunFlags)
		}
	}
	return endNest(b, start)
}

// destAttr is appendDestAttr as an attribute of its own.
func destAttr(d kernelDest, full bool) rawAttr { return appendDestAttr(nil, d, full) }

// beginRequest appends the netlink and generic netlink headers of a
// request for cmd (NLM_F_REQUEST is added to flags); endRequest sets its
// length once its attributes are appended.
func beginRequest(b []byte, family, flags uint16, seq uint32, cmd uint8) ([]byte, int) {
	start := len(b)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = binary.NativeEndian.AppendUint16(b, family)
	b = binary.NativeEndian.AppendUint16(b, flags|unix.NLM_F_REQUEST)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0) // the kernel fills in the port id
	return append(b, cmd, ipvsGenlVersion, 0, 0), start
}

func endRequest(b []byte, start int) []byte {
	binary.NativeEndian.PutUint32(b[start:], uint32(len(b)-start))
	return b
}

// appendRequest appends one request with the given attributes.
func appendRequest(b []byte, family, flags uint16, seq uint32, cmd uint8, attrs ...rawAttr) []byte {
	b, start := beginRequest(b, family, flags, seq, cmd)
	for _, a := range attrs {
		b = append(b, a...)
	}
	return endRequest(b, start)
}

// forAttrs calls fn with the type (without the nested and byte-order bits)
// and value of each attribute in b, without allocating.
func forAttrs(b []byte, fn func(typ uint16, v []byte) error) error {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return fmt.Errorf("bad attribute length %d (%d bytes left)", l, len(b))
		}
		if err := fn(binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask, b[unix.SizeofRtAttr:l]); err != nil {
			return err
		}
		b = b[min(nlaAlign(l), len(b)):]
	}
	return nil
}

// topAttr returns the value of the top-level attribute typ of a generic
// netlink message's payload.
func topAttr(msg []byte, typ uint16) ([]byte, error) {
	if len(msg) < nl.SizeofGenlmsg {
		return nil, fmt.Errorf("short message (%d bytes)", len(msg))
	}
	var out []byte
	err := forAttrs(msg[nl.SizeofGenlmsg:], func(t uint16, v []byte) error {
		if t == typ && out == nil {
			out = v
		}
		return nil
	})
	if err == nil && out == nil {
		err = errNoAttr
	}
	return out, err
}

var errNoAttr = errors.New("attribute missing")

// parseStats decodes a stats attribute of either width: each counter is
// read by its length, so IPVS_*_ATTR_STATS64 gives the full counters and
// IPVS_*_ATTR_STATS their low 32 bits.
func parseStats(b []byte) (lb.Stats, error) {
	var st lb.Stats
	err := forAttrs(b, func(typ uint16, v []byte) error {
		var x uint64
		switch len(v) {
		case 4:
			x = uint64(binary.NativeEndian.Uint32(v))
		case 8:
			x = binary.NativeEndian.Uint64(v)
		default:
			return nil // padding and unknown attributes
		}
		switch typ {
		case statsConns:
			st.Conns = x
		case statsInPkts:
			st.InPkts = x
		case statsOutPkts:
			st.OutPkts = x
		case statsInBytes:
			st.InBytes = x
		case statsOutBytes:
			st.OutBytes = x
		case statsCPS:
			st.CPS = x
		case statsInPPS:
			st.InPPS = x
		case statsOutPPS:
			st.OutPPS = x
		case statsInBPS:
			st.InBPS = x
		case statsOutBPS:
			st.OutBPS = x
		}
		return nil
	})
	if err != nil {
		return lb.Stats{}, fmt.Errorf("stats: %w", err)
	}
	return st, nil
}

// parseServiceMsg decodes one message of a service dump (or the answer to
// a service query): a generic netlink header and an IPVS_CMD_ATTR_SERVICE
// attribute, into moby's service type (as moby reads it) and its stats,
// 64-bit when the kernel sends them.
func parseServiceMsg(msg []byte) (*mobyipvs.Service, lb.Stats, error) {
	v, err := topAttr(msg, cmdAttrService)
	if errors.Is(err, errNoAttr) {
		return nil, lb.Stats{}, errors.New("no service attribute in message")
	}
	if err != nil {
		return nil, lb.Stats{}, err
	}
	return parseServiceAttrs(v)
}

func parseServiceAttrs(b []byte) (*mobyipvs.Service, lb.Stats, error) {
	ms := &mobyipvs.Service{}
	var addr, stats, stats64 []byte
	err := forAttrs(b, func(typ uint16, v []byte) error {
		var bad bool
		switch typ {
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
			return fmt.Errorf("service attribute %d: bad length %d", typ, len(v))
		}
		return nil
	})
	if err != nil {
		return nil, lb.Stats{}, err
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

// parseDestMsg decodes one message of a destination dump: a generic
// netlink header and an IPVS_CMD_ATTR_DEST attribute. svcFamily is the
// family to assume when the kernel sends none (before Linux 3.18).
func parseDestMsg(msg []byte, svcFamily uint16) (kernelDest, error) {
	v, err := topAttr(msg, cmdAttrDest)
	if errors.Is(err, errNoAttr) {
		return kernelDest{}, errors.New("no destination attribute in message")
	}
	if err != nil {
		return kernelDest{}, err
	}
	return parseDestAttrs(v, svcFamily)
}

func parseDestAttrs(b []byte, svcFamily uint16) (kernelDest, error) {
	d := kernelDest{family: svcFamily}
	var addr, stats, stats64 []byte
	err := forAttrs(b, func(typ uint16, v []byte) error {
		var bad bool
		switch typ {
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
			return fmt.Errorf("destination attribute %d: bad length %d", typ, len(v))
		}
		return nil
	})
	if err != nil {
		return kernelDest{}, err
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
	return binary.NativeEndian.Uint16(v), false
}

func u32(v []byte) (uint32, bool) {
	if len(v) < 4 {
		return 0, true
	}
	return binary.NativeEndian.Uint32(v), false
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
