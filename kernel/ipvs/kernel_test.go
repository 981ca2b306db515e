package ipvs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/kernel/link"
	"github.com/vipd/vipd/lb"
)

// The tests in this file need a kernel with IPVS. In the real-kernel test
// guest (test/vm sets VIPD_VM=1) they must run; elsewhere they skip when
// the kernel has no ip_vs. Each runs in a network namespace of its own,
// which has an IPVS table of its own. Run them in the guest with
//
//	VIPD_GUEST_PKGS="./kernel/ipvs ./kernel/link ./kernel/sysctl" test/vm/e2e.sh

// guestSchedulers are the schedulers of Linux 6.1, which lacks twos.
var guestSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh"}

func inGuest() bool {
	return os.Getenv("VIPD_VM") == "1" || os.Getenv("VIPD_GUEST") == "1"
}

// table is an adapter on a fresh IPVS table, with a moby handle on the
// same table for making foreign services.
type table struct {
	*IPVS
	moby *mobyipvs.Handle
	ns   netns.NsHandle
	path string
}

func needIPVS(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := familyID(); err != nil && !inGuest() {
		t.Skipf("no ip_vs on this kernel (%v); runs in the test guest (test/vm)", err)
	}
}

func newTable(t testing.TB) *table {
	t.Helper()
	needIPVS(t)
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result)
	go func() {
		// Never unlocked: the thread, now in the new namespace, exits
		// with this goroutine.
		runtime.LockOSThread()
		ns, err := netns.New()
		ch <- result{ns, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("create network namespace: %v", r.err)
	}
	t.Cleanup(func() { r.ns.Close() })
	// IPVS refuses IPv4 real servers (EINVAL) until the namespace has a
	// local routing table, which bringing lo up creates.
	h, err := netlink.NewHandleAt(r.ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("set lo up: %v", err)
	}
	path := fmt.Sprintf("/proc/self/fd/%d", int(r.ns))
	i, err := New(Options{NetnsPath: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { i.Close() })
	mh, err := mobyipvs.New(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mh.Close)
	// Empty the table before the namespace goes (cleanups run last
	// first). The kernel tears a namespace down asynchronously, and
	// removes its services then from the hash table that the services of
	// every namespace share; a dump of another table at that moment skips
	// or repeats services (see IPVS.Services), and the next test's read
	// of its table would be short by the services of this one. Flushed
	// here, a test's services are gone from the shared table when the
	// test ends.
	t.Cleanup(func() {
		if err := mh.Flush(); err != nil {
			t.Errorf("flush the table: %v", err)
		}
	})
	return &table{IPVS: i, moby: mh, ns: r.ns, path: path}
}

// services reads i's whole table for a comparison with want. A dump is
// no snapshot (see IPVS.Services): when a service of want is missing
// from it but a read of that service alone finds it, IPVS changed in
// another namespace during the dump, and the table is read again, up to
// 5 times in all. In the test guest nothing changes another table while
// a test reads (newTable empties each table before its namespace goes)
// and the first read is whole; on a host with other users of IPVS
// (Docker's ingress namespaces) the reads again keep the tests
// deterministic. They are logged.
func services(t testing.TB, i *IPVS, want map[lb.ServiceKey]*lb.ServiceState) map[lb.ServiceKey]*lb.ServiceState {
	t.Helper()
	for try := 1; ; try++ {
		got, err := i.Services()
		if err != nil {
			t.Fatal(err)
		}
		var gaps []string
		for k := range want {
			if got[k] != nil {
				continue
			}
			if st, err := i.Service(k); err == nil && st != nil {
				gaps = append(gaps, k.String())
			}
		}
		if len(gaps) == 0 || try == 5 {
			return got
		}
		slices.Sort(gaps)
		t.Logf("read %d: the dump missed %d services that a read alone finds (%s): the table changed elsewhere during the dump; reading again", try, len(gaps), strings.Join(gaps[:min(len(gaps), 3)], ", "))
	}
}

// run runs a command in the table's network namespace.
func (tb *table) run(t *testing.T, name string, args ...string) string {
	t.Helper()
	type result struct {
		out []byte
		err error
	}
	ch := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked, as in newTable
		if err := netns.Set(tb.ns); err != nil {
			ch <- result{nil, err}
			return
		}
		out, err := exec.Command(name, args...).CombinedOutput()
		ch <- result{out, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), r.err, r.out)
	}
	return string(r.out)
}

// entry is a service with its destinations, as written.
type entry struct {
	svc   lb.Service
	dests []lb.Destination
}

func svc(k lb.ServiceKey, sched string) lb.Service { return lb.Service{Key: k, Scheduler: sched} }

