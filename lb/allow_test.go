package lb_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

var allowHost = lb.Host{Kernel: "6.1.0-27-cloud-amd64", Dummy: "vipd0", Addrs: map[string][]netip.Addr{
	"eth0": {netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8:1::1")},
	"eth1": {netip.MustParseAddr("203.0.113.1")},
}}

func allowSpec(rules bool) *lb.Spec {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	svc := func(name, vip string, port uint16, allow []netip.Prefix) lb.VirtualService {
		a := netip.MustParseAddr(vip)
		return lb.VirtualService{
			Name: name, VIP: a, Allow: allow,
			Service:  lb.Service{Key: lb.ServiceKey{Family: lb.FamilyOf(a), Proto: lb.TCP, Addr: a, Port: port}, Scheduler: "wlc"},
			Backends: []lb.Destination{{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Weight: 1, Forward: lb.Masq}},
		}
	}
	spec := &lb.Spec{Services: []lb.VirtualService{
		// Prefixes of the other family admit nothing; host bits are
		// masked.
		svc("web", "192.0.2.10", 80, pfx("10.1.2.3/8", "198.51.100.7/32", "2001:db8::/32")),
		// Only prefixes of the other family: nothing is admitted.
		svc("web6", "2001:db8::10", 80, pfx("10.0.0.0/8")),
		// A /0 of the family admits every source.
		svc("all", "192.0.2.10", 81, pfx("10.0.0.0/8", "0.0.0.0/0")),
		svc("open", "192.0.2.10", 82, nil),
	}}
	np := svc("np", "192.0.2.99", 30080, pfx("192.0.2.0/24"))
	np.VIP, np.NodePort, np.Service.Key.Addr = netip.Addr{}, true, netip.Addr{}
	fw := svc("fw", "192.0.2.11", 0, pfx("10.0.0.0/8"))
	fw.Service.Key = lb.ServiceKey{Family: lb.IPv4, FWMark: 7}
	allPorts := svc("any", "192.0.2.12", 0, pfx("10.0.0.0/8"))
	allPorts.Service.Persistent, allPorts.Service.Netmask = 60, 32
	spec.Services = append(spec.Services, np, fw, allPorts)
	if rules {
		spec.Rules = lb.RulePolicy{Enabled: true, SNATMark: 0x4000000, FilterVIPs: true}
	}
	return spec
}

// TestDesiredAllow: a service's allow list becomes a restriction of its
// address,proto:port and one admitted source per prefix of its family
// (per host address of a nodeport service); a service whose list cannot
// be enforced is not served at all.
func TestDesiredAllow(t *testing.T) {
	d := lb.Desired(allowSpec(true), allowHost)
	dump := d.Dump()
	for _, want := range []string{
		"set allowed/ipv4 192.0.2.10,tcp:80,10.0.0.0/8\n",
		"set allowed/ipv4 192.0.2.10,tcp:80,198.51.100.7/32\n",
		"set restricted/ipv4 192.0.2.10,tcp:80\n",
		"set restricted/ipv6 2001:db8::10,tcp:80\n",
		"set allowed/ipv4 198.51.100.1,tcp:30080,192.0.2.0/24\n",
		"set allowed/ipv4 203.0.113.1,tcp:30080,192.0.2.0/24\n",
		"set restricted/ipv4 198.51.100.1,tcp:30080\n",
		"set restricted/ipv4 203.0.113.1,tcp:30080\n",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("desired state lacks %q:\n%s", want, dump)
		}
	}
	for _, not := range []string{
		"2001:db8::/32",                     // another family's prefix
		"allowed/ipv6",                      // web6 admits nothing
		"restricted/ipv4 192.0.2.10,tcp:81", // a /0 restricts nothing
		"restricted/ipv4 192.0.2.10,tcp:82",
		"192.0.2.11", "fwmark 7", "192.0.2.12", // cannot be enforced: not served
	} {
		if strings.Contains(dump, not) {
			t.Errorf("desired state has %q:\n%s", not, dump)
		}
	}
	if n := strings.Count(dump, "set allowed/") + strings.Count(dump, "set restricted/"); n != 8 {
		t.Errorf("%d allow entries, want 8:\n%s", n, dump)
	}
	// Without vipd's rules nothing can enforce a list: those services
	// are left out rather than served to everyone.
	d = lb.Desired(allowSpec(false), allowHost)
	for k := range d.Services {
		if k.Port != 82 {
			t.Errorf("rules disabled: service %s with an allow list is served", k)
		}
	}
}

