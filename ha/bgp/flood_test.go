package bgp

import (
	"context"
	"fmt"
	"regexp"
	"runtime"
	"sync"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"

	"github.com/vipd/vipd/ha/bgpproc"
)

// floodPrefix is the i-th of a flood of /24s from 16.0.0.0 on.
func floodPrefix(i int) string { return fmt.Sprintf("%d.%d.%d.0/24", 16+i>>16, i>>8&255, i&255) }

// heapInuse returns the heap in use after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// heapWatch samples the heap in use every 10 ms until stopped and
// returns the peak growth over base.
func heapWatch(base uint64) (stop func() uint64) {
	var peak uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > base {
				peak = max(peak, ms.HeapInuse-base)
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak
	}
}

// TestBirdFlood: router A sends 100,000 routes to a vipd whose peer has
// the default max_prefixes (1000). vipd cuts the session and keeps
// nothing of the flood. (Without the limit it held all 100,000: 142 MiB
// of heap.) The peak of the heap on the way is logged, not asserted:
// GoBGP reads and parses a peer's messages ahead of its checks, so what
// the peer sent between the crossing and the end of the session is held
// for those milliseconds.
func TestBirdFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of 100,000 routes")
	}
	const n = 100_000
	pa, pb := twoRouters(t)
	ra := startBirdConf(t, pa, routerA, routerConf(routerA, vipdA, 65001, n, floodPrefix))
	startBirdConf(t, pb, routerB, routerConf(routerB, vipdB, 65002, 0, nil))
	cfg := testBGP(PeerOptions{Address: routerA, ASN: 65001}, PeerOptions{Address: routerB, ASN: 65002})
	cfg.ASN, cfg.RouterID = 65100, vipdA
	base := heapInuse()
	stopHeap := heapWatch(base)
	log, logs := captureLogger(t)
	sp, err := Start(context.Background(), withRun(cfg, Options{Options: bgpproc.Options{ConnectRetry: time.Second}, Logger: log}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Stop(context.Background()) })
	start := time.Now()
	ra.waitFor("A's session cut", 60*time.Second, func() (bool, string) {
		return !sp.Peers()[0].Limited.IsZero(), fmt.Sprintf("%d routes from A held", len(sp.table(t, api.TableType_ADJ_IN, routerA.String())))
	})
	took := time.Since(start)
	ra.waitFor("nothing of A's held", 5*time.Second, func() (bool, string) {
		k := len(sp.table(t, api.TableType_ADJ_IN, routerA.String()))
		return k == 0, fmt.Sprintf("%d routes from A held", k)
	})
	peak := stopHeap()
	kept := int64(heapInuse()) - int64(base)
	// GoBGP logs each UPDATE it took in past the limit.
	past := len(regexp.MustCompile(`msg="gobgp: prefix limit reached" Family=\S+ Key=10\.98\.1\.2 Topic`).FindAllString(logs.String(), -1))
	t.Logf("A sent %d routes: cut after %v; %d UPDATEs taken in past the limit; heap growth: peak %.1f MiB, after the cut %.1f MiB",
		n, took.Round(time.Millisecond), past, float64(peak)/(1<<20), float64(kept)/(1<<20))
	if got := sp.table(t, api.TableType_GLOBAL, ""); len(got) != 0 {
		t.Errorf("vipd's RIB holds %d routes", len(got))
	}
	if kept > 16<<20 {
		t.Errorf("vipd's heap grew by %.1f MiB and stayed so after the cut", float64(kept)/(1<<20))
	}
}
