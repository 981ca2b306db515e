//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// returnsResult is what a series of failovers and returns cost the
// clients, under one load that runs through the whole series.
type returnsResult struct {
	// Done counts the cycles made (cut, takeover, return).
	Done int
	// Failed counts the short requests that failed and were sent while
	// the backup took over (from inFlight before the cut until the
	// client's neighbour entry moved, and 200 ms more); FailedBack the
	// others: sent while the backup served, or as the master came back,
	// or after.
	Failed, FailedBack int
	// Unsynced counts the failed requests of FailedBack's kind whose
	// connection the returning master cannot have had (see
	// unsynchronized); they are not in FailedBack.
	Unsynced int
	// PerCycle is FailedBack per cycle.
	PerCycle []int
	// Back holds the times from each return (links up) to the client's
	// neighbour entry naming the master again.
	Back            []time.Duration
	Broken          int
	Short, Long     int
	Errors, Broken1 []string
	// slowLog is the returning master's high-availability log over its
	// slowest return, slowest.
	slowLog []string
	slowest time.Duration
	// Diag holds, for each failed request, the nodes' connection tables
	// as it failed and its handshake's packets on every link.
	Diag []string
	// Slow and SlowBack count the short requests answered after 900 ms or
	// more (a lost SYN costs the client 1 s), as Failed and FailedBack
	// count the failed ones; SlowDiag holds the packets of the first few
	// slow ones of SlowBack.
	Slow, SlowBack int
	SlowDiag       []string
}

// handshakeTrace records the TCP handshakes to and from port 80 on every
// link of the topology (tcpdump on the root namespace's ends of the
// veths): SYN, SYN-ACK and RST packets; and every ARP packet, to show
// whom each end of a failed handshake believed the VIP and the SNAT
// address to be at.
type handshakeTrace struct {
	mu      sync.Mutex
	packets []tracedPacket
}

type tracedPacket struct {
	at   time.Time
	line string
}

func startHandshakeTrace(t *testing.T) *handshakeTrace {
	t.Helper()
	h := &handshakeTrace{}
	startTcpdump(t, "", []string{"-e", "-i", "any", "arp or (tcp port 80 and tcp[tcpflags] & (tcp-syn|tcp-rst) != 0)"}, func(at time.Time, line string) {
		h.mu.Lock()
		h.packets = append(h.packets, tracedPacket{at, at.UTC().Format("15:04:05.000000") + " " + line})
		h.mu.Unlock()
	})
	return h
}

// request returns the packets of the connection from client port port
// sent at sent (those from then until 6 s later: a client port may serve
// again later), and the ARP packets from 1 s before the first of them to
// 200 ms after it, as each entered the bridge.
func (h *handshakeTrace) request(port int, sent time.Time) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	from, to := sent.Add(-10*time.Millisecond), sent.Add(6*time.Second)
	mine := func(p tracedPacket) bool {
		return !p.at.Before(from) && p.at.Before(to) &&
			(strings.Contains(p.line, fmt.Sprintf(".%d > ", port)) || strings.Contains(p.line, fmt.Sprintf(".%d: ", port)))
	}
	var first time.Time
	for _, p := range h.packets {
		if mine(p) {
			first = p.at
			break
		}
	}
	var out []string
	for _, p := range h.packets {
		if mine(p) || arpIn(p.line) && !p.at.Before(first.Add(-time.Second)) && !p.at.After(first.Add(200*time.Millisecond)) {
			out = append(out, p.line)
		}
	}
	return out
}

// synAckVia returns the times at which vip's SYN-ACKs to client ports
// left node veth (as the bridge received them), by client port.
func (h *handshakeTrace) synAckVia(veth, vip string) map[int][]time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[int][]time.Time{}
	for _, p := range h.packets {
		f := strings.Fields(p.line)
		if len(f) < 4 || f[2] != veth || f[3] != "P" {
			continue
		}
		_, after, ok := strings.Cut(p.line, " "+vip+".80 > ")
		if !ok {
			continue
		}
		dst, _, ok := strings.Cut(after, ": Flags [S.]")
		if !ok || strings.Contains(dst, " ") {
			continue
		}
		port, err := strconv.Atoi(dst[strings.LastIndex(dst, ".")+1:])
		if err == nil {
			out[port] = append(out[port], p.at)
		}
	}
	return out
}