func fwmark(fam lb.Family, mark uint32) lb.ServiceKey {
	return lb.ServiceKey{Family: fam, FWMark: mark}
}

func tunnel(addr string, typ lb.TunnelType, port uint16, csum lb.TunnelCsum) lb.Destination {
	d := dest(addr, lb.Tunnel)
	d.Tunnel, d.TunnelPort, d.TunnelCsum = typ, port, csum
	return d
}

func withWeight(d lb.Destination, w int) lb.Destination         { d.Weight = w; return d }
func withThresh(d lb.Destination, up, lo uint32) lb.Destination { d.Upper, d.Lower = up, lo; return d }

func persistent(s lb.Service, timeout uint32, mask int) lb.Service {
	s.Persistent, s.Netmask = timeout, mask
	return s
}

func flags(s lb.Service, f lb.SchedFlags) lb.Service { s.Flags = f; return s }

func onePacket(s lb.Service) lb.Service { s.OnePacket = true; return s }

// everything covers every kind of service and destination vipd writes.
func everything() []entry {
	return []entry{
		{svc(tcp4("192.0.2.1", 80), "rr"), []lb.Destination{
			dest("10.0.0.1:8080", lb.Masq),
			withThresh(withWeight(dest("10.0.0.2:8080", lb.Masq), 0), 100, 10),
		}},
		{onePacket(svc(key(lb.IPv4, lb.UDP, "192.0.2.1", 53), "wrr")), []lb.Destination{withWeight(dest("10.0.0.3:53", lb.DirectRoute), 65535)}},
		{flags(svc(key(lb.IPv4, lb.SCTP, "192.0.2.1", 3868), "sh"), lb.SHPort|lb.SHFallback), []lb.Destination{dest("10.0.0.4:3868", lb.Masq)}},
		{flags(svc(tcp4("192.0.2.2", 443), "mh"), lb.MHPort), []lb.Destination{dest("192.0.2.2:443", lb.DirectRoute)}},
		{flags(svc(tcp4("192.0.2.2", 444), "mh"), lb.MHFallback|lb.MHPort), nil},
		{flags(svc(tcp4("192.0.2.2", 445), "sh"), lb.SHFallback), nil},
		{persistent(svc(tcp4("192.0.2.3", 0), "wlc"), 300, 24), []lb.Destination{dest("10.0.0.5:0", lb.DirectRoute)}},
		{persistent(svc(tcp4("192.0.2.3", 22), "wlc"), 60, 32), []lb.Destination{dest("10.0.0.5:22", lb.Masq)}},
		{persistent(svc(key(lb.IPv6, lb.TCP, "2001:db8::1", 80), "lc"), 600, 64), []lb.Destination{dest("[2001:db8:1::1]:8080", lb.Masq)}},
		{persistent(svc(key(lb.IPv6, lb.TCP, "2001:db8::1", 81), "lc"), 600, 128), nil},
		{svc(key(lb.IPv6, lb.UDP, "2001:db8::1", 53), "sed"), []lb.Destination{dest("[2001:db8:1::2]:53", lb.DirectRoute)}},
		{onePacket(svc(key(lb.IPv6, lb.UDP, "2001:db8::1", 54), "rr")), nil},
		{persistent(svc(fwmark(lb.IPv4, 1), "nq"), 30, 32), []lb.Destination{dest("10.0.0.6:0", lb.Tunnel)}},
		{svc(fwmark(lb.IPv6, 2), "fo"), []lb.Destination{tunnel("[2001:db8:1::3]:0", lb.GRE, 0, lb.CsumNone)}},
		{persistent(svc(fwmark(lb.IPv6, 3), "rr"), 60, 48), nil},
		{persistent(svc(fwmark(lb.IPv4, 4), "sh"), 60, 16), nil},
		{svc(tcp4("192.0.2.4", 80), "ovf"), []lb.Destination{
			tunnel("10.0.0.7:80", lb.GUE, 6080, lb.Csum),
			tunnel("10.0.0.8:80", lb.GUE, 6081, lb.RemCsum),
			tunnel("10.0.0.9:80", lb.GUE, 6082, lb.CsumNone),
			tunnel("10.0.0.10:80", lb.GRE, 0, lb.Csum),
			tunnel("10.0.0.11:80", lb.GRE, 0, lb.CsumNone),
			tunnel("10.0.0.12:80", lb.IPIP, 0, lb.CsumNone),
			tunnel("[2001:db8:1::4]:80", lb.IPIP, 0, lb.CsumNone), // ipv6 backend of an ipv4 service
		}},
		{svc(key(lb.IPv6, lb.TCP, "2001:db8::2", 80), "lblc"), []lb.Destination{
			tunnel("[2001:db8:1::5]:80", lb.GUE, 5555, lb.Csum),
			tunnel("10.0.0.13:80", lb.IPIP, 0, lb.CsumNone), // ipv4 backend of an ipv6 service
		}},
		{svc(tcp4("192.0.2.5", 80), "lblcr"), []lb.Destination{withThresh(dest("10.0.0.14:80", lb.Masq), 0, 0)}},
		{svc(tcp4("192.0.2.5", 81), "dh"), []lb.Destination{withThresh(dest("10.0.0.14:81", lb.Masq), 1<<31-1, 1<<30)}},
	}
}

