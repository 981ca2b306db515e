package ipvs

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"net"
	"net/netip"

	mobyipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

// Service flags of the kernel (IP_VS_SVC_F_*).
const (
	svcFlagPersistent = 0x0001
	svcFlagHashed     = 0x0002 // set by the kernel on every service
	svcFlagOnePacket  = 0x0004
	svcFlagSched1     = 0x0008 // sh-fallback, mh-fallback
	svcFlagSched2     = 0x0010 // sh-port, mh-port
)

// Forwarding methods of the kernel (IP_VS_CONN_F_*, under IP_VS_CONN_F_FWD_MASK).
const (
	fwdMask   = 0x7
	fwdMasq   = 0
	fwdTunnel = 2 // 1 is the local node, which vipd never writes
	fwdDirect = 3
)

// Tunnel types and checksum flags of the kernel (IP_VS_CONN_F_TUNNEL_TYPE_*
// and IP_VS_TUNNEL_ENCAP_FLAG_*).
const (
	tunIPIP = 0
	tunGUE  = 1
	tunGRE  = 2

	tunFlagCsum    = 1 << 0
	tunFlagRemCsum = 1 << 1
)

// IP protocol numbers of the protocols IPVS balances.
const (
	protoTCP  = unix.IPPROTO_TCP
	protoUDP  = unix.IPPROTO_UDP
	protoSCTP = unix.IPPROTO_SCTP
)

// kernelKey is a service key as the kernel's netlink attributes carry it.
type kernelKey struct {
	family uint16
	proto  uint16
	addr   netip.Addr // invalid for firewall-mark services
	port   uint16
	fwmark uint32
}

func toKernelFamily(f lb.Family) (uint16, error) {
	switch f {
	case lb.IPv4:
		return unix.AF_INET, nil
	case lb.IPv6:
		return unix.AF_INET6, nil
	}
	return 0, fmt.Errorf("unknown address family %s", f)
}

func fromKernelFamily(af uint16) (lb.Family, error) {
	switch af {
	case unix.AF_INET:
		return lb.IPv4, nil
	case unix.AF_INET6:
		return lb.IPv6, nil
	}
	return 0, fmt.Errorf("unknown address family %d", af)
}

func toKernelProto(p lb.Proto) (uint16, error) {
	switch p {
	case lb.TCP:
		return protoTCP, nil
	case lb.UDP:
		return protoUDP, nil
	case lb.SCTP:
		return protoSCTP, nil
	}
	return 0, fmt.Errorf("unknown protocol %s", p)
}

func fromKernelProto(p uint16) (lb.Proto, error) {
	switch p {
	case protoTCP:
		return lb.TCP, nil
	case protoUDP:
		return lb.UDP, nil
	case protoSCTP:
		return lb.SCTP, nil
	}
	return 0, fmt.Errorf("unknown ip protocol %d", p)
}

// toKernelKey checks k and converts it to the kernel's fields.
func toKernelKey(k lb.ServiceKey) (kernelKey, error) {
	af, err := toKernelFamily(k.Family)
	if err != nil {
		return kernelKey{}, err
	}
	if k.FWMark != 0 {
		return kernelKey{family: af, fwmark: k.FWMark}, nil
	}
	proto, err := toKernelProto(k.Proto)
	if err != nil {
		return kernelKey{}, err
	}
	addr, err := familyAddr(k.Addr, k.Family)
	if err != nil {
		return kernelKey{}, fmt.Errorf("service address: %w", err)
	}
	return kernelKey{family: af, proto: proto, addr: addr, port: k.Port}, nil
}

// familyAddr returns a unicast address of family fam in its plain form
// (IPv4 unmapped).
func familyAddr(a netip.Addr, fam lb.Family) (netip.Addr, error) {
	switch {
	case !a.IsValid():
		return netip.Addr{}, fmt.Errorf("no address")
	case a.Zone() != "":
		return netip.Addr{}, fmt.Errorf("%s has a zone", a)
	case lb.FamilyOf(a) != fam:
		return netip.Addr{}, fmt.Errorf("%s is not an %s address", a, fam)
	}
	return a.Unmap(), nil
}

// ipOf returns a as a net.IP of 4 or 16 bytes.
func ipOf(a netip.Addr) net.IP {
	return net.IP(a.AsSlice())
}

// addrOf converts a kernel address of family af to a netip.Addr. The
// kernel sends IPv4 addresses in the first 4 bytes of a 16-byte field.
func addrOf(b []byte, af uint16) (netip.Addr, error) {
	switch {
	case af == unix.AF_INET && len(b) >= 4:
		return netip.AddrFrom4([4]byte(b[:4])), nil
	case af == unix.AF_INET6 && len(b) >= 16:
		return netip.AddrFrom16([16]byte(b[:16])), nil
	}
	return netip.Addr{}, fmt.Errorf("bad address %x for address family %d", b, af)
}

