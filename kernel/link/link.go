// Package link is the adapter between vipd's core and the host's network
// interfaces: it implements lb.VIPs on vipd's dummy interface, which holds
// the VIPs so that the kernel accepts their traffic locally, and reports
// the host's addresses for NodePort services.
package link

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

// Options configure a Dummy.
type Options struct {
	// Interface is the name of vipd's dummy interface, such as "vipd0".
	Interface string
	// NetnsPath is the network namespace the interface lives in, such as
	// /run/netns/lb; empty means the caller's.
	NetnsPath string
	// Claimed reports whether an address found on an interface without
	// vipd's mark is vipd's all the same: one that a vipd from before the
	// mark bound (the daemon asks its ledger). Nil claims none.
	Claimed func(netip.Addr) bool
}

// Mark is the alias (IFLA_IFALIAS) that marks an interface as vipd's. vipd
// gives it to the interface it creates, and takes over an existing
// interface only when it has the mark or holds no address that vipd does
// not claim (see Options.Claimed); it then marks it.
const Mark = "vipd"

// ForeignError says that the interface exists without vipd's mark and
// holds addresses vipd did not bind.
type ForeignError struct {
	Interface string
	Addrs     []netip.Addr
}

func (e *ForeignError) Error() string {
	addrs := make([]string, len(e.Addrs))
	for i, a := range e.Addrs {
		addrs[i] = a.String()
	}
	return fmt.Sprintf("interface %s is not vipd's: it has no %q alias and holds addresses vipd did not bind (%s), which vipd would take over and delete; "+
		"set [daemon] interface to a name of its own, or, if the interface and its addresses are vipd's, mark it: ip link set dev %s alias %s",
		e.Interface, Mark, strings.Join(addrs, ", "), e.Interface, Mark)
}

// Dummy is vipd's dummy interface. VIPs are bound to it as /32 and /128
// addresses. Bind, Unbind and VIPs work on an existing interface of any
// type; only Ensure (and Bind, when the interface is missing) insist on
// creating a dummy. Its methods are safe for concurrent use.
type Dummy struct {
	name    string
	h       *netlink.Handle
	claimed func(netip.Addr) bool

	mu sync.Mutex // serialises ensuring the interface exists
	// bound is the interface as Bind last found it: binding a thousand
	// VIPs then costs one exchange each rather than two. A stale one
	// (the interface was deleted) fails with ENODEV and is looked up
	// again.
	bound netlink.Link
}

var _ lb.VIPs = (*Dummy)(nil)

// socketTimeout bounds each send and receive on the netlink sockets.
const socketTimeout = 30 * time.Second

// New returns the adapter for opts. It does not touch the interface.
func New(opts Options) (*Dummy, error) {
	if err := validName(opts.Interface); err != nil {
		return nil, fmt.Errorf("link: interface name %q: %w", opts.Interface, err)
	}
	ns := netns.None()
	if opts.NetnsPath != "" {
		var err error
		if ns, err = netns.GetFromPath(opts.NetnsPath); err != nil {
			return nil, fmt.Errorf("link: open network namespace %s: %w", opts.NetnsPath, err)
		}
		defer ns.Close()
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("link: open netlink handle: %w", err)
	}
	if err := h.SetSocketTimeout(socketTimeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("link: set socket timeout: %w", err)
	}
	return &Dummy{name: opts.Interface, h: h, claimed: opts.Claimed}, nil
}

func validName(name string) error {
	switch {
	case name == "":
		return errors.New("empty")
	case len(name) >= unix.IFNAMSIZ:
		return fmt.Errorf("longer than %d bytes", unix.IFNAMSIZ-1)
	case name == "." || name == "..":
		return errors.New("reserved")
	}
	for _, r := range name {
		if r == '/' || r == ':' || r <= ' ' || r > '~' {
			return fmt.Errorf("invalid character %q", r)
		}
	}
	return nil
}

// Close releases the netlink sockets. The interface stays as it is.
func (d *Dummy) Close() error {
	d.h.Close()
	return nil
}

// Name returns the interface's name.
func (d *Dummy) Name() string { return d.name }

