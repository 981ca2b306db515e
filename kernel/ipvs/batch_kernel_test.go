package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
)

// The tests in this file need the real kernel (see kernel_test.go).

// bulk returns n services of m backends each, of several kinds, after
// everything(): at n = 1,000 and m = 10 over 11,000 objects.
func bulk(n, m int) []entry {
	out := everything()
	scheds := []string{"rr", "wrr", "wlc", "sh", "mh"}
	for i := range n {
		vip := netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})
		s := svc(lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: vip, Port: uint16(80 + i%3)}, scheds[i%len(scheds)])
		switch i % 7 {
		case 1:
			s = persistent(s, 300, 24)
		case 2:
			s.Key.Proto = lb.UDP
			s = onePacket(s)
		case 3:
			s = svc(lb.ServiceKey{Family: lb.IPv6, Proto: lb.TCP, Addr: netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, 15: byte(i), 14: byte(i >> 8)}), Port: 443}, "wrr")
		}
		e := entry{svc: s}
		for j := range m {
			var d lb.Destination
			if s.Key.Family == lb.IPv6 {
				d = dest(netip.AddrPortFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xee, 13: byte(j), 14: byte(i >> 8), 15: byte(i)}), 8443).String(), lb.Masq)
			} else {
				d = dest(netip.AddrPortFrom(netip.AddrFrom4([4]byte{172, 16 + byte(j), byte(i >> 8), byte(i)}), 8080).String(), lb.Masq)
			}
			switch j % 4 {
			case 1:
				d = withWeight(d, j)
			case 2:
				d = withThresh(d, 1000, 100)
			case 3:
				if s.Key.Family == lb.IPv4 {
					d = tunnel(d.Addr.String(), lb.GUE, 6080, lb.Csum)
				}
			}
			e.dests = append(e.dests, d)
		}
		out = append(out, e)
	}
	return out
}

// opsOf returns the operations that write entries: services, then
// backends, as the planner orders them.
func opsOf(entries []entry) []lb.Op {
	var svcs, dests []lb.Op
	for _, e := range entries {
		svcs = append(svcs, lb.Op{Kind: lb.OpAddService, Service: e.svc})
		for _, d := range e.dests {
			dests = append(dests, lb.Op{Kind: lb.OpAddDest, Service: e.svc, Dest: d})
		}
	}
	return append(svcs, dests...)
}

// one applies ops one at a time, each a batch of one.
func one(tb *table, ops []lb.Op) []error {
	errs := make([]error, len(ops))
	for n, op := range ops {
		switch op.Kind {
		case lb.OpAddService:
			errs[n] = tb.AddService(op.Service)
		case lb.OpUpdateService:
			errs[n] = tb.UpdateService(op.Service)
		case lb.OpDeleteService:
			errs[n] = tb.DeleteService(op.Service.Key)
		case lb.OpAddDest:
			errs[n] = tb.AddDest(op.Service.Key, op.Dest)
		case lb.OpUpdateDest, lb.OpDrainDest:
			errs[n] = tb.UpdateDest(op.Service.Key, op.Dest)
		case lb.OpDeleteDest:
			errs[n] = tb.DeleteDest(op.Service.Key, op.Dest.Addr)
		}
	}
	return errs
}

// batched applies ops through Apply, 1,024 at a time as the
// reconciler does.
func batched(tb *table, ops []lb.Op) []error {
	var errs []error
	for len(ops) > 0 {
		n := min(len(ops), 1024)
		errs = append(errs, tb.Apply(ops[:n])...)
		ops = ops[n:]
	}
	return errs
}

// saved returns ipvsadm -Sn's lines, sorted: the order of services
// depends on the namespace.
func (tb *table) saved(t *testing.T) []string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(tb.run(t, "ipvsadm", "-S", "-n")), "\n")
	slices.Sort(lines)
	return lines
}

func noErrors(t *testing.T, what string, errs []error) {
	t.Helper()
	n := 0
	for _, err := range errs {
		if err != nil {
			if n < 5 {
				t.Errorf("%s: %v", what, err)
			}
			n++
		}
	}
	if n > 5 {
		t.Errorf("%s: %d errors in all", what, n)
	}
}

// sameTables compares two tables as ipvsadm saves them and as the
// adapter reads them.
func sameTables(t *testing.T, step string, a, b *table, want map[lb.ServiceKey]*lb.ServiceState) {
	t.Helper()
	sa, sb := a.saved(t), b.saved(t)
	if !slices.Equal(sa, sb) {
		var d []string
		for _, l := range sa {
			if !slices.Contains(sb, l) {
				d = append(d, "one at a time only: "+l)
			}
		}
		for _, l := range sb {
			if !slices.Contains(sa, l) {
				d = append(d, "batched only: "+l)
			}
		}
		t.Errorf("%s: ipvsadm -Sn differs (%d and %d lines):\n%s", step, len(sa), len(sb), strings.Join(d[:min(len(d), 20)], "\n"))
	}
	for name, tb := range map[string]*table{"one at a time": a, "batched": b} {
		got := services(t, tb.IPVS, want)
		for _, d := range diff(want, got)[:min(len(diff(want, got)), 10)] {
			t.Errorf("%s, %s: %s", step, name, d)
		}
	}
	t.Logf("%s: %d lines of ipvsadm -Sn agree", step, len(sa))
}

