package link

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inGuest reports whether the tests run in the real-kernel test guest
// (test/vm), where every kernel feature must be there.
func inGuest() bool {
	return os.Getenv("VIPD_VM") == "1" || os.Getenv("VIPD_GUEST") == "1"
}

// newNetns creates a network namespace for one test and returns its path
// (for Options.NetnsPath) and a netlink handle in it.
func newNetns(t *testing.T) (string, *netlink.Handle) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result)
	go func() {
		// Never unlocked: the thread, now in the new namespace, exits
		// with this goroutine.
		runtime.LockOSThread()
		ns, err := netns.New()
		ch <- result{ns, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("create network namespace: %v", r.err)
	}
	t.Cleanup(func() { r.ns.Close() })
	h, err := netlink.NewHandleAt(r.ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("set lo up: %v", err)
	}
	return fmt.Sprintf("/proc/self/fd/%d", int(r.ns)), h
}

func newDummy(t *testing.T, path, name string) *Dummy {
	t.Helper()
	d, err := New(Options{Interface: name, NetnsPath: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// addVeth creates a veth pair, both ends up, standing in for a dummy
// interface where the kernel has no dummy driver.
func addVeth(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: name + "p"}); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	for _, n := range []string{name, name + "p"} {
		l, err := h.LinkByName(n)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func mustVIPs(t *testing.T, d *Dummy, want ...string) {
	t.Helper()
	got, err := d.VIPs()
	if err != nil {
		t.Fatal(err)
	}
	if w := addrs(want...); !slices.Equal(got, w) {
		t.Fatalf("VIPs %v, want %v", got, w)
	}
}

// kernelAddrs lists the interface's addresses as netlink reports them.
func kernelAddrs(t *testing.T, h *netlink.Handle, l netlink.Link) map[string]netlink.Addr {
	t.Helper()
	list, err := dump(func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]netlink.Addr{}
	for _, a := range list {
		m[a.IPNet.String()] = a
	}
	return m
}

func TestNewValidatesName(t *testing.T) {
	for _, name := range []string{"", "a/b", "has space", "0123456789abcdef", "..", "eth0:1"} {
		if _, err := New(Options{Interface: name}); err == nil {
			t.Errorf("New(%q): no error", name)
		}
	}
}

// markLink gives l vipd's mark, as vipd gives the interface it creates.
func markLink(t *testing.T, h *netlink.Handle, l netlink.Link) {
	t.Helper()
	if err := h.LinkSetAlias(l, Mark); err != nil {
		t.Fatal(err)
	}
}

func hasKey[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}

func alias(t *testing.T, h *netlink.Handle, name string) string {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Alias
}

// TestOwnership: an interface without vipd's mark that holds addresses
// vipd does not claim is refused, untouched; one that holds none, or only
// claimed ones (bound by a vipd from before the mark), is marked and used.
func TestOwnership(t *testing.T) {
	path, h := newNetns(t)
	l := addVeth(t, h, "kube-ipvs0")
	foreign := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP{10, 96, 0, 1}, Mask: net.CIDRMask(32, 32)}}
	if err := h.AddrAdd(l, foreign); err != nil {
		t.Fatal(err)
	}
	d := newDummy(t, path, "kube-ipvs0")
	var fe *ForeignError
	if _, err := d.VIPs(); !errors.As(err, &fe) || !slices.Equal(fe.Addrs, addrs("10.96.0.1")) {
		t.Fatalf("VIPs of a foreign interface: %v, want a ForeignError for 10.96.0.1", err)
	}
	want := `interface kube-ipvs0 is not vipd's: it has no "vipd" alias and holds addresses vipd did not bind (10.96.0.1)`
	if err := d.Bind(netip.MustParseAddr("192.0.2.1")); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("bind on a foreign interface: %v, want %q", err, want)
	}
	if err := d.Ensure(); err == nil {
		t.Fatal("ensure on a foreign interface: no error")
	}
	if ka := kernelAddrs(t, h, l); !hasKey(ka, "10.96.0.1/32") || hasKey(ka, "192.0.2.1/32") || alias(t, h, "kube-ipvs0") != "" {
		t.Errorf("a foreign interface was changed: addresses %v, alias %q", kernelAddrs(t, h, l), alias(t, h, "kube-ipvs0"))
	}

	// Claimed: the address is vipd's from before the mark.
	claiming, err := New(Options{Interface: "kube-ipvs0", NetnsPath: path, Claimed: func(a netip.Addr) bool { return a == netip.MustParseAddr("10.96.0.1") }})
	if err != nil {
		t.Fatal(err)
	}
	defer claiming.Close()
	mustVIPs(t, claiming, "10.96.0.1")
	if err := claiming.Bind(netip.MustParseAddr("192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	if got := alias(t, h, "kube-ipvs0"); got != Mark {
		t.Errorf("alias after claiming = %q, want %q", got, Mark)
	}
	// Marked, it is vipd's for every adapter.
	mustVIPs(t, d, "10.96.0.1", "192.0.2.1")

	// An unmarked interface without addresses is marked by the first bind.
	l2 := addVeth(t, h, "vipd1")
	d2 := newDummy(t, path, "vipd1")
	mustVIPs(t, d2)
	if err := d2.Bind(netip.MustParseAddr("192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	if got := alias(t, h, l2.Attrs().Name); got != Mark {
		t.Errorf("alias after the first bind = %q, want %q", got, Mark)
	}
}

func TestBindUnbindOnVeth(t *testing.T) {
	path, h := newNetns(t)
	l := addVeth(t, h, "vipd0")
	markLink(t, h, l)
	d := newDummy(t, path, "vipd0")

	// Link-local addresses are no VIPs. (The kernel adds one of its own
	// once the link has a carrier, which may be later.)
	for _, s := range []string{"fe80::1/64", "169.254.1.1/16"} {
		p := netip.MustParsePrefix(s)
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
	}
	mustVIPs(t, d)

	// A foreign address on the interface.
	foreign := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP{198, 51, 100, 7}, Mask: net.CIDRMask(24, 32)}}
	if err := h.AddrAdd(l, foreign); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		for _, a := range addrs("192.0.2.10", "2001:db8::10", "::ffff:192.0.2.11") {
			if err := d.Bind(a); err != nil {
				t.Fatalf("bind %s: %v", a, err)
			}
		}
	}
	mustVIPs(t, d, "192.0.2.10", "192.0.2.11", "198.51.100.7", "2001:db8::10")

	ka := kernelAddrs(t, h, l)
	for _, want := range []string{"192.0.2.10/32", "192.0.2.11/32", "2001:db8::10/128", "198.51.100.7/24"} {
		if _, ok := ka[want]; !ok {
			t.Errorf("kernel has no %s: %v", want, ka)
		}
	}
	if a := ka["2001:db8::10/128"]; a.Flags&unix.IFA_F_NODAD == 0 || a.Flags&unix.IFA_F_TENTATIVE != 0 {
		t.Errorf("ipv6 vip flags %#x: want nodad and not tentative", a.Flags)
	}

	for range 2 { // idempotent
		for _, a := range addrs("192.0.2.10", "2001:db8::10", "203.0.113.99", "2001:db8::99") {
			if err := d.Unbind(a); err != nil {
				t.Fatalf("unbind %s: %v", a, err)
			}
		}
	}
	mustVIPs(t, d, "192.0.2.11", "198.51.100.7")
	if _, ok := kernelAddrs(t, h, l)["198.51.100.7/24"]; !ok {
		t.Error("the foreign address did not survive")
	}
	for _, bad := range []netip.Addr{{}, netip.IPv4Unspecified(), netip.MustParseAddr("224.0.0.1"), netip.MustParseAddr("fe80::1%vipd0")} {
		if err := d.Bind(bad); err == nil {
			t.Errorf("bind %v: no error", bad)
		}
	}
}

