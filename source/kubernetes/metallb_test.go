package kubernetes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/vipd/vipd/source/kubernetes"
	"github.com/vipd/vipd/source/kubernetes/apitest"
)

// waitFakeStatus waits until the Service ns/name's status shows want (IPs,
// comma-separated).
func waitFakeStatus(t *testing.T, cs *fake.Clientset, name, want string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		svc, err := cs.CoreV1().Services("ns").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		if got := strings.Join(ips, ","); got == want {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("ns/%s status %q, want %q", name, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metallbServices are Services as MetalLB left them: annotated with
// MetalLB's annotations, old and new, one with the address MetalLB wrote
// in its status.
func metallbServices() []*corev1.Service {
	moved := stamped(fakeService("moved", map[string]string{"metallb.universe.tf/address-pool": "gold"}, port("http", corev1.ProtocolTCP, 80)), 1)
	moved.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.3"}}
	return []*corev1.Service{
		moved,
		stamped(fakeService("asked", map[string]string{"metallb.io/loadBalancerIPs": "192.0.2.12"}, port("http", corev1.ProtocolTCP, 80)), 2),
		stamped(fakeService("web", map[string]string{"metallb.universe.tf/loadBalancerIPs": "192.0.2.13", "metallb.universe.tf/allow-shared-ip": "front"}, port("http", corev1.ProtocolTCP, 80)), 3),
		stamped(fakeService("web-tls", map[string]string{"metallb.io/loadBalancerIPs": "192.0.2.13", "metallb.io/allow-shared-ip": "front"}, port("https", corev1.ProtocolTCP, 443)), 4),
		stamped(fakeService("gold", map[string]string{"metallb.io/address-pool": "gold"}, port("http", corev1.ProtocolTCP, 80)), 5),
		// vipd's own annotation wins over MetalLB's.
		stamped(fakeService("both", map[string]string{"metallb.io/loadBalancerIPs": "192.0.2.14", kubernetes.AnnotationAddresses: "192.0.2.15"}, port("http", corev1.ProtocolTCP, 80)), 6),
	}
}

func metallbPools() []kubernetes.Pool {
	return []kubernetes.Pool{
		{Name: "gold", Addresses: []string{"192.0.2.0/29"}, AutoAssign: ptr.To(false)},
		{Name: "silver", Addresses: []string{"192.0.2.8/29"}},
	}
}

// TestMetalLBAnnotations: with MetalLBAnnotations, MetalLB's Service
// annotations (metallb.io/ and metallb.universe.tf/ loadBalancerIPs,
// address-pool, allow-shared-ip) are read as vipd's addresses, pool and
// sharing key, a Service keeps the address MetalLB wrote in its status,
// and vipd's own annotations win.
func TestMetalLBAnnotations(t *testing.T) {
	var objs []*corev1.Service
	objs = append(objs, metallbServices()...)
	cs := fake.NewClientset(objs[0], objs[1], objs[2], objs[3], objs[4], objs[5])
	runSource(t, kubernetes.Options{Pools: metallbPools(), MetalLBAnnotations: true}, cs, &fakeSink{})
	waitFakeStatus(t, cs, "moved", "192.0.2.3")
	waitFakeStatus(t, cs, "asked", "192.0.2.12")
	waitFakeStatus(t, cs, "web", "192.0.2.13")
	waitFakeStatus(t, cs, "web-tls", "192.0.2.13")
	waitFakeStatus(t, cs, "gold", "192.0.2.0")
	waitFakeStatus(t, cs, "both", "192.0.2.15")
}

// TestMetalLBAnnotationsOff: without the switch MetalLB's annotations are
// not read: the Services get addresses of the auto-assigned pool, and
// one that names a pool only by MetalLB's annotation gets none of it.
func TestMetalLBAnnotationsOff(t *testing.T) {
	s := metallbServices()
	cs := fake.NewClientset(s[1], s[2], s[3], s[4])
	runSource(t, kubernetes.Options{Pools: metallbPools()}, cs, &fakeSink{})
	waitFakeStatus(t, cs, "asked", "192.0.2.8")
	waitFakeStatus(t, cs, "web", "192.0.2.9")
	waitFakeStatus(t, cs, "web-tls", "192.0.2.10")
	waitFakeStatus(t, cs, "gold", "192.0.2.11")
}

// waitIPs waits until the Service ns/name's status shows want (IPs,
// comma-separated), whatever their ipMode: MetalLB writes none.
func waitIPs(t *testing.T, cs clientset.Interface, ns, name, want string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		svc, err := cs.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		if got := strings.Join(ips, ","); got == want {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%s/%s status %q, want %q", ns, name, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetalLBSwitch switches a namespace's Services from MetalLB to vipd
// against a real API server: Services MetalLB gave addresses to, by its
// annotations (a pool of no auto-assignment, an address, a shared
// address), keep them when vipd starts with metallb_annotations, and a
// new Service annotated for MetalLB gets what it asks for.
func TestMetalLBSwitch(t *testing.T) {
	srv := apitest.Start(t)
	e := &env{srv: srv, cs: clientset.NewForConfigOrDie(srv.Config)}
	ns := e.namespace(t)
	// What MetalLB left: annotated Services, and the addresses it wrote.
	for _, s := range []struct {
		name string
		port int32
		ann  map[string]string
		ip   string
	}{
		{"gold", 80, map[string]string{"metallb.universe.tf/address-pool": "gold"}, "192.0.2.3"},
		{"web", 80, map[string]string{"metallb.universe.tf/allow-shared-ip": "front", "metallb.universe.tf/loadBalancerIPs": "192.0.2.10"}, "192.0.2.10"},
		{"web-tls", 443, map[string]string{"metallb.io/allow-shared-ip": "front", "metallb.io/loadBalancerIPs": "192.0.2.10"}, "192.0.2.10"},
	} {
		svc := lbService(ns, s.name, port("p", corev1.ProtocolTCP, s.port))
		svc.Annotations = s.ann
		svc = e.create(t, svc)
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: s.ip}}
		if _, err := e.cs.CoreV1().Services(ns).UpdateStatus(ctxOf(t), svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: metallbPools(), MetalLBAnnotations: true, LeaderElection: ptr.To(false)}, &fakeSink{})
	asked := lbService(ns, "asked", port("p", corev1.ProtocolTCP, 80))
	asked.Annotations = map[string]string{"metallb.io/loadBalancerIPs": "192.0.2.12"}
	e.create(t, asked)
	waitIPs(t, e.cs, ns, "asked", "192.0.2.12")
	waitIPs(t, e.cs, ns, "gold", "192.0.2.3")
	waitIPs(t, e.cs, ns, "web", "192.0.2.10")
	waitIPs(t, e.cs, ns, "web-tls", "192.0.2.10")
	// Settled: nothing moved, and no Service was refused.
	time.Sleep(time.Second)
	for name, ip := range map[string]string{"asked": "192.0.2.12", "gold": "192.0.2.3", "web": "192.0.2.10", "web-tls": "192.0.2.10"} {
		waitIPs(t, e.cs, ns, name, ip)
	}
	evs, err := e.cs.CoreV1().Events(ns).List(ctxOf(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		// The API server's own (ClusterIPNotAllocated, say) are not vipd's.
		if ev.Type == corev1.EventTypeWarning && ev.Source.Component == "vipd" {
			t.Errorf("Event on %s: %s: %s", ev.InvolvedObject.Name, ev.Reason, ev.Message)
		}
	}
}
