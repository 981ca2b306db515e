package kubernetes_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/source/kubernetes"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// runFake runs a source against client-go's fake clientset holding objs
// until the test ends.
func runFake(t *testing.T, opts kubernetes.Options, sink *fakeSink, objs ...runtime.Object) *fake.Clientset {
	t.Helper()
	cs := fake.NewClientset(objs...)
	runSource(t, opts, cs, sink)
	return cs
}

// runSource runs a source of opts, serving Services of no class and
// electing no leader unless opts say so, against cs until the test ends.
func runSource(t *testing.T, opts kubernetes.Options, cs clientset.Interface, sink *fakeSink) *kubernetes.Source {
	t.Helper()
	src, stop := startSource(t, opts, cs, sink)
	t.Cleanup(stop)
	return src
}

// startSource starts a source as runSource does, and returns it with the
// function that stops it and waits for Run to return.
func startSource(t *testing.T, opts kubernetes.Options, cs clientset.Interface, sink *fakeSink) (*kubernetes.Source, func()) {
	t.Helper()
	opts.DefaultClass = true
	if opts.LeaderElection == nil {
		opts.LeaderElection = ptr.To(false)
	}
	opts.Kubeconfig = "unused"
	src, err := kubernetes.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	kubernetes.UseClient(src, cs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	var once sync.Once
	return src, func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}

// waitFakeEvent waits for a warning Event with reason on the Service whose
// message is want.
func waitFakeEvent(t *testing.T, cs *fake.Clientset, name, reason, want string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs, err := cs.CoreV1().Events("ns").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == name && ev.InvolvedObject.Kind == "Service" && ev.Type == corev1.EventTypeWarning && ev.Reason == reason && ev.Message == want {
				return
			}
			seen = append(seen, ev.InvolvedObject.Name+" "+ev.Reason+": "+ev.Message)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event %q on ns/%s; events:\n%s", reason, want, name, strings.Join(seen, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func fakeService(name string, annotations map[string]string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: annotations},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: ports},
	}
}

func fakeSlice(svc, name string, ports []discoveryv1.EndpointPort, addrs ...string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return es
}

