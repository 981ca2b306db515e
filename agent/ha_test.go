package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/conntrack"
	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// fakeElector is an election the test decides.
type fakeElector struct {
	mu         sync.Mutex
	opts       ElectorOptions
	priorities []uint8
	resigned   []string
	resumed    int
}

func (e *fakeElector) Run(ctx context.Context) error { <-ctx.Done(); return nil }

func (e *fakeElector) SetPriority(p uint8) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.priorities = append(e.priorities, p)
	return nil
}

func (e *fakeElector) Resign(ctx context.Context, reason string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.resigned = append(e.resigned, reason)
	return nil
}

func (e *fakeElector) Resume() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.resumed++
}

func (e *fakeElector) lastPriority() uint8 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.priorities) == 0 {
		return 0
	}
	return e.priorities[len(e.priorities)-1]
}

// haRig starts an agent with [ha] (plus extra settings) on services and
// a fake elector.
func haRig(t *testing.T, extra, services string) (*rig, *fakeElector) {
	t.Helper()
	e := &fakeElector{}
	r := newRigWith(t, haSection(extra)+services, func(o *Options) {
		o.OpenElector = func(opts ElectorOptions) (Elector, error) {
			e.opts = opts
			return e, nil
		}
	})
	return r, e
}

func haSection(extra string) string {
	return "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 51\npriority = 150\n" + extra + "\n"
}

func TestHARoles(t *testing.T) {
	r, e := haRig(t, "", services(3, 1))
	if got := e.opts.Addrs; !slices.Equal(got, []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("192.0.2.12")}) {
		t.Errorf("advertised %v, want the three VIPs", got)
	}
	if e.opts.StartAsMaster {
		t.Error("a first start started as master")
	}
	// A backup programs everything and announces nothing.
	r.has(t, "vip 192.0.2.10", "service tcp 192.0.2.10:80", "10.0.0.1:80 masq weight=1")
	r.hasNot(t, "announce ")
	r.k.Reads()
	r.k.Calls()
	e.opts.Report(RoleChange{Master: true, Reason: "master down timer expired", Cause: "test"})
	r.waitFor(t, []string{"announce 192.0.2.10", "announce 192.0.2.11", "announce 192.0.2.12"}, nil)
	if reads := r.k.Reads(); len(reads) != 0 {
		t.Errorf("taking over read IPVS: %v", reads)
	}
	for _, c := range r.k.Calls() {
		if !strings.HasPrefix(c, "announce ") {
			t.Errorf("taking over made %q", c)
		}
	}
	// Another master of lower priority: the master announces again.
	r.k.Calls()
	e.opts.Reassert("master 192.0.2.99 of priority 50 advertises too")
	waitCalls(t, r, "withdraw 192.0.2.10", "announce 192.0.2.10", "announce 192.0.2.12")
	// Full passes keep the role: a reload as master announces a new VIP.
	r.write(haSection("") + services(4, 1))
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	r.has(t, "announce 192.0.2.13")
	e.opts.Report(RoleChange{Master: false, Reason: "preempted", Cause: "test"})
	r.waitFor(t, []string{"vip 192.0.2.13"}, []string{"announce "})
	// A full pass as backup announces nothing either.
	if _, err := r.a.Reload(context.Background(), ReloadOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	r.hasNot(t, "announce ")
	// Stopping resigns.
	r.stop()
	<-r.done
	r.done <- nil
	if len(e.resigned) != 1 {
		t.Errorf("resigned %v, want once on stop", e.resigned)
	}
}

func TestHARestartAsMaster(t *testing.T) {
	r, e := haRig(t, "", services(1, 1))
	e.opts.Report(RoleChange{Master: true, Reason: "master down timer expired", Cause: "test"})
	r.waitFor(t, []string{"announce 192.0.2.10"}, nil)
	r.stop()
	<-r.done
	r.done <- nil
	r2 := r.restart(t)
	if !e.opts.StartAsMaster {
		t.Error("a master restarted with on_stop = \"keep\" did not start as master")
	}
	// Until the elector has listened and reports, nothing is announced.
	r2.has(t, "vip 192.0.2.10")
	r2.hasNot(t, "announce ")
	e.opts.Report(RoleChange{Master: true, Reason: "master when it stopped, and no master of higher priority spoke", Cause: "test"})
	r2.waitFor(t, []string{"announce 192.0.2.10"}, nil)
}

