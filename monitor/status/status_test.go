package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
)

var update = flag.Bool("update", false, "rewrite golden files")

// golden compares got with testdata/name.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
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
		t.Fatalf("%v (run go test ./monitor/status -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from golden file (go test ./monitor/status -update rewrites it)\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func key(s string, proto lb.Proto) lb.ServiceKey {
	a := ap(s)
	return lb.ServiceKey{Family: lb.FamilyOf(a.Addr()), Proto: proto, Addr: a.Addr(), Port: a.Port()}
}

func dest(addr string, weight int, fwd lb.Forward) lb.Destination {
	return lb.Destination{Addr: ap(addr), Weight: weight, Forward: fwd}
}

// observed returns the kernel state of spec as vipd programs it, owned,
// with traffic on every backend.
func observed(spec *lb.Spec) *lb.State {
	st := lb.NewState()
	for _, vs := range spec.Services {
		if vs.NodePort {
			continue
		}
		k := vs.Service.Key
		ss := &lb.ServiceState{Service: vs.Service, Dests: map[netip.AddrPort]lb.Destination{}}
		for i, d := range vs.Backends {
			d.ActiveConns, d.InactiveConns = uint32(10*(i+1)), uint32(100*(i+1))
			dst := traffic(uint64(i + 1))
			d.Stats = &dst
			ss.Dests[d.Addr] = d
			ss.Stats = add(ss.Stats, dst)
		}
		st.Services[k] = ss
		st.Owned[k] = struct{}{}
		if vs.VIP.IsValid() {
			st.VIPs[vs.VIP] = struct{}{}
		}
	}
	return st
}

func traffic(n uint64) lb.Stats {
	return lb.Stats{
		Conns: 12345 * n, InPkts: 1_000_000 * n, OutPkts: 2_000_000 * n, InBytes: 150_000_000 * n, OutBytes: 2_400_000_000 * n,
		CPS: 3 * n, InPPS: 200 * n, OutPPS: 400 * n, InBPS: 30_000 * n, OutBPS: 1_200_000 * n,
	}
}

func add(a, b lb.Stats) lb.Stats {
	return lb.Stats{
		Conns: a.Conns + b.Conns, InPkts: a.InPkts + b.InPkts, OutPkts: a.OutPkts + b.OutPkts,
		InBytes: a.InBytes + b.InBytes, OutBytes: a.OutBytes + b.OutBytes,
		CPS: a.CPS + b.CPS, InPPS: a.InPPS + b.InPPS, OutPPS: a.OutPPS + b.OutPPS,
		InBPS: a.InBPS + b.InBPS, OutBPS: a.OutBPS + b.OutBPS,
	}
}

func web() lb.VirtualService {
	return lb.VirtualService{
		Name:    "web",
		VIP:     netip.MustParseAddr("192.0.2.10"),
		Service: lb.Service{Key: key("192.0.2.10:80", lb.TCP), Scheduler: "wrr"},
		Backends: []lb.Destination{
			dest("10.0.0.1:8080", 100, lb.Masq),
			dest("10.0.0.2:8080", 50, lb.Masq),
		},
	}
}

func dns() lb.VirtualService {
	return lb.VirtualService{
		Name:     "dns",
		VIP:      netip.MustParseAddr("192.0.2.53"),
		Service:  lb.Service{Key: key("192.0.2.53:53", lb.UDP), Scheduler: "rr"},
		Backends: []lb.Destination{dest("10.0.1.1:53", 1, lb.DirectRoute), dest("10.0.1.2:53", 1, lb.DirectRoute)},
	}
}

func up(since time.Duration) health.Status {
	return health.Status{State: health.Up, Since: now.Add(-since)}
}

func down(since time.Duration, err string) health.Status {
	return health.Status{State: health.Down, Since: now.Add(-since), Err: errors.New(err)}
}

