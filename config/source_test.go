package config

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
)

// TestCheckSourceService accepts a well-formed source service and refuses
// each way one can be wrong, naming it.
func TestCheckSourceService(t *testing.T) {
	vip := netip.MustParseAddr("192.0.2.10")
	good := func() lb.VirtualService {
		return lb.VirtualService{
			Name: "k8s/default/web",
			VIP:  vip,
			Service: lb.Service{
				Key:       lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: vip, Port: 80},
				Scheduler: "wrr",
			},
			Backends: []lb.Destination{
				{Addr: netip.MustParseAddrPort("10.0.0.1:8080"), Weight: 1, Forward: lb.Masq},
				{Addr: netip.MustParseAddrPort("10.0.0.2:8080"), Weight: 0, Forward: lb.Masq},
			},
		}
	}
	if vs := good(); CheckSourceService(&vs) != nil {
		t.Fatalf("a good service refused: %v", CheckSourceService(&vs))
	}
	tests := []struct {
		name, want string
		edit       func(*lb.VirtualService)
	}{
		{"no name", "no name", func(vs *lb.VirtualService) { vs.Name = "" }},
		{"nodeport", "cannot make NodePort", func(vs *lb.VirtualService) { vs.NodePort = true }},
		{"key without the vip", "does not have the vip", func(vs *lb.VirtualService) { vs.Service.Key.Addr = netip.MustParseAddr("192.0.2.11") }},
		{"no port", "has no port or protocol", func(vs *lb.VirtualService) { vs.Service.Key.Port = 0 }},
		{"no protocol", "has no port or protocol", func(vs *lb.VirtualService) { vs.Service.Key.Proto = 0 }},
		{"family", "not of the vip's family", func(vs *lb.VirtualService) { vs.Service.Key.Family = lb.IPv6 }},
		{"scheduler", `unknown scheduler "fastest"`, func(vs *lb.VirtualService) { vs.Service.Scheduler = "fastest" }},
		{"backend address", "invalid or repeated", func(vs *lb.VirtualService) { vs.Backends[1].Addr = netip.AddrPort{} }},
		{"repeated backend", "backend 10.0.0.1:8080: invalid or repeated", func(vs *lb.VirtualService) { vs.Backends[1].Addr = vs.Backends[0].Addr }},
		{"negative weight", "invalid or repeated", func(vs *lb.VirtualService) { vs.Backends[0].Weight = -1 }},
		{"forward", "invalid or repeated", func(vs *lb.VirtualService) { vs.Backends[0].Forward = lb.Tunnel + 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs := good()
			tt.edit(&vs)
			if err := CheckSourceService(&vs); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CheckSourceService = %v; want an error containing %q", err, tt.want)
			}
		})
	}
}
