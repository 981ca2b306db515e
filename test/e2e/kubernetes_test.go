//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/source/kubernetes/apitest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// k8sCluster is the guest's real etcd and kube-apiserver, shared by the
// Kubernetes tests (k8scluster.go), with the client test t creates
// objects through.
type k8sCluster struct {
	t   *testing.T
	srv *apitest.Server
	cs  *kubernetes.Clientset
}

// startCluster returns the shared etcd and kube-apiserver from
// /payload/k8s (e2e.sh puts them there with VIPD_E2E_K8S=1; without them
// the test fails), started on first use, at its baseline: whatever an
// earlier test left is deleted first, and what this one makes is deleted
// when it ends, after its vipd stopped (cleanups run last-in first-out,
// and the tests start their vipd after this).
func startCluster(t *testing.T) *k8sCluster {
	t.Helper()
	srv, cs := sharedCluster(t)
	t.Logf("etcd and kube-apiserver: shared, started by %s", shared.starter)
	resetFor(t, "before")
	t.Cleanup(func() { resetFor(t, "after") })
	return &k8sCluster{t: t, srv: srv, cs: cs}
}

func (c *k8sCluster) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	c.t.Cleanup(cancel)
	return ctx
}

// node creates a Ready Node with an internal address.
func (c *k8sCluster) node(name, addr string) {
	c.t.Helper()
	n, err := c.cs.CoreV1().Nodes().Create(c.ctx(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}, {Type: corev1.NodeHostName, Address: name}}
	if _, err := c.cs.CoreV1().Nodes().UpdateStatus(c.ctx(), n, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// endpoint is one endpoint of an EndpointSlice: "ready", "terminating"
// (serving and terminating) or anything else (not ready).
type endpoint struct{ addr, node, state string }

// slice creates or replaces the EndpointSlice NAME-1 of Service name,
// port "http" at port.
func (c *k8sCluster) slice(name string, port int32, eps ...endpoint) {
	c.t.Helper()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}},
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{Addresses: []string{e.addr}}
		switch e.state {
		case "ready":
			x.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
		case "terminating":
			x.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		default:
			x.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
		}
		if e.node != "" {
			x.NodeName = ptr.To(e.node)
		}
		es.Endpoints = append(es.Endpoints, x)
	}
	api := c.cs.DiscoveryV1().EndpointSlices("default")
	if old, err := api.Get(c.ctx(), es.Name, metav1.GetOptions{}); err == nil {
		es.ResourceVersion = old.ResourceVersion
		_, err = api.Update(c.ctx(), es, metav1.UpdateOptions{})
		if err != nil {
			c.t.Fatal(err)
		}
		return
	}
	if _, err := api.Create(c.ctx(), es, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// service creates a LoadBalancer Service with one port "http" 80 (to
// targetPort 8080), and waits until its status has an address, which it
// returns.
func (c *k8sCluster) service(name string, annotations map[string]string, nodePort int32) string {
	c.t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: annotations},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: nodePort}}},
	}
	if _, err := c.cs.CoreV1().Services("default").Create(c.ctx(), svc, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	var ip string
	Eventually(c.t, 60*time.Second, 100*time.Millisecond, func() bool {
		s, err := c.cs.CoreV1().Services("default").Get(c.ctx(), name, metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
			return false
		}
		ip = s.Status.LoadBalancer.Ingress[0].IP
		return true
	}, "Service %s got no address", name)
	return ip
}

// ipvsDests returns "ADDR:PORT/WEIGHT" of each real server of the TCP
// virtual service vip:80, sorted as ipvsadm prints them.
func ipvsDests(t *testing.T, vip string) []string {
	t.Helper()
	r := Exec("ipvsadm", "-Ln", "-t", vip+":80")
	if r.Err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(r.Stdout, "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == "->" && f[1] != "RemoteAddress:Port" {
			out = append(out, f[1]+"/"+f[3])
		}
	}
	return out
}

// waitDests waits until vip:80's real servers are want.
func waitDests(t *testing.T, vip string, want ...string) {
	t.Helper()
	w := strings.Join(want, " ")
	Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool { return strings.Join(ipvsDests(t, vip), " ") == w },
		"ipvs %s:80 real servers %q, want %q", vip, ipvsDests(t, vip), w)
}

