package agent

import (
	"net/netip"
	"time"

	"github.com/vipd/vipd/kernel/conntrack"
	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/lb"
)

// ConnTracker gives a node that becomes master the connection-tracking
// entries of the SNAT connections its peer synchronized to it (package
// kernel/conntrack explains why IPVS's synchronization alone leaves them
// broken).
type ConnTracker interface {
	// Connections calls fn for each connection of the kernel's IPVS
	// table, until fn returns false.
	Connections(fn func(ipvs.Connection) bool) error
	// Track creates an entry for each flow, doing what existing says
	// with those that have one, going on after a failure.
	Track(flows []conntrack.Flow, existing conntrack.Existing) (conntrack.Result, error)
}

// snatKey is a service whose traffic comes from a floating SNAT source;
// Port zero stands for every port.
type snatKey struct {
	Proto lb.Proto
	Addr  netip.Addr
	Port  uint16
}

// snatServices are the services of a pass whose traffic comes from a
// floating SNAT source, and the sources.
type snatServices struct {
	keys       map[snatKey]bool
	src4, src6 netip.Addr
}

// snatServicesOf returns spec's services with a floating SNAT source, or
// nil when it has none. Firewall-mark and NodePort services are left
// out: the connection table names a firewall-mark connection by the
// address its client asked for, which no service key says, and a
// NodePort service's address is the node's own, which no peer takes over.
func snatServicesOf(spec *lb.Spec) *snatServices {
	if spec == nil || !spec.Rules.Enabled || !spec.Rules.SNATSource4.IsValid() && !spec.Rules.SNATSource6.IsValid() {
		return nil
	}
	s := &snatServices{keys: map[snatKey]bool{}, src4: spec.Rules.SNATSource4, src6: spec.Rules.SNATSource6}
	for i := range spec.Services {
		vs := &spec.Services[i]
		k := vs.Service.Key
		if !vs.SNAT || vs.NodePort || k.FWMark != 0 || !k.Addr.IsValid() {
			continue
		}
		s.keys[snatKey{Proto: k.Proto, Addr: k.Addr, Port: k.Port}] = true
	}
	if len(s.keys) == 0 {
		return nil
	}
	return s
}

// flow returns the flow to track for c, and false when c is not a
// connection to one of the services.
func (s *snatServices) flow(c ipvs.Connection) (conntrack.Flow, bool) {
	v := c.Virtual
	if !s.keys[snatKey{Proto: c.Proto, Addr: v.Addr(), Port: v.Port()}] && !s.keys[snatKey{Proto: c.Proto, Addr: v.Addr()}] {
		return conntrack.Flow{}, false
	}
	src := s.src4
	if v.Addr().Is6() {
		src = s.src6
	}
	return conntrack.FlowOf(c, src)
}

// adoption is what a takeover did to the SNAT connections' tracking.
type adoption struct {
	conntrack.Result
	took time.Duration
	// read is the part of took spent reading the connection table, and
	// listed the connections it listed.
	read   time.Duration
	listed int
	err    error
	// partial says that the pass stopped at its deadline, having read
	// part of the connection table; preread that the takeover neither
	// read the table nor tracked, but took the tracking done during the
	// master's suspicion.
	partial, preread bool
}

// adoptSNAT tracks the connections of the IPVS table to s's services:
// those a peer synchronized. It stops reading the table at deadline (the
// zero time reads it all), so that a table of a million connections does
// not hold a takeover back: what it leaves, a later pass tracks. A
// takeover replaces the entries the node has already (conntrack.Replace:
// leftovers of its last turn as master); a pass once master keeps them.
func adoptSNAT(t ConnTracker, s *snatServices, deadline time.Time, existing conntrack.Existing) adoption {
	start := time.Now()
	flows, n, partial, err := readSNAT(t, s, deadline)
	a := adoption{read: time.Since(start), listed: n, partial: partial}
	if err == nil {
		a.Result, err = t.Track(flows, existing)
	}
	a.took, a.err = time.Since(start), err
	return a
}

// readSNAT reads the flows of s's services from the IPVS table, until
// deadline (the zero time reads it all): the flows, the connections it
// listed, and whether it stopped at the deadline.
func readSNAT(t ConnTracker, s *snatServices, deadline time.Time) (flows []conntrack.Flow, n int, partial bool, err error) {
	err = t.Connections(func(c ipvs.Connection) bool {
		if f, ok := s.flow(c); ok {
			flows = append(flows, f)
		}
		// The clock is read every 256 connections.
		if n++; n%256 == 0 && !deadline.IsZero() && time.Now().After(deadline) {
			partial = true
			return false
		}
		return true
	})
	return flows, n, partial, err
}

// trackSNAT tracks flows read before (on suspicion).
func trackSNAT(t ConnTracker, flows []conntrack.Flow, existing conntrack.Existing) adoption {
	start := time.Now()
	var a adoption
	a.Result, a.err = t.Track(flows, existing)
	a.took = time.Since(start)
	return a
}
