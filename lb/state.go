package lb

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// State is a view of the kernel objects vipd manages: either the desired
// state computed from a Spec, or the state observed from the kernel.
type State struct {
	// Services are the IPVS services with their destinations.
	Services map[ServiceKey]*ServiceState
	// VIPs are the addresses bound to vipd's dummy interface.
	VIPs map[netip.Addr]struct{}
	// Owned is vipd's ledger: the service keys it programs. Together with
	// the VIPs on the dummy interface it tells vipd's services from
	// foreign ones, also for NodePort and firewall-mark services and for
	// services whose VIP could not be bound.
	Owned map[ServiceKey]struct{}
	// Sysctls maps a path below /proc/sys to its value.
	Sysctls map[string]string
	// Rules are vipd's packet-filter helpers.
	Rules Rules
	// Announce lists the VIPs announced on the uplinks.
	Announce map[netip.Addr]struct{}
}

// ServiceState is one IPVS service and its destinations.
type ServiceState struct {
	Service
	Dests map[netip.AddrPort]Destination
	// Stats are the service's counters, filled in by observation.
	Stats Stats
}

// NewState returns an empty state with all maps allocated.
func NewState() *State {
	return &State{
		Services: map[ServiceKey]*ServiceState{},
		VIPs:     map[netip.Addr]struct{}{},
		Owned:    map[ServiceKey]struct{}{},
		Sysctls:  map[string]string{},
		Rules:    Rules{Entries: map[SetEntry]struct{}{}},
		Announce: map[netip.Addr]struct{}{},
	}
}

// Owns reports whether vipd owns the service key in state s: its address
// is a VIP on the dummy interface or the ledger lists it.
func (s *State) Owns(k ServiceKey) bool {
	if _, ok := s.Owned[k]; ok {
		return true
	}
	if k.FWMark == 0 {
		_, ok := s.VIPs[k.Addr]
		return ok
	}
	return false
}

// SetKind names one of vipd's ipsets.
type SetKind uint8

// The sets vipd keeps. Each exists once per address family.
const (
	// SetVIPs holds every VIP whose traffic vipd filters.
	SetVIPs SetKind = iota + 1
	// SetServed holds VIP,proto:port for every port a service serves.
	SetServed
	// SetSNAT holds address,proto:port of services whose traffic is
	// source-NATed (full-NAT, one-arm and NodePort services).
	SetSNAT
	// SetAllowed holds address,proto:port,source-net: the source
	// prefixes each restricted service admits (VirtualService.Allow).
	SetAllowed
	// SetRestricted holds address,proto:port of the services that admit
	// only the sources SetAllowed lists for them; new connections to
	// them from any other source are dropped. A plan adds a service's
	// SetAllowed entries before its SetRestricted entry, and deletes the
	// SetRestricted entry first, so that an admitted source is never
	// dropped in between.
	SetRestricted
)

// String returns the set's base name.
func (k SetKind) String() string {
	switch k {
	case SetVIPs:
		return "vips"
	case SetServed:
		return "served"
	case SetSNAT:
		return "snat"
	case SetAllowed:
		return "allowed"
	case SetRestricted:
		return "restricted"
	}
	return fmt.Sprintf("set(%d)", uint8(k))
}

// SetEntry is one member of one of vipd's sets. Port and Proto are zero in
// address-only sets; Net, the source prefix, is valid in SetAllowed only.
type SetEntry struct {
	Set   SetKind
	Addr  netip.Addr
	Proto Proto
	Port  uint16
	Net   netip.Prefix
}

// String formats the entry as "set addr[,proto:port[,net]]".
func (e SetEntry) String() string {
	s := fmt.Sprintf("%s/%s %s", e.Set, FamilyOf(e.Addr), e.Addr)
	if e.Proto != 0 {
		s += fmt.Sprintf(",%s:%d", e.Proto, e.Port)
	}
	if e.Net.IsValid() {
		s += "," + e.Net.String()
	}
	return s
}

// restriction returns the SetRestricted entry of the service an entry of
// SetAllowed or SetRestricted belongs to.
func (e SetEntry) restriction() SetEntry {
	return SetEntry{Set: SetRestricted, Addr: e.Addr, Proto: e.Proto, Port: e.Port}
}

