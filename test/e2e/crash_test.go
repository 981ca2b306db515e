//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Crash tests: vipd killed with SIGKILL at random moments of a cold start
// and of a large reload, then restarted, must converge to exactly its
// configuration; a second vipd must not touch the first one's kernel.

// The crash configuration: crashServices services of crashBackends
// backends each, crashPorts to a VIP, whose backends need not answer,
// and the topology's real service, which carries the long-lived
// connections.
const (
	crashServices = 1000
	crashBackends = 10
	crashPorts    = 10
)

// crashSpec is one generation of the crash configuration: gen 0 is the
// base; an odd gen raises every weight by one and replaces the last
// backend of the first 500 services (500 backends removed, 500 added).
type crashSpec struct {
	tp  *Topo
	gen int
}

// crashVIP is the VIP of big service i.
func crashVIP(i int) netip.Addr {
	n := i / crashPorts
	return netip.AddrFrom4([4]byte{10, 100, byte(n >> 8), byte(n + 1)})
}

type crashBackend struct {
	addr   netip.AddrPort
	weight int
}

// backends returns big service i's backends.
func (c crashSpec) backends(i int) []crashBackend {
	out := make([]crashBackend, crashBackends)
	for j := range out {
		n := i*crashBackends + j
		a := netip.AddrFrom4([4]byte{172, 16, byte(n >> 8), byte(n)})
		if c.gen%2 == 1 && j == crashBackends-1 && i < 500 {
			a = netip.AddrFrom4([4]byte{172, 17, byte(n >> 8), byte(n)})
		}
		out[j] = crashBackend{netip.AddrPortFrom(a, 8080), 1 + c.gen%2}
	}
	return out
}

// toml renders the configuration's services.
func (c crashSpec) toml() string {
	var b strings.Builder
	b.WriteString(service("web", c.tp.VIP, 80, `scheduler = "wrr"`, c.tp.BackendIPs...))
	for i := range crashServices {
		fmt.Fprintf(&b, "\n[[service]]\nname = \"s%d\"\nvip = %q\nport = %d\nscheduler = \"wrr\"\nbackend = [", i, crashVIP(i), 80+i%crashPorts)
		for j, be := range c.backends(i) {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "{ address = %q, port = %d, weight = %d }", be.addr.Addr(), be.addr.Port(), be.weight)
		}
		b.WriteString("]\n")
	}
	return b.String()
}

// table returns vipd's part of `ipvsadm -Sn` for the configuration, sorted.
func (c crashSpec) table() []string {
	var out []string
	web := HostPort(c.tp.VIP, 80)
	out = append(out, fmt.Sprintf("-A -t %s -s wrr", web))
	for _, be := range c.tp.BackendIPs {
		out = append(out, fmt.Sprintf("-a -t %s -r %s -m -w 1", web, HostPort(be, 80)))
	}
	for i := range crashServices {
		svc := netip.AddrPortFrom(crashVIP(i), uint16(80+i%crashPorts))
		out = append(out, fmt.Sprintf("-A -t %s -s wrr", svc))
		for _, be := range c.backends(i) {
			out = append(out, fmt.Sprintf("-a -t %s -r %s -m -w %d", svc, be.addr, be.weight))
		}
	}
	slices.Sort(out)
	return out
}

// services returns the keys of the configuration's services as the
// ledger stores them ("tcp ADDR:PORT"), sorted.
func (c crashSpec) services() []string {
	out := []string{"tcp " + HostPort(c.tp.VIP, 80)}
	for i := range crashServices {
		out = append(out, fmt.Sprintf("tcp %s", netip.AddrPortFrom(crashVIP(i), uint16(80+i%crashPorts))))
	}
	slices.Sort(out)
	return out
}

// vips returns the VIPs the configuration binds, sorted.
func (c crashSpec) vips() []string {
	out := []string{c.tp.VIP}
	for i := 0; i < crashServices; i += crashPorts {
		out = append(out, crashVIP(i).String())
	}
	slices.Sort(out)
	return out
}

