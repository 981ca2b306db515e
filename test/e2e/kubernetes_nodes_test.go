//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The node health tests run vipd in nodeport mode against a real
// kube-apiserver in the guest, with topo_k8s's stand-ins for kube-proxy's
// health servers on the nodes (issue 35 part 1), and a one-arm layout
// where only SNAT works (part 2).

// nodeHealthBound is how long a failed node may stay in rotation: fall ×
// interval (2 × 1 s, the defaults) plus one interval for the probe in
// flight and the reconcile, plus 0.5 s of slack for the emulated guest.
const nodeHealthBound = 3500 * time.Millisecond

// k8sNodesConfig is the config of the nodeport-mode tests: the Kubernetes
// source with the [daemon] extra lines, the [kubernetes] extra lines
// (node_health) and the pools. The daemon does no periodic resync (1 h):
// its loop runs one pass at a time, so a health transition waits for a
// resync pass in progress, and in the emulated guest under load a resync
// pass (which re-reads the sysctls and the iptables and ipset rules) took
// 1-5.5 s, against tens of milliseconds on a real host; with the harness's
// 2 s resync the loop was almost always busy, and even at the default 30 s
// one pass in six overlapped the removal and added its length to it.
func k8sNodesConfig(d *daemon, tp *Topo, kubeconfig, daemonExtra, extra string, pools string) string {
	daemonExtra += "\nresync_interval = \"1h\""
	return d.header(tp.LBIf, daemonExtra) + fmt.Sprintf(`
[kubernetes]
kubeconfig = %q
default_class = true
backends = "nodeport"
leader_election = false
%s
%s`, kubeconfig, extra, pools)
}

// destState returns the weight of real server addr ("IP:PORT") of the TCP
// virtual service vip:80, and whether ipvsadm lists it.
func destState(t *testing.T, vip, addr string) (weight string, listed bool) {
	for _, d := range ipvsDests(t, vip) {
		if a, w, ok := strings.Cut(d, "/"); ok && a == addr {
			return w, true
		}
	}
	return "", false
}

// outOfRotation reports whether addr takes no new connections of vip:80:
// not listed, or at weight 0 (drained: vipd's drain keeps a removed real
// server at weight 0 while it has connections, up to drain_timeout).
func outOfRotation(t *testing.T, vip, addr string) bool {
	w, listed := destState(t, vip, addr)
	return !listed || w == "0"
}

// leaves runs act (what takes a node down) and measures how long until the
// node's real server addr is out of vip:80's rotation, from the moment act
// returned (its change, the last thing it does, is then in force); it
// fails the test when that takes longer than nodeHealthBound, and returns
// the time it took and when it was seen.
func leaves(t *testing.T, d *daemon, vip, addr, what string, act func()) (time.Duration, time.Time) {
	t.Helper()
	called := time.Now()
	act()
	start := time.Now()
	t.Logf("%s: the change took %v to make", what, start.Sub(called).Round(time.Millisecond))
	deadline := start.Add(30 * time.Second)
	for !outOfRotation(t, vip, addr) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s still in rotation of %s:80 after 30 s: %q", what, addr, vip, ipvsDests(t, vip))
		}
		time.Sleep(50 * time.Millisecond)
	}
	seen := time.Now()
	took := seen.Sub(start)
	_, listed := destState(t, vip, addr)
	t.Logf("%s: %s out of rotation after %v (listed at weight 0: %t)", what, addr, took.Round(10*time.Millisecond), listed)
	// Where the time went: vipd's lines about addr since the change,
	// with their offsets from it (the probe's verdict, the pass that
	// applied it).
	for _, line := range strings.Split(d.logSince(), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "time=") || !strings.Contains(line, addr) {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time="))
		if err != nil || at.Before(start) {
			continue
		}
		t.Logf("%s: +%v %s", what, at.Sub(start).Round(time.Millisecond), strings.Join(f[1:], " "))
	}
	if took > nodeHealthBound {
		t.Errorf("%s: %s left after %v, want at most %v (fall × interval + 1 interval)", what, addr, took.Round(10*time.Millisecond), nodeHealthBound)
	}
	return took, seen
}

// returns waits until vip:80's real servers are want again, and logs how
// long that took since start.
func returns(t *testing.T, vip, what string, start time.Time, want ...string) {
	t.Helper()
	waitDests(t, vip, want...)
	t.Logf("%s: back after %v: %q", what, time.Since(start).Round(10*time.Millisecond), want)
}

