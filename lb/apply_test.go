package lb_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// TestParallelBinds: many VIP binds (a cold start) run alongside the IPVS
// operations, and reach what binds one at a time reach, a failed bind
// included (its announcement is skipped in both). The reference applies
// the services a few at a time, fewer than run in parallel.
func TestParallelBinds(t *testing.T) {
	const header = "[daemon]\nuplinks = [\"eth0\"]\n"
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, "[[service]]\nname = \"s%d\"\nvip = \"192.0.2.%d\"\nport = 80\nbackend = [{ address = \"10.0.0.%d\" }]\n", i, i+1, i+1)
	}
	services := b.String()
	spec := &mustParse(t, header+services).Spec
	fail := func(call string) error {
		if strings.Contains(call, "192.0.2.7") && strings.HasPrefix(call, "bind") {
			return errors.New("boom")
		}
		return nil
	}
	ref, par := lbtest.New(), lbtest.New()
	ref.FailWith(fail)
	par.FailWith(fail)
	r1 := lb.NewReconciler(lb.Options{Kernel: ref.Interface(), Dummy: "vipd0"})
	blocks := strings.SplitAfter(services, "}]\n")
	for n := 4; n <= 40; n += 4 {
		part := &mustParse(t, header+strings.Join(blocks[:n], "")).Spec
		if _, err := r1.Reconcile(context.Background(), part); err != nil {
			t.Fatal(err)
		}
	}
	r2 := lb.NewReconciler(lb.Options{Kernel: par.Interface(), Dummy: "vipd0"})
	res2, err := r2.Reconcile(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if ref.Dump() != par.Dump() {
		t.Errorf("parallel binds reach another state:\n%s\nwant\n%s", par.Dump(), ref.Dump())
	}
	if len(res2.Failed) != 1 || len(res2.Skipped) != 1 || res2.Skipped[0].Kind != lb.OpAnnounce {
		t.Errorf("results: parallel %d/%d/%v, want one failed bind and its announcement skipped", len(res2.Applied), len(res2.Failed), res2.Skipped)
	}
	binds := 0
	for _, op := range res2.Applied {
		if op.Kind == lb.OpBindVIP {
			binds++
		}
	}
	if binds != 39 {
		t.Errorf("%d binds applied, want 39", binds)
	}
}
