// Package vrrp is a VRRPv3 virtual router (RFC 5798) for IPv4 or IPv6
// that speaks the standard's packets, so that vipd and keepalived
// (vrrp_version 3) can be peers in one virtual router.
//
// A Router elects a master among its peers and reports its role; it does
// not add, answer or announce addresses itself: what a role means is the
// caller's to decide. The protocol is a pure state machine (Machine) fed
// with the time of every event, and packets (Packet) that Parse checks as
// the RFC's receive rules ask; the Router runs them over a raw socket for
// IP protocol 112 on one interface, joined to 224.0.0.18 or ff02::12, or
// sending to unicast peers, with TTL (hop limit) 255 sent and required
// whatever the destination.
package vrrp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Options configure a Router.
type Options struct {
	// Interface names the interface the router advertises and listens on.
	Interface string
	// VRID is the virtual router id, 1 to 255.
	VRID uint8
	// Priority is 1 to 255; 255 is the address owner's.
	Priority uint8
	// Interval is the advertisement interval in centiseconds, 1 to 4095.
	Interval uint16
	// Preempt lets this router, as a backup, take over from a master of
	// lower priority; PreemptDelay is how long it keeps accepting such a
	// master first (see MachineConfig).
	Preempt      bool
	PreemptDelay time.Duration
	// RejoinDelay is how long a router that starts again after standing
	// back accepts a master of lower priority before it preempts it (see
	// MachineConfig.RejoinDelay).
	RejoinDelay time.Duration
	// StartAsMaster starts as master, advertising at once: for a restart
	// that must keep the addresses from a peer of lower priority.
	StartAsMaster bool
	// CarrierFault makes the router stand back while its interface is up
	// without a carrier, as keepalived's fault state does, and take part
	// again by its own link messages once the carrier is back (see
	// WatchesCarrier). Unset, only an interface missing or down (or
	// advertisements that cannot be sent) makes it stand back: two
	// routers cabled to each other then still take over from each
	// other.
	CarrierFault bool
	// Addrs are the virtual addresses advertised, all IPv4 or all IPv6
	// (for IPv6 the first should be link-local, as RFC 5798 asks); their
	// family is the router's.
	Addrs []netip.Addr
	// Peers, when set, are sent advertisements by unicast instead of the
	// multicast group, and are the only sources accepted. Unicast
	// advertisements, as multicast ones, are sent and must arrive with
	// TTL (hop limit) 255: a peer's address alone can be spoofed from
	// off the link. keepalived sends IPv6 unicast with hop limit 64
	// unless its instance sets unicast_ttl 255.
	Peers []netip.Addr
	// Source is the primary address advertisements are sent from and ties
	// are broken with; unset, the interface's first IPv4 address or its
	// IPv6 link-local address.
	Source netip.Addr
	// OnTransition is called on every change of role, from Run's
	// goroutine: on becoming master before the advertisement that goes
	// with it is sent, so that the caller's announcements go out first;
	// otherwise after it. It must not block for long; it may call the
	// Router's methods except Resign.
	OnTransition func(Transition)
	// OnReassert is called, as OnTransition is, when the master heard
	// another master of lower priority and must announce its addresses
	// again, with why.
	OnReassert func(reason string)
	// OnSuspect, when set, is called, as OnTransition is, when a backup
	// has heard nothing from its master for SuspectIntervals
	// advertisement intervals, with why: a takeover may follow when the
	// master down timer fires, and the caller can ready what it needs.
	OnSuspect func(reason string)
	// Logger receives a record per transition and per failure. Nil
	// discards them.
	Logger *slog.Logger
	// Clock is the time source; nil means the system's.
	Clock Clock
}