// admitted reports whether entries admit src to the service at ap.
func admitted(entries map[lb.SetEntry]struct{}, ap netip.AddrPort, src netip.Addr) bool {
	r := lb.SetEntry{Set: lb.SetRestricted, Addr: ap.Addr(), Proto: lb.TCP, Port: ap.Port()}
	if _, ok := entries[r]; !ok {
		return true
	}
	for e := range entries {
		if e.Set == lb.SetAllowed && e.Addr == ap.Addr() && e.Port == ap.Port() && e.Net.Contains(src) {
			return true
		}
	}
	return false
}

// TestAllowChangesKeepAdmittedSources walks every operation of the plans
// that widen, narrow, replace and remove an allow list, and of a plan
// that restricts an open service: at no point between them is a source
// that both the old and the new list admit refused.
func TestAllowChangesKeepAdmittedSources(t *testing.T) {
	lists := []string{
		``,
		`allow = ["10.0.0.0/8"]`,
		`allow = ["10.0.0.0/8", "172.16.0.0/12", "192.168.1.7"]`,
		`allow = ["172.16.0.0/12"]`,
		`allow = ["192.168.1.7", "10.0.0.0/8"]`,
		`allow = ["0.0.0.0/0"]`,
		``,
	}
	sources := []netip.Addr{netip.MustParseAddr("10.9.9.9"), netip.MustParseAddr("172.16.3.3"), netip.MustParseAddr("192.168.1.7"), netip.MustParseAddr("203.0.113.50")}
	vip := netip.MustParseAddrPort("192.0.2.10:80")
	k := lbtest.New()
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0"})
	cfgOf := func(list string) *lb.Spec {
		return &mustParse(t, "[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\n"+list+"\nbackend = [{ address = \"10.0.0.1\" }]\n").Spec
	}
	for i := range lists {
		for j := range lists {
			if i == j {
				continue
			}
			if _, err := r.Reconcile(context.Background(), cfgOf(lists[i])); err != nil {
				t.Fatal(err)
			}
			var before lb.Rules
			k.Edit(func(s *lb.State) { before = lb.Rules{Entries: maps(s.Rules.Entries)} })
			after := lb.Desired(cfgOf(lists[j]), lb.Host{}).Rules.Entries
			ops, err := r.Plan(context.Background(), cfgOf(lists[j]))
			if err != nil {
				t.Fatal(err)
			}
			cur := maps(before.Entries)
			check := func(when string) {
				for _, src := range sources {
					if admitted(before.Entries, vip, src) && admitted(after, vip, src) && !admitted(cur, vip, src) {
						t.Errorf("%q -> %q: %s refused %s", lists[i], lists[j], src, when)
					}
				}
			}
			for _, op := range ops {
				switch op.Kind {
				case lb.OpAddEntry:
					cur[op.Host.Entry] = struct{}{}
				case lb.OpDelEntry:
					delete(cur, op.Host.Entry)
				}
				check("after " + op.String())
			}
			for _, src := range sources {
				if admitted(cur, vip, src) != admitted(after, vip, src) {
					t.Errorf("%q -> %q: the plan leaves %s admitted=%t", lists[i], lists[j], src, admitted(cur, vip, src))
				}
			}
		}
	}
}

