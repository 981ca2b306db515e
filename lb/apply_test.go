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

// TestParallelBinds: many VIP binds run alongside the IPVS operations
// with a batching adapter, and reach what a plain adapter reaches, a
// failed bind included (its announcement is skipped in both).
func TestParallelBinds(t *testing.T) {
	var b strings.Builder
	b.WriteString("[daemon]\nuplinks = [\"eth0\"]\n")
	for i := range 40 {
		fmt.Fprintf(&b, "[[service]]\nname = \"s%d\"\nvip = \"192.0.2.%d\"\nport = 80\nbackend = [{ address = \"10.0.0.%d\" }]\n", i, i+1, i+1)
	}
	spec := &mustParse(t, b.String()).Spec
	fail := func(call string) error {
		if strings.Contains(call, "192.0.2.7") && strings.HasPrefix(call, "bind") {
			return errors.New("boom")
		}
		return nil
	}
	plain, batchedK := lbtest.New(), lbtest.New()
	plain.FailWith(fail)
	batchedK.FailWith(fail)
	r1 := lb.NewReconciler(lb.Options{Kernel: plain.Interface(), Dummy: "vipd0"})
	kb := batchedK.Interface()
	kb.IPVS = batchedK.Batched()
	r2 := lb.NewReconciler(lb.Options{Kernel: kb, Dummy: "vipd0"})
	res1, err1 := r1.Reconcile(context.Background(), spec)
	res2, err2 := r2.Reconcile(context.Background(), spec)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if plain.Dump() != batchedK.Dump() {
		t.Errorf("parallel binds reach another state:\n%s\nwant\n%s", batchedK.Dump(), plain.Dump())
	}
	if len(res1.Applied) != len(res2.Applied) || len(res2.Failed) != 1 || len(res2.Skipped) != 1 || res2.Skipped[0].Kind != lb.OpAnnounce {
		t.Errorf("results: plain %d/%d/%d, parallel %d/%d/%v", len(res1.Applied), len(res1.Failed), len(res1.Skipped),
			len(res2.Applied), len(res2.Failed), res2.Skipped)
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
