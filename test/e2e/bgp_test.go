//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The BGP tests run two vipd nodes, lb1 and lb2, as namespaces on the LAN
// of topo_bgp. Both announce the VIP to the router (bird2 in namespace
// rtr), which installs one route with both nodes as next hops (ECMP, L4
// hashing); the client sits behind the router, the backends answer by
// direct routing.

// bgpNode is one vipd of the pair.
type bgpNode struct {
	*daemon
	name, ip string
}

// bgpNodeConfig is a node's configuration: [bgp] towards the router, and
// the one service.
func bgpNodeConfig(d *daemon, tp *Topo, ip, svcExtra, bgpExtra string) string {
	return bgpNodeConfigPeer(d, tp, ip, svcExtra, bgpExtra, "")
}

// bgpNodeConfigPeer is bgpNodeConfig with peerExtra in the router's
// [[bgp.peer]].
func bgpNodeConfigPeer(d *daemon, tp *Topo, ip, svcExtra, bgpExtra, peerExtra string) string {
	return fmt.Sprintf(`[daemon]
state_dir = %q
control_socket = %q
resync_interval = "2s"
metrics_listen = ""
on_stop = "keep"

[bgp]
asn = 65001
router_id = %q
withdraw_wait = "2s"
%s
[[bgp.peer]]
address = "10.0.3.254"
asn = 65000
hold_time = "3s"
keepalive = "1s"
%s
`, filepath.Join(d.dir, "state"), filepath.Join(d.dir, "vipd.sock"), ip, bgpExtra, peerExtra) +
		service("web", tp.VIP, 80, "forward = \"droute\"\n"+svcExtra, tp.BackendIPs...)
}

func startBGPNode(t *testing.T, tp *Topo, n int, svcExtra, bgpExtra string, more ...string) *bgpNode {
	t.Helper()
	return startBGPNodePeer(t, tp, n, svcExtra, bgpExtra, "", more...)
}

// startBGPNodePeer is startBGPNode with peerExtra in the router's
// [[bgp.peer]].
func startBGPNodePeer(t *testing.T, tp *Topo, n int, svcExtra, bgpExtra, peerExtra string, more ...string) *bgpNode {
	t.Helper()
	d := newDaemon(t)
	d.ns = fmt.Sprintf("lb%d", n)
	ip := fmt.Sprintf("10.0.3.%d", 20+n)
	d.write(bgpNodeConfigPeer(d, tp, ip, svcExtra, bgpExtra, peerExtra) + strings.Join(more, ""))
	d.start()
	return &bgpNode{daemon: d, name: d.ns, ip: ip}
}

// startRouter runs bird2 in the router namespace: a session with each
// node (hold time 3 s), and the best routes merged into multipath kernel
// routes.
func startRouter(t *testing.T, v6 bool) (birdc func(args ...string) string) {
	t.Helper()
	return startRouterBFD(t, v6, false)
}

// startRouterBFD is startRouter, with BFD (100 ms × 3 asked of the
// nodes) on the BGP sessions when bfd is set: bird drops a node's
// session, and its routes, when the node's BFD session fails.
func startRouterBFD(t *testing.T, v6, bfd bool) (birdc func(args ...string) string) {
	t.Helper()
	birdc, _ = startRouterLog(t, v6, bfd)
	return birdc
}

// startRouterLog is startRouterBFD that also returns bird's log, its
// lines stamped to the millisecond. With BFD, bird traces its BFD
// sessions' events, its BGP sessions' states and what it writes to the
// kernel: where the time from a cut to the route's change goes.
func startRouterLog(t *testing.T, v6, bfd bool) (birdc func(args ...string) string, log *lockedBuffer) {
	t.Helper()
	bird, err := exec.LookPath("bird")
	if err != nil {
		t.Fatal("bird is not in the guest: install bird2 on the host (test/deps.sh, make deps); initramfs.sh copies it")
	}
	dir := t.TempDir()
	var c strings.Builder
	c.WriteString("router id 10.0.3.254;\nlog stderr all;\ntimeformat log \"%F %T.%3f\";\nprotocol device { scan time 1; }\n")
	bfdOn, kernelDebug := "", ""
	if bfd {
		c.WriteString("protocol bfd {\n  debug { states, events };\n  interface \"eth0\" { interval 100 ms; multiplier 3; };\n}\n")
		bfdOn, kernelDebug = "  bfd on;\n  debug { states };\n", " debug { routes };"
	}
	fmt.Fprintf(&c, "protocol kernel { ipv4 { export all; }; merge paths yes;%s }\n", kernelDebug)
	if v6 {
		c.WriteString("protocol kernel { ipv6 { export all; }; merge paths yes; }\n")
		for i := 1; i <= 2; i++ {
			fmt.Fprintf(&c, `protocol bgp lb%dv6 {
  local fd00:3::fe as 65000;
  neighbor fd00:3::%d as 65001;
  direct;
  hold time 3;
  keepalive time 1;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 2;
%s  ipv6 { import all; export none; };
}
`, i, 20+i, bfdOn)
		}
	}
	for i := 1; i <= 2; i++ {
		fmt.Fprintf(&c, `protocol bgp lb%d {
  local 10.0.3.254 as 65000;
  neighbor 10.0.3.%d as 65001;
  direct;
  hold time 3;
  keepalive time 1;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 2;
%s  ipv4 { import all; export none; };
}
`, i, 20+i, bfdOn)
	}
	return runBird(t, bird, dir, c.String())
}