// arpIn reports whether a traced line is an ARP packet as it entered the
// bridge (once each: not its copies out of the other ports, nor the
// bridge's own, brlan in the pair topology of test/vm/topo.sh).
func arpIn(line string) bool {
	f := strings.Fields(line)
	return strings.Contains(line, "ARP") && len(f) > 3 && f[2] != "brlan" && f[3] != "Out"
}

// connTables returns what each node's IPVS connection table and
// conntrack hold for client port port.
func (p *pair) connTables(port int) string {
	var b strings.Builder
	for _, n := range p.nodes {
		for _, argv := range [][]string{{"ipvsadm", "-Lnc"}, {"conntrack", "-L", "-p", "tcp"}} {
			res := Exec("ip", append([]string{"netns", "exec", n.name}, argv...)...)
			fmt.Fprintf(&b, "%s %s:\n", n.name, strings.Join(argv, " "))
			for _, l := range strings.Split(res.Stdout, "\n") {
				if strings.Contains(l, fmt.Sprintf(":%d ", port)) || strings.Contains(l, fmt.Sprintf("=%d ", port)) {
					b.WriteString(l + "\n")
				}
			}
			if res.Err != nil {
				fmt.Fprintf(&b, "(%v: %s)\n", res.Err, strings.TrimSpace(res.Stderr))
			}
		}
	}
	return b.String()
}

// haLogWindow returns the lines of d's log stamped from from to to.
func haLogWindow(d *daemon, from, to time.Time) []string {
	var out []string
	for _, line := range strings.Split(d.logSince(), "\n") {
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err == nil && !at.Before(from) && !at.After(to) {
			out = append(out, line)
		}
	}
	return out
}

const (
	// inFlight is how long before a cut a request counts as the
	// takeover's: a request in the emulated guest takes a few
	// milliseconds, and the message that synchronizes its connection
	// leaves with the next connection's (agent/ha.go syncMaxLen), which
	// the load opens 25 ms later on average (two workers, one request
	// every 50 ms each).
	inFlight = 100 * time.Millisecond
	// served is how long the master serves after each return. A
	// client's SYN that reaches the backup as the addresses move back
	// (the client and the backend learn the new owner at moments that
	// differ) is answered to the master, which drops the answer; the
	// client sends the SYN again 1 s later (TCP's initial
	// retransmission timeout), and the master answers that. With 1 s
	// here, that second SYN met the next cut, and the third (3 s) the
	// cut after it, and the request failed: a rhythm no real failure
	// keeps.
	served = 1500 * time.Millisecond
)

