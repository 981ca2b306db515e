package lb_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

const deltaBase = `
[daemon]
uplinks = ["eth0"]
drain = true

[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
scheduler = "wrr"
snat = true
backend = [{ address = "10.0.0.1" }, { address = "10.0.0.2" }]

[[service]]
name = "dns"
vip = "192.0.2.10"
port = 53
protocol = "udp"
backend = [{ address = "10.0.0.53" }]

[[service]]
name = "api"
vip = "192.0.2.11"
port = 443
backend = [{ address = "10.0.1.1" }, { address = "10.0.1.2", weight = 3 }]
`

// deltaOf returns the change from old to cur of the named services.
func deltaOf(old, cur *config.Config, names ...string) lb.Delta {
	var d lb.Delta
	for _, vs := range old.Spec.Services {
		if slices.Contains(names, vs.Name) {
			d.Old = append(d.Old, vs)
		}
	}
	for _, vs := range cur.Spec.Services {
		if slices.Contains(names, vs.Name) {
			d.New = append(d.New, vs)
		}
	}
	return d
}

// newPair returns two reconcilers over two fake kernels, both programmed
// with src by a full pass.
func newPair(t *testing.T, src string) (delta, full *lb.Reconciler, kd, kf *lbtest.Kernel) {
	t.Helper()
	mk := func() (*lb.Reconciler, *lbtest.Kernel) {
		k := lbtest.New()
		r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0", KernelRelease: "6.1.0-27-cloud-amd64", Removal: lb.RemovalPolicy{Drain: true}})
		res, err := r.Reconcile(context.Background(), &mustParse(t, src).Spec)
		if err != nil || len(res.Failed) > 0 {
			t.Fatalf("first pass: %v %v", err, res.Failed)
		}
		k.Calls()
		k.Reads()
		return r, k
	}
	delta, kd = mk()
	full, kf = mk()
	return delta, full, kd, kf
}

// TestReconcileDelta: a change confined to services applied by
// ReconcileDelta leaves the kernel exactly as a full pass does, with the
// same calls, reading only the touched services.
func TestReconcileDelta(t *testing.T) {
	edits := []struct {
		name, from, to string
		services       []string
	}{
		{"weight", `{ address = "10.0.1.2", weight = 3 }`, `{ address = "10.0.1.2", weight = 5 }`, []string{"api"}},
		{"add backend", `{ address = "10.0.0.53" }]`, `{ address = "10.0.0.53" }, { address = "10.0.0.54" }]`, []string{"dns"}},
		{"remove idle backend", `{ address = "10.0.1.1" }, `, ``, []string{"api"}},
		{"scheduler", `scheduler = "wrr"`, `scheduler = "mh"`, []string{"web"}},
		{"persistence", "port = 443\n", "port = 443\npersistence = \"5m\"\n", []string{"api"}},
		{"two services", `weight = 3 }`, `weight = 4 }`, []string{"api", "web"}},
	}
	for _, e := range edits {
		t.Run(e.name, func(t *testing.T) {
			cur := strings.Replace(deltaBase, e.from, e.to, 1)
			if cur == deltaBase {
				t.Fatalf("edit %q changes nothing", e.from)
			}
			old, next := mustParse(t, deltaBase), mustParse(t, cur)
			rd, rf, kd, kf := newPair(t, deltaBase)
			res, ok, err := rd.ReconcileDelta(context.Background(), &next.Spec, deltaOf(old, next, e.services...))
			if err != nil || !ok {
				t.Fatalf("ReconcileDelta: ok %v, err %v", ok, err)
			}
			if len(res.Applied) == 0 || len(res.Failed) > 0 {
				t.Fatalf("applied %v, failed %v", res.Applied, res.Failed)
			}
			fres, err := rf.Reconcile(context.Background(), &next.Spec)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := kd.Dump(), kf.Dump(); got != want {
				t.Errorf("kernel after the delta pass:\n%s\nafter a full pass:\n%s", got, want)
			}
			if got, want := kd.Calls(), kf.Calls(); !slices.Equal(got, want) {
				t.Errorf("delta pass calls %q, full pass %q", got, want)
			}
			if len(res.Applied) != len(fres.Applied) {
				t.Errorf("delta pass applied %d operations, full pass %d", len(res.Applied), len(fres.Applied))
			}
			for _, r := range kd.Reads() {
				if !strings.HasPrefix(r, "service ") {
					t.Errorf("delta pass read %q; want only the touched services", r)
				}
			}
			// A removed backend went to weight 0; the next pass over its
			// service (the daemon's drain pass) deletes it, idle. Then
			// nothing is left for a full pass to do.
			ops, err := rd.Plan(context.Background(), &next.Spec)
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(ops, func(op lb.Op) bool { return op.Kind != lb.OpDeleteDest }) {
				t.Fatalf("a full plan after the delta pass still has %v", ops)
			}
			if len(ops) > 0 {
				res, ok, err := rd.ReconcileDelta(context.Background(), &next.Spec, deltaOf(next, next, e.services...))
				if err != nil || !ok || len(res.Applied) != len(ops) || len(res.Failed) > 0 {
					t.Fatalf("second delta pass: ok %v, err %v, applied %v, failed %v; want %v", ok, err, res.Applied, res.Failed, ops)
				}
				if ops, err = rd.Plan(context.Background(), &next.Spec); err != nil || len(ops) > 0 {
					t.Errorf("a full plan after the second delta pass still has %v (%v)", ops, err)
				}
			}
		})
	}
}