// runBird runs bird with config conf in the router namespace, its files
// in dir, and returns its birdc and its log.
func runBird(t *testing.T, bird, dir, conf string) (birdc func(args ...string) string, log *lockedBuffer) {
	t.Helper()
	path := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "bird.ctl")
	log = &lockedBuffer{}
	cmd := exec.Command("ip", "netns", "exec", "rtr", bird, "-f", "-c", path, "-s", sock)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("bird's (%s) log:\n%s", dir, log)
		}
	})
	return func(args ...string) string {
		r := Exec("birdc", append([]string{"-s", sock}, args...)...)
		return r.Stdout + r.Stderr
	}, log
}

// nextHops returns the next hops of the router's kernel route to vip.
func nextHops(t *testing.T, vip string) []string {
	family, bits := "-4", "/32"
	if strings.Contains(vip, ":") {
		family, bits = "-6", "/128"
	}
	out := Exec("ip", "-n", "rtr", family, "route", "show", vip+bits).Stdout
	var hops []string
	for _, m := range regexp.MustCompile(`via (\S+)`).FindAllStringSubmatch(out, -1) {
		hops = append(hops, m[1])
	}
	slices.Sort(hops)
	return hops
}

// waitHops waits until the router routes vip to exactly hops, and
// returns when it saw that.
func waitHops(t *testing.T, vip string, timeout time.Duration, hops ...string) time.Time {
	t.Helper()
	want := strings.Join(slices.Sorted(slices.Values(hops)), " ")
	Eventually(t, timeout, 10*time.Millisecond, func() bool {
		return strings.Join(nextHops(t, vip), " ") == want
	}, "the router routes %s via %v, not %q:\n%s", vip, nextHops(t, vip), want, Exec("ip", "-n", "rtr", "route").Stdout)
	return time.Now()
}

// conns returns the connections the node's IPVS service on vip:80 has
// handled.
func (n *bgpNode) conns(t *testing.T, vip string) int {
	out := Run(t, "ip", "netns", "exec", n.name, "ipvsadm", "-Ln", "--stats")
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[0] == "TCP" && f[1] == HostPort(vip, 80) {
			v, _ := strconv.Atoi(f[2])
			return v
		}
	}
	return 0
}

// spread returns the connections each node handled of the n just sent
// to vip. The kernel sums its per-CPU counters every 2 seconds (the
// estimator): it waits until they show most of the n (a new connection
// on a reused client port that IPVS still lists is not counted again),
// then one more period.
func spread(t *testing.T, vip string, n int, nodes ...*bgpNode) []int {
	t.Helper()
	c := make([]int, len(nodes))
	read := func() int {
		sum := 0
		for i, node := range nodes {
			c[i] = node.conns(t, vip)
			sum += c[i]
		}
		return sum
	}
	Eventually(t, 10*time.Second, 200*time.Millisecond, func() bool { return read() >= n*9/10 },
		"the nodes' counters do not add up to the %d connections sent to %s: %v", n, vip, c)
	time.Sleep(2500 * time.Millisecond)
	read()
	return c
}

// established counts the node's established IPVS connections.
func (n *bgpNode) established(t *testing.T) int {
	return strings.Count(Run(t, "ip", "netns", "exec", n.name, "ipvsadm", "-Lnc"), "ESTABLISHED")
}

// bgpPair builds the topology, the router and two nodes, and waits until
// the router uses both.
func bgpPair(t *testing.T, svcExtra, bgpExtra string) (*Topo, *bgpNode, *bgpNode, func(...string) string) {
	t.Helper()
	return bgpPairPeer(t, svcExtra, bgpExtra, "")
}

// bgpPairPeer is bgpPair with peerExtra in the nodes' [[bgp.peer]];
// when it turns BFD on, the router runs BFD too.
func bgpPairPeer(t *testing.T, svcExtra, bgpExtra, peerExtra string) (*Topo, *bgpNode, *bgpNode, func(...string) string) {
	t.Helper()
	tp, lb1, lb2, birdc, _ := bgpPairLog(t, svcExtra, bgpExtra, peerExtra)
	return tp, lb1, lb2, birdc
}

// bgpPairLog is bgpPairPeer that also returns the router's log.
func bgpPairLog(t *testing.T, svcExtra, bgpExtra, peerExtra string) (*Topo, *bgpNode, *bgpNode, func(...string) string, *lockedBuffer) {
	t.Helper()
	tp := NewTopo(t, "bgp 2")
	birdc, log := startRouterLog(t, false, strings.Contains(peerExtra, "bfd = true"))
	lb1 := startBGPNodePeer(t, tp, 1, svcExtra, bgpExtra, peerExtra)
	lb2 := startBGPNodePeer(t, tp, 2, svcExtra, bgpExtra, peerExtra)
	start := time.Now()
	waitHops(t, tp.VIP, 30*time.Second, lb1.ip, lb2.ip)
	t.Logf("the router uses both nodes %v after the second node was ready", time.Since(start).Round(time.Millisecond))
	return tp, lb1, lb2, birdc, log
}

