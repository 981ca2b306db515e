//go:build e2e

package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// tcpFlagCounts returns how many packets from src to port 80 the INPUT
// rules of namespace ns counted with SYN alone and with ACK alone (the
// last packet of a handshake), as installed by countHandshakes.
func tcpFlagCounts(t *testing.T, tp *Topo, ns string) (syn, ack int) {
	t.Helper()
	out := tp.InNS(t, ns, "iptables", "-w", "-nvxL", "INPUT")
	// "pkts bytes [target] prot ...": the rules have no target, and
	// iptables-nft prints the protocol by number.
	found := 0
	for _, m := range regexp.MustCompile(`(?m)^\s*(\d+)\s+\d+\s+(?:\S+\s+)?(?:tcp|6)\s.*/\* vipd-e2e-(syn|ack) \*/`).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		if m[2] == "syn" {
			syn = n
		} else {
			ack = n
		}
		found++
	}
	if found != 2 {
		t.Fatalf("the counting rules are not in %s's INPUT chain:\n%s", ns, out)
	}
	return syn, ack
}

// countHandshakes counts, in namespace ns, the SYNs from src to port 80
// and the bare ACKs that would complete a handshake.
func countHandshakes(t *testing.T, tp *Topo, ns, src string) {
	t.Helper()
	for _, r := range []struct{ flags, name string }{{"SYN", "syn"}, {"ACK", "ack"}} {
		tp.InNS(t, ns, "iptables", "-w", "-I", "INPUT", "-s", src, "-p", "tcp", "--dport", "80",
			"--tcp-flags", "SYN,ACK,RST,FIN", r.flags, "-m", "comment", "--comment", "vipd-e2e-"+r.name)
	}
}

// TestVipdHealthHalfOpen: a half-open tcp check (half_open = true) keeps
// serving backends up while completing no handshake with them (SYNs
// arrive, no ACK ever follows: the backend accepts nothing), takes a
// backend whose server died out within fall x interval + timeout, no
// request failing after that, and puts it back when its server returns.
func TestVipdHealthHalfOpen(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	d := newDaemon(t)
	be := tp.BackendIPs
	const interval, timeout, rise, fall = 300 * time.Millisecond, 200 * time.Millisecond, 2, 2
	check := fmt.Sprintf("[service.check]\ntype = \"tcp\"\nhalf_open = true\ninterval = %q\ntimeout = %q\nrise = %d\nfall = %d\njitter = 0\n",
		interval, timeout, rise, fall)
	d.write(d.header(tp.LBIf, "") + service("web", tp.VIP, 80, "scheduler = \"rr\"\n"+check, be...))
	// The checker's packets come from the LB's address on the backends'
	// bridge (topo.sh: 10.0.2.1); the clients' keep their own address.
	countHandshakes(t, tp, tp.Backends[0], "10.0.2.1")
	d.start()
	Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool { return weightOf(t, be[0]) == 1 && weightOf(t, be[1]) == 1 },
		"the backends never came up")
	checkCounts(t, tp.Hit(t, url(tp, 80), 10, false), tp.Backends, 5)
	syn0, _ := tcpFlagCounts(t, tp, tp.Backends[0])
	time.Sleep(10 * interval)
	syn, ack := tcpFlagCounts(t, tp, tp.Backends[0])
	t.Logf("be1 got %d SYNs from the checker in %v and %d handshake ACKs", syn-syn0, 10*interval, ack)
	if syn-syn0 < 5 {
		t.Errorf("be1 got %d probes in %v, want about 10", syn-syn0, 10*interval)
	}
	if ack != 0 {
		t.Errorf("the half-open checker completed %d handshakes with be1", ack)
	}

	// be2's server dies: its port answers with a reset.
	tp.BackendStop(t, tp.Backends[1])
	start := time.Now()
	Eventually(t, 30*time.Second, 20*time.Millisecond, func() bool { return weightOf(t, be[1]) == 0 }, "be2 was not quiesced")
	took := time.Since(start)
	t.Logf("be2 quiesced %v after its server died (fall x interval = %v)", took.Round(time.Millisecond), fall*interval)
	if limit := fall*interval + timeout + 5*time.Second; took > limit {
		t.Errorf("quiescing took %v, more than %v", took, limit)
	}
	h := tp.Hit(t, url(tp, 80), 20, false)
	if h.Errors != 0 || h.Counts[tp.Backends[0]] != 20 {
		t.Errorf("after be2 left: %+v", h)
	}
	tp.BackendStart(t, tp.Backends[1])
	start = time.Now()
	Eventually(t, 30*time.Second, 20*time.Millisecond, func() bool { return weightOf(t, be[1]) == 1 }, "be2 did not come back")
	t.Logf("be2 back %v after its server restarted (rise x interval = %v)", time.Since(start).Round(time.Millisecond), rise*interval)
	checkCounts(t, tp.Hit(t, url(tp, 80), 10, false), tp.Backends, 5)
}