func (tb *table) write(t *testing.T, entries []entry) {
	t.Helper()
	for _, e := range entries {
		if err := tb.AddService(e.svc); err != nil {
			t.Fatal(err)
		}
		for _, d := range e.dests {
			if err := tb.AddDest(e.svc.Key, d); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// wantState is what entries read back as.
func wantState(entries []entry) map[lb.ServiceKey]*lb.ServiceState {
	m := map[lb.ServiceKey]*lb.ServiceState{}
	for _, e := range entries {
		st := &lb.ServiceState{Service: e.svc, Dests: map[netip.AddrPort]lb.Destination{}}
		for _, d := range e.dests {
			st.Dests[d.Addr] = d.Settings()
		}
		m[e.svc.Key] = st
	}
	return m
}

// diff lists how got differs from want, comparing as the planner does.
func diff(want, got map[lb.ServiceKey]*lb.ServiceState) []string {
	var out []string
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			out = append(out, fmt.Sprintf("missing service %s", w.Service))
			continue
		}
		if g.Service != w.Service {
			out = append(out, fmt.Sprintf("service\n   got %s\n  want %s", g.Service, w.Service))
		}
		for a, wd := range w.Dests {
			gd, ok := g.Dests[a]
			switch {
			case !ok:
				out = append(out, fmt.Sprintf("%s: missing backend %s", k, wd))
			case gd.Settings() != wd.Settings():
				out = append(out, fmt.Sprintf("%s: backend\n   got %s (%+v)\n  want %s (%+v)", k, gd, gd, wd, wd))
			}
		}
		for a, gd := range g.Dests {
			if _, ok := w.Dests[a]; !ok {
				out = append(out, fmt.Sprintf("%s: extra backend %s", k, gd))
			}
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("extra service %s", g.Service))
		}
	}
	slices.Sort(out)
	return out
}

func (tb *table) expect(t *testing.T, want map[lb.ServiceKey]*lb.ServiceState) {
	t.Helper()
	got := services(t, tb.IPVS, want)
	for _, d := range diff(want, got) {
		t.Error(d)
	}
}

func TestNewWithoutIPVS(t *testing.T) {
	if _, err := familyID(); err == nil {
		t.Skip("this kernel has ip_vs")
	}
	if inGuest() {
		t.Fatal("the test guest has no ip_vs")
	}
	_, err := New(Options{})
	if err == nil || !strings.Contains(err.Error(), "ipvs: the kernel has no IPVS (generic netlink family IPVS not found; load the ip_vs module)") {
		t.Errorf("New without ip_vs: %v", err)
	}
}

// TestSchedulers adds, updates and deletes a service and its backends with
// every scheduler of Linux 6.1, IPv4 and IPv6.
func TestSchedulers(t *testing.T) {
	tb := newTable(t)
	for n, sched := range guestSchedulers {
		for _, k := range []lb.ServiceKey{tcp4("192.0.2.1", uint16(1000+n)), key(lb.IPv6, lb.UDP, "2001:db8::1", uint16(1000+n))} {
			s := svc(k, sched)
			b1 := netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), 80)
			b2 := netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), 80)
			if k.Family == lb.IPv6 {
				b1 = netip.AddrPortFrom(netip.MustParseAddr("2001:db8:1::1"), 80)
				b2 = netip.AddrPortFrom(netip.MustParseAddr("2001:db8:1::2"), 80)
			}
			d1 := lb.Destination{Addr: b1, Weight: 1, Forward: lb.Masq}
			d2 := lb.Destination{Addr: b2, Weight: 2, Forward: lb.DirectRoute}
			e := entry{s, []lb.Destination{d1, d2}}
			tb.write(t, []entry{e})
			tb.expect(t, wantState([]entry{e}))

			// Update: the next scheduler, new weights and methods.
			s.Scheduler = guestSchedulers[(n+1)%len(guestSchedulers)]
			d1.Weight, d2.Forward, d2.Upper = 10, lb.Masq, 50
			if err := tb.UpdateService(s); err != nil {
				t.Fatal(err)
			}
			for _, d := range []lb.Destination{d1, d2} {
				if err := tb.UpdateDest(s.Key, d); err != nil {
					t.Fatal(err)
				}
			}
			tb.expect(t, wantState([]entry{{s, []lb.Destination{d1, d2}}}))

			if err := tb.DeleteDest(s.Key, d1.Addr); err != nil {
				t.Fatal(err)
			}
			tb.expect(t, wantState([]entry{{s, []lb.Destination{d2}}}))
			if err := tb.DeleteService(s.Key); err != nil {
				t.Fatal(err)
			}
			tb.expect(t, nil)
		}
	}
}

