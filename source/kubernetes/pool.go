package kubernetes

import (
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Pool is a named set of addresses that the source hands out to
// LoadBalancer Services: one [[kubernetes.pool]] table.
type Pool struct {
	// Name names the pool in the vipd.io/pool annotation and in Events.
	Name string `toml:"name"`
	// Addresses are CIDRs ("192.0.2.0/28", "2001:db8::/120"), ranges
	// ("192.0.2.10-192.0.2.20") and single addresses, IPv4 and IPv6.
	Addresses []string `toml:"addresses"`
	// AutoAssign lets Services that name no pool and no address get an
	// address from this pool; nil means true. A pool without it serves
	// only Services that name it or one of its addresses.
	AutoAssign *bool `toml:"auto_assign"`
	// AvoidNetworkBroadcast keeps the network and broadcast addresses of
	// the pool's IPv4 CIDRs (of prefixes up to /30), and the first
	// (subnet-router anycast) address of its IPv6 CIDRs (up to /126), out
	// of automatic allocation. Ranges and single addresses are taken as
	// written.
	AvoidNetworkBroadcast bool `toml:"avoid_network_broadcast"`
	// Namespaces are the namespaces whose Services may use the pool, and
	// ServiceSelector a label selector ("tier=front") a Service must
	// match to use it, as MetalLB's serviceAllocation: with both set, a
	// Service must match both; with neither, every Service may use it.
	// They hold for a Service that names the pool, asks for one of its
	// addresses, holds one, or is auto-assigned.
	Namespaces      []string `toml:"namespaces"`
	ServiceSelector string   `toml:"service_selector"`
	// ShareAcrossNamespaces lets Services of different namespaces share
	// an address of the pool under one sharing key. Without it a
	// sharing key is the namespace's: a Service joins an address only
	// with Services of its own namespace.
	ShareAcrossNamespaces bool `toml:"share_across_namespaces"`
	// SNAT makes the traffic of the masq-forwarded Services at the
	// pool's addresses come from the load balancer's address (see
	// AnnotationSNAT, which overrides it).
	SNAT bool `toml:"snat"`
}

// span is an inclusive range of addresses of one family.
type span struct{ first, last netip.Addr }

func (s span) contains(a netip.Addr) bool {
	return a.BitLen() == s.first.BitLen() && s.first.Compare(a) <= 0 && a.Compare(s.last) <= 0
}

func (s span) String() string {
	if s.first == s.last {
		return s.first.String()
	}
	return s.first.String() + "-" + s.last.String()
}

// pool is a parsed Pool.
type pool struct {
	name string
	auto bool
	// namespaces, selector (nil for none) and shareAcross are the
	// Pool's Namespaces, ServiceSelector and ShareAcrossNamespaces.
	namespaces  []string
	selector    labels.Selector
	selectorSrc string
	shareAcross bool
	snat        bool
	spans       []span
	avoid       map[netip.Addr]bool // network and broadcast addresses kept out
	cursor      []netip.Addr        // per span: where the next search starts
}

// contains reports whether a is one of p's addresses.
func (p *pool) contains(a netip.Addr) bool {
	for _, s := range p.spans {
		if s.contains(a) {
			return true
		}
	}
	return false
}

// parsePool parses and validates one pool.
func parsePool(pc Pool) (*pool, error) {
	if pc.Name == "" {
		return nil, errors.New("pool without a name")
	}
	if len(pc.Addresses) == 0 {
		return nil, fmt.Errorf("pool %q has no addresses", pc.Name)
	}
	p := &pool{name: pc.Name, auto: pc.AutoAssign == nil || *pc.AutoAssign, avoid: map[netip.Addr]bool{},
		namespaces: slices.Clone(pc.Namespaces), selectorSrc: pc.ServiceSelector, shareAcross: pc.ShareAcrossNamespaces, snat: pc.SNAT}
	for _, ns := range pc.Namespaces {
		if ns == "" || len(ns) > 63 {
			return nil, fmt.Errorf("pool %q: namespaces: %q is not a namespace name", pc.Name, ns)
		}
	}
	if pc.ServiceSelector != "" {
		sel, err := labels.Parse(pc.ServiceSelector)
		if err != nil {
			return nil, fmt.Errorf("pool %q: service_selector %q: %w", pc.Name, pc.ServiceSelector, err)
		}
		p.selector = sel
	}
	for _, s := range pc.Addresses {
		sp, avoid, err := parseSpan(s)
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", pc.Name, err)
		}
		if pc.AvoidNetworkBroadcast {
			for _, a := range avoid {
				p.avoid[a] = true
			}
		}
		p.spans = append(p.spans, sp)
	}
	for i, a := range p.spans {
		for _, b := range p.spans[i+1:] {
			if overlap(a, b) {
				return nil, fmt.Errorf("pool %q: %s overlaps %s", pc.Name, a, b)
			}
		}
	}
	p.cursor = make([]netip.Addr, len(p.spans))
	for i, s := range p.spans {
		p.cursor[i] = s.first
	}
	return p, nil
}

