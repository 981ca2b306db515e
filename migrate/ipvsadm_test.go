package migrate

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
)

// genTable builds an IPVS table of n services that vipd can program:
// every protocol, fwmarks of both families, schedulers with their flags,
// persistence with netmasks, one-packet scheduling, the three forwarding
// methods and tunnel types, weights and thresholds.
func genTable(n int) map[lb.ServiceKey]*lb.ServiceState {
	out := map[lb.ServiceKey]*lb.ServiceState{}
	scheds := []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh"}
	for i := range n {
		v6 := i%5 == 4
		fam := lb.IPv4
		vip := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		if v6 {
			fam = lb.IPv6
			vip = netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", i+1))
		}
		svc := lb.Service{Scheduler: scheds[i%len(scheds)]}
		switch i % 7 {
		case 0:
			svc.Key = lb.ServiceKey{Family: fam, FWMark: uint32(i + 1)}
		case 1:
			svc.Key = lb.ServiceKey{Family: fam, Proto: lb.UDP, Addr: vip, Port: 53}
		case 2:
			svc.Key = lb.ServiceKey{Family: fam, Proto: lb.SCTP, Addr: vip, Port: 3868}
		default:
			svc.Key = lb.ServiceKey{Family: fam, Proto: lb.TCP, Addr: vip, Port: uint16(80 + i%3)}
		}
		switch svc.Scheduler {
		case "sh":
			svc.Flags = lb.SHFallback | lb.SHPort
		case "mh":
			svc.Flags = lb.MHPort
		}
		full := 32
		if v6 {
			full = 128
		}
		switch {
		case i%4 == 1 && svc.Key.Proto == lb.UDP:
			svc.OnePacket = true
		case i%3 == 0:
			svc.Persistent, svc.Netmask = uint32(60+i), full
		case i%3 == 1:
			svc.Persistent, svc.Netmask = 300, full-8
		}
		st := &lb.ServiceState{Service: svc, Dests: map[netip.AddrPort]lb.Destination{}}
		for j := range 1 + i%4 {
			a := netip.AddrFrom4([4]byte{10, byte(j), byte(i >> 8), byte(i)})
			if v6 {
				a = netip.MustParseAddr(fmt.Sprintf("fd00:%x::%x", j+1, i+1))
			}
			port := svc.Key.Port
			d := lb.Destination{Weight: (i + j) % 7, Forward: []lb.Forward{lb.Masq, lb.DirectRoute, lb.Tunnel}[j%3]}
			switch d.Forward {
			case lb.Masq:
				if svc.Key.FWMark == 0 {
					port = 8000 + uint16(j)
				}
				d.Upper, d.Lower = uint32(100*j), uint32(50*j)
			case lb.Tunnel:
				d.Tunnel = lb.TunnelType(i % 3)
				if d.Tunnel == lb.GUE {
					d.TunnelPort, d.TunnelCsum = 6080, lb.RemCsum
				} else if d.Tunnel == lb.GRE {
					d.TunnelCsum = lb.Csum
				}
			}
			if svc.Key.FWMark != 0 {
				port = 0
			}
			d.Addr = netip.AddrPortFrom(a, port)
			st.Dests[d.Addr] = d
		}
		out[svc.Key] = st
	}
	return out
}

