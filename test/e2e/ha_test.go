//go:build e2e

package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The high-availability tests run a pair of vipd nodes, lb1 and lb2, as
// namespaces on the LAN of topo_ha: one VRRP virtual router (VRRPv3 with
// 100 ms advertisements), the VIP served by direct routing to two
// backends, and the kernel's connection synchronization between the
// nodes. Client traffic flows while the master fails.

// haNode is one vipd of the pair.
type haNode struct {
	*daemon
	name, ip string
}

// haConfig is a node's configuration: [ha] with priority, and the one
// service.
func haConfig(d *daemon, tp *Topo, priority int, extra string) string {
	return d.header("eth0", "") + fmt.Sprintf(`
[ha]
mode = "vrrp"
interface = "eth0"
vrid = 51
priority = %d
advert_interval = "100ms"
sync_interface = "eth0"
%s
`, priority, extra) + service("web", tp.VIP, 80, "scheduler = \"mh\"\nforward = \"droute\"", tp.BackendIPs...)
}

func startHANode(t *testing.T, tp *Topo, n, priority int, extra string) *haNode {
	t.Helper()
	d := newDaemon(t)
	d.ns = fmt.Sprintf("lb%d", n)
	d.write(haConfig(d, tp, priority, extra))
	d.start()
	return &haNode{daemon: d, name: d.ns, ip: fmt.Sprintf("10.0.3.%d", 20+n)}
}

var roleLine = regexp.MustCompile(`time=(\S+) level=INFO msg="high availability: role changed" role=(\w+)`)

// roles returns the node's role changes, each with its time.
func (n *haNode) roles() []string {
	var out []string
	for _, m := range roleLine.FindAllStringSubmatch(n.logSince(), -1) {
		out = append(out, m[2]+"@"+m[1])
	}
	return out
}

// waitRole waits until the node's last role change is role.
func (n *haNode) waitRole(t *testing.T, role string, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	Eventually(t, timeout, 20*time.Millisecond, func() bool {
		r := n.roles()
		if len(r) == 0 || !strings.HasPrefix(r[len(r)-1], role+"@") {
			return false
		}
		at, _ = time.Parse(time.RFC3339Nano, strings.TrimPrefix(r[len(r)-1], role+"@"))
		return true
	}, "%s never became %s; roles %v:\n%s", n.name, role, n.roles(), n.log)
	return at
}

// macOf returns the MAC address of eth0 in namespace ns.
func macOf(t *testing.T, ns string) string {
	out := Run(t, "ip", "-n", ns, "-br", "link", "show", "eth0")
	f := strings.Fields(out)
	if len(f) < 3 {
		t.Fatalf("ip -br link in %s: %q", ns, out)
	}
	return f[2]
}

// clientNeighbour returns the MAC the client resolves the VIP to.
func clientNeighbour(t *testing.T, tp *Topo) string {
	out := tp.InClient(t, "ip", "neigh", "show", tp.VIP)
	if i := strings.Index(out, "lladdr "); i >= 0 {
		return strings.Fields(out[i+len("lladdr "):])[0]
	}
	return ""
}

// TestHAFailover cuts the master's link under load: the backup takes
// over within the VRRP master-down interval, the client's neighbour entry
// moves to it, no request fails and no long-lived connection breaks.
func TestHAFailover(t *testing.T) {
	tp := NewTopo(t, "ha 2")
	lb1 := startHANode(t, tp, 1, 150, "")
	lb1.waitRole(t, "master", 10*time.Second)
	lb2 := startHANode(t, tp, 2, 100, "")
	// The backup programs the service too, and announces nothing.
	mustContain(t, "ipvsadm -Ln in lb2", Run(t, "ip", "netns", "exec", "lb2", "ipvsadm", "-Ln"), tp.VIP+":80", "Route")
	if r := lb2.roles(); len(r) != 0 {
		t.Fatalf("lb2 changed role with a master of higher priority present: %v", r)
	}
	if h := tp.Hit(t, url(tp, 80), 6, false); h.Errors != 0 {
		t.Fatalf("requests through the master failed: %+v", h)
	}
	if got, want := clientNeighbour(t, tp), macOf(t, "lb1"); got != want {
		t.Fatalf("the client resolves the VIP to %s, not to the master lb1 (%s)", got, want)
	}
	mustContain(t, "sync daemons in lb2", Run(t, "ip", "netns", "exec", "lb2", "ipvsadm", "-L", "--daemon"),
		"master sync daemon (mcast=eth0, syncid=51", "backup sync daemon (mcast=eth0, syncid=51")

	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 10, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(2 * time.Second)
	// The synchronization daemon copies the master's connections.
	Eventually(t, 10*time.Second, 200*time.Millisecond, func() bool {
		return strings.Count(Run(t, "ip", "netns", "exec", "lb2", "ipvsadm", "-Lnc"), "ESTABLISHED") >= 10
	}, "lb2 has not the master's 10 long-lived connections:\n%s", Run(t, "ip", "netns", "exec", "lb2", "ipvsadm", "-Lnc"))

	cut := time.Now()
	Run(t, "ip", "link", "set", "vlb1", "down")
	took := lb2.waitRole(t, "master", 5*time.Second).Sub(cut)
	Eventually(t, 5*time.Second, 20*time.Millisecond, func() bool { return clientNeighbour(t, tp) == macOf(t, "lb2") },
		"the client still resolves the VIP to %s, not to lb2", clientNeighbour(t, tp))
	time.Sleep(3 * time.Second)
	l.finish(t, "link of the master cut")
	t.Logf("takeover: lb2 master %v after the cut (advertisement interval 100 ms)", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("lb2 took over %v after the cut, want well under a second at 100 ms adverts", took)
	}
}

// TestHAGracefulStop stops the master: it resigns (priority 0) and the
// backup takes over at once, with no failed request.
func TestHAGracefulStop(t *testing.T) {
	tp := NewTopo(t, "ha 2")
	lb1 := startHANode(t, tp, 1, 150, "")
	lb1.waitRole(t, "master", 10*time.Second)
	lb2 := startHANode(t, tp, 2, 100, "")
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 4, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(time.Second)
	stop := time.Now()
	lb1.stop()
	took := lb2.waitRole(t, "master", 5*time.Second).Sub(stop)
	time.Sleep(2 * time.Second)
	l.finish(t, "master stopped")
	t.Logf("takeover after SIGTERM: %v", took.Round(time.Millisecond))
	if !strings.Contains(lb2.logSince(), "resigned (priority 0)") {
		t.Errorf("lb2 did not take over on lb1's resignation:\n%s", lb2.logSince())
	}
}
