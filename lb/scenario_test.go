package lb_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

var update = flag.Bool("update", false, "rewrite golden files")

// golden compares got with testdata/name.golden.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./lb -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from golden file (go test ./lb -update rewrites it)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func mustParse(t testing.TB, src string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("step.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// step is one configuration of a scenario, with optional changes made to
// the kernel behind vipd's back before it is applied.
// A step named "resync: ..." first makes the reconciler re-read sysctls
// and rules, as the daemon's periodic resync does.
type step struct {
	name   string
	config string
	before func(*lbtest.Kernel)
}

// runScenario applies each step's config in turn against one fake kernel
// and records the operations applied and the kernel dump after each.
func runScenario(t *testing.T, k *lbtest.Kernel, opts lb.Options, steps []step) string {
	t.Helper()
	opts.Kernel = k.Interface()
	opts.Dummy = "vipd0"
	opts.KernelRelease = "6.1.0-27-cloud-amd64"
	r := lb.NewReconciler(opts)
	var b strings.Builder
	for i, s := range steps {
		if s.before != nil {
			s.before(k)
		}
		if strings.HasPrefix(s.name, "resync:") {
			r.Refresh()
		}
		cfg := mustParse(t, s.config)
		res, err := r.Reconcile(context.Background(), &cfg.Spec)
		if err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		fmt.Fprintf(&b, "== step %d: %s\n", i+1, s.name)
		for _, op := range res.Applied {
			fmt.Fprintf(&b, "applied: %s\n", op)
		}
		for _, f := range res.Failed {
			fmt.Fprintf(&b, "failed: %s\n", f)
		}
		for _, op := range res.Skipped {
			fmt.Fprintf(&b, "skipped: %s\n", op)
		}
		b.WriteString("-- kernel\n")
		b.WriteString(k.Dump())
		// Level-triggered convergence: a second pass with the same
		// config must do nothing (unless a backend is still draining).
		again, err := r.Plan(context.Background(), &cfg.Spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range again {
			fmt.Fprintf(&b, "pending: %s\n", op)
		}
	}
	return b.String()
}

// oneWeb is one VIP service with one backend.
const oneWeb = `
[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
backend = [{ address = "10.0.0.1" }]
`

// nodePortAndMark is a NodePort service and a firewall-mark service.
const nodePortAndMark = `
[[service]]
name = "np"
nodeport = true
port = 30080
backend = [{ address = "10.0.0.1", port = 8080 }]

[[service]]
name = "fw"
fwmark = 5
backend = [{ address = "10.0.0.2" }]
`

// allowed is a VIP service and a nodeport service with allow keys
// web and np.
func allowed(web, np string) string {
	return `
[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
` + web + `
backend = [{ address = "10.0.0.1" }]

[[service]]
name = "np"
nodeport = true
port = 30080
` + np + `
backend = [{ address = "10.0.0.1", port = 8080 }]
`
}

const base = `
[daemon]
uplinks = ["eth0"]

[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
scheduler = "rr"
backend = [{ address = "10.0.0.1" }, { address = "10.0.0.2" }]

[[service]]
name = "dns"
vip = "192.0.2.10"
port = 53
protocol = "udp"
backend = [{ address = "10.0.0.53" }]
`

// setPort80Conns sets the connection counts of backend addr of the port 80
// service.
func setPort80Conns(k *lbtest.Kernel, addr string, active, inactive uint32) {
	k.Edit(func(s *lb.State) {
		for key, svc := range s.Services {
			if key.Port == 80 {
				d := svc.Dests[netip.MustParseAddrPort(addr)]
				d.ActiveConns, d.InactiveConns = active, inactive
				svc.Dests[d.Addr] = d
			}
		}
	})
}

func foreign(k *lbtest.Kernel) {
	k.Edit(func(s *lb.State) {
		key := lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("198.51.100.7"), Port: 443}
		s.Services[key] = &lb.ServiceState{
			Service: lb.Service{Key: key, Scheduler: "wlc"},
			Dests: map[netip.AddrPort]lb.Destination{
				netip.MustParseAddrPort("10.9.9.9:443"): {Addr: netip.MustParseAddrPort("10.9.9.9:443"), Weight: 1, Forward: lb.Masq},
			},
		}
		fw := lb.ServiceKey{Family: lb.IPv4, FWMark: 99}
		s.Services[fw] = &lb.ServiceState{Service: lb.Service{Key: fw, Scheduler: "rr"}, Dests: map[netip.AddrPort]lb.Destination{}}
	})
}

