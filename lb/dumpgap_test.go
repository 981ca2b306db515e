package lb_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// A dump of the kernel's IPVS table is no snapshot: changes in other
// network namespaces during a dump make it skip or repeat services (see
// ipvs.IPVS.Services). These tests make the fake kernel's dump miss
// services and check that a pass does what it would have done with a
// whole dump: no operation fails, nothing vipd owns is dropped from the
// ledger or left behind, and the kernel ends where a pass over a whole
// dump takes it. Repeated services are tested in kernel/ipvs, whose netlink
// fake can send them.

const gapConfig = `
[daemon]
uplinks = ["eth0"]

[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
scheduler = "rr"
backend = [{ address = "10.0.0.1" }, { address = "10.0.0.2" }]

[[service]]
name = "api"
vip = "192.0.2.20"
port = 443
backend = [{ address = "10.0.1.1" }]

[[service]]
name = "mark"
fwmark = 7
backend = [{ address = "10.0.2.1" }]
`

var (
	webKey  = lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("192.0.2.10"), Port: 80}
	apiKey  = lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("192.0.2.20"), Port: 443}
	markKey = lb.ServiceKey{Family: lb.IPv4, FWMark: 7}
)

// without returns gapConfig without the named service.
func without(name string) string {
	start := strings.Index(gapConfig, "[[service]]\nname = \""+name+"\"")
	end := strings.Index(gapConfig[start+1:], "[[service]]")
	if end < 0 {
		return gapConfig[:start]
	}
	return gapConfig[:start] + gapConfig[start+1+end:]
}

// twins are two fake kernels driven alike, except that the dumps of one
// have gaps; ref shows what a pass over a whole dump does.
type twins struct {
	k, ref *lbtest.Kernel
	r, rr  *lb.Reconciler
}

func newTwins(t *testing.T, opts lb.Options) *twins {
	t.Helper()
	tw := &twins{k: lbtest.New(), ref: lbtest.New()}
	mk := func(k *lbtest.Kernel) *lb.Reconciler {
		o := opts
		o.Kernel = k.Interface()
		o.Dummy = "vipd0"
		return lb.NewReconciler(o)
	}
	tw.r, tw.rr = mk(tw.k), mk(tw.ref)
	tw.both(t, gapConfig)
	return tw
}

// edit changes both kernels behind vipd's back.
func (tw *twins) edit(f func(*lb.State)) {
	tw.k.Edit(f)
	tw.ref.Edit(f)
}