// launch runs vipd, in network namespace ns unless it is "", without
// waiting for it to get ready.
func (d *daemon) launch(ns string) {
	d.t.Helper()
	d.starts++
	fmt.Fprintf(d.log, "---- start %d\n", d.starts)
	d.cmd = exec.Command(vipdBin(), "run", "-c", d.path)
	if ns != "" {
		// ip netns exec execs vipd: the process is vipd's.
		d.cmd = exec.Command("ip", "netns", "exec", ns, vipdBin(), "run", "-c", d.path)
	}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(d.cmd, d.done)
}

// ready waits for the current process to report ready and returns how
// long after launched it did. A restart after a crash must log no error
// on its way: no operation that failed, no pass that could not read the
// kernel.
func (d *daemon) ready(launched time.Time) time.Duration {
	d.t.Helper()
	Eventually(d.t, 120*time.Second, 20*time.Millisecond, func() bool {
		select {
		case <-d.done:
			d.t.Fatalf("vipd exited:\n%s", d.logSince())
		default:
		}
		return strings.Contains(d.logSince(), "msg=ready")
	}, "vipd did not get ready:\n%s", d.logSince())
	took := time.Since(launched)
	mustNotContain(d.t, "the log of a start", d.logSince(), "level=ERROR", "level=WARN")
	return took
}

// killAt kills vipd delay after t and says how far it had come since
// its log was mark bytes long: the kinds of operations it logged as
// applied (a large pass logs a kind when it is done with it), and
// whether its pass (why) had ended.
func (d *daemon) killAt(t time.Time, delay time.Duration, mark int, why string) string {
	time.Sleep(time.Until(t.Add(delay)))
	d.kill()
	log := d.logSince()[mark:]
	var kinds []string
	for _, l := range strings.Split(log, "\n") {
		if _, rest, ok := strings.Cut(l, "msg=applied op="); ok {
			kinds = append(kinds, strings.Fields(rest)[0])
		}
	}
	at := delay.Round(time.Millisecond).String()
	switch {
	case strings.Contains(log, "msg=reconciled why="+why):
		return at + " (pass done)"
	case len(kinds) == 0:
		return at + " (no kind of operation done)"
	}
	return at + " (done: " + strings.Join(kinds, ",") + ")"
}

// sortedLines returns the non-empty lines of s, sorted.
func sortedLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// diffLines describes how got differs from want, both sorted: lines
// missing, and lines extra (a duplicate is an extra line).
func diffLines(got, want []string) string {
	var missing, extra []string
	i, j := 0, 0
	for i < len(got) || j < len(want) {
		switch {
		case j == len(want) || i < len(got) && got[i] < want[j]:
			extra = append(extra, got[i])
			i++
		case i == len(got) || got[i] > want[j]:
			missing = append(missing, want[j])
			j++
		default:
			i++
			j++
		}
	}
	if len(missing)+len(extra) == 0 {
		return ""
	}
	return fmt.Sprintf("%d lines missing %q, %d extra %q", len(missing), first(missing), len(extra), first(extra))
}

// crashCheck is the converged state a crash test expects of the network
// namespace ns ("" is the guest's own), foreign objects included.
type crashCheck struct {
	t       *testing.T
	d       *daemon
	ns      string
	foreign []string // the foreign service's lines of ipvsadm -Sn
	rule    string   // the foreign iptables rule, as iptables-save prints it
}

// run runs a command in the namespace.
func (cc crashCheck) run(name string, args ...string) string {
	cc.t.Helper()
	if cc.ns == "" {
		return Run(cc.t, name, args...)
	}
	return Run(cc.t, "ip", append([]string{"netns", "exec", cc.ns, name}, args...)...)
}

