package kubernetes_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/source"
	"github.com/vipd/vipd/source/kubernetes"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// testNodeHealth is the node probing of the tests: kube-proxy's port.
var testNodeHealth = &kubernetes.NodeHealth{Port: 10256, Path: "/healthz", Local: true, Interval: time.Second, Timeout: 500 * time.Millisecond, Rise: 2, Fall: 2}

// dumpHealth formats the health checking and SNAT of a snapshot's
// services, one line per service, sorted.
func dumpHealth(snap source.Snapshot) string {
	var lines []string
	for _, vs := range snap.Services {
		var b strings.Builder
		fmt.Fprintf(&b, "%s snat=%t", vs.Name, vs.SNAT)
		if h, ok := snap.Health[vs.Name]; ok {
			fmt.Fprintf(&b, " policy=%s/%d", h.Policy.Action, h.Policy.Quorum)
			for _, d := range vs.Backends {
				spec, ok := h.Checks[d.Addr]
				if !ok {
					fmt.Fprintf(&b, " %s:unchecked", d.Addr)
					continue
				}
				fmt.Fprintf(&b, " %s:%s", spec.Target(d.Addr), spec.Kind)
				if spec.HTTP.Path != "" {
					fmt.Fprintf(&b, "%s", spec.HTTP.Path)
				}
				fmt.Fprintf(&b, ",initial=%s", spec.Initial)
				for _, r := range spec.HTTP.Status {
					fmt.Fprintf(&b, ",status=%s", r)
				}
				if spec.Interval != 0 {
					fmt.Fprintf(&b, ",every=%s,fall=%d", spec.Interval, spec.Fall)
				}
			}
		}
		lines = append(lines, b.String())
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// waitHealth waits until the sink's last snapshot's health dumps as want.
func waitHealth(t *testing.T, sink *fakeSink, want string) {
	t.Helper()
	want = strings.TrimSpace(want)
	deadline := time.Now().Add(timeout)
	for {
		sink.mu.Lock()
		got := "(nothing published)"
		if n := len(sink.snaps); n > 0 {
			got = dumpHealth(sink.snaps[n-1])
		}
		sink.mu.Unlock()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health:\n%s\nwant:\n%s", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readyNode(name, addr string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}},
		},
	}
}

// TestNodeHealthFake: in nodeport mode every Node of a Cluster Service is
// probed at kube-proxy's health port, and of a Local Service at its
// healthCheckNodePort, with the same check for every Service (so that
// the checker probes each Node once); a Node weighs its local endpoints;
// vipd.io/check replaces the probe; endpoints mode and the Services of a
// source without NodeHealth are not probed.
func TestNodeHealthFake(t *testing.T) {
	http := port("http", corev1.ProtocolTCP, 80)
	http.NodePort = 30080
	other := port("http", corev1.ProtocolTCP, 80)
	other.NodePort = 30081
	local := fakeService("local", nil, http)
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	local.Spec.HealthCheckNodePort = 32001
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "local-1", Labels: map[string]string{discoveryv1.LabelServiceName: "local"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)},
	}
	for i, node := range []string{"n1", "n1", "n1", "n2", "n3"} {
		ready := node != "n3"
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.0.%d", i+1)}, NodeName: ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}})
	}
	objs := []runtime.Object{
		readyNode("n1", "10.0.0.1"), readyNode("n2", "10.0.0.2"), readyNode("n3", "10.0.0.3"),
		stamped(fakeService("a", nil, http), 1),
		stamped(fakeService("b", nil, other), 2),
		stamped(local, 3),
		slice,
		stamped(fakeService("own", map[string]string{kubernetes.AnnotationCheck: `{ type = "tcp" }`}, http), 4),
		stamped(fakeService("pods", map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}, http), 5),
	}

	sink := &fakeSink{}
	runFake(t, kubernetes.Options{Pools: pools("192.0.2.0/29"), NodeHealth: testNodeHealth}, sink, objs...)
	waitSnap(t, sink, `
k8s/ns/a/http/tcp tcp 192.0.2.0:80 -> 10.0.0.1:30080/1 10.0.0.2:30080/1 10.0.0.3:30080/1
k8s/ns/b/http/tcp tcp 192.0.2.1:80 -> 10.0.0.1:30081/1 10.0.0.2:30081/1 10.0.0.3:30081/1
k8s/ns/local/http/tcp tcp 192.0.2.2:80 -> 10.0.0.1:30080/3 10.0.0.2:30080/1
k8s/ns/own/http/tcp tcp 192.0.2.3:80 -> 10.0.0.1:30080/1 10.0.0.2:30080/1 10.0.0.3:30080/1
k8s/ns/pods/http/tcp tcp 192.0.2.4:80 ->`)
	waitHealth(t, sink, `
k8s/ns/a/http/tcp snat=false policy=remove/1 10.0.0.1:10256:http/healthz,initial=up,status=200,every=1s,fall=2 10.0.0.2:10256:http/healthz,initial=up,status=200,every=1s,fall=2 10.0.0.3:10256:http/healthz,initial=up,status=200,every=1s,fall=2
k8s/ns/b/http/tcp snat=false policy=remove/1 10.0.0.1:10256:http/healthz,initial=up,status=200,every=1s,fall=2 10.0.0.2:10256:http/healthz,initial=up,status=200,every=1s,fall=2 10.0.0.3:10256:http/healthz,initial=up,status=200,every=1s,fall=2
k8s/ns/local/http/tcp snat=false policy=remove/1 10.0.0.1:32001:http/healthz,initial=up,status=200,every=1s,fall=2 10.0.0.2:32001:http/healthz,initial=up,status=200,every=1s,fall=2
k8s/ns/own/http/tcp snat=false policy=quiesce/0 10.0.0.1:30080:tcp,initial=down 10.0.0.2:30080:tcp,initial=down 10.0.0.3:30080:tcp,initial=down
k8s/ns/pods/http/tcp snat=false`)
	// One check per Node, whatever the Service: the checker keys its
	// checks by spec and target.
	sink.mu.Lock()
	snap := sink.snaps[len(sink.snaps)-1]
	sink.mu.Unlock()
	a, b := snap.Health["k8s/ns/a/http/tcp"], snap.Health["k8s/ns/b/http/tcp"]
	for _, n := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		sa, sb := a.Checks[mustAddrPort(n+":30080")], b.Checks[mustAddrPort(n+":30081")]
		if sa.Target(mustAddrPort(n+":30080")) != sb.Target(mustAddrPort(n+":30081")) || fmt.Sprint(sa) != fmt.Sprint(sb) {
			t.Errorf("node %s: Services a and b probe it differently: %+v and %+v", n, sa, sb)
		}
	}

	// Without NodeHealth, nothing is probed but what asks for it.
	sink = &fakeSink{}
	runFake(t, kubernetes.Options{Pools: pools("192.0.2.0/29")}, sink, objs...)
	waitHealth(t, sink, `
k8s/ns/a/http/tcp snat=false
k8s/ns/b/http/tcp snat=false
k8s/ns/local/http/tcp snat=false
k8s/ns/own/http/tcp snat=false policy=quiesce/0 10.0.0.1:30080:tcp,initial=down 10.0.0.2:30080:tcp,initial=down 10.0.0.3:30080:tcp,initial=down
k8s/ns/pods/http/tcp snat=false`)

	// Port 0 leaves Cluster Services unprobed; without Local, Local
	// Services are probed as Cluster ones.
	sink = &fakeSink{}
	runFake(t, kubernetes.Options{Pools: pools("192.0.2.0/29"), NodeHealth: &kubernetes.NodeHealth{Path: "/healthz", Local: true}}, sink, objs...)
	waitHealth(t, sink, `
k8s/ns/a/http/tcp snat=false
k8s/ns/b/http/tcp snat=false
k8s/ns/local/http/tcp snat=false policy=remove/1 10.0.0.1:32001:http/healthz,initial=up,status=200 10.0.0.2:32001:http/healthz,initial=up,status=200
k8s/ns/own/http/tcp snat=false policy=quiesce/0 10.0.0.1:30080:tcp,initial=down 10.0.0.2:30080:tcp,initial=down 10.0.0.3:30080:tcp,initial=down
k8s/ns/pods/http/tcp snat=false`)
	sink = &fakeSink{}
	runFake(t, kubernetes.Options{Pools: pools("192.0.2.0/29"), NodeHealth: &kubernetes.NodeHealth{Port: 9876, Path: "/livez"}}, sink, objs...)
	waitHealth(t, sink, `
k8s/ns/a/http/tcp snat=false policy=remove/1 10.0.0.1:9876:http/livez,initial=up,status=200 10.0.0.2:9876:http/livez,initial=up,status=200 10.0.0.3:9876:http/livez,initial=up,status=200
k8s/ns/b/http/tcp snat=false policy=remove/1 10.0.0.1:9876:http/livez,initial=up,status=200 10.0.0.2:9876:http/livez,initial=up,status=200 10.0.0.3:9876:http/livez,initial=up,status=200
k8s/ns/local/http/tcp snat=false policy=remove/1 10.0.0.1:9876:http/livez,initial=up,status=200 10.0.0.2:9876:http/livez,initial=up,status=200
k8s/ns/own/http/tcp snat=false policy=quiesce/0 10.0.0.1:30080:tcp,initial=down 10.0.0.2:30080:tcp,initial=down 10.0.0.3:30080:tcp,initial=down
k8s/ns/pods/http/tcp snat=false`)
}

