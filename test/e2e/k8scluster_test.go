//go:build e2e

package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// TestKubernetesSharedCluster proves the shared cluster's isolation: what
// a test leaves behind (a Node, a namespace with a Service, a Service
// with a finalizer and an address in its status, its EndpointSlice, an
// Event, vipd's Lease) is gone when the next test starts, and the same
// names can be made again; what a test makes after startCluster is gone
// when it ends.
func TestKubernetesSharedCluster(t *testing.T) {
	want := []string{"Namespace pay", "Service default/web", "Service pay/thief", "EndpointSlice default/web-1",
		"Event default/web.test", "Lease default/vipd", "Node node1"}
	leftovers := func(t *testing.T) []string {
		t.Helper()
		sharedCluster(t)
		cs := shared.reset
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		left, err := clusterLeftovers(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, o := range left {
			names = append(names, o.String())
		}
		slices.Sort(names)
		return names
	}
	sorted := slices.Sorted(slices.Values(want))
	t.Run("leaves-objects-behind", func(t *testing.T) {
		// As a test whose cleanup did not run: no reset.
		srv, cs := sharedCluster(t)
		makeLeftovers(&k8sCluster{t: t, srv: srv, cs: cs})
		if got := leftovers(t); !slices.Equal(got, sorted) {
			t.Fatalf("left behind %q, want %q", got, sorted)
		}
	})
	t.Run("next-starts-at-baseline", func(t *testing.T) {
		c := startCluster(t)
		if got := leftovers(t); len(got) != 0 {
			t.Fatalf("the test starts with %q", got)
		}
		makeLeftovers(c)
		if got := leftovers(t); !slices.Equal(got, sorted) {
			t.Fatalf("made %q, want %q", got, sorted)
		}
	})
	t.Run("gone-after-the-test", func(t *testing.T) {
		if got := leftovers(t); len(got) != 0 {
			t.Fatalf("the last test left %q", got)
		}
	})
}

// makeLeftovers makes the objects TestKubernetesSharedCluster expects a
// reset to delete.
func makeLeftovers(c *k8sCluster) {
	t := c.t
	t.Helper()
	c.node("node1", "10.0.2.11")
	if _, err := c.cs.CoreV1().Namespaces().Create(c.ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pay"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := func(ns, name string, finalizers ...string) {
		t.Helper()
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: finalizers},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}
		s, err := c.cs.CoreV1().Services(ns).Create(c.ctx(), s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.0.0.10"}}
		if _, err := c.cs.CoreV1().Services(ns).UpdateStatus(c.ctx(), s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc("pay", "thief")
	svc("default", "web", "service.kubernetes.io/load-balancer-cleanup")
	c.slice("web", 8080, endpoint{"10.0.2.101", "", "ready"})
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "default", Name: "web.test"},
		InvolvedObject: corev1.ObjectReference{Kind: "Service", Namespace: "default", Name: "web"},
		Reason:         "PoolNotAllowed", Message: "left behind", Type: corev1.EventTypeWarning,
		Source: corev1.EventSource{Component: "vipd"}, FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
	}
	if _, err := c.cs.CoreV1().Events("default").Create(c.ctx(), ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vipd"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("lb1"), LeaseDurationSeconds: ptr.To(int32(3600))}}
	if _, err := c.cs.CoordinationV1().Leases("default").Create(c.ctx(), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
