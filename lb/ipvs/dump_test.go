package ipvs

import (
	"fmt"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
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
	for n, err := range i.ApplyBatch(opsOf(all)) {
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