// TestBatchEqualsOneAtATime writes over 11,000 objects of many kinds to
// one table one operation at a time and to another in batches, then
// updates and deletes part of them the same two ways: ipvsadm saves the
// two tables the same, and the adapter reads both as written.
func TestBatchEqualsOneAtATime(t *testing.T) {
	a, b := newTable(t), newTable(t)
	all := bulk(1000, 10)
	ops := opsOf(all)

	t0 := time.Now()
	noErrors(t, "one at a time", one(a, ops))
	t1 := time.Now()
	noErrors(t, "batched", batched(b, ops))
	t2 := time.Now()
	t.Logf("%d operations: one at a time %v, batched %v", len(ops), t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond))
	sameTables(t, "add", a, b, wantState(all))

	// Update every tenth service (scheduler and persistence) and every
	// third backend (weight, method, thresholds), delete every fifth
	// backend and every ninth service.
	var upd, del []lb.Op
	next := slices.Clone(all)
	for n := range next {
		e := &next[n]
		e.dests = slices.Clone(e.dests)
		if n%9 == 4 {
			del = append(del, lb.Op{Kind: lb.OpDeleteService, Service: e.svc})
			continue
		}
		if n%10 == 0 && e.svc.Flags == 0 {
			e.svc.Scheduler = "lc"
			e.svc = persistent(e.svc, 120, map[lb.Family]int{lb.IPv4: 16, lb.IPv6: 64}[e.svc.Key.Family])
			upd = append(upd, lb.Op{Kind: lb.OpUpdateService, Service: e.svc})
		}
		var keep []lb.Destination
		for m, d := range e.dests {
			switch {
			case m%5 == 4:
				del = append(del, lb.Op{Kind: lb.OpDeleteDest, Service: e.svc, Dest: d})
				continue
			case m%3 == 0:
				d = withWeight(d, d.Weight+3)
				if d.Forward == lb.Masq {
					d = withThresh(d, 50, 5)
				}
				upd = append(upd, lb.Op{Kind: lb.OpUpdateDest, Service: e.svc, Dest: d})
			}
			keep = append(keep, d)
		}
		e.dests = keep
	}
	next = slices.DeleteFunc(next, func(e entry) bool {
		return slices.ContainsFunc(del, func(op lb.Op) bool { return op.Kind == lb.OpDeleteService && op.Service.Key == e.svc.Key })
	})
	change := append(upd, del...)
	t0 = time.Now()
	noErrors(t, "one at a time", one(a, change))
	t1 = time.Now()
	noErrors(t, "batched", batched(b, change))
	t2 = time.Now()
	t.Logf("%d updates and deletions: one at a time %v, batched %v", len(change), t1.Sub(t0).Round(time.Millisecond), t2.Sub(t1).Round(time.Millisecond))
	sameTables(t, "update and delete", a, b, wantState(next))
}