// addForeign adds a service and a rule that are not vipd's.
func (cc *crashCheck) addForeign(addr, backend string) {
	cc.run("ipvsadm", "-A", "-t", addr+":8080", "-s", "lc")
	cc.run("ipvsadm", "-a", "-t", addr+":8080", "-r", backend+":8080", "-m")
	cc.run("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "9999", "-m", "comment", "--comment", "foreign", "-j", "ACCEPT")
	cc.rule = `-A INPUT -p tcp -m tcp --dport 9999 -m comment --comment foreign -j ACCEPT`
	cc.foreign = sortedLines(cc.run("ipvsadm", "-Sn"))
}

// check compares the kernel and the ledger with spec exactly.
func (cc crashCheck) check(what string, spec crashSpec) {
	t := cc.t
	t.Helper()
	start := time.Now()
	want := append(spec.table(), cc.foreign...)
	slices.Sort(want)
	// Backends the file removed leave rotation (weight 0) in the pass
	// and are deleted by a drain pass a second or so later (see
	// lb.PlanOptions): the table converges within a few seconds.
	var table, diff string
	var read time.Duration
	for deadline := time.Now().Add(60 * time.Second); ; {
		begin := time.Now()
		table = cc.run("ipvsadm", "-Sn")
		read = time.Since(begin)
		if diff = diffLines(sortedLines(table), want); diff == "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if diff != "" {
		t.Errorf("%s: ipvsadm -Sn after %v: %s", what, time.Since(start).Round(time.Millisecond), diff)
	}
	var vips []string
	for _, f := range strings.Fields(cc.run("ip", "-o", "-4", "addr", "show", "dev", "vipd0")) {
		if a, ok := strings.CutSuffix(f, "/32"); ok {
			vips = append(vips, a)
		}
	}
	slices.Sort(vips)
	if diff := diffLines(vips, spec.vips()); diff != "" {
		t.Errorf("%s: VIPs on vipd0: %s", what, diff)
	}
	// No rule twice in a table, the foreign one kept.
	save := cc.run("iptables-save")
	seen := map[string]bool{}
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "*") {
			clear(seen)
		}
		if strings.HasPrefix(l, "-A ") {
			if seen[l] {
				t.Errorf("%s: iptables rule twice: %s", what, l)
			}
			seen[l] = true
		}
	}
	if n := strings.Count(save, cc.rule); n != 1 {
		t.Errorf("%s: the foreign rule %q is in iptables-save %d times", what, cc.rule, n)
	}
	if got := strings.Count(cc.run("ipset", "list", "vipd-served-4"), ",tcp:"); got != len(spec.services()) {
		t.Errorf("%s: vipd-served-4 has %d members, want %d", what, got, len(spec.services()))
	}
	// The ledger: every service vipd owns, nothing else.
	data, err := os.ReadFile(filepath.Join(cc.d.dir, "state", "owned.json"))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	var doc struct {
		Version  int
		Services []struct {
			Proto string
			Addr  string
			Port  int
		}
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: owned.json does not parse: %v", what, err)
	}
	var owned []string
	for _, s := range doc.Services {
		owned = append(owned, fmt.Sprintf("%s %s", s.Proto, HostPort(s.Addr, s.Port)))
	}
	slices.Sort(owned)
	if diff := diffLines(owned, spec.services()); diff != "" || doc.Version != 1 {
		t.Errorf("%s: owned.json (version %d): %s", what, doc.Version, diff)
	}
	t.Logf("%s: checked in %v (ipvsadm -Sn %v)", what, time.Since(start).Round(time.Millisecond), read.Round(time.Millisecond))
}

// crashSeed returns the seed of a crash test's random moments:
// VIPD_CRASH_SEED, or the clock. The test logs it.
func crashSeed(t *testing.T) uint64 {
	if s := os.Getenv("VIPD_CRASH_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("VIPD_CRASH_SEED=%q: %v", s, err)
		}
		return n
	}
	return uint64(time.Now().UnixNano())
}