// refuses says why p is not for svc ("NAMESPACE/NAME") with labels lbls,
// or "": the Service's namespace must be one of the pool's namespaces
// and its labels must match the pool's service_selector, where set.
func (p *pool) refuses(svc string, lbls map[string]string) string {
	if ns := nsOf(svc); len(p.namespaces) > 0 && !slices.Contains(p.namespaces, ns) {
		return fmt.Sprintf("is not for namespace %q (its namespaces: %s)", ns, strings.Join(p.namespaces, ", "))
	}
	if p.selector != nil && !p.selector.Matches(labels.Set(lbls)) {
		return fmt.Sprintf("is not for Service %s: its labels do not match the pool's service_selector %q", svc, p.selectorSrc)
	}
	return ""
}

// nsOf returns the namespace of a Service's key.
func nsOf(svc string) string {
	ns, _, ok := strings.Cut(svc, "/")
	if !ok {
		return ""
	}
	return ns
}

// parseSpan parses a CIDR, a range "A-B" or an address, as
// config.ParsePoolRange does. For a CIDR it also returns the addresses
// AvoidNetworkBroadcast keeps out.
func parseSpan(s string) (span, []netip.Addr, error) {
	first, last, avoid, err := config.ParsePoolRange(s)
	return span{first, last}, avoid, err
}

func overlap(a, b span) bool {
	return a.first.BitLen() == b.first.BitLen() && a.first.Compare(b.last) <= 0 && b.first.Compare(a.last) <= 0
}

// PortKey is one port of a Service: what two Services that share an
// address must not both use.
type PortKey struct {
	Proto lb.Proto
	Port  uint16
}

// Want is what a Service asks of the pools.
type Want struct {
	// Pool is the pool to allocate from; empty means every pool with
	// auto-assign on (or, with Addrs, whichever pool holds them).
	Pool string
	// Addrs are specific addresses, at most one per family.
	Addrs []netip.Addr
	// Families are the families to get one address each of, in order.
	Families []lb.Family
	// AnyFamily (ipFamilyPolicy PreferDualStack) lets the Service hold
	// the families it can get when it cannot get them all: at least
	// one, in the order of Families. Without it, it gets every family
	// or none (RequireDualStack, and a Service with no policy).
	AnyFamily bool
	// SharingKey lets Services with the same key share an address when
	// their ports do not overlap.
	SharingKey string
	// Ports are the Service's ports.
	Ports []PortKey
	// Labels are the Service's, for the pools' service_selector; its
	// namespace is that of its key.
	Labels map[string]string
	// Unchecked skips the pools' namespaces, service_selector and
	// namespaced sharing keys: a follower keeps what the leader wrote.
	Unchecked bool
}

