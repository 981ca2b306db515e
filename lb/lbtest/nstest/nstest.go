// Package nstest runs root tests in private network namespaces: a test
// binary re-executes itself in a fresh namespace (Main), tests that need it
// skip without root (Need), and Peer is a second namespace joined to the
// test's by a veth pair, a host on the other end of a link.
package nstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsEnv is set in the test binary re-executed in a private network
// namespace.
const netnsEnv = "VIPD_TEST_NETNS"

// Main re-executes the test binary in a fresh network namespace when
// running as root, so that the root tests change only tables, sets and
// links that exist nowhere else. Without root the root tests skip.
func Main(m *testing.M) {
	if os.Getuid() == 0 && os.Getenv(netnsEnv) == "" {
		os.Exit(reexecInNetns())
	}
	if os.Getenv(netnsEnv) != "" {
		if err := LinkUp("lo"); err != nil {
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

// Need skips t unless the test binary runs as root in its private
// network namespace.
func Need(t *testing.T) {
	t.Helper()
	if os.Getenv(netnsEnv) == "" {
		t.Skip("needs root: runs in a private network namespace")
	}
}

func LinkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

// Peer is a second network namespace, joined to the test's own by a veth
// pair: a client host on the uplink.
type Peer struct {
	ns netns.NsHandle
}

// NewPeer creates a namespace and a veth pair between it and the test's
// namespace: local in the test's, remote in the peer's, both up. Both are
// removed when t ends.
func NewPeer(t *testing.T, local, remote string) *Peer {
	t.Helper()
	nsc := make(chan netns.NsHandle, 1)
	errc := make(chan error, 1)
	go func() {
		// The thread switches namespaces and is never unlocked, so it
		// dies with the goroutine instead of serving others.
		runtime.LockOSThread()
		ns, err := netns.New()
		if err != nil {
			errc <- err
			return
		}
		nsc <- ns
	}()
	var p Peer
	select {
	case p.ns = <-nsc:
	case err := <-errc:
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() { p.ns.Close() })
	// New links skip duplicate address detection, so that link-local
	// addresses are usable at once.
	p.Do(t, func() error { return Sysctl("net/ipv6/conf/default/accept_dad", "0") })
	if err := Sysctl("net/ipv6/conf/default/accept_dad", "0"); err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: local}, PeerName: remote, PeerNamespace: netlink.NsFd(int(p.ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth %s/%s: %v", local, remote, err)
	}
	t.Cleanup(func() { netlink.LinkDel(veth) })
	if err := LinkUp(local); err != nil {
		t.Fatal(err)
	}
	p.Do(t, func() error {
		if err := LinkUp("lo"); err != nil {
			return err
		}
		return LinkUp(remote)
	})
	// The link-local addresses come once the kernel has seen the
	// carrier; a packet sent from one still tentative is refused.
	if err := WaitLinkLocal(local); err != nil {
		t.Fatal(err)
	}
	p.Do(t, func() error { return WaitLinkLocal(remote) })
	return &p
}

// WaitLinkLocal waits, up to 5 s, until link (in the calling thread's
// network namespace) has an IPv6 link-local address that is no longer
// tentative: sending from it fails until then.
func WaitLinkLocal(link string) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		addrs, err := AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("addresses of %s: %w", link, err)
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no usable IPv6 link-local address within 5s: %v", link, addrs)
		}
	}
}

// AddrList lists l's addresses of family as netlink.AddrList does,
// reading them again when the kernel says they changed during the dump
// (duplicate address detection finishing, say).
func AddrList(l netlink.Link, family int) ([]netlink.Addr, error) {
	return Dump(func() ([]netlink.Addr, error) { return netlink.AddrList(l, family) })
}

// Dump calls f, a netlink dump, again while the kernel says its table
// changed during the dump (netlink.ErrDumpInterrupted), up to 100 times.
func Dump[T any](f func() (T, error)) (T, error) {
	v, err := f()
	for i := 0; errors.Is(err, netlink.ErrDumpInterrupted) && i < 100; i++ {
		v, err = f()
	}
	return v, err
}

// Do runs f on a thread in the peer's namespace, failing t on error.
func (p *Peer) Do(t *testing.T, f func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(p.ns); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// AddAddr adds a prefix to a link; IPv6 addresses skip duplicate address
// detection so they are usable at once.
func AddAddr(link, prefix string) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(prefix)
	if err != nil {
		return err
	}
	if a.IP.To4() == nil {
		a.Flags |= 0x02 // IFA_F_NODAD
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add %s to %s: %w", prefix, link, err)
	}
	return nil
}

// AddAddrFor adds prefix to link as AddAddr does, and removes it when t
// ends: a test that adds addresses to a link that outlives it (lo) runs
// again in the same namespace (go test -count).
func AddAddrFor(t *testing.T, link, prefix string) {
	t.Helper()
	if err := AddAddr(link, prefix); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return // the link is gone, and its addresses with it
		}
		a, err := netlink.ParseAddr(prefix)
		if err == nil {
			err = netlink.AddrDel(l, a)
		}
		if err != nil {
			t.Errorf("remove %s from %s: %v", prefix, link, err)
		}
	})
}

// Sysctl writes a value below /proc/sys.
func Sysctl(path, value string) error {
	return os.WriteFile("/proc/sys/"+path, []byte(value), 0o644)
}