// scenarios are the snapshots the golden tests render.
func scenarios() map[string]Options {
	out := map[string]Options{}

	// healthy: every backend up and programmed; a foreign service.
	spec := &lb.Spec{Services: []lb.VirtualService{web()}}
	obs := observed(spec)
	obs.Services[key("198.51.100.1:25", lb.TCP)] = &lb.ServiceState{Service: lb.Service{Key: key("198.51.100.1:25", lb.TCP), Scheduler: "rr"}}
	out["healthy"] = Options{Spec: spec, Observed: obs, Now: now, Health: HealthMap{"web": {
		ap("10.0.0.1:8080"): up(3*24*time.Hour + 2*time.Hour),
		ap("10.0.0.2:8080"): up(42 * time.Second),
	}}}

	// backend-down: a failed check quiesced the second backend.
	spec = &lb.Spec{Services: []lb.VirtualService{web()}}
	obs = observed(spec)
	setWeight(obs, key("192.0.2.10:80", lb.TCP), "10.0.0.2:8080", 0)
	out["backend-down"] = Options{Spec: spec, Observed: obs, Now: now, Health: HealthMap{"web": {
		ap("10.0.0.1:8080"): up(time.Hour),
		ap("10.0.0.2:8080"): down(5*time.Minute+12*time.Second, "dial tcp 10.0.0.2:8080: connect: connection refused"),
	}}}

	// all-down: every check fails and the service fails open.
	spec = &lb.Spec{Services: []lb.VirtualService{web()}}
	out["all-down"] = Options{Spec: spec, Observed: observed(spec), Now: now, Health: HealthMap{"web": {
		ap("10.0.0.1:8080"): down(time.Minute, "http 503"),
		ap("10.0.0.2:8080"): down(2*time.Minute, "timed out after 1s:\ncontext deadline exceeded"),
	}}}

	// admin-drained: an operator drained a backend everywhere; health
	// checks are off.
	spec = &lb.Spec{Services: []lb.VirtualService{web(), dns()}}
	obs = observed(spec)
	setWeight(obs, key("192.0.2.10:80", lb.TCP), "10.0.0.1:8080", 0)
	out["admin-drained"] = Options{Spec: spec, Observed: obs, Now: now,
		Drained: map[Ref]struct{}{{Backend: ap("10.0.0.1:8080")}: {}, {Service: "dns", Backend: ap("10.0.1.2:53")}: {}}}

	// missing: one service is not in the kernel.
	spec = &lb.Spec{Services: []lb.VirtualService{web(), dns()}}
	obs = observed(spec)
	delete(obs.Services, key("192.0.2.53:53", lb.UDP))
	out["missing"] = Options{Spec: spec, Observed: obs, Now: now}

	// removed: services no longer configured, one draining
	// (drain_services) and one the next pass deletes.
	spec = &lb.Spec{Services: []lb.VirtualService{web()}}
	obs = observed(&lb.Spec{Services: []lb.VirtualService{web(), dns()}})
	dk := key("192.0.2.53:53", lb.UDP)
	setWeight(obs, dk, "10.0.1.1:53", 0)
	setWeight(obs, dk, "10.0.1.2:53", 0)
	old := key("192.0.2.99:80", lb.TCP)
	obs.Services[old] = &lb.ServiceState{Service: lb.Service{Key: old, Scheduler: "rr"},
		Dests: map[netip.AddrPort]lb.Destination{ap("10.0.0.5:80"): dest("10.0.0.5:80", 1, lb.Masq)}}
	obs.Owned[old] = struct{}{}
	out["removed"] = Options{Spec: spec, Observed: obs, Now: now}

	// draining: a backend removed from the configuration drains at
	// weight 0 with connections left.
	spec = &lb.Spec{Services: []lb.VirtualService{web()}}
	obs = observed(spec)
	gone := dest("10.0.0.9:8080", 0, lb.Masq)
	goneStats := traffic(1)
	gone.ActiveConns, gone.InactiveConns, gone.Stats = 5, 1, &goneStats
	obs.Services[key("192.0.2.10:80", lb.TCP)].Dests[gone.Addr] = gone
	out["draining"] = Options{Spec: spec, Observed: obs, Now: now}

	// drift: the kernel was changed behind vipd's back; the sorry
	// backend of another service is in use.
	spec = &lb.Spec{Services: []lb.VirtualService{web(), dns()}}
	obs = observed(spec)
	k := key("192.0.2.10:80", lb.TCP)
	obs.Services[k].Scheduler = "rr"
	setWeight(obs, k, "10.0.0.1:8080", 5)
	obs.Services[k].Dests[ap("10.0.0.7:8080")] = dest("10.0.0.7:8080", 1, lb.Masq)
	d := obs.Services[k].Dests[ap("10.0.0.2:8080")]
	d.Forward, d.Upper = lb.DirectRoute, 100
	obs.Services[k].Dests[d.Addr] = d
	setWeight(obs, dk, "10.0.1.1:53", 0)
	setWeight(obs, dk, "10.0.1.2:53", 0)
	obs.Services[dk].Dests[ap("10.0.9.9:53")] = dest("10.0.9.9:53", 1, lb.DirectRoute)
	out["drift"] = Options{Spec: spec, Observed: obs, Now: now,
		Sorry: map[string]netip.AddrPort{"dns": ap("10.0.9.9:53")},
		Health: HealthMap{"dns": {
			ap("10.0.1.1:53"): down(time.Hour, "no answer"),
			ap("10.0.1.2:53"): down(time.Hour, "no answer"),
		}}}

	// ipv6: a persistent source-hash service with direct routing.
	spec = &lb.Spec{Services: []lb.VirtualService{{
		Name: "api6",
		VIP:  netip.MustParseAddr("2001:db8::10"),
		Service: lb.Service{Key: key("[2001:db8::10]:443", lb.TCP), Scheduler: "sh", Flags: lb.SHPort,
			Persistent: 300, Netmask: 64},
		Backends: []lb.Destination{dest("[2001:db8:1::1]:443", 1, lb.DirectRoute), dest("[2001:db8:1::2]:443", 1, lb.DirectRoute)},
	}}}
	out["ipv6"] = Options{Spec: spec, Observed: observed(spec), Now: now, Health: HealthMap{"api6": {
		ap("[2001:db8:1::1]:443"): up(26 * time.Hour),
	}}}

	// fwmark: the same mark in both families, tunnelled and mixed.
	tun := dest("10.0.2.1:0", 1, lb.Tunnel)
	tun.Tunnel, tun.TunnelPort = lb.GUE, 6080
	spec = &lb.Spec{Services: []lb.VirtualService{
		{
			Name:     "marked",
			Service:  lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, FWMark: 7}, Scheduler: "mh", Flags: lb.MHFallback | lb.MHPort},
			Backends: []lb.Destination{tun, dest("10.0.2.2:0", 1, lb.DirectRoute)},
		},
		{
			Name:     "marked6",
			Service:  lb.Service{Key: lb.ServiceKey{Family: lb.IPv6, FWMark: 7}, Scheduler: "rr", OnePacket: true},
			Backends: []lb.Destination{dest("[2001:db8:2::1]:0", 1, lb.DirectRoute)},
		},
	}}
	out["fwmark"] = Options{Spec: spec, Observed: observed(spec), Now: now}

	// nodeport: one service per host address; a foreign service on
	// another port.
	spec = &lb.Spec{Services: []lb.VirtualService{{
		Name:     "np",
		NodePort: true,
		SNAT:     true,
		Service:  lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Port: 30080}, Scheduler: "rr"},
		Backends: []lb.Destination{dest("10.0.3.1:80", 1, lb.Masq)},
	}, {
		Name:     "np-gone",
		NodePort: true,
		Service:  lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Port: 30090}, Scheduler: "rr"},
		Backends: []lb.Destination{dest("10.0.3.1:90", 1, lb.Masq)},
	}}}
	obs = lb.NewState()
	for _, a := range []string{"203.0.113.2:30080", "198.51.100.2:30080", "198.51.100.2:30081"} {
		k := key(a, lb.TCP)
		b := dest("10.0.3.1:80", 1, lb.Masq)
		bs := traffic(2)
		b.Stats = &bs
		obs.Services[k] = &lb.ServiceState{Service: lb.Service{Key: k, Scheduler: "rr"},
			Dests: map[netip.AddrPort]lb.Destination{b.Addr: b}, Stats: traffic(2)}
		if k.Port == 30080 {
			obs.Owned[k] = struct{}{}
		}
	}
	out["nodeport"] = Options{Spec: spec, Observed: obs, Now: now}

	out["empty"] = Options{Now: now}
	return out
}