// TestBGPECMP: both nodes announce the VIP, the router spreads the flows
// over them, bird's table shows the attributes, a service without a
// serving backend is withdrawn and comes back, and vipd status shows the
// session.
func TestBGPECMP(t *testing.T) {
	// fall = 2: one probe slowed past its timeout by a loaded TCG guest
	// must not take the only backends out while requests are counted.
	tp, lb1, lb2, birdc := bgpPair(t, "scheduler = \"mh\"\n[service.check]\ntype = \"http\"\npath = \"/healthz\"\ninterval = \"300ms\"\nrise = 1\nfall = 2",
		"communities = [\"65001:100\"]\nmed = 10")
	mustContain(t, "bird's route", birdc("show", "route", "all", tp.VIP+"/32"), "BGP.community: (65001,100)", "BGP.med: 10",
		"via 10.0.3.21 on eth0", "via 10.0.3.22 on eth0")
	h := tp.Hit(t, url(tp, 80), 200, false)
	if h.Errors != 0 {
		t.Fatalf("requests failed: %+v", h)
	}
	c := spread(t, tp.VIP, 200, lb1, lb2)
	c1, c2 := c[0], c[1]
	t.Logf("200 new connections: lb1 took %d, lb2 %d; backends %v", c1, c2, h.Counts)
	if c1 < 40 || c2 < 40 {
		t.Errorf("the flows do not spread over both nodes: lb1 %d, lb2 %d of 200", c1, c2)
	}
	st := Run(t, vipdBin(), "status", "--socket", filepath.Join(lb1.dir, "vipd.sock"))
	mustContain(t, "vipd status", st, "bgp: AS65001 router id 10.0.3.21, 1 VIPs announced, 0 withheld", "bgp peer 10.0.3.254 AS65000: established")

	// Every backend fails its check on lb2 alone is not possible (the
	// backends are shared): take them all down; both nodes withdraw,
	// the route goes; one comes back, the route is back on both.
	for _, be := range tp.Backends {
		tp.BackendDown(t, be)
	}
	start := time.Now()
	waitHops(t, tp.VIP, 20*time.Second)
	t.Logf("every backend down: the route gone from the router after %v", time.Since(start).Round(time.Millisecond))
	mustContain(t, "vipd status", Run(t, vipdBin(), "status", "--socket", filepath.Join(lb2.dir, "vipd.sock")),
		"bgp withheld "+tp.VIP+"/32: no backend serves")
	tp.BackendUp(t, tp.Backends[0])
	start = time.Now()
	waitHops(t, tp.VIP, 20*time.Second, lb1.ip, lb2.ip)
	t.Logf("one backend up: the route back on both nodes after %v", time.Since(start).Round(time.Millisecond))
	if h := tp.Hit(t, url(tp, 80), 20, false); h.Errors != 0 || h.Counts[tp.Backends[0]] != 20 {
		t.Errorf("after one backend came back: %+v", h)
	}
	tp.BackendUp(t, tp.Backends[1])

	// vipd drain --node withdraws the node's route; undrain restores it.
	if r := Exec(vipdBin(), "drain", "--node", "--socket", filepath.Join(lb2.dir, "vipd.sock")); r.Err != nil {
		t.Fatalf("drain --node: %s", r)
	}
	waitHops(t, tp.VIP, 10*time.Second, lb1.ip)
	if r := Exec(vipdBin(), "undrain", "--node", "--socket", filepath.Join(lb2.dir, "vipd.sock")); r.Err != nil {
		t.Fatalf("undrain --node: %s", r)
	}
	waitHops(t, tp.VIP, 10*time.Second, lb1.ip, lb2.ip)
}

// TestBGPGracefulStop: a node stopped with SIGTERM withdraws its route,
// waits, then ends its session; the router moves its flows to the other
// node: no request fails, no long-lived connection breaks (mh and sloppy
// TCP: the other node sends each flow to the same backend).
func TestBGPGracefulStop(t *testing.T) {
	tp, lb1, lb2, _ := bgpPair(t, "scheduler = \"mh\"", "")
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 10, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(2 * time.Second)
	on1, on2 := lb1.established(t), lb2.established(t)
	start := time.Now()
	stopped := make(chan time.Duration, 1)
	go func() {
		lb2.stop()
		stopped <- time.Since(start)
	}()
	gone := waitHops(t, tp.VIP, 10*time.Second, lb1.ip).Sub(start)
	took := <-stopped
	if gone > took {
		t.Errorf("the route went %v after SIGTERM, after vipd exited (%v)", gone, took)
	}
	time.Sleep(2 * time.Second)
	l.finish(t, "graceful stop of lb2")
	withdrawn := "?"
	if m := regexp.MustCompile(`time=(\S+) level=INFO msg="bgp: routes withdrawn"`).FindStringSubmatch(lb2.log.String()); m != nil {
		if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
			withdrawn = at.Sub(start).Round(time.Millisecond).String()
		}
	}
	for _, l := range strings.Split(lb2.logSince(), "\n") {
		if strings.Contains(l, "stopping") || strings.Contains(l, "bgp:") || strings.Contains(l, "msg=reconciled") {
			t.Logf("lb2: %s", l)
		}
	}
	t.Logf("graceful stop: SIGTERM at %s; vipd withdrew %s after SIGTERM, the router's route changed %v after, vipd exited after %v; established connections: %d on lb1, %d on lb2",
		start.Format("15:04:05.000"), withdrawn, gone.Round(time.Millisecond), took.Round(time.Millisecond), on1, on2)
	if on2 == 0 {
		t.Error("no connection was on lb2: the test proves nothing")
	}
}

