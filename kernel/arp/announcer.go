// Package arp announces VIPs on uplink interfaces, as MetalLB's layer-2
// mode does: it answers ARP requests and IPv6 neighbour solicitations for
// them and sends gratuitous announcements.
//
// vipd binds VIPs to a dummy interface and runs with strict ARP
// (arp_ignore=1, arp_announce=2), so the kernel answers ARP only for
// addresses of the receiving interface and never for a VIP; IPv6 neighbour
// discovery likewise answers only for the receiving interface's
// addresses. An Announcer answers for the VIPs it announces on each
// uplink and never touches the dummy interface.
//
// Announcing a VIP sends a burst of Count announcements spaced by
// Interval, the first at once: for IPv4 each is a gratuitous ARP request
// and a gratuitous ARP reply, for IPv6 an unsolicited neighbour
// advertisement with the override flag to all nodes. A Refresh repeats
// one announcement periodically.
package arp

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"

	"github.com/vipd/vipd/lb"
)

// Options configure an Announcer.
type Options struct {
	// Uplinks name the interfaces VIPs are announced on.
	Uplinks []string
	// Dummy names vipd's dummy interface, which New refuses as an uplink.
	Dummy string
	// Count is the number of announcements in the burst sent when a VIP
	// is announced. Zero sends none: the VIP is only answered for.
	Count int
	// Interval separates the announcements of a burst; zero means one
	// second.
	Interval time.Duration
	// Refresh repeats one announcement of each VIP this often after its
	// burst; zero never does. A refresh also retries uplinks that were
	// missing or down.
	Refresh time.Duration
	// Logger receives records of failures in the background: burst,
	// refresh and uplink connections. Nil discards them.
	Logger *slog.Logger
	// Links opens connections on the uplinks; nil means KernelLinks.
	Links Links
}

// Stats count the packets an Announcer sent.
type Stats struct {
	// Announcements counts gratuitous ARP packets and unsolicited
	// neighbour advertisements.
	Announcements uint64
	// Replies counts ARP replies and solicited neighbour advertisements.
	Replies uint64
	// Errors counts packets that could not be sent.
	Errors uint64
}

// Announcer implements lb.Announcer. Its methods are safe for concurrent
// use.
type Announcer struct {
	opts  Options
	log   *slog.Logger
	links Links

	mu     sync.RWMutex
	closed bool
	vips   map[netip.Addr]*vip
	open   map[linkKey]*link
	// looked, while AnnounceAll prepares its addresses, holds the
	// uplinks it looked up: one lookup of each for the whole batch.
	looked map[string]lookup
	wg     sync.WaitGroup

	announcements, replies, errs atomic.Uint64
}

var _ lb.Announcer = (*Announcer)(nil)

// vip is one announced VIP.
type vip struct {
	addr netip.Addr
	// stop is closed when the VIP is withdrawn, ending its burst and
	// refresh.
	stop chan struct{}
	// on holds the uplinks its announcements go out on. The VIP is fully
	// announced when it holds every uplink; a failure on an uplink
	// removes it, so that the next Announce (or refresh) retries.
	on map[string]bool
}

type linkKey struct {
	name string
	fam  lb.Family
}

// link is an open connection on one uplink for one address family, with
// the goroutine that answers on it.
type link struct {
	linkKey
	ifi *net.Interface
	arp Conn    // IPv4
	ndp NDPConn // IPv6
	// vips are the IPv6 VIPs whose solicited-node multicast groups this
	// link joined; groups counts them by group.
	vips   map[netip.Addr]bool
	groups map[netip.Addr]int
	closed atomic.Bool
}

