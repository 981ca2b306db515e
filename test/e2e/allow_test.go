//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// extraClient makes a client namespace ns on a link of its own to the LB
// (subnet 10.0.i.0/24 and fd00:i::/64, the client at .2 and ::2), removed
// when the test ends. It returns the client's IPv4 and IPv6 addresses.
func extraClient(t *testing.T, ns, link string, i int) (string, string) {
	t.Helper()
	t.Cleanup(func() {
		ShExec(fmt.Sprintf("ip link del %s 2>/dev/null; ip netns del %s 2>/dev/null", link, ns))
	})
	Sh(t, fmt.Sprintf(`
ip netns add %[1]s
ip -n %[1]s link set lo up
ip link add %[2]s type veth peer name eth0 netns %[1]s
ip addr add 10.0.%[3]d.1/24 dev %[2]s
ip addr add fd00:%[3]d::1/64 dev %[2]s nodad
ip link set %[2]s up
ip -n %[1]s addr add 10.0.%[3]d.2/24 dev eth0
ip -n %[1]s addr add fd00:%[3]d::2/64 dev eth0 nodad
ip -n %[1]s link set eth0 up
ip -n %[1]s route add default via 10.0.%[3]d.1
ip -n %[1]s -6 route add default via fd00:%[3]d::1
ip netns exec %[1]s busybox ping -c 1 -W 2 10.0.%[3]d.1 >/dev/null
ip netns exec %[1]s busybox ping -c 1 -W 2 fd00:%[3]d::1 >/dev/null
`, ns, link, i))
	return fmt.Sprintf("10.0.%d.2", i), fmt.Sprintf("fd00:%d::2", i)
}

// hitFrom sends n requests, each on a new connection, from namespace ns,
// each given timeout.
func hitFrom(t *testing.T, ns, url string, n int, timeout time.Duration) Hits {
	t.Helper()
	out := Run(t, "ip", "netns", "exec", ns, Payload()+"/bin/rignode", "hit", "-n", fmt.Sprint(n), "-timeout", timeout.String(), url)
	var h Hits
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("rignode hit printed %q: %v", out, err)
	}
	return h
}

// TestVipdAllow: a file service's allow list, enforced in the real kernel
// in front of real IPVS, IPv4 and IPv6. Three clients in three namespaces:
// a is admitted throughout, b never, c only for a while. While a keeps
// long-lived connections and a stream of new ones going, reloads widen
// the list to c, narrow it back (and rewrite a's entry as an address),
// then lift it: not one of a's requests fails, b is refused until the
// list goes, c is admitted exactly while listed, and a port of the same
// VIP without a list stays open to everyone.
func TestVipdAllow(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	extraClient(t, "vipd-cb", "lb-cb", 5)
	c4, c6 := extraClient(t, "vipd-cc", "lb-cc", 6)
	d := newDaemon(t)
	cfg := func(allow4, allow6 string) string {
		return d.header(tp.LBIf, "") +
			service("web", tp.VIP, 80, allow4, tp.BackendIPs...) +
			service("web6", tp.VIP6, 80, allow6, tp.BackendIP6...) +
			service("open", tp.VIP, 8080, "", tp.BackendIPs...)
	}
	web4, web6, open := HTTPURL(tp.VIP, 80, "/"), HTTPURL(tp.VIP6, 80, "/"), HTTPURL(tp.VIP, 8080, "/")
	const refused = 700 * time.Millisecond
	admitted := func(stage, name, ns string, urls ...string) {
		t.Helper()
		for _, u := range urls {
			if h := hitFrom(t, ns, u, 4, 3*time.Second); h.OK != 4 {
				t.Errorf("%s: %s (%s) to %s: %+v, want admitted", stage, name, ns, u, h)
			}
		}
	}
	denied := func(stage, name, ns string, urls ...string) {
		t.Helper()
		for _, u := range urls {
			if h := hitFrom(t, ns, u, 2, refused); h.OK != 0 || h.Errors != 2 {
				t.Errorf("%s: %s (%s) to %s: %+v, want refused", stage, name, ns, u, h)
			} else if e := strings.ToLower(strings.Join(h.ErrorSamples, " ")); !strings.Contains(e, "timeout") || strings.Contains(e, "refused") || strings.Contains(e, "reset") {
				t.Errorf("%s: %s to %s failed otherwise than by a drop: %v", stage, name, u, h.ErrorSamples)
			}
		}
	}
	reload := func(stage, allow4, allow6 string) {
		t.Helper()
		d.write(cfg(allow4, allow6))
		if r := d.reload(false); r.Err != nil {
			t.Fatalf("%s: reload:\n%s", stage, r)
		}
	}

	a4 := `allow = ["10.0.1.0/24", "192.0.2.0/24"]`
	a6 := `allow = ["fd00:1::/64"]`
	d.write(cfg(a4, a6))
	d.start()
	stage := "allow a"
	admitted(stage, "a", tp.ClientNS, web4, web6, open)
	denied(stage, "b", "vipd-cb", web4, web6)
	denied(stage, "c", "vipd-cc", web4, web6)
	admitted(stage, "b", "vipd-cb", open)
	mustContain(t, "ipset vipd-allowed-4", Run(t, "ipset", "list", "vipd-allowed-4"), tp.VIP+",tcp:80,10.0.1.0/24")
	mustContain(t, "ipset vipd-restricted-6", Run(t, "ipset", "list", "vipd-restricted-6"), tp.VIP6+",tcp:80")
	mustContain(t, "iptables-save", Run(t, "iptables-save", "-t", "filter"), "vipd drop sources a service does not allow")
	mustNotContain(t, "ipset vipd-restricted-4", Run(t, "ipset", "list", "vipd-restricted-4"), ",tcp:8080")

	// a's traffic goes on through every reload that follows.
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 4, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})

	stage = "widen to c"
	reload(stage, fmt.Sprintf(`allow = ["10.0.1.0/24", "192.0.2.0/24", %q]`, c4), fmt.Sprintf(`allow = ["fd00:1::/64", %q]`, c6))
	admitted(stage, "c", "vipd-cc", web4, web6)
	denied(stage, "b", "vipd-cb", web4, web6)

	stage = "narrow to a's address"
	reload(stage, `allow = ["10.0.1.2"]`, `allow = ["fd00:1::2"]`)
	denied(stage, "c", "vipd-cc", web4, web6)
	denied(stage, "b", "vipd-cb", web4, web6)
	admitted(stage, "a", tp.ClientNS, web4, web6)
	mustNotContain(t, "ipset vipd-allowed-4", Run(t, "ipset", "list", "vipd-allowed-4"), "10.0.1.0/24", c4)

	stage = "lift"
	reload(stage, "", "")
	admitted(stage, "b", "vipd-cb", web4, web6)
	admitted(stage, "c", "vipd-cc", web4, web6)
	mustNotContain(t, "ipset vipd-restricted-4", Run(t, "ipset", "list", "vipd-restricted-4"), tp.VIP)

	l.finish(t, "a, through every reload")
}

