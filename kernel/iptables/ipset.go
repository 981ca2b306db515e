package iptables

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

var setKinds = []lb.SetKind{lb.SetVIPs, lb.SetServed, lb.SetSNAT, lb.SetAllowed, lb.SetRestricted}

// setName names the ipset of one kind and family, such as "vipd-vips-4".
func setName(k lb.SetKind, f lb.Family) string {
	return fmt.Sprintf("vipd-%s-%d", k, f)
}

// setType returns the ipset type of a kind: addresses for the VIP set,
// address,protocol:port,source-net for the allowed set, and
// address,protocol:port for the others.
func setType(k lb.SetKind) string {
	switch k {
	case lb.SetVIPs:
		return "hash:ip"
	case lb.SetAllowed:
		return "hash:ip,port,net"
	}
	return "hash:ip,port"
}

// maxAllowed is the capacity of the allowed sets.
const maxAllowed = 1 << 20

var protoNumbers = map[lb.Proto]uint8{
	lb.TCP:  unix.IPPROTO_TCP,
	lb.UDP:  unix.IPPROTO_UDP,
	lb.SCTP: unix.IPPROTO_SCTP,
}

// toNetlink converts e to the set name and netlink entry that hold it.
func toNetlink(e lb.SetEntry) (string, *netlink.IPSetEntry, error) {
	if !e.Addr.IsValid() {
		return "", nil, fmt.Errorf("set entry %s: no address", e)
	}
	addr := e.Addr.Unmap()
	fam := lb.FamilyOf(addr)
	ne := &netlink.IPSetEntry{
		IP: net.IP(addr.AsSlice()),
		// Replace drops NLM_F_EXCL, which makes adding a present entry
		// and deleting a missing one succeed, as lb.RuleTables expects.
		Replace: true,
	}
	switch e.Set {
	case lb.SetVIPs:
		if e.Proto != 0 || e.Port != 0 {
			return "", nil, fmt.Errorf("set entry %s: the vips set holds addresses only", e)
		}
	case lb.SetServed, lb.SetSNAT, lb.SetRestricted, lb.SetAllowed:
		proto, ok := protoNumbers[e.Proto]
		if !ok {
			return "", nil, fmt.Errorf("set entry %s: no protocol", e)
		}
		port := e.Port
		ne.Protocol, ne.Port = &proto, &port
	default:
		return "", nil, fmt.Errorf("set entry %s: unknown set", e)
	}
	if e.Set == lb.SetAllowed {
		// The kernel takes no /0 in a net of a hash set; Desired never
		// asks for one (such a list restricts nothing).
		n := e.Net.Masked()
		if !n.IsValid() || n.Bits() == 0 || n.Addr().Is4In6() || lb.FamilyOf(n.Addr()) != fam {
			return "", nil, fmt.Errorf("set entry %s: want a source prefix of %s longer than /0", e, fam)
		}
		ne.IP2, ne.CIDR2 = net.IP(n.Addr().AsSlice()), uint8(n.Bits())
	} else if e.Net.IsValid() {
		return "", nil, fmt.Errorf("set entry %s: only the allowed set holds source prefixes", e)
	}
	return setName(e.Set, fam), ne, nil
}

// fromNetlink converts a member of the set of kind k back to a SetEntry.
func fromNetlink(k lb.SetKind, ne netlink.IPSetEntry) (lb.SetEntry, error) {
	addr, ok := netip.AddrFromSlice(ne.IP)
	if !ok {
		return lb.SetEntry{}, fmt.Errorf("set %s: member with bad address %v", k, ne.IP)
	}
	e := lb.SetEntry{Set: k, Addr: addr.Unmap()}
	if k == lb.SetVIPs {
		return e, nil
	}
	if ne.Protocol == nil || ne.Port == nil {
		return lb.SetEntry{}, fmt.Errorf("set %s: member %s without protocol and port", k, addr)
	}
	for p, n := range protoNumbers {
		if n == *ne.Protocol {
			e.Proto = p
		}
	}
	if e.Proto == 0 {
		return lb.SetEntry{}, fmt.Errorf("set %s: member %s with protocol %d vipd does not use", k, addr, *ne.Protocol)
	}
	e.Port = *ne.Port
	if k == lb.SetAllowed {
		src, ok := netip.AddrFromSlice(ne.IP2)
		bits := int(ne.CIDR2)
		if !ok || bits == 0 {
			return lb.SetEntry{}, fmt.Errorf("set %s: member %s without a source prefix", k, addr)
		}
		n, err := src.Unmap().Prefix(bits)
		if err != nil {
			return lb.SetEntry{}, fmt.Errorf("set %s: member %s with bad source prefix %s/%d", k, addr, src, bits)
		}
		e.Net = n
	}
	return e, nil
}

// isNoSet reports whether err says an ipset does not exist.
func isNoSet(err error) bool {
	return errors.Is(err, syscall.ENOENT)
}

// isExist reports whether err says an ipset exists already.
func isExist(err error) bool {
	return errors.Is(err, syscall.EEXIST) || errors.Is(err, nl.IPSetError(nl.IPSET_ERR_EXIST))
}

// createSet creates the set of kind k and family f unless it exists.
func (t *Tables) createSet(k lb.SetKind, f lb.Family) error {
	af := uint8(unix.AF_INET)
	if f == lb.IPv6 {
		af = unix.AF_INET6
	}
	name := setName(k, f)
	opts := netlink.IpsetCreateOptions{Family: af}
	if k == lb.SetAllowed {
		// Each service's allow list is a member per prefix (and per
		// host address of a nodeport service): room beyond the
		// default 65536, which costs nothing until used.
		opts.MaxElements = maxAllowed
	}
	err := t.nl.IpsetCreate(name, setType(k), opts)
	if err != nil && !isExist(err) {
		return fmt.Errorf("create ipset %s: %w", name, err)
	}
	return nil
}

// listSet returns the members of the set of kind k and family f; a
// missing set has none.
func (t *Tables) listSet(k lb.SetKind, f lb.Family) ([]lb.SetEntry, error) {
	name := setName(k, f)
	res, err := t.nl.IpsetList(name)
	if err != nil {
		if isNoSet(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list ipset %s: %w", name, err)
	}
	out := make([]lb.SetEntry, 0, len(res.Entries))
	for _, ne := range res.Entries {
		e, err := fromNetlink(k, ne)
		if err != nil {
			return nil, fmt.Errorf("list ipset %s: %w", name, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// destroySet destroys the set of kind k and family f if it exists.
func (t *Tables) destroySet(k lb.SetKind, f lb.Family) error {
	name := setName(k, f)
	if err := t.nl.IpsetDestroy(name); err != nil && !isNoSet(err) {
		return fmt.Errorf("destroy ipset %s: %w", name, err)
	}
	return nil
}
