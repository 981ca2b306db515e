package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/monitor/status"
)

// fakeAnnouncer is a BGP speaker that records what it is asked.
type fakeAnnouncer struct {
	mu      sync.Mutex
	opts    AnnouncerOptions
	routes  map[netip.Prefix]config.BGPAttrs
	sets    int
	retired int
	// stopped counts Stop calls; atStop is the kernel's dump when the
	// first came.
	stopped int
	atStop  string
	dump    func() string
}

func (f *fakeAnnouncer) Set(routes map[netip.Prefix]config.BGPAttrs) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes = maps.Clone(routes)
	f.sets++
	return nil
}

func (f *fakeAnnouncer) Retire(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retired++
	f.routes = nil
	return nil
}

func (f *fakeAnnouncer) Stop(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped == 0 && f.dump != nil {
		f.atStop = f.dump()
	}
	f.stopped++
	f.routes = nil
	return nil
}

func (f *fakeAnnouncer) Peers() []BGPPeer {
	return []BGPPeer{{Address: netip.MustParseAddr("10.0.0.254"), ASN: 65000, State: "established", Established: true, Routes: len(f.announced()),
		BFD: &status.BFD{State: "up", RemoteState: "up", TxInterval: 200, Received: 7}}}
}

// announced returns the routes announced, sorted, as "prefix attrs".
func (f *fakeAnnouncer) announced() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range slices.SortedFunc(maps.Keys(f.routes), netip.Prefix.Compare) {
		a := f.routes[p]
		s := p.String()
		if len(a.Communities) > 0 {
			s += fmt.Sprintf(" communities=%v", a.Communities)
		}
		if a.HasMED {
			s += fmt.Sprintf(" med=%d", a.MED)
		}
		out = append(out, s)
	}
	return out
}

