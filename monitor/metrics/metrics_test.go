package metrics

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/monitor/status"
)

var update = flag.Bool("update", false, "rewrite golden files")

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func key(s string, proto lb.Proto) lb.ServiceKey {
	a := ap(s)
	return lb.ServiceKey{Family: lb.FamilyOf(a.Addr()), Proto: proto, Addr: a.Addr(), Port: a.Port()}
}

func dest(addr string, weight int, active uint32, n uint64) lb.Destination {
	return lb.Destination{
		Addr: ap(addr), Weight: weight, Forward: lb.Masq, ActiveConns: active, InactiveConns: 2 * active,
		Stats: &lb.Stats{Conns: 100 * n, InPkts: 1000 * n, OutPkts: 2000 * n, InBytes: 150_000 * n, OutBytes: 2_400_000 * n},
	}
}

// fakeStatus is a snapshot with a service in every state and a backend
// of every kind: up, down, unchecked, draining after removal, missing.
func fakeStatus() *status.Snapshot {
	spec := &lb.Spec{Services: []lb.VirtualService{
		{
			Name:    "web",
			VIP:     netip.MustParseAddr("192.0.2.10"),
			Service: lb.Service{Key: key("192.0.2.10:80", lb.TCP), Scheduler: "wrr"},
			Backends: []lb.Destination{
				{Addr: ap("10.0.0.1:8080"), Weight: 100, Forward: lb.Masq},
				{Addr: ap("10.0.0.2:8080"), Weight: 50, Forward: lb.Masq},
				{Addr: ap("10.0.0.3:8080"), Weight: 10, Forward: lb.Masq},
			},
		},
		{
			Name:     "api6",
			VIP:      netip.MustParseAddr("2001:db8::10"),
			Service:  lb.Service{Key: key("[2001:db8::10]:443", lb.TCP), Scheduler: "rr"},
			Backends: []lb.Destination{{Addr: ap("[2001:db8:1::1]:443"), Weight: 1, Forward: lb.DirectRoute}},
		},
		{
			Name:     "marked",
			Service:  lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, FWMark: 7}, Scheduler: "rr"},
			Backends: []lb.Destination{{Addr: ap("10.0.2.1:0"), Weight: 1, Forward: lb.DirectRoute}},
		},
		{
			Name:     "np",
			NodePort: true,
			Service:  lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Port: 30080}, Scheduler: "rr"},
			Backends: []lb.Destination{{Addr: ap("10.0.3.1:80"), Weight: 1, Forward: lb.Masq}},
		},
	}}
	obs := lb.NewState()
	web := key("192.0.2.10:80", lb.TCP)
	obs.Services[web] = &lb.ServiceState{
		Service: spec.Services[0].Service,
		Dests: map[netip.AddrPort]lb.Destination{
			ap("10.0.0.1:8080"): dest("10.0.0.1:8080", 100, 10, 1),
			ap("10.0.0.2:8080"): dest("10.0.0.2:8080", 0, 3, 2),
			ap("10.0.0.9:8080"): dest("10.0.0.9:8080", 0, 1, 3),
		},
		Stats: lb.Stats{Conns: 600, InPkts: 6000, OutPkts: 12000, InBytes: 900_000, OutBytes: 14_400_000},
	}
	api := key("[2001:db8::10]:443", lb.TCP)
	d := dest("[2001:db8:1::1]:443", 1, 4, 4)
	d.Forward = lb.DirectRoute
	obs.Services[api] = &lb.ServiceState{Service: spec.Services[1].Service,
		Dests: map[netip.AddrPort]lb.Destination{d.Addr: d}, Stats: *d.Stats}
	for _, a := range []string{"198.51.100.2:30080", "203.0.113.2:30080"} {
		k := key(a, lb.TCP)
		d := dest("10.0.3.1:80", 1, 0, 1)
		obs.Services[k] = &lb.ServiceState{Service: lb.Service{Key: k, Scheduler: "rr"},
			Dests: map[netip.AddrPort]lb.Destination{d.Addr: d}, Stats: *d.Stats}
		obs.Owned[k] = struct{}{}
	}
	foreign := key("198.51.100.1:25", lb.TCP)
	obs.Services[foreign] = &lb.ServiceState{Service: lb.Service{Key: foreign, Scheduler: "rr"}}
	obs.Owned[web], obs.Owned[api] = struct{}{}, struct{}{}
	snap := status.Build(status.Options{
		Spec: spec, Observed: obs, Now: now,
		Health: status.HealthMap{
			"web": {
				ap("10.0.0.1:8080"): {State: health.Up, Since: now.Add(-time.Hour)},
				ap("10.0.0.2:8080"): {State: health.Down, Since: now.Add(-time.Minute), Err: errors.New("refused")},
			},
			"np": {ap("10.0.3.1:80"): {State: health.Up, Since: now.Add(-time.Hour)}},
		},
	})
	snap.BGP = fakeBGP()
	return snap
}

