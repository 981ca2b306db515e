package ipvs

import (
	"encoding/binary"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

func tcp4(addr string, port uint16) lb.ServiceKey {
	return lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr(addr), Port: port}
}

func key(fam lb.Family, proto lb.Proto, addr string, port uint16) lb.ServiceKey {
	return lb.ServiceKey{Family: fam, Proto: proto, Addr: netip.MustParseAddr(addr), Port: port}
}

// nativeMask returns the uint32 moby carries for an IPVS IPv4 netmask:
// the mask's network-order bytes read in host order.
func nativeMask(b0, b1, b2, b3 byte) uint32 {
	return binary.NativeEndian.Uint32([]byte{b0, b1, b2, b3})
}

func TestServiceRoundTrip(t *testing.T) {
	for _, s := range []lb.Service{
		{Key: tcp4("192.0.2.1", 80), Scheduler: "rr"},
		{Key: key(lb.IPv4, lb.UDP, "192.0.2.1", 53), Scheduler: "wrr", OnePacket: true},
		{Key: key(lb.IPv4, lb.SCTP, "192.0.2.1", 3868), Scheduler: "lc"},
		{Key: key(lb.IPv6, lb.TCP, "2001:db8::1", 443), Scheduler: "wlc"},
		{Key: key(lb.IPv6, lb.UDP, "2001:db8::1", 0), Scheduler: "rr", Persistent: 60, Netmask: 128},
		{Key: lb.ServiceKey{Family: lb.IPv4, FWMark: 7}, Scheduler: "rr"},
		{Key: lb.ServiceKey{Family: lb.IPv6, FWMark: 0xffffffff}, Scheduler: "dh"},
		{Key: tcp4("192.0.2.1", 80), Scheduler: "sh", Flags: lb.SHPort | lb.SHFallback},
		{Key: tcp4("192.0.2.1", 80), Scheduler: "sh", Flags: lb.SHPort},
		{Key: tcp4("192.0.2.1", 80), Scheduler: "mh", Flags: lb.MHFallback},
		{Key: tcp4("192.0.2.1", 80), Scheduler: "mh", Flags: lb.MHPort | lb.MHFallback},
		{Key: tcp4("192.0.2.1", 80), Scheduler: "wlc", Persistent: 300, Netmask: 24},
		{Key: tcp4("192.0.2.1", 80), Scheduler: "wlc", Persistent: 300, Netmask: 32},
		{Key: tcp4("192.0.2.1", 80), Scheduler: "wlc", Persistent: 1, Netmask: 1},
		{Key: key(lb.IPv6, lb.TCP, "2001:db8::1", 80), Scheduler: "sh", Flags: lb.SHPort, Persistent: 600, Netmask: 64},
		{Key: lb.ServiceKey{Family: lb.IPv4, FWMark: 1}, Scheduler: "rr", Persistent: 30, Netmask: 16},
		{Key: tcp4("192.0.2.1", 80), Scheduler: "twos"},
	} {
		ms, err := toKernelService(s)
		if err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		// The kernel always adds the hashed flag.
		ms.Flags |= svcFlagHashed
		got, err := fromKernelService(ms)
		if err != nil {
			t.Errorf("%s: read back: %v", s, err)
			continue
		}
		if got != s {
			t.Errorf("round trip\n got %s\nwant %s", got, s)
		}
	}
}