func setWeight(st *lb.State, k lb.ServiceKey, addr string, w int) {
	d := st.Services[k].Dests[ap(addr)]
	d.Weight = w
	st.Services[k].Dests[d.Addr] = d
}

func TestGolden(t *testing.T) {
	for name, opts := range scenarios() {
		t.Run(name, func(t *testing.T) {
			snap := Build(opts)
			var table, js bytes.Buffer
			if err := RenderTable(&table, snap); err != nil {
				t.Fatal(err)
			}
			if err := RenderJSON(&js, snap); err != nil {
				t.Fatal(err)
			}
			golden(t, name+".txt", table.String())
			golden(t, name+".json", js.String())

			// Scripts and "vipd status" decode what the daemon sends.
			var back Snapshot
			if err := json.Unmarshal(js.Bytes(), &back); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(&back, snap) {
				t.Errorf("JSON does not round-trip:\n got %+v\nwant %+v", back, *snap)
			}
		})
	}
}

func TestStates(t *testing.T) {
	want := map[string][]State{
		"healthy":       {OK},
		"backend-down":  {Degraded},
		"all-down":      {Down},
		"admin-drained": {OK, OK},
		"missing":       {OK, Missing},
		"removed":       {OK},
		"draining":      {OK},
		"drift":         {Degraded, Degraded},
		"ipv6":          {OK},
		"fwmark":        {OK, OK},
		"nodeport":      {OK, OK, Missing},
		"empty":         nil,
	}
	for name, opts := range scenarios() {
		var got []State
		for _, s := range Build(opts).Services {
			got = append(got, s.State)
		}
		if !reflect.DeepEqual(got, want[name]) {
			t.Errorf("%s: states %v, want %v", name, got, want[name])
		}
	}
}