// TestHAFloating binds the floating addresses on every node and
// announces them with the VIPs on the master only; SNAT traffic comes
// from the SNAT address.
func TestHAFloating(t *testing.T) {
	extra := "addresses = [\"10.0.2.254\"]\nsnat_addresses = [\"10.0.3.99\"]"
	r, e := haRig(t, extra, services(1, 1))
	r.has(t, "vip 10.0.2.254", "vip 10.0.3.99", "snat-source=10.0.3.99")
	r.hasNot(t, "announce ")
	e.opts.Report(RoleChange{Master: true, Reason: "master down timer expired", Cause: "test"})
	r.waitFor(t, []string{"announce 10.0.2.254", "announce 10.0.3.99", "announce 192.0.2.10"}, nil)
	// A reload changes the floating addresses as it changes services.
	r.write(haSection("addresses = [\"10.0.2.253\"]") + services(1, 1))
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	r.has(t, "announce 10.0.2.253")
	r.hasNot(t, "10.0.2.254", "10.0.3.99", "snat-source")
	e.opts.Report(RoleChange{Master: false, Reason: "preempted", Cause: "test"})
	r.waitFor(t, []string{"vip 10.0.2.253"}, []string{"announce "})
}

func TestHATracking(t *testing.T) {
	r, e := haRig(t, "track_backends = true\ntrack_priority = 40\n", services(2, 1))
	if p := e.lastPriority(); p != 0 {
		t.Fatalf("priority set to %d with every backend serving", p)
	}
	// Every backend of s1 drained by hand: s1 cannot serve.
	ctx := context.Background()
	for _, b := range []string{"10.0.1.1:80", "10.0.1.2:80"} {
		if _, err := r.a.Drain(ctx, DrainOptions{Service: "s1", Backend: netip.MustParseAddrPort(b)}); err != nil {
			t.Fatal(err)
		}
	}
	if p := e.lastPriority(); p != 110 {
		t.Errorf("priority %d with a service that cannot serve, want 150 - 40", p)
	}
	if _, err := r.a.Undrain(ctx, DrainOptions{Service: "s1", Backend: netip.MustParseAddrPort("10.0.1.1:80")}); err != nil {
		t.Fatal(err)
	}
	if p := e.lastPriority(); p != 150 {
		t.Errorf("priority %d once the service serves again, want 150", p)
	}
}

func TestHATrackInterfaces(t *testing.T) {
	var mu sync.Mutex
	up := true
	e := &fakeElector{}
	newRigWith(t, haSection("track_interfaces = [\"eth1\"]")+services(1, 1), func(o *Options) {
		o.OpenElector = func(opts ElectorOptions) (Elector, error) { e.opts = opts; return e, nil }
		o.LinkUp = func(name string) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			switch name {
			case "eth0":
				return true, nil
			case "eth1":
				return up, nil
			}
			return false, fmt.Errorf("no interface %s", name)
		}
	})
	mu.Lock()
	up = false
	mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for e.lastPriority() != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("priority %d with eth1 down, want 150 - 50", e.lastPriority())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHAInterfaceDown takes the node out of the election while its [ha]
