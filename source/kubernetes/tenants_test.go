package kubernetes_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	checkdesc "github.com/vipd/vipd/monitor/check"
	"github.com/vipd/vipd/source/kubernetes"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// lastHealth returns the health checks of the last snapshot, by virtual
// service name.
func (f *fakeSink) lastHealth() map[string][]checkdesc.Spec {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]checkdesc.Spec{}
	if len(f.snaps) == 0 {
		return out
	}
	for name, h := range f.snaps[len(f.snaps)-1].Health {
		for _, s := range h.Checks {
			out[name] = append(out[name], *s)
		}
	}
	return out
}

// TestCheckAnnotationConfined runs the source against the fake
// clientset: a vipd.io/check that would aim the load balancer away from
// the backend (another address, the load balancer's mark, its files) is
// refused with a BadAnnotation Event naming the key, and the Service is
// served unchecked; a check port is taken where the backends are the
// pods, and refused where they are the Nodes, whose other services it
// would reach.
func TestCheckAnnotationConfined(t *testing.T) {
	http := port("http", corev1.ProtocolTCP, 80)
	endpoints := func(check string) map[string]string {
		return map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints, kubernetes.AnnotationCheck: check}
	}
	slice := func(svc string) *discoveryv1.EndpointSlice {
		return fakeSlice(svc, svc+"-1", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}, "10.244.0.1")
	}
	sink := &fakeSink{}
	cs := runFake(t, kubernetes.Options{Pools: pools("192.0.2.0/29")}, sink,
		stamped(fakeService("meta", endpoints(`{ type = "http", address = "169.254.169.254", path = "/latest/meta-data/" }`), http), 1), slice("meta"),
		stamped(fakeService("mark", endpoints(`{ type = "tcp", mark = 4096 }`), http), 2), slice("mark"),
		stamped(fakeService("ca", endpoints(`{ type = "https", ca_file = "/dev/zero" }`), http), 3), slice("ca"),
		stamped(fakeService("np", map[string]string{kubernetes.AnnotationCheck: `{ type = "tcp", port = 10250 }`}, http), 4),
		stamped(fakeService("ok", endpoints(`{ type = "http", port = 8081, path = "/healthz" }`), http), 5), slice("ok"),
	)
	// A refused annotation leaves the Service its last valid settings:
	// here the defaults (nodeport mode, and no Nodes).
	waitSnap(t, sink, `
k8s/ns/ca/http/tcp tcp 192.0.2.2:80 ->
k8s/ns/mark/http/tcp tcp 192.0.2.1:80 ->
k8s/ns/meta/http/tcp tcp 192.0.2.0:80 ->
k8s/ns/np/http/tcp tcp 192.0.2.3:80 ->
k8s/ns/ok/http/tcp tcp 192.0.2.4:80 -> 10.244.0.1:8080/1`)
	const why = ": an annotation's check probes the backend's address and sets nothing of the load balancer's own"
	waitFakeEvent(t, cs, "meta", kubernetes.ReasonBadAnnotation, `vipd.io/check: key "address" is not allowed in an annotation`+why)
	waitFakeEvent(t, cs, "mark", kubernetes.ReasonBadAnnotation, `vipd.io/check: key "mark" is not allowed in an annotation`+why)
	waitFakeEvent(t, cs, "ca", kubernetes.ReasonBadAnnotation, `vipd.io/check: key "ca_file" is not allowed in an annotation`+why)
	waitFakeEvent(t, cs, "np", kubernetes.ReasonBadAnnotation,
		`vipd.io/check: port 10250: in nodeport mode the backends are the Nodes, and a check port would reach their other services (leave port out: the check probes the node port)`)
	deadline := time.Now().Add(timeout)
	for {
		h := sink.lastHealth()
		ok := h["k8s/ns/ok/http/tcp"]
		if len(h) == 1 && len(ok) == 1 && ok[0].Port == 8081 && !ok[0].Addr.IsValid() && ok[0].HTTP.Path == "/healthz" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health checks %+v, want only ok's, on port 8081", h)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitNsEvent waits for a warning Event with reason on ns/name whose
// message is want, in the fake clientset.
func waitNsEvent(t *testing.T, cs *fake.Clientset, ns, name, reason, want string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
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
			t.Fatalf("no %s Event %q on %s/%s; events:\n%s", reason, want, ns, name, strings.Join(seen, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPoolTenantsEvents runs the source against the fake clientset: a
// Service that names a pool, asks for an address of a pool, or waits for
// auto-assignment from pools that are not for its namespace or its
// labels gets no address and an Event that says why; so does a Service
// that asks for an address shared under its sharing key in another
// namespace. The Services the pools are for get their addresses.
func TestPoolTenantsEvents(t *testing.T) {
	svc := func(ns, name string, sec int, lbls, ann map[string]string, ip string) *corev1.Service {
		s := stamped(fakeService(name, ann, port("http", corev1.ProtocolTCP, 80)), sec)
		s.Namespace, s.Labels, s.Spec.LoadBalancerIP = ns, lbls, ip
		return s
	}
	front := map[string]string{"tier": "front"}
	pool := func(name string) map[string]string { return map[string]string{kubernetes.AnnotationPool: name} }
	key := map[string]string{kubernetes.AnnotationSharingKey: "k"}
	sink := &fakeSink{}
	cs := runFake(t, kubernetes.Options{Pools: []kubernetes.Pool{
		{Name: "gold", Addresses: []string{"192.0.2.0/30"}, AutoAssign: ptr.To(false), Namespaces: []string{"pay"}},
		{Name: "front", Addresses: []string{"192.0.2.8/30"}, ServiceSelector: "tier=front"},
	}}, sink,
		svc("pay", "vault", 1, nil, pool("gold"), ""),
		svc("dev", "thief", 2, nil, pool("gold"), ""),
		svc("dev", "grab", 3, nil, nil, "192.0.2.1"),
		svc("dev", "plain", 4, nil, nil, ""),
		svc("dev", "web", 5, front, key, ""),
		svc("shop", "join", 6, front, key, "192.0.2.8"),
		svc("shop", "own", 7, front, key, ""),
	)
	waitSnap(t, sink, `
k8s/dev/web/http/tcp tcp 192.0.2.8:80 ->
k8s/pay/vault/http/tcp tcp 192.0.2.0:80 ->
k8s/shop/own/http/tcp tcp 192.0.2.9:80 ->`)
	waitNsEvent(t, cs, "dev", "thief", kubernetes.ReasonPoolNotAllowed, `pool "gold" is not for namespace "dev" (its namespaces: pay)`)
	waitNsEvent(t, cs, "dev", "grab", kubernetes.ReasonPoolNotAllowed, `192.0.2.1 is in pool "gold", which is not for namespace "dev" (its namespaces: pay)`)
	waitNsEvent(t, cs, "dev", "plain", kubernetes.ReasonPoolNotAllowed,
		`no pool with auto_assign is for Service dev/plain (see the pools' namespaces and service_selector)`)
	waitNsEvent(t, cs, "shop", "join", kubernetes.ReasonAddressTaken,
		`192.0.2.8 is shared under vipd.io/sharing-key "k" by Service dev/web of another namespace, and pool "front" does not let namespaces share (share_across_namespaces)`)
	for _, k := range [][2]string{{"dev", "thief"}, {"dev", "grab"}, {"dev", "plain"}, {"shop", "join"}} {
		got, err := cs.CoreV1().Services(k[0]).Get(context.Background(), k[1], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.LoadBalancer.Ingress) != 0 {
			t.Errorf("%s/%s has status %v", k[0], k[1], got.Status.LoadBalancer.Ingress)
		}
	}
}

// testTenants: against the real API server, a Service of a namespace a
// pool is not for gets no address from it, whether it names the pool or
// asks for one of its addresses by spec.loadBalancerIP, and joins no
// other namespace's sharing key; each refusal is an Event on it.
func (e *env) testTenants(t *testing.T) {
	pay := e.namespace(t)
	dev := pay + "-dev"
	if _, err := e.cs.CoreV1().Namespaces().Create(ctxOf(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: dev}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{pay, dev}, Pools: []kubernetes.Pool{
		{Name: "gold", Addresses: []string{"192.0.2.200/30"}, AutoAssign: ptr.To(false), Namespaces: []string{pay}},
		{Name: "open", Addresses: []string{"192.0.2.204/30"}},
	}}, sink)
	with := func(ns, name string, p int32, ann map[string]string) *corev1.Service {
		svc := lbService(ns, name, port("", corev1.ProtocolTCP, p))
		svc.Annotations = ann
		return svc
	}
	e.create(t, with(pay, "vault", 80, map[string]string{kubernetes.AnnotationPool: "gold"}))
	e.waitStatus(t, pay, "vault", "192.0.2.200")
	e.create(t, with(pay, "web", 80, map[string]string{kubernetes.AnnotationSharingKey: "k"}))
	e.waitStatus(t, pay, "web", "192.0.2.204")

	e.create(t, with(dev, "thief", 80, map[string]string{kubernetes.AnnotationPool: "gold"}))
	e.waitEvent(t, dev, "thief", kubernetes.ReasonPoolNotAllowed, fmt.Sprintf(`pool "gold" is not for namespace %q (its namespaces: %s)`, dev, pay))
	grab := with(dev, "grab", 80, nil)
	grab.Spec.LoadBalancerIP = "192.0.2.201"
	e.create(t, grab)
	e.waitEvent(t, dev, "grab", kubernetes.ReasonPoolNotAllowed, fmt.Sprintf(`192.0.2.201 is in pool "gold", which is not for namespace %q`, dev))
	e.create(t, with(dev, "join", 81, map[string]string{kubernetes.AnnotationSharingKey: "k", kubernetes.AnnotationAddresses: "192.0.2.204"}))
	e.waitEvent(t, dev, "join", kubernetes.ReasonAddressTaken,
		fmt.Sprintf(`192.0.2.204 is shared under vipd.io/sharing-key "k" by Service %s/web of another namespace, and pool "open" does not let namespaces share`, pay))
	// Without the address it asked for, the same key gets an address of
	// its own.
	e.create(t, with(dev, "own", 82, map[string]string{kubernetes.AnnotationSharingKey: "k"}))
	e.waitStatus(t, dev, "own", "192.0.2.205")
	for _, name := range []string{"thief", "grab", "join"} {
		e.waitStatus(t, dev, name, "")
	}
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[2]s/own/82/tcp tcp 192.0.2.205:82 ->
k8s/%[1]s/vault/80/tcp tcp 192.0.2.200:80 ->
k8s/%[1]s/web/80/tcp tcp 192.0.2.204:80 ->`, pay, dev))
}

// TestPoolTenantsRestart: a Service that holds an address of a pool that
// is not for it (the pool's namespaces changed while vipd was down)
// loses it at the start: it is not served there, its status is cleared,
// and an Event says why.
func TestPoolTenantsRestart(t *testing.T) {
	held := stamped(fakeService("old", map[string]string{kubernetes.AnnotationPool: "gold"}, port("http", corev1.ProtocolTCP, 80)), 1)
	held.Namespace = "dev"
	held.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}
	sink := &fakeSink{}
	cs := runFake(t, kubernetes.Options{Pools: []kubernetes.Pool{
		{Name: "gold", Addresses: []string{"192.0.2.0/30"}, AutoAssign: ptr.To(false), Namespaces: []string{"pay"}},
	}}, sink, held)
	waitNsEvent(t, cs, "dev", "old", kubernetes.ReasonPoolNotAllowed, `pool "gold" is not for namespace "dev" (its namespaces: pay)`)
	waitSnap(t, sink, "")
	deadline := time.Now().Add(timeout)
	for {
		got, err := cs.CoreV1().Services("dev").Get(context.Background(), "old", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.LoadBalancer.Ingress) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status still %v", got.Status.LoadBalancer.Ingress)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSourceRangesEvents: a Service whose source ranges cannot be
// enforced as written says so in an Event: an annotation that does not
// parse (no source is then admitted), or ranges while vipd keeps no
// packet-filter rules (the Service is then not served). A Service
// without ranges gets no such Event.
func TestSourceRangesEvents(t *testing.T) {
	const annotation = "service.beta.kubernetes.io/load-balancer-source-ranges"
	pools := []kubernetes.Pool{{Name: "p", Addresses: []string{"192.0.2.0/29"}}}
	t.Run("bad annotation", func(t *testing.T) {
		bad := stamped(fakeService("bad", map[string]string{annotation: "10.0.0.0/8, not-a-range"}, port("http", corev1.ProtocolTCP, 80)), 1)
		cs := runFake(t, kubernetes.Options{Pools: pools}, &fakeSink{}, bad)
		waitNsEvent(t, cs, "ns", "bad", kubernetes.ReasonBadAnnotation,
			`service.beta.kubernetes.io/load-balancer-source-ranges: " not-a-range" is not a CIDR range: no source is admitted`)
	})
	t.Run("no packet filter", func(t *testing.T) {
		ranged := stamped(fakeService("ranged", nil, port("http", corev1.ProtocolTCP, 80)), 1)
		ranged.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8"}
		open := stamped(fakeService("open", nil, port("http", corev1.ProtocolTCP, 81)), 2)
		cs := runFake(t, kubernetes.Options{Pools: pools, NoPacketFilter: true}, &fakeSink{}, ranged, open)
		waitNsEvent(t, cs, "ns", "ranged", kubernetes.ReasonSourceRangesUnenforceable,
			"the Service has source ranges, and vipd keeps no packet-filter rules to enforce them ([daemon] manage_iptables is off): it is not served")
		evs, err := cs.CoreV1().Events("ns").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == "open" && ev.Reason == kubernetes.ReasonSourceRangesUnenforceable {
				t.Errorf("an Event on the Service without ranges: %s: %s", ev.Reason, ev.Message)
			}
		}
	})
}
