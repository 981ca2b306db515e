package lb

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Spec is what an operator asked for, already validated: the input from
// which Desired computes kernel state. The config package produces it.
type Spec struct {
	// StrictARP sets arp_ignore=1 and arp_announce=2 so that the kernel
	// answers ARP only for addresses on the receiving interface; vipd
	// itself answers for announced VIPs on the uplinks.
	StrictARP bool
	// ManageSysctls lets vipd set the sysctls IPVS needs.
	ManageSysctls bool
	// Rules is the policy of vipd's packet-filter helpers.
	Rules RulePolicy
	// Sloppy sets net.ipv4.vs.sloppy_tcp and sloppy_sctp: IPVS takes a
	// packet in the middle of a connection it does not know as a new
	// connection. A node that takes over VIPs then keeps the connections
	// its peer had not synchronized yet (on the same backend with the mh
	// scheduler, or with one backend). It also sets
	// net.ipv4.vs.nat_icmp_send: a backend's packet for a NAT connection
	// the node does not know (yet: its synchronization on the way, as the
	// node takes over) is dropped, with an ICMP port unreachable that the
	// backend's TCP takes as a soft error, and sent again, rather than
	// forwarded untranslated to the client, whose reset would end the
	// connection.
	Sloppy bool
	// Floating are addresses that move with the role of a node in a
	// high-availability group ([ha] addresses and snat_addresses): bound
	// to the dummy interface and announced like VIPs (the node's role
	// decides what reaches the wire), they serve no service. The backends
	// route through them, or SNAT traffic comes from them, so that their
	// replies follow the master.
	Floating []netip.Addr
	// HoldOwned keeps the services vipd owns that Services does not name
	// as the kernel has them, with their VIPs, set entries and
	// announcements: a pass neither removes nor changes them. The agent
	// sets it while a source of services has not yet said what it
	// wants (after a restart), so that its services keep serving.
	HoldOwned bool
	// Services are the virtual services.
	Services []VirtualService
}

// VirtualService is one configured service: a VIP (or the host's own
// addresses, or a firewall mark) with its backends.
type VirtualService struct {
	// Name is the operator's name for the service, unique in a Spec.
	Name string
	// Service holds the IPVS settings. For NodePort services its Key has
	// no address: Desired expands it to one service per host address.
	Service Service
	// VIP is bound to the dummy interface. It is invalid for NodePort
	// services, and optional for firewall-mark services.
	VIP netip.Addr
	// NodePort makes the service listen on the host's own addresses.
	NodePort bool
	// Interfaces restricts a NodePort service to these interfaces'
	// addresses; empty means every address except loopback and the dummy
	// interface's.
	Interfaces []string
	// Announce sends gratuitous ARP/NA for the VIP and answers ARP for it.
	Announce bool
	// SNAT masquerades traffic to the backends (full-NAT, one-arm).
	SNAT bool
	// Allow, when not empty, lists the only source prefixes that may
	// open connections to the service (a file service's allow key, a
	// Kubernetes Service's loadBalancerSourceRanges); new connections
	// from any other source are dropped in the kernel. Empty allows
	// every source. Prefixes of the other family than the service's,
	// and invalid ones, admit nothing: a list of only those admits no
	// source at all. A prefix of length 0 of the service's family
	// admits every source. A service with an Allow list that the kernel
	// cannot enforce (vipd's rules disabled, a firewall-mark or an
	// all-ports service) is left out of the desired state rather than
	// served to every source.
	Allow []netip.Prefix
	// Backends are the real servers.
	Backends []Destination
}

// Host is what Desired needs to know about the machine.
type Host struct {
	// Addrs lists the host's addresses by interface name, for NodePort
	// services and the VIP filter.
	Addrs map[string][]netip.Addr
	// Kernel is the running kernel's release, such as "6.1.0-27-cloud-amd64".
	Kernel string
	// Dummy is the name of vipd's dummy interface, whose addresses are
	// never NodePort addresses.
	Dummy string
}

// foreign returns the addresses of the host's interfaces other than the
// dummy interface.
func (h Host) foreign() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for name, addrs := range h.Addrs {
		if name == h.Dummy {
			continue
		}
		for _, a := range addrs {
			out[a.Unmap()] = true
		}
	}
	return out
}

// HostVIP is a VIP that is an address of another interface of the host.
type HostVIP struct {
	// Service names the service.
	Service string
	VIP     netip.Addr
	// Interface is the interface that has the address.
	Interface string
}

// HostVIPs returns the VIPs of services that are addresses of host
// interfaces other than the dummy interface, in service order. vipd
// refuses such a VIP: it would take over the host's address, and the VIP
// filter would drop traffic to the host's other ports.
func HostVIPs(services []VirtualService, host Host) []HostVIP {
	owner := map[netip.Addr]string{}
	for name, addrs := range host.Addrs {
		if name == host.Dummy {
			continue
		}
		for _, a := range addrs {
			if cur, ok := owner[a.Unmap()]; !ok || name < cur {
				owner[a.Unmap()] = name
			}
		}
	}
	var out []HostVIP
	for i := range services {
		vs := &services[i]
		if !vs.VIP.IsValid() {
			continue
		}
		if name, ok := owner[vs.VIP]; ok {
			out = append(out, HostVIP{Service: vs.Name, VIP: vs.VIP, Interface: name})
		}
	}
	return out
}