// Clock is a time source.
type Clock interface {
	Now() time.Time
	// Timer returns a channel that receives once d has passed, and a
	// function that stops it.
	Timer(d time.Duration) (<-chan time.Time, func() bool)
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Timer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// Status is a router's view of its virtual router.
type Status struct {
	Role     Role
	Priority uint8
	// Master is the master's primary address and MasterPriority its
	// priority, when known.
	Master         netip.Addr
	MasterPriority uint8
	// Sent counts advertisements sent, SendErrors those that failed;
	// Received counts advertisements for this virtual router that passed
	// the receive checks, Dropped the packets that failed them.
	Sent, SendErrors, Received, Dropped uint64
	// Fault, when set, says why the router stands back (in Init): its
	// interface is missing or down, or advertisements cannot be sent.
	Fault string
}

// Router is one VRRP virtual router on one interface. Its methods are
// safe for concurrent use.
type Router struct {
	opts  Options
	log   *slog.Logger
	clock Clock
	c     conn
	self  netip.Addr
	dsts  []netip.Addr
	m     *Machine

	mu       sync.Mutex
	ops      []op
	status   Status
	sendFail bool

	// link, when set, watches the interface and opens the socket again
	// on it (see checkLink); index is the interface's index the socket
	// is bound to. Run's goroutine only, as the fields below.
	link  linker
	index int
	// fault says the router stands back for its interface (Status.Fault
	// says why); resigned that Resign asked it to, until Resume. The
	// router takes part in the election when neither holds.
	fault, resigned bool
	// failedSends counts the advertisements in a row that went to no
	// destination; recheck asks Run to look at the interface now;
	// reopen to open the socket again even on the same index.
	failedSends     int
	recheck, reopen bool
	// pkts and errc receive from the socket's reader, which stop ends.
	pkts chan received
	errc chan connErr
	stop chan struct{}

	// addrWarn and intervalWarn limit the warnings about advertisements
	// with other addresses, and with too long an interval (Run's
	// goroutine only).
	addrWarn, intervalWarn warnLimiter

	wake chan struct{}
	done chan struct{}
}

type opKind int

const (
	opPriority opKind = iota
	opResign
	opResume
)

type op struct {
	kind     opKind
	priority uint8
	reason   string
	done     chan struct{}
}

// New checks opts and opens the router's socket on the interface, in the
// network namespace of the calling thread.
func New(opts Options) (*Router, error) {
	v6, err := checkOptions(&opts)
	if err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByName(opts.Interface)
	if err != nil {
		return nil, fmt.Errorf("vrrp: interface %q: %w", opts.Interface, err)
	}
	configured := opts.Source.IsValid()
	if !configured {
		if opts.Source, err = primaryAddr(ifi, v6); err != nil {
			return nil, fmt.Errorf("vrrp: %w", err)
		}
	}
	link, err := newIfaceLink(opts.Interface, v6, !configured)
	if err != nil {
		return nil, fmt.Errorf("vrrp: %w", err)
	}
	c, err := listen(ifi, v6)
	if err != nil {
		link.Close()
		return nil, fmt.Errorf("vrrp: %w", err)
	}
	r, err := newRouter(opts, c)
	if err != nil {
		c.Close()
		link.Close()
		return nil, err
	}
	r.link, r.index = link, ifi.Index
	return r, nil
}

// checkOptions validates opts, fills in defaults and tells the family.
func checkOptions(opts *Options) (v6 bool, err error) {
	if opts.Interface == "" {
		return false, errors.New("vrrp: no interface")
	}
	if opts.VRID == 0 {
		return false, errors.New("vrrp: virtual router id 0 is not valid (1 to 255)")
	}
	if len(opts.Addrs) == 0 || len(opts.Addrs) > 255 {
		return false, fmt.Errorf("vrrp: %d virtual addresses (1 to 255)", len(opts.Addrs))
	}
	v6 = opts.Addrs[0].Is6()
	check := func(what string, a netip.Addr) error {
		if !a.IsValid() || a.Is6() != v6 || a.Is4In6() {
			return fmt.Errorf("vrrp: %s %v: one family per virtual router, as %v", what, a, opts.Addrs[0])
		}
		return nil
	}
	for _, a := range opts.Addrs {
		if err := check("virtual address", a); err != nil {
			return false, err
		}
	}
	for _, a := range opts.Peers {
		if err := check("peer", a); err != nil {
			return false, err
		}
	}
	if opts.Source.IsValid() {
		if err := check("source", opts.Source); err != nil {
			return false, err
		}
	}
	return v6, nil
}

func newRouter(opts Options, c conn) (*Router, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = systemClock{}
	}
	m, err := NewMachine(MachineConfig{
		Self: opts.Source, Priority: opts.Priority, Interval: opts.Interval,
		Preempt: opts.Preempt, PreemptDelay: opts.PreemptDelay, StartAsMaster: opts.StartAsMaster, RejoinDelay: opts.RejoinDelay,
		Suspect: opts.OnSuspect != nil,
	})
	if err != nil {
		return nil, fmt.Errorf("vrrp: %w", err)
	}
	dsts := opts.Peers
	if len(dsts) == 0 {
		dsts = []netip.Addr{Group4}
		if opts.Source.Is6() {
			dsts = []netip.Addr{Group6}
		}
	}
	return &Router{
		opts:   opts,
		log:    opts.Logger.With("interface", opts.Interface, "vrid", opts.VRID),
		clock:  opts.Clock,
		c:      c,
		self:   opts.Source,
		dsts:   dsts,
		m:      m,
		status: Status{Role: Init, Priority: opts.Priority},
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}, nil
}

