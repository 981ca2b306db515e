package nstest

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
)

// recordTB records what a helper fails or skips with.
type recordTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordTB) Helper() {}

func (r *recordTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recordTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestToolMissing: without the program a test skips, and fails when CI
// is set.
func TestToolMissing(t *testing.T) {
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		r := &recordTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			Tool(r, "no-such-bird", filepath.Join(t.TempDir(), "bird"), "bird2")
		}()
		<-done
		if ci == "" && (r.skip == "" || r.fatal != "") || ci != "" && (r.fatal == "" || r.skip != "") {
			t.Errorf("CI=%q: fatal %q, skip %q", ci, r.fatal, r.skip)
		}
	}
}

// TestToolFound: a program at its fallback path is found.
func TestToolFound(t *testing.T) {
	if got := Tool(t, "no-such-program", "/bin/sh", "dash"); got != "/bin/sh" {
		t.Errorf("Tool = %q, want /bin/sh", got)
	}
}