// Ensure makes the interface exist as a dummy interface that is up and
// answers no ARP. It never removes addresses. An interface of the name
// that is not a dummy is an error: vipd does not take over other
// interfaces.
func (d *Dummy) Ensure() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, err := d.ensure()
	return err
}

func (d *Dummy) ensure() (netlink.Link, error) {
	l, err := d.h.LinkByName(d.name)
	if isNotFound(err) {
		l, err = d.create()
	}
	if err != nil {
		return nil, err
	}
	if t := l.Type(); t != "dummy" {
		return nil, fmt.Errorf("interface %s is a %s interface, not a dummy; remove it or name another interface", d.name, t)
	}
	if err := d.own(l); err != nil {
		return nil, err
	}
	a := l.Attrs()
	if a.RawFlags&unix.IFF_NOARP == 0 {
		if err := d.h.LinkSetARPOff(l); err != nil {
			return nil, fmt.Errorf("turn off arp on %s: %w", d.name, err)
		}
	}
	if a.Flags&net.FlagUp == 0 {
		if err := d.h.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("set %s up: %w", d.name, err)
		}
	}
	return l, nil
}

func (d *Dummy) create() (netlink.Link, error) {
	la := netlink.NewLinkAttrs()
	la.Name = d.name
	err := d.h.LinkAdd(&netlink.Dummy{LinkAttrs: la})
	switch {
	case errors.Is(err, unix.EOPNOTSUPP):
		return nil, fmt.Errorf("create dummy interface %s: the kernel has no dummy interface driver (CONFIG_DUMMY; load the dummy module): %w", d.name, err)
	case err != nil && !errors.Is(err, unix.EEXIST): // EEXIST: created meanwhile
		return nil, fmt.Errorf("create dummy interface %s: %w", d.name, err)
	}
	l, err := d.h.LinkByName(d.name)
	if err != nil {
		return nil, fmt.Errorf("look up interface %s: %w", d.name, err)
	}
	if err := d.own(l); err != nil {
		return nil, err
	}
	return l, nil
}

// own makes sure that l is vipd's: it has the mark, or it gets it when
// every address it holds is claimed (see Options.Claimed).
func (d *Dummy) own(l netlink.Link) error {
	if l.Attrs().Alias == Mark {
		return nil
	}
	if _, err := d.unmarked(l); err != nil {
		return err
	}
	if err := d.h.LinkSetAlias(l, Mark); err != nil {
		return fmt.Errorf("mark %s as vipd's (alias %q): %w", d.name, Mark, err)
	}
	return nil
}

// unmarked returns the addresses of l, an interface without the mark,
// or a ForeignError when some are not claimed.
func (d *Dummy) unmarked(l netlink.Link) ([]netip.Addr, error) {
	addrs, err := d.addrs(l)
	if err != nil {
		return nil, err
	}
	var foreign []netip.Addr
	for _, a := range addrs {
		if d.claimed == nil || !d.claimed(a) {
			foreign = append(foreign, a)
		}
	}
	if len(foreign) > 0 {
		return nil, &ForeignError{Interface: d.name, Addrs: foreign}
	}
	return addrs, nil
}

// link returns the interface, or nil when it does not exist.
func (d *Dummy) link() (netlink.Link, error) {
	l, err := d.h.LinkByName(d.name)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up interface %s: %w", d.name, err)
	}
	return l, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// VIPs implements lb.VIPs: the interface's IPv4 and IPv6 addresses, of
// any prefix length, except link-local ones, sorted. A missing interface
// has none; an interface without vipd's mark that holds addresses vipd
// does not claim is a ForeignError.
func (d *Dummy) VIPs() ([]netip.Addr, error) {
	l, err := d.link()
	if err != nil || l == nil {
		return nil, err
	}
	if l.Attrs().Alias != Mark {
		// Not marked yet (Ensure marks it): only claimed addresses.
		return d.unmarked(l)
	}
	return d.addrs(l)
}

