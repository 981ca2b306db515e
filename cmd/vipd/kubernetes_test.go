package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/source/kubernetes/apitest"
)

// TestDaemonKubernetes runs the daemon with a [kubernetes] section
// against a real API server, on the fake kernel: a LoadBalancer Service
// gets an address from the pool, its status says so, the kernel gets a
// virtual service on that address with the Ready node as backend, and
// vipd status lists the source. Deleting the Service removes it.
func TestDaemonKubernetes(t *testing.T) {
	api := apitest.Start(t)
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.1.0.5"}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	h := newHarness(t, t.TempDir(), lbtest.New())
	h.write(h.header("") + fmt.Sprintf(`
[kubernetes]
kubeconfig = %q
default_class = true

[[kubernetes.pool]]
name = "test"
addresses = ["192.0.2.200/29"]
avoid_network_broadcast = true
`, api.Kubeconfig) + twoServices)
	h.run()

	svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodePort := svc.Spec.Ports[0].NodePort
	var ip string
	h.eventually("the Service's status", func() bool {
		s, err := cs.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
			return false
		}
		ip = s.Status.LoadBalancer.Ingress[0].IP
		return true
	})
	if !strings.HasPrefix(ip, "192.0.2.20") {
		t.Fatalf("address %s is not from the pool", ip)
	}
	h.eventually("the Service in the kernel", func() bool {
		d := h.k.Dump()
		return strings.Contains(d, "service tcp "+ip+":80") && strings.Contains(d, fmt.Sprintf("-> 10.1.0.5:%d masq weight=1", nodePort))
	})
	rep, err := callControl(h.socket, "GET", "/v1/status")
	if err != nil || rep.Status == nil {
		t.Fatalf("status: %v %+v", err, rep)
	}
	var names []string
	for _, s := range rep.Status.Services {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, " "), "k8s/default/web/http/tcp") || len(rep.Status.Sources) != 1 ||
		rep.Status.Sources[0].Name != "kubernetes" || rep.Status.Sources[0].Services != 1 || rep.Status.Sources[0].Error != "" {
		t.Errorf("status services %v, sources %+v", names, rep.Status.Sources)
	}
	// A Service with a health check annotation that probes a closed port
	// of loopback (the test sends nothing off the host): the backend is
	// out.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	checked, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "checked", Annotations: map[string]string{
			"vipd.io/check": fmt.Sprintf(`{ type = "tcp", address = "127.0.0.1", port = %d, interval = "100ms", timeout = "100ms", rise = 1, fall = 1 }`, closedPort)}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.eventually("the checked Service's backend out of rotation", func() bool {
		return strings.Contains(h.k.Dump(), fmt.Sprintf("-> 10.1.0.5:%d masq weight=0", checked.Spec.Ports[0].NodePort)) &&
			strings.Contains(h.k.Dump(), fmt.Sprintf("-> 10.1.0.5:%d masq weight=1", nodePort))
	})
	// The file's services are untouched by the source's.
	if d := h.k.Dump(); !strings.Contains(d, "service tcp 192.0.2.10:80") || !strings.Contains(d, "service tcp 192.0.2.11:443") {
		t.Errorf("the file's services are missing:\n%s", d)
	}
	if err := cs.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for strings.Contains(h.k.Dump(), "service tcp "+ip+":80") {
		if time.Now().After(deadline) {
			t.Fatalf("the deleted Service is still in the kernel:\n%s", h.k.Dump())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
