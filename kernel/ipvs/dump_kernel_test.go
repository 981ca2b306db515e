package ipvs

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// The tests in this file need the real kernel (see kernel_test.go).

// rawDump returns the keys of the services of one service dump of tb's
// table, in the order the kernel sent them, repeats included.
func rawDump(t *testing.T, tb *table) []lb.ServiceKey {
	t.Helper()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var keys []lb.ServiceKey
	err := dump(tb.conns[0], tb.family, cmdGetService, nil, func(data []byte) error {
		ms, _, err := parseServiceMsg(data)
		if err != nil {
			return err
		}
		s, err := fromKernelService(ms)
		if err != nil {
			return err
		}
		keys = append(keys, s.Key)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestDumpWhileAnotherNamespaceChurns reads a table of 320 services
// while another network namespace adds and deletes services as fast as
// it can. The kernel's dumps of the table, resumed by an index into a
// hash table all namespaces share, then skip and repeat services (the
// test counts them). What vipd reads never does: each reconciler pass
// finds nothing to change and fails nothing, its ledger keeps every
// service, and the table read as the reconciler does (Services, then
// Service for each wanted service the dump lacked) is exactly what was
// written.
func TestDumpWhileAnotherNamespaceChurns(t *testing.T) {
	tb, other := newTable(t), newTable(t)
	all := bulk(300, 2)
	want := wantState(all)
	ledger := lbtest.New()
	r := lb.NewReconciler(lb.Options{Kernel: lb.Kernel{IPVS: tb.IPVS, Ledger: ledger}})
	ctx := context.Background()
	sp := spec(all)
	if res, err := r.Reconcile(ctx, sp); err != nil || res.Err() != nil {
		t.Fatalf("first pass: %v, %v", err, res.Err())
	}

	var changes atomic.Int64
	stop, done := make(chan struct{}), make(chan error)
	go func() {
		defer close(done)
		for round := 0; ; round++ {
			var keys []lb.ServiceKey
			for n := range 40 {
				k := lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.AddrFrom4([4]byte{10, 50, byte(round), byte(n)}), Port: 80}
				if err := other.AddService(svc(k, "rr")); err != nil {
					done <- err
					return
				}
				changes.Add(1)
				keys = append(keys, k)
			}
			for _, k := range keys {
				if err := other.DeleteService(k); err != nil {
					done <- err
					return
				}
				changes.Add(1)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()

	const rounds = 25
	var missed, repeated, found, confirmed int
	start := time.Now()
	for round := range rounds {
		seen := map[lb.ServiceKey]int{}
		for _, k := range rawDump(t, tb) {
			seen[k]++
			if seen[k] == 2 {
				repeated++
			}
		}
		for k := range want {
			if seen[k] == 0 {
				missed++
			}
		}

		res, err := r.Reconcile(ctx, sp)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, f := range res.Failed {
			t.Errorf("round %d: failed %v", round, f)
		}
		for _, op := range append(res.Applied, res.Skipped...) {
			t.Errorf("round %d: the pass did %s", round, op)
		}
		found += len(res.Existed)
		owned, err := ledger.Load()
		if err != nil {
			t.Fatal(err)
		}
		if len(owned) != len(want) {
			t.Errorf("round %d: the ledger lists %d services, want %d", round, len(owned), len(want))
		}

		got, err := tb.Services()
		if err != nil {
			t.Fatal(err)
		}
		for k := range want {
			if got[k] != nil {
				continue
			}
			st, err := tb.Service(k)
			if err != nil {
				t.Fatal(err)
			}
			if st != nil {
				got[k] = st
				confirmed++
			}
		}
		for _, d := range diff(want, got) {
			t.Errorf("round %d: %s", round, d)
		}
	}
	took := time.Since(start)
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("the other namespace: %v", err)
	}
	t.Logf("%d rounds in %v while the other namespace made %d changes: the raw dumps missed %d and repeated %d services; the passes found %d adds' services; Service confirmed %d services missing from Services",
		rounds, took.Round(time.Millisecond), changes.Load(), missed, repeated, found, confirmed)
	if changes.Load() == 0 {
		t.Fatal("the other namespace changed nothing during the reads")
	}
}