// fakeBGP is a node's BGP with three peers: two with a BFD session, one
// up and one down, and one without.
func fakeBGP() *status.BGP {
	return &status.BGP{ASN: 65001, RouterID: "10.0.0.1", Peers: []status.BGPPeer{
		{Address: "fd00::fe", ASN: 65000, State: "active", BFD: &status.BFD{State: "down", RemoteState: "down", Downs: 3,
			LastDown: "control detection time expired", Received: 900, Sent: 1000, Dropped: status.BFDDropped{TTL: 2}}},
		{Address: "10.0.0.254", ASN: 65000, State: "established", BFD: &status.BFD{State: "up", RemoteState: "up", Downs: 1,
			Received: 12345, Sent: 12000, Dropped: status.BFDDropped{Malformed: 1, Discriminator: 4}}},
		{Address: "10.0.0.253", ASN: 65002, State: "established"},
	}}
}

func fixed(s *status.Snapshot) func() (*status.Snapshot, error) {
	return func() (*status.Snapshot, error) { return s, nil }
}

// golden compares the exposition of c with testdata/name, and rewrites
// it with -update.
func golden(t *testing.T, c prometheus.Collector, name string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		// Not testutil.CollectAndFormat: without metric names it
		// formats none.
		mfs, err := gatherer(c).Gather()
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if err := enc.Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		got := buf.Bytes()
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (run go test ./monitor/metrics -update to create it)", err)
	}
	defer f.Close()
	if err := testutil.CollectAndCompare(c, f); err != nil {
		t.Errorf("%s: %v (go test ./monitor/metrics -update rewrites it)", path, err)
	}
}

// lint fails the test on any lint problem of c's metrics.
func lint(t *testing.T, name string, c prometheus.Collector) {
	t.Helper()
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s: %s", name, p.Metric, p.Text)
	}
}

func TestStatusGolden(t *testing.T) {
	golden(t, newStatusCollector(fixed(fakeStatus()), nil), "status.prom")
}

func TestStatusReadAtScrape(t *testing.T) {
	snap := fakeStatus()
	c := newStatusCollector(func() (*status.Snapshot, error) { return snap, nil }, nil)
	want := `
# HELP vipd_foreign_services IPVS services vipd does not own.
# TYPE vipd_foreign_services gauge
vipd_foreign_services %d
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(fmt.Sprintf(want, 1)), "vipd_foreign_services"); err != nil {
		t.Error(err)
	}
	snap = &status.Snapshot{Foreign: 3}
	if err := testutil.CollectAndCompare(c, strings.NewReader(fmt.Sprintf(want, 3)), "vipd_foreign_services"); err != nil {
		t.Errorf("after the kernel changed: %v", err)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestStatusError(t *testing.T) {
	c := newStatusCollector(func() (*status.Snapshot, error) { return nil, errors.New("netlink: no such file") }, nil)
	c.log = discard()
	want := `
# HELP vipd_status_errors_total Scrapes that could not read the status of vipd's services, and so lack their metrics.
# TYPE vipd_status_errors_total counter
vipd_status_errors_total 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c); n != 1 {
		t.Errorf("%d series after a failed read, want only the error count", n)
	}
}