// New returns an Announcer for opts. It opens nothing until a VIP is
// announced.
func New(opts Options) (*Announcer, error) {
	if len(opts.Uplinks) == 0 {
		return nil, errors.New("no uplinks to announce vips on")
	}
	for i, u := range opts.Uplinks {
		switch {
		case u == "":
			return nil, errors.New("empty uplink name")
		case u == opts.Dummy:
			return nil, fmt.Errorf("uplink %s is vipd's dummy interface; announce on a real uplink", u)
		case slices.Contains(opts.Uplinks[:i], u):
			return nil, fmt.Errorf("uplink %s is listed twice", u)
		}
	}
	if opts.Count < 0 {
		return nil, fmt.Errorf("announcement count %d is negative", opts.Count)
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Links == nil {
		opts.Links = KernelLinks{}
	}
	return &Announcer{
		opts:  opts,
		log:   opts.Logger,
		links: opts.Links,
		vips:  map[netip.Addr]*vip{},
		open:  map[linkKey]*link{},
	}, nil
}

// Stats returns the packet counts so far.
func (a *Announcer) Stats() Stats {
	return Stats{Announcements: a.announcements.Load(), Replies: a.replies.Load(), Errors: a.errs.Load()}
}

// Announced implements lb.Announcer. It lists the VIPs announced on every
// uplink; a VIP missing an uplink (missing, down, or failing) is left out
// so that the reconciler announces it again.
func (a *Announcer) Announced() []netip.Addr {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var out []netip.Addr
	for addr, v := range a.vips {
		if len(v.on) == len(a.opts.Uplinks) {
			out = append(out, addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// Announce implements lb.Announcer. It starts answering for addr on every
// uplink and sends the first announcement of a burst on each uplink the
// VIP is not yet announced on, leaving the rest of the burst to the
// background. It returns an error naming each uplink it could not use; the
// VIP is still announced on the others, and a later Announce or refresh
// retries.
func (a *Announcer) Announce(addr netip.Addr) error {
	if !addr.IsValid() {
		return errors.New("announce: invalid address")
	}
	addr = addr.Unmap()
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return fmt.Errorf("announce %s: %w", addr, errClosed)
	}
	v := a.vipLocked(addr)
	fresh, err := a.prepare(v)
	a.mu.Unlock()
	if err := errors.Join(err, a.startBurst(v, fresh)); err != nil {
		return fmt.Errorf("announce %s: %w", addr, err)
	}
	return nil
}

// vipLocked returns the state of addr, making it (and starting its
// refresh) the first time. a.mu must be held.
func (a *Announcer) vipLocked(addr netip.Addr) *vip {
	v := a.vips[addr]
	if v == nil {
		v = &vip{addr: addr, stop: make(chan struct{}), on: map[string]bool{}}
		a.vips[addr] = v
		if a.opts.Refresh > 0 {
			a.wg.Add(1)
			go a.refresh(v)
		}
	}
	return v
}

// AnnounceAll announces each of addrs as Announce does, with one lookup
// of each uplink for them all and their first announcements sent back to
// back: the first packet of each address on each uplink, in the order of
// addrs, and only then the second (the gratuitous ARP reply). A node
// that takes several addresses over (a VIP and the floating address its
// backends answer) so puts them all on the wire within as few packets of
// one another as it can, so that few connections open through the node
// with half of their way there. It returns an error naming each address
// it could not announce on every uplink.
func (a *Announcer) AnnounceAll(addrs []netip.Addr) error {
	type job struct {
		v     *vip
		fresh []string
		sent  []string
		errs  []error
	}
	var errs []error
	jobs := make([]*job, 0, len(addrs))
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return fmt.Errorf("announce %d addresses: %w", len(addrs), errClosed)
	}
	a.looked = map[string]lookup{}
	for _, addr := range addrs {
		if !addr.IsValid() {
			errs = append(errs, errors.New("announce: invalid address"))
			continue
		}
		addr = addr.Unmap()
		v := a.vipLocked(addr)
		fresh, err := a.prepare(v)
		j := &job{v: v, fresh: fresh}
		if err != nil {
			j.errs = append(j.errs, err)
		}
		jobs = append(jobs, j)
	}
	a.looked = nil
	a.mu.Unlock()
	if a.opts.Count > 0 {
		for _, j := range jobs {
			j.sent, j.errs = a.sendOn(j.v, j.fresh, false, j.errs)
		}
		for _, j := range jobs {
			j.sent, j.errs = a.sendOn(j.v, j.sent, true, j.errs)
		}
	} else {
		for _, j := range jobs {
			j.sent = j.fresh
		}
	}
	for _, j := range jobs {
		if !a.started(j.v, j.sent) {
			continue // withdrawn meanwhile
		}
		if err := errors.Join(j.errs...); err != nil {
			errs = append(errs, fmt.Errorf("announce %s: %w", j.v.addr, err))
		}
	}
	return errors.Join(errs...)
}

// lookup is an uplink as AnnounceAll looked it up.
type lookup struct {
	ifi *net.Interface
	err error
}

// Ready opens, on every uplink, the connection that announcing addr
// needs, without answering for addr or announcing it: a node that stands
// by (a high-availability backup) is then one packet away from taking
// addr over, with no socket to open at the takeover. It returns an error
// naming each uplink it could not open; Announce tries them again.
func (a *Announcer) Ready(addr netip.Addr) error {
	if !addr.IsValid() {
		return errors.New("ready: invalid address")
	}
	fam := lb.FamilyOf(addr.Unmap())
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("ready %s: %w", addr, errClosed)
	}
	var errs []error
	for _, name := range a.opts.Uplinks {
		if a.open[linkKey{name, fam}] != nil {
			// Open already, for another address: no interface lookup
			// per VIP (a backup holds thousands). Announce checks for
			// an interface replaced since.
			continue
		}
		if _, err := a.link(name, fam); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ready %s: %w", addr, err)
	}
	return nil
}

// Withdraw implements lb.Announcer. It stops answering for addr and ends
// its burst and refresh. Withdrawing an address not announced is no error.
func (a *Announcer) Withdraw(addr netip.Addr) error {
	addr = addr.Unmap()
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.vips[addr]
	if v == nil {
		return nil
	}
	delete(a.vips, addr)
	close(v.stop)
	for _, l := range a.open {
		if l.vips[addr] {
			a.leave(l, addr)
		}
	}
	return nil
}

// Close withdraws every VIP, closes the uplink connections and waits for
// the background work to end.
func (a *Announcer) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	for addr, v := range a.vips {
		close(v.stop)
		delete(a.vips, addr)
	}
	for _, l := range a.open {
		a.closeLink(l)
	}
	a.mu.Unlock()
	a.wg.Wait()
	return nil
}

// announces reports whether addr is a VIP to answer for.
func (a *Announcer) announces(addr netip.Addr) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	_, ok := a.vips[addr.Unmap()]
	return ok
}