func TestUnsupportedScheduler(t *testing.T) {
	tb := newTable(t)
	if !inGuest() {
		t.Skip("which schedulers a kernel lacks is known only in the test guest (Linux 6.1 has no twos)")
	}
	s := svc(tcp4("192.0.2.1", 80), "twos")
	err := tb.AddService(s)
	want := `add service tcp 192.0.2.1:80: scheduler "twos" is not supported by this kernel (no ip_vs_twos module): no such file or directory`
	if err == nil || err.Error() != want {
		t.Errorf("add:\n got %v\nwant %s", err, want)
	}
	s.Scheduler = "rr"
	tb.write(t, []entry{{s, nil}})
	s.Scheduler = "twos"
	err = tb.UpdateService(s)
	want = `update service tcp 192.0.2.1:80: scheduler "twos" is not supported by this kernel (no ip_vs_twos module): no such file or directory`
	if err == nil || err.Error() != want {
		t.Errorf("update:\n got %v\nwant %s", err, want)
	}
	s.Scheduler = "rr"
	tb.expect(t, wantState([]entry{{s, nil}}))
}

// TestRoundTrip writes every kind of service and backend and reads it
// back equal.
func TestRoundTrip(t *testing.T) {
	tb := newTable(t)
	all := everything()
	tb.write(t, all)
	tb.expect(t, wantState(all))

	// A second adapter (a restarted daemon) reads the same.
	again, err := New(Options{NetnsPath: tb.path})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	got := services(t, again, wantState(all))
	for _, d := range diff(wantState(all), got) {
		t.Errorf("second adapter: %s", d)
	}

	// Delete every backend (an IPv6 backend of an IPv4 tunnel service
	// needs its own address family sent), then every service.
	for _, e := range all {
		for _, d := range e.dests {
			if err := tb.DeleteDest(e.svc.Key, d.Addr); err != nil {
				t.Error(err)
			}
		}
		if err := tb.DeleteService(e.svc.Key); err != nil {
			t.Error(err)
		}
	}
	tb.expect(t, nil)
}

// spec turns entries into a spec of VIP services.
func spec(entries []entry) *lb.Spec {
	s := &lb.Spec{}
	for n, e := range entries {
		vs := lb.VirtualService{Name: fmt.Sprintf("svc%d", n), Service: e.svc, VIP: e.svc.Key.Addr, Backends: e.dests}
		s.Services = append(s.Services, vs)
	}
	return s
}

// TestRestartPlansNothing drives the real core: a reconciler writes the
// spec, and a plan for the same spec, from the same or from a new adapter,
// has no operations.
func TestRestartPlansNothing(t *testing.T) {
	tb := newTable(t)
	sp := spec(everything())
	ctx := context.Background()
	r := lb.NewReconciler(lb.Options{Kernel: lb.Kernel{IPVS: tb.IPVS}})
	res, err := r.Reconcile(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	if len(res.Applied) == 0 {
		t.Fatal("the first pass applied nothing")
	}
	ops, err := r.Plan(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		t.Errorf("same adapter plans %s", op)
	}

	again, err := New(Options{NetnsPath: tb.path})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	r2 := lb.NewReconciler(lb.Options{Kernel: lb.Kernel{IPVS: again}})
	ops, err = r2.Plan(ctx, sp)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		t.Errorf("restarted adapter plans %s", op)
	}
}