// nodeLossResult is what nodeLoss measured.
type nodeLossResult struct {
	// took holds, for each cut, the time from the return of the netlink
	// call that cut lb1's link to the router's route update that left
	// only lb2; call, how long that call took (the cut happened during
	// it, mostly at once, later when the guest stalled in it).
	took, call []time.Duration
	// on1 is the fewest long-lived connections lb1 had at a cut.
	on1 int
	// broken counts the long-lived connections that broke, failed the
	// short requests that failed, ok the requests that succeeded.
	broken, failed, ok int
}

// nodeLoss cuts lb1's link under load until cuts cuts were measured,
// bringing it back and waiting until the router uses both nodes again
// between them, and reports how long the router kept using lb1 after
// each cut and what broke in them. The cut is a netlink call in the
// test, timed when it returns; the router's change is timed by a route
// monitor that runs from before the first cut: no process start, which
// takes tens to hundreds of milliseconds in the emulated guest, lies on
// either end.
//
// Each cut runs its own load, from 2 s before it to 5 s after (TCP
// retransmits what was lost while the router still sent to lb1). With
// BFD, a cut during which a BFD session went down that the cut did not
// take down (the guest stalled longer than the detection time: what it
// measured were the stalls, and a router that dropped both nodes broke
// connections no load balancer could keep) is void: logged with what
// broke in it and done again, up to cuts more times.
func nodeLoss(t *testing.T, cuts int, svcExtra, bgpExtra, peerExtra string) (r nodeLossResult) {
	tp, lb1, lb2, birdc, birdLog := bgpPairLog(t, svcExtra, bgpExtra, peerExtra)
	bfd := strings.Contains(peerExtra, "bfd = true")
	mon := startRouteMonitor(t, "rtr", netip.PrefixFrom(netip.MustParseAddr(tp.VIP), 32))
	vlb1, err := netlink.LinkByName("vlb1")
	if err != nil {
		t.Fatalf("lb1's port on the LAN: %v", err)
	}
	status := func() string { return Run(t, vipdBin(), "status", "--socket", filepath.Join(lb1.dir, "vipd.sock")) }
	// ready waits until the router routes the VIP via both nodes and,
	// with BFD, the router's BFD sessions with both are up and vipd
	// status on lb1 shows its own up: BFD, not the hold time, is what a
	// cut then measures.
	ready := func() {
		t.Helper()
		if bfd {
			var sessions string
			Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool {
				sessions = birdc("show", "bfd", "sessions")
				return strings.Count(sessions, " Up ") == 2
			}, "the router's BFD sessions are not up:\n%s", sessions)
		}
		waitHops(t, tp.VIP, 30*time.Second, lb1.ip, lb2.ip)
		if bfd {
			var st string
			Eventually(t, 10*time.Second, 100*time.Millisecond, func() bool {
				st = status()
				return strings.Contains(st, "bgp peer 10.0.3.254 AS65000: established") && strings.Contains(st, " routes, bfd up\n")
			}, "vipd status does not show the BFD session up:\n%s", st)
		}
	}
	ready()
	if bfd {
		mustContain(t, "vipd status", status(), "bgp peer 10.0.3.254 bfd: up for ", ", remote up, tx 100ms, rx 100ms, multiplier 3 (remote 3), detection 300ms, ")
	}
	downRE := regexp.MustCompile(`\nbgp peer 10\.0\.3\.254 AS65000: \S+.*, bfd down\nbgp peer 10\.0\.3\.254 bfd: down for \S+, .*, (\d+) downs \(last: (?:control detection time expired|neighbor signaled session down)\)`)
	// With BFD the hold timer cannot drop lb1 first; a route that does
	// not change within it means lb1 was dropped before the cut.
	wait := 20 * time.Second
	if bfd {
		wait = 5 * time.Second
	}
	r.on1 = -1
	void := 0
	for attempt := 1; len(r.took) < cuts; attempt++ {
		if void > cuts {
			t.Fatalf("%d of %d cuts were void: the guest stalls longer than BFD's detection time too often to measure", void, attempt-1)
		}
		if attempt > 1 {
			if err := netlink.LinkSetUp(vlb1); err != nil {
				t.Fatalf("set vlb1 up: %v", err)
			}
			ready()
		}
		from := time.Now()
		l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 20, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
		time.Sleep(2 * time.Second)
		n1 := lb1.established(t)
		before := time.Now()
		if err := netlink.LinkSetDown(vlb1); err != nil {
			t.Fatalf("cut %d: set vlb1 down: %v", attempt, err)
		}
		cut := time.Now()
		end, updates, changed := mon.first(before, wait, lb2.ip)
		if err := mon.err(); err != nil {
			t.Fatalf("cut %d: the monitor of the router's route to %s failed: %v", attempt, tp.VIP, err)
		}
		// Every BFD session that went down since the load started, but
		// lb1's at its cut, went down because the guest stalled.
		stalled := func() []string {
			if !bfd {
				return nil
			}
			downs := bfdDowns(birdLog.String(), from)
			if i := slices.IndexFunc(downs, func(d birdLine) bool {
				return !d.at.Before(cut.Truncate(time.Millisecond)) && strings.Contains(d.text, " "+lb1.ip+" ")
			}); i >= 0 {
				downs = slices.Delete(downs, i, i+1)
			}
			var s []string
			for _, d := range downs {
				s = append(s, d.String())
			}
			return s
		}
		stalls := stalled()
		if !changed && len(stalls) == 0 {
			t.Fatalf("cut %d: %v after it the router's route to %s was not updated to via %s only; its updates: %v; its table: %v",
				attempt, wait, tp.VIP, lb2.ip, updates, nextHops(t, tp.VIP))
		}
		where := ""
		if changed && len(stalls) == 0 {
			if hops := nextHops(t, tp.VIP); !slices.Equal(hops, []string{lb2.ip}) {
				t.Errorf("cut %d: the route update said via %s only, the router's table says via %v", attempt, lb2.ip, hops)
			}
			if bfd {
				// BFD, not the hold timer, ended the session with lb1.
				if out := birdc("show", "protocols", "all", "lb1"); !strings.Contains(out, "BFD session down") {
					t.Errorf("cut %d: the router did not end its session with lb1 for BFD:\n%s", attempt, out)
				}
				where = "; " + birdTimes(birdLog.String(), cut, lb1.ip, tp.VIP)
				// lb1 saw the silence: vipd status shows its BFD
				// session down once more.
				var st string
				Eventually(t, 10*time.Second, 100*time.Millisecond, func() bool {
					st = status()
					m := downRE.FindStringSubmatch(st)
					if m == nil {
						return false
					}
					n, _ := strconv.Atoi(m[1])
					return n >= len(r.took)+1
				}, "cut %d: vipd status on lb1 does not show its BFD session down (%d downs at least):\n%s", attempt, len(r.took)+1, st)
			}
		}
		time.Sleep(5 * time.Second)
		close(l.stop)
		l.wg.Wait()
		stalls = stalled()
		l.mu.Lock()
		lb, sf, n := len(l.longErrs), len(l.shortErr), l.longOK+l.shortOK
		for _, e := range l.longErrs {
			t.Logf("cut %d: long-lived: %s", attempt, e)
		}
		l.mu.Unlock()
		if len(stalls) > 0 {
			void++
			t.Logf("cut %d at %s is void: BFD sessions went down without a cut (the guest stalled): %s; the route's updates: %v; in its load %d long-lived connections broke, %d short requests failed, %d succeeded",
				attempt, cut.Format("15:04:05.000"), strings.Join(stalls, "; "), updates, lb, sf, n)
			// Which side missed the other's packets first.
			for _, l := range birdLines(birdLog.String(), from, "bfd1: Session to ") {
				t.Logf("cut %d: router: %s", attempt, l)
			}
			for _, node := range []*bgpNode{lb1, lb2} {
				for _, l := range strings.Split(node.logSince(), "\n") {
					stamp, _, _ := strings.Cut(l, " ")
					at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(stamp, "time="))
					if err == nil && !at.Before(from) && strings.Contains(l, "bfd: session state") {
						t.Logf("cut %d: %s: %s", attempt, node.name, l)
					}
				}
			}
			continue
		}
		r.took, r.call = append(r.took, end.at.Sub(cut)), append(r.call, cut.Sub(before))
		if r.on1 < 0 || n1 < r.on1 {
			r.on1 = n1
		}
		r.broken, r.failed, r.ok = r.broken+lb, r.failed+sf, r.ok+n
		t.Logf("cut %d at %s: the router routed the VIP via lb2 only %v after it (the netlink call took %v)%s; the route's updates: %v; %d long-lived connections were on lb1, %d broke; %d short requests failed, %d succeeded",
			attempt, cut.Format("15:04:05.000"), r.took[len(r.took)-1].Round(time.Millisecond), cut.Sub(before).Round(time.Microsecond), where, updates, n1, lb, sf, n)
	}
	return r
}

