//go:build !linux

package health

import (
	"os"
	"testing"
	"time"
)

// runTests runs the tests.
func runTests(m *testing.M) { os.Exit(m.Run()) }

// httpProbes returns the ways c probes: through net/http alone.
func httpProbes(t *testing.T, c *HTTPCheck) map[string]func(time.Duration) error {
	return map[string]func(time.Duration) error{
		"net/http": func(d time.Duration) error { return c.Probe(probeCtx(t, d)) },
	}
}
