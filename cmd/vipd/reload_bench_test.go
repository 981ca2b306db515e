package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/health"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/lb/metrics"
	"github.com/vipd/vipd/systemd"
	"github.com/vipd/vipd/test/bench"
)

// BenchmarkReload is the daemon's reload of a file in which one backend's
// weight changed, against the fake kernel: the work vipd does between the
// watcher's read and the kernel's answer (ParseFrom, the guard, the pass
// over the changed service, the bookkeeping). It must not grow with the
// number of services beyond the file comparison and the copy of the
// service list.
func BenchmarkReload(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			f, err := bench.New(bench.Spec{Services: n, Backends: 10})
			if err != nil {
				b.Fatal(err)
			}
			var v1, v2 bytes.Buffer
			if err := f.WriteTOML(&v1, bench.Daemon{}); err != nil {
				b.Fatal(err)
			}
			if err := f.WithWeight(n/2, 5, 2).WriteTOML(&v2, bench.Daemon{}); err != nil {
				b.Fatal(err)
			}
			cfg, _, err := config.ParseFrom(nil, "vipd.toml", v1.Bytes())
			if err != nil {
				b.Fatal(err)
			}
			k := lbtest.New()
			kk := k.Interface()
			kk.IPVS = k.Batched()
			kk.Ledger = nil
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			d := &daemon{opts: daemonOptions{Path: "vipd.toml"}, log: log, n: &systemd.Notifier{}, cfg: cfg,
				r: lb.NewReconciler(lb.Options{Kernel: kk, Logger: log, Dummy: "vipd0", KernelRelease: "6.1.0"})}
			d.m = metrics.New(metrics.Options{Logger: log})
			d.hm = health.NewManager(health.Options{Logger: log})
			d.health = healthView{m: d.hm}
			d.remember(d.reconcile(context.Background(), "start", d.effective(cfg)))
			files := [2][]byte{v2.Bytes(), v1.Bytes()}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				rep := d.reload(context.Background(), fileRead{why: "file changed", data: files[i%2], compared: true}, false)
				if rep.Error != "" || len(rep.Applied) != 1 {
					b.Fatalf("reload %d: %+v", i, rep)
				}
				i++
			}
		})
	}
}