func TestUnbindAnyPrefixLength(t *testing.T) {
	path, h := newNetns(t)
	l := addVeth(t, h, "vipd0")
	markLink(t, h, l)
	d := newDummy(t, path, "vipd0")
	for _, s := range []string{"192.0.2.1/24", "2001:db8::1/64"} {
		p := netip.MustParsePrefix(s)
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
	}
	mustVIPs(t, d, "192.0.2.1", "2001:db8::1")
	for _, a := range addrs("192.0.2.1", "2001:db8::1") {
		if err := d.Unbind(a); err != nil {
			t.Fatal(err)
		}
	}
	mustVIPs(t, d)
}

func TestMissingInterface(t *testing.T) {
	path, _ := newNetns(t)
	d := newDummy(t, path, "vipd9")
	mustVIPs(t, d)
	if err := d.Unbind(netip.MustParseAddr("192.0.2.1")); err != nil {
		t.Errorf("unbind on a missing interface: %v", err)
	}
}

func TestEnsureRefusesOtherTypes(t *testing.T) {
	path, h := newNetns(t)
	addVeth(t, h, "vipd0")
	d := newDummy(t, path, "vipd0")
	err := d.Ensure()
	if err == nil || !strings.Contains(err.Error(), "interface vipd0 is a veth interface, not a dummy") {
		t.Errorf("ensure on a veth: %v", err)
	}
}