func TestToKernelService(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   lb.Service
		want mobyipvs.Service
	}{
		{
			name: "ipv4 tcp",
			in:   lb.Service{Key: tcp4("192.0.2.1", 80), Scheduler: "rr"},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 6, Address: net.IP{192, 0, 2, 1}, Port: 80, SchedName: "rr", Netmask: 0xffffffff},
		},
		{
			name: "ipv6 udp without persistence has netmask 128",
			in:   lb.Service{Key: key(lb.IPv6, lb.UDP, "2001:db8::1", 53), Scheduler: "wrr"},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET6, Protocol: 17, Address: net.ParseIP("2001:db8::1"), Port: 53, SchedName: "wrr", Netmask: 128},
		},
		{
			name: "sctp",
			in:   lb.Service{Key: key(lb.IPv4, lb.SCTP, "192.0.2.1", 3868), Scheduler: "rr"},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 132, Address: net.IP{192, 0, 2, 1}, Port: 3868, SchedName: "rr", Netmask: 0xffffffff},
		},
		{
			name: "fwmark",
			in:   lb.Service{Key: lb.ServiceKey{Family: lb.IPv6, FWMark: 42}, Scheduler: "rr"},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET6, FWMark: 42, SchedName: "rr", Netmask: 128},
		},
		{
			name: "persistent ipv4 /24",
			in:   lb.Service{Key: tcp4("192.0.2.1", 0), Scheduler: "wlc", Persistent: 300, Netmask: 24},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 6, Address: net.IP{192, 0, 2, 1}, SchedName: "wlc", Flags: svcFlagPersistent, Timeout: 300, Netmask: nativeMask(255, 255, 255, 0)},
		},
		{
			name: "persistent ipv4 without netmask is /32",
			in:   lb.Service{Key: tcp4("192.0.2.1", 80), Scheduler: "wlc", Persistent: 300},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 6, Address: net.IP{192, 0, 2, 1}, Port: 80, SchedName: "wlc", Flags: svcFlagPersistent, Timeout: 300, Netmask: 0xffffffff},
		},
		{
			name: "persistent ipv6 /48",
			in:   lb.Service{Key: key(lb.IPv6, lb.TCP, "2001:db8::1", 80), Scheduler: "rr", Persistent: 10, Netmask: 48},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET6, Protocol: 6, Address: net.ParseIP("2001:db8::1"), Port: 80, SchedName: "rr", Flags: svcFlagPersistent, Timeout: 10, Netmask: 48},
		},
		{
			name: "sh flags",
			in:   lb.Service{Key: tcp4("192.0.2.1", 80), Scheduler: "sh", Flags: lb.SHFallback | lb.SHPort},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 6, Address: net.IP{192, 0, 2, 1}, Port: 80, SchedName: "sh", Flags: svcFlagSched1 | svcFlagSched2, Netmask: 0xffffffff},
		},
		{
			name: "mh port and one-packet",
			in:   lb.Service{Key: key(lb.IPv4, lb.UDP, "192.0.2.1", 53), Scheduler: "mh", Flags: lb.MHPort, OnePacket: true},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 17, Address: net.IP{192, 0, 2, 1}, Port: 53, SchedName: "mh", Flags: svcFlagSched2 | svcFlagOnePacket, Netmask: 0xffffffff},
		},
		{
			name: "ipv4-mapped address is written as ipv4",
			in:   lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("::ffff:192.0.2.1"), Port: 80}, Scheduler: "rr"},
			want: mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 6, Address: net.IP{192, 0, 2, 1}, Port: 80, SchedName: "rr", Netmask: 0xffffffff},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := toKernelService(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Address.Equal(tc.want.Address) || len(got.Address) != len(tc.want.Address) {
				t.Errorf("address %v (%d bytes), want %v (%d bytes)", got.Address, len(got.Address), tc.want.Address, len(tc.want.Address))
			}
			got.Address, tc.want.Address = nil, nil
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("\n got %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}

func TestToKernelServiceErrors(t *testing.T) {
	for _, tc := range []struct {
		in   lb.Service
		want string
	}{
		{lb.Service{Key: tcp4("192.0.2.1", 80)}, "no scheduler"},
		{lb.Service{Key: tcp4("192.0.2.1", 80), Scheduler: "rr", Flags: lb.SHPort}, "scheduler flag sh-port needs scheduler sh, not rr"},
		{lb.Service{Key: tcp4("192.0.2.1", 80), Scheduler: "sh", Flags: lb.MHPort}, "needs scheduler mh"},
		{lb.Service{Key: tcp4("192.0.2.1", 80), Scheduler: "rr", Persistent: 1, Netmask: 33}, "outside /1../32"},
		{lb.Service{Key: key(lb.IPv6, lb.TCP, "2001:db8::1", 80), Scheduler: "rr", Persistent: 1, Netmask: 129}, "outside /1../128"},
		{lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("2001:db8::1")}, Scheduler: "rr"}, "is not an ipv4 address"},
		{lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP}, Scheduler: "rr"}, "no address"},
		{lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Addr: netip.MustParseAddr("192.0.2.1")}, Scheduler: "rr"}, "unknown protocol"},
		{lb.Service{Key: lb.ServiceKey{Proto: lb.TCP, Addr: netip.MustParseAddr("192.0.2.1")}, Scheduler: "rr"}, "unknown address family"},
	} {
		_, err := toKernelService(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}

func TestFromKernelService(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   mobyipvs.Service
		want lb.Service
	}{
		{
			name: "hashed flag and stray timeout and netmask are ignored without persistence",
			in:   mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 6, Address: net.IP{192, 0, 2, 1}, Port: 80, SchedName: "rr", Flags: svcFlagHashed, Timeout: 300, Netmask: 0xffffffff},
			want: lb.Service{Key: tcp4("192.0.2.1", 80), Scheduler: "rr"},
		},
		{
			name: "sched flags of other schedulers are dropped",
			in:   mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 6, Address: net.IP{192, 0, 2, 1}, Port: 80, SchedName: "rr", Flags: svcFlagHashed | svcFlagSched1 | svcFlagSched2},
			want: lb.Service{Key: tcp4("192.0.2.1", 80), Scheduler: "rr"},
		},
		{
			name: "kernel's 16-byte ipv4 address",
			in:   mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 17, Address: net.ParseIP("192.0.2.9"), Port: 53, SchedName: "wrr"},
			want: lb.Service{Key: key(lb.IPv4, lb.UDP, "192.0.2.9", 53), Scheduler: "wrr"},
		},
		{
			name: "persistent ipv4 /16",
			in:   mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 6, Address: net.IP{192, 0, 2, 1}, SchedName: "wlc", Flags: svcFlagHashed | svcFlagPersistent, Timeout: 360, Netmask: nativeMask(255, 255, 0, 0)},
			want: lb.Service{Key: tcp4("192.0.2.1", 0), Scheduler: "wlc", Persistent: 360, Netmask: 16},
		},
		{
			name: "non-contiguous ipv4 mask reads as its leading ones",
			in:   mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: 6, Address: net.IP{192, 0, 2, 1}, SchedName: "wlc", Flags: svcFlagPersistent, Timeout: 1, Netmask: nativeMask(255, 0, 255, 0)},
			want: lb.Service{Key: tcp4("192.0.2.1", 0), Scheduler: "wlc", Persistent: 1, Netmask: 8},
		},
		{
			name: "fwmark ipv6 persistent",
			in:   mobyipvs.Service{AddressFamily: unix.AF_INET6, FWMark: 9, SchedName: "mh", Flags: svcFlagHashed | svcFlagPersistent | svcFlagSched1, Timeout: 5, Netmask: 56},
			want: lb.Service{Key: lb.ServiceKey{Family: lb.IPv6, FWMark: 9}, Scheduler: "mh", Flags: lb.MHFallback, Persistent: 5, Netmask: 56},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fromKernelService(&tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
		})
	}
	for _, bad := range []mobyipvs.Service{
		{AddressFamily: 99, Protocol: 6, Address: net.IP{192, 0, 2, 1}},
		{AddressFamily: unix.AF_INET, Protocol: 50, Address: net.IP{192, 0, 2, 1}},
		{AddressFamily: unix.AF_INET, Protocol: 6},
	} {
		if _, err := fromKernelService(&bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func TestNetmask(t *testing.T) {
	for ones := 0; ones <= 32; ones++ {
		m := toKernelNetmask(ones, lb.IPv4)
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], m)
		if got, _ := net.IPMask(b[:]).Size(); got != ones {
			t.Errorf("/%d: mask bytes %v are /%d", ones, b, got)
		}
		if got := fromKernelNetmask(m, lb.IPv4); got != ones {
			t.Errorf("/%d: read back /%d", ones, got)
		}
	}
	for ones := 1; ones <= 128; ones++ {
		if got := fromKernelNetmask(toKernelNetmask(ones, lb.IPv6), lb.IPv6); got != ones {
			t.Errorf("ipv6 /%d: read back /%d", ones, got)
		}
	}
}

