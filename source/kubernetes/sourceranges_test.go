package kubernetes

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipd/vipd/lb"
)

// TestSourceRanges: a Service's loadBalancerSourceRanges, or the
// annotation cloud providers read when the field is empty, become the
// Allow list of every port and VIP, in both backend modes, and the
// kernel's sets then restrict each VIP to the ranges of its family (a
// VIP with none of its family admits no source). A bad annotation
// admits no source at all and says why.
func TestSourceRanges(t *testing.T) {
	nodes := []*corev1.Node{testNode("a", true, nil, "10.0.0.1", "fd00::1")}
	eps := []*discoveryv1.EndpointSlice{
		testSlice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080))}}, endpoint("10.1.0.1", "a", nil, nil, nil)),
		testSlice(discoveryv1.AddressTypeIPv6, []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080))}}, endpoint("fd01::1", "a", nil, nil, nil)),
	}
	vips := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")}
	service := func(ranges []string, annotation string) *corev1.Service {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
			Spec: corev1.ServiceSpec{
				Type:                     corev1.ServiceTypeLoadBalancer,
				LoadBalancerSourceRanges: ranges,
				Ports: []corev1.ServicePort{
					{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080},
				},
			},
		}
		if annotation != "" {
			svc.Annotations = map[string]string{"service.beta.kubernetes.io/load-balancer-source-ranges": annotation}
		}
		return svc
	}
	// entries returns the allow entries the kernel gets for svc.
	entries := func(t *testing.T, svc *corev1.Service, mode string) []string {
		t.Helper()
		st, err := parseSettings(svc, mode)
		if err != nil {
			t.Fatal(err)
		}
		vss := virtualServices(svc, vips, st, nodes, eps)
		if len(vss) != 2 {
			t.Fatalf("%d virtual services, want 2", len(vss))
		}
		spec := &lb.Spec{Rules: lb.RulePolicy{Enabled: true, SNATMark: 1, FilterVIPs: true}, Services: vss}
		var out []string
		for _, l := range strings.Split(lb.Desired(spec, lb.Host{}).Dump(), "\n") {
			if strings.HasPrefix(l, "set allowed/") || strings.HasPrefix(l, "set restricted/") {
				out = append(out, strings.TrimPrefix(l, "set "))
			}
		}
		return out
	}
	tests := []struct {
		name       string
		ranges     []string
		annotation string
		want       []string
		bad        bool
	}{
		{"none", nil, "", nil, false},
		{"field, both families", []string{"10.0.0.0/8", "2001:db8:1::/48", "198.51.100.7/32"}, "", []string{
			"allowed/ipv4 192.0.2.10,tcp:80,10.0.0.0/8",
			"allowed/ipv4 192.0.2.10,tcp:80,198.51.100.7/32",
			"restricted/ipv4 192.0.2.10,tcp:80",
			"allowed/ipv6 2001:db8::10,tcp:80,2001:db8:1::/48",
			"restricted/ipv6 2001:db8::10,tcp:80",
		}, false},
		// Only IPv4 ranges: the IPv6 VIP admits no source, as a cloud
		// provider's firewall would admit none of that family.
		{"field, one family", []string{"10.0.0.0/8"}, "", []string{
			"allowed/ipv4 192.0.2.10,tcp:80,10.0.0.0/8",
			"restricted/ipv4 192.0.2.10,tcp:80",
			"restricted/ipv6 2001:db8::10,tcp:80",
		}, false},
		{"field over annotation", []string{"10.0.0.0/8"}, "172.16.0.0/12", []string{
			"allowed/ipv4 192.0.2.10,tcp:80,10.0.0.0/8",
			"restricted/ipv4 192.0.2.10,tcp:80",
			"restricted/ipv6 2001:db8::10,tcp:80",
		}, false},
		{"annotation", nil, " 172.16.0.1/12 , 2001:db8:2::/48", []string{
			"allowed/ipv4 192.0.2.10,tcp:80,172.16.0.0/12",
			"restricted/ipv4 192.0.2.10,tcp:80",
			"allowed/ipv6 2001:db8::10,tcp:80,2001:db8:2::/48",
			"restricted/ipv6 2001:db8::10,tcp:80",
		}, false},
		{"everyone", []string{"0.0.0.0/0", "::/0"}, "", nil, false},
		{"bad annotation", nil, "10.0.0.0/8,example.com", []string{
			"restricted/ipv4 192.0.2.10,tcp:80",
			"restricted/ipv6 2001:db8::10,tcp:80",
		}, true},
		{"too many ranges", slices.Repeat([]string{"10.0.0.0/8"}, 257), "", []string{
			"restricted/ipv4 192.0.2.10,tcp:80",
			"restricted/ipv6 2001:db8::10,tcp:80",
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := service(tt.ranges, tt.annotation)
			for _, mode := range []string{BackendsEndpoints, BackendsNodePort} {
				want := slices.Sorted(slices.Values(tt.want))
				if got := entries(t, svc, mode); !slices.Equal(slices.Sorted(slices.Values(got)), want) {
					t.Errorf("backends %s: entries\n%s\nwant\n%s", mode, strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			}
			_, err := sourceRanges(svc)
			var ae *AllocError
			if tt.bad != (err != nil) || tt.bad && (!errors.As(err, &ae) || ae.Reason != ReasonBadAnnotation) {
				t.Errorf("sourceRanges error %v, want one: %t", err, tt.bad)
			}
		})
	}
}