// birdLine is a line of bird's log and its time stamp.
type birdLine struct {
	at   time.Time
	text string
}

func (l birdLine) String() string { return l.at.Format("15:04:05.000") + " " + l.text }

// birdLines returns the lines of bird's log stamped at or after from
// (to the millisecond) that contain match.
func birdLines(log string, from time.Time, match string) []birdLine {
	var out []birdLine
	from = from.Truncate(time.Millisecond)
	for _, l := range strings.Split(log, "\n") {
		f := strings.SplitN(strings.TrimSpace(l), " ", 3)
		if len(f) < 3 || !strings.Contains(l, match) {
			continue
		}
		at, err := time.ParseInLocation("2006-01-02 15:04:05.000", f[0]+" "+f[1], time.Local)
		if err != nil || at.Before(from) {
			continue
		}
		out = append(out, birdLine{at, f[2]})
	}
	return out
}

// bfdDowns returns the lines of bird's log from from on in which one of
// its BFD sessions went down.
func bfdDowns(log string, from time.Time) []birdLine {
	return birdLines(log, from, " changed state from Up to Down")
}

// birdTimes finds in bird's log, after cut, when bird's BFD session
// with node expired, when it stopped its BGP session with node, and when
// it wrote its new route to vip to the kernel, and says each as the time
// since cut (bird stamps its lines to the millisecond).
func birdTimes(log string, cut time.Time, node, vip string) string {
	steps := []struct{ what, match string }{
		{"bird's BFD session expired", "bfd1: Session to " + node + " expired"},
		{"its BGP session stopped", "lb1: State changed to stop"},
		{"its route went to the kernel", "kernel1.ipv4 < replaced " + vip + "/32 "},
	}
	var out []string
	for _, s := range steps {
		found := "not in its log"
		if l := birdLines(log, cut, s.match); len(l) > 0 {
			found = "+" + l[0].at.Sub(cut).Round(time.Millisecond).String()
		}
		out = append(out, s.what+" "+found)
	}
	return strings.Join(out, ", ")
}