// TestReconcileDeltaDeclines: changes that reach what services share are
// refused (ok false) without touching or reading the kernel, so the
// caller runs a full pass.
func TestReconcileDeltaDeclines(t *testing.T) {
	edits := []struct {
		name, from, to string
		services       []string
	}{
		{"new port", "port = 443\n", "port = 8443\n", []string{"api"}},
		{"new vip", `vip = "192.0.2.11"`, `vip = "192.0.2.12"`, []string{"api"}},
		{"announce off", "port = 443\n", "port = 443\nannounce = false\n", []string{"api"}},
		{"snat off", "snat = true\n", "", []string{"web"}},
		{"new service", "", "", []string{"extra"}},
	}
	for _, e := range edits {
		t.Run(e.name, func(t *testing.T) {
			cur := strings.Replace(deltaBase, e.from, e.to, 1)
			if e.name == "new service" {
				cur += "\n[[service]]\nname = \"extra\"\nvip = \"192.0.2.10\"\nport = 8080\nbackend = [{ address = \"10.0.2.1\" }]\n"
			}
			old, next := mustParse(t, deltaBase), mustParse(t, cur)
			rd, _, kd, _ := newPair(t, deltaBase)
			_, ok, err := rd.ReconcileDelta(context.Background(), &next.Spec, deltaOf(old, next, e.services...))
			if err != nil || ok {
				t.Fatalf("ReconcileDelta: ok %v, err %v; want a refusal", ok, err)
			}
			if c, r := kd.Calls(), kd.Reads(); len(c)+len(r) > 0 {
				t.Errorf("a refused delta touched the kernel: calls %q, reads %q", c, r)
			}
		})
	}
}

// TestReconcileDeltaDrains: a backend removed while it has connections
// drains (weight 0) as in a full pass, from the fresh read of its service.
func TestReconcileDeltaDrains(t *testing.T) {
	cur := strings.Replace(deltaBase, `{ address = "10.0.1.1" }, `, ``, 1)
	old, next := mustParse(t, deltaBase), mustParse(t, cur)
	rd, _, kd, _ := newPair(t, deltaBase)
	busy := netip.MustParseAddrPort("10.0.1.1:443")
	kd.Edit(func(s *lb.State) {
		for _, st := range s.Services {
			if d, ok := st.Dests[busy]; ok {
				d.ActiveConns = 7
				st.Dests[busy] = d
			}
		}
	})
	res, ok, err := rd.ReconcileDelta(context.Background(), &next.Spec, deltaOf(old, next, "api"))
	if err != nil || !ok {
		t.Fatalf("ReconcileDelta: ok %v, err %v", ok, err)
	}
	if len(res.Applied) != 1 || res.Applied[0].Kind != lb.OpDrainDest {
		t.Fatalf("applied %v; want one drain", res.Applied)
	}
	if rd.Draining() != 1 {
		t.Errorf("draining %d backends; want 1", rd.Draining())
	}
}