// newNetns makes a network namespace, removed when the test ends. Cold
// starts each get their own: IPVS keeps deleted backends in a trash list
// for two minutes and searches it for every backend it adds, so wiping
// 10,000 backends to start cold again in one namespace makes the next
// start ten times slower.
func newNetns(t *testing.T, name string) {
	t.Helper()
	Exec("ip", "netns", "del", name)
	Run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { Exec("ip", "netns", "del", name) })
	Run(t, "ip", "-n", name, "link", "set", "lo", "up")
}

// crashNetns is the namespace of the crash tests that need no traffic.
const crashNetns = "vipd-crash"

// netnsDaemon prepares, in a fresh namespace crashNetns holding a foreign
// service and rule, a vipd with the big configuration spec: no uplinks,
// so nothing to announce.
func netnsDaemon(t *testing.T, spec crashSpec) (*daemon, crashCheck) {
	t.Helper()
	newNetns(t, crashNetns)
	d := newDaemon(t)
	cc := crashCheck{t: t, d: d, ns: crashNetns}
	cc.addForeign("203.0.113.1", "198.51.100.9")
	d.write(netnsHeader(d) + spec.toml())
	return d, cc
}

// netnsHeader is the [daemon] table of a vipd in crashNetns.
func netnsHeader(d *daemon) string {
	return fmt.Sprintf("[daemon]\nuplinks = []\nstate_dir = %q\ncontrol_socket = %q\nmetrics_listen = \"\"\nresync_interval = \"1m\"\n",
		filepath.Join(d.dir, "state"), filepath.Join(d.dir, "vipd.sock"))
}

// netnsSpec is the big configuration of the namespace tests; its real
// service's backends do not exist either.
func netnsSpec() crashSpec {
	return crashSpec{tp: &Topo{VIP: "192.0.2.80", BackendIPs: []string{"198.51.100.1", "198.51.100.2"}}}
}

// startSeeded logs and returns a crash test's random source.
func startSeeded(t *testing.T) (*rand.Rand, uint64) {
	seed := crashSeed(t)
	t.Logf("seed %d (VIPD_CRASH_SEED=%d repeats this run's moments)", seed, seed)
	return rand.New(rand.NewPCG(seed, 0)), seed
}