func dest(addr string, fwd lb.Forward) lb.Destination {
	return lb.Destination{Addr: netip.MustParseAddrPort(addr), Weight: 1, Forward: fwd}
}

func destCases() []lb.Destination {
	gue := dest("198.51.100.1:80", lb.Tunnel)
	gue.Tunnel, gue.TunnelPort, gue.TunnelCsum = lb.GUE, 6080, lb.Csum
	gueRem := gue
	gueRem.TunnelCsum = lb.RemCsum
	gre := dest("198.51.100.2:80", lb.Tunnel)
	gre.Tunnel, gre.TunnelCsum = lb.GRE, lb.Csum
	gre6 := dest("[2001:db8::2]:80", lb.Tunnel)
	gre6.Tunnel = lb.GRE
	thresh := dest("198.51.100.3:8080", lb.Masq)
	thresh.Upper, thresh.Lower, thresh.Weight = 1000, 100, 65535
	zero := dest("198.51.100.4:80", lb.DirectRoute)
	zero.Weight = 0
	return []lb.Destination{
		dest("198.51.100.1:80", lb.Masq),
		dest("198.51.100.1:80", lb.DirectRoute),
		dest("198.51.100.1:80", lb.Tunnel), // ipip
		dest("[2001:db8::1]:443", lb.Masq),
		dest("[2001:db8::1]:443", lb.Tunnel),
		dest("198.51.100.1:0", lb.DirectRoute),
		gue, gueRem, gre, gre6, thresh, zero,
	}
}