// TestBatchPartialFailureKernel sends a batch with bad operations in the
// middle to the kernel: each fails alone, with the wording of the
// one-at-a-time methods, and the others apply.
func TestBatchPartialFailureKernel(t *testing.T) {
	tb := newTable(t)
	s := svc(tcp4("192.0.2.1", 80), "rr")
	twos := svc(tcp4("192.0.2.2", 80), "twos")
	missing := svc(tcp4("192.0.2.99", 80), "rr")
	d1, d2, d3 := dest("10.0.0.1:80", lb.Masq), dest("10.0.0.2:80", lb.Masq), dest("10.0.0.3:80", lb.Masq)
	ops := []lb.Op{
		{Kind: lb.OpAddService, Service: s},
		{Kind: lb.OpAddService, Service: twos},
		{Kind: lb.OpAddDest, Service: s, Dest: d1},
		{Kind: lb.OpAddDest, Service: missing, Dest: d1},
		{Kind: lb.OpAddDest, Service: s, Dest: d1},
		{Kind: lb.OpAddDest, Service: s, Dest: dest("[2001:db8::1]:80", lb.Masq)},
		{Kind: lb.OpAddDest, Service: s, Dest: d2},
		{Kind: lb.OpUpdateDest, Service: s, Dest: withWeight(d3, 5)},
		{Kind: lb.OpAddDest, Service: s, Dest: d3},
	}
	want := []string{
		"",
		`add service tcp 192.0.2.2:80: scheduler "twos" is not supported by this kernel (no ip_vs_twos module): no such file or directory`,
		"",
		"add backend tcp 192.0.2.99:80 -> 10.0.0.1:80: no such service: no such process",
		"add backend tcp 192.0.2.1:80 -> 10.0.0.1:80: backend exists: file exists",
		"add backend tcp 192.0.2.1:80 -> [2001:db8::1]:80: invalid argument",
		"",
		"update backend tcp 192.0.2.1:80 -> 10.0.0.3:80: no such backend: no such file or directory",
		"",
	}
	if !inGuest() {
		t.Skip("which schedulers a kernel lacks is known only in the test guest (Linux 6.1 has no twos)")
	}
	errs := tb.Apply(ops)
	for n := range ops {
		got := ""
		if errs[n] != nil {
			got = errs[n].Error()
		}
		if got != want[n] {
			t.Errorf("op %d (%s):\n got %q\nwant %q", n, ops[n], got, want[n])
		}
	}
	// The one-at-a-time methods say the same.
	again := newTable(t)
	errs1 := one(again, ops)
	for n := range ops {
		if fmt.Sprint(errs1[n]) != fmt.Sprint(errs[n]) {
			t.Errorf("op %d: one at a time %v, batched %v", n, errs1[n], errs[n])
		}
	}
	tb.expect(t, wantState([]entry{{s, []lb.Destination{d1, d2, d3}}}))
}

// TestServicesParallel reads a large table with one socket and with
// several: the same services, backends and settings.
func TestServicesParallel(t *testing.T) {
	tb := newTable(t)
	all := bulk(500, 4)
	noErrors(t, "write", batched(tb, opsOf(all)))
	for _, n := range []int{1, 2, 4, 8} {
		i, err := New(Options{NetnsPath: tb.path, DumpSockets: n})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		got := services(t, i, wantState(all))
		took := time.Since(t0)
		i.Close()
		for _, d := range diff(wantState(all), got) {
			t.Errorf("%d sockets: %s", n, d)
		}
		t.Logf("%d sockets: %d services read in %v", n, len(got), took.Round(time.Millisecond))
	}
}

// TestServiceKernel: Service, which sends the service's query and the
// dump of its destinations in one datagram, reads each service as the
// whole-table read does: services of every kind, one with 600
// destinations (an answer of several datagrams), one with none, and a
// missing key.
func TestServiceKernel(t *testing.T) {
	tb := newTable(t)
	all := bulk(60, 3)
	big := entry{svc: svc(tcp4("10.200.0.1", 443), "wrr")}
	for i := range 600 {
		d := dest(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 201, byte(i >> 8), byte(i)}), 443).String(), lb.Masq)
		d.Weight = 1 + i%5
		big.dests = append(big.dests, d)
	}
	all = append(all, big, entry{svc: svc(tcp4("10.200.0.2", 443), "rr")})
	noErrors(t, "write", batched(tb, opsOf(all)))
	whole := services(t, tb.IPVS, wantState(all))
	one := map[lb.ServiceKey]*lb.ServiceState{}
	for _, e := range all {
		st, err := tb.Service(e.svc.Key)
		if err != nil || st == nil {
			t.Fatalf("Service(%s): %+v, %v", e.svc.Key, st, err)
		}
		one[e.svc.Key] = st
	}
	if len(whole) < len(all) {
		t.Fatalf("the whole-table read found %d services, want at least %d", len(whole), len(all))
	}
	for _, d := range diff(wantState(all), one) {
		t.Errorf("one by one: %s", d)
	}
	for k, st := range one {
		if w := whole[k]; w == nil || !maps.EqualFunc(w.Dests, st.Dests, sameObserved) || w.Service != st.Service {
			t.Errorf("%s: one by one %+v, the whole table %+v", k, st, w)
		}
	}
	if got := len(one[big.svc.Key].Dests); got != 600 {
		t.Errorf("the large service: %d destinations, want 600", got)
	}
	if none, err := tb.Service(tcp4("10.200.0.99", 443)); none != nil || err != nil {
		t.Errorf("a missing key: %+v, %v", none, err)
	}
	// The socket is clean for the next request.
	if st, err := tb.Service(big.svc.Key); err != nil || st == nil || len(st.Dests) != 600 {
		t.Errorf("again: %v, %v", st != nil, err)
	}
}

// sameObserved reports whether two reads of a destination agree, its
// counters compared by value.
func sameObserved(a, b lb.Destination) bool {
	if (a.Stats == nil) != (b.Stats == nil) || a.Stats != nil && *a.Stats != *b.Stats {
		return false
	}
	a.Stats, b.Stats = nil, nil
	return a == b
}