func TestScenarios(t *testing.T) {
	// The grace scenario's clock; its steps move it on.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	wait := func(d time.Duration) func(*lbtest.Kernel) { return func(*lbtest.Kernel) { now = now.Add(d) } }
	removed := strings.Replace(base, `, { address = "10.0.0.2" }]`, `]`, 1)
	tests := []struct {
		name  string
		opts  lb.Options
		steps []step
	}{
		{"lifecycle", lb.Options{}, []step{
			{"empty kernel, foreign services present", base, foreign},
			{"unchanged config", base, nil},
			{"add a backend", strings.Replace(base, `{ address = "10.0.0.2" }]`, `{ address = "10.0.0.2" }, { address = "10.0.0.3" }]`, 1), nil},
			{"change weights and scheduler", strings.Replace(strings.Replace(base, `scheduler = "rr"`, `scheduler = "wrr"`, 1),
				`{ address = "10.0.0.2" }]`, `{ address = "10.0.0.2", weight = 5 }]`, 1), nil},
			{"remove a service", base[:strings.Index(base, "[[service]]\nname = \"dns\"")], nil},
			{"move the service to a new VIP", strings.Replace(base[:strings.Index(base, "[[service]]\nname = \"dns\"")], "192.0.2.10", "192.0.2.11", 1), nil},
			{"remove everything", "[daemon]\nuplinks = [\"eth0\"]\n", nil},
		}},
		{"drain", lb.Options{Removal: lb.RemovalPolicy{Drain: true, DrainTimeout: time.Minute}}, []step{
			{"two backends", base, nil},
			{"remove a backend with connections", strings.Replace(base, `, { address = "10.0.0.2" }]`, `]`, 1), func(k *lbtest.Kernel) {
				k.Edit(func(s *lb.State) {
					for key, svc := range s.Services {
						if key.Port == 80 {
							d := svc.Dests[netip.MustParseAddrPort("10.0.0.2:80")]
							d.ActiveConns = 4
							svc.Dests[d.Addr] = d
						}
					}
				})
			}},
			{"connections still open", strings.Replace(base, `, { address = "10.0.0.2" }]`, `]`, 1), nil},
			{"connections closed", strings.Replace(base, `, { address = "10.0.0.2" }]`, `]`, 1), func(k *lbtest.Kernel) {
				k.Edit(func(s *lb.State) {
					for key, svc := range s.Services {
						if key.Port == 80 {
							d := svc.Dests[netip.MustParseAddrPort("10.0.0.2:80")]
							d.ActiveConns = 0
							svc.Dests[d.Addr] = d
						}
					}
				})
			}},
			{"re-add the backend", base, nil},
		}},
		{"grace", lb.Options{Removal: lb.RemovalPolicy{Drain: true, DrainTimeout: time.Minute, Grace: 2 * time.Second}, Now: clock}, []step{
			{"two backends", base, nil},
			{"remove an idle backend: out of rotation, not deleted", removed, nil},
			{"no connection at all: deleted", removed, wait(time.Second)},
			{"re-add it", base, nil},
			{"remove it while a handshake is in flight: out of rotation", removed, func(k *lbtest.Kernel) {
				setPort80Conns(k, "10.0.0.2:80", 0, 1)
			}},
			{"a second later, still not established: it stays", removed, wait(time.Second)},
			{"the grace is over: deleted", removed, wait(time.Second)},
		}},
		{"drain-services", lb.Options{Removal: lb.RemovalPolicy{Drain: true, DrainServices: true, DrainTimeout: time.Minute}}, []step{
			{"two services", base, nil},
			{"remove the udp service while the tcp one has connections", base[:strings.Index(base, "[[service]]\nname = \"dns\"")], func(k *lbtest.Kernel) {
				k.Edit(func(s *lb.State) {
					for key, svc := range s.Services {
						if key.Port == 80 {
							d := svc.Dests[netip.MustParseAddrPort("10.0.0.1:80")]
							d.ActiveConns = 2
							svc.Dests[d.Addr] = d
						}
					}
				})
			}},
			{"remove the tcp service too: it drains, its VIP stays", "[daemon]\nuplinks = [\"eth0\"]\n", nil},
			{"its connections end: it goes, and the VIP", "[daemon]\nuplinks = [\"eth0\"]\n", func(k *lbtest.Kernel) {
				k.Edit(func(s *lb.State) {
					for _, svc := range s.Services {
						for a, d := range svc.Dests {
							d.ActiveConns = 0
							svc.Dests[a] = d
						}
					}
				})
			}},
		}},
		{"host address", lb.Options{}, []step{
			{"a VIP and a host address", oneWeb, nil},
			{"the uplink gains the VIP: the filter lets its traffic go, the rest stays", oneWeb, func(k *lbtest.Kernel) {
				k.SetHostAddrs("eth0", netip.MustParseAddr("192.0.2.10"))
			}},
			{"the uplink loses it: filtered again", oneWeb, func(k *lbtest.Kernel) {
				k.SetHostAddrs("eth0", netip.MustParseAddr("198.51.100.1"))
			}},
		}},
		{"drift", lb.Options{}, []step{
			{"programmed", base, nil},
			{"service, VIP, a sysctl and the chains changed by hand; IPVS and VIPs are read every pass", base, func(k *lbtest.Kernel) {
				k.Edit(func(s *lb.State) {
					for key := range s.Services {
						if key.Port == 80 {
							delete(s.Services, key)
						}
					}
					delete(s.VIPs, netip.MustParseAddr("192.0.2.10"))
					s.Sysctls[lb.SysctlExpireNodest] = "0"
					s.Rules.Policy = lb.RulePolicy{}
				})
			}},
			{"resync: sysctls and rules are re-read and repaired", base, nil},
			{"backend weight changed by hand", base, func(k *lbtest.Kernel) {
				k.Edit(func(s *lb.State) {
					for key, svc := range s.Services {
						if key.Port == 53 {
							d := svc.Dests[netip.MustParseAddrPort("10.0.0.53:53")]
							d.Weight = 7
							svc.Dests[d.Addr] = d
						}
					}
				})
			}},
		}},
		{"allow", lb.Options{}, []step{
			{"an open service and a nodeport service", allowed(``, ``), func(k *lbtest.Kernel) {
				k.SetHostAddrs("eth0", netip.MustParseAddr("198.51.100.1"))
			}},
			{"restrict both: sources first, then the restriction", allowed(`allow = ["10.0.0.0/8"]`, `allow = ["10.0.0.0/8"]`), nil},
			{"widen", allowed(`allow = ["10.0.0.0/8", "172.16.0.0/12"]`, `allow = ["10.0.0.0/8"]`), nil},
			{"narrow", allowed(`allow = ["172.16.0.0/12"]`, `allow = ["10.0.0.0/8"]`), nil},
			{"replace", allowed(`allow = ["192.168.1.7"]`, `allow = ["10.0.0.0/8"]`), nil},
			{"the host gains an address: the nodeport service is restricted there too", allowed(`allow = ["192.168.1.7"]`, `allow = ["10.0.0.0/8"]`), func(k *lbtest.Kernel) {
				k.SetHostAddrs("eth1", netip.MustParseAddr("203.0.113.1"))
			}},
			{"lift both: the restriction first, then the sources", allowed(``, ``), nil},
		}},
		{"nodeport-and-fwmark", lb.Options{}, []step{
			{"nodeport and fwmark services", nodePortAndMark, func(k *lbtest.Kernel) {
				k.SetHostAddrs("eth0", netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("fe80::1"))
				k.SetHostAddrs("lo", netip.MustParseAddr("127.0.0.1"))
				foreign(k)
			}},
			{"host gains an address", nodePortAndMark, func(k *lbtest.Kernel) {
				k.SetHostAddrs("eth1", netip.MustParseAddr("203.0.113.1"))
			}},
			{"both removed: the ledger says they are vipd's", "", nil},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			golden(t, "scenario-"+tt.name, runScenario(t, lbtest.New(), tt.opts, tt.steps))
		})
	}
}

