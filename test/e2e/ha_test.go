//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// startHANode starts vipd as node n of a direct-routing pair with
// synchronized connections (see pairOptions), with priority.
func startHANode(t *testing.T, tp *Topo, n, priority int) *haNode {
	t.Helper()
	d := newDaemon(t)
	d.ns = fmt.Sprintf("lb%d", n)
	d.write(vipdPairConfig(t, d, tp, pairOptions{Mode: "dr", Sync: true}, priority))
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
	lb1 := startHANode(t, tp, 1, 150)
	lb1.waitRole(t, "master", 10*time.Second)
	lb2 := startHANode(t, tp, 2, 100)
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
	took := lb2.waitRole(t, "master", 15*time.Second).Sub(cut)
	Eventually(t, 15*time.Second, 20*time.Millisecond, func() bool { return clientNeighbour(t, tp) == macOf(t, "lb2") },
		"the client still resolves the VIP to %s, not to lb2", clientNeighbour(t, tp))
	time.Sleep(3 * time.Second)
	l.finish(t, "link of the master cut")
	// The time is reported, not asserted: the emulated guest stalls now
	// and then; what must hold is that no request failed.
	t.Logf("takeover: lb2 master %v after the cut (advertisement interval 100 ms)", took.Round(time.Millisecond))
}