// waitRoutes waits until the announced routes are want.
func (f *fakeAnnouncer) waitRoutes(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := f.announced()
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("announced %q, want %q", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const bgpSection = `[bgp]
asn = 65001
router_id = "10.0.0.1"
med = 5
[[bgp.peer]]
address = "10.0.0.254"
asn = 65000
[bgp.service.s1]
communities = ["65000:1"]
`

// bgpRig starts an agent with [bgp] (daemon settings first, in extra)
// on services and a fake announcer.
func bgpRig(t *testing.T, extra, services string) (*rig, *fakeAnnouncer) {
	t.Helper()
	f := &fakeAnnouncer{}
	r := newRigWith(t, extra+bgpSection+services, func(o *Options) {
		o.OpenAnnouncer = func(_ context.Context, opts AnnouncerOptions) (Announcer, error) {
			f.opts = opts
			return f, nil
		}
	})
	f.mu.Lock()
	f.dump = r.k.Dump
	f.mu.Unlock()
	return r, f
}

// TestBGPAnnounce: every VIP with a backend that serves is announced,
// with the section's attributes or its service's; a VIP whose backends
// are all drained is withdrawn, and announced again when one comes back.
func TestBGPAnnounce(t *testing.T) {
	r, f := bgpRig(t, "", services(3, 1))
	if f.opts.BGP.ASN != 65001 || len(f.opts.BGP.Peers) != 1 {
		t.Errorf("announcer opened with %+v", f.opts.BGP)
	}
	f.waitRoutes(t, "192.0.2.10/32 med=5", "192.0.2.11/32 communities=[4259840001] med=5", "192.0.2.12/32 med=5")
	// Every node binds and serves every VIP.
	r.has(t, "vip 192.0.2.10", "vip 192.0.2.11", "vip 192.0.2.12")

	ctx := context.Background()
	for _, b := range []string{"10.0.1.1:80", "10.0.1.2:80"} {
		if _, err := r.a.Drain(ctx, DrainOptions{Service: "s1", Backend: netip.MustParseAddrPort(b)}); err != nil {
			t.Fatal(err)
		}
	}
	f.waitRoutes(t, "192.0.2.10/32 med=5", "192.0.2.12/32 med=5")
	st, err := r.a.Status(ctx)
	if err != nil || st.BGP == nil || len(st.BGP.Withheld) != 1 || st.BGP.Withheld[0].Route != "192.0.2.11/32" ||
		st.BGP.Withheld[0].Reason != "no backend serves" || !slices.Equal(st.BGP.Announced, []string{"192.0.2.10/32", "192.0.2.12/32"}) {
		t.Errorf("status %+v %v", st.BGP, err)
	}
	if len(st.BGP.Peers) != 1 || st.BGP.Peers[0].State != "established" || st.BGP.ASN != 65001 || st.BGP.RouterID != "10.0.0.1" {
		t.Errorf("status peers %+v", st.BGP)
	} else if b := st.BGP.Peers[0].BFD; b == nil || b.State != "up" || b.TxInterval != 200 || b.Received != 7 {
		t.Errorf("status peer's bfd %+v, want the announcer's", b)
	}
	// The VIP stays bound: the node still serves what reaches it.
	r.has(t, "vip 192.0.2.11")
	if _, err := r.a.Undrain(ctx, DrainOptions{Service: "s1", Backend: netip.MustParseAddrPort("10.0.1.2:80")}); err != nil {
		t.Fatal(err)
	}
	f.waitRoutes(t, "192.0.2.10/32 med=5", "192.0.2.11/32 communities=[4259840001] med=5", "192.0.2.12/32 med=5")
	if st, _ := r.a.Status(ctx); len(st.BGP.Withheld) != 0 {
		t.Errorf("withheld after undrain: %+v", st.BGP.Withheld)
	}
	// Passes that change nothing hand the announcer nothing.
	f.mu.Lock()
	sets := f.sets
	f.mu.Unlock()
	if _, err := r.a.Reload(ctx, ReloadOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	if f.sets != sets {
		t.Errorf("a pass that changed nothing set the routes again (%d sets, was %d)", f.sets, sets)
	}
	f.mu.Unlock()
}

// TestBGPSharedVIP: a VIP with several services is announced while any
// of them can serve, with the attributes of the first that can.
func TestBGPSharedVIP(t *testing.T) {
	shared := `[[service]]
name = "s0"
vip = "192.0.2.10"
port = 80
backend = [{ address = "10.0.0.1" }]
[[service]]
name = "s1"
vip = "192.0.2.10"
port = 443
backend = [{ address = "10.0.0.1" }]
`
	r, f := bgpRig(t, "", shared)
	f.waitRoutes(t, "192.0.2.10/32 med=5")
	ctx := context.Background()
	if _, err := r.a.Drain(ctx, DrainOptions{Service: "s0", Backend: netip.MustParseAddrPort("10.0.0.1:80")}); err != nil {
		t.Fatal(err)
	}
	f.waitRoutes(t, "192.0.2.10/32 communities=[4259840001] med=5")
	if _, err := r.a.Drain(ctx, DrainOptions{Service: "s1", Backend: netip.MustParseAddrPort("10.0.0.1:443")}); err != nil {
		t.Fatal(err)
	}
	f.waitRoutes(t)
}

// switchable is a TCP listener on 127.0.0.1 that can be closed and
// opened again on the same port: a backend's health check target.
type switchable struct {
	mu   sync.Mutex
	port int
	l    net.Listener
}

func (s *switchable) up(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", s.port))
	if err != nil {
		t.Fatal(err)
	}
	s.l = l
	s.port = l.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
}

func (s *switchable) down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.l.Close()
}

// TestBGPHealth: a service whose backends all fail their checks is
// withdrawn, and announced again when one passes.
func TestBGPHealth(t *testing.T) {
	var target switchable
	target.up(t)
	checked := fmt.Sprintf(`[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
check = { type = "tcp", address = "127.0.0.1", port = %d, interval = "100ms", timeout = "50ms", rise = 1, fall = 1 }
backend = [{ address = "10.0.0.1" }, { address = "10.0.0.2" }]
`, target.port)
	checked = strings.Replace(checked, `name = "web"`, `name = "s1"`, 1)
	r, f := bgpRig(t, "", checked)
	f.waitRoutes(t, "192.0.2.10/32 communities=[4259840001] med=5")
	target.down()
	f.waitRoutes(t)
	st, err := r.a.Status(context.Background())
	if err != nil || len(st.BGP.Withheld) != 1 || st.BGP.Withheld[0].Reason != "no backend serves" {
		t.Errorf("status %+v %v", st.BGP, err)
	}
	target.up(t)
	f.waitRoutes(t, "192.0.2.10/32 communities=[4259840001] med=5")
}

// TestBGPDrainNode: vipd drain --node withdraws every VIP (gracefully,
// through Retire) and keeps the node out across a restart, until vipd
// undrain --node.
func TestBGPDrainNode(t *testing.T) {
	r, f := bgpRig(t, "", services(2, 1))
	f.waitRoutes(t, "192.0.2.10/32 med=5", "192.0.2.11/32 communities=[4259840001] med=5")
	ctx := context.Background()
	if err := r.a.DrainNode(ctx, true); err != nil {
		t.Fatal(err)
	}
	f.waitRoutes(t)
	if f.retired != 1 {
		t.Errorf("retired %d times, want once", f.retired)
	}
	if err := r.a.DrainNode(ctx, true); err == nil || !strings.Contains(err.Error(), "drained already") {
		t.Errorf("draining twice: %v", err)
	}
	st, err := r.a.Status(ctx)
	if err != nil || !st.BGP.Drained || len(st.BGP.Withheld) != 2 || st.BGP.Withheld[0].Reason != "node drained" {
		t.Errorf("status %+v %v", st.BGP, err)
	}
	// The VIPs stay programmed: connections that still arrive are
	// served.
	r.has(t, "vip 192.0.2.10", "service tcp 192.0.2.10:80")
	r.stop()
	<-r.done
	r.done <- nil
	f.mu.Lock()
	sets := f.sets
	f.mu.Unlock()
	r2 := r.restart(t)
	st, err = r2.a.Status(ctx)
	if err != nil || !st.BGP.Drained || len(st.BGP.Announced) != 0 || len(st.BGP.Withheld) != 2 {
		t.Errorf("status after a restart of a drained node %+v %v", st.BGP, err)
	}
	f.mu.Lock()
	if f.sets == sets || len(f.routes) != 0 {
		t.Errorf("a restarted drained node set %v (%d sets, was %d)", f.routes, f.sets, sets)
	}
	f.mu.Unlock()
	if err := r2.a.DrainNode(ctx, false); err != nil {
		t.Fatal(err)
	}
	f.waitRoutes(t, "192.0.2.10/32 med=5", "192.0.2.11/32 communities=[4259840001] med=5")
	if err := r2.a.DrainNode(ctx, false); err == nil || !strings.Contains(err.Error(), "not drained") {
		t.Errorf("undraining twice: %v", err)
	}
}

// TestBGPStop: a stopping node withdraws its routes and ends its
// sessions (the announcer's Stop) before it removes what it programmed
// (on_stop = "clean").
func TestBGPStop(t *testing.T) {
	r, f := bgpRig(t, "on_stop = \"clean\"\n", services(1, 1))
	f.waitRoutes(t, "192.0.2.10/32 med=5")
	r.stop()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	r.done <- nil
	if f.stopped != 1 {
		t.Errorf("the announcer was stopped %d times, want once", f.stopped)
	}
	if !strings.Contains(f.atStop, "vip 192.0.2.10") {
		t.Errorf("the VIP was gone when the routes were withdrawn:\n%s", f.atStop)
	}
	r.hasNot(t, "vip 192.0.2.10")
}

// TestBGPReload: a reload that changes the attributes announces them
// anew (no restart); one that removes a VIP withdraws it.
func TestBGPReload(t *testing.T) {
	r, f := bgpRig(t, "", services(2, 1))
	f.waitRoutes(t, "192.0.2.10/32 med=5", "192.0.2.11/32 communities=[4259840001] med=5")
	r.write(strings.Replace(bgpSection, "med = 5", "med = 7", 1) + services(2, 1))
	ctx := context.Background()
	if _, err := r.a.Reload(ctx, ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitRoutes(t, "192.0.2.10/32 med=7", "192.0.2.11/32 communities=[4259840001] med=7")
	if strings.Contains(r.log.String(), "take effect on restart") {
		t.Errorf("a change of attributes asks for a restart:\n%s", r.log)
	}
	r.write(strings.Replace(bgpSection, "med = 5", "med = 7", 1) + services(1, 1))
	if _, err := r.a.Reload(ctx, ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitRoutes(t, "192.0.2.10/32 med=7")
	// A change of the sessions takes a restart.
	r.write(strings.Replace(bgpSection, "asn = 65000", "asn = 65002", 1) + services(1, 1))
	if _, err := r.a.Reload(ctx, ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.log.String(), "take effect on restart") {
		t.Errorf("a change of a peer's asn does not ask for a restart:\n%s", r.log)
	}
}

// TestBGPNoSpeaker: a vipd without a speaker refuses a [bgp] section;
// vipd drain --node without [bgp] or [ha] is refused as before.
func TestBGPNoSpeaker(t *testing.T) {
	dir := t.TempDir()
	r := &rig{t: t, dir: dir, path: dir + "/vipd.toml"}
	r.write(bgpSection + services(1, 1))
	fake := func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
		return lbtest.New().Interface(), func() {}, nil
	}
	a := New(Options{Path: r.path, OpenKernel: fake})
	if err := a.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "this vipd has no BGP speaker") {
		t.Errorf("run without a speaker: %v", err)
	}
	r2 := newRig(t, services(1, 1))
	if err := r2.a.DrainNode(context.Background(), true); err == nil || !strings.Contains(err.Error(), "no [ha] section") {
		t.Errorf("drain --node without [bgp] or [ha]: %v", err)
	}
}