// prepare opens the uplinks v needs and returns those v is not yet
// announced on, with an error naming each uplink it cannot use. The
// caller holds a.mu.
func (a *Announcer) prepare(v *vip) ([]string, error) {
	fam := lb.FamilyOf(v.addr)
	var fresh []string
	var errs []error
	for _, name := range a.opts.Uplinks {
		l, err := a.link(name, fam)
		if err == nil && fam == lb.IPv6 && !l.vips[v.addr] {
			err = a.join(l, v.addr)
		}
		if err != nil {
			errs = append(errs, err)
			delete(v.on, name)
			continue
		}
		if !v.on[name] {
			fresh = append(fresh, name)
		}
	}
	return fresh, errors.Join(errs...)
}

// link returns the open connection on uplink name for family fam,
// opening it (and starting its responder) if needed. An interface that
// was replaced since is reopened. The caller holds a.mu.
func (a *Announcer) link(name string, fam lb.Family) (*link, error) {
	var ifi *net.Interface
	var err error
	if got, ok := a.looked[name]; ok {
		ifi, err = got.ifi, got.err
	} else {
		ifi, err = a.links.Interface(name)
		if a.looked != nil {
			a.looked[name] = lookup{ifi, err}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("uplink %s: %w", name, err)
	}
	if ifi.Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("uplink %s is down", name)
	}
	if ifi.Flags&net.FlagLoopback != 0 {
		return nil, fmt.Errorf("uplink %s is a loopback interface", name)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("uplink %s has no ethernet address", name)
	}
	k := linkKey{name, fam}
	if l := a.open[k]; l != nil {
		if l.ifi.Index == ifi.Index && bytes.Equal(l.ifi.HardwareAddr, ifi.HardwareAddr) {
			return l, nil
		}
		a.closeLink(l)
	}
	l := &link{linkKey: k, ifi: ifi, vips: map[netip.Addr]bool{}, groups: map[netip.Addr]int{}}
	if fam == lb.IPv4 {
		if l.arp, err = a.links.ListenARP(ifi); err != nil {
			return nil, fmt.Errorf("uplink %s: listen for arp: %w", name, err)
		}
	} else {
		if l.ndp, err = a.links.ListenNDP(ifi); err != nil {
			return nil, fmt.Errorf("uplink %s: listen for neighbour solicitations: %w", name, err)
		}
	}
	a.open[k] = l
	a.wg.Add(1)
	go a.serve(l)
	return l, nil
}