// routeMonitor records the updates of one of a namespace's kernel
// routes, each stamped when the test received it from its netlink
// subscription.
type routeMonitor struct {
	prefix netip.Prefix
	seen   chan struct{} // a value after each update
	mu     sync.Mutex
	events []routeEvent
	errs   []error
}

// routeEvent is one update of the monitored route.
type routeEvent struct {
	at      time.Time
	deleted bool
	hops    []string // its next hops, sorted
}

func (e routeEvent) String() string {
	if e.deleted {
		return e.at.Format("15:04:05.000") + " deleted"
	}
	return e.at.Format("15:04:05.000") + " via " + strings.Join(e.hops, " ")
}

// startRouteMonitor subscribes to the route updates of namespace ns and
// records those of prefix until the test ends.
func startRouteMonitor(t *testing.T, ns string, prefix netip.Prefix) *routeMonitor {
	t.Helper()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatalf("namespace %s: %v", ns, err)
	}
	defer h.Close()
	m := &routeMonitor{prefix: prefix, seen: make(chan struct{}, 1)}
	ch := make(chan netlink.RouteUpdate, 64)
	done := make(chan struct{})
	var closing atomic.Bool
	err = netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{
		Namespace:         &h,
		ReceiveBufferSize: 1 << 20,
		ErrorCallback: func(err error) {
			if !closing.Load() {
				m.mu.Lock()
				m.errs = append(m.errs, err)
				m.mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatalf("subscribe to the routes of namespace %s: %v", ns, err)
	}
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for u := range ch {
			at := time.Now()
			if u.Dst == nil {
				continue
			}
			addr, ok := netip.AddrFromSlice(u.Dst.IP)
			bits, _ := u.Dst.Mask.Size()
			if !ok || netip.PrefixFrom(addr.Unmap(), bits) != prefix {
				continue
			}
			e := routeEvent{at: at, deleted: u.Type == unix.RTM_DELROUTE}
			for _, nh := range u.MultiPath {
				e.hops = append(e.hops, nh.Gw.String())
			}
			if len(u.MultiPath) == 0 && u.Gw != nil {
				e.hops = append(e.hops, u.Gw.String())
			}
			slices.Sort(e.hops)
			m.mu.Lock()
			m.events = append(m.events, e)
			m.mu.Unlock()
			select {
			case m.seen <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		closing.Store(true)
		close(done)
		<-finished
	})
	return m
}

// err returns what went wrong with the subscription: updates may be
// missing.
func (m *routeMonitor) err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return errors.Join(m.errs...)
}

// first waits until an update at or after from routes the prefix via
// exactly hops, and returns it and every update from from until then;
// after timeout, it returns the updates from from and false.
func (m *routeMonitor) first(from time.Time, timeout time.Duration, hops ...string) (routeEvent, []routeEvent, bool) {
	want := slices.Sorted(slices.Values(hops))
	expire := time.NewTimer(timeout)
	defer expire.Stop()
	for {
		m.mu.Lock()
		var since []routeEvent
		for _, e := range m.events {
			if !e.at.Before(from) {
				since = append(since, e)
			}
		}
		m.mu.Unlock()
		for i, e := range since {
			if !e.deleted && slices.Equal(e.hops, want) {
				return e, since[:i+1], true
			}
		}
		select {
		case <-m.seen:
		case <-expire.C:
			return routeEvent{}, since, false
		}
	}
}

// TestBGPNodeLoss: lb1 loses its link (a dead node: no withdrawal, no
// end of session). The router stops using it when its hold timer (3 s)
// expires; with mh and sloppy TCP the long-lived connections that were on
// lb1 continue on lb2.
func TestBGPNodeLoss(t *testing.T) {
	r := nodeLoss(t, 1, "scheduler = \"mh\"", "sloppy = true", "")
	t.Logf("mh, sloppy TCP: the router stopped using lb1 %v after its link was cut; %d long-lived connections were on lb1, %d broke; %d short requests failed, %d requests succeeded",
		r.took[0].Round(time.Millisecond), r.on1, r.broken, r.failed, r.ok)
	if r.broken != 0 {
		t.Errorf("%d long-lived connections broke with mh and sloppy TCP", r.broken)
	}
	if r.on1 == 0 {
		t.Error("no long-lived connection was on lb1: the test proves nothing")
	}
}