func TestReasons(t *testing.T) {
	type br struct {
		addr   string
		reason Reason
	}
	want := map[string][]br{
		"backend-down":  {{"10.0.0.1:8080", ""}, {"10.0.0.2:8080", HealthDown}},
		"all-down":      {{"10.0.0.1:8080", ""}, {"10.0.0.2:8080", ""}},
		"admin-drained": {{"10.0.0.1:8080", AdminDrain}, {"10.0.0.2:8080", ""}, {"10.0.1.1:53", ""}, {"10.0.1.2:53", ""}},
		"draining":      {{"10.0.0.1:8080", ""}, {"10.0.0.2:8080", ""}, {"10.0.0.9:8080", Draining}},
		"drift": {{"10.0.0.1:8080", Drift}, {"10.0.0.2:8080", Drift}, {"10.0.0.7:8080", Drift},
			{"10.0.1.1:53", HealthDown}, {"10.0.1.2:53", HealthDown}, {"10.0.9.9:53", Sorry}},
	}
	for name, w := range want {
		var got []br
		for _, s := range Build(scenarios()[name]).Services {
			for _, b := range s.Backends {
				got = append(got, br{b.Address.String(), b.Reason})
			}
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%s: reasons %v, want %v", name, got, w)
		}
	}
}

func TestCounts(t *testing.T) {
	for _, tc := range []struct {
		name                       string
		draining, removed, foreign int
	}{
		{"healthy", 0, 0, 1},
		{"missing", 0, 0, 0},
		{"removed", 2, 2, 0},
		{"draining", 1, 0, 0},
		{"nodeport", 0, 0, 1},
	} {
		s := Build(scenarios()[tc.name])
		if s.Draining != tc.draining || len(s.Removed) != tc.removed || s.Foreign != tc.foreign {
			t.Errorf("%s: draining %d, removed %d, foreign %d; want %d, %d, %d", tc.name,
				s.Draining, len(s.Removed), s.Foreign, tc.draining, tc.removed, tc.foreign)
		}
	}
	for _, s := range Build(scenarios()["removed"]).Removed {
		if s.Name != "" || s.State != Removed {
			t.Errorf("removed service %s: name %q, state %s", s.Key, s.Name, s.State)
		}
	}
}

func TestBuildNil(t *testing.T) {
	s := Build(Options{Spec: &lb.Spec{Services: []lb.VirtualService{web()}}})
	if s.Time.IsZero() {
		t.Error("zero Now did not default to the current time")
	}
	if len(s.Services) != 1 || s.Services[0].State != Missing {
		t.Errorf("nil Observed: %+v, want web missing", s.Services)
	}
}

func TestSI(t *testing.T) {
	for v, want := range map[uint64]string{
		0: "0", 999: "999", 1000: "1.00k", 1234: "1.23k", 9994: "9.99k", 9995: "10.0k", 12345: "12.3k",
		99949: "99.9k", 99950: "100k", 999_499: "999k", 999_500: "1.00M", 2_400_000_000: "2.40G",
		1 << 63: "9.22E", 1<<64 - 1: "18.4E", 1_005_000: "1.00M", 1_999_999: "2.00M", 45_649_999: "45.6M",
	} {
		if got := si(v, ""); got != want {
			t.Errorf("si(%d) = %q, want %q", v, got, want)
		}
	}
}

func TestAgo(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 0: "0s", 42*time.Second + 900*time.Millisecond: "42s", 5*time.Minute + 2*time.Second: "5m02s",
		3*time.Hour + 4*time.Minute: "3h04m", 50 * time.Hour: "2d02h",
	} {
		if got := ago(d); got != want {
			t.Errorf("ago(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestRenderHAAndSources(t *testing.T) {
	snap := Build(Options{Now: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)})
	snap.HA = &HA{Role: "backup", VRID: 51, Priority: 0, Configured: 150, Drained: true,
		Master: "10.0.3.22", Since: time.Date(2026, 12, 3, 11, 59, 0, 0, time.UTC), Reason: "drained by the operator"}
	snap.Sources = []Source{{Name: "kubernetes", Services: 3}, {Name: "other", Error: "connection refused"}}
	var b strings.Builder
	if err := RenderTable(&b, snap); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ha: backup of vrid 51 since 2026-12-03T11:59:00Z (drained by the operator), priority 0 (configured 150), master 10.0.3.22, drained (vipd undrain --node puts it back)\n",
		"source kubernetes: 3 services, in step\n",
		"source other: 0 services, out of step, its last services keep serving: connection refused\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in\n%s", want, b.String())
		}
	}
	var j strings.Builder
	if err := RenderJSON(&j, snap); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(j.String(), `"ha": {`) || !strings.Contains(j.String(), `"configured_priority": 150`) {
		t.Errorf("json without ha:\n%s", j.String())
	}
}

