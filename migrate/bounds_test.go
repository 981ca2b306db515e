package migrate

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// keepalivedWithin imports file from the operating system's files,
// failing the test if that takes more than a few seconds (a read that
// blocks).
func keepalivedWithin(t *testing.T, file string) Result {
	t.Helper()
	done := make(chan Result, 1)
	go func() { done <- Keepalived(file, KeepalivedOptions{}) }()
	select {
	case r := <-done:
		return r
	case <-time.After(5 * time.Second):
		t.Fatalf("Keepalived(%s) blocked for 5 s", file)
		return Result{}
	}
}

// TestKeepalivedSpecialFiles includes a FIFO, a device and a directory:
// each is refused at once, at the include's line, and the rest is
// imported.
func TestKeepalivedSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.conf")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub.conf")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	vs := "virtual_server 192.0.2.10 80 {\n  real_server 10.0.0.1 80 {\n  }\n}\n"
	for _, tc := range []struct{ include, want string }{
		{fifo, "not a regular file (a FIFO)"},
		{"/dev/zero", "not a regular file (a character device)"},
		{sub, "not a regular file (a directory)"},
	} {
		main := filepath.Join(dir, "keepalived.conf")
		if err := os.WriteFile(main, []byte("include "+tc.include+"\n"+vs), 0o644); err != nil {
			t.Fatal(err)
		}
		r := keepalivedWithin(t, main)
		if want := main + ":1: read " + tc.include + ": " + tc.want; !strings.Contains(issues(r), want) {
			t.Errorf("include %s: no issue %q in:\n%s", tc.include, want, issues(r))
		}
		if r.Services != 1 {
			t.Errorf("include %s: %d services, want 1", tc.include, r.Services)
		}
	}
	// The main file itself.
	r := keepalivedWithin(t, fifo)
	if !strings.Contains(issues(r), "not a regular file (a FIFO)") {
		t.Errorf("a FIFO as the main file: issues:\n%s", issues(r))
	}
}

// TestKeepalivedSizeRefused refuses a keepalived.conf larger than vipd's
// own configuration files may be, before reading it.
func TestKeepalivedSizeRefused(t *testing.T) {
	main := filepath.Join(t.TempDir(), "keepalived.conf")
	line := "# " + strings.Repeat("x", 77) + "\n"
	if err := os.WriteFile(main, []byte(strings.Repeat(line, (17<<20)/len(line))), 0o644); err != nil {
		t.Fatal(err)
	}
	r := keepalivedWithin(t, main)
	if want := "16 MiB"; !strings.Contains(issues(r), want) {
		t.Errorf("no issue %q in:\n%.1000s", want, issues(r))
	}
}

// TestKeepalivedIssuesBounded imports a file of a great many constructs
// vipd has no equivalent for: the issues kept are bounded and counted,
// and the import's memory stays a small multiple of the file's size.
func TestKeepalivedIssuesBounded(t *testing.T) {
	main := filepath.Join(t.TempDir(), "keepalived.conf")
	var b strings.Builder
	const n = 200000
	for i := range n {
		fmt.Fprintf(&b, "@node%d virtual_server 192.0.2.%d 80 {\n", i, i%250+1)
	}
	if err := os.WriteFile(main, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r := keepalivedWithin(t, main)
	runtime.ReadMemStats(&after)
	if len(r.Issues) > MaxIssues {
		t.Errorf("%d issues kept, want at most %d", len(r.Issues), MaxIssues)
	}
	if got := len(r.Issues) + r.MoreIssues; got != n {
		t.Errorf("%d issues kept and %d counted, want %d in all", len(r.Issues), r.MoreIssues, n)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d bytes read, %d bytes allocated", b.Len(), alloc)
	if limit := uint64(25 * b.Len()); alloc > limit {
		t.Errorf("%d bytes allocated for a file of %d bytes, more than %d", alloc, b.Len(), limit)
	}
}

// endless is a reader that never ends: "y\n" forever, as yes(1) writes.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = "y\n"[i%2]
	}
	return len(p), nil
}

// TestIpvsadmBounded imports an input that never ends: the import stops
// at vipd's file limit, with bounded issues.
func TestIpvsadmBounded(t *testing.T) {
	done := make(chan Result, 1)
	go func() { done <- Ipvsadm("stdin", endless{}) }()
	var r Result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Ipvsadm of an endless input ran for 20 s")
	}
	if len(r.Issues) > MaxIssues || r.MoreIssues == 0 {
		t.Errorf("%d issues kept, %d counted; want at most %d kept and the rest counted", len(r.Issues), r.MoreIssues, MaxIssues)
	}
	if want := "more than 16777216 bytes (16 MiB)"; !strings.Contains(issues(r), want) {
		t.Errorf("no issue %q in: ...%s", want, issues(r)[max(0, len(issues(r))-300):])
	}
}