// Sysctl paths vipd may set, relative to /proc/sys.
const (
	SysctlIPForward          = "net/ipv4/ip_forward"
	SysctlIPv6Forward        = "net/ipv6/conf/all/forwarding"
	SysctlVSConntrack        = "net/ipv4/vs/conntrack"
	SysctlExpireNodest       = "net/ipv4/vs/expire_nodest_conn"
	SysctlExpireQuiescent    = "net/ipv4/vs/expire_quiescent_template"
	SysctlConnReuseMode      = "net/ipv4/vs/conn_reuse_mode"
	SysctlSloppyTCP          = "net/ipv4/vs/sloppy_tcp"
	SysctlSloppySCTP         = "net/ipv4/vs/sloppy_sctp"
	SysctlNATICMPSend        = "net/ipv4/vs/nat_icmp_send"
	SysctlConntrackLiberal   = "net/netfilter/nf_conntrack_tcp_be_liberal"
	SysctlARPIgnore          = "net/ipv4/conf/all/arp_ignore"
	SysctlARPAnnounce        = "net/ipv4/conf/all/arp_announce"
	SysctlDefaultARPIgnore   = "net/ipv4/conf/default/arp_ignore"
	SysctlDefaultARPAnnounce = "net/ipv4/conf/default/arp_announce"
)

// Desired computes the kernel state spec asks for on host.
func Desired(spec *Spec, host Host) *State {
	return desired(spec, host, len(spec.Services) > 0)
}

// desired is Desired for spec's services, where anyServices says whether
// the whole configuration has services, which spec may be a part of.
func desired(spec *Spec, host Host, anyServices bool) *State {
	s := NewState()
	anyMasq, anyMasq6, anySNAT := false, false, false
	// VIPs with an all-ports service are not filtered: the sets match
	// ports, and port 0 matches none.
	allPorts := map[netip.Addr]bool{}
	// The filter never covers an address of another interface of the
	// host: a VIP that is one (which the daemon refuses) must not make
	// the filter drop traffic to the host's own ports, SSH among them.
	var hostAddrs map[netip.Addr]bool
	if spec.Rules.Enabled && spec.Rules.FilterVIPs {
		hostAddrs = host.foreign()
	}
	for i := range spec.Services {
		vs := &spec.Services[i]
		if len(vs.Allow) > 0 && !vs.restrictable(spec.Rules) {
			continue
		}
		keys := vs.keys(host)
		for _, k := range keys {
			svc := vs.Service
			svc.Key = k
			st := &ServiceState{Service: svc, Dests: make(map[netip.AddrPort]Destination, len(vs.Backends))}
			for _, d := range vs.Backends {
				if d.Forward == Masq {
					if FamilyOf(d.Addr.Addr()) == IPv4 {
						anyMasq = true
					} else {
						anyMasq6 = true
					}
				}
				st.Dests[d.Addr] = d.Settings()
			}
			s.Services[k] = st
			s.Owned[k] = struct{}{}
			if !spec.Rules.Enabled || k.FWMark != 0 {
				continue
			}
			vs.restrict(k, s.Rules.Entries)
			if vs.SNAT {
				anySNAT = true
				s.Rules.Entries[SetEntry{Set: SetSNAT, Addr: k.Addr, Proto: k.Proto, Port: k.Port}] = struct{}{}
			}
			if spec.Rules.FilterVIPs && !vs.NodePort && !hostAddrs[k.Addr] {
				if k.Port == 0 {
					allPorts[k.Addr] = true
				}
				s.Rules.Entries[SetEntry{Set: SetVIPs, Addr: k.Addr}] = struct{}{}
				s.Rules.Entries[SetEntry{Set: SetServed, Addr: k.Addr, Proto: k.Proto, Port: k.Port}] = struct{}{}
			}
		}
		if vs.VIP.IsValid() {
			s.VIPs[vs.VIP] = struct{}{}
			if vs.Announce {
				s.Announce[vs.VIP] = struct{}{}
			}
		}
	}
	for _, a := range spec.Floating {
		s.VIPs[a] = struct{}{}
		s.Announce[a] = struct{}{}
	}
	for e := range s.Rules.Entries {
		if (e.Set == SetVIPs || e.Set == SetServed) && allPorts[e.Addr] {
			delete(s.Rules.Entries, e)
		}
	}
	if spec.Rules.Enabled {
		s.Rules.Policy = spec.Rules
	}
	if spec.ManageSysctls {
		if anyMasq {
			s.Sysctls[SysctlIPForward] = "1"
		}
		if anyMasq6 {
			s.Sysctls[SysctlIPv6Forward] = "1"
		}
		if anySNAT {
			// Without conntrack=1 IPVS traffic never reaches the nat
			// table's POSTROUTING rules, so the MASQUERADE never matches.
			s.Sysctls[SysctlVSConntrack] = "1"
			if spec.Rules.SNATSource4.IsValid() || spec.Rules.SNATSource6.IsValid() {
				// SNAT from a floating address: a node that takes a
				// connection over, or back, tracks it from the middle
				// or from a stale window, and strict window tracking
				// would mark its packets invalid and leave them
				// untranslated (the backend's replies then meet a reset).
				s.Sysctls[SysctlConntrackLiberal] = "1"
			}
		}
		if anyServices {
			// Drop connections to deleted real servers at once rather than
			// letting clients time out, and expire persistence templates
			// pointing to quiesced (weight 0) real servers.
			s.Sysctls[SysctlExpireNodest] = "1"
			s.Sysctls[SysctlExpireQuiescent] = "1"
			s.Sysctls[SysctlConnReuseMode] = connReuseMode(host.Kernel)
			if spec.Sloppy {
				s.Sysctls[SysctlSloppyTCP] = "1"
				s.Sysctls[SysctlSloppySCTP] = "1"
				s.Sysctls[SysctlNATICMPSend] = "1"
			}
		}
		if spec.StrictARP {
			s.Sysctls[SysctlARPIgnore] = "1"
			s.Sysctls[SysctlARPAnnounce] = "2"
			s.Sysctls[SysctlDefaultARPIgnore] = "1"
			s.Sysctls[SysctlDefaultARPAnnounce] = "2"
		}
	}
	return s
}

