package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/control"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// TestDaemonIncludedFIFO puts a FIFO among the included files of a
// running daemon: the watcher reports it as that file's error and the
// daemon keeps serving; a reload of every file (what SIGHUP does) is
// rejected at once, naming it; the watcher still applies the next good
// write; and a start with the FIFO in place fails at once, naming it.
func TestDaemonIncludedFIFO(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, lbtest.New())
	web := filepath.Join(dir, "services.d", "web.toml")
	api := filepath.Join(dir, "services.d", "api.toml")
	parts := strings.SplitAfter(twoServices, "\n\n")
	writeAt(t, web, parts[0])
	writeAt(t, api, parts[1])
	h.write("include = [\"services.d/*.toml\"]\n" + h.header(""))
	h.run()
	h.eventually("initial programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	good := h.k.Dump()

	fifo := filepath.Join(dir, "services.d", "evil.toml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	h.eventually("the watcher's rejection", h.logHas("err=\"read config: "+fifo+": not a regular file (a FIFO)\""))

	replied := make(chan control.Reply, 1)
	go func() {
		rep, err := control.Call(h.socket, "POST", "/v1/reload")
		if err != nil {
			rep.Error = err.Error()
		}
		replied <- rep
	}()
	select {
	case rep := <-replied:
		want := "reload rejected: " + h.path + ":1: read included file: " + fifo + ": not a regular file (a FIFO)"
		if rep.Error != want {
			t.Fatalf("reload reply error = %q; want %q", rep.Error, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a reload of every file did not answer within 5s")
	}
	if got := h.k.Dump(); got != good {
		t.Fatalf("the rejected reloads changed the kernel:\n%s\nwant\n%s", got, good)
	}

	writeAt(t, api, strings.Replace(parts[1], `{ address = "10.0.0.4" }`, `{ address = "10.0.0.4", weight = 3 }`, 1))
	h.eventually("the next good write", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443 masq weight=3") })

	// A restart with the FIFO in place ends at once, before it takes the
	// daemon's locks.
	started := make(chan error, 1)
	go func() {
		started <- runDaemon(context.Background(), daemonOptions{
			Path:   h.path,
			Logger: slog.New(slog.DiscardHandler),
			OpenKernel: func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
				t.Error("a start with a FIFO included opened the kernel")
				return h.k.Interface(), func() {}, nil
			},
		})
	}()
	select {
	case err := <-started:
		want := h.path + ":1: read included file: " + fifo + ": not a regular file (a FIFO)"
		if err == nil || err.Error() != want {
			t.Fatalf("start = %v; want %q", err, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a start with a FIFO included did not end within 5s")
	}
	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
}