func TestDestRoundTrip(t *testing.T) {
	for _, d := range destCases() {
		kd, err := toKernelDest(d)
		if err != nil {
			t.Errorf("%s: %v", d, err)
			continue
		}
		if got := fromKernelDest(kd); got != d.Settings() {
			t.Errorf("struct round trip\n got %s\nwant %s", got, d)
		}
		// Through the netlink encoding, as a dump would return it.
		for _, svcFam := range []uint16{unix.AF_INET, unix.AF_INET6} {
			msg := append((&nl.Genlmsg{Command: cmdNewDest, Version: 1}).Serialize(), destAttr(kd, true).Serialize()...)
			back, err := parseDestMsg(msg, svcFam)
			if err != nil {
				t.Errorf("%s: parse: %v", d, err)
				continue
			}
			if got := fromKernelDest(back); got != d.Settings() {
				t.Errorf("netlink round trip (service family %d)\n got %s\nwant %s", svcFam, got, d)
			}
		}
	}
}

// attrMap parses the attributes nested in a serialized attribute.
func attrMap(t *testing.T, a interface{ Serialize() []byte }) map[uint16][]byte {
	t.Helper()
	attrs, err := nl.ParseRouteAttr(a.Serialize()[unix.SizeofRtAttr:])
	if err != nil {
		t.Fatal(err)
	}
	m := map[uint16][]byte{}
	for _, x := range attrs {
		m[x.Attr.Type] = x.Value
	}
	return m
}