// TestBGPNodeLossBFD: the same loss (the router's port keeps its
// carrier), five times, with BFD between the nodes and the router
// (100 ms × 3; bird asks for 100 ms): the router drops lb1 when its BFD
// session fails, not at the hold time, within the goal of 1 s
// of the cut (it measured 38–297 ms, p50 249 ms, in 45 cuts, 322 ms at
// most counted from the start of the netlink call: bird's BFD session
// expires 300 ms after the last packet it received, up to an interval
// before the cut; its route reaches the kernel 0–12 ms later, the test
// 1–52 ms after that). With mh and sloppy TCP no long-lived connection
// breaks.
func TestBGPNodeLossBFD(t *testing.T) {
	const cuts = 5
	r := nodeLoss(t, cuts, "scheduler = \"mh\"", "sloppy = true", "bfd = true\nbfd_interval = \"100ms\"\nbfd_multiplier = 3")
	p50, highest := medianMax(r.took)
	var each []string
	for _, d := range r.took {
		each = append(each, d.Round(time.Millisecond).String())
	}
	t.Logf("BFD 100ms x 3, mh, sloppy TCP: the router stopped using lb1 after its link was cut: n=%d, %s, p50 %v, max %v; at least %d long-lived connections were on lb1 at each cut, %d broke; %d short requests failed, %d requests succeeded",
		len(r.took), strings.Join(each, " "), p50.Round(time.Millisecond), highest.Round(time.Millisecond), r.on1, r.broken, r.failed, r.ok)
	// BFD, not the hold timer, took lb1 out (nodeLoss checks bird's
	// reason), within the goal, counted from the start of the netlink
	// call: more than three times the slowest cut measured, which a
	// stall that did not take a BFD session down (nodeLoss voids the
	// cuts those did) does not reach.
	for i, d := range r.took {
		if d+r.call[i] >= time.Second {
			t.Errorf("cut %d: the router stopped using lb1 %v after the cut (%v after the call to cut began), want less than 1 s",
				i+1, d.Round(time.Millisecond), (d + r.call[i]).Round(time.Millisecond))
		}
	}
	if r.broken != 0 {
		t.Errorf("%d long-lived connections broke with mh and sloppy TCP", r.broken)
	}
	if r.on1 == 0 {
		t.Error("no long-lived connection was on lb1 at a cut: the test proves nothing")
	}
}

// medianMax returns the median and the largest of d.
func medianMax(d []time.Duration) (p50, highest time.Duration) {
	s := slices.Sorted(slices.Values(d))
	if len(s) == 0 {
		return 0, 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2], s[len(s)-1]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, s[len(s)-1]
}

// TestBGPNodeLossWithoutSloppy: the same loss with wlc (the other node's
// choice of backend differs) and without sloppy TCP (the other node drops
// a mid-stream packet it does not know): the connections that were on
// lb1 break. Reported, not asserted beyond that some broke.
func TestBGPNodeLossWithoutSloppy(t *testing.T) {
	r := nodeLoss(t, 1, "scheduler = \"wlc\"", "sloppy = false", "")
	t.Logf("wlc, no sloppy TCP: the router stopped using lb1 %v after its link was cut; %d long-lived connections were on lb1, %d broke; %d short requests failed, %d requests succeeded",
		r.took[0].Round(time.Millisecond), r.on1, r.broken, r.failed, r.ok)
	if r.on1 > 0 && r.broken == 0 {
		t.Errorf("no connection broke without sloppy TCP although %d were on lb1", r.on1)
	}
}

// TestBGPKill: vipd killed with SIGKILL: the kernel closes its session at
// once, the router withdraws the route; the node's IPVS (on_stop = keep
// or not, the kernel's tables outlive vipd) keeps serving what still
// reaches it. No request fails.
func TestBGPKill(t *testing.T) {
	tp, lb1, _, _ := bgpPair(t, "scheduler = \"mh\"", "")
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 10, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})
	time.Sleep(2 * time.Second)
	start := time.Now()
	lb1.kill()
	took := waitHops(t, tp.VIP, 20*time.Second, "10.0.3.22").Sub(start)
	time.Sleep(2 * time.Second)
	l.finish(t, "kill -9 of lb1")
	t.Logf("kill -9 of lb1: the router stopped using it after %v", took.Round(time.Millisecond))
}

// TestBGPIPv6: the nodes announce an IPv6 VIP over IPv6 sessions (beside
// the IPv4 ones) with their own addresses as next hops; the router
// spreads the flows over both.
func TestBGPIPv6(t *testing.T) {
	tp := NewTopo(t, "bgp 2")
	birdc := startRouter(t, true)
	var nodes []*bgpNode
	for n := 1; n <= 2; n++ {
		peer6 := "[[bgp.peer]]\naddress = \"fd00:3::fe\"\nasn = 65000\nhold_time = \"3s\"\nkeepalive = \"1s\"\n"
		web6 := service("web6", tp.VIP6, 80, "scheduler = \"mh\"\nforward = \"droute\"", tp.BackendIP6...)
		nodes = append(nodes, startBGPNode(t, tp, n, "scheduler = \"mh\"", peer6, web6))
	}
	waitHops(t, tp.VIP, 30*time.Second, nodes[0].ip, nodes[1].ip)
	waitHops(t, tp.VIP6, 30*time.Second, "fd00:3::21", "fd00:3::22")
	mustContain(t, "bird's route", birdc("show", "route", "all", tp.VIP6+"/128"), "via fd00:3::21 on eth0", "via fd00:3::22 on eth0",
		"BGP.next_hop: fd00:3::21")
	h := tp.Hit(t, HTTPURL(tp.VIP6, 80, "/"), 100, false)
	if h.Errors != 0 {
		t.Fatalf("requests to the IPv6 VIP failed: %+v", h)
	}
	c := spread(t, tp.VIP6, 100, nodes...)
	t.Logf("100 new IPv6 connections: lb1 took %d, lb2 %d", c[0], c[1])
	if c[0] < 20 || c[1] < 20 {
		t.Errorf("the IPv6 flows do not spread over both nodes: lb1 %d, lb2 %d of 100", c[0], c[1])
	}
	// A graceful stop withdraws the IPv6 route too.
	nodes[1].stop()
	waitHops(t, tp.VIP6, 10*time.Second, "fd00:3::21")
}

