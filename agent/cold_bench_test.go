package agent

import (
	"runtime"
	"testing"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// BenchmarkColdStart is the daemon's start on an empty kernel with 10,000
// services of 10 backends in one file, from Run to ready: the file read
// and parsed, the desired state, the plan of 111,007 operations and the
// pass over them, with an IPVS table that takes every operation and keeps
// nothing (the kernel's own work is not vipd's, and the fake kernel's copy
// of the table would count against vipd's heap). It runs under the
// daemon's soft memory limit, as vipd does, and reports the garbage
// collections a start costs.
func BenchmarkColdStart(b *testing.B) {
	path := benchConfig(b, 10000, 10)
	b.ReportAllocs()
	var ms runtime.MemStats
	var gcs uint64
	var ops int
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		k := lbtest.New().Interface()
		ipvs := &discardIPVS{}
		k.IPVS = ipvs
		runtime.ReadMemStats(&ms)
		gcs -= uint64(ms.NumGC)
		b.StartTimer()
		_, _, stop := benchAgent(b, path, k)
		b.StopTimer()
		runtime.ReadMemStats(&ms)
		gcs += uint64(ms.NumGC)
		ops = ipvs.ops
		stop()
		b.StartTimer()
	}
	if ops != 110000 {
		b.Fatalf("%d ipvs operations, want 110000", ops)
	}
	b.ReportMetric(float64(gcs)/float64(b.N), "GCs/op")
}

// discardIPVS is an empty IPVS table that takes every operation.
type discardIPVS struct{ ops int }

func (*discardIPVS) Services() (map[lb.ServiceKey]*lb.ServiceState, error) {
	return map[lb.ServiceKey]*lb.ServiceState{}, nil
}

func (*discardIPVS) Service(lb.ServiceKey) (*lb.ServiceState, error) { return nil, nil }

func (d *discardIPVS) Apply(ops []lb.Op) []error {
	d.ops += len(ops)
	return make([]error, len(ops))
}