// interface is down, and puts it back when it is up, unless an operator
// drained it meanwhile.
func TestHAInterfaceDown(t *testing.T) {
	var mu sync.Mutex
	up := true
	set := func(v bool) { mu.Lock(); up = v; mu.Unlock() }
	e := &fakeElector{}
	r := newRigWith(t, haSection("")+services(1, 1), func(o *Options) {
		o.OpenElector = func(opts ElectorOptions) (Elector, error) { e.opts = opts; return e, nil }
		o.LinkUp = func(name string) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			if name != "eth0" {
				return false, fmt.Errorf("no interface %s", name)
			}
			return up, nil
		}
	})
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			e.mu.Lock()
			ok := cond()
			e.mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: resigned %q, resumed %d", what, e.resigned, e.resumed)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	set(false)
	wait("eth0 down", func() bool { return slices.Equal(e.resigned, []string{"interface eth0 down"}) })
	set(true)
	wait("eth0 up", func() bool { return e.resumed == 1 })
	// Drained while down: the interface coming back leaves it out.
	set(false)
	wait("eth0 down again", func() bool { return len(e.resigned) == 2 })
	if err := r.a.DrainNode(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	set(true)
	time.Sleep(1500 * time.Millisecond) // a check of the interface passes
	e.mu.Lock()
	resumed := e.resumed
	e.mu.Unlock()
	if resumed != 1 {
		t.Errorf("a drained node took part again when its interface came back (resumed %d)", resumed)
	}
	if err := r.a.DrainNode(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	wait("undrained", func() bool { return e.resumed == 2 })
}

func TestHAErrors(t *testing.T) {
	// No elector: a configuration with [ha] is refused.
	dir := t.TempDir()
	r := &rig{t: t, dir: dir, path: dir + "/vipd.toml"}
	r.write(haSection("") + services(1, 1))
	fake := func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
		return lbtest.New().Interface(), func() {}, nil
	}
	a := New(Options{Path: r.path, OpenKernel: fake})
	if err := a.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "this vipd has no elector") {
		t.Errorf("run without an elector: %v", err)
	}
	// Connection sync needs a kernel adapter that runs it.
	e := &fakeElector{}
	dir = t.TempDir()
	r = &rig{t: t, dir: dir, path: dir + "/vipd.toml"}
	r.write(haSection("sync_interface = \"eth0\"") + services(1, 1))
	a = New(Options{Path: r.path, OpenKernel: fake, OpenElector: func(o ElectorOptions) (Elector, error) { return e, nil }})
	if err := a.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "cannot run IPVS connection synchronization") {
		t.Errorf("run with sync on a fake kernel: %v", err)
	}
}

func TestHADrainNode(t *testing.T) {
	r, e := haRig(t, "", services(1, 1))
	ctx := context.Background()
	e.opts.Report(RoleChange{Master: true, Reason: "master down timer expired", Cause: "test"})
	r.waitFor(t, []string{"announce 192.0.2.10"}, nil)
	if err := r.a.DrainNode(ctx, true); err != nil {
		t.Fatal(err)
	}
	if len(e.resigned) != 1 || e.resigned[0] != "drained by the operator" {
		t.Errorf("resigned %v", e.resigned)
	}
	// The router reports leaving the master role; the VIPs go.
	e.opts.Report(RoleChange{Master: false, Reason: "resigned", Cause: "test"})
	r.waitFor(t, nil, []string{"announce "})
	if err := r.a.DrainNode(ctx, true); err == nil || !strings.Contains(err.Error(), "drained already") {
		t.Errorf("draining twice: %v", err)
	}
	st, err := r.a.Status(ctx)
	if err != nil || st.HA == nil || !st.HA.Drained || st.HA.Priority != 0 || st.HA.Role != "backup" || st.HA.Configured != 150 {
		t.Errorf("status %+v %v", st.HA, err)
	}
	// A drained node stays drained across a restart, and does not start
	// as master although it was one.
	r.stop()
	<-r.done
	r.done <- nil
	e.resigned = nil
	r2 := r.restart(t)
	if e.opts.StartAsMaster || len(e.resigned) != 1 {
		t.Errorf("restart of a drained node: start as master %v, resigned %v", e.opts.StartAsMaster, e.resigned)
	}
	if err := r2.a.DrainNode(ctx, false); err != nil {
		t.Fatal(err)
	}
	if e.resumed != 1 {
		t.Errorf("resumed %d times", e.resumed)
	}
	if st, _ := r2.a.Status(ctx); st.HA.Drained || st.HA.Priority != 150 {
		t.Errorf("status after undrain %+v", st.HA)
	}
	if err := r2.a.DrainNode(ctx, false); err == nil || !strings.Contains(err.Error(), "not drained") {
		t.Errorf("undraining twice: %v", err)
	}
}