// returns cuts the master's links n times under one load, each time
// waiting for the backup to take over, then bringing the master back and
// waiting for it to take the VIP back; it returns what that cost. The
// pair's master stays p.nodes[0] (it has the higher priority). It fails
// the test when a cycle does not complete.
func (p *pair) returns(n int, serving time.Duration) returnsResult {
	t, tp := p.t, p.tp
	t.Helper()
	master, backup := p.nodes[p.master], p.nodes[1-p.master]
	var r returnsResult
	const long = 10
	// The handshakes on every link, and the nodes' tables as a request
	// fails, to find where a lost request's packets went.
	trace := startHandshakeTrace(t)
	var diagMu sync.Mutex
	var dumping sync.WaitGroup
	onFail := func(port int, err error) {
		dumping.Add(1)
		go func() {
			defer dumping.Done()
			dump := p.connTables(port)
			diagMu.Lock()
			defer diagMu.Unlock()
			r.Diag = append(r.Diag, fmt.Sprintf("-- client port %d failed (%v); the nodes' tables then:\n%s", port, err, dump))
		}()
	}
	type slowRequest struct {
		port int
		sent time.Time
		took time.Duration
	}
	var slow []slowRequest
	onSlow := func(port int, sent time.Time, took time.Duration) {
		diagMu.Lock()
		defer diagMu.Unlock()
		slow = append(slow, slowRequest{port, sent, took})
	}
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: long, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond,
		OnShortFail: onFail, OnShortSlow: onSlow, SlowAfter: 900 * time.Millisecond})
	if p.o.Sync {
		p.waitSynced(backup, long)
	}
	bmac, mmac := macOf(t, backup.name), macOf(t, master.name)
	// takeover holds the windows [cut, moved+200ms) of the cycles.
	type window struct{ from, to time.Time }
	var takeovers []window
	// returned holds when the client's neighbour entry named the master
	// again, cycle by cycle.
	var returned []time.Time
	for i := 0; i < n; i++ {
		cut := time.Now()
		p.cut(master, true)
		var moved time.Time
		if !within(10*time.Second, func() bool {
			moved = p.mon.movedAt(tp.VIP, bmac, cut)
			return !moved.IsZero()
		}) {
			l.end()
			t.Fatalf("%s: cycle %d: the client never resolved the VIP to the backup %s within 10s", p.o, i+1, backup.name)
		}
		// A request sent shortly before the cut is in flight when the
		// links go, its connection perhaps not yet synchronized: it is
		// the takeover's, as in checkFailover.
		takeovers = append(takeovers, window{cut.Add(-inFlight), moved.Add(200 * time.Millisecond)})
		time.Sleep(serving)
		back := time.Now()
		p.cut(master, false)
		var movedBack time.Time
		if !within(10*time.Second, func() bool {
			movedBack = p.mon.movedAt(tp.VIP, mmac, back)
			return !movedBack.IsZero()
		}) {
			l.end()
			t.Fatalf("%s: cycle %d: the client never resolved the VIP to %s again within 10s after it came back", p.o, i+1, master.name)
		}
		r.Back = append(r.Back, movedBack.Sub(back))
		returned = append(returned, movedBack)
		if d := movedBack.Sub(back); master.vipd != nil && d > r.slowest {
			// What the returning master did meanwhile, for the
			// slowest return: why it took that long.
			r.slowest = d
			r.slowLog = append(haLogWindow(master.vipd, back.Add(-100*time.Millisecond), movedBack.Add(time.Second)), "-- "+backup.name+":")
			r.slowLog = append(r.slowLog, haLogWindow(backup.vipd, back.Add(-100*time.Millisecond), movedBack.Add(time.Second))...)
			r.slowLog = append(r.slowLog, fmt.Sprintf("-- links up at %s, client moved back at %s", back.UTC().Format(time.RFC3339Nano), movedBack.UTC().Format(time.RFC3339Nano)))
		}
		r.Done++
		// The master serves a while, and synchronizes the connections
		// it opens, before the next cut: longer than a client waits to
		// send a lost SYN again (1 s), so that a handshake that crossed
		// the return completes before the next cut rather than meeting
		// it (see served).
		time.Sleep(served)
	}
	l.end()
	dumping.Wait()
	diagMu.Lock()
	// The load has ended: its records hold still.
	for i, port := range l.shortPorts {
		if port == 0 {
			continue
		}
		r.Diag = append(r.Diag, fmt.Sprintf("-- client port %d's handshakes, and the ARP packets around its first, on every link:\n%s", port, strings.Join(trace.request(port, l.shortFailed[i]), "\n")))
	}
	diagMu.Unlock()
	taking := func(sent time.Time) bool {
		for _, w := range takeovers {
			if !sent.Before(w.from) && sent.Before(w.to) {
				return true
			}
		}
		return false
	}
	diagMu.Lock()
	for _, s := range slow {
		if taking(s.sent) {
			r.Slow++
			continue
		}
		r.SlowBack++
		if len(r.SlowDiag) < 3 {
			r.SlowDiag = append(r.SlowDiag, fmt.Sprintf("-- client port %d, sent %s, answered in %v; its handshakes, and the ARP packets around its first, on every link:\n%s",
				s.port, s.sent.UTC().Format("15:04:05.000000"), s.took.Round(time.Millisecond), strings.Join(trace.request(s.port, s.sent), "\n")))
		}
	}
	diagMu.Unlock()
	r.PerCycle = make([]int, n)
	viaBackup := trace.synAckVia("v"+backup.name, tp.VIP)
	for i, sent := range l.shortFailed {
		if taking(sent) {
			r.Failed++
			continue
		}
		if p.o.Mode != "dr" && unsynchronized(l.shortPorts[i], sent, l.shortErr[i], viaBackup, returned) {
			r.Unsynced++
			continue
		}
		r.FailedBack++
		c := 0
		for c+1 < len(takeovers) && !sent.Before(takeovers[c+1].from) {
			c++
		}
		r.PerCycle[c]++
	}
	r.Broken, r.Short, r.Long = len(l.longErrs), l.shortOK, l.longOK
	r.Errors, r.Broken1 = first(l.shortErr), first(l.longErrs)
	return r
}