func TestDestAttrEncoding(t *testing.T) {
	d := dest("[2001:db8::7]:8080", lb.Tunnel)
	d.Tunnel, d.TunnelPort, d.TunnelCsum = lb.GUE, 0x1234, lb.RemCsum
	d.Weight, d.Upper, d.Lower = 5, 10, 2
	kd, err := toKernelDest(d)
	if err != nil {
		t.Fatal(err)
	}
	m := attrMap(t, destAttr(kd, true))
	checks := []struct {
		name string
		attr uint16
		want []byte
	}{
		{"family", destAttrAddrFamily, nl.Uint16Attr(unix.AF_INET6)},
		{"address", destAttrAddr, netip.MustParseAddr("2001:db8::7").AsSlice()},
		{"port (network order)", destAttrPort, []byte{0x1f, 0x90}},
		{"forwarding method", destAttrFwdMethod, nl.Uint32Attr(fwdTunnel)},
		{"weight", destAttrWeight, nl.Uint32Attr(5)},
		{"upper threshold", destAttrUThresh, nl.Uint32Attr(10)},
		{"lower threshold", destAttrLThresh, nl.Uint32Attr(2)},
		{"tunnel type", destAttrTunType, []byte{tunGUE}},
		{"tunnel port (network order)", destAttrTunPort, []byte{0x12, 0x34}},
		{"tunnel flags", destAttrTunFlags, nl.Uint16Attr(tunFlagRemCsum)},
	}
	for _, c := range checks {
		if got := m[c.attr]; string(got) != string(c.want) {
			t.Errorf("%s (attribute %d): %x, want %x", c.name, c.attr, got, c.want)
		}
	}

	// IPIP and other methods send no tunnel attributes; deletes send only
	// the address, family and port.
	kd, _ = toKernelDest(dest("192.0.2.5:80", lb.Tunnel))
	m = attrMap(t, destAttr(kd, true))
	for _, a := range []uint16{destAttrTunType, destAttrTunPort, destAttrTunFlags} {
		if _, ok := m[a]; ok {
			t.Errorf("ipip destination has tunnel attribute %d", a)
		}
	}
	if got := m[destAttrAddr]; len(got) != 4 {
		t.Errorf("ipv4 address attribute is %d bytes, want 4", len(got))
	}
	m = attrMap(t, destAttr(kd, false))
	if len(m) != 3 || m[destAttrAddr] == nil || m[destAttrPort] == nil || m[destAttrAddrFamily] == nil {
		t.Errorf("delete attributes: %v, want address, family and port only", m)
	}
}

func TestKeyAttrEncoding(t *testing.T) {
	k, err := toKernelKey(tcp4("192.0.2.1", 443))
	if err != nil {
		t.Fatal(err)
	}
	m := attrMap(t, keyAttr(k))
	want := map[uint16][]byte{
		svcAttrAF:       nl.Uint16Attr(unix.AF_INET),
		svcAttrProtocol: nl.Uint16Attr(unix.IPPROTO_TCP),
		svcAttrAddr:     {192, 0, 2, 1},
		svcAttrPort:     {0x01, 0xbb},
	}
	if len(m) != len(want) {
		t.Errorf("attributes %v, want %v", m, want)
	}
	for a, w := range want {
		if string(m[a]) != string(w) {
			t.Errorf("attribute %d: %x, want %x", a, m[a], w)
		}
	}
	k, _ = toKernelKey(lb.ServiceKey{Family: lb.IPv6, FWMark: 3})
	m = attrMap(t, keyAttr(k))
	if len(m) != 2 || string(m[svcAttrFWMark]) != string(nl.Uint32Attr(3)) || string(m[svcAttrAF]) != string(nl.Uint16Attr(unix.AF_INET6)) {
		t.Errorf("fwmark attributes %v", m)
	}
}