func TestDrainNodeWithoutHA(t *testing.T) {
	r := newRig(t, services(1, 1))
	if err := r.a.DrainNode(context.Background(), true); err == nil || !strings.Contains(err.Error(), "no [ha] section") {
		t.Errorf("drain --node without [ha]: %v", err)
	}
}

// waitCalls waits until the fake kernel was called with each of want,
// in any order, since the last look.
func waitCalls(t *testing.T, r *rig, want ...string) {
	t.Helper()
	var seen []string
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		seen = append(seen, r.k.Calls()...)
		if !slices.ContainsFunc(want, func(w string) bool { return !slices.Contains(seen, w) }) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("calls %q, want %q among them", seen, want)
}

// fakeTracker is a kernel's IPVS connection table and connection
// tracking.
type fakeTracker struct {
	mu    sync.Mutex
	conns []ipvs.Connection
	// announced says whether the kernel announced a VIP before each
	// Track.
	announced func() bool
	tracked   [][]conntrack.Flow
	before    []bool
	// existing is what each Track was told to do with existing entries.
	existing []conntrack.Existing
	// slow is how long reading the table stalls after 256 connections.
	slow time.Duration
	// reads counts the readings of the table; readBefore says of each
	// whether it came before the VIPs were announced.
	reads      int
	readBefore []bool
}

// syncingIPVS is the fake kernel's IPVS with the connection
// synchronization daemons of a real one.
type syncingIPVS struct {
	lb.IPVS
	mu      sync.Mutex
	daemons []ipvs.SyncDaemon
}

func (s *syncingIPVS) StartSync(d ipvs.SyncDaemon) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.daemons = append(s.daemons, d)
	return nil
}

func (s *syncingIPVS) SyncDaemons() ([]ipvs.SyncDaemon, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.daemons), nil
}

// withSyncDaemons makes the kernel o opens one that runs connection
// synchronization, with running's daemons running already.
func withSyncDaemons(o *Options, running ...ipvs.SyncDaemon) {
	open := o.OpenKernel
	o.OpenKernel = func(cfg *config.Config, log *slog.Logger) (lb.Kernel, func(), error) {
		k, done, err := open(cfg, log)
		k.IPVS = &syncingIPVS{IPVS: k.IPVS, daemons: slices.Clone(running)}
		return k, done, err
	}
}

func (f *fakeTracker) Connections(fn func(ipvs.Connection) bool) error {
	f.mu.Lock()
	f.reads++
	if f.announced != nil {
		f.readBefore = append(f.readBefore, !f.announced())
	}
	conns := slices.Clone(f.conns)
	f.mu.Unlock()
	for i, c := range conns {
		if i == 256 {
			time.Sleep(f.slow)
		}
		if !fn(c) {
			break
		}
	}
	return nil
}

func (f *fakeTracker) Track(flows []conntrack.Flow, existing conntrack.Existing) (conntrack.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tracked = append(f.tracked, flows)
	f.existing = append(f.existing, existing)
	f.before = append(f.before, f.announced())
	return conntrack.Result{Created: len(flows)}, nil
}

// waitTracks waits, up to 5 s, until Track has been called n times.
func (f *fakeTracker) waitTracks(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		f.mu.Lock()
		got := len(f.tracked)
		f.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no tracking after the announcements")
		}
	}
}

