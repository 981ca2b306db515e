//go:build healthbench

package healthbench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The two layouts of the benchmark (VIPD_HEALTHBENCH_SIDES):
//
//   - "apart" (the default): the listeners live in a network namespace
//     of their own behind a veth pair, the checker runs on CPU 0 and the
//     listener process on CPU 1, and each end of the veth hands the
//     packets it receives to its own side's CPU (RPS). The kernel's work
//     for a backend's end of every check then runs on the backend's CPU
//     and is not charged to the checker, as on a load balancer whose
//     backends are other machines.
//   - "one": everything in one namespace, the backends' addresses local
//     through lo, nothing pinned: a loopback handshake's work for both
//     ends lands on the checker's CPU and in its system time (the layout
//     of the results before December 7).
const (
	sidesApart = "apart"
	sidesOne   = "one"
)

// Addresses of the veth pair between the checker's namespace and the
// backends'.
const (
	vethChecker, vethBackends = "hbc0", "hbb0"
	addrChecker, addrBackends = "10.78.0.1", "10.78.0.2"
)

// CPU masks (taskset's hexadecimal) of the two sides.
const (
	checkerCPUMask, backendCPUMask = "1", "2"
)

// sides is the layout of one run.
type sides struct {
	mode string
	// ns is the backends' network namespace in the apart layout.
	ns string
}

// setupSides builds the layout mode names and undoes it when the test
// ends.
func setupSides(t *testing.T, mode string) *sides {
	t.Helper()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("ip", "link", "set", "lo", "up")
	switch mode {
	case sidesOne:
		run("ip", "route", "replace", "local", BackendPrefix, "dev", "lo")
		return &sides{mode: mode}
	case sidesApart:
	default:
		t.Fatalf("VIPD_HEALTHBENCH_SIDES=%q: want %s or %s", mode, sidesApart, sidesOne)
	}
	if n := runtime.NumCPU(); n < 2 {
		t.Fatalf("the %s layout needs 2 CPUs, this machine has %d (VIPD_HEALTHBENCH_SIDES=%s runs on one)", sidesApart, n, sidesOne)
	}
	s := &sides{mode: mode, ns: fmt.Sprintf("vipd-hb-%d", os.Getpid())}
	run("ip", "netns", "add", s.ns)
	t.Cleanup(func() {
		_ = exec.Command("ip", "route", "del", BackendPrefix).Run()
		_ = exec.Command("ip", "link", "del", vethChecker).Run()
		_ = exec.Command("ip", "netns", "del", s.ns).Run()
	})
	run("ip", "link", "add", vethChecker, "type", "veth", "peer", "name", vethBackends, "netns", s.ns)
	run("ip", "addr", "add", addrChecker+"/30", "dev", vethChecker)
	run("ip", "link", "set", vethChecker, "up")
	run("ip", "-n", s.ns, "addr", "add", addrBackends+"/30", "dev", vethBackends)
	run("ip", "-n", s.ns, "link", "set", vethBackends, "up")
	run("ip", "-n", s.ns, "link", "set", "lo", "up")
	run("ip", "-n", s.ns, "route", "replace", "local", BackendPrefix, "dev", "lo")
	run("ip", "route", "replace", BackendPrefix, "via", addrBackends, "dev", vethChecker)
	// Each side's receive processing on its own CPU. The backends' sysfs
	// is the one ip netns exec mounts; the checker's is mounted here,
	// since the test may run in a namespace (unshare -n) whose /sys shows
	// another's devices.
	run("ip", "netns", "exec", s.ns, "sh", "-c", fmt.Sprintf("echo %s >/sys/class/net/%s/queues/rx-0/rps_cpus", backendCPUMask, vethBackends))
	sysfs := t.TempDir()
	run("mount", "-t", "sysfs", "sysfs", sysfs)
	err := os.WriteFile(filepath.Join(sysfs, "class/net", vethChecker, "queues/rx-0/rps_cpus"), []byte(checkerCPUMask+"\n"), 0o644)
	_ = unix.Unmount(sysfs, unix.MNT_DETACH)
	if err != nil {
		t.Fatalf("rps on %s: %v", vethChecker, err)
	}
	// The benchmark's own polling and scraping stay off the checker's CPU.
	if err := pinSelf(1); err != nil {
		t.Fatal(err)
	}
	return s
}

// checker returns the command line that runs args as the checker.
func (s *sides) checker(args ...string) []string {
	if s.mode != sidesApart {
		return args
	}
	return append([]string{"taskset", checkerCPUMask}, args...)
}

// backends returns the command line that runs args as the backends.
func (s *sides) backends(args ...string) []string {
	if s.mode != sidesApart {
		return args
	}
	return append([]string{"ip", "netns", "exec", s.ns, "taskset", backendCPUMask}, args...)
}

// describe says what the layout is, for the report.
func (s *sides) describe() string {
	if s.mode != sidesApart {
		return "sides: one namespace, backends local through lo, nothing pinned (a loopback handshake's work for both ends is charged to the checker)"
	}
	return "sides: apart: backends in their own network namespace behind a veth, the checker on CPU 0, the listener process and its side's receive processing (RPS) on CPU 1"
}

// pinSelf binds every thread of this process to cpu. A thread the
// runtime starts later inherits the mask of the thread that starts it,
// so a second pass finds none left unpinned.
func pinSelf(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		for _, e := range tasks {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil {
				return fmt.Errorf("pin thread %d to cpu %d: %w", tid, cpu, err)
			}
		}
	}
	return nil
}
