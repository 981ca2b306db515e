package agent

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestTuneRuntime checks the daemon's collector defaults and that the
// environment's GOGC and GOMEMLIMIT win over them.
func TestTuneRuntime(t *testing.T) {
	percent := debug.SetGCPercent(100)
	limit := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	})

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	tuneRuntime()
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, defaultGCPercent)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != defaultMemoryLimit {
		t.Errorf("GOMEMLIMIT unset: memory limit %d, want %d", got, defaultMemoryLimit)
	}

	// With both set, the runtime read them at its start; the daemon
	// leaves what it finds (here: 100 and no limit).
	t.Setenv("GOGC", "100")
	t.Setenv("GOMEMLIMIT", "off")
	tuneRuntime()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=100: GC percent %d, want 100 left alone", got)
	}
	if got := debug.SetMemoryLimit(math.MaxInt64); got != math.MaxInt64 {
		t.Errorf("GOMEMLIMIT=off: memory limit %d, want none left alone", got)
	}
}
