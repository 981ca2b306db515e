package agent

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/source"
)

// fakeSource hands its sink to the test and runs until its context ends
// or the test fails it.
type fakeSource struct {
	name  string
	sinks chan source.Sink
	fail  chan error
}

func newFakeSource(name string) *fakeSource {
	return &fakeSource{name: name, sinks: make(chan source.Sink, 1), fail: make(chan error, 1)}
}

func (f *fakeSource) Name() string { return f.name }

func (f *fakeSource) Run(ctx context.Context, sink source.Sink) error {
	f.sinks <- sink
	select {
	case <-ctx.Done():
		return nil
	case err := <-f.fail:
		return err
	}
}

func (f *fakeSource) sink(t *testing.T) source.Sink {
	t.Helper()
	select {
	case s := <-f.sinks:
		f.sinks <- s
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("the source was not started")
		return nil
	}
}

// vs is a source's service on vip:80 with backends on port 80.
func vs(name, vip string, backends ...string) lb.VirtualService {
	v := lb.VirtualService{Name: name, VIP: netip.MustParseAddr(vip),
		Service: lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr(vip), Port: 80}, Scheduler: "wrr"}}
	for _, b := range backends {
		v.Backends = append(v.Backends, lb.Destination{Addr: netip.MustParseAddrPort(b + ":80"), Weight: 1, Forward: lb.Masq})
	}
	return v
}

func publish(t *testing.T, s source.Sink, svcs ...lb.VirtualService) []source.Conflict {
	t.Helper()
	cs, err := s.Publish(context.Background(), source.Snapshot{Services: svcs})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	return cs
}