// Reasons of allocation errors, as the Events on Services name them.
const (
	ReasonPoolExhausted    = "PoolExhausted"
	ReasonAddressNotInPool = "AddressNotInPool"
	ReasonAddressTaken     = "AddressTaken"
	ReasonBadAnnotation    = "BadAnnotation"
	// ReasonPoolNotAllowed: the pool's namespaces or service_selector
	// leave the Service out.
	ReasonPoolNotAllowed = "PoolNotAllowed"
	// ReasonAddressRemoved: a reload took an address the Service held
	// out of its pools.
	ReasonAddressRemoved = "AddressRemoved"
)

// AllocError is why a Service got no address.
type AllocError struct {
	// Reason is one of the Reason constants.
	Reason string
	// Msg says what went wrong, for the Event's message.
	Msg string
}

func (e *AllocError) Error() string { return e.Msg }

func allocErrorf(reason, format string, args ...any) *AllocError {
	return &AllocError{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// use is one address held by one or more Services.
type use struct {
	key    string // the sharing key; "" for a Service that shares not
	owners map[string][]PortKey
}

// Allocator hands out the pools' addresses to Services, by their keys
// ("NAMESPACE/NAME"). An address held by a Service is never handed to
// another, unless both carry the same sharing key and their ports do not
// overlap; an address released goes back to its pool. The allocator is
// not safe for concurrent use.
type Allocator struct {
	pools  []*pool
	byName map[string]*pool
	used   map[netip.Addr]*use
	held   map[string][]netip.Addr
	// foreign are addresses that Services vipd does not serve show in
	// their status, by address: never handed out.
	foreign map[netip.Addr]string
}

// NewAllocator validates pools: unique names, valid addresses, no address
// in two pools.
func NewAllocator(pools []Pool) (*Allocator, error) {
	a := &Allocator{byName: map[string]*pool{}, used: map[netip.Addr]*use{}, held: map[string][]netip.Addr{}}
	for _, pc := range pools {
		p, err := parsePool(pc)
		if err != nil {
			return nil, err
		}
		if _, dup := a.byName[p.name]; dup {
			return nil, fmt.Errorf("pool %q is defined twice", p.name)
		}
		for _, q := range a.pools {
			for _, s := range p.spans {
				for _, t := range q.spans {
					if overlap(s, t) {
						return nil, fmt.Errorf("pool %q: %s overlaps pool %q's %s", p.name, s, q.name, t)
					}
				}
			}
		}
		a.pools = append(a.pools, p)
		a.byName[p.name] = p
	}
	return a, nil
}

// Held returns the addresses svc holds, in the order it asked for their
// families.
func (a *Allocator) Held(svc string) []netip.Addr { return slices.Clone(a.held[svc]) }

// SetForeign replaces the addresses that Services vipd does not serve show
// in their status (address to "NAMESPACE/NAME"): they are never handed
// out, though a Service that holds one keeps it.
func (a *Allocator) SetForeign(foreign map[netip.Addr]string) { a.foreign = foreign }

// keys returns the Services that hold addresses, sorted.
func (a *Allocator) keys() []string { return slices.Sorted(maps.Keys(a.held)) }

// Users returns the Services that hold addr, sorted.
func (a *Allocator) Users(addr netip.Addr) []string {
	u := a.used[addr]
	if u == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(u.owners))
}

// Release gives back every address svc holds.
func (a *Allocator) Release(svc string) {
	for _, addr := range a.held[svc] {
		u := a.used[addr]
		delete(u.owners, svc)
		if len(u.owners) == 0 {
			delete(a.used, addr)
		}
	}
	delete(a.held, svc)
}

// Restore records that svc holds addrs (the addresses its status shows)
// where they still fit w and are free for it, and returns those it kept.
// A restart calls it for every Service before Assign allocates anything,
// so that no address in use is handed to another Service.
func (a *Allocator) Restore(svc string, w Want, addrs []netip.Addr) []netip.Addr {
	var kept []netip.Addr
	for _, addr := range addrs {
		addr = addr.Unmap()
		fam := lb.FamilyOf(addr)
		if !slices.Contains(w.Families, fam) || slices.ContainsFunc(kept, func(k netip.Addr) bool { return lb.FamilyOf(k) == fam }) {
			continue
		}
		if a.eligible(svc, w, addr) != nil {
			continue
		}
		kept = append(kept, addr)
	}
	if len(kept) > 0 {
		a.commit(svc, w, kept)
	}
	return kept
}

// Assign gives svc one address of each family w asks for, keeping those
// it holds where they still fit w, and returns them. On error svc keeps
// what it held. With w.AnyFamily, a family it cannot get is left out
// while it gets another: it then returns the addresses it gave and the
// error of the first family left out, both.
func (a *Allocator) Assign(svc string, w Want) ([]netip.Addr, error) {
	if w.Pool != "" && a.byName[w.Pool] == nil {
		return nil, allocErrorf(ReasonBadAnnotation, "%s: no pool is named %q", AnnotationPool, w.Pool)
	}
	if len(w.Families) == 0 {
		return nil, allocErrorf(ReasonBadAnnotation, "the Service asks for no address family")
	}
	if w.Pool != "" && !w.Unchecked {
		if why := a.byName[w.Pool].refuses(svc, w.Labels); why != "" {
			return nil, allocErrorf(ReasonPoolNotAllowed, "pool %q %s", w.Pool, why)
		}
	}
	held := a.held[svc]
	var out []netip.Addr
	var missing error
	for _, fam := range w.Families {
		addr, err := a.pick(svc, w, fam, held, out)
		if err != nil && !w.AnyFamily {
			return nil, err
		}
		if err != nil {
			if missing == nil {
				missing = err
			}
			continue
		}
		out = append(out, addr)
	}
	if len(out) == 0 {
		return nil, missing
	}
	a.commit(svc, w, out)
	if missing != nil {
		var ae *AllocError
		if errors.As(missing, &ae) {
			missing = &AllocError{Reason: ae.Reason, Msg: fmt.Sprintf("%s (ipFamilyPolicy PreferDualStack: served by %s alone)", ae.Msg, familiesOf(out))}
		}
		return out, missing
	}
	return out, nil
}

// familiesOf names the families of addrs, in order ("ipv4").
func familiesOf(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = lb.FamilyOf(a).String()
	}
	return strings.Join(s, ",")
}