// TestUpdates changes each setting of a service and a backend in place.
func TestUpdates(t *testing.T) {
	tb := newTable(t)
	s := svc(tcp4("192.0.2.1", 80), "rr")
	d := dest("10.0.0.1:80", lb.Masq)
	tb.write(t, []entry{{s, []lb.Destination{d}}})
	steps := []entry{
		{flags(svc(s.Key, "sh"), lb.SHPort), []lb.Destination{withWeight(d, 7)}},
		{flags(svc(s.Key, "mh"), lb.MHFallback), []lb.Destination{dest("10.0.0.1:80", lb.DirectRoute)}},
		{persistent(svc(s.Key, "wlc"), 300, 24), []lb.Destination{tunnel("10.0.0.1:80", lb.GUE, 6080, lb.Csum)}},
		{persistent(svc(s.Key, "wlc"), 900, 16), []lb.Destination{tunnel("10.0.0.1:80", lb.GUE, 6081, lb.RemCsum)}},
		{svc(s.Key, "wlc"), []lb.Destination{tunnel("10.0.0.1:80", lb.GRE, 0, lb.Csum)}},
		{onePacket(svc(s.Key, "rr")), []lb.Destination{tunnel("10.0.0.1:80", lb.IPIP, 0, lb.CsumNone)}},
		{svc(s.Key, "rr"), []lb.Destination{withThresh(dest("10.0.0.1:80", lb.Masq), 1000, 500)}},
		{svc(s.Key, "rr"), []lb.Destination{withWeight(dest("10.0.0.1:80", lb.Masq), 0)}},
	}
	for n, e := range steps {
		if err := tb.UpdateService(e.svc); err != nil {
			t.Fatalf("step %d: %v", n, err)
		}
		if err := tb.UpdateDest(e.svc.Key, e.dests[0]); err != nil {
			t.Fatalf("step %d: %v", n, err)
		}
		got := services(t, tb.IPVS, wantState([]entry{e}))
		for _, line := range diff(wantState([]entry{e}), got) {
			t.Errorf("step %d: %s", n, line)
		}
	}
}

// TestErrors checks the errors of commands the kernel refuses.
func TestErrors(t *testing.T) {
	tb := newTable(t)
	s := svc(tcp4("192.0.2.1", 80), "rr")
	d := dest("10.0.0.1:80", lb.Masq)
	tb.write(t, []entry{{s, []lb.Destination{d}}})
	missing := tcp4("192.0.2.99", 80)
	for _, c := range []struct {
		err  error
		want string
	}{
		{tb.AddService(s), "add service tcp 192.0.2.1:80: service exists: file exists"},
		{tb.UpdateService(svc(missing, "rr")), "update service tcp 192.0.2.99:80: no such service: no such process"},
		{tb.DeleteService(missing), "delete service tcp 192.0.2.99:80: no such service: no such process"},
		{tb.AddDest(s.Key, d), "add backend tcp 192.0.2.1:80 -> 10.0.0.1:80: backend exists: file exists"},
		{tb.AddDest(missing, d), "add backend tcp 192.0.2.99:80 -> 10.0.0.1:80: no such service: no such process"},
		{tb.UpdateDest(s.Key, dest("10.0.0.2:80", lb.Masq)), "update backend tcp 192.0.2.1:80 -> 10.0.0.2:80: no such backend: no such file or directory"},
		{tb.DeleteDest(s.Key, netip.MustParseAddrPort("10.0.0.2:80")), "delete backend tcp 192.0.2.1:80 -> 10.0.0.2:80: no such backend: no such file or directory"},
		{tb.AddDest(s.Key, dest("[2001:db8::1]:80", lb.Masq)), "add backend tcp 192.0.2.1:80 -> [2001:db8::1]:80: invalid argument"},
		{tb.AddDest(s.Key, tunnel("10.0.0.3:80", lb.GUE, 0, lb.CsumNone)), "add backend tcp 192.0.2.1:80 -> 10.0.0.3:80: tunnel gue needs a tunnel port"},
		{tb.AddService(flags(svc(tcp4("192.0.2.1", 81), "rr"), lb.SHPort)), "add service tcp 192.0.2.1:81: scheduler flag sh-port needs scheduler sh, not rr"},
		{tb.AddDest(s.Key, withThresh(dest("10.0.0.4:80", lb.Masq), 10, 20)), "add backend tcp 192.0.2.1:80 -> 10.0.0.4:80: lower threshold 20 is above upper threshold 10 (the kernel needs lower <= upper, also without an upper threshold)"},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("\n got %v\nwant %s", c.err, c.want)
		}
	}
	tb.expect(t, wantState([]entry{{s, []lb.Destination{d}}}))
}