// toKernelService converts s to moby's service. A service without
// persistence is written with the kernel's default netmask (/32 or /128,
// which IPv6 services need even then); sched flags are checked against the
// scheduler they belong to.
func toKernelService(s lb.Service) (*mobyipvs.Service, error) {
	k, err := toKernelKey(s.Key)
	if err != nil {
		return nil, err
	}
	if s.Scheduler == "" {
		return nil, fmt.Errorf("no scheduler")
	}
	ms := &mobyipvs.Service{
		AddressFamily: k.family,
		Protocol:      k.proto,
		Port:          k.port,
		FWMark:        k.fwmark,
		SchedName:     s.Scheduler,
		Timeout:       s.Persistent,
	}
	if k.addr.IsValid() {
		ms.Address = ipOf(k.addr)
	}
	flags, err := toKernelSchedFlags(s.Flags, s.Scheduler)
	if err != nil {
		return nil, err
	}
	if s.OnePacket {
		flags |= svcFlagOnePacket
	}
	maxBits := 32
	if s.Key.Family == lb.IPv6 {
		maxBits = 128
	}
	bitsLen := maxBits
	if s.Persistent != 0 {
		flags |= svcFlagPersistent
		if s.Netmask < 0 || s.Netmask > maxBits {
			return nil, fmt.Errorf("persistence netmask /%d is outside /1../%d", s.Netmask, maxBits)
		}
		if s.Netmask != 0 {
			bitsLen = s.Netmask
		}
	}
	ms.Flags = flags
	ms.Netmask = toKernelNetmask(bitsLen, s.Key.Family)
	return ms, nil
}

// toKernelNetmask encodes a persistence prefix length. For IPv6 the
// kernel takes the prefix length itself; for IPv4 a mask in network byte
// order, which moby sends in host byte order: the uint32 whose native
// bytes are the mask's (0xffffffff for /32, 0x00ffffff for /24 on x86).
func toKernelNetmask(ones int, fam lb.Family) uint32 {
	if fam == lb.IPv6 {
		return uint32(ones)
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], ^uint32(0)<<(32-ones))
	if ones == 0 {
		b = [4]byte{}
	}
	return binary.NativeEndian.Uint32(b[:])
}

// fromKernelNetmask decodes a netmask the kernel reports into a prefix
// length. A non-contiguous IPv4 mask (which ipvsadm accepts) reads as its
// leading ones.
func fromKernelNetmask(m uint32, fam lb.Family) int {
	if fam == lb.IPv6 {
		return int(m)
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], m)
	return bits.LeadingZeros32(^binary.BigEndian.Uint32(b[:]))
}

func toKernelSchedFlags(f lb.SchedFlags, sched string) (uint32, error) {
	var out uint32
	for _, m := range []struct {
		flag lb.SchedFlags
		bit  uint32
	}{
		{lb.SHFallback, svcFlagSched1},
		{lb.SHPort, svcFlagSched2},
		{lb.MHFallback, svcFlagSched1},
		{lb.MHPort, svcFlagSched2},
	} {
		if f&m.flag == 0 {
			continue
		}
		if m.flag.Scheduler() != sched {
			return 0, fmt.Errorf("scheduler flag %s needs scheduler %s, not %s", m.flag, m.flag.Scheduler(), sched)
		}
		out |= m.bit
		f &^= m.flag
	}
	if f != 0 {
		return 0, fmt.Errorf("unknown scheduler flags %#x", uint8(f))
	}
	return out, nil
}

func fromKernelSchedFlags(flags uint32, sched string) lb.SchedFlags {
	var fallback, port lb.SchedFlags
	switch sched {
	case "sh":
		fallback, port = lb.SHFallback, lb.SHPort
	case "mh":
		fallback, port = lb.MHFallback, lb.MHPort
	default:
		// Other schedulers ignore the bits; lb has no name for them.
		return 0
	}
	var f lb.SchedFlags
	if flags&svcFlagSched1 != 0 {
		f |= fallback
	}
	if flags&svcFlagSched2 != 0 {
		f |= port
	}
	return f
}

// fromKernelService converts a service the kernel reported. The result
// compares equal to the lb.Service it was written from: the hashed flag is
// dropped, and the timeout and netmask of a service without persistence
// read as zero.
func fromKernelService(ms *mobyipvs.Service) (lb.Service, error) {
	fam, err := fromKernelFamily(ms.AddressFamily)
	if err != nil {
		return lb.Service{}, err
	}
	s := lb.Service{Key: lb.ServiceKey{Family: fam}, Scheduler: ms.SchedName}
	if ms.FWMark != 0 {
		s.Key.FWMark = ms.FWMark
	} else {
		if s.Key.Proto, err = fromKernelProto(ms.Protocol); err != nil {
			return lb.Service{}, err
		}
		a, ok := netip.AddrFromSlice(ms.Address)
		if !ok {
			return lb.Service{}, fmt.Errorf("bad service address %x", []byte(ms.Address))
		}
		s.Key.Addr = a.Unmap()
		s.Key.Port = ms.Port
	}
	flags := ms.Flags &^ svcFlagHashed
	s.Flags = fromKernelSchedFlags(flags, ms.SchedName)
	s.OnePacket = flags&svcFlagOnePacket != 0
	if flags&svcFlagPersistent != 0 {
		s.Persistent = ms.Timeout
		s.Netmask = fromKernelNetmask(ms.Netmask, fam)
	}
	return s, nil
}

