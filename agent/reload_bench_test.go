package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/test/bench"
)

// BenchmarkReload is the daemon's reload of a file in which one backend's
// weight changed, against the fake kernel: the work vipd does between the
// watcher's read and the kernel's answer (ParseFrom, the guard, the pass
// over the changed service, the bookkeeping). With one file it must not
// grow with the number of services beyond the file comparison and the
// copy of the service list; with the services split into included files
// of 100 services (layout=split) only the copy of the list remains.
func BenchmarkReload(b *testing.B) {
	for _, layout := range []string{"single", "split"} {
		for _, n := range []int{100, 10000} {
			b.Run(fmt.Sprintf("layout=%s/services=%d", layout, n), func(b *testing.B) {
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
				main, file := "vipd.toml", "vipd.toml"
				files := [2][]byte{v2.Bytes(), v1.Bytes()}
				if layout == "split" {
					dir := b.TempDir()
					main = filepath.Join(dir, "vipd.toml")
					parts1, parts2 := splitServices(b, dir, v1.Bytes()), splitServices(b, b.TempDir(), v2.Bytes())
					for name, data := range parts1 {
						if !filepath.IsAbs(name) {
							continue
						}
						if data2 := parts2[filepath.Base(name)]; !bytes.Equal(data, data2) {
							file, files = name, [2][]byte{data2, data}
						}
					}
				}
				cfg, err := config.Load(main)
				if layout == "single" {
					cfg, _, err = config.ParseFrom(nil, main, v1.Bytes())
				}
				if err != nil {
					b.Fatal(err)
				}
				k := lbtest.New()
				kk := k.Interface()
				kk.Ledger = nil
				log := slog.New(slog.NewTextHandler(io.Discard, nil))
				a := New(Options{Path: main, Logger: log, KernelRelease: "6.1.0"})
				a.setup(context.Background(), cfg, nil, kk)
				a.remember(a.reconcile(context.Background(), "start", a.effective(cfg)))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					out, err := a.reload(context.Background(), fileRead{why: "file changed", file: file, data: files[i%2]}, false)
					if err != nil || len(out.Applied) != 1 {
						b.Fatalf("reload %d: %v %+v", i, err, out)
					}
					i++
				}
			})
		}
	}
}

// splitServices writes a single-file configuration as dir/vipd.toml with
// its settings and an include of dir/services.d/*.toml, which holds its
// services, 100 per file. It returns the included files' contents by
// path, and by file name too.
func splitServices(tb testing.TB, dir string, data []byte) map[string][]byte {
	tb.Helper()
	var starts []int
	for i := 0; i < len(data); {
		j := bytes.Index(data[i:], []byte("[[service]]\n"))
		if j < 0 {
			break
		}
		if i+j == 0 || data[i+j-1] == '\n' {
			starts = append(starts, i+j)
		}
		i += j + 1
	}
	if len(starts) == 0 {
		tb.Fatal("no services")
	}
	if err := os.MkdirAll(filepath.Join(dir, "services.d"), 0o755); err != nil {
		tb.Fatal(err)
	}
	pre := append([]byte("include = [\"services.d/*.toml\"]\n"), data[:starts[0]]...)
	if err := os.WriteFile(filepath.Join(dir, "vipd.toml"), pre, 0o644); err != nil {
		tb.Fatal(err)
	}
	out := map[string][]byte{}
	for k := 0; k < len(starts); k += 100 {
		end := len(data)
		if k+100 < len(starts) {
			end = starts[k+100]
		}
		name := filepath.Join(dir, "services.d", fmt.Sprintf("%04d.toml", k/100))
		out[name] = data[starts[k]:end]
		out[filepath.Base(name)] = out[name]
		if err := os.WriteFile(name, out[name], 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return out
}