// closeLink closes l and forgets that any VIP of its family is announced
// on its uplink. The caller holds a.mu.
func (a *Announcer) closeLink(l *link) {
	l.closed.Store(true)
	if l.arp != nil {
		l.arp.Close()
	} else {
		l.ndp.Close()
	}
	if a.open[l.linkKey] == l {
		delete(a.open, l.linkKey)
	}
	for _, v := range a.vips {
		if lb.FamilyOf(v.addr) == l.fam {
			delete(v.on, l.name)
		}
	}
}

// join joins the solicited-node multicast group of addr on l. The
// caller holds a.mu.
func (a *Announcer) join(l *link, addr netip.Addr) error {
	g, err := ndp.SolicitedNodeMulticast(addr)
	if err != nil {
		return fmt.Errorf("uplink %s: %w", l.name, err)
	}
	if l.groups[g] == 0 {
		if err := l.ndp.JoinGroup(g); err != nil {
			return fmt.Errorf("uplink %s: join %s: %w", l.name, g, err)
		}
	}
	l.groups[g]++
	l.vips[addr] = true
	return nil
}

// leave undoes join. The caller holds a.mu.
func (a *Announcer) leave(l *link, addr netip.Addr) {
	g, _ := ndp.SolicitedNodeMulticast(addr)
	delete(l.vips, addr)
	l.groups[g]--
	if l.groups[g] > 0 {
		return
	}
	delete(l.groups, g)
	if err := l.ndp.LeaveGroup(g); err != nil {
		// The VIP is withdrawn all the same; the group only lets
		// solicitations in that are no longer answered.
		a.log.Warn("leave multicast group", "uplink", l.name, "group", g, "err", err)
	}
}

// startBurst sends the first announcement of v on the uplinks names at
// once and the rest of the burst in the background. It records the
// uplinks the first announcement went out on and returns an error naming
// the others.
func (a *Announcer) startBurst(v *vip, names []string) error {
	if len(names) == 0 {
		return nil
	}
	var err error
	sent := names
	if a.opts.Count > 0 {
		sent, err = a.announceOn(v, names)
	}
	if !a.started(v, sent) {
		return nil // withdrawn meanwhile
	}
	return err
}

// started records that the first announcement of v went out on the
// uplinks sent and starts the rest of its burst there. It reports false
// when v was withdrawn meanwhile (or the announcer closed).
func (a *Announcer) started(v *vip, sent []string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.vips[v.addr] != v {
		return false
	}
	for _, n := range sent {
		v.on[n] = true
	}
	if a.opts.Count > 1 && len(sent) > 0 {
		a.wg.Add(1)
		go a.burst(v, sent)
	}
	return true
}

// burst sends the announcements of v after the first on the uplinks
// names, Interval apart.
func (a *Announcer) burst(v *vip, names []string) {
	defer a.wg.Done()
	t := time.NewTimer(a.opts.Interval)
	defer t.Stop()
	for i := 1; i < a.opts.Count && len(names) > 0; i++ {
		select {
		case <-v.stop:
			return
		case <-t.C:
		}
		sent, err := a.announceOn(v, names)
		if err != nil {
			a.log.Warn("gratuitous announcement failed", "vip", v.addr, "err", err)
			a.forget(v, names, sent)
		}
		names = sent
		t.Reset(a.opts.Interval)
	}
}