// Source is the router's primary address.
func (r *Router) Source() netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.self
}

// Status is the router's current view.
func (r *Router) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// SetPriority changes the router's priority (1 to 255), as tracking does;
// a master advertises it at once.
func (r *Router) SetPriority(p uint8) error {
	if p == 0 {
		return errors.New("vrrp: priority 0 is reserved for resigning")
	}
	r.enqueue(op{kind: opPriority, priority: p})
	return nil
}

// Resign hands the virtual router over: a master advertises priority 0,
// so that a backup takes over after its skew time instead of the master
// down interval, and the router stays in Init, neither master nor backup,
// until Resume. Resign returns once that advertisement was sent, or when
// ctx ends or Run has returned.
func (r *Router) Resign(ctx context.Context, reason string) error {
	done := make(chan struct{})
	r.enqueue(op{kind: opResign, reason: reason, done: done})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("vrrp: resign: %w", ctx.Err())
	case <-r.done:
		return errors.New("vrrp: resign: router stopped")
	}
}

// Resume starts a resigned router again, as a backup (or master, as on
// start).
func (r *Router) Resume() { r.enqueue(op{kind: opResume}) }

// WatchesCarrier reports whether the router watches its interface by its
// link messages, standing back while it is missing, down or without a
// carrier and taking part again once it runs (a Router made by New with
// CarrierFault): its caller need not resign it for that, and a
// resignation would hold its return until the caller's Resume.
func (r *Router) WatchesCarrier() bool { return r.link != nil && r.opts.CarrierFault }

