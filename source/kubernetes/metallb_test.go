package kubernetes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/vipd/vipd/source/kubernetes"
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
