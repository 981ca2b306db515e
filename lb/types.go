// Package lb is the pure core of vipd: it turns a validated configuration
// into the desired kernel state, diffs that against an observed state into
// an ordered plan of operations, and applies plans through small interfaces
// that adapters implement. It never talks to the kernel itself.
package lb

import (
	"cmp"
	"fmt"
	"net/netip"
	"strings"
)

// Proto is an IPVS service protocol.
type Proto uint8

// The protocols IPVS balances.
const (
	TCP Proto = iota + 1
	UDP
	SCTP
)

// String returns the protocol's lowercase name.
func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	case 0:
		return "none"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// ParseProto parses a protocol name.
func ParseProto(s string) (Proto, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return TCP, nil
	case "udp":
		return UDP, nil
	case "sctp":
		return SCTP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want tcp, udp or sctp)", s)
}

// Family is an address family: 4 or 6.
type Family uint8

// The address families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// FamilyOf returns the family of addr.
func FamilyOf(addr netip.Addr) Family {
	if addr.Is4() || addr.Is4In6() {
		return IPv4
	}
	return IPv6
}

// String returns "ipv4" or "ipv6".
func (f Family) String() string {
	switch f {
	case IPv4:
		return "ipv4"
	case IPv6:
		return "ipv6"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

// ServiceKey identifies an IPVS virtual service: either an address, port
// and protocol, or a firewall mark within an address family.
type ServiceKey struct {
	Family Family
	Proto  Proto // zero for firewall-mark services
	Addr   netip.Addr
	Port   uint16
	FWMark uint32
}

// String formats the key the way ipvsadm names services.
func (k ServiceKey) String() string {
	if k.FWMark != 0 {
		return fmt.Sprintf("fwmark %d/%s", k.FWMark, k.Family)
	}
	return fmt.Sprintf("%s %s", k.Proto, netip.AddrPortFrom(k.Addr, k.Port))
}

// Compare orders keys: families, then firewall marks, then address, port
// and protocol. It gives dumps and plans a stable order.
func (k ServiceKey) Compare(o ServiceKey) int {
	switch {
	case k.Family != o.Family:
		return cmp.Compare(k.Family, o.Family)
	case k.FWMark != o.FWMark:
		return cmp.Compare(k.FWMark, o.FWMark)
	}
	if c := k.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if k.Port != o.Port {
		return cmp.Compare(k.Port, o.Port)
	}
	return cmp.Compare(k.Proto, o.Proto)
}

// SchedFlags are the scheduler-specific IPVS flags.
type SchedFlags uint8

// The scheduler flags the kernel knows. sh and mh share the kernel's
// sched-flag-1 and sched-flag-2 bits.
const (
	SHFallback SchedFlags = 1 << iota
	SHPort
	MHFallback
	MHPort
)

var schedFlagNames = []struct {
	f    SchedFlags
	name string
}{
	{SHFallback, "sh-fallback"},
	{SHPort, "sh-port"},
	{MHFallback, "mh-fallback"},
	{MHPort, "mh-port"},
}

// ParseSchedFlag parses one flag name such as "sh-port".
func ParseSchedFlag(s string) (SchedFlags, bool) {
	for _, n := range schedFlagNames {
		if n.name == s {
			return n.f, true
		}
	}
	return 0, false
}

// Scheduler returns the scheduler a flag belongs to.
func (f SchedFlags) Scheduler() string {
	switch f {
	case SHFallback, SHPort:
		return "sh"
	case MHFallback, MHPort:
		return "mh"
	}
	return ""
}

// String returns the flags as a comma-separated list.
func (f SchedFlags) String() string {
	var s []string
	for _, n := range schedFlagNames {
		if f&n.f != 0 {
			s = append(s, n.name)
		}
	}
	return strings.Join(s, ",")
}

// Schedulers lists every IPVS scheduler vipd accepts. The running kernel
// may lack some of them (twos arrived in Linux 6.7).
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}

// Service is the desired or observed configuration of one IPVS service.
type Service struct {
	Key        ServiceKey
	Scheduler  string
	Flags      SchedFlags
	OnePacket  bool
	Persistent uint32 // persistence timeout in seconds, 0 when not persistent
	Netmask    int    // persistence granularity as a prefix length
}

// String formats the service's settings on one line.
func (s Service) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s scheduler=%s", s.Key, s.Scheduler)
	if s.Flags != 0 {
		fmt.Fprintf(&b, " flags=%s", s.Flags)
	}
	if s.OnePacket {
		b.WriteString(" one-packet")
	}
	if s.Persistent != 0 {
		fmt.Fprintf(&b, " persistent=%ds netmask=/%d", s.Persistent, s.Netmask)
	}
	return b.String()
}