// TestKubernetesSourceRanges: a LoadBalancer Service's
// loadBalancerSourceRanges, and the annotation cloud providers read when
// the field is empty, enforced with real traffic in both backend modes,
// against a real kube-apiserver: the listed client is admitted, another
// client namespace refused; an edit of the ranges admits the other one;
// the annotation then replaces the field's list.
func TestKubernetesSourceRanges(t *testing.T) {
	c := startCluster(t)
	tp := NewTopo(t, "k8s 2 2")
	b4, _ := extraClient(t, "vipd-cb", "lb-cb", 5)
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

	api := c.cs.CoreV1().Services("default")
	edit := func(name string, f func(*corev1.Service)) {
		t.Helper()
		s, err := api.Get(c.ctx(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		f(s)
		if _, err := api.Update(c.ctx(), s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ranges := func(vip string, want ...string) {
		t.Helper()
		Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
			out := Run(t, "ipset", "list", "vipd-allowed-4")
			n := 0
			for _, w := range want {
				// ipset prints a host's /32 as the address alone.
				if strings.Contains(out, vip+",tcp:80,"+strings.TrimSuffix(w, "/32")+"\n") {
					n++
				}
			}
			return n == len(want) && strings.Count(out, vip+",tcp:80,") == len(want)
		}, "vipd-allowed-4 for %s, want %v:\n%s", vip, want, Exec("ipset", "list", "vipd-allowed-4").Stdout)
	}
	admitted := func(stage, ns, url string) {
		t.Helper()
		if h := hitFrom(t, ns, url, 4, 3*time.Second); h.OK != 4 {
			t.Errorf("%s: %s to %s: %+v, want admitted", stage, ns, url, h)
		}
	}
	denied := func(stage, ns, url string) {
		t.Helper()
		if h := hitFrom(t, ns, url, 2, 700*time.Millisecond); h.OK != 0 {
			t.Errorf("%s: %s to %s: %+v, want refused", stage, ns, url, h)
		}
	}

	// Pods (endpoints mode) and nodes (nodeport mode), both for the
	// client's network alone.
	pods := c.service("pods", map[string]string{"vipd.io/backends": "endpoints"}, 0)
	c.slice("pods", 8080, endpoint{"10.0.2.101", "", "ready"}, endpoint{"10.0.2.102", "", "ready"})
	nodes := c.service("nodes", nil, 30080)
	for _, name := range []string{"pods", "nodes"} {
		edit(name, func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.1.0/24"} })
	}
	ranges(pods, "10.0.1.0/24")
	ranges(nodes, "10.0.1.0/24")
	waitDests(t, pods, "10.0.2.101:8080/1", "10.0.2.102:8080/1")
	for _, vip := range []string{pods, nodes} {
		u := HTTPURL(vip, 80, "/")
		admitted("client's network", tp.ClientNS, u)
		denied("client's network", "vipd-cb", u)
	}

	// The field widened to the other client, with the first one's
	// requests flowing: none fails.
	l := startLoadWith(t, tp, loadOptions{Port: 80, Short: 2, ShortEvery: 50 * time.Millisecond})
	edit("pods", func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.1.0/24", b4 + "/32"} })
	ranges(pods, "10.0.1.0/24", b4+"/32")
	admitted("widened", "vipd-cb", HTTPURL(pods, 80, "/"))
	l.finish(t, "client while the ranges widen")

	// The field emptied, the annotation lists the other client alone.
	edit("pods", func(s *corev1.Service) {
		s.Spec.LoadBalancerSourceRanges = nil
		s.Annotations["service.beta.kubernetes.io/load-balancer-source-ranges"] = b4 + "/32"
	})
	ranges(pods, b4+"/32")
	denied("annotation", tp.ClientNS, HTTPURL(pods, 80, "/"))
	admitted("annotation", "vipd-cb", HTTPURL(pods, 80, "/"))
}