// TestForeignServices adds services behind vipd's back, with moby and
// with ipvsadm, and checks that reconciling leaves them alone while vipd
// adds and removes its own.
func TestForeignServices(t *testing.T) {
	tb := newTable(t)
	dummy, err := link.New(link.Options{Interface: "vipd0", NetnsPath: tb.path})
	if err != nil {
		t.Fatal(err)
	}
	defer dummy.Close()
	if err := dummy.Ensure(); err != nil {
		if !inGuest() {
			t.Skipf("no dummy interface: %v", err)
		}
		t.Fatal(err)
	}

	foreign := &mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: unix.IPPROTO_TCP, Address: net.IP{198, 51, 100, 1}, Port: 80, SchedName: "wlc", Netmask: 0xffffffff}
	if err := tb.moby.NewService(foreign); err != nil {
		t.Fatal(err)
	}
	fd := &mobyipvs.Destination{Address: net.IP{10, 9, 9, 9}, Port: 80, Weight: 3, ConnectionFlags: mobyipvs.ConnFwdDirectRoute}
	if err := tb.moby.NewDestination(foreign, fd); err != nil {
		t.Fatal(err)
	}
	tb.run(t, "ipvsadm", "-A", "-f", "77", "-s", "sh", "-b", "sh-port", "-p", "120")
	tb.run(t, "ipvsadm", "-a", "-f", "77", "-r", "10.8.8.8", "-i", "-w", "4", "--tun-type", "gue", "--tun-port", "7777", "--tun-csum")
	want := wantState([]entry{
		{svc(tcp4("198.51.100.1", 80), "wlc"), []lb.Destination{withWeight(dest("10.9.9.9:80", lb.DirectRoute), 3)}},
		{persistent(flags(svc(fwmark(lb.IPv4, 77), "sh"), lb.SHPort), 120, 32), []lb.Destination{withWeight(tunnel("10.8.8.8:0", lb.GUE, 7777, lb.Csum), 4)}},
	})
	before := services(t, tb.IPVS, want)
	if len(before) != 2 {
		t.Fatalf("foreign services: %v", before)
	}
	for _, d := range diff(want, before) {
		t.Errorf("foreign services as read: %s", d)
	}

	ours := []entry{
		{svc(tcp4("192.0.2.1", 80), "rr"), []lb.Destination{dest("10.0.0.1:80", lb.Masq)}},
		{svc(key(lb.IPv6, lb.TCP, "2001:db8::1", 80), "rr"), []lb.Destination{dest("[2001:db8:1::1]:80", lb.Masq)}},
	}
	ctx := context.Background()
	r := lb.NewReconciler(lb.Options{Kernel: lb.Kernel{IPVS: tb.IPVS, VIPs: dummy}, Dummy: "vipd0"})
	for _, sp := range []*lb.Spec{spec(ours), spec(ours[:1]), spec(nil)} {
		res, err := r.Reconcile(ctx, sp)
		if err != nil {
			t.Fatal(err)
		}
		if err := res.Err(); err != nil {
			t.Fatal(err)
		}
		wantNow := wantState(nil)
		for k, v := range before {
			wantNow[k] = v
		}
		for _, e := range sp.Services {
			wantNow[e.Service.Key] = wantState([]entry{{e.Service, e.Backends}})[e.Service.Key]
		}
		got := services(t, tb.IPVS, wantNow)
		for _, d := range diff(wantNow, got) {
			t.Errorf("after reconciling %d services: %s", len(sp.Services), d)
		}
		ops, err := r.Plan(ctx, sp)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			t.Errorf("after reconciling %d services, plan has %s", len(sp.Services), op)
		}
	}
	if vips, err := dummy.VIPs(); err != nil || len(vips) != 0 {
		t.Errorf("vips left: %v, %v", vips, err)
	}
}