// TestHATakesSNATConnectionsOver tracks the SNAT connections a peer
// synchronized as the node becomes master, before it announces the VIPs:
// only those of services whose traffic comes from the floating SNAT
// source, in a state with something to keep.
func TestHATakesSNATConnectionsOver(t *testing.T) {
	conn := func(proto lb.Proto, vip, state string) ipvs.Connection {
		return ipvs.Connection{Proto: proto, Client: netip.MustParseAddrPort("198.51.100.7:40000"), Virtual: netip.MustParseAddrPort(vip),
			Backend: netip.MustParseAddrPort("10.0.3.5:8080"), State: state, Expires: 900 * time.Second}
	}
	f := &fakeTracker{conns: []ipvs.Connection{
		conn(lb.TCP, "192.0.2.50:80", "ESTABLISHED"),
		conn(lb.TCP, "192.0.2.50:80", "TIME_WAIT"),
		conn(lb.UDP, "192.0.2.50:80", "UDP"),
		conn(lb.TCP, "192.0.2.10:80", "ESTABLISHED"),
		conn(lb.TCP, "192.0.2.50:443", "ESTABLISHED"),
	}}
	r, e := snatBackupRig(t, f, "snat_addresses = [\"10.0.3.99\"]\nsync_interface = \"eth0\"", services(1, 1))
	r.has(t, "snat-source=10.0.3.99")
	e.opts.Report(RoleChange{Master: true, Reason: "master down timer expired", Cause: "test"})
	r.waitFor(t, []string{"announce 192.0.2.50", "announce 10.0.3.99"}, nil)
	flow := func(c ipvs.Connection) conntrack.Flow {
		return conntrack.Flow{Proto: lb.TCP, Client: c.Client, Virtual: c.Virtual, Backend: c.Backend, Source: netip.MustParseAddr("10.0.3.99"),
			State: conntrack.TCPEstablished, Timeout: 900 * time.Second}
	}
	f.mu.Lock()
	if len(f.tracked) == 0 || !slices.Equal(f.tracked[0], []conntrack.Flow{flow(f.conns[0])}) {
		t.Errorf("tracked %+v, want first %+v", f.tracked, flow(f.conns[0]))
	}
	if len(f.before) > 0 && f.before[0] {
		t.Error("the node announced its VIPs before it tracked the SNAT connections")
	}
	// Before it announces, the node replaces its own leftover entries
	// with the peer's connections; once master, it keeps its own.
	if len(f.existing) == 0 || f.existing[0] != conntrack.Replace {
		t.Errorf("the takeover's tracking was told %v about existing entries, want Replace", f.existing)
	}
	// A connection whose synchronization arrives after the takeover is
	// tracked later.
	late := conn(lb.TCP, "192.0.2.50:80", "ESTABLISHED")
	late.Client = netip.MustParseAddrPort("198.51.100.8:40001")
	f.conns = append(f.conns, late)
	f.mu.Unlock()
	waitLog := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(r.log.String(), want); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log:\n%s", want, r.log.String())
			}
		}
	}
	waitLog(`SNAT connections taken over" tracked=1`)
	waitLog(`SNAT connections synchronized late taken over" tracked=2`)
	f.mu.Lock()
	if last := f.tracked[len(f.tracked)-1]; !slices.Contains(last, flow(late)) {
		t.Errorf("the late tracking has %+v, want %+v in it", last, flow(late))
	}
	if slices.Contains(f.existing[1:], conntrack.Replace) {
		t.Errorf("a late tracking replaced the master's own entries: %v", f.existing)
	}
	f.mu.Unlock()
	rec := httptest.NewRecorder()
	r.a.Metrics().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	// Three at least: one before the announcement, two in the late pass
	// that logged (a later pass may have come since).
	line := grepLines(rec.Body.String(), `vipd_ha_snat_connections_total{result="tracked"}`)
	if n, err := strconv.Atoi(strings.TrimSpace(line[strings.LastIndex(line, " ")+1:])); err != nil || n < 3 {
		t.Errorf("metrics:\n%s", grepLines(rec.Body.String(), "vipd_ha_snat"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// TestHASNATTakeoverWithoutSync: a node to which no peer synchronizes
// connections reads no connection table as it takes over (its own
// connections are tracked already): the announcements wait for nothing.
// A backup sync daemon vipd did not start counts as synchronization.
func TestHASNATTakeoverWithoutSync(t *testing.T) {
	for _, tc := range []struct {
		name    string
		running []ipvs.SyncDaemon
		reads   bool
	}{
		{"no daemon", nil, false},
		{"a master daemon only", []ipvs.SyncDaemon{{State: ipvs.SyncMaster, Interface: "eth0", SyncID: 51}}, false},
		{"a backup daemon vipd did not start", []ipvs.SyncDaemon{{State: ipvs.SyncBackup, Interface: "eth0", SyncID: 51}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTracker{conns: []ipvs.Connection{{Proto: lb.TCP, Client: netip.MustParseAddrPort("198.51.100.7:40000"),
				Virtual: netip.MustParseAddrPort("192.0.2.50:80"), Backend: netip.MustParseAddrPort("10.0.3.5:8080"), State: "ESTABLISHED", Expires: time.Minute}}}
			r, e := snatBackupRig(t, f, "snat_addresses = [\"10.0.3.99\"]", "", tc.running...)
			r.has(t, "snat-source=10.0.3.99")
			e.opts.Report(RoleChange{Master: true, Reason: "master down timer expired", Cause: "test"})
			r.waitFor(t, []string{"announce 192.0.2.50", "announce 10.0.3.99"}, nil)
			// The late passes start 100 ms after the takeover.
			time.Sleep(300 * time.Millisecond)
			f.mu.Lock()
			reads := f.reads
			f.mu.Unlock()
			if got := reads > 0; got != tc.reads {
				t.Errorf("the takeover read the connection table %d times, want reads %v", reads, tc.reads)
			}
			const found = "an IPVS backup sync daemon runs that vipd did not start"
			if got := strings.Contains(r.log.String(), found); got != tc.reads {
				t.Errorf("log has %q: %v, want %v:\n%s", found, got, tc.reads, r.log.String())
			}
		})
	}
}

// TestHATakeoverBoundsSNATTracking: a connection table too long to read
// within the budget before the announcement is read in part, and the
// rest is tracked right after it.
func TestHATakeoverBoundsSNATTracking(t *testing.T) {
	f := &fakeTracker{slow: 2 * adoptBudget}
	for i := range 600 {
		f.conns = append(f.conns, ipvs.Connection{Proto: lb.TCP, Client: netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), uint16(10000+i)),
			Virtual: netip.MustParseAddrPort("192.0.2.50:80"), Backend: netip.MustParseAddrPort("10.0.3.5:8080"), State: "ESTABLISHED", Expires: time.Minute})
	}
	r, e := snatBackupRig(t, f, "snat_addresses = [\"10.0.3.99\"]\nsync_interface = \"eth0\"", "")
	e.opts.Report(RoleChange{Master: true, Reason: "master down timer expired", Cause: "test"})
	r.waitFor(t, []string{"announce 192.0.2.50"}, nil)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		f.mu.Lock()
		n := len(f.tracked)
		var first, second int
		if n >= 2 {
			first, second = len(f.tracked[0]), len(f.tracked[1])
		}
		f.mu.Unlock()
		if n >= 2 {
			if first >= 600 || second != 600 {
				t.Fatalf("tracked %d, then %d connections; want part of the 600 before the announcement, then all", first, second)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tracked %d times, want twice", n)
		}
	}
}

// carrierElector is a fakeElector that watches its interface itself, as
// the VRRP router does.
type carrierElector struct{ *fakeElector }

func (carrierElector) WatchesCarrier() bool { return true }

// TestHAInterfaceDownElectorWatches: an elector that watches its
// interface itself is neither resigned nor resumed as the interface goes
// down and up (a resignation would hold its return until the main loop's
// Resume); the node's status still says the interface is down. Undrained
// while its interface is down, it is resumed: it takes part again once
// the interface is back, by itself.
func TestHAInterfaceDownElectorWatches(t *testing.T) {
	var mu sync.Mutex
	up := true
	set := func(v bool) { mu.Lock(); up = v; mu.Unlock() }
	e := &fakeElector{}
	r := newRigWith(t, haSection("")+services(1, 1), func(o *Options) {
		o.OpenElector = func(opts ElectorOptions) (Elector, error) { e.opts = opts; return carrierElector{e}, nil }
		o.LinkUp = func(name string) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return up, nil
		}
	})
	faultIs := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			var fault bool
			r.a.do(context.Background(), func(context.Context) { fault = r.a.ha.fault })
			if fault == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("fault %v, want %v", fault, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	set(false)
	faultIs(true)
	set(true)
	faultIs(false)
	set(false)
	faultIs(true)
	if err := r.a.DrainNode(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if err := r.a.DrainNode(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !slices.Equal(e.resigned, []string{"drained by the operator"}) || e.resumed != 1 {
		t.Errorf("resigned %q, resumed %d; want only the drain's resignation and the undrain's resumption", e.resigned, e.resumed)
	}
}

// TestHASNATPrereadOnSuspicion: a backup whose master the elector
// suspects reads and tracks the synchronized SNAT connections then,
// replacing the entries it holds, and the takeover by the master down
// timer that follows announces without reading the table or tracking;
// it reads it right after, for what came since, keeping the entries. A
// takeover for another cause reads the table and tracks first.
func TestHASNATPrereadOnSuspicion(t *testing.T) {
	conn := func(port uint16) ipvs.Connection {
		return ipvs.Connection{Proto: lb.TCP, Client: netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), port), Virtual: netip.MustParseAddrPort("192.0.2.50:80"),
			Backend: netip.MustParseAddrPort("10.0.3.5:8080"), State: "ESTABLISHED", Expires: 900 * time.Second}
	}
	for _, tc := range []struct {
		name       string
		masterDown bool
		// readsBefore is how many readings of the table come before
		// the announcements: the suspicion's, and the takeover's own.
		readsBefore int
	}{
		{"master down", true, 1},
		{"preempting", false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTracker{conns: []ipvs.Connection{conn(40000)}}
			r, e := suspectedSNATRig(t, f)
			// Synchronized after the read: the pass after the
			// announcements takes it.
			f.mu.Lock()
			f.conns = append(f.conns, conn(40001))
			f.mu.Unlock()
			e.opts.Report(RoleChange{Master: true, Reason: "test", Cause: "test", MasterDown: tc.masterDown})
			r.waitFor(t, []string{"announce 192.0.2.50"}, nil)
			// The Tracks: the suspicion's; the takeover's own before
			// the announcements, when it could not take the
			// suspicion's; the pass after them.
			want := 2
			if !tc.masterDown {
				want = 3
			}
			f.waitTracks(t, want)
			f.mu.Lock()
			defer f.mu.Unlock()
			before := 0
			for _, b := range f.readBefore {
				if b {
					before++
				}
			}
			if before != tc.readsBefore {
				t.Errorf("%d readings of the table before the announcements, want %d (%v)", before, tc.readsBefore, f.readBefore)
			}
			// Later passes (100 ms on) may follow.
			if len(f.tracked) < want || !f.before[want-1] || f.before[want-2] {
				t.Fatalf("%d Tracks, want %d, the last of them after the announcements (announced before each: %v)", len(f.tracked), want, f.before)
			}
			suspected := []conntrack.Flow{{Proto: lb.TCP, Client: conn(40000).Client, Virtual: conn(40000).Virtual, Backend: conn(40000).Backend,
				Source: netip.MustParseAddr("10.0.3.99"), State: conntrack.TCPEstablished, Timeout: 900 * time.Second}}
			if !slices.Equal(f.tracked[0], suspected) || f.existing[0] != conntrack.Replace || f.before[0] {
				t.Errorf("on suspicion tracked %+v (%v, announced before: %v), want %+v, replacing, before the announcements", f.tracked[0], f.existing[0], f.before[0], suspected)
			}
			if !tc.masterDown && (len(f.tracked[1]) != 2 || f.existing[1] != conntrack.Replace || f.before[1]) {
				t.Errorf("the takeover tracked %+v (%v, announced before: %v), want both connections, replacing, before the announcements", f.tracked[1], f.existing[1], f.before[1])
			}
			last := want - 1
			if len(f.tracked[last]) != 2 || f.existing[last] != conntrack.Keep || !f.before[last] {
				t.Errorf("the pass after the announcements tracked %+v (%v, announced before: %v), want both connections, keeping", f.tracked[last], f.existing[last], f.before[last])
			}
		})
	}
}