// pick chooses svc's address of family fam.
func (a *Allocator) pick(svc string, w Want, fam lb.Family, held, taken []netip.Addr) (netip.Addr, error) {
	if len(w.Addrs) > 0 {
		i := slices.IndexFunc(w.Addrs, func(x netip.Addr) bool { return lb.FamilyOf(x) == fam })
		if i < 0 {
			return netip.Addr{}, allocErrorf(ReasonBadAnnotation, "no %s address among the requested %s", fam, joinAddrs(w.Addrs))
		}
		addr := w.Addrs[i].Unmap()
		if other, ok := a.foreign[addr]; ok && !slices.Contains(held, addr) {
			return netip.Addr{}, allocErrorf(ReasonAddressTaken, "%s is in the status of Service %s, which vipd does not serve", addr, other)
		}
		return addr, a.eligible(svc, w, addr)
	}
	for _, addr := range held {
		if lb.FamilyOf(addr) == fam && a.eligible(svc, w, addr) == nil {
			return addr, nil
		}
	}
	pools := a.candidates(svc, w)
	if w.SharingKey != "" {
		// Join an address already shared under the key, lowest first.
		var best netip.Addr
		for addr, u := range a.used {
			if u.key != w.SharingKey || lb.FamilyOf(addr) != fam || slices.Contains(taken, addr) ||
				best.IsValid() && addr.Compare(best) >= 0 {
				continue
			}
			if a.inAny(pools, addr) && a.free(svc, w, addr) == nil {
				best = addr
			}
		}
		if best.IsValid() {
			return best, nil
		}
	}
	for _, p := range pools {
		if addr, ok := a.next(p, fam); ok {
			return addr, nil
		}
	}
	if w.Pool != "" {
		return netip.Addr{}, allocErrorf(ReasonPoolExhausted, "pool %q has no free %s address", w.Pool, fam)
	}
	if len(pools) == 0 && slices.ContainsFunc(a.pools, func(p *pool) bool { return p.auto }) {
		return netip.Addr{}, allocErrorf(ReasonPoolNotAllowed, "no pool with auto_assign is for Service %s (see the pools' namespaces and service_selector)", svc)
	}
	return netip.Addr{}, allocErrorf(ReasonPoolExhausted, "no pool with auto_assign has a free %s address", fam)
}

