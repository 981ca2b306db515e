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

// launch runs vipd without waiting for it to get ready.
func (d *daemon) launch() {
	d.t.Helper()
	d.starts++
	fmt.Fprintf(d.log, "---- start %d\n", d.starts)
	d.cmd = exec.Command(vipdBin(), "run", "-c", d.path)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(d.cmd, d.done)
}

// ready waits for the current process to report ready and returns how
// long after its launch it did (to 50 ms).
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
	return time.Since(launched)
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

// crashCheck is the converged state a crash test expects, foreign objects
// included.
type crashCheck struct {
	t       *testing.T
	d       *daemon
	foreign []string // the foreign service's lines of ipvsadm -Sn
	rule    string   // the foreign iptables rule
}

// check compares the kernel and the ledger with spec exactly.
func (cc crashCheck) check(what string, spec crashSpec) {
	t := cc.t
	t.Helper()
	want := append(spec.table(), cc.foreign...)
	slices.Sort(want)
	if diff := diffLines(sortedLines(Run(t, "ipvsadm", "-Sn")), want); diff != "" {
		t.Errorf("%s: ipvsadm -Sn: %s", what, diff)
	}
	var vips []string
	for _, f := range strings.Fields(Run(t, "ip", "-o", "-4", "addr", "show", "dev", "vipd0")) {
		if a, ok := strings.CutSuffix(f, "/32"); ok {
			vips = append(vips, a)
		}
	}
	slices.Sort(vips)
	if diff := diffLines(vips, spec.vips()); diff != "" {
		t.Errorf("%s: VIPs on vipd0: %s", what, diff)
	}
	// No rule twice in a table, the foreign one kept.
	save := Run(t, "iptables-save")
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
	if got := strings.Count(Run(t, "ipset", "list", "vipd-served-4"), ",tcp:"); got != len(spec.services()) {
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

// wipeBig deletes the big services and their VIPs behind vipd's back, so
// that the next start is cold again for them.
func wipeBig(t *testing.T, spec crashSpec) {
	t.Helper()
	var ipvs, addrs strings.Builder
	for i := range crashServices {
		fmt.Fprintf(&ipvs, "-D -t %s\n", netip.AddrPortFrom(crashVIP(i), uint16(80+i%crashPorts)))
		if i%crashPorts == 0 {
			fmt.Fprintf(&addrs, "addr del %s/32 dev vipd0\n", crashVIP(i))
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ipvs"), []byte(ipvs.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "addrs"), []byte(addrs.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	Sh(t, fmt.Sprintf("ipvsadm -R < %s/ipvs\nip -batch %s/addrs", dir, dir))
}

// TestVipdCrash kills vipd with SIGKILL at seeded random moments, spread
// over a cold start of 1,000 services x 10 backends (the big services
// wiped before each) and over a reload that changes every weight and
// replaces 500 backends, and restarts it each time; every other restart
// is killed too. After each round the kernel must hold exactly the
// configuration (ipvsadm -Sn, the VIPs, no iptables rule twice, the
// ipset), a foreign service and rule untouched, the ledger exactly
// vipd's services, and long-lived connections through the real service
// must see no error throughout.
func TestVipdCrash(t *testing.T) {
	seed := crashSeed(t)
	t.Logf("seed %d (VIPD_CRASH_SEED=%d repeats this run's moments)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	tp := NewTopo(t, "nat 3")
	foreign := tp.LBIP + ":8080"
	Run(t, "ipvsadm", "-A", "-t", foreign, "-s", "lc")
	Run(t, "ipvsadm", "-a", "-t", foreign, "-r", tp.BackendIPs[0]+":8080", "-m")
	rule := `-A INPUT -p tcp -m tcp --dport 9999 -m comment --comment foreign -j ACCEPT`
	Run(t, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "9999", "-m", "comment", "--comment", "foreign", "-j", "ACCEPT")
	cc := crashCheck{t: t, foreign: sortedLines(Run(t, "ipvsadm", "-Sn")), rule: rule}

	d := newDaemon(t)
	cc.d = d
	spec := crashSpec{tp: tp}
	d.write(d.header(tp.LBIf, "") + spec.toml())

	// An uninterrupted cold start measures how long one takes here.
	launched := time.Now()
	d.launch()
	cold := d.ready(launched)
	t.Logf("cold start (launch to ready): %v", cold.Round(time.Millisecond))
	cc.check("after an uninterrupted cold start", spec)
	l := startLoad(t, tp, 80, 6, 100*time.Millisecond)

	const rounds = 10
	var kills int
	// kill waits for delay after launched, then kills vipd.
	kill := func(launched time.Time, delay time.Duration) {
		time.Sleep(time.Until(launched.Add(delay)))
		d.kill()
		kills++
	}
	// Delays are stratified: round r kills in the r-th tenth of the
	// cold start, at a random point of it.
	var restarts []time.Duration
	for r := range rounds {
		d.kill()
		wipeBig(t, spec)
		delay := time.Duration((float64(r) + rng.Float64()) / rounds * float64(cold))
		launched := time.Now()
		d.launch()
		kill(launched, delay)
		what := fmt.Sprintf("cold round %d (killed %v after launch", r, delay.Round(time.Millisecond))
		if r%2 == 1 {
			// Kill the restart too, somewhere in its first pass.
			again := time.Duration(rng.Float64() * float64(cold) / 2)
			launched = time.Now()
			d.launch()
			kill(launched, again)
			what += fmt.Sprintf(", its restart %v after launch", again.Round(time.Millisecond))
		}
		launched = time.Now()
		d.launch()
		restarts = append(restarts, d.ready(launched))
		cc.check(what+")", spec)
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
	t.Logf("cold rounds: %d kills; restarts to ready %v", kills, roundAll(restarts))

	// The large reload, timed once uninterrupted, then killed at random
	// moments of it: each round writes the other generation.
	spec.gen = 1
	written := time.Now()
	d.write(d.header(tp.LBIf, "") + spec.toml())
	d.waitLog(`msg=reconciled why="file changed"`)
	reload := time.Since(written)
	t.Logf("large reload (write to reconciled): %v", reload.Round(time.Millisecond))
	cc.check("after an uninterrupted reload", spec)
	restarts = restarts[:0]
	for r := range rounds {
		spec.gen = r % 2 // away from the running generation
		delay := time.Duration((float64(r) + rng.Float64()) / rounds * float64(reload))
		written := time.Now()
		d.write(d.header(tp.LBIf, "") + spec.toml())
		kill(written, delay)
		launched := time.Now()
		d.launch()
		restarts = append(restarts, d.ready(launched))
		cc.check(fmt.Sprintf("reload round %d to gen %d (killed %v after the write)", r, spec.gen, delay.Round(time.Millisecond)), spec)
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
	t.Logf("reload rounds: %d kills in all; restarts to ready %v", kills, roundAll(restarts))
	l.finish(t, fmt.Sprintf("%d kills and restarts", kills))
	if t.Failed() {
		t.Logf("seed %d", seed)
	}
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
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
			{"same network namespace", two.path, "/run/lock/vipd-net-"},
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
	a.launch()
	b.launch()
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
	mustContain(t, "the refused vipd's log", loser.logSince(), "holds /run/lock/vipd-net-")
	winner.ready(time.Now())
	ipvs := Run(t, "ipvsadm", "-Sn")
	mustContain(t, "ipvsadm -Sn", ipvs, HostPort(tp.VIP, ports[winner]))
	if strings.Count(ipvs, "-A ") != 1 {
		t.Errorf("two vipds started at once: ipvsadm -Sn holds more than the winner's service:\n%s", ipvs)
	}
}
