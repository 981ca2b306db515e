package lb_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/vipd/vipd/lb"
)

// benchSpec builds n services of m backends each.
func benchSpec(n, m int) *lb.Spec {
	spec := &lb.Spec{ManageSysctls: true, Rules: lb.RulePolicy{Enabled: true, SNATMark: 0x4000000, FilterVIPs: true}}
	for i := range n {
		vip := netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})
		vs := lb.VirtualService{
			Name:     fmt.Sprintf("svc-%d", i),
			VIP:      vip,
			Announce: true,
			Service: lb.Service{
				Key:       lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: vip, Port: 80},
				Scheduler: "wrr",
			},
		}
		for j := range m {
			addr := netip.AddrFrom4([4]byte{10, 200 + byte(j), byte(i >> 8), byte(i)})
			vs.Backends = append(vs.Backends, lb.Destination{Addr: netip.AddrPortFrom(addr, 8080), Weight: 1, Forward: lb.Masq})
		}
		spec.Services = append(spec.Services, vs)
	}
	return spec
}

// BenchmarkPlanFromEmpty plans N services x 10 backends into an empty
// kernel: the cold start.
func BenchmarkPlanFromEmpty(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			spec := benchSpec(n, 10)
			empty := lb.NewState()
			b.ReportAllocs()
			var ops int
			for b.Loop() {
				ops = len(lb.Plan(lb.Desired(spec, lb.Host{}), empty, lb.PlanOptions{}))
			}
			b.ReportMetric(float64(ops), "ops")
		})
	}
}

// BenchmarkReplanOneChange re-plans after one backend's weight changed:
// the hot path of a reload. Its cost is the diff walk (linear in the
// number of objects, with no allocation per unchanged object) and it must
// produce exactly one operation.
func BenchmarkReplanOneChange(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			spec := benchSpec(n, 10)
			observed := lb.Desired(spec, lb.Host{})
			spec.Services[n/2].Backends[3].Weight = 7
			desired := lb.Desired(spec, lb.Host{})
			b.ReportAllocs()
			for b.Loop() {
				if ops := lb.Plan(desired, observed, lb.PlanOptions{}); len(ops) != 1 {
					b.Fatalf("%d ops, want 1", len(ops))
				}
			}
		})
	}
}

// BenchmarkDesired builds the desired state of N services x 10 backends.
func BenchmarkDesired(b *testing.B) {
	spec := benchSpec(10000, 10)
	b.ReportAllocs()
	for b.Loop() {
		lb.Desired(spec, lb.Host{})
	}
}