// TestNodeHealthOptions: New refuses node probing it could not run.
func TestNodeHealthOptions(t *testing.T) {
	for _, tc := range []struct {
		nh   kubernetes.NodeHealth
		want string
	}{
		{kubernetes.NodeHealth{Port: 10256, Path: "healthz"}, `kubernetes: node_health: http path "healthz" does not start with /`},
		{kubernetes.NodeHealth{Port: 10256, Path: "/healthz", Interval: time.Millisecond}, "kubernetes: node_health: interval 1ms is shorter than 10ms"},
		{kubernetes.NodeHealth{Port: 10256, Path: "/healthz", Fall: -1}, "kubernetes: node_health: fall -1 is less than 1"},
	} {
		nh := tc.nh
		_, err := kubernetes.New(kubernetes.Options{DefaultClass: true, Pools: pools("192.0.2.0/29"), NodeHealth: &nh})
		if err == nil || err.Error() != tc.want {
			t.Errorf("%+v: %v, want %s", tc.nh, err, tc.want)
		}
	}
}

// TestSNATFake: a pool's snat makes its masq Services SNAT; vipd.io/snat
// overrides it either way; direct routing never SNATs (and asking for it
// is a bad annotation); without packet-filter rules a Service that asks
// for SNAT is not served, with an Event.
func TestSNATFake(t *testing.T) {
	http := port("http", corev1.ProtocolTCP, 80)
	http.NodePort = 30080
	snat := func(v string) map[string]string { return map[string]string{kubernetes.AnnotationSNAT: v} }
	onearm := []kubernetes.Pool{{Name: "onearm", Addresses: []string{"192.0.2.0/30"}, SNAT: true}, {Name: "routed", Addresses: []string{"192.0.2.8/30"}}}
	pick := func(pool string, extra map[string]string) map[string]string {
		m := map[string]string{kubernetes.AnnotationPool: pool}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	objs := []runtime.Object{
		readyNode("n1", "10.0.0.1"),
		stamped(fakeService("pooled", pick("onearm", nil), http), 1),
		stamped(fakeService("optout", pick("onearm", snat("false")), http), 2),
		stamped(fakeService("routed", pick("routed", nil), http), 3),
		stamped(fakeService("optin", pick("routed", snat("true")), http), 4),
		stamped(fakeService("dr", pick("onearm", map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints, kubernetes.AnnotationForwarding: "dr"}), http), 5),
		stamped(fakeService("drsnat", pick("routed", map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints,
			kubernetes.AnnotationForwarding: "dr", kubernetes.AnnotationSNAT: "true"}), http), 6),
		stamped(fakeService("bad", pick("routed", snat("yes please")), http), 7),
	}
	sink := &fakeSink{}
	cs := runFake(t, kubernetes.Options{Pools: onearm}, sink, objs...)
	waitHealth(t, sink, `
k8s/ns/bad/http/tcp snat=false
k8s/ns/dr/http/tcp snat=false
k8s/ns/drsnat/http/tcp snat=false
k8s/ns/optin/http/tcp snat=true
k8s/ns/optout/http/tcp snat=false
k8s/ns/pooled/http/tcp snat=true
k8s/ns/routed/http/tcp snat=false`)
	waitFakeEvent(t, cs, "drsnat", kubernetes.ReasonBadAnnotation, `vipd.io/snat: SNAT needs masq forwarding, not droute`)
	waitFakeEvent(t, cs, "bad", kubernetes.ReasonBadAnnotation, `vipd.io/snat "yes please" must be "true" or "false"`)

	sink = &fakeSink{}
	cs = runFake(t, kubernetes.Options{Pools: onearm, NoPacketFilter: true}, sink, objs...)
	waitHealth(t, sink, `
k8s/ns/bad/http/tcp snat=false
k8s/ns/dr/http/tcp snat=false
k8s/ns/drsnat/http/tcp snat=false
k8s/ns/optout/http/tcp snat=false
k8s/ns/routed/http/tcp snat=false`)
	const why = "the Service asks for SNAT, and vipd keeps no packet-filter rules to do it ([daemon] manage_iptables is off): it is not served"
	waitFakeEvent(t, cs, "pooled", kubernetes.ReasonSNATUnavailable, why)
	waitFakeEvent(t, cs, "optin", kubernetes.ReasonSNATUnavailable, why)
}

func mustAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// testNodeHealth, against the real API server: a Cluster Service's Nodes
// are probed at kube-proxy's health port; once the Service turns Local,
// at the healthCheckNodePort the API server allocated, with each Node
// weighted by its ready endpoints; a pool's snat makes the Service SNAT
// and vipd.io/snat "false" takes it back.
func (e *env) testNodeHealth(t *testing.T) {
	ns := e.namespace(t)
	e.node(t, "nh-a", true, "10.0.1.1")
	e.node(t, "nh-b", true, "10.0.1.2")
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, NodeHealth: testNodeHealth,
		Pools: []kubernetes.Pool{{Name: "onearm", Addresses: []string{"192.0.2.40/30"}, SNAT: true}}}, sink)
	svc := e.create(t, lbService(ns, "web", port("http", corev1.ProtocolTCP, 80)))
	np := svc.Spec.Ports[0].NodePort
	e.waitStatus(t, ns, "web", "192.0.2.40")
	waitSnap(t, sink, fmt.Sprintf(`k8s/%[1]s/web/http/tcp tcp 192.0.2.40:80 -> 10.0.1.1:%[2]d/1 10.0.1.2:%[2]d/1`, ns, np))
	probe := "http/healthz,initial=up,status=200,every=1s,fall=2"
	waitHealth(t, sink, fmt.Sprintf(`k8s/%s/web/http/tcp snat=true policy=remove/1 10.0.1.1:10256:%[2]s 10.0.1.2:10256:%[2]s`, ns, probe))

	svc = e.update(t, ns, "web", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	hc := svc.Spec.HealthCheckNodePort
	if hc == 0 {
		t.Fatal("the API server allocated no healthCheckNodePort")
	}
	e.slice(t, ns, "web", "web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)},
		ep{addr: "10.244.1.1", node: "nh-a", ready: true, serving: true},
		ep{addr: "10.244.1.2", node: "nh-a", ready: true, serving: true},
		ep{addr: "10.244.1.3", node: "nh-a", ready: true, serving: true},
		ep{addr: "10.244.2.1", node: "nh-b", ready: true, serving: true},
		ep{addr: "10.244.2.2", node: "nh-b", ready: false, serving: false})
	waitSnap(t, sink, fmt.Sprintf(`k8s/%[1]s/web/http/tcp tcp 192.0.2.40:80 -> 10.0.1.1:%[2]d/3 10.0.1.2:%[2]d/1`, ns, np))
	waitHealth(t, sink, fmt.Sprintf(`k8s/%s/web/http/tcp snat=true policy=remove/1 10.0.1.1:%[3]d:%[2]s 10.0.1.2:%[3]d:%[2]s`, ns, probe, hc))

	// The tenant turns SNAT off for its Service (and so keeps the
	// client's address, at the price of routing replies through vipd).
	e.update(t, ns, "web", func(s *corev1.Service) {
		s.Annotations = map[string]string{kubernetes.AnnotationSNAT: "false"}
	})
	waitHealth(t, sink, fmt.Sprintf(`k8s/%s/web/http/tcp snat=false policy=remove/1 10.0.1.1:%[3]d:%[2]s 10.0.1.2:%[3]d:%[2]s`, ns, probe, hc))
}