// TestIpvsadmAgrees checks the adapter's encoding against ipvsadm's: what
// the adapter writes, ipvsadm saves with the same options one would give
// it, and what ipvsadm restores, the adapter reads as written.
func TestIpvsadmAgrees(t *testing.T) {
	tb := newTable(t)
	tb.write(t, []entry{
		{persistent(svc(tcp4("192.0.2.1", 80), "wlc"), 300, 24), []lb.Destination{
			tunnel("10.0.0.1:80", lb.GUE, 6080, lb.RemCsum),
			tunnel("10.0.0.2:80", lb.GRE, 0, lb.Csum),
			withThresh(withWeight(dest("10.0.0.3:80", lb.DirectRoute), 9), 200, 100),
		}},
		{persistent(flags(svc(key(lb.IPv6, lb.UDP, "2001:db8::1", 53), "mh"), lb.MHPort|lb.MHFallback), 60, 64), []lb.Destination{
			dest("[2001:db8:1::1]:5353", lb.Masq),
		}},
		{onePacket(svc(key(lb.IPv4, lb.UDP, "192.0.2.1", 53), "rr")), nil},
	})
	saved := tb.run(t, "ipvsadm", "-S", "-n")
	for _, want := range []string{
		"-A -t 192.0.2.1:80 -s wlc -p 300 -M 255.255.255.0",
		"-a -t 192.0.2.1:80 -r 10.0.0.1:80 -i -w 1 --tun-type gue --tun-port 6080 --tun-remcsum",
		"-a -t 192.0.2.1:80 -r 10.0.0.2:80 -i -w 1 --tun-type gre --tun-csum",
		"-a -t 192.0.2.1:80 -r 10.0.0.3:80 -g -w 9", // -S saves no thresholds
		"-A -u [2001:db8::1]:53 -s mh -p 60 -M 64 -b mh-fallback,mh-port",
		"-a -u [2001:db8::1]:53 -r [2001:db8:1::1]:5353 -m -w 1",
		"-A -u 192.0.2.1:53 -s rr -o",
	} {
		if !strings.Contains(saved, want+"\n") {
			t.Errorf("ipvsadm -Sn has no line %q:\n%s", want, saved)
		}
	}
	listed := tb.run(t, "ipvsadm", "-L", "-n", "--thresholds")
	if !regexp.MustCompile(`(?m)^  -> 10\.0\.0\.3:80 +200 +100 `).MatchString(listed) {
		t.Errorf("ipvsadm -Ln --thresholds shows no thresholds 200 and 100 for 10.0.0.3:80:\n%s", listed)
	}
}

// TestThresholdLimits checks the kernel's limits on thresholds, which
// the adapter checks before the kernel does to give a clear error: Linux
// 6.1.y (since a 2025 fix) refuses an upper threshold above INT_MAX with
// EINVAL, and every version a lower threshold above the upper one, even
// when the upper one is 0 (none), with ERANGE.
func TestThresholdLimits(t *testing.T) {
	tb := newTable(t)
	ms := &mobyipvs.Service{AddressFamily: unix.AF_INET, Protocol: unix.IPPROTO_TCP, Address: net.IP{192, 0, 2, 1}, Port: 80, SchedName: "rr", Netmask: 0xffffffff}
	if err := tb.moby.NewService(ms); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		upper, lower uint32
		want         []error // any of
	}{
		{1 << 31, 0, []error{unix.EINVAL, nil}}, // nil: kernels without the fix
		{0, 5, []error{unix.ERANGE}},
		{5, 6, []error{unix.ERANGE}},
		{math.MaxInt32, 5, []error{nil}},
	} {
		d := &mobyipvs.Destination{Address: net.IP{10, 0, 0, 1}, Port: 80, Weight: 1, UpperThreshold: c.upper, LowerThreshold: c.lower}
		err := tb.moby.NewDestination(ms, d)
		ok := false
		for _, w := range c.want {
			ok = ok || err == w || w != nil && errors.Is(err, w)
		}
		if !ok {
			t.Errorf("upper %d lower %d: kernel says %v, want one of %v", c.upper, c.lower, err, c.want)
		}
		if err == nil {
			if err := tb.moby.DelDestination(ms, d); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// BenchmarkAddServices adds 1,000 services with 2 backends each to an
// empty table, and reads them back (guest only).
func BenchmarkAddServices(b *testing.B) {
	const nsvc, ndest = 1000, 2
	var entries []entry
	for n := range nsvc {
		k := lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.AddrFrom4([4]byte{10, 100, byte(n >> 8), byte(n)}), Port: 80}
		e := entry{svc: svc(k, "wrr")}
		for m := range ndest {
			e.dests = append(e.dests, lb.Destination{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 200, byte(m), 1}), 8080), Weight: 1, Forward: lb.Masq})
		}
		entries = append(entries, e)
	}
	for range b.N {
		b.StopTimer()
		tb := newTable(b)
		b.StartTimer()
		for _, e := range entries {
			if err := tb.AddService(e.svc); err != nil {
				b.Fatal(err)
			}
			for _, d := range e.dests {
				if err := tb.AddDest(e.svc.Key, d); err != nil {
					b.Fatal(err)
				}
			}
		}
		t0 := time.Now()
		got, err := tb.Services()
		if err != nil || len(got) != nsvc {
			b.Fatalf("read back %d services: %v", len(got), err)
		}
		b.ReportMetric(float64(time.Since(t0).Milliseconds()), "ms/dump")
	}
	b.ReportMetric(float64(nsvc*(1+ndest)), "calls/op")
}