// both runs a pass for config on both kernels, checks the gap's pass does
// what the whole dump's does, and returns the gap's result.
func (tw *twins) both(t *testing.T, config string) *lb.Result {
	t.Helper()
	spec := &mustParse(t, config).Spec
	res, err := tw.r.Reconcile(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := tw.rr.Reconcile(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Failed {
		t.Errorf("failed: %v", f)
	}
	if got, want := opStrings(res.Applied), opStrings(ref.Applied); !slices.Equal(got, want) {
		t.Errorf("applied\n  %s\nwant, as over a whole dump,\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if got, want := tw.k.Dump(), tw.ref.Dump(); got != want {
		t.Errorf("kernel and ledger\n%s\nwant, as over a whole dump,\n%s", got, want)
	}
	ops, err := tw.r.Plan(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		t.Errorf("the next pass plans %s", op)
	}
	return res
}

func opStrings(ops []lb.Op) []string {
	var out []string
	for _, op := range ops {
		out = append(out, op.String())
	}
	return out
}

func setConns(key lb.ServiceKey, addr string, active uint32) func(*lb.State) {
	return func(s *lb.State) {
		svc := s.Services[key]
		d := svc.Dests[netip.MustParseAddrPort(addr)]
		d.ActiveConns = active
		svc.Dests[d.Addr] = d
	}
}

func addBackend(key lb.ServiceKey, addr string, weight int) func(*lb.State) {
	return func(s *lb.State) {
		a := netip.MustParseAddrPort(addr)
		s.Services[key].Dests[a] = lb.Destination{Addr: a, Weight: weight, Forward: lb.Masq}
	}
}

// TestDumpMissesWantedService: a wanted service the dump missed is
// planned as an add; the add finds it, is no failure, and the service,
// read alone, gets what a whole dump would have planned for it (here
// the removal of a backend added behind vipd's back), not a second copy
// of what it has.
func TestDumpMissesWantedService(t *testing.T) {
	for _, key := range []lb.ServiceKey{webKey, markKey} {
		tw := newTwins(t, lb.Options{})
		tw.k.Calls()
		// At weight 0 and idle, so that a pass deletes it at once
		// (a backend in rotation leaves by weight 0 first).
		tw.edit(addBackend(key, "10.0.9.9:0", 0))
		tw.k.MissNext(key)
		res := tw.both(t, gapConfig)
		if len(res.Existed) != 1 || res.Existed[0].Kind != lb.OpAddService || res.Existed[0].Service.Key != key {
			t.Errorf("%s: existed %v, want the add of the service", key, opStrings(res.Existed))
		}
		if len(res.Applied) != 1 || res.Applied[0].Kind != lb.OpDeleteDest {
			t.Errorf("%s: applied %v, want the removal of the extra backend", key, opStrings(res.Applied))
		}
		if len(res.Skipped) != 0 {
			t.Errorf("%s: skipped %v", key, opStrings(res.Skipped))
		}
		if reads := tw.k.Reads(); !slices.Contains(reads, "service "+key.String()) {
			t.Errorf("%s: reads %v: the service was not read again", key, reads)
		}
		for _, c := range tw.k.Calls() {
			if strings.HasPrefix(c, "add-") {
				t.Errorf("%s: call %s", key, c)
			}
		}
	}
}

// TestDumpMissesOwnedService: a service of the ledger that the
// configuration dropped and the dump missed is read alone before it is
// taken as gone: it is removed as over a whole dump, or, with
// connections and drain_services, drained with its VIP kept, and it
// stays in the ledger until it goes. Taken as gone, it would have left
// the ledger and stayed forever as a foreign service.
func TestDumpMissesOwnedService(t *testing.T) {
	t.Run("removed", func(t *testing.T) {
		tw := newTwins(t, lb.Options{})
		for _, name := range []string{"api", "mark"} {
			key := map[string]lb.ServiceKey{"api": apiKey, "mark": markKey}[name]
			tw.k.MissNext(key)
			res := tw.both(t, without(name))
			if !slices.ContainsFunc(res.Applied, func(op lb.Op) bool { return op.Kind == lb.OpDeleteService && op.Service.Key == key }) {
				t.Errorf("%s: applied %v, want its deletion", name, opStrings(res.Applied))
			}
			// Put it back for the next one.
			tw.both(t, gapConfig)
		}
	})
	t.Run("drained", func(t *testing.T) {
		opts := lb.Options{Removal: lb.RemovalPolicy{Drain: true, DrainServices: true, DrainTimeout: time.Hour}}
		tw := newTwins(t, opts)
		tw.edit(setConns(apiKey, "10.0.1.1:443", 3))
		tw.k.MissNext(apiKey)
		res := tw.both(t, without("api"))
		if !strings.Contains(tw.k.Dump(), "vip 192.0.2.20\n") || !strings.Contains(tw.k.Dump(), "service tcp 192.0.2.20:443 scheduler=wlc (owned)") {
			t.Errorf("the draining service lost its VIP or its place in the ledger:\n%s", tw.k.Dump())
		}
		if !slices.ContainsFunc(res.Applied, func(op lb.Op) bool { return op.Kind == lb.OpDrainDest }) ||
			slices.ContainsFunc(res.Applied, func(op lb.Op) bool { return op.Kind == lb.OpUnbindVIP }) {
			t.Errorf("applied %v, want the drain of its backend and no unbind", opStrings(res.Applied))
		}
		// Missed again while it drains, then gone.
		tw.k.MissNext(apiKey)
		tw.both(t, without("api"))
		tw.edit(setConns(apiKey, "10.0.1.1:443", 0))
		tw.k.MissNext(apiKey)
		tw.both(t, without("api"))
		if strings.Contains(tw.k.Dump(), "192.0.2.20") {
			t.Errorf("the drained service stayed:\n%s", tw.k.Dump())
		}
	})
}

// racer is the fake kernel's IPVS with another writer: before the first
// addition of a backend reaches the kernel, race changes the table.
type racer struct {
	*lbtest.Kernel
	race func()
	// readErr, if set, fails single-service reads.
	readErr error
}

func (r *racer) run() {
	if r.race != nil {
		f := r.race
		r.race = nil
		f()
	}
}

func (r *racer) Apply(ops []lb.Op) []error {
	r.run()
	return r.Kernel.Apply(ops)
}

func (r *racer) Service(key lb.ServiceKey) (*lb.ServiceState, error) {
	if r.readErr != nil {
		return nil, r.readErr
	}
	return r.Kernel.Service(key)
}

// racing returns k's adapters with a racer as IPVS.
func racing(k *lbtest.Kernel) (lb.Kernel, *racer) {
	r := &racer{Kernel: k}
	kk := k.Interface()
	kk.IPVS = r
	return kk, r
}

// TestAddFindsBackend: a backend added by another writer between the
// read and the add (another tool, or a dump whose answer for the
// service was short) makes the add find it: the service is read again
// and gets the update and removal a pass would plan after the other
// writer, and nothing fails.
func TestAddFindsBackend(t *testing.T) {
	other := func(s *lb.State) {
		addBackend(webKey, "10.0.0.3:80", 1)(s)
		addBackend(webKey, "10.0.9.9:80", 0)(s) // idle at weight 0: deleted at once
	}
	tw := newTwins(t, lb.Options{})
	// The same kernel, now with the other writer on the add path.
	kk, rc := racing(tw.k)
	rc.race = func() { tw.k.Edit(other) }
	tw.r = lb.NewReconciler(lb.Options{Kernel: kk, Dummy: "vipd0"})
	tw.ref.Edit(other)
	config := strings.Replace(gapConfig, `{ address = "10.0.0.2" }]`, `{ address = "10.0.0.2" }, { address = "10.0.0.3", weight = 5 }]`, 1)
	res := tw.both(t, config)
	if len(res.Existed) != 1 || res.Existed[0].Kind != lb.OpAddDest || res.Existed[0].Dest.Addr.String() != "10.0.0.3:80" {
		t.Errorf("existed %v, want the add of 10.0.0.3:80", opStrings(res.Existed))
	}
	want := []string{
		"update backend tcp 192.0.2.10:80 -> 10.0.0.3:80 masq weight=5 (was 10.0.0.3:80 masq weight=1)",
		"delete backend tcp 192.0.2.10:80 -> 10.0.9.9:80",
	}
	if got := opStrings(res.Applied); !slices.Equal(got, want) {
		t.Errorf("applied %q, want %q", got, want)
	}
}

// TestAddFindsServiceReadFails: when the service an add found cannot be
// read again, the add fails with both errors and its backends are
// skipped, as for any failed add.
func TestAddFindsServiceReadFails(t *testing.T) {
	k := lbtest.New()
	kk, rc := racing(k)
	rc.readErr = errors.New("boom")
	r := lb.NewReconciler(lb.Options{Kernel: kk, Dummy: "vipd0"})
	if res, err := r.Reconcile(context.Background(), &mustParse(t, gapConfig).Spec); err != nil || len(res.Failed) != 0 {
		t.Fatalf("first pass: %v, %v", err, res.Failed)
	}
	k.MissNext(webKey)
	res, err := r.Reconcile(context.Background(), &mustParse(t, gapConfig).Spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed) != 1 || res.Failed[0].Op.Kind != lb.OpAddService ||
		res.Failed[0].Err.Error() != "file exists; reading the service again failed: boom" || !errors.Is(res.Failed[0], lbtest.ErrExist) {
		t.Errorf("failed %v, want the add of web with both errors", res.Failed)
	}
	if len(res.Skipped) != 2 || len(res.Applied) != 0 || len(res.Existed) != 0 {
		t.Errorf("skipped %v, applied %v, existed %v; want web's 2 backends skipped, nothing else", opStrings(res.Skipped), opStrings(res.Applied), opStrings(res.Existed))
	}
}

// TestApplyAddFindsService: Apply, which has operations but no desired
// state, makes a service an add found what the operations say: the
// settings of the add, its backends as added, and the backends the
// operations do not name left alone.
func TestApplyAddFindsService(t *testing.T) {
	k := lbtest.New()
	d1 := lb.Destination{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Weight: 1, Forward: lb.Masq}
	d9 := lb.Destination{Addr: netip.MustParseAddrPort("10.0.0.9:80"), Weight: 2, Forward: lb.Masq}
	k.Edit(func(s *lb.State) {
		old := d1
		old.Weight = 3
		s.Services[webKey] = &lb.ServiceState{
			Service: lb.Service{Key: webKey, Scheduler: "wlc"},
			Dests:   map[netip.AddrPort]lb.Destination{d1.Addr: old, d9.Addr: d9},
		}
	})
	kk, _ := racing(k)
	r := lb.NewReconciler(lb.Options{Kernel: kk})
	web := lb.Service{Key: webKey, Scheduler: "rr"}
	res := r.Apply(context.Background(), []lb.Op{
		{Kind: lb.OpAddService, Service: web},
		{Kind: lb.OpAddDest, Service: web, Dest: d1},
	})
	for _, f := range res.Failed {
		t.Errorf("failed: %v", f)
	}
	want := []string{
		"update service tcp 192.0.2.10:80 scheduler=rr (was tcp 192.0.2.10:80 scheduler=wlc)",
		"update backend tcp 192.0.2.10:80 -> 10.0.0.1:80 masq weight=1 (was 10.0.0.1:80 masq weight=3)",
	}
	if got := opStrings(res.Applied); !slices.Equal(got, want) {
		t.Errorf("applied %q, want %q", got, want)
	}
	if len(res.Existed) != 1 || len(res.Skipped) != 0 {
		t.Errorf("existed %v, skipped %v", opStrings(res.Existed), opStrings(res.Skipped))
	}
	wantDump := "service tcp 192.0.2.10:80 scheduler=rr\n  -> 10.0.0.1:80 masq weight=1\n  -> 10.0.0.9:80 masq weight=2\n"
	if got := k.Dump(); got != wantDump {
		t.Errorf("kernel\n%s\nwant\n%s", got, wantDump)
	}
}

// TestAddFindsBackendBesideFailure: an operation that failed in the pass
// is not tried again by the plan of its service made anew after another
// add of it found its backend: it fails once.
func TestAddFindsBackendBesideFailure(t *testing.T) {
	k := lbtest.New()
	kk, rc := racing(k)
	r := lb.NewReconciler(lb.Options{Kernel: kk, Dummy: "vipd0"})
	if res, err := r.Reconcile(context.Background(), &mustParse(t, gapConfig).Spec); err != nil || len(res.Failed) != 0 {
		t.Fatalf("first pass: %v, %v", err, res.Failed)
	}
	rc.race = func() { k.Edit(addBackend(webKey, "10.0.0.3:80", 1)) }
	k.FailWith(func(call string) error {
		if strings.HasPrefix(call, "add-dest tcp 192.0.2.10:80 10.0.0.4:80") {
			return errors.New("boom")
		}
		return nil
	})
	config := strings.Replace(gapConfig, `{ address = "10.0.0.2" }]`, `{ address = "10.0.0.2" }, { address = "10.0.0.3", weight = 5 }, { address = "10.0.0.4" }]`, 1)
	res, err := r.Reconcile(context.Background(), &mustParse(t, config).Spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed) != 1 || !strings.Contains(res.Failed[0].Error(), "10.0.0.4:80") {
		t.Errorf("failed %v, want the add of 10.0.0.4:80 once", res.Failed)
	}
	if len(res.Existed) != 1 || res.Existed[0].Dest.Addr.String() != "10.0.0.3:80" {
		t.Errorf("existed %v, want the add of 10.0.0.3:80", opStrings(res.Existed))
	}
	if !slices.Contains(opStrings(res.Applied), "update backend tcp 192.0.2.10:80 -> 10.0.0.3:80 masq weight=5 (was 10.0.0.3:80 masq weight=1)") {
		t.Errorf("applied %v, want the update of 10.0.0.3:80", opStrings(res.Applied))
	}
}
