package kubernetes

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	checkdesc "github.com/vipd/vipd/monitor/check"
)

func testNode(name string, ready bool, labels map[string]string, addrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue}, {Type: corev1.NodeReady, Status: st}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "203.0.113.99"}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
	}
	return n
}

func testSlice(family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{AddressType: family, Ports: ports, Endpoints: eps}
}

func endpoint(addr, node string, ready, serving, terminating *bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}}
	if node != "" {
		e.NodeName = ptr.To(node)
	}
	return e
}

func dumpVS(svc *corev1.Service, addrs []string, mode string, nodes []*corev1.Node, eps []*discoveryv1.EndpointSlice) string {
	var vips []netip.Addr
	for _, a := range addrs {
		vips = append(vips, netip.MustParseAddr(a))
	}
	var lines []string
	st, err := parseSettings(svc, mode)
	if err != nil {
		return err.Error()
	}
	for _, vs := range virtualServices(svc, vips, st, nodes, eps) {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s %s", vs.Name, vs.Service.Key, vs.Service.Scheduler)
		if vs.Service.Flags != 0 {
			fmt.Fprintf(&b, " flags=%s", vs.Service.Flags)
		}
		if vs.Service.Persistent != 0 {
			fmt.Fprintf(&b, " persistent=%d/%d", vs.Service.Persistent, vs.Service.Netmask)
		}
		fmt.Fprintf(&b, " vip=%s announce=%t ->", vs.VIP, vs.Announce)
		for _, d := range vs.Backends {
			fmt.Fprintf(&b, " %s", d)
		}
		lines = append(lines, b.String())
	}
	return strings.Join(lines, "\n")
}

func TestMapping(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	nodes := []*corev1.Node{
		testNode("a", true, nil, "10.0.0.1", "fd00::1"),
		testNode("b", true, nil, "10.0.0.2"),
		testNode("c", false, nil, "10.0.0.3"),
		testNode("d", true, map[string]string{corev1.LabelNodeExcludeBalancers: ""}, "10.0.0.4"),
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080},
				{Name: "quic", Protocol: corev1.ProtocolUDP, Port: 443, NodePort: 30443},
				{Name: "sig", Protocol: corev1.ProtocolSCTP, Port: 3868},
			},
		},
	}
	http := discoveryv1.EndpointPort{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}
	quic := discoveryv1.EndpointPort{Name: ptr.To("quic"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](8443)}
	// A port of the same name but another protocol matches nothing.
	wrong := discoveryv1.EndpointPort{Name: ptr.To("sig"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](9999)}
	eps := []*discoveryv1.EndpointSlice{
		testSlice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{http, quic, wrong},
			endpoint("10.244.0.1", "a", nil, nil, nil), // ready by default
			endpoint("10.244.0.2", "b", no, yes, yes),  // draining
			endpoint("10.244.0.3", "b", no, no, yes),   // gone
			endpoint("10.244.0.4", "c", no, yes, no)),  // not ready, not terminating: out
		testSlice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{http},
			endpoint("10.244.0.2", "b", yes, yes, no)), // listed twice: ready wins
		testSlice(discoveryv1.AddressTypeIPv6, []discoveryv1.EndpointPort{http},
			endpoint("fd00:244::1", "a", yes, yes, no)),
		testSlice(discoveryv1.AddressTypeFQDN, []discoveryv1.EndpointPort{http},
			endpoint("example.com", "a", yes, yes, no)),
	}

	got := dumpVS(svc, []string{"192.0.2.1"}, BackendsNodePort, nodes, eps)
	want := `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.0.0.1:30080 masq weight=1 10.0.0.2:30080 masq weight=1
k8s/ns/web/quic/udp udp 192.0.2.1:443 wlc vip=192.0.2.1 announce=true -> 10.0.0.1:30443 masq weight=1 10.0.0.2:30443 masq weight=1
k8s/ns/web/sig/sctp sctp 192.0.2.1:3868 wlc vip=192.0.2.1 announce=true ->`
	if got != want {
		t.Errorf("nodeport:\n%s\nwant:\n%s", got, want)
	}

	// externalTrafficPolicy Local: nodes with a ready endpoint (a; b has
	// a draining one only); session affinity with the default
	// timeout; IPv6.
	local := svc.DeepCopy()
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	local.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	local.Spec.Ports = local.Spec.Ports[:1]
	got = dumpVS(local, []string{"192.0.2.1", "2001:db8::1"}, BackendsNodePort, nodes, eps[:1])
	want = `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc persistent=10800/32 vip=192.0.2.1 announce=true -> 10.0.0.1:30080 masq weight=1
k8s/ns/web/http/tcp/ipv6 tcp [2001:db8::1]:80 wlc persistent=10800/128 vip=2001:db8::1 announce=true -> [fd00::1]:30080 masq weight=1`
	if got != want {
		t.Errorf("local:\n%s\nwant:\n%s", got, want)
	}

	got = dumpVS(svc, []string{"192.0.2.1", "2001:db8::1"}, BackendsEndpoints, nodes, eps)
	want = `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.244.0.1:8080 masq weight=1 10.244.0.2:8080 masq weight=1
k8s/ns/web/quic/udp udp 192.0.2.1:443 wlc vip=192.0.2.1 announce=true -> 10.244.0.1:8443 masq weight=1 10.244.0.2:8443 masq weight=0
k8s/ns/web/sig/sctp sctp 192.0.2.1:3868 wlc vip=192.0.2.1 announce=true ->
k8s/ns/web/http/tcp/ipv6 tcp [2001:db8::1]:80 wlc vip=2001:db8::1 announce=true -> [fd00:244::1]:8080 masq weight=1
k8s/ns/web/quic/udp/ipv6 udp [2001:db8::1]:443 wlc vip=2001:db8::1 announce=true ->
k8s/ns/web/sig/sctp/ipv6 sctp [2001:db8::1]:3868 wlc vip=2001:db8::1 announce=true ->`
	if got != want {
		t.Errorf("endpoints:\n%s\nwant:\n%s", got, want)
	}
}

