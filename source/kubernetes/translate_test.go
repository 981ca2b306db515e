package kubernetes

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipd/vipd/lb"
)

// translate maps one Service to its virtual services as the controller
// does, without one: the settings from its annotations (with the default
// mode), the ports nodeport mode cannot serve, the virtual services of
// addrs, and the backends that direct forwarding cannot reach. err is
// the first error of those steps, as the Service's warning Event would
// say it.
func translate(svc *corev1.Service, mode string, addrs []netip.Addr, nodes []*corev1.Node, eps []*discoveryv1.EndpointSlice) ([]lb.VirtualService, error) {
	st, err := parseSettings(svc, mode)
	if err != nil {
		return nil, err
	}
	err = noNodePorts(svc, st)
	vss := virtualServices(svc, addrs, st, nodes, eps)
	return vss, errors.Join(err, keepPorts(vss))
}

// tcpService is a LoadBalancer Service ns/web with one TCP port http/80
// at nodePort 30080, changed by edit.
func tcpService(edit func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}},
		},
	}
	if edit != nil {
		edit(svc)
	}
	return svc
}

// wantVS is the virtual service of ns/web's port http at vip (name as
// ServiceName makes it) with the defaults (wlc, announced) and backends,
// changed by edit.
func wantVS(vip string, backends []lb.Destination, edit func(*lb.VirtualService)) lb.VirtualService {
	addr := netip.MustParseAddr(vip)
	fam := lb.FamilyOf(addr)
	name := "k8s/ns/web/http/tcp"
	if fam == lb.IPv6 {
		name += "/ipv6"
	}
	vs := lb.VirtualService{
		Name:     name,
		Service:  lb.Service{Key: lb.ServiceKey{Family: fam, Proto: lb.TCP, Addr: addr, Port: 80}, Scheduler: "wlc"},
		VIP:      addr,
		Announce: true,
		Backends: backends,
	}
	if edit != nil {
		edit(&vs)
	}
	return vs
}