// connReuseMode picks net.ipv4.vs.conn_reuse_mode for a kernel release.
// Before Linux 5.9, mode 1 made reused source ports of new connections
// wait out a one-second delay behind conntrack (kubernetes#81775); 5.9
// fixed that, and mode 1 reschedules reused ports, which is what draining
// needs. Unknown releases get the safe 0.
func connReuseMode(release string) string {
	major, minor, ok := kernelVersion(release)
	if ok && (major > 5 || major == 5 && minor >= 9) {
		return "1"
	}
	return "0"
}

func kernelVersion(release string) (int, int, bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minorStr := parts[1]
	if i := strings.IndexFunc(minorStr, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorStr = minorStr[:i]
	}
	minor, err2 := strconv.Atoi(minorStr)
	return major, minor, err1 == nil && err2 == nil
}

// restrictable reports whether the kernel can enforce vs's Allow list
// with policy p: vipd's rules are enabled and vs has a protocol and a
// port, which the sets match.
func (vs *VirtualService) restrictable(p RulePolicy) bool {
	k := vs.Service.Key
	return p.Enabled && k.FWMark == 0 && k.Proto != 0 && k.Port != 0
}

// restrict adds to entries the set entries that restrict the service key
// k of vs to the sources its Allow list admits: one SetAllowed entry per
// prefix of k's family and the SetRestricted entry. It adds none when the
// list is empty or admits every source of the family.
func (vs *VirtualService) restrict(k ServiceKey, entries map[SetEntry]struct{}) {
	if len(vs.Allow) == 0 {
		return
	}
	var nets []netip.Prefix
	for _, p := range vs.Allow {
		if !p.IsValid() || prefixFamily(p) != k.Family {
			continue
		}
		if p.Bits() == 0 {
			return
		}
		nets = append(nets, p.Masked())
	}
	r := SetEntry{Set: SetRestricted, Addr: k.Addr, Proto: k.Proto, Port: k.Port}
	entries[r] = struct{}{}
	for _, n := range nets {
		e := r
		e.Set, e.Net = SetAllowed, n
		entries[e] = struct{}{}
	}
}

// prefixFamily returns the family of p's address, or zero for an
// IPv4-mapped IPv6 prefix, which matches neither family's packets.
func prefixFamily(p netip.Prefix) Family {
	switch a := p.Addr(); {
	case a.Is4():
		return IPv4
	case a.Is6() && !a.Is4In6():
		return IPv6
	}
	return 0
}

// keys returns the IPVS service keys of vs on host.
func (vs *VirtualService) keys(host Host) []ServiceKey {
	k := vs.Service.Key
	if !vs.NodePort {
		return []ServiceKey{k}
	}
	var keys []ServiceKey
	for _, a := range nodePortAddrs(host, vs.Interfaces, k.Family) {
		nk := k
		nk.Addr = a
		keys = append(keys, nk)
	}
	return keys
}

func nodePortAddrs(host Host, ifaces []string, fam Family) []netip.Addr {
	var out []netip.Addr
	for name, addrs := range host.Addrs {
		if name == host.Dummy || len(ifaces) > 0 && !slices.Contains(ifaces, name) {
			continue
		}
		for _, a := range addrs {
			if a.IsLoopback() || a.IsLinkLocalUnicast() || FamilyOf(a) != fam {
				continue
			}
			out = append(out, a.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// String names the service for logs: "web (tcp 192.0.2.10:80)".
func (vs *VirtualService) String() string {
	if vs.NodePort {
		return fmt.Sprintf("%s (%s nodeport %d)", vs.Name, vs.Service.Key.Proto, vs.Service.Key.Port)
	}
	return fmt.Sprintf("%s (%s)", vs.Name, vs.Service.Key)
}