// TestEnsure creates the dummy interface. Where the kernel has no dummy
// driver (this project's development hosts) it checks the error instead;
// in the test guest the driver must be there.
func TestEnsure(t *testing.T) {
	path, h := newNetns(t)
	d := newDummy(t, path, "vipd0")
	err := d.Ensure()
	if err != nil && !inGuest() && errors.Is(err, unix.EOPNOTSUPP) {
		want := "create dummy interface vipd0: the kernel has no dummy interface driver (CONFIG_DUMMY; load the dummy module): operation not supported"
		if err.Error() != want {
			t.Errorf("error %q, want %q", err, want)
		}
		if err := d.Bind(netip.MustParseAddr("192.0.2.1")); err == nil || !strings.Contains(err.Error(), "no dummy interface driver") {
			t.Errorf("bind creating the interface: %v", err)
		}
		t.Skip("no dummy driver on this kernel; the rest runs in the test guest (test/vm)")
	}
	if err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("vipd0")
	if err != nil {
		t.Fatal(err)
	}
	check := func(l netlink.Link) {
		t.Helper()
		a := l.Attrs()
		if l.Type() != "dummy" || a.Flags&net.FlagUp == 0 || a.RawFlags&unix.IFF_NOARP == 0 || a.Alias != Mark {
			t.Errorf("interface %s flags %v raw %#x alias %q: want an up dummy with NOARP and vipd's mark", l.Type(), a.Flags, a.RawFlags, a.Alias)
		}
	}
	check(l)

	// Ensure repairs flags and never removes addresses.
	if err := d.Bind(netip.MustParseAddr("192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	if err := d.Bind(netip.MustParseAddr("2001:db8::1")); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetDown(l); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetARPOn(l); err != nil {
		t.Fatal(err)
	}
	if err := d.Ensure(); err != nil {
		t.Fatal(err)
	}
	if l, err = h.LinkByName("vipd0"); err != nil {
		t.Fatal(err)
	}
	check(l)
	// Setting a link down drops its IPv6 addresses; the IPv4 VIP stays,
	// and Ensure must not have removed it.
	if got, err := d.VIPs(); err != nil || !slices.Contains(got, netip.MustParseAddr("192.0.2.1")) {
		t.Errorf("VIPs after ensure: %v, %v", got, err)
	}
	if err := d.Bind(netip.MustParseAddr("2001:db8::1")); err != nil {
		t.Fatal(err)
	}
	mustVIPs(t, d, "192.0.2.1", "2001:db8::1")
	ka := kernelAddrs(t, h, l)
	if a, ok := ka["2001:db8::1/128"]; !ok || a.Flags&unix.IFA_F_TENTATIVE != 0 {
		t.Errorf("ipv6 vip %+v: want present and not tentative", a)
	}

	// Bind creates a missing interface.
	if err := h.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	mustVIPs(t, d)
	if err := d.Bind(netip.MustParseAddr("192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	if l, err = h.LinkByName("vipd0"); err != nil {
		t.Fatal(err)
	}
	check(l)
	mustVIPs(t, d, "192.0.2.2")

	// A dummy that is not vipd's, such as kube-proxy's, is refused and
	// left alone.
	la := netlink.NewLinkAttrs()
	la.Name = "kube-ipvs0"
	if err := h.LinkAdd(&netlink.Dummy{LinkAttrs: la}); err != nil {
		t.Fatal(err)
	}
	kube, err := h.LinkByName("kube-ipvs0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(kube, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP{10, 96, 0, 1}, Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	var fe *ForeignError
	if err := newDummy(t, path, "kube-ipvs0").Ensure(); !errors.As(err, &fe) {
		t.Errorf("ensure on kube-ipvs0: %v, want a ForeignError", err)
	}
	if got := alias(t, h, "kube-ipvs0"); got != "" {
		t.Errorf("kube-ipvs0 got alias %q", got)
	}
}

func TestHostAddrs(t *testing.T) {
	path, h := newNetns(t)
	l := addVeth(t, h, "eth0")
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP{10, 0, 0, 5}, Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	d := newDummy(t, path, "vipd0")
	got, err := d.HostAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if w := addrs("127.0.0.1", "::1"); !slices.Equal(got["lo"], w) {
		t.Errorf("lo: %v, want %v", got["lo"], w)
	}
	if !slices.Contains(got["eth0"], netip.MustParseAddr("10.0.0.5")) {
		t.Errorf("eth0: %v, want 10.0.0.5 among them", got["eth0"])
	}
	if _, ok := got["vipd0"]; ok {
		t.Errorf("addresses for a missing interface: %v", got)
	}
}

func TestKernelRelease(t *testing.T) {
	got, err := KernelRelease()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Skip(err)
	}
	if got != strings.TrimSpace(string(want)) {
		t.Errorf("release %q, want %q", got, want)
	}
}

// TestBindAfterRecreate: Bind remembers the interface between calls; when
// it is deleted and created again (with a new index), the next Bind finds
// the new one.
func TestBindAfterRecreate(t *testing.T) {
	path, h := newNetns(t)
	l := addVeth(t, h, "vipd0")
	d := newDummy(t, path, "vipd0")
	if err := d.Bind(netip.MustParseAddr("192.0.2.10")); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	l2 := addVeth(t, h, "vipd0")
	if l2.Attrs().Index == l.Attrs().Index {
		t.Fatalf("the new interface reuses index %d", l.Attrs().Index)
	}
	if err := d.Bind(netip.MustParseAddr("192.0.2.11")); err != nil {
		t.Fatalf("bind after the interface was recreated: %v", err)
	}
	mustVIPs(t, d, "192.0.2.11")
}
