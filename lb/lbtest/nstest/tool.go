package nstest

import (
	"os"
	"os/exec"
	"testing"
)

// Tool returns the path of the program name, found on PATH or at path.
// Without it the test skips, or fails when CI is set: CI installs every
// program the tests need (test/deps.sh), so a missing one there is a
// test that would not run.
func Tool(t testing.TB, name, path, pkg string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not installed (test/deps.sh installs %s); CI runs every test", name, pkg)
	}
	t.Skipf("%s is not installed (apt-get install %s)", name, pkg)
	return ""
}
