package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/monitor/status"
	"github.com/vipd/vipd/test/bench"
)

// BenchmarkStatusCommand is one `vipd status` against a daemon of 10,000
// services of 10 backends on the fake kernel, from the command's request
// to its last line, the status cache holding a snapshot: "table" as the
// command prints it (the daemon renders the table), "json" for -o json,
// and "table-from-json", the table the command renders itself from the
// JSON answer (as it did before the daemon rendered it, and still does
// with a daemon that does not).
func BenchmarkStatusCommand(b *testing.B) {
	f, err := bench.New(bench.Spec{Services: 10000, Backends: 10})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	h := newHarness(b, dir, lbtest.New())
	var cfg bytes.Buffer
	if err := f.WriteTOML(&cfg, bench.Daemon{StateDir: filepath.Join(dir, "state"), ControlSocket: h.socket}); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(h.path, cfg.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
	h.run()
	statusCmd := func(b *testing.B, args ...string) {
		var errOut strings.Builder
		out := &countingWriter{}
		root := newRoot(out, &errOut)
		root.SetArgs(append([]string{"status", "--socket", h.socket}, args...))
		if err := root.Execute(); err != nil || out.n < 1<<20 {
			b.Fatalf("vipd status %v: %v, %d bytes %s", args, err, out.n, errOut.String())
		}
		b.ReportMetric(float64(out.n)/(1<<20), "MiB/out")
	}
	b.Run("table", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			statusCmd(b)
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			statusCmd(b, "-o", "json")
		}
	})
	b.Run("table-from-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rep, err := callControl(h.socket, "GET", "/v1/status")
			if err != nil || rep.Status == nil {
				b.Fatalf("status: %v %+v", err, rep.Error)
			}
			if err := status.RenderTable(io.Discard, rep.Status); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// countingWriter counts what is written to it and keeps nothing.
type countingWriter struct{ n int }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	return len(p), nil
}