// candidates returns the pools svc, asking w, may take a new address
// from.
func (a *Allocator) candidates(svc string, w Want) []*pool {
	if w.Pool != "" {
		return []*pool{a.byName[w.Pool]}
	}
	var out []*pool
	for _, p := range a.pools {
		if p.auto && (w.Unchecked || p.refuses(svc, w.Labels) == "") {
			out = append(out, p)
		}
	}
	return out
}

// poolOf returns the pool that holds addr, or nil.
func (a *Allocator) poolOf(addr netip.Addr) *pool {
	for _, p := range a.pools {
		if p.contains(addr) {
			return p
		}
	}
	return nil
}

// snat reports whether the pool that holds addr SNATs its Services.
func (a *Allocator) snat(addr netip.Addr) bool {
	p := a.poolOf(addr)
	return p != nil && p.snat
}

func (a *Allocator) inAny(pools []*pool, addr netip.Addr) bool {
	return slices.ContainsFunc(pools, func(p *pool) bool { return p.contains(addr) })
}

// eligible says why svc may not hold addr under w, or nil.
func (a *Allocator) eligible(svc string, w Want, addr netip.Addr) error {
	if len(w.Addrs) > 0 && !slices.Contains(w.Addrs, addr) {
		return allocErrorf(ReasonBadAnnotation, "%s is not among the requested %s", addr, joinAddrs(w.Addrs))
	}
	switch {
	case w.Pool != "" && !a.byName[w.Pool].contains(addr):
		return allocErrorf(ReasonAddressNotInPool, "%s is not in pool %q", addr, w.Pool)
	case len(w.Addrs) > 0 && w.Pool == "" && !a.inAny(a.pools, addr):
		return allocErrorf(ReasonAddressNotInPool, "%s is not in any pool", addr)
	case len(w.Addrs) == 0 && w.Pool == "" && !a.inAny(a.candidates(svc, w), addr):
		return allocErrorf(ReasonAddressNotInPool, "%s is not in a pool with auto_assign", addr)
	}
	if p := a.poolOf(addr); p != nil && !w.Unchecked {
		if why := p.refuses(svc, w.Labels); why != "" {
			return allocErrorf(ReasonPoolNotAllowed, "%s is in pool %q, which %s", addr, p.name, why)
		}
	}
	return a.free(svc, w, addr)
}

