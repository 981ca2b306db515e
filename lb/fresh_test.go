package lb_test

import (
	"context"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// freshRig is a reconciler on a fake kernel that has applied oneWeb.
func freshRig(t *testing.T) (*lb.Reconciler, *lbtest.Kernel) {
	t.Helper()
	k := lbtest.New()
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0", KernelRelease: "6.1.0"})
	pass(t, r, oneWeb)
	return r, k
}

// pass reconciles src and returns the operations applied, one a line.
func pass(t *testing.T, r *lb.Reconciler, src string) string {
	t.Helper()
	res, err := r.Reconcile(context.Background(), &mustParse(t, src).Spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed) > 0 {
		t.Fatalf("failed: %v", res.Failed)
	}
	var b strings.Builder
	for _, op := range res.Applied {
		b.WriteString(op.String() + "\n")
	}
	return b.String()
}

// drift changes, behind vipd's back, a sysctl and a set entry that
// oneWeb wants.
func drift(t *testing.T, k *lbtest.Kernel) {
	t.Helper()
	k.Edit(func(st *lb.State) {
		if len(st.Rules.Entries) == 0 {
			t.Fatal("oneWeb has no set entries")
		}
		st.Sysctls["net/ipv4/ip_forward"] = "0"
		clear(st.Rules.Entries)
	})
}

// TestFreshRepairsDrift shows that a read by ReadFresh, once used, makes
// the next pass see and repair drift in sysctls and rules, as Refresh
// does, and that without it the pass trusts its caches.
func TestFreshRepairsDrift(t *testing.T) {
	r, k := freshRig(t)
	drift(t, k)
	if got := pass(t, r, oneWeb); got != "" {
		t.Fatalf("a pass without a fresh read repaired drift it should not see:\n%s", got)
	}
	f, err := r.ReadFresh()
	if err != nil {
		t.Fatal(err)
	}
	if !r.UseFresh(f) {
		t.Fatal("UseFresh refused a read no pass followed")
	}
	got := pass(t, r, oneWeb)
	for _, want := range []string{"set sysctl net/ipv4/ip_forward=1", "add set entry"} {
		if !strings.Contains(got, want) {
			t.Errorf("the pass after the fresh read did not %q:\n%s", want, got)
		}
	}
}

// TestFreshRefusedAfterWrite shows that UseFresh refuses a read that a
// pass writing rules followed (the read may miss the write), and accepts
// one that passes touching IPVS alone followed.
func TestFreshRefusedAfterWrite(t *testing.T) {
	r, _ := freshRig(t)
	f, err := r.ReadFresh()
	if err != nil {
		t.Fatal(err)
	}
	// Another backend: IPVS alone.
	pass(t, r, strings.Replace(oneWeb, `[{ address = "10.0.0.1" }]`, `[{ address = "10.0.0.1" }, { address = "10.0.0.2" }]`, 1))
	if !r.UseFresh(f) {
		t.Fatal("UseFresh refused a read that only IPVS operations followed")
	}
	f, err = r.ReadFresh()
	if err != nil {
		t.Fatal(err)
	}
	// Another service: set entries.
	got := pass(t, r, oneWeb+strings.Replace(strings.Replace(oneWeb, "web", "api", 1), "192.0.2.10", "192.0.2.11", 1))
	if !strings.Contains(got, "add set entry") {
		t.Fatalf("the second service added no set entry:\n%s", got)
	}
	if r.UseFresh(f) {
		t.Fatal("UseFresh took a read that a write of rules followed")
	}
}