// dests returns destinations forwarded with fwd, from "addr:port=weight"
// pairs.
func dests(fwd lb.Forward, pairs ...string) []lb.Destination {
	var out []lb.Destination
	for _, p := range pairs {
		ap, w, _ := strings.Cut(p, "=")
		var weight int
		if _, err := fmt.Sscan(w, &weight); err != nil {
			panic(p)
		}
		out = append(out, lb.Destination{Addr: netip.MustParseAddrPort(ap), Weight: weight, Forward: fwd})
	}
	return out
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(s))
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// TestTranslate is the table of the pure translation: a Service, its
// EndpointSlices and the Nodes in, the virtual services out, across the
// backend modes, the address families, the annotations, the external
// traffic policies and terminating endpoints.
func TestTranslate(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	ready := func(addr, node string) discoveryv1.Endpoint { return endpoint(addr, node, yes, yes, no) }
	draining := func(addr, node string) discoveryv1.Endpoint { return endpoint(addr, node, no, yes, yes) }
	gone := func(addr, node string) discoveryv1.Endpoint { return endpoint(addr, node, no, no, yes) }
	unready := func(addr, node string) discoveryv1.Endpoint { return endpoint(addr, node, no, no, no) }
	http := func(port int32) []discoveryv1.EndpointPort {
		return []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}}
	}
	v4 := func(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return testSlice(discoveryv1.AddressTypeIPv4, http(8080), eps...)
	}
	v6 := func(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return testSlice(discoveryv1.AddressTypeIPv6, http(8080), eps...)
	}
	nodes := []*corev1.Node{
		testNode("a", true, nil, "10.0.0.1", "fd00::1"),
		testNode("b", true, nil, "10.0.0.2", "fd00::2"),
		testNode("c", false, nil, "10.0.0.3"),                                                    // not Ready
		testNode("d", true, map[string]string{corev1.LabelNodeExcludeBalancers: ""}, "10.0.0.4"), // excluded
	}
	local := func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	annotate := func(kv ...string) func(*corev1.Service) {
		return func(s *corev1.Service) {
			for i := 0; i < len(kv); i += 2 {
				s.Annotations[kv[i]] = kv[i+1]
			}
		}
	}

	tests := []struct {
		name  string
		svc   *corev1.Service
		mode  string
		addrs []netip.Addr
		eps   []*discoveryv1.EndpointSlice
		want  []lb.VirtualService
		// reason is the AllocError reason of the error, "" for none.
		reason string
	}{{
		name:  "nodeport Cluster: every Ready Node not excluded, weight 1",
		svc:   tcpService(nil),
		mode:  BackendsNodePort,
		addrs: addrs("192.0.2.1"),
		eps:   []*discoveryv1.EndpointSlice{v4(ready("10.244.0.1", "a"))},
		want:  []lb.VirtualService{wantVS("192.0.2.1", dests(lb.Masq, "10.0.0.1:30080=1", "10.0.0.2:30080=1"), nil)},
	}, {
		name:  "nodeport Cluster IPv6: the Nodes' IPv6 addresses",
		svc:   tcpService(nil),
		mode:  BackendsNodePort,
		addrs: addrs("2001:db8::1"),
		want:  []lb.VirtualService{wantVS("2001:db8::1", dests(lb.Masq, "[fd00::1]:30080=1", "[fd00::2]:30080=1"), nil)},
	}, {
		name:  "nodeport Local: the Nodes with ready endpoints, weighted by their count",
		svc:   tcpService(local),
		mode:  BackendsNodePort,
		addrs: addrs("192.0.2.1"),
		eps: []*discoveryv1.EndpointSlice{v4(ready("10.244.0.1", "a"), ready("10.244.0.2", "a"), ready("10.244.1.1", "b"),
			draining("10.244.1.2", "b"), ready("10.244.2.1", "c"))},
		want: []lb.VirtualService{wantVS("192.0.2.1", dests(lb.Masq, "10.0.0.1:30080=2", "10.0.0.2:30080=1"), nil)},
	}, {
		name:  "nodeport Local, none ready: the Nodes with serving terminating endpoints",
		svc:   tcpService(local),
		mode:  BackendsNodePort,
		addrs: addrs("192.0.2.1"),
		eps:   []*discoveryv1.EndpointSlice{v4(draining("10.244.1.2", "b"), gone("10.244.0.1", "a"))},
		want:  []lb.VirtualService{wantVS("192.0.2.1", dests(lb.Masq, "10.0.0.2:30080=1"), nil)},
	}, {
		name:  "nodeport Local, no endpoint: no backends",
		svc:   tcpService(local),
		mode:  BackendsNodePort,
		addrs: addrs("192.0.2.1"),
		eps:   []*discoveryv1.EndpointSlice{v4(unready("10.244.0.1", "a"))},
		want:  []lb.VirtualService{wantVS("192.0.2.1", nil, nil)},
	}, {
		name: "nodeport without a nodePort: no backends, and an error",
		svc: tcpService(func(s *corev1.Service) {
			s.Spec.Ports[0].NodePort = 0
			s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
		}),
		mode:   BackendsNodePort,
		addrs:  addrs("192.0.2.1"),
		want:   []lb.VirtualService{wantVS("192.0.2.1", nil, nil)},
		reason: ReasonNoNodePorts,
	}, {
		name:  "endpoints: ready weight 1, serving terminating drained, the rest out",
		svc:   tcpService(nil),
		mode:  BackendsEndpoints,
		addrs: addrs("192.0.2.1"),
		eps: []*discoveryv1.EndpointSlice{v4(ready("10.244.0.1", "a"), draining("10.244.0.2", "b"), gone("10.244.0.3", "b"),
			unready("10.244.0.4", "c"))},
		want: []lb.VirtualService{wantVS("192.0.2.1", dests(lb.Masq, "10.244.0.1:8080=1", "10.244.0.2:8080=0"), nil)},
	}, {
		name:  "endpoints, none ready: the serving terminating ones carry the traffic",
		svc:   tcpService(nil),
		mode:  BackendsEndpoints,
		addrs: addrs("192.0.2.1"),
		eps:   []*discoveryv1.EndpointSlice{v4(draining("10.244.0.2", "b"), gone("10.244.0.3", "b"))},
		want:  []lb.VirtualService{wantVS("192.0.2.1", dests(lb.Masq, "10.244.0.2:8080=1"), nil)},
	}, {
		name:  "endpoints Local: every ready endpoint, as with Cluster",
		svc:   tcpService(local),
		mode:  BackendsEndpoints,
		addrs: addrs("192.0.2.1"),
		eps:   []*discoveryv1.EndpointSlice{v4(ready("10.244.0.1", "a"), ready("10.244.1.1", "b"))},
		want:  []lb.VirtualService{wantVS("192.0.2.1", dests(lb.Masq, "10.244.0.1:8080=1", "10.244.1.1:8080=1"), nil)},
	}, {
		name:  "endpoints dual-stack: one virtual service per family, each with its family's slices",
		svc:   tcpService(nil),
		mode:  BackendsEndpoints,
		addrs: addrs("192.0.2.1", "2001:db8::1"),
		eps:   []*discoveryv1.EndpointSlice{v4(ready("10.244.0.1", "a")), v6(ready("fd00:244::1", "a"), draining("fd00:244::2", "b"))},
		want: []lb.VirtualService{
			wantVS("192.0.2.1", dests(lb.Masq, "10.244.0.1:8080=1"), nil),
			wantVS("2001:db8::1", dests(lb.Masq, "[fd00:244::1]:8080=1", "[fd00:244::2]:8080=0"), nil),
		},
	}, {
		name:  "the backends annotation overrides the default mode",
		svc:   tcpService(annotate(AnnotationBackends, BackendsEndpoints)),
		mode:  BackendsNodePort,
		addrs: addrs("192.0.2.1"),
		eps:   []*discoveryv1.EndpointSlice{v4(ready("10.244.0.1", "a"))},
		want:  []lb.VirtualService{wantVS("192.0.2.1", dests(lb.Masq, "10.244.0.1:8080=1"), nil)},
	}, {
		name:  "scheduler and flags annotations",
		svc:   tcpService(annotate(AnnotationScheduler, "sh", AnnotationSchedulerFlags, "sh-port, sh-fallback")),
		mode:  BackendsEndpoints,
		addrs: addrs("192.0.2.1"),
		eps:   []*discoveryv1.EndpointSlice{v4(ready("10.244.0.1", "a"))},
		want: []lb.VirtualService{wantVS("192.0.2.1", dests(lb.Masq, "10.244.0.1:8080=1"), func(vs *lb.VirtualService) {
			vs.Service.Scheduler, vs.Service.Flags = "sh", lb.SHPort|lb.SHFallback
		})},
	}, {
		name: "session affinity ClientIP: persistence with the Service's timeout, a host mask per family",
		svc: tcpService(func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
		}),
		mode:  BackendsEndpoints,
		addrs: addrs("192.0.2.1", "2001:db8::1"),
		want: []lb.VirtualService{
			wantVS("192.0.2.1", nil, func(vs *lb.VirtualService) { vs.Service.Persistent, vs.Service.Netmask = 60, 32 }),
			wantVS("2001:db8::1", nil, func(vs *lb.VirtualService) { vs.Service.Persistent, vs.Service.Netmask = 60, 128 }),
		},
	}, {
		name:  "droute forwarding at the Service's port",
		svc:   tcpService(annotate(AnnotationForwarding, "droute")),
		mode:  BackendsEndpoints,
		addrs: addrs("192.0.2.1"),
		eps:   []*discoveryv1.EndpointSlice{testSlice(discoveryv1.AddressTypeIPv4, http(80), ready("10.244.0.1", "a"))},
		want:  []lb.VirtualService{wantVS("192.0.2.1", dests(lb.DirectRoute, "10.244.0.1:80=1"), nil)},
	}, {
		name:   "droute forwarding cannot change the port: the endpoint is left out",
		svc:    tcpService(annotate(AnnotationForwarding, "droute")),
		mode:   BackendsEndpoints,
		addrs:  addrs("192.0.2.1"),
		eps:    []*discoveryv1.EndpointSlice{v4(ready("10.244.0.1", "a"))},
		want:   []lb.VirtualService{wantVS("192.0.2.1", []lb.Destination{}, nil)},
		reason: ReasonPortChange,
	}, {
		name:   "nodeport mode refuses droute forwarding",
		svc:    tcpService(annotate(AnnotationForwarding, "droute")),
		mode:   BackendsNodePort,
		addrs:  addrs("192.0.2.1"),
		reason: ReasonBadAnnotation,
	}, {
		name:   "a bad backends annotation",
		svc:    tcpService(annotate(AnnotationBackends, "pods")),
		mode:   BackendsNodePort,
		addrs:  addrs("192.0.2.1"),
		reason: ReasonBadAnnotation,
	}, {
		name: "source ranges: every VIP admits them, masked",
		svc: tcpService(func(s *corev1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.7/24", "2001:db8:1::/48"}
		}),
		mode:  BackendsEndpoints,
		addrs: addrs("192.0.2.1", "2001:db8::1"),
		want: []lb.VirtualService{
			wantVS("192.0.2.1", nil, func(vs *lb.VirtualService) {
				vs.Allow = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/48")}
			}),
			wantVS("2001:db8::1", nil, func(vs *lb.VirtualService) {
				vs.Allow = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/48")}
			}),
		},
	}, {
		name:  "a source-ranges annotation that does not parse admits no source",
		svc:   tcpService(annotate("service.beta.kubernetes.io/load-balancer-source-ranges", "10.0.0.0/8,nonsense")),
		mode:  BackendsEndpoints,
		addrs: addrs("192.0.2.1"),
		want:  []lb.VirtualService{wantVS("192.0.2.1", nil, func(vs *lb.VirtualService) { vs.Allow = []netip.Prefix{{}} })},
	}, {
		name:  "no address held: no virtual service",
		svc:   tcpService(nil),
		mode:  BackendsEndpoints,
		addrs: nil,
		eps:   []*discoveryv1.EndpointSlice{v4(ready("10.244.0.1", "a"))},
		want:  nil,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := translate(tt.svc, tt.mode, tt.addrs, nodes, tt.eps)
			reason := ""
			if err != nil {
				reason = "Error"
				var ae *AllocError
				if errors.As(err, &ae) {
					reason = ae.Reason
				}
			}
			if reason != tt.reason {
				t.Errorf("error %v (reason %q), want reason %q", err, reason, tt.reason)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got\n%s\nwant\n%s", showVS(got), showVS(tt.want))
			}
		})
	}
}

// showVS prints virtual services one a line, every field.
func showVS(vss []lb.VirtualService) string {
	var b strings.Builder
	for _, vs := range vss {
		fmt.Fprintf(&b, "%+v\n", vs)
	}
	return b.String()
}