func TestSourceServices(t *testing.T) {
	src := newFakeSource("kubernetes")
	r := newRig(t, services(1, 1), src)
	s := src.sink(t)
	if cs := publish(t, s, vs("k8s/a", "192.0.2.50", "10.1.0.1", "10.1.0.2")); len(cs) != 0 {
		t.Fatalf("conflicts: %v", cs)
	}
	r.has(t, "192.0.2.50:80", "10.1.0.1:80 masq weight=1", "vip 192.0.2.50", "192.0.2.10:80")
	st, err := r.a.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, svc := range st.Services {
		names = append(names, svc.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "k8s/a") {
		t.Errorf("status shows %v, not the source's service", names)
	}
	// A file reload keeps the source's services.
	r.write(services(2, 1))
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	r.has(t, "192.0.2.50:80", "192.0.2.11:80")
	// An admin drain reaches a source's backend.
	if _, err := r.a.Drain(context.Background(), DrainOptions{Service: "k8s/a", Backend: netip.MustParseAddrPort("10.1.0.2:80")}); err != nil {
		t.Fatal(err)
	}
	r.has(t, "10.1.0.2:80 masq weight=0")
	publish(t, s)
	r.hasNot(t, "192.0.2.50")
	r.has(t, "192.0.2.10:80", "192.0.2.11:80")
}

func TestSourceConflicts(t *testing.T) {
	src := newFakeSource("kubernetes")
	r := newRig(t, services(4, 1), src)
	s := src.sink(t)
	cs := publish(t, s,
		vs("k8s/key", "192.0.2.10", "10.1.0.1"), // s0's key
		vs("s1", "192.0.2.60", "10.1.0.2"),      // s1's name
		vs("k8s/ok", "192.0.2.61", "10.1.0.3"))
	if len(cs) != 2 {
		t.Fatalf("conflicts %v, want 2", cs)
	}
	want := []string{
		`service "k8s/key": tcp 192.0.2.10:80 is taken by file's service "s0"`,
		`service "s1": the name is taken by file's service "s1"`,
	}
	for i, c := range cs {
		if c.Owner != fileSource || c.Error() != want[i] {
			t.Errorf("conflict %d: %q (owner %q), want %q", i, c.Error(), c.Owner, want[i])
		}
	}
	r.has(t, "192.0.2.61:80", "10.0.0.1:80")
	r.hasNot(t, "10.1.0.1:80", "192.0.2.60")

	// The file cannot take a key a source owns.
	r.write(services(4, 1) + "[[service]]\nname = \"late\"\nvip = \"192.0.2.61\"\nport = 80\nbackend = [{ address = \"10.2.0.1\" }]\n")
	_, err := r.a.Reload(context.Background(), ReloadOptions{})
	if !errors.Is(err, ErrReloadRejected) || !strings.Contains(err.Error(), `tcp 192.0.2.61:80 is taken by kubernetes's service "k8s/ok"`) {
		t.Fatalf("file reload taking a source's key: %v", err)
	}
	r.hasNot(t, "10.2.0.1")

	// When the file lets go of s0, the source's service takes its key.
	r.write(strings.Replace(services(4, 1), "name = \"s0\"\nvip = \"192.0.2.10\"", "name = \"s0\"\nvip = \"192.0.2.40\"", 1))
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	r.has(t, "192.0.2.40:80", "10.1.0.1:80")
}

func TestSourcesFirstKeeps(t *testing.T) {
	a, b := newFakeSource("a"), newFakeSource("b")
	r := newRig(t, services(1, 1), a, b)
	sa, sb := a.sink(t), b.sink(t)
	publish(t, sa, vs("a/x", "192.0.2.70", "10.3.0.1"))
	// b sorts after a, but that is not why it loses: a had it first.
	cs := publish(t, sb, vs("b/x", "192.0.2.70", "10.4.0.1"))
	if len(cs) != 1 || cs[0].Owner != "a" || cs[0].OwnerService != "a/x" {
		t.Fatalf("conflicts %v, want b/x refused for a/x", cs)
	}
	r.has(t, "10.3.0.1:80")
	r.hasNot(t, "10.4.0.1:80")
	// a lets go: b's service, refused before, is taken at once.
	publish(t, sa)
	r.has(t, "10.4.0.1:80 masq weight=1")
	r.hasNot(t, "10.3.0.1:80 masq weight=1") // draining, as any removed backend
	// And a cannot take it back.
	if cs := publish(t, sa, vs("a/x", "192.0.2.70", "10.3.0.1")); len(cs) != 1 || cs[0].Owner != "b" {
		t.Fatalf("conflicts %v, want a/x refused for b/x", cs)
	}
}

func TestSourceHostVIP(t *testing.T) {
	src := newFakeSource("kubernetes")
	r := newRig(t, services(1, 1), src)
	r.k.SetHostAddrs("eth0", netip.MustParseAddr("192.0.2.77"))
	cs := publish(t, src.sink(t), vs("k8s/host", "192.0.2.77", "10.1.0.1"), vs("k8s/fine", "192.0.2.78", "10.1.0.2"))
	if len(cs) != 1 || !strings.Contains(cs[0].Error(), `service "k8s/host": vip 192.0.2.77 is an address of interface eth0`) {
		t.Fatalf("conflicts %v, want k8s/host refused", cs)
	}
	r.hasNot(t, "192.0.2.77")
	r.has(t, "192.0.2.78:80")
}

func TestSourceInvalid(t *testing.T) {
	src := newFakeSource("kubernetes")
	r := newRig(t, services(1, 1), src)
	bad := vs("k8s/bad", "192.0.2.90", "10.1.0.1")
	bad.Service.Key.Family = lb.IPv6
	worse := vs("k8s/worse", "192.0.2.91", "10.1.0.2")
	worse.Service.Scheduler = "nope"
	cs := publish(t, src.sink(t), bad, worse, vs("", "192.0.2.92"))
	if len(cs) != 3 {
		t.Fatalf("conflicts %v, want 3 invalid services", cs)
	}
	for _, c := range cs {
		if !strings.Contains(c.Error(), "invalid service:") {
			t.Errorf("conflict %q does not say the service is invalid", c.Error())
		}
	}
	r.hasNot(t, "192.0.2.9")
}

func TestSourceFailureStops(t *testing.T) {
	src := newFakeSource("kubernetes")
	r := newRig(t, services(1, 1), src)
	src.sink(t)
	src.fail <- errors.New("boom")
	select {
	case err := <-r.done:
		if err == nil || !strings.Contains(err.Error(), "source kubernetes: boom") {
			t.Errorf("run ended with %v, want the source's error", err)
		}
		r.done <- err
	case <-time.After(5 * time.Second):
		t.Fatal("the agent did not stop when its source failed")
	}
	if _, err := src.sink(t).Publish(context.Background(), source.Snapshot{}); !errors.Is(err, ErrStopped) {
		t.Errorf("publish after the agent stopped: %v, want ErrStopped", err)
	}
}

func TestSourceHealth(t *testing.T) {
	openPort := uint16(acceptor(t))
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := uint16(closed.Addr().(*net.TCPAddr).Port)
	closed.Close()
	check := func(port uint16) health.Spec {
		return health.Spec{Kind: health.KindTCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: port,
			Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond, Rise: 1, Fall: 1, Jitter: -1}
	}
	src := newFakeSource("kubernetes")
	r := newRig(t, services(1, 1), src)
	svc := vs("k8s/checked", "192.0.2.80", "10.1.0.1", "10.1.0.2")
	_, err = src.sink(t).Publish(context.Background(), source.Snapshot{Services: []lb.VirtualService{svc},
		Health: map[string]config.ServiceHealth{"k8s/checked": {Checks: map[netip.AddrPort]*health.Spec{
			netip.MustParseAddrPort("10.1.0.1:80"): new(check(openPort)),
			netip.MustParseAddrPort("10.1.0.2:80"): new(check(closedPort)),
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, []string{"10.1.0.1:80 masq weight=1", "10.1.0.2:80 masq weight=0"}, nil)
}

// TestSourceChangedHint: a snapshot that names its changed services
// (source.Snapshot.Changed) is programmed with a pass over those alone,
// which reads no dump of the kernel's table, and leaves the kernel as
// the same snapshots taken whole, with full passes, do; a hint that
// does not hold (a changed VIP, a service the agent did not take) takes
// a full pass, with the same result.
func TestSourceChangedHint(t *testing.T) {
	a := vs("k8s/a", "192.0.2.50", "10.1.0.1")
	b := vs("k8s/b", "192.0.2.51", "10.1.1.1", "10.1.1.2")
	steps := []struct {
		name    string
		svcs    []lb.VirtualService
		changed []string
		delta   bool
	}{
		{"first", []lb.VirtualService{a, b}, nil, false},
		{"a backend replaced", []lb.VirtualService{a, vs("k8s/b", "192.0.2.51", "10.1.1.1", "10.1.1.3")}, []string{"k8s/b"}, true},
		{"both change", []lb.VirtualService{vs("k8s/a", "192.0.2.50"), vs("k8s/b", "192.0.2.51", "10.1.1.3")}, []string{"k8s/a", "k8s/b"}, true},
		{"a weight", []lb.VirtualService{vs("k8s/a", "192.0.2.50"), func() lb.VirtualService {
			v := vs("k8s/b", "192.0.2.51", "10.1.1.3")
			v.Backends[0].Weight = 5
			return v
		}()}, []string{"k8s/b"}, true},
		{"a VIP changed", []lb.VirtualService{vs("k8s/a", "192.0.2.52", "10.1.0.1"), vs("k8s/b", "192.0.2.51", "10.1.1.3")}, []string{"k8s/a", "k8s/b"}, false},
		{"an unknown service", []lb.VirtualService{vs("k8s/a", "192.0.2.52", "10.1.0.2"), vs("k8s/b", "192.0.2.51", "10.1.1.3")}, []string{"k8s/c"}, false},
	}
	hinted, whole := newFakeSource("kubernetes"), newFakeSource("kubernetes")
	rh, rw := newRig(t, services(1, 1), hinted), newRig(t, services(1, 1), whole)
	sh, sw := hinted.sink(t), whole.sink(t)
	for _, st := range steps {
		rh.k.Reads()
		if _, err := sh.Publish(context.Background(), source.Snapshot{Services: st.svcs, Changed: st.changed}); err != nil {
			t.Fatal(err)
		}
		publish(t, sw, st.svcs...)
		dumped := slices.Contains(rh.k.Reads(), "services")
		if dumped == st.delta {
			t.Errorf("%s: the pass read the whole table: %v, want %v", st.name, dumped, !st.delta)
		}
		// A pass over some services leaves the backends that drain
		// elsewhere to the drain passes (every second), where a full
		// pass deletes them at once: the kernels meet once they have.
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, want := rh.k.Dump(), rw.k.Dump()
			if got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the kernel with hints:\n%s\nwant, as with whole snapshots:\n%s", st.name, got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	rh.has(t, "192.0.2.52:80", "10.1.0.2:80 masq weight=1", "10.1.1.3:80 masq weight=1")
}