func TestCheckAnnotation(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web",
		Annotations: map[string]string{AnnotationCheck: `{ type = "http", path = "/healthz", interval = "2s" }`}}}
	st, err := parseSettings(svc, BackendsNodePort)
	if err != nil {
		t.Fatal(err)
	}
	if st.check == nil || st.check.Kind != checkdesc.KindHTTP || st.check.HTTP.Path != "/healthz" || st.check.Interval != 2*time.Second {
		t.Errorf("check %+v", st.check)
	}
}

func TestSettingsAnnotations(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}}},
	}
	nodes := []*corev1.Node{testNode("a", true, nil, "10.0.0.1")}
	for _, tc := range []struct {
		annotations map[string]string
		want        string
	}{
		{map[string]string{AnnotationScheduler: "sh", AnnotationSchedulerFlags: "sh-port, sh-fallback"},
			"k8s/ns/web/http/tcp tcp 192.0.2.1:80 sh flags=sh-fallback,sh-port vip=192.0.2.1 announce=true -> 10.0.0.1:30080 masq weight=1"},
		{map[string]string{AnnotationScheduler: "mh", AnnotationBackends: "endpoints"},
			"k8s/ns/web/http/tcp tcp 192.0.2.1:80 mh vip=192.0.2.1 announce=true ->"},
		{map[string]string{AnnotationScheduler: "random"},
			`vipd.io/scheduler: unknown scheduler "random" (want one of rr wrr lc wlc lblc lblcr dh sh sed nq fo ovf mh twos)`},
		{map[string]string{AnnotationSchedulerFlags: "sh-port"},
			`vipd.io/scheduler-flags: scheduler flag "sh-port" needs scheduler "sh", not "wlc"`},
		{map[string]string{AnnotationScheduler: "mh", AnnotationSchedulerFlags: "mh-foo"},
			`vipd.io/scheduler-flags: unknown scheduler flag "mh-foo" (want sh-fallback, sh-port, mh-fallback or mh-port)`},
		{map[string]string{AnnotationBackends: "pods"},
			`vipd.io/backends "pods" must be "nodeport" or "endpoints"`},
		{map[string]string{AnnotationCheck: `{ type = "exec", command = "/bin/true" }`},
			`vipd.io/check: exec checks are not allowed from an annotation: they would run commands on the load balancer`},
		{map[string]string{AnnotationCheck: `{ type = "tcp", rise = 0, fall = 2000 }`},
			`vipd.io/check: rise and fall must be within 1..1000`},
	} {
		s := svc.DeepCopy()
		s.Annotations = tc.annotations
		if got := dumpVS(s, []string{"192.0.2.1"}, BackendsNodePort, nodes, nil); got != tc.want {
			t.Errorf("%v:\n%s\nwant:\n%s", tc.annotations, got, tc.want)
		}
	}
}