func TestAnnouncerCollector(t *testing.T) {
	stats := AnnouncerStats{Announcements: 12, Replies: 340, Errors: 1}
	c := announcerCollector(func() AnnouncerStats { return stats })
	want := `
# HELP vipd_arp_replies_sent_total ARP replies and solicited IPv6 neighbour advertisements sent for VIPs.
# TYPE vipd_arp_replies_sent_total counter
vipd_arp_replies_sent_total 340
# HELP vipd_arp_send_errors_total ARP and neighbour discovery packets for VIPs that could not be sent.
# TYPE vipd_arp_send_errors_total counter
vipd_arp_send_errors_total 1
# HELP vipd_garp_sent_total Gratuitous ARP packets and unsolicited IPv6 neighbour advertisements sent for VIPs.
# TYPE vipd_garp_sent_total counter
vipd_garp_sent_total 12
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	stats.Announcements = 15
	if err := testutil.CollectAndCompare(c, strings.NewReader(strings.Replace(want, "total 12", "total 15", 1))); err != nil {
		t.Errorf("not read at scrape time: %v", err)
	}
}

func TestHealthCollector(t *testing.T) {
	c := healthCollector(func() health.Stats {
		s := health.Stats{Checks: 3, Backends: 5, Probes: 1000, Failures: 7, Transitions: 2, InFlight: 1}
		s.Lateness.Counts[0] = 990 // at most 100µs late
		s.Lateness.Counts[5] = 8   // at most 5ms
		s.Lateness.Counts[14] = 2  // above 2.5s
		s.Lateness.Sum = 6.5
		return s
	})
	want := `
# HELP vipd_health_check_lateness_seconds How late health probes started: the time from a probe's due time to its start.
# TYPE vipd_health_check_lateness_seconds histogram
vipd_health_check_lateness_seconds_bucket{le="0.0001"} 990
vipd_health_check_lateness_seconds_bucket{le="0.00025"} 990
vipd_health_check_lateness_seconds_bucket{le="0.0005"} 990
vipd_health_check_lateness_seconds_bucket{le="0.001"} 990
vipd_health_check_lateness_seconds_bucket{le="0.0025"} 990
vipd_health_check_lateness_seconds_bucket{le="0.005"} 998
vipd_health_check_lateness_seconds_bucket{le="0.01"} 998
vipd_health_check_lateness_seconds_bucket{le="0.025"} 998
vipd_health_check_lateness_seconds_bucket{le="0.05"} 998
vipd_health_check_lateness_seconds_bucket{le="0.1"} 998
vipd_health_check_lateness_seconds_bucket{le="0.25"} 998
vipd_health_check_lateness_seconds_bucket{le="0.5"} 998
vipd_health_check_lateness_seconds_bucket{le="1"} 998
vipd_health_check_lateness_seconds_bucket{le="2.5"} 998
vipd_health_check_lateness_seconds_bucket{le="+Inf"} 1000
vipd_health_check_lateness_seconds_sum 6.5
vipd_health_check_lateness_seconds_count 1000
# HELP vipd_health_checked_backends Backends of services with at least one health check.
# TYPE vipd_health_checked_backends gauge
vipd_health_checked_backends 5
# HELP vipd_health_checks Distinct health checks running; backends with the same check share one.
# TYPE vipd_health_checks gauge
vipd_health_checks 3
# HELP vipd_health_probe_failures_total Health probes that failed.
# TYPE vipd_health_probe_failures_total counter
vipd_health_probe_failures_total 7
# HELP vipd_health_probes_in_flight Health probes running or waiting for a free slot.
# TYPE vipd_health_probes_in_flight gauge
vipd_health_probes_in_flight 1
# HELP vipd_health_probes_total Health probes completed.
# TYPE vipd_health_probes_total counter
vipd_health_probes_total 1000
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// newTest returns Metrics with every provider set and a clock at now.
func newTest() *Metrics {
	return New(Options{
		Version:   "1.2.3",
		Status:    fixed(fakeStatus()),
		Announcer: func() AnnouncerStats { return AnnouncerStats{Announcements: 3} },
		Health:    func() health.Stats { return health.Stats{Checks: 1} },
		Now:       func() time.Time { return now },
		NoRuntime: true,
	})
}

func TestLint(t *testing.T) {
	m := New(Options{
		Version:   "1.2.3",
		Status:    fixed(fakeStatus()),
		Announcer: func() AnnouncerStats { return AnnouncerStats{Announcements: 3} },
		Health:    func() health.Stats { return health.Stats{Checks: 1} },
		Now:       func() time.Time { return now },
	})
	// Give every vector a child, so that each family is linted.
	m.Pass("start", &lb.Result{Applied: []lb.Op{{Kind: lb.OpSetSysctl, Host: &lb.HostChange{Sysctl: lb.SysctlVSConntrack, Value: "1"}}}}, time.Millisecond)
	m.HealthTransition(health.Transition{Service: "web", Backend: ap("10.0.0.2:8080"), State: health.Down})
	m.ConfigLoaded(1, &lb.Spec{})
	m.ReloadFailed(ReloadGuard)
	m.Watch(false)

	for name, c := range map[string]prometheus.Collector{
		"passes": m.passes, "operations": m.ops, "errors": m.passErrors, "duration": m.duration,
		"last success": m.lastSuccess, "generation": m.generation, "last reload": m.lastReload,
		"reload failures": m.reloadFailures, "stale": m.stale, "transitions": m.transitions, "drift": m.drift,
		"rejected": m.rejected, "watch up": m.watchUp, "watch failures": m.watchFailures,
		"status":    newStatusCollector(fixed(fakeStatus()), nil),
		"announcer": announcerCollector(func() AnnouncerStats { return AnnouncerStats{} }),
		"health":    healthCollector(func() health.Stats { return health.Stats{} }),
	} {
		lint(t, name, c)
	}
	// And everything the handler serves, the runtime's metrics included.
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("registry: %s: %s", p.Metric, p.Text)
	}
}

