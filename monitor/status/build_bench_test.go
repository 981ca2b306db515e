package status

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
)

// BenchmarkBuild10k builds the status of 10,000 services of 10 backends
// each: what the daemon's main loop pays each time it takes a snapshot.
func BenchmarkBuild10k(b *testing.B) {
	spec := &lb.Spec{}
	for i := range 10000 {
		vip := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		vs := lb.VirtualService{Name: fmt.Sprint("s", i), VIP: vip, Service: lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: vip, Port: 80}, Scheduler: "wlc"}}
		for j := range 10 {
			vs.Backends = append(vs.Backends, lb.Destination{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 4), byte(j)}), 8080), Weight: 1, Forward: lb.Masq})
		}
		spec.Services = append(spec.Services, vs)
	}
	obs := observed(spec)
	b.ResetTimer()
	for b.Loop() {
		Build(Options{Spec: spec, Observed: obs, Now: time.Now()})
	}
}
