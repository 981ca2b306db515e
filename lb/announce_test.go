package lb_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

func TestReconcileAnnouncements(t *testing.T) {
	k := lbtest.New()
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0", KernelRelease: "6.1.0"})
	spec := &lb.Spec{Services: []lb.VirtualService{
		announced("a", "192.0.2.1", true), announced("b", "192.0.2.2", true), announced("c", "2001:db8::3", true),
	}}
	if _, err := r.Reconcile(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	before := k.Dump()
	k.Calls()
	k.Reads()
	// A backup withdraws every VIP and keeps the rest.
	backup := &lb.Spec{Services: slices.Clone(spec.Services)}
	for i := range backup.Services {
		backup.Services[i].Announce = false
	}
	res, err := r.ReconcileAnnouncements(context.Background(), backup)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(k.Calls(), "\n"); got != "withdraw 192.0.2.1\nwithdraw 192.0.2.2\nwithdraw 2001:db8::3" {
		t.Errorf("calls:\n%s", got)
	}
	if len(res.Applied) != 3 || len(res.Failed) != 0 {
		t.Errorf("result %+v", res)
	}
	if reads := k.Reads(); len(reads) != 0 {
		t.Errorf("the pass read IPVS: %v", reads)
	}
	var rest []string
	for _, l := range strings.SplitAfter(before, "\n") {
		if !strings.HasPrefix(l, "announce ") {
			rest = append(rest, l)
		}
	}
	if got, want := k.Dump(), strings.Join(rest, ""); got != want {
		t.Errorf("after withdrawing:\n%s\nwant\n%s", got, want)
	}
	// Master again: everything is announced, nothing else changes.
	if _, err := r.ReconcileAnnouncements(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	if got := k.Dump(); got != before {
		t.Errorf("after announcing again:\n%s\nwant\n%s", got, before)
	}
	// Nothing to do: no call.
	k.Calls()
	if res, _ := r.ReconcileAnnouncements(context.Background(), spec); len(res.Applied) != 0 || len(k.Calls()) != 0 {
		t.Errorf("a pass with nothing to do did something")
	}
}

func announced(name, vip string, on bool) lb.VirtualService {
	a := netip.MustParseAddr(vip)
	return lb.VirtualService{Name: name, VIP: a, Announce: on,
		Service:  lb.Service{Key: lb.ServiceKey{Family: lb.FamilyOf(a), Proto: lb.TCP, Addr: a, Port: 80}, Scheduler: "wlc"},
		Backends: []lb.Destination{{Addr: netip.AddrPortFrom(a.Next(), 80), Weight: 1, Forward: lb.Masq}}}
}
