package ipvs

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// dumpTable writes n services of 2 destinations each to a fake kernel
// with the given sockets and returns the adapter, the table and what it
// reads back as.
func dumpTable(t *testing.T, n, sockets int) (*IPVS, *fakeTable, []*fakeConn, map[lb.ServiceKey]*lb.ServiceState) {
	t.Helper()
	i, tab, conns := fakeIPVS(t, sockets, 256)
	var all []entry
	for x := range n {
		e := entry{svc: svc(tcp4("192.0.2.1", uint16(1000+x)), "wrr")}
		for m := range 2 {
			e.dests = append(e.dests, withWeight(dest(fmt.Sprintf("10.0.%d.%d:8080", x, m), lb.Masq), m+1))
		}
		all = append(all, e)
	}
	for n, err := range i.Apply(opsOf(all)) {
		if err != nil {
			t.Fatalf("op %d: %v", n, err)
		}
	}
	return i, tab, conns, wantState(all)
}

// destDumps counts the dumps of destinations sent on conns since the
// sends counted in before.
func destDumps(t *testing.T, conns []*fakeConn, before []int) int {
	t.Helper()
	n := 0
	for x, c := range conns {
		for _, d := range c.sends[before[x]:] {
			for _, r := range requests(t, d) {
				if r[unix.NLMSG_HDRLEN] == cmdGetDest {
					n++
				}
			}
		}
	}
	return n
}

func sendCounts(conns []*fakeConn) []int {
	var out []int
	for _, c := range conns {
		out = append(out, len(c.sends))
	}
	return out
}

// TestServicesRepeatedInDump: a service dump that sends services twice,
// as a real one does when a service is added in another namespace
// between two parts of the answer, reads each once, with its
// destinations neither doubled nor lost, and dumps each one's
// destinations once; on one socket and on several.
func TestServicesRepeatedInDump(t *testing.T) {
	for _, sockets := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d sockets", sockets), func(t *testing.T) {
			const n = 70 // more than parallelMin: several sockets read
			i, tab, conns, want := dumpTable(t, n, sockets)
			tab.reorder = func(order []string) []string {
				// The first part ends after the 40th service; the second
				// starts 3 back, and the last service comes twice.
				out := slices.Concat(order[:40], order[37:], order[n-1:])
				if len(out) != n+4 {
					t.Fatalf("reordered dump of %d services", len(out))
				}
				return out
			}
			before := sendCounts(conns)
			got, err := i.Services()
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range diff(want, got) {
				t.Error(d)
			}
			if tab.reorder != nil {
				t.Error("the dump did not repeat services")
			}
			if d := destDumps(t, conns, before); d != n {
				t.Errorf("%d dumps of destinations, want one per service (%d)", d, n)
			}
		})
	}
}

// TestServicesSkippedInDump: a dump that skips a service, as a real one
// does when a service is deleted in another namespace between two parts
// of the answer, cannot tell: the service is missing from Services, and
// Service, which callers ask before taking a service as gone, finds it
// with its destinations.
func TestServicesSkippedInDump(t *testing.T) {
	i, tab, _, want := dumpTable(t, 10, 1)
	tab.reorder = func(order []string) []string { return slices.Delete(order, 4, 5) }
	got, err := i.Services()
	if err != nil {
		t.Fatal(err)
	}
	skipped := tcp4("192.0.2.1", 1004)
	if len(got) != len(want)-1 || got[skipped] != nil {
		t.Fatalf("read %d services (%v the skipped one), want %d without it", len(got), got[skipped] != nil, len(want)-1)
	}
	st, err := i.Service(skipped)
	if err != nil || st == nil {
		t.Fatalf("Service(%s): %v, %v", skipped, st, err)
	}
	got[skipped] = st
	for _, d := range diff(want, got) {
		t.Error(d)
	}
	// The next dump is whole again.
	got, err = i.Services()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diff(want, got) {
		t.Errorf("next dump: %s", d)
	}
}

// fakeKeyOf names key as the fake kernel does.
func fakeKeyOf(t *testing.T, key lb.ServiceKey) string {
	t.Helper()
	k, err := toKernelKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return fakeKey(appendKey(nil, k), true)
}

// TestReconcileOverDumpGaps drives the reconciler over the adapter on a
// fake kernel whose service dumps repeat and skip services, as real ones
// do while other namespaces change their tables: no operation fails,
// nothing is added twice, the ledger keeps what vipd owns, and a service
// the configuration dropped goes although the dump missed it.
func TestReconcileOverDumpGaps(t *testing.T) {
	i, tab, _ := fakeIPVS(t, 2, 256)
	ledger := lbtest.New()
	r := lb.NewReconciler(lb.Options{Kernel: lb.Kernel{IPVS: i, Ledger: ledger}})
	var all []entry
	for x := range 70 {
		e := entry{svc: svc(tcp4("192.0.2.1", uint16(1000+x)), "wrr")}
		for m := range 2 {
			e.dests = append(e.dests, withWeight(dest(fmt.Sprintf("10.0.%d.%d:8080", x, m), lb.Masq), m+1))
		}
		all = append(all, e)
	}
	ctx := context.Background()
	pass := func(step string, entries []entry) *lb.Result {
		t.Helper()
		res, err := r.Reconcile(ctx, spec(entries))
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		for _, f := range res.Failed {
			t.Errorf("%s: failed %v", step, f)
		}
		got, err := i.Services()
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range diff(wantState(entries), got) {
			t.Errorf("%s: %s", step, d)
		}
		owned, err := ledger.Load()
		if err != nil {
			t.Fatal(err)
		}
		if len(owned) != len(entries) {
			t.Errorf("%s: the ledger lists %d services, want %d", step, len(owned), len(entries))
		}
		for _, e := range entries {
			if _, ok := owned[e.svc.Key]; !ok {
				t.Errorf("%s: the ledger lost %s", step, e.svc.Key)
			}
		}
		return res
	}
	pass("first pass", all)

	tab.reorder = func(order []string) []string { return slices.Concat(order[:40], order[37:], order[69:]) }
	if res := pass("a dump that repeats services", all); len(res.Applied)+len(res.Existed)+len(res.Skipped) != 0 {
		t.Errorf("a dump that repeats services: applied %v, existed %v, skipped %v", res.Applied, res.Existed, res.Skipped)
	}

	missed := all[5].svc.Key
	skip := func(key lb.ServiceKey) {
		fk := fakeKeyOf(t, key)
		tab.reorder = func(order []string) []string {
			n := len(order)
			order = slices.DeleteFunc(order, func(k string) bool { return k == fk })
			if len(order) != n-1 {
				t.Fatalf("%s is not in the table", key)
			}
			return order
		}
	}
	skip(missed)
	res := pass("a dump that skips a wanted service", all)
	if len(res.Applied) != 0 || len(res.Existed) != 1 || res.Existed[0].Kind != lb.OpAddService || res.Existed[0].Service.Key != missed {
		t.Errorf("a dump that skips a wanted service: applied %v, existed %v; want the add of %s found and nothing applied", res.Applied, res.Existed, missed)
	}
	if tab.reorder != nil {
		t.Error("the pass read no dump")
	}

	dropped := all[7].svc.Key
	skip(dropped)
	res = pass("a dump that skips a dropped service", slices.Delete(slices.Clone(all), 7, 8))
	if len(res.Applied) != 1 || res.Applied[0].Kind != lb.OpDeleteService || res.Applied[0].Service.Key != dropped {
		t.Errorf("a dump that skips a dropped service: applied %v, want its deletion", res.Applied)
	}
}