// free says why addr, held by others, cannot be svc's too, or nil.
func (a *Allocator) free(svc string, w Want, addr netip.Addr) error {
	u := a.used[addr]
	if u == nil {
		return nil
	}
	for _, other := range slices.Sorted(maps.Keys(u.owners)) {
		if other == svc {
			continue
		}
		if w.SharingKey == "" || u.key != w.SharingKey {
			return allocErrorf(ReasonAddressTaken, "%s is used by Service %s (sharing needs the same %s on both)", addr, other, AnnotationSharingKey)
		}
		if nsOf(other) != nsOf(svc) && !w.Unchecked {
			if p := a.poolOf(addr); p == nil || !p.shareAcross {
				name := ""
				if p != nil {
					name = p.name
				}
				return allocErrorf(ReasonAddressTaken, "%s is shared under %s %q by Service %s of another namespace, and pool %q does not let namespaces share (share_across_namespaces)", addr, AnnotationSharingKey, w.SharingKey, other, name)
			}
		}
		if p, ok := overlapPorts(u.owners[other], w.Ports); ok {
			return allocErrorf(ReasonAddressTaken, "%s is shared with Service %s, which also uses %s/%d", addr, other, p.Proto, p.Port)
		}
	}
	return nil
}

func overlapPorts(a, b []PortKey) (PortKey, bool) {
	for _, p := range a {
		if slices.Contains(b, p) {
			return p, true
		}
	}
	return PortKey{}, false
}

// next returns p's next free address of family fam, searching on from
// where the last search ended, so that a released address is handed out
// again only after the others.
func (a *Allocator) next(p *pool, fam lb.Family) (netip.Addr, bool) {
	for i, s := range p.spans {
		if lb.FamilyOf(s.first) != fam {
			continue
		}
		start := p.cursor[i]
		for addr := start; addr.IsValid() && addr.Compare(s.last) <= 0; addr = addr.Next() {
			if a.used[addr] == nil && !p.avoid[addr] && a.foreign[addr] == "" {
				p.cursor[i] = addr
				return addr, true
			}
		}
		for addr := s.first; addr.Compare(start) < 0; addr = addr.Next() {
			if a.used[addr] == nil && !p.avoid[addr] && a.foreign[addr] == "" {
				p.cursor[i] = addr
				return addr, true
			}
		}
	}
	return netip.Addr{}, false
}

// commit makes addrs svc's, and only they.
func (a *Allocator) commit(svc string, w Want, addrs []netip.Addr) {
	a.Release(svc)
	for _, addr := range addrs {
		u := a.used[addr]
		if u == nil {
			u = &use{key: w.SharingKey, owners: map[string][]PortKey{}}
			a.used[addr] = u
		}
		u.owners[svc] = slices.Clone(w.Ports)
	}
	a.held[svc] = slices.Clone(addrs)
}