// TestTerminatingFallback: when no endpoint of a port and family is
// ready, the serving and terminating ones carry traffic (KEP-1669), so
// that a single-replica rollout does not go dark; once one is ready, they
// drain. With externalTrafficPolicy Local the node choice does the same.
func TestTerminatingFallback(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	nodes := []*corev1.Node{
		testNode("a", true, nil, "10.0.0.1"),
		testNode("b", true, nil, "10.0.0.2"),
		testNode("c", true, nil, "10.0.0.3"),
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, NodePort: 30053},
			},
		},
	}
	http := discoveryv1.EndpointPort{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}
	dns := discoveryv1.EndpointPort{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](5353)}
	old := endpoint("10.244.0.1", "a", no, yes, yes)    // the old replica, terminating but serving
	gone := endpoint("10.244.0.9", "c", no, no, yes)    // terminating and no longer serving: never
	starting := endpoint("10.244.0.2", "b", no, no, no) // the new replica, not ready yet
	ready := endpoint("10.244.0.2", "b", yes, yes, no)  // the new replica, ready
	// dns has a ready endpoint of its own throughout: its terminating one
	// drains.
	dnsSlice := testSlice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{dns},
		endpoint("10.244.0.1", "a", no, yes, yes), endpoint("10.244.0.3", "c", yes, yes, no))

	// During the rollout: the old replica carries http.
	eps := []*discoveryv1.EndpointSlice{testSlice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{http}, old, gone, starting), dnsSlice}
	got := dumpVS(svc, []string{"192.0.2.1"}, BackendsEndpoints, nodes, eps)
	want := `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.244.0.1:8080 masq weight=1
k8s/ns/web/dns/udp udp 192.0.2.1:53 wlc vip=192.0.2.1 announce=true -> 10.244.0.1:5353 masq weight=0 10.244.0.3:5353 masq weight=1`
	if got != want {
		t.Errorf("endpoints, none ready:\n%s\nwant:\n%s", got, want)
	}
	// Local, no ready endpoint: the node of the serving terminating one.
	got = dumpVS(svc, []string{"192.0.2.1"}, BackendsNodePort, nodes, eps[:1])
	want = `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.0.0.1:30080 masq weight=1
k8s/ns/web/dns/udp udp 192.0.2.1:53 wlc vip=192.0.2.1 announce=true -> 10.0.0.1:30053 masq weight=1`
	if got != want {
		t.Errorf("nodeport local, none ready:\n%s\nwant:\n%s", got, want)
	}

	// The new replica is ready: the old one drains, its node leaves.
	eps[0] = testSlice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{http}, old, gone, ready)
	got = dumpVS(svc, []string{"192.0.2.1"}, BackendsEndpoints, nodes, eps)
	want = `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.244.0.1:8080 masq weight=0 10.244.0.2:8080 masq weight=1
k8s/ns/web/dns/udp udp 192.0.2.1:53 wlc vip=192.0.2.1 announce=true -> 10.244.0.1:5353 masq weight=0 10.244.0.3:5353 masq weight=1`
	if got != want {
		t.Errorf("endpoints, one ready:\n%s\nwant:\n%s", got, want)
	}
	got = dumpVS(svc, []string{"192.0.2.1"}, BackendsNodePort, nodes, eps[:1])
	want = `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.0.0.2:30080 masq weight=1
k8s/ns/web/dns/udp udp 192.0.2.1:53 wlc vip=192.0.2.1 announce=true -> 10.0.0.2:30053 masq weight=1`
	if got != want {
		t.Errorf("nodeport local, one ready:\n%s\nwant:\n%s", got, want)
	}

	// Nothing serving at all: no backend, no node.
	eps = []*discoveryv1.EndpointSlice{testSlice(discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{http}, gone, starting)}
	got = dumpVS(svc, []string{"192.0.2.1"}, BackendsEndpoints, nodes, eps) + "\n" + dumpVS(svc, []string{"192.0.2.1"}, BackendsNodePort, nodes, eps)
	want = `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true ->
k8s/ns/web/dns/udp udp 192.0.2.1:53 wlc vip=192.0.2.1 announce=true ->
k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true ->
k8s/ns/web/dns/udp udp 192.0.2.1:53 wlc vip=192.0.2.1 announce=true ->`
	if got != want {
		t.Errorf("none serving:\n%s\nwant:\n%s", got, want)
	}
}