// TestKubernetesTraffic runs vipd with a [kubernetes] section against a
// real etcd and kube-apiserver in the guest, and sends traffic through
// the addresses it gives LoadBalancer Services: to pods (endpoints mode),
// through a rolling endpoint change with requests flowing and none
// failing; and to nodes' nodePorts (nodeport mode), where
// externalTrafficPolicy Local leaves out the node without a ready
// endpoint and keeps the client's address.
func TestKubernetesTraffic(t *testing.T) {
	c := startCluster(t)
	tp := NewTopo(t, "k8s 2 4")
	c.node("node1", "10.0.2.11")
	c.node("node2", "10.0.2.12")

	d := newDaemon(t)
	d.write(d.header(tp.LBIf, "") + fmt.Sprintf(`
[kubernetes]
kubeconfig = %q
default_class = true
backends = "nodeport"
lease_namespace = "default"
identity = "lb1"

[[kubernetes.pool]]
name = "test"
addresses = ["%s-10.0.0.11"]
`, c.srv.Kubeconfig, tp.VIP))
	d.start()

	// Pods: endpoints mode, at their targetPort.
	vip := c.service("pods", map[string]string{"vipd.io/backends": "endpoints"}, 0)
	if vip != tp.VIP {
		t.Fatalf("pods got %s, want the pool's first address %s", vip, tp.VIP)
	}
	c.slice("pods", 8080, endpoint{"10.0.2.101", "", "ready"}, endpoint{"10.0.2.102", "", "ready"})
	waitDests(t, vip, "10.0.2.101:8080/1", "10.0.2.102:8080/1")
	h := tp.Hit(t, HTTPURL(vip, 80, "/"), 20, false)
	if h.Errors != 0 || h.Counts["pod1"] == 0 || h.Counts["pod2"] == 0 || h.OK != 20 {
		t.Fatalf("pods before the rollout: %+v", h)
	}

	// A rolling update with requests flowing: new pods ready, the old
	// ones terminating (drained), then gone from the slice, then
	// stopped.
	l := startLoadWith(t, tp, loadOptions{Port: 80, Short: 2, ShortEvery: 40 * time.Millisecond})
	time.Sleep(time.Second)
	c.slice("pods", 8080, endpoint{"10.0.2.101", "", "terminating"}, endpoint{"10.0.2.102", "", "terminating"},
		endpoint{"10.0.2.103", "", "ready"}, endpoint{"10.0.2.104", "", "ready"})
	waitDests(t, vip, "10.0.2.101:8080/0", "10.0.2.102:8080/0", "10.0.2.103:8080/1", "10.0.2.104:8080/1")
	time.Sleep(2 * time.Second)
	c.slice("pods", 8080, endpoint{"10.0.2.103", "", "ready"}, endpoint{"10.0.2.104", "", "ready"})
	waitDests(t, vip, "10.0.2.103:8080/1", "10.0.2.104:8080/1")
	time.Sleep(time.Second)
	tp.BackendStop(t, "pod1")
	tp.BackendStop(t, "pod2")
	time.Sleep(2 * time.Second)
	l.finish(t, "rolling update")
	h = tp.Hit(t, HTTPURL(vip, 80, "/"), 20, false)
	// (wlc counts the connections each pod had: one may take them all.)
	if h.Errors != 0 || h.Counts["pod3"]+h.Counts["pod4"] != 20 {
		t.Fatalf("pods after the rollout: %+v", h)
	}

	// Nodes: nodeport mode, both Ready nodes at the nodePort.
	nvip := c.service("nodes", nil, 30080)
	waitDests(t, nvip, "10.0.2.11:30080/1", "10.0.2.12:30080/1")
	h = tp.Hit(t, HTTPURL(nvip, 80, "/"), 20, false)
	if h.Errors != 0 || h.Counts["node1"] == 0 || h.Counts["node2"] == 0 || h.OK != 20 {
		t.Fatalf("nodes: %+v", h)
	}
	// externalTrafficPolicy Local with a ready endpoint on node1 only:
	// node2 is left out, and node1 sees the client's address.
	c.slice("nodes", 8080, endpoint{"10.244.1.5", "node1", "ready"}, endpoint{"10.244.2.5", "node2", "not-ready"})
	s, err := c.cs.CoreV1().Services("default").Get(c.ctx(), "nodes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	s, err = c.cs.CoreV1().Services("default").Update(c.ctx(), s, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// kube-proxy's health server of the Service on each node (vipd
	// probes it): 200 on node1, 503 on node2, which has no ready endpoint.
	hc := int(s.Spec.HealthCheckNodePort)
	tp.NodeHealthz(t, "node1", hc)
	tp.NodeHealthz(t, "node2", hc)
	tp.NodeHealthDown(t, "node2", hc)
	waitDests(t, nvip, "10.0.2.11:30080/1")
	h = tp.Hit(t, HTTPURL(nvip, 80, "/"), 20, false)
	if h.Errors != 0 || h.Counts["node1"] != 20 {
		t.Fatalf("nodes with externalTrafficPolicy Local: %+v", h)
	}
	who := tp.InClient(t, "curl", "-sS", "--max-time", "5", HTTPURL(nvip, 80, "/whoami"))
	if !strings.HasPrefix(who, "node1 "+tp.ClientIP+":") {
		t.Errorf("node1 saw %q, want the client's address %s", who, tp.ClientIP)
	}
	// node2's endpoint becomes ready: node2 is back (and, having had no
	// connections, takes the next ones under wlc).
	tp.NodeHealthUp(t, "node2", hc)
	c.slice("nodes", 8080, endpoint{"10.244.1.5", "node1", "ready"}, endpoint{"10.244.2.5", "node2", "ready"})
	waitDests(t, nvip, "10.0.2.11:30080/1", "10.0.2.12:30080/1")
	h = tp.Hit(t, HTTPURL(nvip, 80, "/"), 20, false)
	if h.Errors != 0 || h.Counts["node2"] == 0 || h.Counts["node1"]+h.Counts["node2"] != 20 {
		t.Fatalf("nodes with both endpoints ready: %+v", h)
	}
	if strings.Contains(d.logSince(), "level=ERROR") {
		t.Errorf("vipd logged errors:\n%s", d.logSince())
	}
}

// TestKubernetesPoolTenants runs vipd against a real kube-apiserver in
// the guest with a pool for one namespace only: a Service of another
// namespace that names the pool, or asks for its address by
// spec.loadBalancerIP, gets no address, no IPVS service and an Event
// PoolNotAllowed; a Service of the pool's namespace gets the address and
// its IPVS service.
func TestKubernetesPoolTenants(t *testing.T) {
	c := startCluster(t)
	tp := NewTopo(t, "k8s 2 4")
	if _, err := c.cs.CoreV1().Namespaces().Create(c.ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "pay"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := newDaemon(t)
	d.write(d.header(tp.LBIf, "") + fmt.Sprintf(`
[kubernetes]
kubeconfig = %q
default_class = true
leader_election = false

[[kubernetes.pool]]
name = "gold"
addresses = [%q]
auto_assign = false
namespaces = ["pay"]
`, c.srv.Kubeconfig, tp.VIP))
	d.start()

	create := func(ns, name, ip string) {
		t.Helper()
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{"vipd.io/pool": "gold"}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerIP: ip,
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}
		if ip != "" {
			svc.Annotations = nil
		}
		if _, err := c.cs.CoreV1().Services(ns).Create(c.ctx(), svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	event := func(name, want string) {
		t.Helper()
		Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
			evs, err := c.cs.CoreV1().Events("default").List(c.ctx(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			if err != nil {
				return false
			}
			for _, ev := range evs.Items {
				if ev.Reason == "PoolNotAllowed" && strings.Contains(ev.Message, want) {
					return true
				}
			}
			return false
		}, "no PoolNotAllowed Event %q on default/%s", want, name)
	}
	create("default", "thief", "")
	create("default", "grab", tp.VIP)
	event("thief", `pool "gold" is not for namespace "default" (its namespaces: pay)`)
	event("grab", fmt.Sprintf(`%s is in pool "gold", which is not for namespace "default"`, tp.VIP))
	if r := Exec("ipvsadm", "-Ln", "-t", tp.VIP+":80"); r.Err == nil {
		t.Fatalf("a refused Service has an IPVS service on %s:80:\n%s", tp.VIP, r.Stdout)
	}
	create("pay", "vault", "")
	Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
		return Exec("ipvsadm", "-Ln", "-t", tp.VIP+":80").Err == nil
	}, "pay/vault got no IPVS service on %s:80", tp.VIP)
	for _, name := range []string{"thief", "grab"} {
		s, err := c.cs.CoreV1().Services("default").Get(c.ctx(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Status.LoadBalancer.Ingress) != 0 {
			t.Errorf("default/%s has status %v", name, s.Status.LoadBalancer.Ingress)
		}
	}
}
