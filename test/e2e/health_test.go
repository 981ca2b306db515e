//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// weightOf returns the weight ipvsadm shows for backend addr:80, or -1.
func weightOf(t *testing.T, addr string) int {
	re := regexp.MustCompile(`-> ` + regexp.QuoteMeta(addr) + `:80\s+\S+\s+(\d+)\s`)
	m := re.FindStringSubmatch(Run(t, "ipvsadm", "-Ln"))
	if m == nil {
		return -1
	}
	var w int
	fmt.Sscan(m[1], &w)
	return w
}

// TestVipdHealth: a backend that is down at start never gets traffic; a
// backend whose server dies leaves within fall x interval + timeout and no
// request fails after that; it returns after rise x interval; a flapping
// backend does not flap the IPVS table.
func TestVipdHealth(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	d := newDaemon(t)
	be := tp.BackendIPs
	const interval, timeout, rise, fall = 500 * time.Millisecond, 300 * time.Millisecond, 2, 2
	check := fmt.Sprintf("[service.check]\ntype = \"http\"\npath = \"/healthz\"\ninterval = %q\ntimeout = %q\nrise = %d\nfall = %d\njitter = 0\n",
		interval, timeout, rise, fall)
	d.write(d.header(tp.LBIf, "") + service("web", tp.VIP, 80, "scheduler = \"rr\"\n"+check, be...))

	// Cold start with be2 dead: it is programmed at weight 0 from the start.
	tp.BackendStop(t, tp.Backends[1])
	d.start()
	if !strings.Contains(d.logSince(), fmt.Sprintf("add backend tcp %s:80 -> %s:80 masq weight=0", tp.VIP, be[1])) {
		t.Errorf("a dead backend was programmed with weight on a cold start:\n%s", d.logSince())
	}
	tp.BackendStart(t, tp.Backends[1])
	start := time.Now()
	Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool { return weightOf(t, be[1]) == 1 }, "be2 never came up")
	t.Logf("be2 up %v after its server started (rise x interval = %v)", time.Since(start).Round(time.Millisecond), rise*interval)
	Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool { return weightOf(t, be[0]) == 1 }, "be1 never came up")
	checkCounts(t, tp.Hit(t, url(tp, 80), 10, false), tp.Backends, 5)

	// be2's server dies.
	tp.BackendStop(t, tp.Backends[1])
	start = time.Now()
	Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool { return weightOf(t, be[1]) == 0 }, "be2 was not quiesced")
	took := time.Since(start)
	t.Logf("be2 quiesced %v after its server died (fall x interval + timeout = %v)", took.Round(time.Millisecond), fall*interval+timeout)
	if limit := fall*interval + timeout + 5*time.Second; took > limit {
		t.Errorf("quiescing took %v, more than %v", took, limit)
	}
	h := tp.Hit(t, url(tp, 80), 20, false)
	if h.Errors != 0 || h.Counts[tp.Backends[0]] != 20 {
		t.Errorf("after the failover: %+v", h)
	}

	// It comes back.
	tp.BackendStart(t, tp.Backends[1])
	start = time.Now()
	Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool { return weightOf(t, be[1]) == 1 }, "be2 did not come back")
	t.Logf("be2 back %v after its server restarted (rise x interval = %v)", time.Since(start).Round(time.Millisecond), rise*interval)
	checkCounts(t, tp.Hit(t, url(tp, 80), 10, false), tp.Backends, 5)

	// Flapping: be2's check now answers up and down alternately, every
	// probe, so no rise or fall run ever completes: the table must not
	// move. (The flapping endpoint is served here, on the LB.)
	var n atomic.Int64
	ln, err := net.Listen("tcp", net.JoinHostPort(tp.LBIP, "9999"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})}
	go srv.Serve(ln)
	defer srv.Close()
	flap := fmt.Sprintf("{address = %q\ncheck = { type = \"http\", address = %q, port = 9999, interval = %q, timeout = %q, rise = %d, fall = %d, jitter = 0 }}",
		be[1], tp.LBIP, interval, timeout, rise, fall)
	d.write(d.header(tp.LBIf, "") + service("web", tp.VIP, 80, "scheduler = \"rr\"\n"+check, be[0], flap))
	Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool { return n.Load() >= 4 }, "the flapping check never probed")
	before, probes := strings.Count(d.logSince(), "op=update-backend"), n.Load()
	time.Sleep(20 * interval)
	changes, probes := strings.Count(d.logSince(), "op=update-backend")-before, n.Load()-probes
	t.Logf("%d alternating probe results changed the IPVS table %d times", probes, changes)
	if probes < 10 || changes > 0 {
		t.Errorf("a flapping backend (%d alternating probes) changed the table %d times", probes, changes)
	}
}

// TestVipdHealthForwardingPath: a DR check that probes the VIP through
// each backend (a policy route per mark sends marked probes to the
// backend, as IPVS forwards clients) catches a backend that lacks the VIP
// on its loopback, which a check of its own address would pass.
func TestVipdHealthForwardingPath(t *testing.T) {
	tp := NewTopo(t, "dr 2")
	d := newDaemon(t)
	be := tp.BackendIPs
	// be2 lost its VIP: clients sent to it would get no answer.
	tp.InNS(t, tp.Backends[1], "ip", "addr", "del", tp.VIP+"/32", "dev", "lo")
	Sh(t, fmt.Sprintf(`
ip rule add pref 100 lookup local
ip rule del pref 0
ip rule add pref 90 fwmark 0x101 lookup 101
ip rule add pref 91 fwmark 0x102 lookup 102
ip route add %[1]s/32 via %[2]s dev %[4]s table 101
ip route add %[1]s/32 via %[3]s dev %[4]s table 102
sysctl -qw net.ipv4.conf.%[4]s.accept_local=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.%[4]s.rp_filter=0`,
		tp.VIP, be[0], be[1], tp.LBIf))
	t.Cleanup(func() {
		ShExec(`ip rule add pref 0 lookup local; ip rule del pref 100; ip rule del pref 90; ip rule del pref 91
ip route flush table 101; ip route flush table 102`)
	})
	probe := func(addr string, mark int) string {
		return fmt.Sprintf("{address = %q\ncheck = { type = \"http\", address = %q, port = 8080, path = \"/healthz\", mark = %d, interval = \"500ms\", timeout = \"300ms\", rise = 1, fall = 1 }}",
			addr, tp.VIP, mark)
	}
	d.write(d.header(tp.LBIf, "") + service("dr", tp.VIP, 80, "scheduler = \"rr\"\nforward = \"droute\"", probe(be[0], 0x101), probe(be[1], 0x102)))
	d.start()
	Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		return weightOf(t, be[0]) == 1 && weightOf(t, be[1]) == 0
	}, "be1 should be up and be2 (no VIP on lo) down: %s", Run(t, "ipvsadm", "-Ln"))
	h := tp.Hit(t, url(tp, 80), 6, false)
	if h.Errors != 0 || h.Counts[tp.Backends[0]] != 6 {
		t.Errorf("traffic with be2 down: %+v", h)
	}
	// Its VIP back, be2 passes the same check.
	tp.InNS(t, tp.Backends[1], "ip", "addr", "add", tp.VIP+"/32", "dev", "lo")
	Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool { return weightOf(t, be[1]) == 1 }, "be2 did not come up with its VIP")
	checkCounts(t, tp.Hit(t, url(tp, 80), 6, false), tp.Backends, 3)
}