// unsynchronized reports whether the short request from client port
// port, sent at sent, that failed with error text err, failed in the way
// the synchronization of IPVS connections cannot prevent at a return
// through NAT or SNAT: its handshake completed through the backup
// (viaBackup: when the VIP's SYN-ACKs to each client port left the
// backup) before a return (returned: when the client's neighbour entry
// named the master again), and no other handshake completed through the
// backup between it and that return, and it then timed out reading the
// answer. The backup's kernel synchronizes a connection in a message it
// sends when the next connection is synchronized, or 2 to 3 s later
// (vipd makes each message hold one connection, agent/ha.go syncMaxLen):
// the last connection through the backup before a return waits for
// those seconds, while the backend's answers go to the master, which
// does not know it and drops them.
func unsynchronized(port int, sent time.Time, err string, viaBackup map[int][]time.Time, returned []time.Time) bool {
	if !strings.Contains(err, ": read tcp ") || !strings.HasSuffix(err, "i/o timeout") {
		return false
	}
	var opened time.Time
	for _, at := range viaBackup[port] {
		if !at.Before(sent) && at.Before(sent.Add(time.Second)) {
			opened = at
			break
		}
	}
	if opened.IsZero() {
		return false
	}
	i := slices.IndexFunc(returned, func(at time.Time) bool { return at.After(opened) })
	if i < 0 || returned[i].Sub(opened) > time.Second {
		return false
	}
	for other, ats := range viaBackup {
		for _, at := range ats {
			if other != port && at.After(opened) && at.Before(returned[i]) {
				return false
			}
		}
	}
	return true
}

// TestHAReturns fails the master of a pair with synchronized connections
// 20 times in a row under load, for direct routing, NAT through the
// pair's floating gateway and one-arm SNAT from its floating source, and
// asserts that no long-lived connection breaks and that no request fails
// as the master comes back and takes the VIP back (nor while the backup
// serves). (On a host starved by 3-5 other guests, NAT and SNAT lost 0-5
// requests in 20 returns, all 5 s timeouts: test/bench/results/
// 2026-12-06-ha-returns.txt.) Requests sent while the backup takes over
// (or just before the cut: in flight as the links go) are counted, not
// asserted (see checkFailover); so are, through NAT and SNAT, those that
// the synchronization of connections cannot save (see unsynchronized). With 100 ms advertisements, 300 ms of
// service by the backup and 1.5 s by the master, a cycle takes about
// 2.3 s in the emulated guest.
func TestHAReturns(t *testing.T) {
	const n = 20
	for _, mode := range []string{"dr", "nat", "snat"} {
		t.Run(mode, func(t *testing.T) {
			p := startPair(t, pairOptions{Mode: mode, Sync: true})
			start := time.Now()
			r := p.returns(n, 300*time.Millisecond)
			back := make([]string, len(r.Back))
			for i, d := range r.Back {
				back[i] = d.Round(time.Millisecond).String()
			}
			t.Logf("%s: %d cycles in %v; %d short and %d long-lived requests; failed: %d as the backup took over, %d after (per cycle %v), %d opened through the backup last before a return (unsynchronized); answered after 900 ms or more: %d as the backup took over, %d after; broken %d; returns (links up to the client's neighbour entry back) %s; errors %q %q",
				p.o, r.Done, time.Since(start).Round(time.Millisecond), r.Short, r.Long, r.Failed, r.FailedBack, r.PerCycle, r.Unsynced, r.Slow, r.SlowBack, r.Broken, strings.Join(back, " "), r.Errors, r.Broken1)
			t.Logf("%s: the slowest return (%v from %s, links up at the first line's time or before):\n%s", p.o, r.slowest.Round(time.Millisecond),
				p.nodes[0].name, strings.Join(r.slowLog, "\n"))
			if len(r.SlowDiag) > 0 {
				t.Logf("%s: the first requests answered after 900 ms or more after the backup took over:\n%s", p.o, strings.Join(r.SlowDiag, "\n"))
			}
			if len(r.Diag) > 0 {
				t.Logf("%s: where the failed requests went:\n%s", p.o, strings.Join(r.Diag, "\n"))
			}
			if r.FailedBack != 0 {
				t.Errorf("%s: %d requests failed as the master came back over %d returns (per cycle %v): %q", p.o, r.FailedBack, r.Done, r.PerCycle, r.Errors)
			}
			// The synchronization's limit at a return (see
			// unsynchronized) cost one request in 640 NAT and SNAT
			// returns; more than 2 in 20 is synchronization failing.
			if r.Unsynced > 2 {
				t.Errorf("%s: %d requests failed at returns, each the last connection through the backup before its return, in %d returns: more than the synchronization's limit explains", p.o, r.Unsynced, r.Done)
			}
			if r.Broken != 0 || r.Short == 0 || r.Long == 0 {
				t.Errorf("%s: %d broken long-lived connections (%d short, %d long-lived requests): %q", p.o, r.Broken, r.Short, r.Long, r.Broken1)
			}
			fmt.Fprintf(os.Stderr, "HA-RETURNS %s n=%d failed_back=%d failed_takeover=%d unsynced=%d broken=%d slow_back=%d slow_takeover=%d\n", mode, r.Done, r.FailedBack, r.Failed, r.Unsynced, r.Broken, r.SlowBack, r.Slow)
		})
	}
}