// failedSince splits the short requests of l that failed into those sent
// before at and those sent at or after it.
func (l *load) failedSince(at time.Time) (before, after []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, sent := range l.shortFailed {
		if sent.Before(at) {
			before = append(before, l.shortErr[i])
		} else {
			after = append(after, fmt.Sprintf("sent %s: %s", sent.Format("15:04:05.000"), l.shortErr[i]))
		}
	}
	return before, after
}

// TestKubernetesNodeHealth: a Cluster Service in nodeport mode on three
// nodes, with requests flowing. A node whose kube-proxy health server
// (10256 /healthz) answers 503 leaves the Service within fall × interval
// plus one interval, while its nodePort still answers, and no request
// fails; it returns once healthy. Then a node's link is cut: it leaves
// within the same bound; requests in flight to it may fail, none sent
// after it left; it returns when the link does.
func TestKubernetesNodeHealth(t *testing.T) {
	c := startCluster(t)
	tp := NewTopo(t, "k8s 3 0")
	for i := 1; i <= 3; i++ {
		c.node(fmt.Sprintf("node%d", i), fmt.Sprintf("10.0.2.%d", 10+i))
	}
	d := newDaemon(t)
	// Every key of [kubernetes.node_health], at its default.
	d.write(k8sNodesConfig(d, tp, c.srv.Kubeconfig, "", `
[kubernetes.node_health]
enabled = true
port = 10256
path = "/healthz"
local = true
interval = "1s"
timeout = "500ms"
rise = 2
fall = 2
`, fmt.Sprintf(`
[[kubernetes.pool]]
name = "test"
addresses = [%q]
`, tp.VIP)))
	d.start()

	vip := c.service("nodes", nil, 30080)
	all := []string{"10.0.2.11:30080/1", "10.0.2.12:30080/1", "10.0.2.13:30080/1"}
	waitDests(t, vip, all...)
	// The probes pass: the nodes stay (a failing probe would take them
	// out within 3 s, or fail all of them open).
	time.Sleep(3 * time.Second)
	waitDests(t, vip, all...)

	// 1. node2's health endpoint answers 503 under load; its nodePort
	// still serves, so no request may fail, before or after.
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 3, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(time.Second)
	leaves(t, d, vip, "10.0.2.12:30080", "node2 health 503", func() { tp.NodeHealthDown(t, "node2") })
	time.Sleep(2 * time.Second)
	if h := tp.Hit(t, HTTPURL(vip, 80, "/"), 12, false); h.Errors != 0 || h.Counts["node2"] != 0 || h.OK != 12 {
		t.Errorf("with node2 unhealthy: %+v", h)
	}
	up := time.Now()
	tp.NodeHealthUp(t, "node2")
	returns(t, vip, "node2 health 200", up, all...)
	time.Sleep(time.Second)
	l.finish(t, "node2 health 503 and back")

	// 2. node3's link is cut under load.
	l = startLoadWith(t, tp, loadOptions{Port: 80, Short: 3, ShortEvery: 50 * time.Millisecond})
	time.Sleep(time.Second)
	_, gone := leaves(t, d, vip, "10.0.2.13:30080", "node3 link down", func() { tp.LinkDown(t, "node3") })
	time.Sleep(3 * time.Second)
	if h := tp.Hit(t, HTTPURL(vip, 80, "/"), 12, false); h.Errors != 0 || h.Counts["node3"] != 0 || h.OK != 12 {
		t.Errorf("with node3 cut off: %+v", h)
	}
	up = time.Now()
	tp.LinkUp(t, "node3")
	returns(t, vip, "node3 link up", up, all...)
	time.Sleep(time.Second)
	l.end()
	before, after := l.failedSince(gone)
	t.Logf("node3 link down: %d short requests ok, %d failed before node3 left (in flight to it), %d after %q",
		l.shortOK, len(before), len(after), first(before))
	if len(after) > 0 {
		t.Errorf("node3 link down: %d requests sent after node3 left failed: %q", len(after), first(after))
	}
	if l.shortOK == 0 {
		t.Errorf("node3 link down: no traffic went through")
	}
	if strings.Contains(d.logSince(), "level=ERROR") {
		t.Errorf("vipd logged errors:\n%s", d.logSince())
	}
}

