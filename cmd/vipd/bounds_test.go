package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// run runs vipd with args, and returns its exit code (0, or an
// exitError's), standard output and standard error, failing the test if
// it takes more than 10 s.
func runVipd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut strings.Builder
	root := newRoot(&out, &errOut)
	root.SetArgs(args)
	done := make(chan error, 1)
	go func() { done <- root.Execute() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("vipd %v ran for 10 s", args)
	}
	code := 0
	if err != nil {
		ex, ok := err.(exitError)
		if !ok {
			t.Fatalf("vipd %v: %v", args, err)
		}
		code = int(ex)
	}
	return code, out.String(), errOut.String()
}

// TestImportIssuesCapped: vipd import prints the first issues and a
// count of the others, not one line for each of a huge file's lines.
func TestImportIssuesCapped(t *testing.T) {
	kconf := filepath.Join(t.TempDir(), "keepalived.conf")
	var b strings.Builder
	const n = 5000
	for i := range n {
		fmt.Fprintf(&b, "@node%d global_defs {\n", i)
	}
	if err := os.WriteFile(kconf, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runVipd(t, "import", "keepalived", kconf)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	if len(lines) > maxPrinted+2 {
		t.Errorf("%d lines on standard error, want at most %d", len(lines), maxPrinted+2)
	}
	if want := fmt.Sprintf("... and %d more issues", n-maxPrinted); !strings.Contains(stderr, want) {
		t.Errorf("no %q in: ...%s", want, stderr[max(0, len(stderr)-300):])
	}
	if want := fmt.Sprintf("%d constructs not imported", n); !strings.Contains(stderr, want) {
		t.Errorf("no %q in: ...%s", want, stderr[max(0, len(stderr)-300):])
	}
}

// TestImportFIFOInclude: an include of a FIFO is refused at once.
func TestImportFIFOInclude(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.conf")
	mkfifo(t, fifo)
	kconf := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(kconf, []byte("include "+fifo+"\nvirtual_server 192.0.2.10 80 {\n  real_server 10.0.0.1 80 {\n  }\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runVipd(t, "import", "keepalived", kconf)
	if want := kconf + ":1: read " + fifo + ": not a regular file (a FIFO)"; code != 1 || !strings.Contains(stderr, want) || !strings.Contains(stdout, `vip = "192.0.2.10"`) {
		t.Errorf("exit %d, printed %q and %q; want 1, the service and %q", code, stdout, stderr, want)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCheckErrorsCapped: vipd check of included files full of errors
// prints the first errors and a count, not a line for each.
func TestCheckErrorsCapped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	if err := os.WriteFile(path, []byte("include = [\"services.d/*.toml\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "services.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for f := range 3 {
		var b strings.Builder
		for i := range 50000 {
			fmt.Fprintf(&b, "k%d = %d\n", i, i)
		}
		if err := os.WriteFile(filepath.Join(dir, "services.d", fmt.Sprintf("%d.toml", f)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	code, stdout, stderr := runVipd(t, "check", "--offline", path)
	t.Logf("%s, %d bytes of output", time.Since(start), len(stdout)+len(stderr))
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if n := strings.Count(stderr, "\n"); n > 102 || !strings.Contains(stderr, "... and ") {
		t.Errorf("%d lines on standard error, want at most 102 with a count: ...%s", n, stderr[max(0, len(stderr)-300):])
	}
}