func joinAddrs(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

// The annotations a Service may carry. Their values are validated; a bad
// one is an Event on the Service with reason BadAnnotation.
const (
	// AnnotationPool names the pool to allocate from.
	AnnotationPool = "vipd.io/pool"
	// AnnotationAddresses asks for specific addresses, comma-separated,
	// at most one per family of the Service's ipFamilies; it replaces
	// the deprecated spec.loadBalancerIP, which is honoured too.
	AnnotationAddresses = "vipd.io/addresses"
	// AnnotationSharingKey lets Services share an address: those with
	// the same key and no port (protocol and number) in common may.
	AnnotationSharingKey = "vipd.io/sharing-key"
	// AnnotationBackends picks the backends: "nodeport" or "endpoints".
	AnnotationBackends = "vipd.io/backends"
	// AnnotationScheduler picks the IPVS scheduler (default wlc).
	AnnotationScheduler = "vipd.io/scheduler"
	// AnnotationSchedulerFlags sets scheduler flags, comma-separated
	// ("sh-port,sh-fallback").
	AnnotationSchedulerFlags = "vipd.io/scheduler-flags"
	// AnnotationCheck is the health check of every backend, a TOML
	// inline table with keys of the file's [service.check]:
	// { type = "http", path = "/healthz", interval = "2s" }. It probes
	// the backend's own address and nothing else: address, mark,
	// device, source, ca_file and exec checks are refused (see
	// config.ParseCheck), and so is port in nodeport mode, where the
	// backends are the Nodes; the interval is at least
	// config.MinAnnotationInterval.
	AnnotationCheck = "vipd.io/check"
	// AnnotationForwarding picks the forwarding method, as the file's
	// forward key: "masq" (or "nat", the default), "droute" (or "dr")
	// or "tunnel" (or "tun", IPIP). Only the endpoints backends may use
	// droute and tunnel: node ports need masq.
	AnnotationForwarding = "vipd.io/forwarding"
	// AnnotationSNAT, "true" or "false", says whether the traffic to the
	// backends comes from the load balancer's address (its [ha]
	// snat_addresses one when there is one) rather than the client's:
	// for layouts where the backends do not route their replies through
	// vipd. It overrides the pool's snat; it needs masq forwarding.
	AnnotationSNAT = "vipd.io/snat"
)

// wantOf returns what svc asks of the pools, from its ipFamilies, ports,
// annotations and spec.loadBalancerIP.
func wantOf(svc *corev1.Service) (Want, error) {
	w := Want{Pool: svc.Annotations[AnnotationPool], SharingKey: svc.Annotations[AnnotationSharingKey], Labels: svc.Labels}
	if v, ok := svc.Annotations[AnnotationPool]; ok && v == "" {
		return Want{}, allocErrorf(ReasonBadAnnotation, "%s is empty", AnnotationPool)
	}
	if v, ok := svc.Annotations[AnnotationSharingKey]; ok && v == "" {
		return Want{}, allocErrorf(ReasonBadAnnotation, "%s is empty", AnnotationSharingKey)
	}
	families := []lb.Family{}
	for _, f := range svc.Spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
			families = append(families, lb.IPv4)
		case corev1.IPv6Protocol:
			families = append(families, lb.IPv6)
		}
	}
	if len(families) == 0 {
		families = []lb.Family{lb.IPv4}
	}
	// ipFamilyPolicy, which the API server always sets: SingleStack
	// gets the first of ipFamilies, RequireDualStack one of each family
	// or none, PreferDualStack those it can get. Without it (a client
	// that sets none), every family of ipFamilies or none.
	var policy corev1.IPFamilyPolicy
	if svc.Spec.IPFamilyPolicy != nil {
		policy = *svc.Spec.IPFamilyPolicy
	}
	switch policy {
	case "":
	case corev1.IPFamilyPolicySingleStack:
		families = families[:1]
	case corev1.IPFamilyPolicyPreferDualStack:
		w.AnyFamily = true
	case corev1.IPFamilyPolicyRequireDualStack:
		for _, f := range []lb.Family{lb.IPv4, lb.IPv6} {
			if !slices.Contains(families, f) {
				families = append(families, f)
			}
		}
	default:
		return Want{}, allocErrorf(ReasonBadAnnotation, "spec.ipFamilyPolicy %q is not %s, %s or %s", truncate(string(policy)),
			corev1.IPFamilyPolicySingleStack, corev1.IPFamilyPolicyPreferDualStack, corev1.IPFamilyPolicyRequireDualStack)
	}
	asked := AnnotationAddresses
	if v, ok := svc.Annotations[AnnotationAddresses]; ok {
		for _, f := range strings.Split(v, ",") {
			addr, err := netip.ParseAddr(strings.TrimSpace(f))
			if err != nil || addr.Zone() != "" {
				return Want{}, allocErrorf(ReasonBadAnnotation, "%s: %q is not an IP address", AnnotationAddresses, strings.TrimSpace(f))
			}
			w.Addrs = append(w.Addrs, addr.Unmap())
		}
	}
	if ip := svc.Spec.LoadBalancerIP; ip != "" {
		addr, err := netip.ParseAddr(ip)
		switch {
		case err != nil || addr.Zone() != "":
			return Want{}, allocErrorf(ReasonBadAnnotation, "spec.loadBalancerIP %q is not an IP address", ip)
		case len(w.Addrs) > 0 && !slices.Contains(w.Addrs, addr.Unmap()):
			return Want{}, allocErrorf(ReasonBadAnnotation, "spec.loadBalancerIP %s is not among %s %s", addr, AnnotationAddresses, joinAddrs(w.Addrs))
		case len(w.Addrs) == 0:
			w.Addrs = []netip.Addr{addr.Unmap()}
			asked = "spec.loadBalancerIP"
		}
	}
	if len(w.Addrs) > 0 {
		var fams []lb.Family
		for _, addr := range w.Addrs {
			fam := lb.FamilyOf(addr)
			if slices.Contains(fams, fam) {
				return Want{}, allocErrorf(ReasonBadAnnotation, "%s asks for two %s addresses", AnnotationAddresses, fam)
			}
			if !slices.Contains(families, fam) {
				return Want{}, allocErrorf(ReasonBadAnnotation, "%s is %s, which is not among the Service's ipFamilies", addr, fam)
			}
			fams = append(fams, fam)
		}
		if policy == corev1.IPFamilyPolicyRequireDualStack && len(fams) < len(families) {
			return Want{}, allocErrorf(ReasonBadAnnotation, "ipFamilyPolicy %s needs an address of each family, and %s asks for %s alone",
				policy, asked, joinAddrs(w.Addrs))
		}
		// Asked for, the addresses are all or nothing, whatever the
		// policy.
		w.AnyFamily = false
		// The Service gets exactly the addresses it asks for, in the
		// order of its ipFamilies.
		families = slices.DeleteFunc(families, func(f lb.Family) bool { return !slices.Contains(fams, f) })
	}
	w.Families = families
	for _, p := range svc.Spec.Ports {
		proto, err := lb.ParseProto(string(p.Protocol))
		if err != nil {
			return Want{}, allocErrorf(ReasonBadAnnotation, "port %d: %v", p.Port, err)
		}
		w.Ports = append(w.Ports, PortKey{Proto: proto, Port: uint16(p.Port)})
	}
	return w, nil
}

