package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// provider builds vipd-kubernetes once, beside the test binary, where
// the daemon looks for it by default.
var provider struct {
	once sync.Once
	err  error
	out  []byte
}

// needProvider builds vipd-kubernetes for the daemons of the tests that
// enable [kubernetes].
func needProvider(t testing.TB) {
	t.Helper()
	provider.once.Do(func() {
		exe, err := os.Executable()
		if err != nil {
			provider.err = err
			return
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			provider.err = err
			return
		}
		cmd := exec.Command(goTool, "build", "-o", filepath.Join(filepath.Dir(exe), kubernetesProgram), "../vipd-kubernetes")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		provider.out, provider.err = cmd.CombinedOutput()
	})
	if provider.err != nil {
		t.Fatalf("build vipd-kubernetes: %v\n%s", provider.err, provider.out)
	}
}