// kernelDest is a destination as the kernel's netlink attributes carry it.
type kernelDest struct {
	family    uint16
	addr      netip.Addr
	port      uint16
	fwd       uint32
	weight    uint32
	upper     uint32
	lower     uint32
	tunType   uint8
	tunPort   uint16
	tunFlags  uint16
	active    uint32
	inactive  uint32
	persisted uint32
	stats     lb.Stats
}

// toKernelDest converts d. Tunnel attributes are set only for GUE and GRE
// tunnels: the kernel's defaults (all zero) are an IPIP tunnel, and kernels
// before 5.3 know no tunnel attributes at all.
func toKernelDest(d lb.Destination) (kernelDest, error) {
	a := d.Addr.Addr()
	if !a.IsValid() || a.Zone() != "" {
		return kernelDest{}, fmt.Errorf("bad destination address %s", d.Addr)
	}
	a = a.Unmap()
	af, _ := toKernelFamily(lb.FamilyOf(a))
	kd := kernelDest{family: af, addr: a, port: d.Addr.Port(), upper: d.Upper, lower: d.Lower}
	if d.Weight < 0 || d.Weight > math.MaxInt32 {
		return kernelDest{}, fmt.Errorf("weight %d is out of range", d.Weight)
	}
	kd.weight = uint32(d.Weight)
	// The kernel compares thresholds with int connection counts; since
	// 2025 (also in 6.1.y) it refuses larger ones with a bare EINVAL.
	if d.Upper > math.MaxInt32 {
		return kernelDest{}, fmt.Errorf("upper threshold %d is above the kernel's limit %d", d.Upper, math.MaxInt32)
	}
	// The kernel refuses a lower threshold above the upper one with
	// ERANGE, also when the upper one is 0 (no limit).
	if d.Lower > d.Upper {
		return kernelDest{}, fmt.Errorf("lower threshold %d is above upper threshold %d (the kernel needs lower <= upper, also without an upper threshold)", d.Lower, d.Upper)
	}
	switch d.Forward {
	case lb.Masq:
		kd.fwd = fwdMasq
	case lb.DirectRoute:
		kd.fwd = fwdDirect
	case lb.Tunnel:
		kd.fwd = fwdTunnel
	default:
		return kernelDest{}, fmt.Errorf("unknown forwarding method %s", d.Forward)
	}
	if d.Forward != lb.Tunnel {
		return kd, nil
	}
	switch d.Tunnel {
	case lb.IPIP:
		return kd, nil
	case lb.GUE:
		if d.TunnelPort == 0 {
			return kernelDest{}, fmt.Errorf("tunnel gue needs a tunnel port")
		}
		kd.tunType = tunGUE
	case lb.GRE:
		kd.tunType = tunGRE
	default:
		return kernelDest{}, fmt.Errorf("unknown tunnel type %s", d.Tunnel)
	}
	kd.tunPort = d.TunnelPort
	switch d.TunnelCsum {
	case lb.CsumNone:
	case lb.Csum:
		kd.tunFlags = tunFlagCsum
	case lb.RemCsum:
		kd.tunFlags = tunFlagRemCsum
	default:
		return kernelDest{}, fmt.Errorf("unknown tunnel checksum mode %s", d.TunnelCsum)
	}
	return kd, nil
}

// fromKernelDest converts a destination the kernel reported. Forwarding
// methods lb has no name for (local node, bypass) read as the zero Forward,
// so that a planner compares them unequal to anything vipd writes. Tunnel
// fields are kept only for tunnel forwarding, as lb.Destination.Settings
// does. The counters are the caller's to place (Stats is nil).
func fromKernelDest(kd kernelDest) lb.Destination {
	d := lb.Destination{
		Addr:          netip.AddrPortFrom(kd.addr.Unmap(), kd.port),
		Weight:        int(kd.weight),
		Upper:         kd.upper,
		Lower:         kd.lower,
		ActiveConns:   kd.active,
		InactiveConns: kd.inactive,
	}
	switch kd.fwd & fwdMask {
	case fwdMasq:
		d.Forward = lb.Masq
	case fwdDirect:
		d.Forward = lb.DirectRoute
	case fwdTunnel:
		d.Forward = lb.Tunnel
	}
	if d.Forward != lb.Tunnel {
		return d
	}
	d.Tunnel = lb.TunnelType(kd.tunType) // the kernel's numbering is lb's
	d.TunnelPort = kd.tunPort
	switch kd.tunFlags {
	case 0:
		d.TunnelCsum = lb.CsumNone
	case tunFlagCsum:
		d.TunnelCsum = lb.Csum
	case tunFlagRemCsum:
		d.TunnelCsum = lb.RemCsum
	default:
		d.TunnelCsum = lb.TunnelCsum(kd.tunFlags)
	}
	return d
}