func TestRenderBGP(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	snap := Build(Options{Now: now})
	snap.BGP = &BGP{ASN: 65001, RouterID: "10.0.0.1", Announced: []string{"192.0.2.10/32"},
		Peers: []BGPPeer{
			{Address: "10.0.0.254", ASN: 65000, State: "established", Since: now.Add(-5*time.Minute - 2*time.Second), Routes: 1,
				BFD: &BFD{State: "up", RemoteState: "up", Since: now.Add(-5*time.Minute - time.Second), Downs: 2, LastDown: "control detection time expired",
					TxInterval: 200, RxInterval: 100, DetectMult: 3, RemoteDetectMult: 5, DetectionTime: 500, Received: 3012, Sent: 1510,
					Dropped: BFDDropped{TTL: 1, Malformed: 3}}},
			{Address: "fd00::fe", ASN: 65000, State: "active", BFD: &BFD{State: "down", RemoteState: "down", Since: now.Add(-42 * time.Second),
				TxInterval: 1000, DetectMult: 3}},
			{Address: "10.0.0.253", ASN: 65002, State: "idle", Limited: now.Add(-30 * time.Second)},
		},
		Withheld: []BGPWithheld{{Route: "192.0.2.11/32", Reason: "no backend serves"}}}
	var b strings.Builder
	if err := RenderTable(&b, snap); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"bgp: AS65001 router id 10.0.0.1, 1 VIPs announced, 1 withheld\n",
		"bgp peer 10.0.0.254 AS65000: established for 5m02s, 1 routes, bfd up\n" +
			"bgp peer 10.0.0.254 bfd: up for 5m01s, remote up, tx 200ms, rx 100ms, multiplier 3 (remote 5), detection 500ms, 2 downs (last: control detection time expired), packets 3012 received, 1510 sent, 4 dropped (ttl 1, malformed 3, discriminator 0)\n",
		"bgp peer fd00::fe AS65000: active, 0 routes, bfd down\n" +
			"bgp peer fd00::fe bfd: down for 42s, remote down, tx 1s, rx 0s, multiplier 3 (remote 0), detection 0s, 0 downs, packets 0 received, 0 sent, 0 dropped\n",
		"bgp peer 10.0.0.253 AS65002: idle, 0 routes, cut 30s ago for sending more than max_prefixes\n",
		"bgp withheld 192.0.2.11/32: no backend serves\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in\n%s", want, b.String())
		}
	}
	var j strings.Builder
	if err := RenderJSON(&j, snap); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"bgp": {`, `"router_id": "10.0.0.1"`, `"state": "established"`, `"reason": "no backend serves"`, `"max_prefixes_exceeded": "2026-12-03T11:59:30Z"`,
		`"bfd": {`, `"remote_state": "up"`, `"last_down": "control detection time expired"`, `"tx_interval_ms": 200`, `"detection_time_ms": 500`,
		`"packets_received": 3012`, `"packets_dropped": {`, `"malformed": 3`} {
		if !strings.Contains(j.String(), want) {
			t.Errorf("json without %s:\n%s", want, j.String())
		}
	}
	if strings.Contains(j.String(), `"since": "0001`) {
		t.Errorf("json with a zero since:\n%s", j.String())
	}
	// A peer without BFD has no bfd line nor key; the JSON reads back.
	if strings.Count(j.String(), `"bfd": {`) != 2 || strings.Contains(b.String(), "bgp peer 10.0.0.253 bfd") || strings.Contains(b.String(), "max_prefixes, bfd") {
		t.Errorf("bfd of a peer without one:\n%s\n%s", b.String(), j.String())
	}
	var back Snapshot
	if err := json.Unmarshal([]byte(j.String()), &back); err != nil {
		t.Fatal(err)
	}
	if got := back.BGP.Peers[0].BFD; got == nil || *got != *snap.BGP.Peers[0].BFD {
		t.Errorf("bfd read back %+v, want %+v", got, snap.BGP.Peers[0].BFD)
	}
}