// TestHAGracefulStop stops the master: it resigns (priority 0) and the
// backup takes over at once, with no failed request.
func TestHAGracefulStop(t *testing.T) {
	tp := NewTopo(t, "ha 2")
	lb1 := startHANode(t, tp, 1, 150)
	lb1.waitRole(t, "master", 10*time.Second)
	lb2 := startHANode(t, tp, 2, 100)
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 4, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(time.Second)
	stop := time.Now()
	lb1.stop()
	took := lb2.waitRole(t, "master", 15*time.Second).Sub(stop)
	time.Sleep(2 * time.Second)
	l.finish(t, "master stopped")
	t.Logf("takeover after SIGTERM: %v", took.Round(time.Millisecond))
	if !strings.Contains(lb2.logSince(), "resigned (priority 0)") {
		t.Errorf("lb2 did not take over on lb1's resignation:\n%s", lb2.logSince())
	}
	// A restart: lb1, master when it stopped and of higher priority,
	// preempts lb2 at its first advertisement, with no failed request.
	l = startLoadWith(t, tp, loadOptions{Port: 80, Long: 4, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(time.Second)
	lb1.start()
	lb1.waitRole(t, "master", 15*time.Second)
	lb2.waitRole(t, "backup", 15*time.Second)
	Eventually(t, 15*time.Second, 20*time.Millisecond, func() bool { return clientNeighbour(t, tp) == macOf(t, "lb1") },
		"the client still resolves the VIP to %s, not to the restarted lb1", clientNeighbour(t, tp))
	time.Sleep(time.Second)
	l.finish(t, "master restarted")
	if back := lb1.logSince(); !strings.Contains(back, "preempting master 10.0.3.22") {
		t.Errorf("the restarted lb1 did not preempt lb2 at once:\n%s", back)
	}
}

// keepalivedConf is a keepalived 2.2 director for the LAN of topo_ha:
// VRRPv3 at 100 ms on eth0 with the VIP, IPVS's connection sync (sync id
// 51) following its role, and the same DR service as the vipd nodes.
func keepalivedConf(tp *Topo, priority int) string {
	var rs strings.Builder
	for _, ip := range tp.BackendIPs {
		fmt.Fprintf(&rs, "  real_server %s 80 {\n    weight 1\n  }\n", ip)
	}
	return fmt.Sprintf(`global_defs {
  vrrp_version 3
  lvs_sync_daemon eth0 VI_1 id 51
  enable_script_security
}
vrrp_instance VI_1 {
  state BACKUP
  interface eth0
  virtual_router_id 51
  priority %d
  advert_int 0.1
  virtual_ipaddress {
    %s/32
  }
}
virtual_server %s 80 {
  lb_algo mh
  lb_kind DR
  protocol TCP
%s}
`, priority, tp.VIP, tp.VIP, rs.String())
}

// TestHAKeepalivedPeer runs keepalived on lb1 and vipd on lb2 as peers
// of one virtual router: keepalived, of higher priority, is master and
// vipd its backup, receiving keepalived's connection sync; when
// keepalived's node is cut off, vipd takes over, and the long-lived
// connections keepalived's node carried continue through vipd's.
func TestHAKeepalivedPeer(t *testing.T) {
	bin, err := exec.LookPath("keepalived")
	if err != nil {
		t.Fatalf("keepalived is not in the guest (test/deps.sh installs it on the host, and the guest image copies it): %v", err)
	}
	tp := NewTopo(t, "ha 2")
	dir := t.TempDir()
	conf := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(conf, []byte(keepalivedConf(tp, 200)), 0o644); err != nil {
		t.Fatal(err)
	}
	klog := &lockedBuffer{}
	k := exec.Command("ip", "netns", "exec", "lb1", bin, "-n", "-l", "-D", "-f", conf,
		"-p", filepath.Join(dir, "k.pid"), "-r", filepath.Join(dir, "v.pid"), "-c", filepath.Join(dir, "c.pid"))
	k.Stdout, k.Stderr = klog, klog
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	kdone := make(chan struct{})
	go func() { k.Wait(); close(kdone) }()
	t.Cleanup(func() {
		k.Process.Kill()
		<-kdone
		if t.Failed() {
			t.Logf("keepalived log:\n%s", klog)
		}
	})
	Eventually(t, 20*time.Second, 50*time.Millisecond, func() bool {
		return strings.Contains(Run(t, "ip", "-n", "lb1", "addr", "show", "eth0"), tp.VIP+"/32")
	}, "keepalived never became master:\n%s", klog)

	lb2 := startHANode(t, tp, 2, 100)
	time.Sleep(time.Second)
	if r := lb2.roles(); len(r) != 0 {
		t.Fatalf("vipd changed role with keepalived master at a higher priority: %v", r)
	}
	if h := tp.Hit(t, url(tp, 80), 4, false); h.Errors != 0 {
		t.Fatalf("requests through keepalived's node failed: %+v", h)
	}
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 6, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	Eventually(t, 10*time.Second, 200*time.Millisecond, func() bool {
		return strings.Count(Run(t, "ip", "netns", "exec", "lb2", "ipvsadm", "-Lnc"), "ESTABLISHED") >= 6
	}, "vipd's node has not keepalived's 6 long-lived connections:\n%s", Run(t, "ip", "netns", "exec", "lb2", "ipvsadm", "-Lnc"))
	cut := time.Now()
	Run(t, "ip", "link", "set", "vlb1", "down")
	took := lb2.waitRole(t, "master", 15*time.Second).Sub(cut)
	time.Sleep(3 * time.Second)
	l.finish(t, "keepalived's node cut off")
	t.Logf("vipd took over from keepalived %v after the cut", took.Round(time.Millisecond))
}

// TestHAKillAndComeBack kills the master's vipd (kill -9: its kernel keeps
// the VIP, the services and the synchronization daemons, but no longer
// answers ARP for the VIP or advertises), then starts it again: the backup
// takes over, and the restarted node, of higher priority and master when
// it was killed, takes the VIPs back at once. Long-lived connections
// live through both moves and no request fails.
func TestHAKillAndComeBack(t *testing.T) {
	tp := NewTopo(t, "ha 2")
	lb1 := startHANode(t, tp, 1, 150)
	lb1.waitRole(t, "master", 10*time.Second)
	lb2 := startHANode(t, tp, 2, 100)
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 6, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	Eventually(t, 10*time.Second, 200*time.Millisecond, func() bool {
		return strings.Count(Run(t, "ip", "netns", "exec", "lb2", "ipvsadm", "-Lnc"), "ESTABLISHED") >= 6
	}, "lb2 has not the master's long-lived connections")
	kill := time.Now()
	lb1.kill()
	took := lb2.waitRole(t, "master", 15*time.Second).Sub(kill)
	Eventually(t, 15*time.Second, 20*time.Millisecond, func() bool { return clientNeighbour(t, tp) == macOf(t, "lb2") },
		"the client still resolves the VIP to %s, not to lb2", clientNeighbour(t, tp))
	time.Sleep(2 * time.Second)
	// Back: lb1 was master when it was killed, so it starts as master.
	lb1.start()
	back := lb1.logSince()
	if !strings.Contains(back, "master when it stopped; taking the VIPs back") {
		t.Errorf("the restarted lb1 did not take the VIPs back as the master it was:\n%s", back)
	}
	lb2.waitRole(t, "backup", 15*time.Second)
	Eventually(t, 15*time.Second, 20*time.Millisecond, func() bool { return clientNeighbour(t, tp) == macOf(t, "lb1") },
		"the client still resolves the VIP to %s, not to lb1", clientNeighbour(t, tp))
	time.Sleep(2 * time.Second)
	l.finish(t, "master killed and restarted")
	t.Logf("kill -9 of the master: lb2 master %v after it", took.Round(time.Millisecond))
}