// TestKubernetesNodeHealthLocal: a Service with externalTrafficPolicy
// Local gets a healthCheckNodePort from the API server; vipd probes the
// nodes there (not at kube-proxy's 10256), weights each node by its ready
// endpoints (3 and 1), and a node whose healthCheckNodePort answers 503
// leaves within fall × interval plus one interval.
func TestKubernetesNodeHealthLocal(t *testing.T) {
	c := startCluster(t)
	tp := NewTopo(t, "k8s 2 0")
	c.node("node1", "10.0.2.11")
	c.node("node2", "10.0.2.12")
	d := newDaemon(t)
	// No [kubernetes.node_health]: the defaults (enabled, local = true).
	d.write(k8sNodesConfig(d, tp, c.srv.Kubeconfig, "", "", fmt.Sprintf(`
[[kubernetes.pool]]
name = "test"
addresses = [%q]
`, tp.VIP)))
	d.start()

	// Three ready endpoints on node1, one on node2 (and one not ready,
	// which does not count).
	c.slice("local", 8080, endpoint{"10.244.1.5", "node1", "ready"}, endpoint{"10.244.1.6", "node1", "ready"},
		endpoint{"10.244.1.7", "node1", "ready"}, endpoint{"10.244.2.5", "node2", "ready"}, endpoint{"10.244.2.6", "node2", "not-ready"})
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "local"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30080}}},
	}
	created, err := c.cs.CoreV1().Services("default").Create(c.ctx(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hc := int(created.Spec.HealthCheckNodePort)
	if hc == 0 {
		t.Fatalf("the API server allocated no healthCheckNodePort: %+v", created.Spec)
	}
	t.Logf("healthCheckNodePort %d", hc)
	// kube-proxy's health server of the Service, on each node.
	tp.NodeHealthz(t, "node1", hc)
	tp.NodeHealthz(t, "node2", hc)
	var vip string
	Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
		s, err := c.cs.CoreV1().Services("default").Get(c.ctx(), "local", metav1.GetOptions{})
		if err != nil || len(s.Status.LoadBalancer.Ingress) == 0 {
			return false
		}
		vip = s.Status.LoadBalancer.Ingress[0].IP
		return true
	}, "Service local got no address")

	// Weighted by ready endpoints.
	weighted := []string{"10.0.2.11:30080/3", "10.0.2.12:30080/1"}
	waitDests(t, vip, weighted...)
	h := tp.Hit(t, HTTPURL(vip, 80, "/"), 40, false)
	t.Logf("40 requests at weights 3 and 1: %v", h.Counts)
	if h.Errors != 0 || h.OK != 40 || h.Counts["node2"] == 0 || h.Counts["node1"] <= h.Counts["node2"] {
		t.Errorf("weights 3 and 1: %+v", h)
	}
	who := tp.InClient(t, "curl", "-sS", "--max-time", "5", HTTPURL(vip, 80, "/whoami"))
	if f := strings.Fields(who); len(f) < 2 || !strings.HasPrefix(f[1], tp.ClientIP+":") {
		t.Errorf("a Local Service's node saw %q, want the client's address %s", who, tp.ClientIP)
	}

	// kube-proxy's own health (10256) does not decide a Local Service's
	// nodes: node2's answering 503 there changes nothing.
	tp.NodeHealthDown(t, "node2")
	time.Sleep(nodeHealthBound)
	if got := strings.Join(ipvsDests(t, vip), " "); got != strings.Join(weighted, " ") {
		t.Errorf("node2's 10256 /healthz at 503 changed the Local Service: %q, want %q", got, weighted)
	}
	tp.NodeHealthUp(t, "node2")

	// node1's healthCheckNodePort answers 503 (as kube-proxy does for a
	// node without a ready endpoint): node1 leaves, node2 stays.
	l := startLoadWith(t, tp, loadOptions{Port: 80, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(time.Second)
	leaves(t, d, vip, "10.0.2.11:30080", "node1 healthCheckNodePort 503", func() { tp.NodeHealthDown(t, "node1", hc) })
	if w, ok := destState(t, vip, "10.0.2.12:30080"); !ok || w != "1" {
		t.Errorf("node2 should stay at weight 1: %q", ipvsDests(t, vip))
	}
	time.Sleep(2 * time.Second)
	if h := tp.Hit(t, HTTPURL(vip, 80, "/"), 10, false); h.Errors != 0 || h.Counts["node2"] != 10 {
		t.Errorf("with node1 unhealthy: %+v", h)
	}
	up := time.Now()
	tp.NodeHealthUp(t, "node1", hc)
	returns(t, vip, "node1 healthCheckNodePort 200", up, weighted...)
	time.Sleep(time.Second)
	l.finish(t, "node1 healthCheckNodePort 503 and back")
	if strings.Contains(d.logSince(), "level=ERROR") {
		t.Errorf("vipd logged errors:\n%s", d.logSince())
	}
}

// TestKubernetesOneArm: in topo_k8s's one-arm layout the nodes route
// their replies to their own gateway, not through vipd. A Service without
// SNAT keeps the client's address and every request fails (which proves
// the layout); with the annotation vipd.io/snat "true", and in a pool with
// snat = true, vipd masquerades (ipset, iptables MASQUERADE, the nodes see
// vipd's own address) and requests under load all succeed.
func TestKubernetesOneArm(t *testing.T) {
	c := startCluster(t)
	tp := NewTopo(t, "k8s 2 0 onearm")
	c.node("node1", "10.0.2.11")
	c.node("node2", "10.0.2.12")
	const snatVIP = "10.0.0.11"
	d := newDaemon(t)
	d.write(k8sNodesConfig(d, tp, c.srv.Kubeconfig, "manage_iptables = true", "", fmt.Sprintf(`
[[kubernetes.pool]]
name = "lan"
addresses = [%q]

[[kubernetes.pool]]
name = "onearm"
addresses = [%q]
auto_assign = false
snat = true
`, tp.VIP, snatVIP)))
	d.start()
	nodes := []string{"10.0.2.11:30080/1", "10.0.2.12:30080/1"}

	// Plain NAT: the nodes answer the client through their gateway, which
	// drops it. Every request fails.
	vip := c.service("plain", nil, 30080)
	if vip != tp.VIP {
		t.Fatalf("plain got %s, want %s", vip, tp.VIP)
	}
	waitDests(t, vip, nodes...)
	if h := tp.Hit(t, HTTPURL(vip, 80, "/"), 4, false); h.OK != 0 || h.Errors != 4 {
		t.Fatalf("without SNAT in the one-arm layout every request should fail: %+v", h)
	}
	if out := Exec("ipset", "list", "vipd-snat-4").Stdout; strings.Contains(out, vip+",tcp:80") {
		t.Errorf("plain is in the SNAT set without asking:\n%s", out)
	}

	// The annotation turns SNAT on: traffic flows, from vipd's address.
	s, err := c.cs.CoreV1().Services("default").Get(c.ctx(), "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Annotations = map[string]string{"vipd.io/snat": "true"}
	if _, err := c.cs.CoreV1().Services("default").Update(c.ctx(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkSNAT(t, tp, vip)
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 2, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(4 * time.Second)
	l.finish(t, "one-arm, vipd.io/snat")

	// A pool with snat = true: its Services masquerade without an
	// annotation. (The nodes serve one nodePort: the first Service goes.)
	if err := c.cs.CoreV1().Services("default").Delete(c.ctx(), "plain", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
		return Exec("ipvsadm", "-Ln", "-t", vip+":80").Err != nil
	}, "plain's IPVS service stayed")
	pvip := c.service("pooled", map[string]string{"vipd.io/pool": "onearm"}, 30080)
	if pvip != snatVIP {
		t.Fatalf("pooled got %s, want %s", pvip, snatVIP)
	}
	waitDests(t, pvip, nodes...)
	checkSNAT(t, tp, pvip)
	ptp := *tp
	ptp.VIP = pvip
	l = startLoadWith(t, &ptp, loadOptions{Port: 80, Long: 2, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(4 * time.Second)
	l.finish(t, "one-arm, pool snat")
	if strings.Contains(d.logSince(), "level=ERROR") {
		t.Errorf("vipd logged errors:\n%s", d.logSince())
	}
}

// checkSNAT waits until vip:80 is masqueraded (in vipd's SNAT set, with
// its MASQUERADE rule and IPVS conntrack on) and checks that the nodes see
// vipd's own address on the nodes' bridge (10.0.2.1) as the client.
func checkSNAT(t *testing.T, tp *Topo, vip string) {
	t.Helper()
	Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
		return strings.Contains(Exec("ipset", "list", "vipd-snat-4").Stdout, vip+",tcp:80")
	}, "%s,tcp:80 never entered vipd-snat-4:\n%s", vip, Exec("ipset", "list", "vipd-snat-4").Stdout)
	mustContain(t, "iptables-save -t nat", Run(t, "iptables-save", "-t", "nat"), "-j MASQUERADE")
	if v := strings.TrimSpace(Run(t, "cat", "/proc/sys/net/ipv4/vs/conntrack")); v != "1" {
		t.Errorf("net.ipv4.vs.conntrack = %s, want 1", v)
	}
	mustContain(t, "ipvsadm -Ln", Run(t, "ipvsadm", "-Ln", "-t", vip+":80"), "Masq")
	var who string
	Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		r := Exec("ip", "netns", "exec", tp.ClientNS, "curl", "-sS", "--max-time", "3", HTTPURL(vip, 80, "/whoami"))
		who = r.Stdout
		return r.Err == nil
	}, "no answer through %s with SNAT", vip)
	if f := strings.Fields(who); len(f) < 2 || !strings.HasPrefix(f[1], "10.0.2.1:") {
		t.Errorf("through %s with SNAT the node saw %q, want vipd's 10.0.2.1", vip, who)
	}
}
