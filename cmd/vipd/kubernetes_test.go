package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/control"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/monitor/status"
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

# n1 is not on this host: probing it would send packets off the host
# (TestDaemonKubernetesNodeHealth probes Nodes on loopback).
[kubernetes.node_health]
enabled = false

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
	rep, err := control.Call(h.socket, "GET", "/v1/status")
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
	// A Service with a health check annotation whose one backend is a
	// closed node port of loopback (the test sends nothing off the host;
	// an annotation's check probes the backend's own address and port):
	// a second Node, on 127.0.0.2, the only one with an endpoint of the
	// Service, which has externalTrafficPolicy Local. The backend is out.
	n2, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n2.Status.Conditions = node.Status.Conditions
	n2.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.2"}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	checked, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "checked", Annotations: map[string]string{
			"vipd.io/check": `{ type = "tcp", interval = "1s", timeout = "100ms", rise = 1, fall = 1 }`}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "checked-1", Labels: map[string]string{discoveryv1.LabelServiceName: "checked"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(8080))}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.9"}, NodeName: ptr.To("n2"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkedPort := checked.Spec.Ports[0].NodePort
	if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", checkedPort)); err == nil {
		l.Close() // closed, as it should be
	} else {
		t.Fatalf("something listens on 127.0.0.2:%d, the checked Service's node port: %v", checkedPort, err)
	}
	h.eventually("the checked Service's backend out of rotation", func() bool {
		return strings.Contains(h.k.Dump(), fmt.Sprintf("-> 127.0.0.2:%d masq weight=0", checkedPort)) &&
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

// TestDaemonKubernetesAPILoss runs the daemon against a real API server,
// on the fake kernel, through what the API can do to it: EndpointSlice
// changes reach the kernel; with the API server stopped the kernel keeps
// the last state while vipd status and vipd_source_up say the source is
// out of step; when it comes back the daemon is in step again without a
// kernel call; and a restart of vipd writes no status and makes no kernel
// call either.
func TestDaemonKubernetesAPILoss(t *testing.T) {
	api := apitest.Start(t)
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	k := lbtest.New()
	h := newHarness(t, dir, k)
	addr := freeAddr(t)
	h.write(strings.Replace(h.header(""), `metrics_listen = ""`, `metrics_listen = "`+addr+`"`, 1) + fmt.Sprintf(`
[kubernetes]
kubeconfig = %q
default_class = true
backends = "endpoints"
leader_election = false

[[kubernetes.pool]]
name = "test"
addresses = ["192.0.2.208/30"]
`, api.Kubeconfig) + twoServices)
	h.run()

	if _, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slices := cs.DiscoveryV1().EndpointSlices("default")
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "app-1", Labels: map[string]string{discoveryv1.LabelServiceName: "app"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.244.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		},
	}
	es, err = slices.Create(ctx, es, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.eventually("both endpoints in the kernel", func() bool {
		d := k.Dump()
		return strings.Contains(d, "service tcp 192.0.2.208:80") && strings.Contains(d, "-> 10.244.0.1:8080 masq weight=1") &&
			strings.Contains(d, "-> 10.244.0.2:8080 masq weight=1")
	})
	// A rolling change: a new endpoint, the old one terminating (drained),
	// then gone.
	es.Endpoints[1].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	if es, err = slices.Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the terminating endpoint drained, the new one in", func() bool {
		d := k.Dump()
		return strings.Contains(d, "-> 10.244.0.2:8080 masq weight=0") && strings.Contains(d, "-> 10.244.0.3:8080 masq weight=1")
	})
	es.Endpoints = []discoveryv1.Endpoint{es.Endpoints[0], es.Endpoints[2]}
	if _, err = slices.Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the old endpoint gone", func() bool { return !strings.Contains(k.Dump(), "10.244.0.2:8080") })
	svc, err := cs.CoreV1().Services("default").Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := k.Dump()
	k.Calls()

	sourceState := func() (up float64, line string) {
		_, body, err := scrape(ctx, http.DefaultClient, addr)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := control.Call(h.socket, "GET", "/v1/status")
		if err != nil || rep.Status == nil || len(rep.Status.Sources) != 1 {
			t.Fatalf("status: %v %+v", err, rep)
		}
		var b strings.Builder
		if err := status.RenderTable(&b, rep.Status); err != nil {
			t.Fatal(err)
		}
		return metricValue(body, `vipd_source_up{source="kubernetes"}`), grepLines(b.String(), "source kubernetes")
	}
	if up, line := sourceState(); up != 1 || !strings.Contains(line, "source kubernetes: 1 services, in step") {
		t.Fatalf("before the loss: vipd_source_up %v, status %q", up, line)
	}

	api.StopAPIServer()
	deadline := time.Now().Add(30 * time.Second)
	for {
		up, line := sourceState()
		if up == 0 && strings.Contains(line, "out of step, its last services keep serving") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with the API server stopped: vipd_source_up %v, status %q", up, line)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A while without the API server: nothing changes in the kernel.
	time.Sleep(4 * time.Second)
	if d := k.Dump(); d != before {
		t.Errorf("the kernel changed without the API server:\n%s\nwas:\n%s", d, before)
	}
	if err := api.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		up, line := sourceState()
		if up == 1 && strings.Contains(line, "in step") && !strings.Contains(line, "out of step") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with the API server back: vipd_source_up %v, status %q", up, line)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Zero churn: the resync changed nothing.
	time.Sleep(time.Second)
	if calls := k.Calls(); len(calls) != 0 || k.Dump() != before {
		t.Errorf("the resync made kernel calls %v; kernel:\n%s", calls, k.Dump())
	}

	// A restart of vipd: the same kernel, no status written, no call.
	h.cancel()
	err = <-h.done
	h.done <- err
	if err != nil {
		t.Fatalf("daemon: %v", err)
	}
	h2 := startDaemonAt(t, dir, k)
	h2.eventually("the source in step after the restart", h2.logHas("kubernetes: waiting for the caches"))
	rep := func() string {
		r, err := control.Call(h2.socket, "GET", "/v1/status")
		if err != nil || r.Status == nil || len(r.Status.Sources) != 1 {
			return ""
		}
		var b strings.Builder
		status.RenderTable(&b, r.Status)
		return grepLines(b.String(), "source kubernetes")
	}
	h2.eventually("the source in step after the restart", func() bool { return strings.Contains(rep(), "1 services, in step") })
	// The restarted daemon holds the source's services until the source
	// publishes, and the source publishes what the kernel has.
	time.Sleep(time.Second)
	if calls := k.Calls(); len(calls) != 0 || k.Dump() != before {
		t.Errorf("the restart made kernel calls %v; kernel:\n%s", calls, k.Dump())
	}
	got, err := cs.CoreV1().Services("default").Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != svc.ResourceVersion {
		t.Errorf("the restart wrote the Service (resourceVersion %s, was %s): %+v", got.ResourceVersion, svc.ResourceVersion, got.Status)
	}

	// A restart while the API server is gone: the services stay until it
	// is back, and then nothing changes either.
	h2.cancel()
	err = <-h2.done
	h2.done <- err
	if err != nil {
		t.Fatalf("daemon: %v", err)
	}
	api.StopAPIServer()
	h3 := startDaemonAt(t, dir, k)
	h3.eventually("the source out of step", h3.logHas("source out of step"))
	time.Sleep(4 * time.Second)
	if calls := k.Calls(); len(calls) != 0 || k.Dump() != before {
		t.Errorf("a restart without the API server made kernel calls %v; kernel:\n%s", calls, k.Dump())
	}
	if err := api.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	h3.eventually("the source in step with its service", func() bool {
		r, err := control.Call(h3.socket, "GET", "/v1/status")
		if err != nil || r.Status == nil || len(r.Status.Sources) != 1 {
			return false
		}
		var b strings.Builder
		status.RenderTable(&b, r.Status)
		return strings.Contains(b.String(), "source kubernetes: 1 services, in step")
	})
	time.Sleep(time.Second)
	if calls := k.Calls(); len(calls) != 0 || k.Dump() != before {
		t.Errorf("the API server's return made kernel calls %v; kernel:\n%s", calls, k.Dump())
	}
}
