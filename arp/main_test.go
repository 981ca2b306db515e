package arp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
)

// netnsEnv is set in the test binary re-executed in a private network
// namespace.
const netnsEnv = "VIPD_TEST_NETNS"

// TestMain re-executes the test binary in a fresh network namespace when
// running as root, so that the root tests change only tables, sets and
// links that exist nowhere else. Without root the root tests skip.
func TestMain(m *testing.M) {
	if os.Getuid() == 0 && os.Getenv(netnsEnv) == "" {
		os.Exit(reexecInNetns())
	}
	if os.Getenv(netnsEnv) != "" {
		if err := linkUp("lo"); err != nil {
			fmt.Fprintln(os.Stderr, "bring up lo:", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

func reexecInNetns() int {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "re-exec in a network namespace:", err)
		return 1
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), netnsEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "re-exec in a network namespace:", err)
		return 1
	}
	return 0
}

// needNetns skips t unless the test binary runs as root in its private
// network namespace.
func needNetns(t *testing.T) {
	t.Helper()
	if os.Getenv(netnsEnv) == "" {
		t.Skip("needs root: runs in a private network namespace")
	}
}

func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}