func maps(m map[lb.SetEntry]struct{}) map[lb.SetEntry]struct{} {
	out := make(map[lb.SetEntry]struct{}, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestAllowFailures: when an admitted source fails to be added the
// restriction is not added, and when a restriction fails to be deleted
// its admitted sources stay, so that a failure never refuses a source
// both lists admit.
func TestAllowFailures(t *testing.T) {
	k := lbtest.New()
	boom := errors.New("boom")
	k.FailWith(func(call string) error {
		if strings.HasPrefix(call, "add-entry allowed/") || strings.HasPrefix(call, "del-entry restricted/") {
			return boom
		}
		return nil
	})
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0"})
	restricted := mustParse(t, "[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\nallow = [\"10.0.0.0/8\"]\nbackend = [{ address = \"10.0.0.1\" }]\n")
	res, err := r.Reconcile(context.Background(), &restricted.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(res.Skipped, func(op lb.Op) bool { return op.String() == "add set entry restricted/ipv4 192.0.2.10,tcp:80" }) ||
		strings.Contains(k.Dump(), "restricted/") {
		t.Errorf("the restriction was not skipped after its source failed: skipped %v\n%s", res.Skipped, k.Dump())
	}
	k.FailWith(nil)
	if _, err := r.Reconcile(context.Background(), &restricted.Spec); err != nil {
		t.Fatal(err)
	}
	k.FailWith(func(call string) error {
		if strings.HasPrefix(call, "del-entry restricted/") {
			return boom
		}
		return nil
	})
	open := mustParse(t, "[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n")
	res, err = r.Reconcile(context.Background(), &open.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if dump := k.Dump(); !strings.Contains(dump, "set allowed/ipv4 192.0.2.10,tcp:80,10.0.0.0/8") || len(res.Skipped) != 1 {
		t.Errorf("the admitted source went though its restriction stayed: skipped %v\n%s", res.Skipped, dump)
	}
}

// TestHoldOwnedKeepsRestriction: a restarted daemon that holds a
// service it owns keeps its restriction and admitted sources: a held
// service never opens to every source.
func TestHoldOwnedKeepsRestriction(t *testing.T) {
	k := lbtest.New()
	cfg := mustParse(t, base+"\n[[service]]\nname = \"api\"\nvip = \"192.0.2.11\"\nport = 443\nallow = [\"10.0.0.0/8\"]\nbackend = [{ address = \"10.0.0.3\" }]\n")
	opts := lb.Options{Kernel: k.Interface(), Dummy: "vipd0"}
	if _, err := lb.NewReconciler(opts).Reconcile(context.Background(), &cfg.Spec); err != nil {
		t.Fatal(err)
	}
	k.Calls() // reads and forgets the first pass's calls
	before := k.Dump()
	if !strings.Contains(before, "set restricted/ipv4 192.0.2.11,tcp:443") {
		t.Fatalf("not restricted:\n%s", before)
	}
	held := cfg.Spec
	held.Services = slices.DeleteFunc(slices.Clone(held.Services), func(vs lb.VirtualService) bool { return vs.Name == "api" })
	held.HoldOwned = true
	if _, err := lb.NewReconciler(opts).Reconcile(context.Background(), &held); err != nil {
		t.Fatal(err)
	}
	if calls := k.Calls(); len(calls) != 0 || k.Dump() != before {
		t.Fatalf("held: calls %v; kernel:\n%s", calls, k.Dump())
	}
}

// TestAllowChangeIsNoDelta: a change of an allow list changes set
// entries, which a delta pass leaves alone, so it declines and a full
// pass applies the change.
func TestAllowChangeIsNoDelta(t *testing.T) {
	k := lbtest.New()
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0"})
	src := "[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\n%s\nbackend = [{ address = \"10.0.0.1\" }]\n"
	old := mustParse(t, strings.Replace(src, "%s", `allow = ["10.0.0.0/8"]`, 1))
	cur := mustParse(t, strings.Replace(src, "%s", `allow = ["172.16.0.0/12"]`, 1))
	if _, err := r.Reconcile(context.Background(), &old.Spec); err != nil {
		t.Fatal(err)
	}
	_, ok, err := r.ReconcileDelta(context.Background(), &cur.Spec, lb.Delta{Old: old.Spec.Services, New: cur.Spec.Services})
	if ok || err != nil {
		t.Errorf("ReconcileDelta of an allow change: ok %t, err %v; want it declined", ok, err)
	}
}
