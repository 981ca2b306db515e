package agent

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/vipd/vipd/kernel/arp"
	"github.com/vipd/vipd/lb"
)

// roleGate is the kernel's announcer on a node of a high-availability
// group. The reconciler announces every VIP as if the node were master;
// the gate passes the announcements on only while it is. A change of role
// announces or withdraws everything at once, from the elector's
// goroutine: a takeover never waits for the main loop, which may be in
// the middle of a long pass, and an announcement a pass planned before
// the node stopped being master never reaches the wire.
type roleGate struct {
	inner lb.Announcer

	mu     sync.Mutex
	master bool
	// wanted holds what the reconciler announced, which the master
	// announces.
	wanted map[netip.Addr]struct{}
}

func newRoleGate(inner lb.Announcer) *roleGate {
	return &roleGate{inner: inner, wanted: map[netip.Addr]struct{}{}}
}

// Announced implements lb.Announcer: what the reconciler asked for,
// whatever the role.
func (g *roleGate) Announced() []netip.Addr {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.SortedFunc(maps.Keys(g.wanted), netip.Addr.Compare)
}

// Announce implements lb.Announcer.
func (g *roleGate) Announce(a netip.Addr) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.wanted[a] = struct{}{}
	if !g.master {
		// Stand ready: the takeover then sends at once, with no
		// socket to open. An uplink that cannot be opened now is
		// tried again, and reported, by the takeover's Announce.
		if r, ok := g.inner.(readier); ok {
			_ = r.Ready(a)
		}
		return nil
	}
	return g.inner.Announce(a)
}

// readier is an announcer that can open what announcing an address needs
// ahead of time (arp.Announcer.Ready).
type readier interface {
	Ready(netip.Addr) error
}

// Withdraw implements lb.Announcer.
func (g *roleGate) Withdraw(a netip.Addr) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.wanted, a)
	return g.inner.Withdraw(a)
}

// Stats returns the announcer's counters, when it keeps any.
func (g *roleGate) Stats() arp.Stats {
	if s, ok := g.inner.(interface{ Stats() arp.Stats }); ok {
		return s.Stats()
	}
	return arp.Stats{}
}

// setRole announces every wanted address (master) or withdraws every
// announced one, and returns how many addresses it changed.
func (g *roleGate) setRole(master bool) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.master = master
	if master {
		return g.announceMissing()
	}
	// Every address the announcer may hold, not only those it lists as
	// announced on every uplink: an address whose uplink failed (the
	// master's link cut) is left out of that list, and, not withdrawn,
	// its refresh would announce it again from the backup once the
	// uplink is back, taking the clients and the backends from the
	// master. Withdrawing an address not announced is no error.
	addrs := maps.Clone(g.wanted)
	for _, a := range g.inner.Announced() {
		addrs[a] = struct{}{}
	}
	var errs []error
	n := 0
	for _, a := range slices.SortedFunc(maps.Keys(addrs), netip.Addr.Compare) {
		n++
		errs = append(errs, g.inner.Withdraw(a))
	}
	return n, errors.Join(errs...)
}

// retry announces, on a master, what is wanted and not announced on every
// uplink: an uplink that was down or missing when the node took over
// gets its announcements once it is back. It returns how many addresses
// it announced, and their errors.
func (g *roleGate) retry() (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.master {
		return 0, nil
	}
	return g.announceMissing()
}

// announceMissing announces the wanted addresses the announcer does not
// list as announced on every uplink. The caller holds g.mu.
func (g *roleGate) announceMissing() (int, error) {
	on := map[netip.Addr]bool{}
	for _, a := range g.inner.Announced() {
		on[a] = true
	}
	var missing []netip.Addr
	for _, a := range slices.SortedFunc(maps.Keys(g.wanted), netip.Addr.Compare) {
		if !on[a] {
			missing = append(missing, a)
		}
	}
	if b, ok := g.inner.(batchAnnouncer); ok && len(missing) > 1 {
		return len(missing), b.AnnounceAll(missing)
	}
	var errs []error
	for _, a := range missing {
		errs = append(errs, g.inner.Announce(a))
	}
	return len(missing), errors.Join(errs...)
}

// batchAnnouncer announces several addresses at once, back to back on
// the wire (arp.Announcer).
type batchAnnouncer interface {
	AnnounceAll([]netip.Addr) error
}

// reassert announces every address again, on a master: a new burst of
// gratuitous ARP / unsolicited NA, so that the clients that followed
// another master after a split brain come back.
func (g *roleGate) reassert() (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.master {
		return 0, nil
	}
	var errs []error
	n := 0
	for _, a := range slices.SortedFunc(maps.Keys(g.wanted), netip.Addr.Compare) {
		// The announcer sends a burst for an address it starts
		// answering for.
		if err := g.inner.Withdraw(a); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
		errs = append(errs, g.inner.Announce(a))
	}
	return n, errors.Join(errs...)
}
