package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSmallPages runs smallPages in a child process (the setting is the
// process's for good) and reads the kernel's answer back: the daemon's
// memory is not backed by huge pages, and a GODEBUG disablethp setting of
// the operator's leaves the process as it was.
func TestSmallPages(t *testing.T) {
	if os.Getenv("VIPD_TEST_SMALLPAGES") == "1" {
		if err := smallPages(); err != nil {
			os.Stdout.WriteString("error " + err.Error())
			os.Exit(0)
		}
		v, err := unix.PrctlRetInt(unix.PR_GET_THP_DISABLE, 0, 0, 0, 0)
		if err != nil {
			os.Stdout.WriteString("error " + err.Error())
			os.Exit(0)
		}
		if v == 1 {
			os.Stdout.WriteString("disabled")
		} else {
			os.Stdout.WriteString("enabled")
		}
		os.Exit(0)
	}
	for _, tc := range []struct{ godebug, want string }{
		{"", "disabled"},
		{"disablethp=0", "enabled"},
		{"madvdontneed=1,disablethp=1", "enabled"}, // the runtime's own, for the heap
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSmallPages$")
		cmd.Env = append(os.Environ(), "VIPD_TEST_SMALLPAGES=1", "GODEBUG="+tc.godebug)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GODEBUG=%q: child: %v", tc.godebug, err)
		}
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("GODEBUG=%q: huge pages %s, want %s", tc.godebug, got, tc.want)
		}
	}
}
