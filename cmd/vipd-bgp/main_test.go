package main

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/ha/bgpproc"
)

// TestProgramUnprivileged builds vipd-bgp as make does (without cgo),
// starts it as the daemon does, and reads its threads' status once its
// speaker runs: CAP_NET_BIND_SERVICE alone, no_new_privs, still uid 0;
// routes set, and a Stop that ends it cleanly.
func TestProgramUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool builds the program: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "vipd-bgp")
	build := exec.Command(goTool, "build", "-tags", "grpcnotrace", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// No peers and no listening port: the speaker runs and sends
	// nothing anywhere.
	c, err := bgpproc.Start(context.Background(), bgpproc.ClientOptions{Program: bin, Args: []string{"--log-level", "warn"},
		Options: bgpproc.Options{ASN: 65001, RouterID: netip.MustParseAddr("192.0.2.1")}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			c.Stop(context.Background())
		}
	}()
	pid := pidOf(t, bin)
	tasks, err := filepath.Glob(filepath.Join("/proc", pid, "task", "*", "status"))
	if err != nil || len(tasks) < 2 {
		t.Fatalf("tasks: %v, %v", tasks, err)
	}
	want := map[string]string{"CapInh": "0000000000000000", "CapPrm": "0000000000000400", "CapEff": "0000000000000400",
		"CapBnd": "0000000000000400", "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Uid": "0\t0\t0\t0"}
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for line := range strings.Lines(string(b)) {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if w, ok := want[k]; ok {
				seen++
				if v = strings.TrimSpace(v); v != w {
					t.Errorf("%s: %s %s, want %s", f, k, v, w)
				}
			}
		}
		if seen != len(want) {
			t.Errorf("%s: %d of the %d lines looked for", f, seen, len(want))
		}
	}
	if err := c.Set(map[netip.Prefix]bgpproc.Attrs{netip.MustParsePrefix("198.51.100.1/32"): {}}); err != nil {
		t.Fatal(err)
	}
	if ps := c.Peers(); len(ps) != 0 {
		t.Errorf("peers %v, want none", ps)
	}
	stopped = true
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/proc", pid)); err == nil {
		t.Errorf("vipd-bgp (pid %s) still runs after Stop", pid)
	}
}

// pidOf returns the pid of the one process running bin.
func pidOf(t *testing.T, bin string) string {
	t.Helper()
	exes, _ := filepath.Glob("/proc/[0-9]*/exe")
	var pids []string
	for _, e := range exes {
		if target, err := os.Readlink(e); err == nil && target == bin {
			pids = append(pids, filepath.Base(filepath.Dir(e)))
		}
	}
	if len(pids) != 1 {
		t.Fatalf("processes running %s: %v", bin, pids)
	}
	return pids[0]
}