// refresh announces v every Refresh until it is withdrawn, retrying the
// uplinks it is not announced on.
func (a *Announcer) refresh(v *vip) {
	defer a.wg.Done()
	t := time.NewTicker(a.opts.Refresh)
	defer t.Stop()
	for {
		select {
		case <-v.stop:
			return
		case <-t.C:
		}
		a.mu.Lock()
		if a.closed || a.vips[v.addr] != v {
			a.mu.Unlock()
			return
		}
		fresh, err := a.prepare(v)
		var steady []string
		for _, n := range a.opts.Uplinks {
			if v.on[n] {
				steady = append(steady, n)
			}
		}
		a.mu.Unlock()
		if err := errors.Join(err, a.startBurst(v, fresh)); err != nil {
			a.log.Warn("refresh: uplinks unavailable", "vip", v.addr, "err", err)
		}
		if sent, err := a.announceOn(v, steady); err != nil {
			a.log.Warn("refresh announcement failed", "vip", v.addr, "err", err)
			a.forget(v, steady, sent)
		}
	}
}

// forget records that v is no longer announced on the uplinks in names
// but not in sent.
func (a *Announcer) forget(v *vip, names, sent []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range names {
		if !slices.Contains(sent, n) {
			delete(v.on, n)
		}
	}
}

// announceOn sends one announcement of v on each uplink in names and
// returns the uplinks it went out on, with an error naming the others.
func (a *Announcer) announceOn(v *vip, names []string) ([]string, error) {
	sent, errs := a.sendOn(v, names, false, nil)
	sent, errs = a.sendOn(v, sent, true, errs)
	return sent, errors.Join(errs...)
}

// sendOn sends the first packet of an announcement of v (second false)
// or the second (second true) on each uplink in names. It returns the
// uplinks it went out on, and errs with an error for each of the others
// appended.
func (a *Announcer) sendOn(v *vip, names []string, second bool, errs []error) ([]string, []error) {
	fam := lb.FamilyOf(v.addr)
	if second && fam == lb.IPv6 {
		return names, errs // an advertisement is one packet
	}
	var sent []string
	for _, name := range names {
		select {
		case <-v.stop:
			return sent, errs // withdrawn: send no more
		default:
		}
		a.mu.RLock()
		l := a.open[linkKey{name, fam}]
		a.mu.RUnlock()
		var err error
		if l == nil {
			err = errors.New("not open")
		} else {
			err = a.announcePacket(l, v.addr, second)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("uplink %s: %w", name, err))
			continue
		}
		sent = append(sent, name)
	}
	return sent, errs
}

// allNodes is the IPv6 all-nodes multicast address.
var allNodes = netip.MustParseAddr("ff02::1")

// announcePacket sends one packet of an announcement of addr on l: the
// first, or with second the second. For IPv4 the first is a gratuitous
// ARP request (target hardware address zero, as RFC 5227 and Linux send
// them) and the second a gratuitous ARP reply (target hardware address
// the sender's, which Linux requires of a gratuitous reply), both
// broadcast. For IPv6 the first is an unsolicited neighbour
// advertisement with the override flag, to all nodes, and there is no
// second.
func (a *Announcer) announcePacket(l *link, addr netip.Addr, second bool) error {
	mac := l.ifi.HardwareAddr
	if l.fam == lb.IPv4 {
		op, target := arp.OperationRequest, make(net.HardwareAddr, len(mac))
		if second {
			op, target = arp.OperationReply, mac
		}
		pkt, err := arp.NewPacket(op, mac, addr, target, addr)
		if err != nil {
			return fmt.Errorf("build gratuitous arp for %s: %w", addr, err)
		}
		if err := l.arp.WriteTo(pkt, ethernet.Broadcast); err != nil {
			a.errs.Add(1)
			return fmt.Errorf("send gratuitous arp %s for %s: %w", op, addr, err)
		}
		a.announcements.Add(1)
		return nil
	}
	if second {
		return nil
	}
	na := &ndp.NeighborAdvertisement{
		Override:      true,
		TargetAddress: addr,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: mac}},
	}
	if err := l.ndp.WriteTo(na, allNodes); err != nil {
		a.errs.Add(1)
		return fmt.Errorf("send unsolicited neighbour advertisement for %s: %w", addr, err)
	}
	a.announcements.Add(1)
	return nil
}