// netlink returns a netlink handle in the table's namespace.
func (tb *table) netlink(t *testing.T) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(tb.ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func addAddr(t *testing.T, h *netlink.Handle, ifname, prefix string) {
	t.Helper()
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix(prefix)
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
}

// TestLocalBackend writes backends on the load balancer's own addresses,
// which the kernel of old forwarded as "local node": they must read back
// as written.
func TestLocalBackend(t *testing.T) {
	tb := newTable(t)
	h := tb.netlink(t)
	addAddr(t, h, "lo", "192.0.2.50/32")
	addAddr(t, h, "lo", "2001:db8::50/128")
	all := []entry{
		{svc(tcp4("192.0.2.50", 80), "rr"), []lb.Destination{
			dest("127.0.0.1:8080", lb.Masq),
			dest("192.0.2.50:8081", lb.Masq),
		}},
		{svc(tcp4("192.0.2.50", 81), "rr"), []lb.Destination{dest("192.0.2.50:81", lb.DirectRoute)}},
		{svc(key(lb.IPv6, lb.TCP, "2001:db8::50", 80), "rr"), []lb.Destination{
			dest("[::1]:8080", lb.Masq),
			dest("[2001:db8::50]:80", lb.DirectRoute),
		}},
	}
	tb.write(t, all)
	tb.expect(t, wantState(all))
}

// inNetns runs f on a thread in ns; the thread is not reused.
func inNetns(ns netns.NsHandle, f func() error) error {
	ch := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked
		if err := netns.Set(ns); err != nil {
			ch <- err
			return
		}
		ch <- f()
	}()
	return <-ch
}

// TestConnectionCounts opens a real connection through a service and
// reads the backend's active and inactive connection counts.
func TestConnectionCounts(t *testing.T) {
	tb := newTable(t)
	h := tb.netlink(t)
	backend := newTable(t) // just its namespace
	bh := backend.netlink(t)

	// lb0 (10.0.0.1) in the load balancer's namespace, be0 (10.0.0.2) in
	// the backend's, which routes back through the load balancer.
	la := netlink.NewLinkAttrs()
	la.Name = "lb0"
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "be0", PeerNamespace: netlink.NsFd(int(backend.ns))}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		h    *netlink.Handle
		name string
		addr string
	}{{h, "lb0", "10.0.0.1/24"}, {bh, "be0", "10.0.0.2/24"}} {
		addAddr(t, x.h, x.name, x.addr)
		l, err := x.h.LinkByName(x.name)
		if err == nil {
			err = x.h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := bh.RouteAdd(&netlink.Route{Gw: net.IP{10, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	addAddr(t, h, "lo", "192.0.2.1/32")

	var ln net.Listener
	err := inNetns(backend.ns, func() (err error) {
		ln, err = net.Listen("tcp4", "10.0.0.2:8080")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()

	s := svc(tcp4("192.0.2.1", 80), "rr")
	d := dest("10.0.0.2:8080", lb.Masq)
	tb.write(t, []entry{{s, []lb.Destination{d}}})

	var c net.Conn
	err = inNetns(tb.ns, func() (err error) {
		c, err = net.DialTimeout("tcp4", "192.0.2.1:80", 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("connect through the service: %v", err)
	}
	server, ok := <-accepted
	if !ok {
		t.Fatal("the backend accepted nothing")
	}
	one := wantState([]entry{{s, []lb.Destination{d}}})
	counts := func() lb.Destination {
		t.Helper()
		got := services(t, tb.IPVS, one)
		if got[s.Key] == nil {
			t.Fatalf("no service %s", s.Key)
		}
		return got[s.Key].Dests[d.Addr]
	}
	if got := counts(); got.ActiveConns != 1 || got.InactiveConns != 0 {
		t.Errorf("open connection: active %d inactive %d, want 1 and 0", got.ActiveConns, got.InactiveConns)
	}
	// The kernel's estimator copies the counters every 2 seconds.
	for deadline := time.Now().Add(6 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got := services(t, tb.IPVS, one)
		if got[s.Key] == nil {
			t.Fatalf("no service %s", s.Key)
		}
		ss, ds := got[s.Key].Stats, got[s.Key].Dests[d.Addr].Stats
		if ds == nil {
			t.Fatalf("backend %s has no counters", d.Addr)
		}
		if ss.Conns == 1 && ds.Conns == 1 && ss.InPkts >= 2 && ds.InPkts == ss.InPkts && ss.InBytes > 0 && ss.OutPkts >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("stats after one connection: service %+v, backend %+v", ss, ds)
			break
		}
	}
	c.Close()
	server.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := counts()
		if got.ActiveConns == 0 && got.InactiveConns == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("closed connection: active %d inactive %d, want 0 and 1", got.ActiveConns, got.InactiveConns)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}