// TestHASNATTakeoverWaitsForSuspicionRead: a takeover by the master down
// timer that comes while the suspicion's read of the connection table
// still runs waits for it, and takes its tracking, instead of reading
// the table again beside it.
func TestHASNATTakeoverWaitsForSuspicionRead(t *testing.T) {
	var conns []ipvs.Connection
	for port := range uint16(300) {
		conns = append(conns, ipvs.Connection{Proto: lb.TCP, Client: netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), 40000+port),
			Virtual: netip.MustParseAddrPort("192.0.2.50:80"), Backend: netip.MustParseAddrPort("10.0.3.5:8080"), State: "ESTABLISHED", Expires: 900 * time.Second})
	}
	// The read stalls 50 ms after 256 connections: the takeover comes
	// in the middle of it.
	f := &fakeTracker{conns: conns, slow: 50 * time.Millisecond}
	r, e := suspectedSNATRig(t, f)
	e.opts.Report(RoleChange{Master: true, Reason: "test", Cause: "test", MasterDown: true})
	r.waitFor(t, []string{"announce 192.0.2.50"}, nil)
	f.waitTracks(t, 2)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.readBefore[0] != true || len(f.readBefore) < 2 || f.readBefore[1] {
		t.Errorf("readings of the table before the announcements: %v, want only the suspicion's", f.readBefore)
	}
	if len(f.tracked[0]) != 300 || f.existing[0] != conntrack.Replace || f.before[0] || !f.before[1] {
		t.Errorf("tracked %d connections (%v) first, announced before each Track: %v; want the suspicion's 300, replacing, then the pass after the announcements", len(f.tracked[0]), f.existing[0], f.before)
	}
}

