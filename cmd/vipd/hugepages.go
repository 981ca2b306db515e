package main

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// smallPages asks the kernel not to back the daemon's memory with
// transparent huge pages (prctl PR_SET_THP_DISABLE), unless GODEBUG
// carries a disablethp setting of the operator's. Where the kernel gives
// huge pages to every process (transparent_hugepage=always, Debian's
// default) each 2 MiB region the Go heap touches counts whole in the
// resident set; a heap of a few MiB gains nothing from them. The setting
// is the process's and its children's (the Kubernetes provider, exec
// checks); the Go runtime's own GODEBUG=disablethp does the same for the
// heap alone but cannot be a vipd binary's default.
func smallPages() error {
	if strings.Contains(os.Getenv("GODEBUG"), "disablethp=") {
		return nil
	}
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl PR_SET_THP_DISABLE: %w", err)
	}
	return nil
}