// twoRouterConf is the config of one of TestBGPTwoRouters' routers: router
// id and address addr, AS asn, a session with lb1 (bound to addr, so
// that two birds share the router namespace), sending the n static
// routes prefix(i) and taking what lb1 sends.
func twoRouterConf(addr string, asn, n int, prefix func(int) string) string {
	var c strings.Builder
	fmt.Fprintf(&c, "router id %s;\nlog stderr all;\nprotocol device { scan time 1; }\nprotocol static own {\n  ipv4;\n", addr)
	for i := range n {
		fmt.Fprintf(&c, "  route %s blackhole;\n", prefix(i))
	}
	fmt.Fprintf(&c, `}
protocol bgp lb1 {
  local %s as %d;
  neighbor 10.0.3.21 as 65001;
  strict bind yes;
  direct;
  hold time 3;
  keepalive time 1;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 2;
  ipv4 { import all; export where proto = "own"; };
}
`, addr, asn)
	return c.String()
}

// fromLB1 returns the prefixes a router has from lb1.
func fromLB1(birdc func(...string) string) []string {
	var ps []string
	for _, l := range strings.Split(birdc("show", "route", "protocol", "lb1"), "\n") {
		if f := strings.Fields(l); len(f) > 0 && l[0] != ' ' && l[0] != '\t' && strings.Contains(f[0], "/") {
			ps = append(ps, f[0])
		}
	}
	slices.Sort(ps)
	return ps
}

// TestBGPTwoRouters: one node between two eBGP routers of different ASes
// (a top-of-rack pair), A (AS 65000) sending 999 routes, B (AS 65002)
// 10. Each router learns the VIP from vipd and nothing of the other's
// routes: vipd is no transit path. Then A sends 1,001, past the default
// max_prefixes (1000): vipd cuts A's session with a Cease and logs it;
// B keeps its session and the VIP.
func TestBGPTwoRouters(t *testing.T) {
	tp := NewTopo(t, "bgp 2")
	bird, err := exec.LookPath("bird")
	if err != nil {
		t.Fatal("bird is not in the guest: install bird2 on the host (test/deps.sh, make deps); initramfs.sh copies it")
	}
	Run(t, "ip", "-n", "rtr", "addr", "add", "10.0.3.253/24", "dev", "eth0")
	aPrefix := func(i int) string { return fmt.Sprintf("100.%d.%d.0/24", 64+i/256, i%256) }
	aDir := t.TempDir()
	birdA, logA := runBird(t, bird, aDir, twoRouterConf("10.0.3.254", 65000, 999, aPrefix))
	birdB, logB := runBird(t, bird, t.TempDir(), twoRouterConf("10.0.3.253", 65002, 10, func(i int) string { return fmt.Sprintf("172.16.%d.0/24", i) }))
	lb1 := startBGPNode(t, tp, 1, "", "[[bgp.peer]]\naddress = \"10.0.3.253\"\nasn = 65002\nhold_time = \"3s\"\nkeepalive = \"1s\"\n")
	vip := tp.VIP + "/32"
	for _, r := range []struct {
		name  string
		birdc func(...string) string
	}{{"A", birdA}, {"B", birdB}} {
		Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool { return slices.Contains(fromLB1(r.birdc), vip) },
			"router %s has no route to %s from lb1:\n%s", r.name, vip, r.birdc("show", "protocols", "all", "lb1"))
	}
	exported := regexp.MustCompile(`(\d+) exported`)
	Eventually(t, 10*time.Second, 100*time.Millisecond, func() bool {
		m := exported.FindStringSubmatch(birdA("show", "protocols", "all", "lb1"))
		return m != nil && m[1] == "999"
	}, "router A did not send its 999 routes:\n%s", birdA("show", "protocols", "all", "lb1"))
	// What lb1 would pass on has had the time to arrive.
	time.Sleep(2 * time.Second)
	for _, r := range []struct {
		name  string
		birdc func(...string) string
	}{{"A", birdA}, {"B", birdB}} {
		if got := fromLB1(r.birdc); !slices.Equal(got, []string{vip}) {
			t.Errorf("router %s learned %d routes from lb1, want only %s: %.300q", r.name, len(got), vip, got)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("A sent 999 routes, B 10: each learned from lb1 only %s", vip)

	// A sends 1,001: past max_prefixes, lb1 cuts the session.
	if err := os.WriteFile(filepath.Join(aDir, "bird.conf"), []byte(twoRouterConf("10.0.3.254", 65000, 1001, aPrefix)), 0o644); err != nil {
		t.Fatal(err)
	}
	mustContain(t, "birdc configure", birdA("configure"), "Reconfigured")
	start := time.Now()
	Eventually(t, 10*time.Second, 100*time.Millisecond, func() bool {
		return strings.Contains(logA.String(), "lb1: Received: Maximum number of prefixes reached")
	}, "router A's session was not cut:\n%s", birdA("show", "protocols", "all", "lb1"))
	lb1.waitLog(`msg="bgp: peer sent more routes than max_prefixes; session closed" peer=10.0.3.254 asn=65000 max_prefixes=1000`)
	t.Logf("A sent 1001 routes: lb1 cut its session after %v", time.Since(start).Round(time.Millisecond))
	if up := birdB("show", "protocols", "lb1"); !strings.Contains(up, "Established") || strings.Contains(logB.String(), "Received:") {
		t.Errorf("router B's session suffered:\n%s\n%s", up, logB)
	}
	if got := fromLB1(birdB); !slices.Equal(got, []string{vip}) {
		t.Errorf("router B has %q from lb1 after A's cut, want only %s", got, vip)
	}
}