// oneArmSNAT is a one-arm service whose traffic comes from the floating
// SNAT source.
const oneArmSNAT = "[[service]]\nname = \"one-arm\"\nvip = \"192.0.2.50\"\nport = 80\nsnat = true\nforward = \"masq\"\nbackend = [{ address = \"10.0.3.5:8080\" }]\n"

// snatBackupRig runs a node of an [ha] section with ha's keys, the
// services of more and oneArmSNAT, whose connections f tracks, whose
// kernel runs connection synchronization (with running's daemons
// running already), and whose elector is the returned fake.
func snatBackupRig(t *testing.T, f *fakeTracker, ha, more string, running ...ipvs.SyncDaemon) (*rig, *fakeElector) {
	t.Helper()
	e := &fakeElector{}
	r := newRigWith(t, haSection(ha)+more+oneArmSNAT, func(o *Options) {
		o.OpenElector = func(opts ElectorOptions) (Elector, error) {
			e.opts = opts
			return e, nil
		}
		o.ConnTracker = f
		withSyncDaemons(o, running...)
	})
	f.announced = func() bool { return strings.Contains(r.k.Dump(), "announce ") }
	return r, e
}

// suspectedSNATRig runs a synchronized SNAT backup on f, makes its
// elector suspect the master, and waits for the suspicion's read of the
// connection table to begin.
func suspectedSNATRig(t *testing.T, f *fakeTracker) (*rig, *fakeElector) {
	t.Helper()
	r, e := snatBackupRig(t, f, "snat_addresses = [\"10.0.3.99\"]\nsync_interface = \"eth0\"", "")
	r.has(t, "snat-source=10.0.3.99")
	if e.opts.Suspect == nil {
		t.Fatal("the elector was given no Suspect")
	}
	e.opts.Suspect("no advertisement from master 10.0.3.21 for 2 intervals")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		f.mu.Lock()
		reads := f.reads
		f.mu.Unlock()
		if reads == 1 {
			return r, e
		}
		if time.Now().After(deadline) {
			t.Fatal("the suspicion read no table")
		}
	}
}