// TestVipdCrashColdStart kills vipd with SIGKILL at seeded random moments
// of cold starts of 1,000 services x 10 backends, each in a fresh network
// namespace holding a foreign service and rule: round r of 8 kills in the
// r-th eighth of the start's length, measured first, and every other
// round kills the restart too (12 kills). After each round's last restart
// the kernel must hold exactly the configuration (ipvsadm -Sn, the VIPs,
// no iptables rule twice, the ipset), the foreign service and rule
// untouched, and the ledger exactly vipd's services.
func TestVipdCrashColdStart(t *testing.T) {
	rng, seed := startSeeded(t)
	spec := netnsSpec()
	d, cc := netnsDaemon(t, spec)
	launched := time.Now()
	d.launch(crashNetns)
	cold := d.ready(launched)
	t.Logf("cold start (launch to ready): %v", cold.Round(time.Millisecond))
	cc.check("uninterrupted cold start", spec)
	d.kill()

	const rounds = 8
	kills := 0
	for r := range rounds {
		d, cc := netnsDaemon(t, spec)
		delay := time.Duration((float64(r) + rng.Float64()) / rounds * float64(cold))
		launched := time.Now()
		d.launch(crashNetns)
		what := "killed at " + d.killAt(launched, delay, 0, "start")
		kills++
		if r%2 == 1 {
			// Kill the restart too, somewhere in its first two thirds.
			again := time.Duration(rng.Float64() * float64(cold) * 2 / 3)
			launched = time.Now()
			d.launch(crashNetns)
			what += ", restart killed at " + d.killAt(launched, again, 0, "start")
			kills++
		}
		launched = time.Now()
		d.launch(crashNetns)
		took := d.ready(launched)
		cc.check(fmt.Sprintf("round %d: %s; restart ready in %v", r, what, took.Round(time.Millisecond)), spec)
		d.kill()
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
	t.Logf("%d kills", kills)
}

// TestVipdCrashReload kills vipd with SIGKILL at seeded random moments of
// a large reload (every weight changes, 500 backends leave and 500 come),
// in a network namespace holding a foreign service and rule: round r of
// 10 kills in the r-th tenth of the reload's length, measured first (from
// the file's write to the end of its pass), and restarts it. After each
// restart the kernel and the ledger must match the new file exactly.
func TestVipdCrashReload(t *testing.T) {
	rng, seed := startSeeded(t)
	spec := netnsSpec()
	d, cc := netnsDaemon(t, spec)
	d.launch(crashNetns)
	d.ready(time.Now())
	spec.gen = 1
	written := time.Now()
	d.write(netnsHeader(d) + spec.toml())
	d.waitLog(`msg=reconciled why="file changed"`)
	reload := time.Since(written)
	t.Logf("large reload (write to reconciled): %v", reload.Round(time.Millisecond))
	cc.check("uninterrupted reload", spec)
	const rounds = 10
	for r := range rounds {
		spec.gen = r % 2 // away from the running generation
		delay := time.Duration((float64(r) + rng.Float64()) / rounds * float64(reload))
		mark := len(d.logSince())
		written := time.Now()
		d.write(netnsHeader(d) + spec.toml())
		k := d.killAt(written, delay, mark, `"file changed"`)
		launched := time.Now()
		d.launch(crashNetns)
		took := d.ready(launched)
		cc.check(fmt.Sprintf("round %d to gen %d: killed at %s; restart ready in %v", r, spec.gen, k, took.Round(time.Millisecond)), spec)
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
}

// TestVipdCrashLongLived: long-lived connections, and a stream of short
// ones, through a real service survive vipd being killed with SIGKILL at
// random moments of the first start of 1,000 more services beside it
// (three times) and of large reloads (three), restarted each time; after
// each series the kernel and the ledger match the file exactly, a foreign
// service and rule untouched.
func TestVipdCrashLongLived(t *testing.T) {
	rng, seed := startSeeded(t)
	tp := NewTopo(t, "nat 3")
	d := newDaemon(t)
	cc := crashCheck{t: t, d: d}
	cc.addForeign(tp.LBIP, tp.BackendIPs[0])
	header := d.header(tp.LBIf, `resync_interval = "1m"`)
	d.write(header + service("web", tp.VIP, 80, `scheduler = "wrr"`, tp.BackendIPs...))
	d.start()
	l := startLoad(t, tp, 80, 6, 200*time.Millisecond)

	// The 1,000 services arrive with a restart, killed three times at
	// random moments of its first 2 s (a cold start takes 1.5-2 s in
	// the guest).
	spec := crashSpec{tp: tp}
	d.write(header + spec.toml())
	var kills []string
	for range 3 {
		d.kill()
		launched := time.Now()
		d.launch("")
		kills = append(kills, d.killAt(launched, time.Duration(rng.Float64()*float64(2*time.Second)), 0, "start"))
	}
	launched := time.Now()
	d.launch("")
	cc.check(fmt.Sprintf("start killed at %s; restart ready in %v", strings.Join(kills, ", "), d.ready(launched).Round(time.Millisecond)), spec)

	for r := range 3 {
		spec.gen = 1 - r%2
		mark := len(d.logSince())
		written := time.Now()
		d.write(header + spec.toml())
		k := d.killAt(written, time.Duration(rng.Float64()*float64(3*time.Second)), mark, `"file changed"`)
		launched := time.Now()
		d.launch("")
		took := d.ready(launched)
		cc.check(fmt.Sprintf("reload %d to gen %d: killed at %s; restart ready in %v", r, spec.gen, k, took.Round(time.Millisecond)), spec)
	}
	l.finish(t, "6 kills and restarts")
	if t.Failed() {
		t.Logf("seed %d", seed)
	}
}

// second runs `vipd run -c path` that must fail: it returns its output
// and how long it took.
func second(t *testing.T, path string) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	r := Exec(vipdBin(), "run", "-c", path)
	took := time.Since(start)
	if r.Err == nil {
		t.Fatalf("a second vipd ran and exited 0:\n%s", r)
	}
	if took > 10*time.Second {
		t.Errorf("the second vipd took %v to give up", took)
	}
	return r.Stdout + r.Stderr, took
}

// TestVipdSecondInstance: while vipd runs, a second `vipd run` on the
// same configuration (same state_dir) or on another configuration (same
// network namespace) exits non-zero at once, naming the lock and the
// first one's pid, and the first one's kernel state and control socket
// are intact; in both orders. Two started at the same moment: exactly
// one runs.
func TestVipdSecondInstance(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	a, b := newDaemon(t), newDaemon(t)
	ports := map[*daemon]int{a: 80, b: 81}
	for x, port := range ports {
		x.write(x.header(tp.LBIf, "") + service(fmt.Sprint(port), tp.VIP, port, `scheduler = "rr"`, tp.BackendIPs...))
	}
	for _, order := range [][2]*daemon{{a, b}, {b, a}} {
		one, two := order[0], order[1]
		one.start()
		before := Run(t, "ipvsadm", "-Sn")
		pid := one.cmd.Process.Pid
		for _, tc := range []struct{ name, path, lock string }{
			{"same state_dir", one.path, filepath.Join(one.dir, "state", "vipd.lock")},
			{"same network namespace", two.path, "/run/vipd/lock/vipd-net-"},
		} {
			out, took := second(t, tc.path)
			t.Logf("%s, %s: refused in %v", filepath.Base(one.dir), tc.name, took.Round(time.Millisecond))
			mustContain(t, "the second vipd's output", out, fmt.Sprintf("another vipd (pid %d) holds %s", pid, tc.lock), "changed nothing")
			if after := Run(t, "ipvsadm", "-Sn"); after != before {
				t.Errorf("%s: the second vipd changed IPVS:\nbefore\n%s\nafter\n%s", tc.name, before, after)
			}
			mustContain(t, "vipd status of the first", Run(t, vipdBin(), "status", "--socket", filepath.Join(one.dir, "vipd.sock")), tp.BackendIPs[0])
		}
		// The first one keeps running and repairs drift as before.
		Run(t, "ipvsadm", "-D", "-t", HostPort(tp.VIP, ports[one]))
		Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
			return Run(t, "ipvsadm", "-Sn") == before
		}, "the first vipd did not repair its service")
		one.stop()
		Run(t, "ipvsadm", "-C")
	}

	// Both at once: one runs, the other exits non-zero.
	a.launch("")
	b.launch("")
	var winner, loser *daemon
	Eventually(t, 30*time.Second, 20*time.Millisecond, func() bool {
		for _, x := range [][2]*daemon{{a, b}, {b, a}} {
			select {
			case <-x[0].done:
				winner, loser = x[1], x[0]
				return true
			default:
			}
		}
		return false
	}, "neither of two vipds started at once exited:\n%s\n%s", a.log, b.log)
	if code := loser.cmd.ProcessState.ExitCode(); code == 0 {
		t.Errorf("the refused vipd exited 0")
	}
	loser.cmd = nil
	mustContain(t, "the refused vipd's log", loser.logSince(), "holds /run/vipd/lock/vipd-net-")
	winner.ready(time.Now())
	ipvs := Run(t, "ipvsadm", "-Sn")
	mustContain(t, "ipvsadm -Sn", ipvs, HostPort(tp.VIP, ports[winner]))
	if strings.Count(ipvs, "-A ") != 1 {
		t.Errorf("two vipds started at once: ipvsadm -Sn holds more than the winner's service:\n%s", ipvs)
	}
}