func TestPass(t *testing.T) {
	m := newTest()
	svc := lb.Service{Key: key("192.0.2.10:80", lb.TCP), Scheduler: "rr"}
	res := &lb.Result{
		Applied: []lb.Op{{Kind: lb.OpBindVIP}, {Kind: lb.OpAddService, Service: svc}, {Kind: lb.OpAddDest}, {Kind: lb.OpAddDest}},
		Failed:  []*lb.OpError{{Op: lb.Op{Kind: lb.OpAddService}, Err: errors.New("no ip_vs_twos")}},
		Skipped: []lb.Op{{Kind: lb.OpAddDest}},
	}
	m.Pass("start", res, 3*time.Millisecond)
	m.Pass("resync", &lb.Result{}, 200*time.Microsecond)
	m.Pass("resync", nil, 40*time.Second)

	for _, tc := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.passes.WithLabelValues("start"), 1},
		{m.passes.WithLabelValues("resync"), 2},
		{m.ops.WithLabelValues("bind-vip", "applied"), 1},
		{m.ops.WithLabelValues("add-service", "applied"), 1},
		{m.ops.WithLabelValues("add-service", "failed"), 1},
		{m.ops.WithLabelValues("add-backend", "applied"), 2},
		{m.ops.WithLabelValues("add-backend", "skipped"), 1},
		{m.ops.WithLabelValues("delete-service", "applied"), 0},
		{m.passErrors, 2},
		{m.lastSuccess, float64(now.Unix())},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%s = %v, want %v", desc(tc.c), got, tc.want)
		}
	}
	// Every kind and result is exported from the start, at zero.
	if n := testutil.CollectAndCount(m.ops); n != 16*3 {
		t.Errorf("%d operation series, want 48", n)
	}
	want := `
# HELP vipd_reconcile_duration_seconds Time a reconcile pass took: observe, plan and apply.
# TYPE vipd_reconcile_duration_seconds histogram
vipd_reconcile_duration_seconds_bucket{le="0.0001"} 0
vipd_reconcile_duration_seconds_bucket{le="0.00025"} 1
vipd_reconcile_duration_seconds_bucket{le="0.0005"} 1
vipd_reconcile_duration_seconds_bucket{le="0.001"} 1
vipd_reconcile_duration_seconds_bucket{le="0.0025"} 1
vipd_reconcile_duration_seconds_bucket{le="0.005"} 2
vipd_reconcile_duration_seconds_bucket{le="0.01"} 2
vipd_reconcile_duration_seconds_bucket{le="0.025"} 2
vipd_reconcile_duration_seconds_bucket{le="0.05"} 2
vipd_reconcile_duration_seconds_bucket{le="0.1"} 2
vipd_reconcile_duration_seconds_bucket{le="0.25"} 2
vipd_reconcile_duration_seconds_bucket{le="0.5"} 2
vipd_reconcile_duration_seconds_bucket{le="1"} 2
vipd_reconcile_duration_seconds_bucket{le="2.5"} 2
vipd_reconcile_duration_seconds_bucket{le="5"} 2
vipd_reconcile_duration_seconds_bucket{le="10"} 2
vipd_reconcile_duration_seconds_bucket{le="30"} 2
vipd_reconcile_duration_seconds_bucket{le="60"} 3
vipd_reconcile_duration_seconds_bucket{le="+Inf"} 3
vipd_reconcile_duration_seconds_sum 40.0032
vipd_reconcile_duration_seconds_count 3
`
	if err := testutil.CollectAndCompare(m.duration, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func desc(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc, 1)
	c.Describe(ch)
	return (<-ch).String()
}

