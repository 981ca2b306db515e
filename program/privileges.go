package program

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DropPrivileges drops every capability but keep from every thread of
// the process: the bounding set, the ambient set, the effective,
// permitted and inheritable sets (keep stays in the bounding, permitted
// and effective sets), and sets no_new_privs, so that nothing it
// executes gains any. The process keeps its uid (0, for a root-only
// kubeconfig). It needs a binary built without cgo (CGO_ENABLED=0): with
// cgo, Go cannot change the capabilities of every thread.
func DropPrivileges(keep ...int) error {
	all := func(what string, trap, a1, a2, a3 uintptr) error {
		if _, _, e := syscall.AllThreadsSyscall(trap, a1, a2, a3); e != 0 {
			if e == syscall.ENOTSUP {
				return fmt.Errorf("%s: the binary is built with cgo (build it with CGO_ENABLED=0): %w", what, e)
			}
			return fmt.Errorf("%s: %w", what, e)
		}
		return nil
	}
	if err := all("no_new_privs", unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
		return err
	}
	last, err := lastCap()
	if err != nil {
		return err
	}
	var kept uint64
	for _, c := range keep {
		if c < 0 || c > last {
			return fmt.Errorf("capability %d is not one the kernel knows (the last is %d)", c, last)
		}
		kept |= 1 << c
	}
	for c := 0; c <= last; c++ {
		if kept&(1<<c) != 0 {
			continue
		}
		if err := all(fmt.Sprintf("drop capability %d from the bounding set", c), unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil {
			return err
		}
	}
	if err := all("clear the ambient capabilities", unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil &&
		!errors.Is(err, syscall.EINVAL) {
		return err
	}
	// A capability kept stays only if the process has it: capset
	// cannot add one.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var had [2]unix.CapUserData
	if err := unix.Capget(&hdr, &had[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	var data [2]unix.CapUserData
	for i := range data {
		data[i].Permitted = uint32(kept>>(32*i)) & had[i].Permitted
		data[i].Effective = data[i].Permitted
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

// lastCap returns the highest capability the kernel knows.
func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("the last capability: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n > 63 {
		return 0, fmt.Errorf("the last capability: /proc/sys/kernel/cap_last_cap says %q", strings.TrimSpace(string(b)))
	}
	return n, nil
}