func (e SetEntry) compare(o SetEntry) int {
	if e.Set != o.Set {
		return cmp.Compare(e.Set, o.Set)
	}
	if c := e.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if e.Proto != o.Proto {
		return cmp.Compare(e.Proto, o.Proto)
	}
	if e.Port != o.Port {
		return cmp.Compare(e.Port, o.Port)
	}
	if c := e.Net.Addr().Compare(o.Net.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(e.Net.Bits(), o.Net.Bits())
}

// RulePolicy is the fixed part of vipd's packet-filter rules: which chains
// exist and what they do. The chains never grow with the number of
// services; set entries carry the per-service data.
type RulePolicy struct {
	// Enabled is false when vipd manages no rules at all.
	Enabled bool
	// SNATMark is the packet mark that selects traffic to masquerade.
	SNATMark uint32
	// FilterVIPs drops traffic to VIPs on ports no service serves.
	FilterVIPs bool
	// SNATSource4 and SNATSource6, when valid, are the addresses SNAT
	// traffic of their family comes from (floating addresses of [ha]),
	// keeping the client's port where it can, so that a peer that takes
	// over maps a connection it picks up in the middle the same way.
	// Unset, the traffic is masqueraded to the outgoing interface's
	// address with random ports.
	SNATSource4, SNATSource6 netip.Addr
}

// SNATSource returns the SNAT source of family f, or the zero address.
func (p RulePolicy) SNATSource(f Family) netip.Addr {
	if f == IPv6 {
		return p.SNATSource6
	}
	return p.SNATSource4
}

// String formats the policy on one line.
func (p RulePolicy) String() string {
	if !p.Enabled {
		return "none"
	}
	s := fmt.Sprintf("snat-mark=%#x filter-vips=%t", p.SNATMark, p.FilterVIPs)
	if p.SNATSource4.IsValid() {
		s += " snat-source=" + p.SNATSource4.String()
	}
	if p.SNATSource6.IsValid() {
		s += " snat-source6=" + p.SNATSource6.String()
	}
	return s
}

// Rules are vipd's chains (by policy) and set members.
type Rules struct {
	// Policy is the chains' policy. Observed states report the zero
	// policy when the chains are missing or differ from what the policy
	// they claim would render, so the planner rewrites them.
	Policy  RulePolicy
	Entries map[SetEntry]struct{}
}

// Dump writes the state as sorted text, one object per line, for golden
// tests and for people.
func (s *State) Dump() string {
	var b strings.Builder
	for _, k := range sortedKeys(s.Sysctls, strings.Compare) {
		fmt.Fprintf(&b, "sysctl %s=%s\n", k, s.Sysctls[k])
	}
	if s.Rules.Policy.Enabled {
		fmt.Fprintf(&b, "chains %s\n", s.Rules.Policy)
	}
	for _, e := range sortedKeys(s.Rules.Entries, SetEntry.compare) {
		fmt.Fprintf(&b, "set %s\n", e)
	}
	for _, a := range sortedKeys(s.VIPs, netip.Addr.Compare) {
		fmt.Fprintf(&b, "vip %s\n", a)
	}
	for _, a := range sortedKeys(s.Announce, netip.Addr.Compare) {
		fmt.Fprintf(&b, "announce %s\n", a)
	}
	for _, k := range sortedKeys(s.Services, ServiceKey.Compare) {
		svc := s.Services[k]
		owned := ""
		if _, ok := s.Owned[k]; ok {
			owned = " (owned)"
		}
		fmt.Fprintf(&b, "service %s%s\n", svc.Service, owned)
		for _, a := range sortedKeys(svc.Dests, netip.AddrPort.Compare) {
			fmt.Fprintf(&b, "  -> %s\n", svc.Dests[a])
		}
	}
	return b.String()
}

func sortedKeys[K comparable, V any](m map[K]V, cmp func(a, b K) int) []K {
	return slices.SortedFunc(maps.Keys(m), cmp)
}

// Clone returns a deep copy of s.
func (s *State) Clone() *State {
	c := NewState()
	for k, v := range s.Services {
		c.Services[k] = &ServiceState{Service: v.Service, Dests: cloneMap(v.Dests), Stats: v.Stats}
	}
	c.VIPs = cloneMap(s.VIPs)
	c.Owned = cloneMap(s.Owned)
	c.Sysctls = cloneMap(s.Sysctls)
	c.Rules = Rules{Policy: s.Rules.Policy, Entries: cloneMap(s.Rules.Entries)}
	c.Announce = cloneMap(s.Announce)
	return c
}

// cloneMap is maps.Clone, except that the clone of a nil map is an empty
// one, which the caller may write to.
func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return maps.Clone(m)
}