// TestForwardingAnnotation runs the source against the fake clientset:
// vipd.io/forwarding picks the method of endpoints backends, with the
// file's messages as Events when it is bad or asks for what the backends
// cannot do.
func TestForwardingAnnotation(t *testing.T) {
	http := port("http", corev1.ProtocolTCP, 80)
	named := http
	named.TargetPort = intstr.FromString("web")
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}},
		},
	}
	withNodePort := http
	withNodePort.NodePort = 30080
	endpoints := map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	sink := &fakeSink{}
	cs := runFake(t, kubernetes.Options{Pools: pools("192.0.2.0/29")}, sink,
		node,
		// The fake clientset hands out no cluster IPs and no node ports:
		// creationTimestamps order the allocation.
		stamped(fakeService("dr", with(map[string]string{kubernetes.AnnotationForwarding: "dr"}), http), 1),
		fakeSlice("dr", "dr-1", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 80)}, "10.244.0.1", "10.244.0.2"),
		stamped(fakeService("tun", with(map[string]string{kubernetes.AnnotationForwarding: "tunnel"}), named), 2),
		fakeSlice("tun", "tun-1", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 80)}, "10.244.1.1"),
		fakeSlice("tun", "tun-2", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}, "10.244.1.2"),
		stamped(fakeService("nat", with(map[string]string{kubernetes.AnnotationForwarding: "nat"}), http), 3),
		fakeSlice("nat", "nat-1", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}, "10.244.2.1"),
		stamped(fakeService("bad", with(map[string]string{kubernetes.AnnotationForwarding: "fullnat"}), http), 4),
		fakeSlice("bad", "bad-1", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}, "10.244.3.1"),
		stamped(fakeService("np", map[string]string{kubernetes.AnnotationForwarding: "droute"}, withNodePort), 5),
	)
	// bad has no valid settings yet: the defaults (nodeport mode, where
	// the fake gave it no node port).
	waitSnap(t, sink, `
k8s/ns/bad/http/tcp tcp 192.0.2.3:80 ->
k8s/ns/dr/http/tcp tcp 192.0.2.0:80 -> 10.244.0.1:80/1/droute 10.244.0.2:80/1/droute
k8s/ns/nat/http/tcp tcp 192.0.2.2:80 -> 10.244.2.1:8080/1
k8s/ns/np/http/tcp tcp 192.0.2.4:80 -> 10.0.0.1:30080/1
k8s/ns/tun/http/tcp tcp 192.0.2.1:80 -> 10.244.1.1:80/1/tunnel`)
	waitFakeEvent(t, cs, "bad", kubernetes.ReasonBadAnnotation, `vipd.io/forwarding: forward "fullnat" must be masq, droute or tunnel`)
	waitFakeEvent(t, cs, "np", kubernetes.ReasonBadAnnotation, `vipd.io/forwarding: a nodeport service forwards with masq, not droute`)
	waitFakeEvent(t, cs, "tun", kubernetes.ReasonPortChange,
		`vipd.io/forwarding: tunnel forwarding cannot change the port (80 to 8080): the backend sees the VIP's packet unchanged; endpoint 10.244.1.2:8080 left out`)
	// The status writes follow the data plane's snapshot, on their own.
	for i, name := range []string{"dr", "tun", "nat", "bad", "np"} {
		waitStatusOf(t, cs, name, fmt.Sprintf("192.0.2.%d", i), func(*corev1.Service) bool { return true })
	}

	// A bad value keeps the last good method; a good one ends the
	// problem.
	update := func(name string, f func(*corev1.Service)) {
		t.Helper()
		svc, err := cs.CoreV1().Services("ns").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f(svc)
		if _, err := cs.CoreV1().Services("ns").Update(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	update("dr", func(s *corev1.Service) { s.Annotations[kubernetes.AnnotationForwarding] = "direct" })
	waitFakeEvent(t, cs, "dr", kubernetes.ReasonBadAnnotation, `vipd.io/forwarding: forward "direct" must be masq, droute or tunnel`)
	update("bad", func(s *corev1.Service) { s.Annotations[kubernetes.AnnotationForwarding] = "masq" })
	update("np", func(s *corev1.Service) { s.Annotations = endpoints })
	waitSnap(t, sink, `
k8s/ns/bad/http/tcp tcp 192.0.2.3:80 -> 10.244.3.1:8080/1
k8s/ns/dr/http/tcp tcp 192.0.2.0:80 -> 10.244.0.1:80/1/droute 10.244.0.2:80/1/droute
k8s/ns/nat/http/tcp tcp 192.0.2.2:80 -> 10.244.2.1:8080/1
k8s/ns/np/http/tcp tcp 192.0.2.4:80 ->
k8s/ns/tun/http/tcp tcp 192.0.2.1:80 -> 10.244.1.1:80/1/tunnel`)
}

// TestNoNodePorts: a Service that asks for no node ports
// (spec.allocateLoadBalancerNodePorts false) gets no backends in
// nodeport mode, and a warning Event says so; in endpoints mode it is
// served.
func TestNoNodePorts(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}},
		},
	}
	web := fakeService("web", nil, port("http", corev1.ProtocolTCP, 80), port("", corev1.ProtocolUDP, 53))
	web.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	sink := &fakeSink{}
	cs := runFake(t, kubernetes.Options{Pools: pools("192.0.2.8/29")}, sink, node, web,
		fakeSlice("web", "web-1", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080), epPort("", corev1.ProtocolUDP, 5353)}, "10.244.0.1"))
	waitSnap(t, sink, `
k8s/ns/web/53/udp udp 192.0.2.8:53 ->
k8s/ns/web/http/tcp tcp 192.0.2.8:80 ->`)
	waitFakeEvent(t, cs, "web", kubernetes.ReasonNoNodePorts,
		`port http/tcp, 53/udp gets no backends in nodeport mode: spec.allocateLoadBalancerNodePorts is false and it has no nodePort (set vipd.io/backends: endpoints, or give it a nodePort)`)

	web, err := cs.CoreV1().Services("ns").Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	web.Annotations = map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
	if _, err := cs.CoreV1().Services("ns").Update(context.Background(), web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSnap(t, sink, `
k8s/ns/web/53/udp udp 192.0.2.8:53 -> 10.244.0.1:5353/1
k8s/ns/web/http/tcp tcp 192.0.2.8:80 -> 10.244.0.1:8080/1`)
	// One Event per lasting problem.
	evs, err := cs.CoreV1().Events("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs.Items {
		if ev.Reason == kubernetes.ReasonNoNodePorts {
			n++
			if ev.Count != 1 {
				t.Errorf("event %q recorded %d times", ev.Message, ev.Count)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d NoNodePorts Events, want 1", n)
	}
}

// stamped sets svc's creationTimestamp to the epoch plus sec seconds.
func stamped(svc *corev1.Service, sec int) *corev1.Service {
	svc.CreationTimestamp = metav1.NewTime(time.Unix(int64(sec), 0))
	return svc
}

// TestFamilyPolicyFake runs the source against the fake clientset, which
// defaults no ipFamilyPolicy: a Service without one gets every family of
// its ipFamilies or none, as before policies were honoured; one with
// PreferDualStack gets the family the pools have.
func TestFamilyPolicyFake(t *testing.T) {
	dual := []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	none := fakeService("none", nil, corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80})
	none.Spec.IPFamilies = dual
	prefer := fakeService("prefer", nil, corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80})
	prefer.Spec.IPFamilies = dual
	prefer.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	sink := &fakeSink{}
	cs := runFake(t, kubernetes.Options{Pools: pools("192.0.2.0/30")}, sink, none, prefer)
	waitFakeEvent(t, cs, "prefer", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv6 address (ipFamilyPolicy PreferDualStack: served by ipv4 alone)")
	waitFakeEvent(t, cs, "none", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv6 address")
	waitSnap(t, sink, `k8s/ns/prefer/http/tcp tcp 192.0.2.0:80 ->`)
	deadline := time.Now().Add(timeout)
	for {
		svc, err := cs.CoreV1().Services("ns").Get(context.Background(), "prefer", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		in := svc.Status.LoadBalancer.Ingress
		if len(in) == 1 && in[0].IP == "192.0.2.0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prefer's status %+v, want 192.0.2.0", in)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