// truncate shortens s for a message.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// PoolCount is how many addresses of one family a pool has: Total it may
// hand out, InUse held by Services, Free neither held nor shown in the
// status of a Service vipd does not serve.
type PoolCount struct {
	Pool, Family       string
	Total, InUse, Free float64
}

// counts returns the addresses of each pool and family, in the pools'
// order, IPv4 first.
func (a *Allocator) counts() []PoolCount {
	type pf struct {
		p   *pool
		fam lb.Family
	}
	inUse, taken := map[pf]float64{}, map[pf]float64{}
	for addr := range a.used {
		if p := a.poolOf(addr); p != nil {
			k := pf{p, lb.FamilyOf(addr)}
			inUse[k]++
			if !p.avoid[addr] {
				taken[k]++
			}
		}
	}
	for addr := range a.foreign {
		if p := a.poolOf(addr); p != nil && a.used[addr] == nil && !p.avoid[addr] {
			taken[pf{p, lb.FamilyOf(addr)}]++
		}
	}
	var out []PoolCount
	for _, p := range a.pools {
		for _, fam := range []lb.Family{lb.IPv4, lb.IPv6} {
			total, any := 0.0, false
			for _, s := range p.spans {
				if lb.FamilyOf(s.first) == fam {
					total += s.size()
					any = true
				}
			}
			if !any {
				continue
			}
			for addr := range p.avoid {
				if lb.FamilyOf(addr) == fam {
					total--
				}
			}
			k := pf{p, fam}
			out = append(out, PoolCount{Pool: p.name, Family: fam.String(), Total: total, InUse: inUse[k], Free: max(total-taken[k], 0)})
		}
	}
	return out
}

// size returns how many addresses s holds.
func (s span) size() float64 {
	f, l := s.first.As16(), s.last.As16()
	var d big.Int
	d.Sub(new(big.Int).SetBytes(l[:]), new(big.Int).SetBytes(f[:]))
	v, _ := new(big.Float).SetInt(&d).Float64()
	return v + 1
}