// saveLines renders a table as "ipvsadm -Sn" does.
func saveLines(svcs map[lb.ServiceKey]*lb.ServiceState) string {
	keys := make([]lb.ServiceKey, 0, len(svcs))
	for k := range svcs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, lb.ServiceKey.Compare)
	var b strings.Builder
	for _, k := range keys {
		s := svcs[k]
		id := ""
		switch {
		case k.FWMark != 0 && k.Family == lb.IPv6:
			id = fmt.Sprintf("-f %d -6", k.FWMark)
		case k.FWMark != 0:
			id = fmt.Sprintf("-f %d", k.FWMark)
		case k.Proto == lb.TCP:
			id = "-t " + netip.AddrPortFrom(k.Addr, k.Port).String()
		case k.Proto == lb.UDP:
			id = "-u " + netip.AddrPortFrom(k.Addr, k.Port).String()
		default:
			id = "--sctp-service " + netip.AddrPortFrom(k.Addr, k.Port).String()
		}
		fmt.Fprintf(&b, "-A %s -s %s", id, s.Scheduler)
		if s.Flags != 0 {
			fmt.Fprintf(&b, " -b %s", s.Flags)
		}
		if s.Persistent != 0 {
			fmt.Fprintf(&b, " -p %d", s.Persistent)
			if k.Family == lb.IPv4 && s.Netmask != 32 {
				m := netip.PrefixFrom(netip.IPv4Unspecified(), s.Netmask)
				mask := ^uint32(0) << (32 - m.Bits())
				fmt.Fprintf(&b, " -M %d.%d.%d.%d", mask>>24, mask>>16&255, mask>>8&255, mask&255)
			} else if k.Family == lb.IPv6 && s.Netmask != 128 {
				fmt.Fprintf(&b, " -M %d", s.Netmask)
			}
		}
		if s.OnePacket {
			b.WriteString(" -o")
		}
		b.WriteString("\n")
		addrs := make([]netip.AddrPort, 0, len(s.Dests))
		for a := range s.Dests {
			addrs = append(addrs, a)
		}
		slices.SortFunc(addrs, netip.AddrPort.Compare)
		for _, a := range addrs {
			d := s.Dests[a]
			fwd := map[lb.Forward]string{lb.Masq: "-m", lb.DirectRoute: "-g", lb.Tunnel: "-i"}[d.Forward]
			fmt.Fprintf(&b, "-a %s -r %s %s -w %d", id, a, fwd, d.Weight)
			if d.Upper != 0 {
				fmt.Fprintf(&b, " -x %d", d.Upper)
			}
			if d.Lower != 0 {
				fmt.Fprintf(&b, " -y %d", d.Lower)
			}
			if d.Forward == lb.Tunnel && d.Tunnel != lb.IPIP {
				fmt.Fprintf(&b, " --tun-type %s", map[lb.TunnelType]string{lb.GUE: "gue", lb.GRE: "gre"}[d.Tunnel])
				if d.TunnelPort != 0 {
					fmt.Fprintf(&b, " --tun-port %d", d.TunnelPort)
				}
				switch d.TunnelCsum {
				case lb.Csum:
					b.WriteString(" --tun-csum")
				case lb.RemCsum:
					b.WriteString(" --tun-remcsum")
				default:
					b.WriteString(" --tun-nocsum")
				}
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// sameTable compares a configuration's services with a table.
func sameTable(t *testing.T, name string, want map[lb.ServiceKey]*lb.ServiceState, got []lb.VirtualService) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d services, want %d", name, len(got), len(want))
	}
	for _, vs := range got {
		w, ok := want[vs.Service.Key]
		if !ok {
			t.Fatalf("%s: service %s is not in the table", name, vs.Service)
		}
		if vs.Service != w.Service {
			t.Errorf("%s: service %s, want %s", name, vs.Service, w.Service)
		}
		if len(vs.Backends) != len(w.Dests) {
			t.Errorf("%s: %s has %d backends, want %d", name, vs.Service.Key, len(vs.Backends), len(w.Dests))
		}
		for _, d := range vs.Backends {
			if wd := w.Dests[d.Addr]; wd.Settings() != d {
				t.Errorf("%s: %s backend %+v, want %+v", name, vs.Service.Key, d, wd)
			}
		}
	}
}

// TestIpvsadmRoundTrip: a table of 1,000 services saved as ipvsadm -Sn
// does, imported, parses into the same services; so does the import of
// the table itself (the --live path).
func TestIpvsadmRoundTrip(t *testing.T) {
	table := genTable(1000)
	r := Ipvsadm("table.txt", strings.NewReader(saveLines(table)))
	if len(r.Issues) > 0 {
		t.Fatalf("issues:\n%s", issues(r))
	}
	sameTable(t, "ipvsadm -Sn", table, parse(t, "ipvsadm.toml", r).Spec.Services)

	live := Table("kernel", table)
	if len(live.Issues) > 0 {
		t.Fatalf("issues of the live import:\n%s", issues(live))
	}
	sameTable(t, "live", table, parse(t, "live.toml", live).Spec.Services)
}

// TestIpvsadmIssues: what vipd cannot program is reported by line.
func TestIpvsadmIssues(t *testing.T) {
	in := `# ipvsadm -Sn
-A -t 192.0.2.1:80 -s rr
-a -t 192.0.2.1:80 -r 10.0.0.1:80 -m -w 1
-a -t 192.0.2.1:80 -r 192.0.2.2:80 -m -w 1
-A -t 192.0.2.2:80 -s wlc --pe sip
-a -t 192.0.2.2:80 -r 10.0.0.2:8080 -g -w 1
-A -t 127.0.0.1:80 -s rr
-a -t 127.0.0.1:80 -r 10.0.0.3:80 -m -w 1
-A -t 192.0.2.3:80 -s bogus
-a -t 192.0.2.9:80 -r 10.0.0.3:80 -m -w 1
-A -u 192.0.2.4:53 -s rr
-X
-A -t 192.0.2.1:80 -s rr
`
	r := Ipvsadm("save.txt", strings.NewReader(in))
	got := issues(r)
	for _, w := range []string{
		"save.txt:4: tcp 192.0.2.1:80: server 192.0.2.2:80: the address 192.0.2.2 is the VIP",
		"save.txt:5: -A -t 192.0.2.2:80 -s wlc --pe sip: persistence engine \"sip\"",
		"save.txt:6: tcp 192.0.2.2:80: server 10.0.0.2:8080: droute forwarding cannot change the port",
		"save.txt:5: tcp 192.0.2.2:80: no server vipd can program",
		"save.txt:7: tcp 127.0.0.1:80: vipd cannot bind the VIP (loopback)",
		"save.txt:9: tcp 192.0.2.3:80: unknown scheduler \"bogus\"",
		"save.txt:10: -a -t 192.0.2.9:80 -r 10.0.0.3:80 -m -w 1: no service was added before it",
		"save.txt:11: udp 192.0.2.4:53: no server vipd can program",
		"save.txt:12: -X: unknown option \"-X\"",
		"save.txt:13: -A -t 192.0.2.1:80 -s rr: the service was added on line 2",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("no issue %q in:\n%s", w, got)
		}
	}
	if r.Services != 1 {
		t.Errorf("%d services, want 1", r.Services)
	}
	parse(t, "save.toml", r)
}

// FuzzIpvsadm: whatever the input, the import's output passes vipd's
// parser and every issue names a line of the input.
func FuzzIpvsadm(f *testing.F) {
	f.Add([]byte(saveLines(genTable(20))))
	f.Add([]byte("-A -f 1 -s mh -b flag-1,flag-2 -p\n-a -f 1 -r [2001:db8::1]:0 -i -w 0 --tun-type gue --tun-port 1 --tun-remcsum\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := Ipvsadm("in.txt", strings.NewReader(string(data)))
		lines := strings.Count(string(data), "\n") + 1
		for _, i := range r.Issues {
			if i.File != "in.txt" || i.Line < 1 || i.Line > lines {
				t.Fatalf("issue outside the input: %s", i)
			}
		}
		parse(t, "fuzz.toml", r)
	})
}
