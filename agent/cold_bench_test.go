package agent

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/test/bench"
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
	f, err := bench.New(bench.Spec{Services: 10000, Backends: 10})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	out, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := f.WriteTOML(out, bench.Daemon{StateDir: dir}); err != nil {
		b.Fatal(err)
	}
	out.Close()
	b.ReportAllocs()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var gcs uint64
	var ops int
	for b.Loop() {
		b.StopTimer()
		os.RemoveAll(filepath.Join(dir, "state"))
		runtime.GC()
		k := lbtest.New().Interface()
		ipvs := &discardIPVS{}
		k.IPVS = ipvs
		n := &readyNotifier{ready: make(chan struct{})}
		a := New(Options{
			Path:          path,
			Logger:        slog.New(slog.DiscardHandler),
			Notifier:      n,
			KernelRelease: "6.1.0",
			OpenKernel: func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
				return k, func() {}, nil
			},
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		runtime.ReadMemStats(&ms)
		gcs -= uint64(ms.NumGC)
		b.StartTimer()
		go func() { done <- a.Run(ctx) }()
		select {
		case <-n.ready:
		case err := <-done:
			b.Fatal(err)
		case <-time.After(5 * time.Minute):
			b.Fatal("the agent was not ready after 5 minutes")
		}
		b.StopTimer()
		runtime.ReadMemStats(&ms)
		gcs += uint64(ms.NumGC)
		ops = ipvs.ops
		cancel()
		<-done
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
