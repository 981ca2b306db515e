package kubernetes_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/source/kubernetes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// waitIngress waits until the status of ns/name in cs holds ips, in order.
func waitIngress(t *testing.T, cs *fake.Clientset, name string, ips ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		svc, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("services"), "ns", name)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range svc.(*corev1.Service).Status.LoadBalancer.Ingress {
			got = append(got, in.IP)
		}
		if slices.Equal(got, ips) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ns/%s: status %v, want %v", name, got, ips)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSetPoolsLive hands a running source new pools: the Services keep
// their addresses, the one waiting for an address gets one from the new
// space at once, and a Service whose address leaves the pools gets
// another, with an Event saying why.
func TestSetPoolsLive(t *testing.T) {
	http := corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	a := stamped(fakeService("a", nil, http), 1)
	b := stamped(fakeService("b", nil, http), 2)
	c := stamped(fakeService("c", nil, http), 3)
	sink := &fakeSink{}
	cs := fake.NewClientset(a, b, c)
	src := runSource(t, kubernetes.Options{Pools: pools("192.0.2.0/31")}, cs, sink)
	waitFakeEvent(t, cs, "c", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv4 address")
	waitSnap(t, sink, `
k8s/ns/a/http/tcp tcp 192.0.2.0:80 ->
k8s/ns/b/http/tcp tcp 192.0.2.1:80 ->`)

	// An address added: c gets it, a and b keep theirs.
	if err := src.SetPools(pools("192.0.2.0/31", "192.0.2.8")); err != nil {
		t.Fatal(err)
	}
	waitSnap(t, sink, `
k8s/ns/a/http/tcp tcp 192.0.2.0:80 ->
k8s/ns/b/http/tcp tcp 192.0.2.1:80 ->
k8s/ns/c/http/tcp tcp 192.0.2.8:80 ->`)
	waitIngress(t, cs, "c", "192.0.2.8")

	// b's address removed, a new one added: b moves, with an Event.
	if err := src.SetPools([]kubernetes.Pool{{Name: "default", Addresses: []string{"192.0.2.0", "192.0.2.8"}}, {Name: "more", Addresses: []string{"198.51.100.1"}}}); err != nil {
		t.Fatal(err)
	}
	waitFakeEvent(t, cs, "b", kubernetes.ReasonAddressRemoved, "192.0.2.1 left the pools for this Service (a reload changed [[kubernetes.pool]]): allocating again")
	waitSnap(t, sink, `
k8s/ns/a/http/tcp tcp 192.0.2.0:80 ->
k8s/ns/b/http/tcp tcp 198.51.100.1:80 ->
k8s/ns/c/http/tcp tcp 192.0.2.8:80 ->`)
	waitIngress(t, cs, "b", "198.51.100.1")

	// Pools New refuses are refused, and change nothing.
	if err := src.SetPools([]kubernetes.Pool{{Name: "x", Addresses: []string{"192.0.2.0"}}, {Name: "x", Addresses: []string{"192.0.2.9"}}}); err == nil {
		t.Fatal("SetPools took a pool defined twice")
	}
	if err := src.SetPools(nil); err == nil {
		t.Fatal("SetPools took no pools")
	}
	waitSnap(t, sink, `
k8s/ns/a/http/tcp tcp 192.0.2.0:80 ->
k8s/ns/b/http/tcp tcp 198.51.100.1:80 ->
k8s/ns/c/http/tcp tcp 192.0.2.8:80 ->`)

	// The last of b's pool removed: b waits, its status cleared.
	if err := src.SetPools(pools("192.0.2.0", "192.0.2.8")); err != nil {
		t.Fatal(err)
	}
	waitFakeEvent(t, cs, "b", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv4 address")
	waitSnap(t, sink, `
k8s/ns/a/http/tcp tcp 192.0.2.0:80 ->
k8s/ns/c/http/tcp tcp 192.0.2.8:80 ->`)
	waitIngress(t, cs, "b")
}

// waitCounts waits until src's pool counts, one "POOL FAMILY TOTAL
// IN-USE FREE" per line, are want.
func waitCounts(t *testing.T, src *kubernetes.Source, want string) {
	t.Helper()
	want = strings.TrimSpace(want)
	deadline := time.Now().Add(timeout)
	for {
		var lines []string
		src.EachPool(func(pool, family string, total, inUse, free float64) {
			lines = append(lines, fmt.Sprintf("%s %s %v %v %v", pool, family, total, inUse, free))
		})
		got := strings.Join(lines, "\n")
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool counts:\n%s\nwant:\n%s", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPoolCounts: the source counts each pool's addresses by family, as
// its metrics export them: those it may hand out (network and broadcast
// kept out), those Services hold, and those free, which leaves out an
// address another load balancer's Service shows.
func TestPoolCounts(t *testing.T) {
	http := corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	a := stamped(fakeService("a", nil, http), 1)
	b := stamped(fakeService("b", nil, http), 2)
	other := stamped(fakeService("other", nil, http), 3)
	other.Spec.LoadBalancerClass = ptr.To("elsewhere")
	other.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.3"}}
	sink := &fakeSink{}
	cs := fake.NewClientset(a, b, other)
	src := runSource(t, kubernetes.Options{Pools: []kubernetes.Pool{
		{Name: "default", Addresses: []string{"192.0.2.0/30"}, AvoidNetworkBroadcast: true},
		{Name: "more", Addresses: []string{"198.51.100.0/30", "2001:db8::/64"}, AutoAssign: ptr.To(false)},
	}}, cs, sink)
	waitCounts(t, src, `
default ipv4 2 2 0
more ipv4 4 0 3
more ipv6 1.8446744073709552e+19 0 1.8446744073709552e+19`)
	if err := src.SetPools(pools("192.0.2.0/29")); err != nil {
		t.Fatal(err)
	}
	waitCounts(t, src, "default ipv4 8 2 6")
	waitIngress(t, cs, "a", "192.0.2.1")
}

// testPoolsLive hands a source running against the API server new pools:
// the waiting Service gets an address from the new space, and one whose
// address leaves the pools moves, with an Event.
func (e *env) testPoolsLive(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	var src *kubernetes.Source
	e.runWith(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.40/31")}, sink, func(s *kubernetes.Source) { src = s })
	// Oldest first, and by name within a second.
	for _, name := range []string{"s1", "s2", "s3"} {
		e.create(t, lbService(ns, name, port("", corev1.ProtocolTCP, 80)))
	}
	e.waitStatus(t, ns, "s1", "192.0.2.40")
	e.waitStatus(t, ns, "s2", "192.0.2.41")
	e.waitEvent(t, ns, "s3", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv4 address")
	if err := src.SetPools(pools("192.0.2.40/31", "192.0.2.44")); err != nil {
		t.Fatal(err)
	}
	e.waitStatus(t, ns, "s3", "192.0.2.44")
	if err := src.SetPools(pools("192.0.2.40", "192.0.2.44", "192.0.2.46")); err != nil {
		t.Fatal(err)
	}
	e.waitEvent(t, ns, "s2", kubernetes.ReasonAddressRemoved, "192.0.2.41 left the pools for this Service (a reload changed [[kubernetes.pool]]): allocating again")
	e.waitStatus(t, ns, "s2", "192.0.2.46")
	e.waitStatus(t, ns, "s1", "192.0.2.40")
	e.waitStatus(t, ns, "s3", "192.0.2.44")
}