func TestParseKernelDest(t *testing.T) {
	// A dump message as Linux 6.1 sends it: a 16-byte address field with
	// the IPv4 address first, counters, and the tunnel attributes even for
	// masquerading.
	a := nl.NewRtAttr(cmdAttrDest|unix.NLA_F_NESTED, nil)
	a.AddRtAttr(destAttrAddr, append([]byte{10, 1, 2, 3}, make([]byte, 12)...))
	a.AddRtAttr(destAttrPort, []byte{0, 80})
	a.AddRtAttr(destAttrFwdMethod, nl.Uint32Attr(fwdMasq|0x0100)) // flag bits above the method
	a.AddRtAttr(destAttrWeight, nl.Uint32Attr(3))
	a.AddRtAttr(destAttrTunType, []byte{0})
	a.AddRtAttr(destAttrTunPort, []byte{0, 0})
	a.AddRtAttr(destAttrTunFlags, nl.Uint16Attr(0))
	a.AddRtAttr(destAttrUThresh, nl.Uint32Attr(0))
	a.AddRtAttr(destAttrLThresh, nl.Uint32Attr(0))
	a.AddRtAttr(destAttrActiveConns, nl.Uint32Attr(7))
	a.AddRtAttr(destAttrInactConns, nl.Uint32Attr(8))
	a.AddRtAttr(destAttrPersistConns, nl.Uint32Attr(9))
	a.AddRtAttr(destAttrAddrFamily, nl.Uint16Attr(unix.AF_INET))
	msg := append((&nl.Genlmsg{Command: cmdNewDest, Version: 1}).Serialize(), a.Serialize()...)
	kd, err := parseDestMsg(msg, unix.AF_INET6)
	if err != nil {
		t.Fatal(err)
	}
	got := fromKernelDest(kd)
	want := lb.Destination{Addr: netip.MustParseAddrPort("10.1.2.3:80"), Weight: 3, Forward: lb.Masq, ActiveConns: 7, InactiveConns: 8}
	if got != want {
		t.Errorf("\n got %+v\nwant %+v", got, want)
	}

	// Without a family attribute (Linux before 3.18) the service's applies.
	b := nl.NewRtAttr(cmdAttrDest, nil)
	b.AddRtAttr(destAttrAddr, append([]byte{10, 1, 2, 3}, make([]byte, 12)...))
	b.AddRtAttr(destAttrPort, []byte{0, 80})
	msg = append((&nl.Genlmsg{Command: cmdNewDest, Version: 1}).Serialize(), b.Serialize()...)
	if kd, err := parseDestMsg(msg, unix.AF_INET); err != nil || kd.addr != netip.MustParseAddr("10.1.2.3") {
		t.Errorf("no family attribute: %v, %v", kd.addr, err)
	}

	for name, bad := range map[string][]byte{
		"short":      {1, 2},
		"no dest":    (&nl.Genlmsg{}).Serialize(),
		"no address": append((&nl.Genlmsg{}).Serialize(), nl.NewRtAttr(cmdAttrDest, nil).Serialize()...),
	} {
		if _, err := parseDestMsg(bad, unix.AF_INET); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestFromKernelDestUnknownForward(t *testing.T) {
	// The local-node method is not one lb knows: it must compare unequal
	// to anything vipd writes.
	d := fromKernelDest(kernelDest{family: unix.AF_INET, addr: netip.MustParseAddr("127.0.0.1"), port: 80, fwd: 1, weight: 1})
	for _, f := range []lb.Forward{lb.Masq, lb.DirectRoute, lb.Tunnel} {
		w := dest("127.0.0.1:80", f)
		if d.Settings() == w.Settings() {
			t.Errorf("local-node destination compares equal to %s", w)
		}
	}
}

func TestToKernelDestErrors(t *testing.T) {
	gue := dest("192.0.2.1:80", lb.Tunnel)
	gue.Tunnel = lb.GUE
	neg := dest("192.0.2.1:80", lb.Masq)
	neg.Weight = -1
	for _, tc := range []struct {
		in   lb.Destination
		want string
	}{
		{gue, "tunnel gue needs a tunnel port"},
		{neg, "weight -1 is out of range"},
		{lb.Destination{Addr: netip.MustParseAddrPort("192.0.2.1:80")}, "unknown forwarding method"},
		{lb.Destination{Forward: lb.Masq}, "bad destination address"},
		{withThresh(dest("192.0.2.1:80", lb.Masq), 1<<31, 0), "upper threshold 2147483648 is above the kernel's limit 2147483647"},
		{withThresh(dest("192.0.2.1:80", lb.Masq), 0, 5), "lower threshold 5 is above upper threshold 0"},
		{withThresh(dest("192.0.2.1:80", lb.Masq), 10, 11), "lower threshold 11 is above upper threshold 10"},
	} {
		_, err := toKernelDest(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}