// TestReconcileDeltaTrusted: a change that keeps a service's settings and
// backends (weights) is planned from the old desired state without
// reading the service, and leaves the kernel as a full pass does; a
// change of settings, or of the backends, reads it.
func TestReconcileDeltaTrusted(t *testing.T) {
	for _, e := range []struct {
		name, from, to string
		read           bool
	}{
		{"weight", `weight = 3 }`, `weight = 5 }`, false},
		{"weight to 0", `weight = 3 }`, `weight = 0 }`, false},
		{"scheduler", "port = 443\n", "port = 443\nscheduler = \"rr\"\n", true},
		{"add backend", `weight = 3 }`, `weight = 3 }, { address = "10.0.1.3" }`, true},
	} {
		t.Run(e.name, func(t *testing.T) {
			cur := strings.Replace(deltaBase, e.from, e.to, 1)
			old, next := mustParse(t, deltaBase), mustParse(t, cur)
			rd, rf, kd, kf := newPair(t, deltaBase)
			res, ok, err := rd.ReconcileDelta(context.Background(), &next.Spec, deltaOf(old, next, "api"))
			if err != nil || !ok || len(res.Applied) != 1 || len(res.Failed) > 0 {
				t.Fatalf("ReconcileDelta: ok %v, err %v, applied %v, failed %v", ok, err, res.Applied, res.Failed)
			}
			if reads := kd.Reads(); e.read != (len(reads) > 0) {
				t.Errorf("reads %q; want a read of the service: %v", reads, e.read)
			}
			if _, err := rf.Reconcile(context.Background(), &next.Spec); err != nil {
				t.Fatal(err)
			}
			if got, want := kd.Dump(), kf.Dump(); got != want {
				t.Errorf("kernel after the delta pass:\n%s\nafter a full pass:\n%s", got, want)
			}
			if got, want := kd.Calls(), kf.Calls(); !slices.Equal(got, want) {
				t.Errorf("delta pass calls %q, full pass %q", got, want)
			}
		})
	}
}

// TestReconcileDeltaTrustedLost: when the kernel lost the backend whose
// weight changes (deleted behind vipd's back), the update fails, the
// service is read, and the backend is added again with its new weight:
// the pass reports the add and no failure.
func TestReconcileDeltaTrustedLost(t *testing.T) {
	cur := strings.Replace(deltaBase, `weight = 3 }`, `weight = 5 }`, 1)
	old, next := mustParse(t, deltaBase), mustParse(t, cur)
	rd, _, kd, _ := newPair(t, deltaBase)
	lost := netip.MustParseAddrPort("10.0.1.2:443")
	kd.Edit(func(s *lb.State) {
		for _, st := range s.Services {
			delete(st.Dests, lost)
		}
	})
	res, ok, err := rd.ReconcileDelta(context.Background(), &next.Spec, deltaOf(old, next, "api"))
	if err != nil || !ok || len(res.Failed) > 0 {
		t.Fatalf("ReconcileDelta: ok %v, err %v, failed %v", ok, err, res.Failed)
	}
	if len(res.Applied) != 1 || res.Applied[0].Kind != lb.OpAddDest || res.Applied[0].Dest.Weight != 5 {
		t.Fatalf("applied %v; want the backend added with weight 5", res.Applied)
	}
	if reads := kd.Reads(); !slices.Equal(reads, []string{"service tcp 192.0.2.11:443"}) {
		t.Errorf("reads %q; want one read of the service after the failed update", reads)
	}
	if !strings.Contains(kd.Dump(), "-> 10.0.1.2:443 masq weight=5") {
		t.Errorf("the lost backend is not back with weight 5:\n%s", kd.Dump())
	}
}