func TestSysctlDrift(t *testing.T) {
	m := newTest()
	set := func(path, value string) *lb.Result {
		return &lb.Result{Applied: []lb.Op{{Kind: lb.OpSetSysctl, Host: &lb.HostChange{Sysctl: path, Value: value}}}}
	}
	drift := func(name string) float64 { return testutil.ToFloat64(m.drift.WithLabelValues(name)) }

	m.Pass("start", set(lb.SysctlExpireNodest, "1"), 0)
	if n := testutil.CollectAndCount(m.drift); n != 1 || drift("net.ipv4.vs.expire_nodest_conn") != 0 {
		t.Fatalf("first set: %d series, drift %v; want one series at 0", n, drift("net.ipv4.vs.expire_nodest_conn"))
	}
	m.Pass("resync", &lb.Result{}, 0)
	m.Pass("resync", set(lb.SysctlExpireNodest, "1"), 0)
	m.Pass("resync", set(lb.SysctlExpireNodest, "1"), 0)
	if got := drift("net.ipv4.vs.expire_nodest_conn"); got != 2 {
		t.Errorf("after two repairs: drift %v, want 2", got)
	}
	// A sysctl that becomes wanted on a reload is set for the first time.
	m.Pass("reload", set(lb.SysctlVSConntrack, "1"), 0)
	// A failed set is no repair.
	m.Pass("resync", &lb.Result{Failed: []*lb.OpError{{Op: lb.Op{Kind: lb.OpSetSysctl, Host: &lb.HostChange{Sysctl: lb.SysctlVSConntrack, Value: "1"}}}}}, 0)
	// A new wanted value is no drift either.
	m.Pass("reload", set(lb.SysctlConnReuseMode, "0"), 0)
	m.Pass("reload", set(lb.SysctlConnReuseMode, "1"), 0)
	want := `
# HELP vipd_sysctl_drift_total Times a pass had to set a sysctl again to the value vipd had already set it to.
# TYPE vipd_sysctl_drift_total counter
vipd_sysctl_drift_total{sysctl="net.ipv4.vs.conn_reuse_mode"} 0
vipd_sysctl_drift_total{sysctl="net.ipv4.vs.conntrack"} 0
vipd_sysctl_drift_total{sysctl="net.ipv4.vs.expire_nodest_conn"} 2
`
	if err := testutil.CollectAndCompare(m.drift, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestConfig(t *testing.T) {
	m := newTest()
	names := []string{"vipd_config_generation", "vipd_config_last_reload_success_timestamp_seconds",
		"vipd_config_reload_failures_total", "vipd_config_stale"}
	expo := func(gen, ts, invalid, guard, apply, stale string) string {
		return `
# HELP vipd_config_generation Generation of the running configuration: 1 at start, one more with each configuration that takes effect.
# TYPE vipd_config_generation gauge
vipd_config_generation ` + gen + `
# HELP vipd_config_last_reload_success_timestamp_seconds When the running configuration took effect, as a Unix time.
# TYPE vipd_config_last_reload_success_timestamp_seconds gauge
vipd_config_last_reload_success_timestamp_seconds ` + ts + `
# HELP vipd_config_reload_failures_total Reloads that did not take effect, by reason: invalid file, refused by the reload guard, or failed to apply and rolled back.
# TYPE vipd_config_reload_failures_total counter
vipd_config_reload_failures_total{reason="apply"} ` + apply + `
vipd_config_reload_failures_total{reason="guard"} ` + guard + `
vipd_config_reload_failures_total{reason="invalid"} ` + invalid + `
# HELP vipd_config_stale 1 while the configuration file differs from the running configuration because its last reload failed, 0 once a configuration takes effect.
# TYPE vipd_config_stale gauge
vipd_config_stale ` + stale + `
`
	}
	check := func(step, want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
			t.Errorf("%s: %v", step, err)
		}
	}
	check("new", expo("0", "0", "0", "0", "0", "0"))
	m.ConfigLoaded(1, &lb.Spec{})
	start := fmt.Sprint(now.Unix())
	check("start", expo("1", start, "0", "0", "0", "0"))
	m.ReloadFailed(ReloadInvalid)
	m.ReloadFailed(ReloadInvalid)
	m.ReloadFailed(ReloadGuard)
	check("bad reloads", expo("1", start, "2", "1", "0", "1"))
	now = now.Add(time.Minute)
	defer func() { now = now.Add(-time.Minute) }()
	m.ConfigLoaded(2, &lb.Spec{})
	later := fmt.Sprint(now.Unix())
	check("good reload", expo("2", later, "2", "1", "0", "0"))
	m.ReloadFailed(ReloadApply)
	check("rolled back", expo("2", later, "2", "1", "1", "1"))
}

func TestHealthTransitions(t *testing.T) {
	m := newTest()
	web := func(addr string) lb.Destination { return lb.Destination{Addr: ap(addr), Weight: 1} }
	spec := &lb.Spec{Services: []lb.VirtualService{{Name: "web", Backends: []lb.Destination{web("10.0.0.1:80"), web("10.0.0.2:80")}}}}
	m.ConfigLoaded(1, spec)
	for _, tr := range []health.Transition{
		{Service: "web", Backend: ap("10.0.0.1:80"), State: health.Down},
		{Service: "web", Backend: ap("10.0.0.1:80"), State: health.Up},
		{Service: "web", Backend: ap("10.0.0.1:80"), State: health.Down},
		{Service: "web", Backend: ap("10.0.0.2:80"), State: health.Down},
	} {
		m.HealthTransition(tr)
	}
	want := `
# HELP vipd_health_transitions_total Health transitions of backends, by the state they went to.
# TYPE vipd_health_transitions_total counter
vipd_health_transitions_total{backend="10.0.0.1:80",service="web",to="down"} 2
vipd_health_transitions_total{backend="10.0.0.1:80",service="web",to="up"} 1
`
	full := want + `vipd_health_transitions_total{backend="10.0.0.2:80",service="web",to="down"} 1
`
	if err := testutil.CollectAndCompare(m.transitions, strings.NewReader(full)); err != nil {
		t.Error(err)
	}
	// A reload that removes a backend drops its series.
	spec.Services[0].Backends = spec.Services[0].Backends[:1]
	m.ConfigLoaded(2, spec)
	if err := testutil.CollectAndCompare(m.transitions, strings.NewReader(want)); err != nil {
		t.Errorf("after removing 10.0.0.2:80: %v", err)
	}
}

func TestHandler(t *testing.T) {
	m := New(Options{
		Version: "1.2.3",
		Status:  func() (*status.Snapshot, error) { return nil, errors.New("netlink: timeout") },
		Logger:  discard(),
	})
	m.Pass("start", &lb.Result{}, time.Millisecond)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s:\n%s", resp.Status, body)
	}
	for _, want := range []string{
		`vipd_build_info{version="1.2.3"} 1`,
		`vipd_reconcile_passes_total{why="start"} 1`,
		`vipd_status_errors_total 1`,
		`go_goroutines `,
		`process_start_time_seconds `,
		`promhttp_metric_handler_requests_total{code="200"} 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(string(body), "vipd_service_state") {
		t.Error("/metrics has service metrics although the status could not be read")
	}
}

func TestNoProviders(t *testing.T) {
	m := New(Options{NoRuntime: true})
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		n := mf.GetName()
		if strings.HasPrefix(n, "vipd_service_") || strings.HasPrefix(n, "vipd_backend_") ||
			strings.HasPrefix(n, "vipd_arp_") || strings.HasPrefix(n, "vipd_garp_") || strings.HasPrefix(n, "go_") {
			t.Errorf("%s exported without its provider", n)
		}
	}
}

func gatherer(c prometheus.Collector) prometheus.Gatherer {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	return reg
}

// TestWatchAndRejected: the watch metrics appear with the first report
// of the watch's state and count its failures; rejections count by
// server.
func TestWatchAndRejected(t *testing.T) {
	m := newTest()
	if n, err := testutil.GatherAndCount(m.Registry(), "vipd_config_watch_up", "vipd_config_watch_failures_total"); err != nil || n != 0 {
		t.Fatalf("watch metrics before any report: %d series, %v; want none", n, err)
	}
	m.Watch(true)
	m.Watch(false)
	m.Watch(true)
	m.Watch(false)
	m.Rejected(ServerMetrics)
	m.Rejected(ServerMetrics)
	m.Rejected(ServerControl)
	want := `
# HELP vipd_config_watch_failures_total Times watching the configuration files failed: a watched directory removed or renamed, or inotify out of resources.
# TYPE vipd_config_watch_failures_total counter
vipd_config_watch_failures_total 2
# HELP vipd_config_watch_up 1 while vipd watches its configuration files for changes, 0 while watching has failed and is being retried (SIGHUP and vipd reload still reload).
# TYPE vipd_config_watch_up gauge
vipd_config_watch_up 0
# HELP vipd_http_requests_rejected_total Requests the control socket or the metrics endpoint refused at once (503) because as many as it serves at a time were in progress, by server.
# TYPE vipd_http_requests_rejected_total counter
vipd_http_requests_rejected_total{server="control"} 1
vipd_http_requests_rejected_total{server="metrics"} 2
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"vipd_config_watch_up", "vipd_config_watch_failures_total", "vipd_http_requests_rejected_total"); err != nil {
		t.Error(err)
	}
}