// Forward is an IPVS packet-forwarding method.
type Forward uint8

// The forwarding methods.
const (
	Masq Forward = iota + 1
	DirectRoute
	Tunnel
)

// String returns the method's configuration name.
func (f Forward) String() string {
	switch f {
	case Masq:
		return "masq"
	case DirectRoute:
		return "droute"
	case Tunnel:
		return "tunnel"
	}
	return fmt.Sprintf("forward(%d)", uint8(f))
}

// TunnelType is the encapsulation of tunnel forwarding.
type TunnelType uint8

// The tunnel encapsulations.
const (
	IPIP TunnelType = iota
	GUE
	GRE
)

// String returns the encapsulation's configuration name.
func (t TunnelType) String() string {
	switch t {
	case IPIP:
		return "ipip"
	case GUE:
		return "gue"
	case GRE:
		return "gre"
	}
	return fmt.Sprintf("tunnel(%d)", uint8(t))
}

// TunnelCsum is the checksum mode of GUE and GRE tunnels.
type TunnelCsum uint8

// The tunnel checksum modes.
const (
	CsumNone TunnelCsum = iota
	Csum
	RemCsum
)

// String returns the mode's configuration name.
func (c TunnelCsum) String() string {
	switch c {
	case CsumNone:
		return "none"
	case Csum:
		return "csum"
	case RemCsum:
		return "remcsum"
	}
	return fmt.Sprintf("csum(%d)", uint8(c))
}

// Destination is the desired or observed configuration of one real server
// of a service. Stats and connection counts are filled in by observation
// and ignored when comparing.
type Destination struct {
	Addr       netip.AddrPort
	Weight     int
	Forward    Forward
	Tunnel     TunnelType
	TunnelPort uint16
	TunnelCsum TunnelCsum
	Upper      uint32 // upper connection threshold, 0 for none
	Lower      uint32 // lower connection threshold, 0 for none

	ActiveConns   uint32
	InactiveConns uint32
	// Stats are the kernel's counters, filled in by observation, nil
	// otherwise. They are behind a pointer, which nobody writes through,
	// so that desired backends and the plan's operations, by the hundred
	// thousand in a cold start, do not carry their room.
	Stats *Stats
}

// Stats are IPVS traffic counters and rates of a service or destination.
// Rates are the kernel's estimates, per second, updated every 2 seconds.
type Stats struct {
	Conns, InPkts, OutPkts, InBytes, OutBytes uint64
	CPS, InPPS, OutPPS, InBPS, OutBPS         uint64
}

// Settings returns d without the fields the kernel fills in, for
// comparison of configuration.
func (d Destination) Settings() Destination {
	d.ActiveConns, d.InactiveConns, d.Stats = 0, 0, nil
	if d.Forward != Tunnel {
		d.Tunnel, d.TunnelPort, d.TunnelCsum = 0, 0, 0
	}
	return d
}

// String formats the destination's settings on one line.
func (d Destination) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s weight=%d", d.Addr, d.Forward, d.Weight)
	if d.Forward == Tunnel {
		fmt.Fprintf(&b, " tunnel=%s", d.Tunnel)
		if d.Tunnel != IPIP {
			if d.TunnelPort != 0 {
				fmt.Fprintf(&b, " tunnel-port=%d", d.TunnelPort)
			}
			if d.TunnelCsum != CsumNone {
				fmt.Fprintf(&b, " tunnel-csum=%s", d.TunnelCsum)
			}
		}
	}
	if d.Upper != 0 {
		fmt.Fprintf(&b, " upper=%d", d.Upper)
	}
	if d.Lower != 0 {
		fmt.Fprintf(&b, " lower=%d", d.Lower)
	}
	return b.String()
}
