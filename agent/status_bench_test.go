package agent

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/monitor/status"
	"github.com/vipd/vipd/test/bench"
)

// BenchmarkStatus is one `vipd status` and one Prometheus scrape of a
// daemon running 10,000 services of 10 backends on the fake kernel, with
// metrics on. "cached" is what a request costs while the status cache
// holds a snapshot (any request within stats_interval of the last take):
// the daemon's state, nothing read; "taken" is the request that finds the
// cache stale and takes a snapshot: the read of the table (here the fake
// kernel's copy; in the kernel, one netlink dump) joined with the daemon's
// state. The status is encoded as the control socket answers -o json
// (JSON) and rendered as it answers `vipd status` (table).
func BenchmarkStatus(b *testing.B) {
	k := lbtest.New()
	a, ctx, stop := benchAgent(b, benchConfig(b, 10000, 10), k.Interface())
	defer stop()
	snap, err := a.Status(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if got := len(snap.Services); got != 10000 {
		b.Fatalf("status of %d services, want 10000", got)
	}

	// request is the control socket's answer to vipd status -o json
	// (cmd/vipd): the snapshot as JSON, a service at a time.
	request := func(b *testing.B) {
		snap, err := a.Status(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := status.WriteJSON(io.Discard, snap); err != nil {
			b.Fatal(err)
		}
	}
	h := a.Metrics()
	scrape := func(b *testing.B) {
		w := httptest.NewRecorder()
		w.Body = nil // count the bytes, keep none
		cw := &countingWriter{ResponseRecorder: w}
		h.ServeHTTP(cw, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if w.Code != http.StatusOK || cw.n < 1<<20 {
			b.Fatalf("scrape: status %d, %d bytes", w.Code, cw.n)
		}
		b.ReportMetric(float64(cw.n)/(1<<20), "MiB/scrape")
	}
	for _, bc := range []struct {
		name  string
		stale bool
		do    func(*testing.B)
	}{
		{"status/cached", false, request},
		{"status/taken", true, request},
		{"scrape/cached", false, scrape},
		{"scrape/taken", true, scrape},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if bc.stale {
					a.stats.Invalidate()
				}
				bc.do(b)
			}
		})
	}
	b.Run("render/table", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := status.RenderTable(io.Discard, snap); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// countingWriter counts the body's bytes and discards them.
type countingWriter struct {
	*httptest.ResponseRecorder
	n int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	return len(p), nil
}

// benchConfig writes the benchmark fixture of n services of m backends as
// a daemon's configuration in a temporary directory, which also holds the
// daemon's state, and returns the file's path.
func benchConfig(b *testing.B, n, m int) string {
	b.Helper()
	f, err := bench.New(bench.Spec{Services: n, Backends: m})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	out, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	if err := f.WriteTOML(out, bench.Daemon{StateDir: dir}); err != nil {
		b.Fatal(err)
	}
	return path
}

// benchAgent runs the daemon on path and kernel k until it is ready, and
// returns it with its context and a function that stops it.
func benchAgent(b *testing.B, path string, k lb.Kernel) (*Agent, context.Context, func()) {
	b.Helper()
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
	go func() { done <- a.Run(ctx) }()
	stop := func() { cancel(); <-done }
	select {
	case <-n.ready:
	case err := <-done:
		b.Fatal(err)
	case <-time.After(5 * time.Minute):
		stop()
		b.Fatal("the agent was not ready after 5 minutes")
	}
	return a, ctx, stop
}