// TestUnsynchronized checks which failed requests TestHAReturns takes for
// the ones synchronization cannot save, on the packets of one it caught
// (NAT, December 7): only a read timeout of a connection whose
// handshake was the last through the backup before a return.
func TestUnsynchronized(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse("15:04:05.000000", s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	synAck := func(when, veth string, port int) tracedPacket {
		return tracedPacket{at(when), fmt.Sprintf("%s 1796678106.641372 %s  P   ifindex 80 16:4d:19:db:7b:92 ethertype IPv4 (0x0800), length 80: 10.0.3.100.80 > 10.0.3.2.%d: Flags [S.], seq 2174307499, ack 3356679586, win 65160, length 0", when, veth, port)}
	}
	h := &handshakeTrace{packets: []tracedPacket{
		// The backend's SYN-ACK on its way to the balancer: not the VIP's.
		{at("21:15:06.641209"), "21:15:06.641209 1796678106.641209 vbe3  P   ifindex 86 1e:b8:50:6a:fb:db ethertype IPv4 (0x0800), length 80: 10.0.2.13.80 > 10.0.3.2.55745: Flags [S.], seq 2174307499, ack 3356679586, win 65160, length 0"},
		synAck("21:15:06.641372", "vlb2", 55745),
		// The same packet out of the client's port of the bridge.
		{at("21:15:06.641378"), "21:15:06.641378 1796678106.641378 vcl   Out ifindex 78 16:4d:19:db:7b:92 ethertype IPv4 (0x0800), length 80: 10.0.3.100.80 > 10.0.3.2.55745: Flags [S.], seq 2174307499, ack 3356679586, win 65160, length 0"},
		synAck("21:15:07.100000", "vlb1", 40000),
		synAck("21:15:08.000000", "vlb2", 40001),
		synAck("21:15:08.020000", "vlb2", 40002),
		synAck("21:15:09.000000", "vlb2", 40003),
	}}
	via := h.synAckVia("vlb2", "10.0.3.100")
	if want := map[int][]time.Time{55745: {at("21:15:06.641372")}, 40001: {at("21:15:08.000000")}, 40002: {at("21:15:08.020000")}, 40003: {at("21:15:09.000000")}}; fmt.Sprint(via) != fmt.Sprint(want) {
		t.Fatalf("synAckVia = %v, want %v", via, want)
	}
	returned := []time.Time{at("21:15:06.660000"), at("21:15:08.100000"), at("21:15:11.000000")}
	read := "21:15:11.658 port 55745: read tcp 10.0.3.2:55745->10.0.3.100:80: i/o timeout"
	for _, c := range []struct {
		name string
		port int
		sent string
		err  string
		want bool
	}{
		{"last through the backup, read timeout", 55745, "21:15:06.640000", read, true},
		{"a dial timeout", 55745, "21:15:06.640000", "dial tcp 10.0.3.100:80: i/o timeout", false},
		{"a reset", 55745, "21:15:06.640000", "21:15:06.700 port 55745: read tcp 10.0.3.2:55745->10.0.3.100:80: read: connection reset by peer", false},
		{"through the master", 40000, "21:15:07.099000", read, false},
		{"another through the backup after it", 40001, "21:15:07.999000", read, false},
		{"the last of two", 40002, "21:15:08.019000", read, true},
		{"the return more than 1 s later", 40003, "21:15:08.999000", read, false},
		{"no handshake", 40004, "21:15:06.640000", read, false},
	} {
		if got := unsynchronized(c.port, at(c.sent), c.err, via, returned); got != c.want {
			t.Errorf("%s: unsynchronized = %v, want %v", c.name, got, c.want)
		}
	}
}
