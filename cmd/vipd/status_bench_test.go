package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/control"

	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/monitor/status"
	"github.com/vipd/vipd/test/bench"
)

// cliEnv, set in a test binary's environment, makes it run the command
// line of its arguments, as vipd does, instead of its tests: the command
// of BenchmarkStatusCommand, in a process of its own as an operator's.
const cliEnv = "VIPD_TEST_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(cliEnv) != "" {
		if len(os.Args) == 3 && (os.Args[1] == "status-from-json" || os.Args[1] == "status-json-decoded") {
			// The command as it was before the daemon rendered the
			// table and before -o json indented the answer as it
			// came: the JSON answer decoded, rendered here.
			rep, err := control.Call(os.Args[2], "GET", "/v1/status")
			if err != nil || rep.Status == nil {
				fmt.Fprintln(os.Stderr, "status:", err, rep.Error)
				os.Exit(1)
			}
			render := status.RenderTable
			if os.Args[1] == "status-json-decoded" {
				render = status.RenderJSON
			}
			if err := render(os.Stdout, rep.Status); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.Exit(0)
		}
		root := newRoot(os.Stdout, os.Stderr)
		root.SetArgs(os.Args[1:])
		if err := root.Execute(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// BenchmarkStatusCommand is one `vipd status` against a daemon of 10,000
// services of 10 backends on the fake kernel, from the start of the
// command's process (this test binary, see cliEnv) to its exit, the status
// cache holding a snapshot: "table" as the command prints it (the daemon
// renders the table), "json" for -o json, and "table-from-json", the
// table the command renders itself from the JSON answer (as it did before
// the daemon rendered it, and still does with a daemon that does not);
// "json-decoded" is -o json as it was, the answer decoded and encoded
// again. "version" is the process alone: its start and exit.
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
	run := func(b *testing.B, args ...string) {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), cliEnv+"=1")
		out := &countingWriter{}
		var errOut strings.Builder
		cmd.Stdout, cmd.Stderr = out, &errOut
		if err := cmd.Run(); err != nil || errOut.Len() > 0 || args[0] == "status" && out.n < 1<<20 {
			b.Fatalf("vipd %v: %v, %d bytes %s", args, err, out.n, errOut.String())
		}
		b.ReportMetric(float64(out.n)/(1<<20), "MiB/out")
		b.ReportMetric(float64(cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())/1e6, "cli-cpu-ms")
	}
	for _, bc := range []struct {
		name string
		args []string
	}{
		{"version", []string{"version"}},
		{"table", []string{"status", "--socket", h.socket}},
		{"json", []string{"status", "--socket", h.socket, "-o", "json"}},
		{"table-from-json", []string{"status-from-json", h.socket}},
		{"json-decoded", []string{"status-json-decoded", h.socket}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				run(b, bc.args...)
			}
		})
	}
}

// countingWriter counts what is written to it and keeps nothing.
type countingWriter struct{ n int }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	return len(p), nil
}