// TestLocalWeights: with externalTrafficPolicy Local a Node weighs its
// ready endpoints of the VIP's family, counted once per address whatever
// the number of slices that list them; with none ready anywhere, its
// serving and terminating ones; a Service without a slice of the family
// counts the others.
func TestLocalWeights(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	nodes := []*corev1.Node{
		testNode("a", true, nil, "10.0.0.1", "fd00::1"),
		testNode("b", true, nil, "10.0.0.2", "fd00::2"),
		testNode("c", true, nil, "10.0.0.3", "fd00::3"),
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}}},
	}
	http := []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}}
	v4 := []*discoveryv1.EndpointSlice{
		testSlice(discoveryv1.AddressTypeIPv4, http,
			endpoint("10.244.0.1", "a", yes, yes, no), endpoint("10.244.0.2", "a", yes, yes, no), endpoint("10.244.0.3", "a", yes, yes, no),
			endpoint("10.244.1.1", "b", yes, yes, no), endpoint("10.244.1.2", "b", no, yes, yes),
			endpoint("10.244.2.1", "c", no, no, no)),
		// A second slice that lists an endpoint again.
		testSlice(discoveryv1.AddressTypeIPv4, http, endpoint("10.244.0.3", "a", yes, yes, no)),
	}
	got := dumpVS(svc, []string{"192.0.2.1"}, BackendsNodePort, nodes, v4)
	want := `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.0.0.1:30080 masq weight=3 10.0.0.2:30080 masq weight=1`
	if got != want {
		t.Errorf("ready:\n%s\nwant:\n%s", got, want)
	}
	// Dual stack: the IPv6 slice has one endpoint on c, which the IPv6
	// VIP alone follows.
	v6 := testSlice(discoveryv1.AddressTypeIPv6, http, endpoint("fd00:244::1", "c", yes, yes, no))
	got = dumpVS(svc, []string{"192.0.2.1", "2001:db8::1"}, BackendsNodePort, nodes, append(v4, v6))
	want = `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.0.0.1:30080 masq weight=3 10.0.0.2:30080 masq weight=1
k8s/ns/web/http/tcp/ipv6 tcp [2001:db8::1]:80 wlc vip=2001:db8::1 announce=true -> [fd00::3]:30080 masq weight=1`
	if got != want {
		t.Errorf("dual stack:\n%s\nwant:\n%s", got, want)
	}
	// None ready: the terminating ones, weighted.
	term := []*discoveryv1.EndpointSlice{testSlice(discoveryv1.AddressTypeIPv4, http,
		endpoint("10.244.0.1", "a", no, yes, yes), endpoint("10.244.0.2", "a", no, yes, yes), endpoint("10.244.1.1", "b", no, yes, yes),
		endpoint("10.244.2.1", "c", no, no, yes))}
	got = dumpVS(svc, []string{"192.0.2.1"}, BackendsNodePort, nodes, term)
	want = `k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.0.0.1:30080 masq weight=2 10.0.0.2:30080 masq weight=1`
	if got != want {
		t.Errorf("terminating:\n%s\nwant:\n%s", got, want)
	}
	// Many endpoints on one Node: the weight is bounded.
	many := testSlice(discoveryv1.AddressTypeIPv4, http)
	for i := range maxNodeWeight + 5 {
		many.Endpoints = append(many.Endpoints, endpoint(fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256), "a", yes, yes, no))
	}
	got = dumpVS(svc, []string{"192.0.2.1"}, BackendsNodePort, nodes, []*discoveryv1.EndpointSlice{many})
	want = fmt.Sprintf(`k8s/ns/web/http/tcp tcp 192.0.2.1:80 wlc vip=192.0.2.1 announce=true -> 10.0.0.1:30080 masq weight=%d`, maxNodeWeight)
	if got != want {
		t.Errorf("many:\n%s\nwant:\n%s", got, want)
	}
}