// addrs returns the IPv4 and IPv6 addresses of l except link-local ones,
// sorted.
func (d *Dummy) addrs(l netlink.Link) ([]netip.Addr, error) {
	addrs, err := dump(func() ([]netlink.Addr, error) { return d.h.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", d.name, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		if ip = ip.Unmap(); ip.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, ip)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// Bind implements lb.VIPs: it adds addr as a /32 or /128. IPv6 addresses
// skip duplicate address detection so that they are usable at once.
// Binding an address the interface has is no error. A missing interface
// is created first, as Ensure does.
func (d *Dummy) Bind(addr netip.Addr) error {
	addr, err := vip(addr)
	if err != nil {
		return fmt.Errorf("bind %s: %w", addr, err)
	}
	na := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(addr.BitLen(), addr.BitLen())}}
	if addr.Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	d.mu.Lock()
	l := d.bound
	d.mu.Unlock()
	if l != nil {
		err := d.h.AddrAdd(l, na)
		if err == nil || errors.Is(err, unix.EEXIST) {
			return nil
		}
		if !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("bind %s to %s: %w", addr, d.name, err)
		}
	}
	d.mu.Lock()
	d.bound = nil
	l, err = d.link()
	switch {
	case err == nil && l == nil:
		l, err = d.ensure()
	case err == nil:
		err = d.own(l)
	}
	if err == nil {
		d.bound = l
	}
	d.mu.Unlock()
	if err != nil {
		return fmt.Errorf("bind %s: %w", addr, err)
	}
	if err := d.h.AddrAdd(l, na); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("bind %s to %s: %w", addr, d.name, err)
	}
	return nil
}

// Unbind implements lb.VIPs: it removes addr from the interface, whatever
// its prefix length there. Removing an address the interface does not
// have (or from a missing interface) is no error; no other address is
// touched.
func (d *Dummy) Unbind(addr netip.Addr) error {
	addr, err := vip(addr)
	if err != nil {
		return fmt.Errorf("unbind %s: %w", addr, err)
	}
	l, err := d.link()
	if err != nil {
		return fmt.Errorf("unbind %s: %w", addr, err)
	}
	if l == nil {
		return nil
	}
	family := netlink.FAMILY_V4
	if addr.Is6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := dump(func() ([]netlink.Addr, error) { return d.h.AddrList(l, family) })
	if err != nil {
		return fmt.Errorf("unbind %s: list addresses of %s: %w", addr, d.name, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); !ok || ip.Unmap() != addr {
			continue
		}
		err := d.h.AddrDel(l, &netlink.Addr{IPNet: a.IPNet, Peer: a.Peer})
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("unbind %s from %s: %w", a.IPNet, d.name, err)
		}
	}
	return nil
}

// vip checks that addr can be a VIP and returns it unmapped.
func vip(addr netip.Addr) (netip.Addr, error) {
	switch {
	case !addr.IsValid():
		return addr, errors.New("invalid address")
	case addr.Zone() != "":
		return addr, errors.New("a vip has no zone")
	case addr.IsUnspecified() || addr.IsMulticast():
		return addr, errors.New("not a unicast address")
	}
	return addr.Unmap(), nil
}

// HostAddrs implements lb.VIPs: every interface's addresses, by interface
// name, sorted. Loopback and link-local addresses are included; the core
// decides which to use.
func (d *Dummy) HostAddrs() (map[string][]netip.Addr, error) {
	links, err := dump(d.h.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	names := make(map[int]string, len(links))
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	addrs, err := dump(func() ([]netlink.Addr, error) { return d.h.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	out := map[string][]netip.Addr{}
	for _, a := range addrs {
		name, ok := names[a.LinkIndex]
		ip, ok2 := netip.AddrFromSlice(a.IP)
		if !ok || !ok2 {
			continue // an interface that came after the list, or junk
		}
		out[name] = append(out[name], ip.Unmap())
	}
	for name, list := range out {
		slices.SortFunc(list, netip.Addr.Compare)
		out[name] = slices.Compact(list)
	}
	return out, nil
}

// dump retries a netlink dump that the kernel interrupted because the
// table changed meanwhile.
func dump[T any](f func() (T, error)) (T, error) {
	var v T
	var err error
	for range 5 {
		if v, err = f(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return v, err
}

// KernelRelease returns the running kernel's release, such as
// "6.1.0-27-cloud-amd64" (uname -r).
func KernelRelease() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(u.Release[:]), nil
}
