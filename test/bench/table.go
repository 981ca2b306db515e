package bench

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/lb"
)

// SaveLines renders IPVS services the way `ipvsadm -Sn` saves services
// with masquerading, direct-routing or tunnel backends, sorted: the form
// in which the benchmark compares tables (see Fixture.Table). Settings
// the fixtures never use (persistence, flags, thresholds) are not shown.
func SaveLines(svcs map[lb.ServiceKey]*lb.ServiceState) []string {
	var out []string
	for k, s := range svcs {
		proto := map[lb.Proto]string{lb.TCP: "-t", lb.UDP: "-u", lb.SCTP: "--sctp-service"}[k.Proto]
		vs := netip.AddrPortFrom(k.Addr, k.Port).String()
		if k.FWMark != 0 {
			proto, vs = "-f", fmt.Sprint(k.FWMark)
		}
		out = append(out, fmt.Sprintf("-A %s %s -s %s", proto, vs, s.Scheduler))
		for _, d := range s.Dests {
			fwd := map[lb.Forward]string{lb.Masq: "-m", lb.DirectRoute: "-g", lb.Tunnel: "-i"}[d.Forward]
			out = append(out, fmt.Sprintf("-a %s %s -r %s %s -w %d", proto, vs, d.Addr, fwd, d.Weight))
		}
	}
	slices.Sort(out)
	return out
}