// TestGoldenPlans plans every example from an empty kernel.
func TestGoldenPlans(t *testing.T) {
	files, err := filepath.Glob("../examples/*.toml")
	if err != nil || len(files) == 0 {
		t.Fatal("no examples", err)
	}
	host := lb.Host{Kernel: "6.1.0-27-cloud-amd64", Dummy: "vipd0", Addrs: map[string][]netip.Addr{
		"eth0": {netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8:1::1")},
		"eth1": {netip.MustParseAddr("203.0.113.1")},
	}}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".toml")
		t.Run(name, func(t *testing.T) {
			cfg, err := config.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for _, op := range lb.Plan(lb.Desired(&cfg.Spec, host), lb.NewState(), lb.PlanOptions{}) {
				fmt.Fprintln(&b, op)
			}
			golden(t, "plan-"+name, b.String())
		})
	}
}

// TestRestartChangesNothing checks adoption: a fresh reconciler (a
// restarted daemon) with the same config makes no kernel calls.
func TestRestartChangesNothing(t *testing.T) {
	k := lbtest.New()
	cfg := mustParse(t, base)
	opts := lb.Options{Kernel: k.Interface(), Dummy: "vipd0"}
	if _, err := lb.NewReconciler(opts).Reconcile(context.Background(), &cfg.Spec); err != nil {
		t.Fatal(err)
	}
	if len(k.Calls()) == 0 {
		t.Fatal("first pass made no calls")
	}
	res, err := lb.NewReconciler(opts).Reconcile(context.Background(), &cfg.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if calls := k.Calls(); len(calls) != 0 || len(res.Applied) != 0 {
		t.Fatalf("restart made calls %v", calls)
	}
}

// TestHoldOwned: a fresh reconciler (a restarted daemon) whose spec lacks
// services vipd owns (a source's, before it said what it wants) leaves
// them as they are, VIPs, set entries and announcements included, while
// the spec holds what it owns; without the hold it removes them.
func TestHoldOwned(t *testing.T) {
	k := lbtest.New()
	cfg := mustParse(t, base+`
[[service]]
name = "api"
vip = "192.0.2.11"
port = 443
backend = [{ address = "10.0.0.3" }]
`)
	opts := lb.Options{Kernel: k.Interface(), Dummy: "vipd0"}
	if _, err := lb.NewReconciler(opts).Reconcile(context.Background(), &cfg.Spec); err != nil {
		t.Fatal(err)
	}
	if calls := strings.Join(k.Calls(), "\n"); !strings.Contains(calls, "add-entry served/ipv4 192.0.2.11,tcp:443") ||
		!strings.Contains(calls, "bind 192.0.2.11") || !strings.Contains(calls, "announce 192.0.2.11") {
		t.Fatalf("the first pass did not program api's VIP, set entries and announcement:\n%s", calls)
	}
	before := k.Dump()
	fewer := cfg.Spec
	fewer.Services = fewer.Services[:1]
	fewer.HoldOwned = true
	if _, err := lb.NewReconciler(opts).Reconcile(context.Background(), &fewer); err != nil {
		t.Fatal(err)
	}
	if calls := k.Calls(); len(calls) != 0 || k.Dump() != before {
		t.Fatalf("held: calls %v; kernel:\n%s", calls, k.Dump())
	}
	fewer.HoldOwned = false
	if _, err := lb.NewReconciler(opts).Reconcile(context.Background(), &fewer); err != nil {
		t.Fatal(err)
	}
	removed := 0
	for _, c := range k.Calls() {
		if strings.HasPrefix(c, "delete-service") {
			removed++
		}
	}
	if want := len(cfg.Spec.Services) - 1; removed != want || want == 0 {
		t.Fatalf("without the hold: %d services removed, want %d", removed, want)
	}
}

// TestFailuresContinue checks that a failed operation neither stops the
// pass nor hides what was reached, and that a missing scheduler fails only
// its own service.
func TestFailuresContinue(t *testing.T) {
	k := lbtest.New()
	k.Unsupport("twos")
	boom := errors.New("boom")
	k.FailWith(func(call string) error {
		if call == "bind 192.0.2.12" {
			return boom
		}
		return nil
	})
	cfg := mustParse(t, base+`
[[service]]
name = "new-sched"
vip = "192.0.2.11"
port = 80
scheduler = "twos"
backend = [{ address = "10.0.0.4" }]

[[service]]
name = "unlucky"
vip = "192.0.2.12"
port = 80
backend = [{ address = "10.0.0.5" }]
`)
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0"})
	res, err := r.Reconcile(context.Background(), &cfg.Spec)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range res.Failed {
		fmt.Fprintf(&b, "failed: %s\n", f)
	}
	for _, op := range res.Skipped {
		fmt.Fprintf(&b, "skipped: %s\n", op)
	}
	if !errors.Is(res.Err(), boom) {
		t.Errorf("Err() = %v, want it to wrap the bind failure", res.Err())
	}
	b.WriteString("-- kernel\n")
	b.WriteString(k.Dump())
	// The failure clears: the next pass completes what is possible.
	k.FailWith(nil)
	res, err = r.Reconcile(context.Background(), &cfg.Spec)
	if err != nil {
		t.Fatal(err)
	}
	b.WriteString("-- second pass\n")
	for _, op := range res.Applied {
		fmt.Fprintf(&b, "applied: %s\n", op)
	}
	for _, f := range res.Failed {
		fmt.Fprintf(&b, "failed: %s\n", f)
	}
	golden(t, "failures", b.String())
}

// TestPlanOrder checks the documented order of operations on a plan that
// has every kind.
func TestPlanOrder(t *testing.T) {
	k := lbtest.New()
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0"})
	if _, err := r.Reconcile(context.Background(), &mustParse(t, base).Spec); err != nil {
		t.Fatal(err)
	}
	next := mustParse(t, strings.Replace(strings.Replace(base, "192.0.2.10\"\nport = 53", "192.0.2.20\"\nport = 53", 1),
		`scheduler = "rr"`, `scheduler = "lc"`, 1))
	ops, err := r.Plan(context.Background(), &next.Spec)
	if err != nil {
		t.Fatal(err)
	}
	last := lb.OpKind(0)
	for _, op := range ops {
		if op.Kind < last {
			t.Errorf("%s after a %s operation", op, last)
		}
		last = op.Kind
	}
	if len(ops) < 6 {
		t.Errorf("plan too short: %v", ops)
	}
}

func TestNoManagement(t *testing.T) {
	k := lbtest.New()
	cfg := mustParse(t, strings.Replace(base, "[daemon]\n", "[daemon]\nmanage_sysctls = false\nmanage_iptables = false\n", 1))
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0"})
	if _, err := r.Reconcile(context.Background(), &cfg.Spec); err != nil {
		t.Fatal(err)
	}
	dump := k.Dump()
	if strings.Contains(dump, "sysctl") || strings.Contains(dump, "chains") || strings.Contains(dump, "set ") {
		t.Errorf("unmanaged sysctls or rules touched:\n%s", dump)
	}
}

// TestAllPortsNotFiltered checks that a VIP with an all-ports service is
// left out of the filter sets, which match ports and would drop it all.
func TestAllPortsNotFiltered(t *testing.T) {
	cfg := mustParse(t, `
[[service]]
name = "all"
vip = "192.0.2.30"
port = 0
persistence = 60
backend = [{ address = "10.0.0.1", port = 0 }]

[[service]]
name = "web"
vip = "192.0.2.30"
port = 80
backend = [{ address = "10.0.0.1" }]

[[service]]
name = "other"
vip = "192.0.2.31"
port = 80
backend = [{ address = "10.0.0.1" }]
`)
	d := lb.Desired(&cfg.Spec, lb.Host{})
	for e := range d.Rules.Entries {
		if e.Addr == netip.MustParseAddr("192.0.2.30") {
			t.Errorf("all-ports VIP in filter set: %s", e)
		}
	}
	if _, ok := d.Rules.Entries[lb.SetEntry{Set: lb.SetVIPs, Addr: netip.MustParseAddr("192.0.2.31")}]; !ok {
		t.Error("other VIP missing from the filter set")
	}
}

// TestApplyBatches: IPVS changes reach the adapter as runs of one kind,
// and a service that fails (an unknown scheduler) skips its backends.
func TestApplyBatches(t *testing.T) {
	cfg := mustParse(t, base+`
[[service]]
name = "new-sched"
vip = "192.0.2.11"
port = 80
scheduler = "twos"
backend = [{ address = "10.0.0.4" }]
`)
	k := lbtest.New()
	k.Unsupport("twos")
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0"})
	res, err := r.Reconcile(context.Background(), &cfg.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed) != 1 || len(res.Skipped) != 1 || res.Skipped[0].Kind != lb.OpAddDest {
		t.Errorf("failed %v, skipped %v: want the twos service failed and its backend skipped", res.Failed, res.Skipped)
	}
	want := []string{"add-service 3", "add-backend 3"}
	if got := k.Batches(); !slices.Equal(got, want) {
		t.Errorf("batches = %q, want %q", got, want)
	}
}