func (r *Router) enqueue(o op) {
	r.mu.Lock()
	r.ops = append(r.ops, o)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

type received struct {
	b        []byte
	src, dst netip.Addr
	ttl      int
	// at is when the kernel received the packet (wall clock), if it
	// says.
	at time.Time
}

// connErr is a socket's receive error.
type connErr struct {
	c   conn
	err error
}

// linker watches a router's interface and opens its socket again
// (ifaceLink).
type linker interface {
	// state returns the interface's index, whether it is up, and
	// whether it runs (up with a carrier: what is sent goes out).
	state() (index int, up, running bool, err error)
	// open opens a socket on the interface as it is now, and returns
	// its index and primary address (invalid when configured).
	open() (c conn, index int, src netip.Addr, err error)
	// watch sends on changed, coalesced, whenever the interface may
	// have changed (a link message), until stop closes; done closes
	// once it has ended.
	watch(stop <-chan struct{}, log *slog.Logger) (changed, done <-chan struct{})
	// resolve sends each peer an ICMP echo request from src on the
	// interface: resolving the peer's link-layer address refreshes the
	// peer's neighbour entry for src.
	resolve(src netip.Addr, peers []netip.Addr) error
	Close()
}

// linkCheckEvery is how often the router looks at its interface besides
// the link messages: the backstop for a message lost, and the pace at
// which a router whose socket failed, or whose advertisements went
// nowhere, tries again.
const linkCheckEvery = time.Second

// maxSendFailures is how many advertisements in a row may go to no
// destination, the interface looking fine, before the router stands
// back: a master that cannot advertise must not keep the VIPs while its
// backup, hearing nothing, takes over.
const maxSendFailures = 3

// Run runs the router until ctx ends or receiving fails, and closes its
// socket; a Router runs once. It starts the router (Startup) at once.
// When ctx ends, Run returns nil without advertising anything and
// without a transition: resign first to hand over at once.
//
// While its interface is missing or down, or advertisements cannot be
// sent, or receiving failed, the router stands back as Resign does
// (Status.Fault says why); when the interface is back it opens its
// socket again on it (on its new index when it was created again) and
// takes part in the election as on start, unless resigned. A Router
// made without New (no interface to watch) resigns, reports Init and
// returns the error when receiving fails.
func (r *Router) Run(ctx context.Context) error {
	defer close(r.done)
	r.pkts = make(chan received, 16)
	r.errc = make(chan connErr, 1)
	r.startReader()
	var (
		checkAt time.Time
		// changed receives when a link message may concern the
		// interface: the router looks at it at once.
		changed   <-chan struct{}
		watchDone <-chan struct{}
		stopWatch = make(chan struct{})
	)
	if r.link != nil {
		checkAt = r.clock.Now().Add(linkCheckEvery)
		changed, watchDone = r.link.watch(stopWatch, r.log)
	}
	defer func() {
		close(stopWatch)
		if watchDone != nil {
			<-watchDone
		}
		close(r.stop)
		r.c.Close()
		if r.link != nil {
			r.link.Close()
		}
	}()
	r.apply(r.m.Start(r.clock.Now()))
	for {
		var timer <-chan time.Time
		stopTimer := func() bool { return false }
		dl := r.m.Deadline()
		if !checkAt.IsZero() && (dl.IsZero() || checkAt.Before(dl)) {
			dl = checkAt
		}
		if !dl.IsZero() {
			timer, stopTimer = r.clock.Timer(dl.Sub(r.clock.Now()))
		}
		select {
		case <-ctx.Done():
			stopTimer()
			return nil
		case e := <-r.errc:
			stopTimer()
			if e.c != r.c {
				break // a socket closed for a new one
			}
			if r.link != nil {
				// Deaf, the router stands back; the next check of
				// the interface opens the socket again (at most
				// once per linkCheckEvery) and takes it back.
				r.reopen = true
				r.standBack("receive failed", "error", e.err)
				break
			}
			r.apply(r.m.Resign(r.clock.Now(), "receive failed: "+e.err.Error()))
			return fmt.Errorf("vrrp: receive on %s: %w", r.opts.Interface, e.err)
		case <-timer:
			// Advertisements that arrived meanwhile come first: a
			// node slow to run this loop (its CPU busy) would
			// otherwise take over from a master whose advertisements
			// wait here, as select picks among ready cases at random.
			r.drainPackets()
			now := r.clock.Now()
			if !checkAt.IsZero() && !now.Before(checkAt) {
				checkAt = now.Add(linkCheckEvery)
				r.checkLink(true)
			}
			r.apply(r.m.Expire(r.clock.Now()))
		case p := <-r.pkts:
			stopTimer()
			r.receive(p)
		case <-r.wake:
			stopTimer()
			r.runOps()
		case <-changed:
			stopTimer()
			r.checkLink(true)
		}
		if r.recheck {
			r.recheck = false
			r.checkLink(false)
		}
	}
}

// drainPackets handles the packets already received, without waiting.
func (r *Router) drainPackets() {
	for {
		select {
		case p := <-r.pkts:
			r.receive(p)
		default:
			return
		}
	}
}

// startReader starts a reader of the router's socket.
func (r *Router) startReader() {
	r.stop = make(chan struct{})
	go r.read(r.c, r.pkts, r.errc, r.stop)
}

func (r *Router) read(c conn, pkts chan<- received, errc chan<- connErr, stop <-chan struct{}) {
	for {
		p, err := c.Recv(make([]byte, 1500))
		if err != nil {
			select {
			case errc <- connErr{c, err}:
			case <-stop:
			}
			return
		}
		select {
		case pkts <- p:
		case <-stop:
			return
		}
	}
}

// checkLink looks at the router's interface: missing, down, or, with
// CarrierFault, up without a carrier (not running: what is sent is
// dropped), the router stands back; created again (a new index), it
// opens its socket again there; when advertisements went nowhere
// maxSendFailures times in a row, it stands back too. Back to normal and
// running, at a periodic check or on a link message (resume; not at a
// check that a failed send asked for), it takes part in the election
// again, as a
// backup (or master with priority 255) that preempts a master of lower
// priority at the first advertisement it hears (see Machine.Start).
func (r *Router) checkLink(resume bool) {
	if r.link == nil {
		return
	}
	index, up, running, err := r.link.state()
	switch {
	case err != nil:
		r.standBack(fmt.Sprintf("interface %s missing", r.opts.Interface), "error", err)
		return
	case !up:
		r.standBack(fmt.Sprintf("interface %s down", r.opts.Interface))
		return
	case !running && r.opts.CarrierFault:
		// Up without a carrier (a cable or a switch port gone, a
		// peer's end of a veth down): what is sent goes nowhere. The
		// router stands back by its own link messages, and comes
		// back by them, without waiting for its caller.
		r.standBack(fmt.Sprintf("interface %s has no carrier", r.opts.Interface))
		return
	case index != r.index || r.reopen:
		if index != r.index {
			r.standBack(fmt.Sprintf("interface %s created again", r.opts.Interface), "index", index, "was", r.index)
		}
		c, index, src, err := r.link.open()
		if err != nil {
			r.standBack(fmt.Sprintf("interface %s cannot be opened", r.opts.Interface), "error", err)
			return
		}
		close(r.stop)
		r.c.Close()
		r.c, r.index, r.reopen = c, index, false
		r.startReader()
		if src.IsValid() && src != r.self {
			r.m.SetSelf(src)
			r.mu.Lock()
			r.self = src
			r.mu.Unlock()
		}
		r.log.Info("vrrp socket opened again", "index", index, "source", r.self)
	case r.failedSends >= maxSendFailures:
		r.failedSends = 0
		r.standBack("advertisements cannot be sent")
		return
	}
	if !r.fault || !resume || !running {
		// Up without a carrier, or its queue not attached yet, the
		// interface would drop the advertisements and the resolution
		// of the peers: the link message that says it runs brings the
		// router back.
		return
	}
	r.fault, r.failedSends = false, 0
	r.mu.Lock()
	r.status.Fault = ""
	r.mu.Unlock()
	r.log.Info("vrrp interface usable again; taking part in the election", "resigned", r.resigned)
	if !r.resigned {
		r.rejoin(r.clock.Now())
	}
}

// rejoin starts the router again (after a fault or Resume). With
// unicast peers it also sends each an ICMP echo request: a peer that sent
// advertisements to this node while its link was down has its neighbour
// entry for the node failed, or waiting a second for its next probe, and
// the node's ARP request or neighbour solicitation for the peer, which
// names the node's address, refreshes it, so that the peer's next
// advertisement reaches the node at once.
func (r *Router) rejoin(now time.Time) {
	r.apply(r.m.Start(now))
	if len(r.opts.Peers) > 0 && r.link != nil {
		if err := r.link.resolve(r.self, r.opts.Peers); err != nil {
			r.log.Debug("vrrp: resolving the peers", "error", err)
		}
	}
}

// standBack takes the router out of the election, for reason, until
// checkLink finds the interface usable.
func (r *Router) standBack(reason string, args ...any) {
	if r.fault {
		return
	}
	r.fault = true
	r.mu.Lock()
	r.status.Fault = reason
	r.mu.Unlock()
	r.log.Warn("vrrp standing back", append([]any{"reason", reason}, args...)...)
	r.apply(r.m.Fault(r.clock.Now(), reason))
}

func (r *Router) runOps() {
	r.mu.Lock()
	ops := r.ops
	r.ops = nil
	r.mu.Unlock()
	now := r.clock.Now()
	for _, o := range ops {
		switch o.kind {
		case opPriority:
			old := r.m.Priority()
			st, err := r.m.SetPriority(now, o.priority)
			if err != nil {
				r.log.Error("vrrp priority change", "error", err)
				continue
			}
			if old != o.priority {
				r.log.Info("vrrp priority changed", "from", old, "to", o.priority, "role", r.m.Role())
			}
			r.apply(st)
		case opResign:
			reason := o.reason
			if reason == "" {
				reason = "resigned"
			}
			r.resigned = true
			r.apply(r.m.Resign(now, reason))
			close(o.done)
		case opResume:
			r.resigned = false
			if !r.fault {
				r.rejoin(now)
			}
		}
	}
}

// receive applies the receive rules of RFC 5798 section 7.1 that need
// the IP header and the configuration, then hands the advertisement to
// the machine. Every advertisement must arrive with TTL (hop limit) 255,
// whatever its destination: one sent from off the link, to the group or
// to the node's own address, has lost at least one; in unicast mode it
// must also come from a configured peer (keepalived's check_unicast_src).
func (r *Router) receive(p received) {
	drop := func(why string, args ...any) {
		r.mu.Lock()
		r.status.Dropped++
		r.mu.Unlock()
		r.log.Debug("vrrp packet dropped", append([]any{"reason", why, "source", p.src}, args...)...)
	}
	switch {
	case p.src.Is6() != r.self.Is6():
		drop("address family")
		return
	case p.src == r.self:
		return // our own, looped back
	case p.ttl != ttl:
		drop("ttl", "ttl", p.ttl)
		return
	case len(r.opts.Peers) > 0 && !slices.Contains(r.opts.Peers, p.src):
		drop("not a configured peer")
		return
	}
	pkt, err := Parse(p.b, p.src, p.dst)
	if err != nil {
		drop(err.Error())
		return
	}
	if pkt.VRID != r.opts.VRID {
		return // another virtual router's
	}
	r.checkAddrs(p.src, pkt.Addrs)
	r.checkInterval(p.src, pkt)
	r.mu.Lock()
	r.status.Received++
	r.mu.Unlock()
	r.apply(r.m.Receive(r.arrival(p), p.src, pkt))
}

// maxArrivalAge bounds how far before its handling a packet's time of
// arrival is believed: a larger age is a wall clock that stepped.
const maxArrivalAge = 5 * time.Second

// arrival returns when p arrived, on the router's clock: the kernel's
// time of arrival where it says, else now. A backup whose loop gets to
// an advertisement late (a busy CPU) counts its master down timer from
// the advertisement's arrival, not from its own delay: it takes over as
// soon after the master's last advertisement as its peers would.
func (r *Router) arrival(p received) time.Time {
	now := r.clock.Now()
	if p.at.IsZero() {
		return now
	}
	if age := time.Since(p.at); age > 0 && age <= maxArrivalAge {
		return now.Add(-age)
	}
	return now
}

// checkAddrs logs an advertisement whose addresses differ from the
// configured ones, when they differ from the source's previous ones too:
// RFC 5798 accepts it all the same. A source that changes its addresses
// again and again is logged at most once per warnEvery, with the count
// of the changes not logged.
func (r *Router) checkAddrs(src netip.Addr, addrs []netip.Addr) {
	want := slices.Clone(r.opts.Addrs)
	got := slices.Clone(addrs)
	slices.SortFunc(want, netip.Addr.Compare)
	slices.SortFunc(got, netip.Addr.Compare)
	diff := ""
	if !slices.Equal(want, got) {
		diff = fmt.Sprint(got)
	}
	s := r.addrWarn.state(src)
	changed := diff != s.last
	s.last = diff
	if diff == "" || !changed {
		return
	}
	if ok, n := s.allow(r.clock.Now()); ok {
		r.log.Warn("vrrp advertisement with other addresses", "source", src, "addresses", got, "configured", want, "suppressed", n)
	}
}

// checkInterval logs, at most once per warnEvery and source, an
// advertisement whose interval is beyond MaxIntervalFactor times the
// router's own: the backup counts its master down timer from the bounded
// interval instead (see MaxIntervalFactor), and may take over between
// the advertisements of a master that really advertises that slowly.
func (r *Router) checkInterval(src netip.Addr, p Packet) {
	adopted := AdoptedInterval(r.opts.Interval, p.Interval)
	if p.Priority == 0 || adopted == p.Interval {
		return
	}
	if ok, n := r.intervalWarn.state(src).allow(r.clock.Now()); ok {
		r.log.Warn("vrrp advertisement interval beyond twice the configured one", "source", src,
			"interval", centis(p.Interval), "configured", centis(r.opts.Interval), "counted", centis(adopted), "suppressed", n)
	}
}

// apply sends the step's advertisement and reports its transition, then
// logs it. A router that becomes master reports first: the caller's
// announcements are what moves the clients, and the advertisement, which
// only tells the peers, follows them at once (RFC 5798 sends both as the
// router becomes master, in no order that matters to a peer). Any other
// step advertises first, as a master that resigns must (a backup then
// takes over after its skew time). The log line, a write that may block
// on a slow journal, comes last.
func (r *Router) apply(st Step) {
	t := st.Transition
	var reported, sent time.Time
	if t != nil {
		t.At = r.clock.Now()
	}
	if t != nil && t.To == Master {
		r.report(*t)
		reported = r.clock.Now()
	}
	if st.Send {
		r.send(st.SendPriority)
		sent = r.clock.Now()
	}
	r.mu.Lock()
	r.status.Role = r.m.Role()
	r.status.Priority = r.m.Priority()
	r.status.Master, r.status.MasterPriority = r.m.MasterAddr()
	r.mu.Unlock()
	if t != nil {
		if t.To != Master {
			r.report(*t)
		}
		args := []any{"from", t.From, "to", t.To, "reason", t.Reason, "master", t.Master, "priority", t.Priority}
		if t.Late > 0 {
			args = append(args, "timer_late", t.Late)
		}
		if !reported.IsZero() {
			// How long the caller's announcements took, and the
			// advertisement after them.
			args = append(args, "reported_in", reported.Sub(t.At))
			if !sent.IsZero() {
				args = append(args, "advertised_in", sent.Sub(t.At))
			}
		}
		r.log.Info("vrrp transition", args...)
	}
	if st.Suspect != "" && r.opts.OnSuspect != nil {
		r.opts.OnSuspect(st.Suspect)
	}
	if st.Reassert != "" {
		r.log.Warn("vrrp: another master; announcing the addresses again", "reason", st.Reassert)
		if r.opts.OnReassert != nil {
			r.opts.OnReassert(st.Reassert)
		}
	}
}

// report hands a transition to OnTransition, when set.
func (r *Router) report(t Transition) {
	if r.opts.OnTransition != nil {
		r.opts.OnTransition(t)
	}
}

func (r *Router) send(prio uint8) {
	p := Packet{VRID: r.opts.VRID, Priority: prio, Interval: r.opts.Interval, Addrs: r.opts.Addrs}
	var errs []error
	for _, dst := range r.dsts {
		b, err := p.Marshal(r.self, dst)
		if err == nil {
			err = r.c.Send(b, r.self, dst)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("to %v: %w", dst, err))
		}
	}
	r.mu.Lock()
	r.status.Sent += uint64(len(r.dsts) - len(errs))
	r.status.SendErrors += uint64(len(errs))
	was := r.sendFail
	r.sendFail = len(errs) > 0
	r.mu.Unlock()
	if len(errs) == len(r.dsts) {
		// Nothing went out: is the interface still there?
		r.failedSends++
		r.recheck = true
	} else {
		r.failedSends = 0
	}
	switch {
	case len(errs) > 0 && !was:
		r.log.Warn("vrrp advertisement not sent", "error", errors.Join(errs...))
	case len(errs) == 0 && was:
		r.log.Info("vrrp advertisements sent again")
	}
}
