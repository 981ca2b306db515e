package vrrp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a clock the test moves; a timer whose time has come fires
// when made or when the clock reaches it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	c  chan time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Timer(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := fakeTimer{at: c.now.Add(d), c: make(chan time.Time, 1)}
	if !t.at.After(c.now) {
		t.c <- c.now
		return t.c, func() bool { return false }
	}
	c.timers = append(c.timers, t)
	return t.c, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, o := range c.timers {
			if o.c == t.c {
				c.timers = append(c.timers[:i], c.timers[i+1:]...)
				return true
			}
		}
		return false
	}
}

// set moves the clock to t0+d and fires the timers due.
func (c *fakeClock) set(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t0.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
		} else {
			t.c <- c.now
		}
	}
	c.timers = kept
}

// fakeConn hands the test's packets to the Router and its
// advertisements to the test.
type fakeConn struct {
	in     chan received
	out    chan sent
	closed chan struct{}
	once   sync.Once
	// fail makes every Send fail.
	fail atomic.Bool
}

type sent struct {
	src, dst netip.Addr
	p        Packet
}

func newFakeConn() *fakeConn {
	return &fakeConn{in: make(chan received), out: make(chan sent, 16), closed: make(chan struct{})}
}

func (c *fakeConn) Recv(b []byte) (received, error) {
	select {
	case r := <-c.in:
		r.b = b[:copy(b, r.b)]
		return r, nil
	case <-c.closed:
		return received{}, errors.New("closed")
	}
}

func (c *fakeConn) Send(b []byte, src, dst netip.Addr) error {
	if c.fail.Load() {
		return errors.New("no buffer space available")
	}
	p, err := Parse(b, src, dst)
	if err != nil {
		return err
	}
	c.out <- sent{src, dst, p}
	return nil
}

func (c *fakeConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// routerRig runs a Router on a fakeConn and a fakeClock.
type routerRig struct {
	t      *testing.T
	r      *Router
	conn   *fakeConn
	clock  *fakeClock
	trs    chan Transition
	cancel context.CancelFunc
	done   chan error
}

var (
	self4 = netip.MustParseAddr("10.19.0.1")
	peer4 = netip.MustParseAddr("10.19.0.2")
	vip4  = netip.MustParseAddr("10.19.0.100")
)

func newRig(t *testing.T, opts Options) *routerRig {
	t.Helper()
	return newRigWith(t, opts, nil)
}

// newRigWith is newRig with a function that sets up the Router before
// it runs.
func newRigWith(t *testing.T, opts Options, setup func(*Router)) *routerRig {
	t.Helper()
	g := &routerRig{t: t, conn: newFakeConn(), clock: &fakeClock{now: t0}, trs: make(chan Transition, 16), done: make(chan error, 1)}
	opts.Interface, opts.VRID, opts.Source = "eth0", 19, self4
	if opts.Addrs == nil {
		opts.Addrs = []netip.Addr{vip4}
	}
	opts.Clock = g.clock
	opts.OnTransition = func(tr Transition) { g.trs <- tr }
	if opts.Logger == nil {
		opts.Logger = newTestLogger(t, "rig")
	}
	if _, err := checkOptions(&opts); err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(opts, g.conn)
	if err != nil {
		t.Fatal(err)
	}
	g.r = r
	if setup != nil {
		setup(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	go func() { g.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-g.done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return g
}

// deliver hands the Router an advertisement, checksummed for dst.
func (g *routerRig) deliver(src, dst netip.Addr, ttl int, p Packet) {
	g.t.Helper()
	if p.Interval == 0 {
		p.Interval = 100
	}
	if p.Addrs == nil {
		p.Addrs = []netip.Addr{vip4}
	}
	b, err := p.Marshal(src, dst)
	if err != nil {
		g.t.Fatal(err)
	}
	g.conn.in <- received{b: b, src: src, dst: dst, ttl: ttl}
}

func (g *routerRig) sent(dst netip.Addr, prio uint8) {
	g.t.Helper()
	select {
	case s := <-g.conn.out:
		if s.dst != dst || s.src != self4 || s.p.Priority != prio || s.p.VRID != 19 || s.p.Interval != 100 {
			g.t.Fatalf("sent %+v, want priority %d to %v", s, prio, dst)
		}
	case <-time.After(5 * time.Second):
		g.t.Fatalf("nothing sent; want priority %d to %v", prio, dst)
	}
}

func (g *routerRig) transition(to Role) Transition {
	g.t.Helper()
	select {
	case tr := <-g.trs:
		if tr.To != to {
			g.t.Fatalf("transition %+v, want to %v", tr, to)
		}
		return tr
	case <-time.After(5 * time.Second):
		g.t.Fatalf("no transition to %v", to)
	}
	return Transition{}
}

// TestRouterReceiveRules feeds a master packets that RFC 5798's receive
// rules discard; none moves it, and a resigning peer, which makes it
// advertise at once, shows that they were all handled.
func TestRouterReceiveRules(t *testing.T) {
	g := newRig(t, Options{Priority: 100, Interval: 100, StartAsMaster: true})
	at := g.reclaim(100, 100)
	g.sent(Group4, 100)
	g.transition(Master)

	g.deliver(peer4, Group4, 64, Packet{VRID: 19, Priority: 255})  // TTL
	g.deliver(peer4, Group4, 255, Packet{VRID: 18, Priority: 255}) // another VRID
	g.deliver(self4, Group4, 255, Packet{VRID: 19, Priority: 255}) // our own
	g.deliver(netip.MustParseAddr("fe80::2"), Group6, 255, Packet{VRID: 19, Priority: 255, Addrs: []netip.Addr{netip.MustParseAddr("fe80::100")}})
	b, _ := Packet{VRID: 19, Priority: 255, Interval: 100, Addrs: []netip.Addr{vip4}}.Marshal(peer4, Group4)
	b[2] = 254 // the checksum no longer matches
	g.conn.in <- received{b: b, src: peer4, dst: Group4, ttl: 255}
	g.deliver(peer4, Group4, 255, Packet{VRID: 19, Priority: 0})
	g.sent(Group4, 100)
	// The router counts an advertisement once Send has returned.
	g.waitStatus(func(st Status) bool { return st.Role == Master && st.Dropped == 3 && st.Received == 1 && st.Sent == 2 })

	// A master of higher priority (and other addresses, which RFC 5798
	// accepts with a warning) makes it a backup.
	g.deliver(peer4, Group4, 255, Packet{VRID: 19, Priority: 200, Addrs: []netip.Addr{netip.MustParseAddr("10.19.0.200")}})
	if tr := g.transition(Backup); tr.Master != peer4 {
		t.Errorf("master %v", tr.Master)
	}
	// Silence: at the master down interval it takes over.
	g.clock.set(at + MasterDownInterval(100, 100))
	g.sent(Group4, 100)
	if tr := g.transition(Master); tr.Reason != "master down timer expired" {
		t.Errorf("reason %q", tr.Reason)
	}
	// The next advertisement is one interval later.
	g.clock.set(at + MasterDownInterval(100, 100) + time.Second)
	g.sent(Group4, 100)

	// Tracking lowers the priority: advertised at once.
	if err := g.r.SetPriority(50); err != nil {
		t.Fatal(err)
	}
	g.sent(Group4, 50)
	if err := g.r.SetPriority(0); err == nil {
		t.Error("SetPriority(0) accepted")
	}

	// Resign returns once priority 0 is sent; Resume starts again.
	if err := g.r.Resign(context.Background(), "drain"); err != nil {
		t.Fatal(err)
	}
	g.sent(Group4, 0)
	if tr := g.transition(Init); tr.Reason != "drain" {
		t.Errorf("reason %q", tr.Reason)
	}
	g.r.Resume()
	if tr := g.transition(Backup); tr.Reason != "started" {
		t.Errorf("resumed: %+v (StartAsMaster is for the first start only)", tr)
	}
	g.clock.set(at + MasterDownInterval(100, 100) + time.Second + MasterDownInterval(50, 100))
	g.sent(Group4, 50)
	g.transition(Master)
}

// reclaim waits out the listening of a router started as master of
// priority and interval, and returns the time it takes over.
func (g *routerRig) reclaim(priority uint8, interval uint16) time.Duration {
	g.t.Helper()
	if tr := g.transition(Backup); !strings.Contains(tr.Reason, "master when it stopped") {
		g.t.Fatalf("started as master: %+v", tr)
	}
	at := centis(interval) + SkewTime(priority, interval)
	g.clock.set(at)
	return at
}

// TestRouterUnicast sends to every peer and accepts only peers, with TTL
// 255.
func TestRouterUnicast(t *testing.T) {
	other := netip.MustParseAddr("10.19.0.3")
	g := newRig(t, Options{Priority: 100, Interval: 100, StartAsMaster: true, Peers: []netip.Addr{peer4, other}})
	g.reclaim(100, 100)
	g.sent(peer4, 100)
	g.sent(other, 100)
	g.transition(Master)
	g.deliver(netip.MustParseAddr("10.19.0.4"), self4, 255, Packet{VRID: 19, Priority: 255})  // not a peer
	g.deliver(netip.MustParseAddr("10.19.0.4"), Group4, 255, Packet{VRID: 19, Priority: 255}) // not a peer, to the group
	g.deliver(other, self4, 64, Packet{VRID: 19, Priority: 255})                              // a peer, off-link
	g.deliver(other, self4, 255, Packet{VRID: 19, Priority: 0})                               // a peer resigns
	g.sent(peer4, 100)
	g.sent(other, 100)
	if st := g.r.Status(); st.Role != Master || st.Dropped != 3 || st.Received != 1 {
		t.Fatalf("status %+v", st)
	}
}

// TestRouterOffLink is the reproduction: an advertisement of
// priority 255 and interval 4095 sent with TTL 64 to the node's own
// address, as a host anywhere routed to it can, moved a master to backup
// for minutes. Every advertisement must arrive with TTL 255 (RFC 5798
// section 7.1), whatever its destination and mode.
func TestRouterOffLink(t *testing.T) {
	for _, unicast := range []bool{false, true} {
		t.Run(fmt.Sprintf("unicast=%v", unicast), func(t *testing.T) {
			opts := Options{Priority: 100, Interval: 100, StartAsMaster: true}
			group := Group4
			if unicast {
				opts.Peers, group = []netip.Addr{peer4}, peer4
			}
			g := newRig(t, opts)
			g.reclaim(100, 100)
			g.sent(group, 100)
			g.transition(Master)
			for _, hops := range []int{64, 254, 1, 0} {
				g.deliver(peer4, self4, hops, Packet{VRID: 19, Priority: 255, Interval: MaxInterval})
				g.deliver(peer4, Group4, hops, Packet{VRID: 19, Priority: 255, Interval: MaxInterval})
			}
			// A peer that resigns on the link makes the master
			// advertise at once: what came before was handled.
			g.deliver(peer4, self4, 255, Packet{VRID: 19, Priority: 0})
			g.sent(group, 100)
			if st := g.r.Status(); st.Role != Master || st.Dropped != 8 || st.Received != 1 {
				t.Fatalf("status %+v", st)
			}
			select {
			case tr := <-g.trs:
				t.Fatalf("transition %+v", tr)
			default:
			}
		})
	}
}

// TestRouterBoundsMasterInterval: one advertisement on the link with
// interval 4095 (40.95 s) and priority 255 makes a master a backup, as
// RFC 5798 asks, but its master down timer runs from at most twice its
// own interval, not for minutes; the difference is logged.
func TestRouterBoundsMasterInterval(t *testing.T) {
	var logs captured
	g := newRig(t, Options{Priority: 100, Interval: 100, StartAsMaster: true, Logger: logs.logger(t)})
	at := g.reclaim(100, 100)
	g.sent(Group4, 100)
	g.transition(Master)
	g.deliver(peer4, Group4, 255, Packet{VRID: 19, Priority: 255, Interval: MaxInterval})
	g.transition(Backup)
	g.clock.set(at + MasterDownInterval(100, 2*100))
	g.sent(Group4, 100)
	if tr := g.transition(Master); tr.Reason != "master down timer expired" {
		t.Errorf("reason %q", tr.Reason)
	}
	w := logs.find("vrrp advertisement interval beyond twice the configured one")
	if len(w) != 1 || w[0].attrs["interval"] != "40.95s" || w[0].attrs["counted"] != "2s" {
		t.Errorf("warnings %+v", w)
	}
}

// TestRouterAddrsWarningLimited: a warning per advertisement whose
// addresses differ from the last one flooded the log when two masters
// with other addresses spoke, or one alternated its addresses. It is
// logged at most once a minute per source, with the count of those not
// logged.
func TestRouterAddrsWarningLimited(t *testing.T) {
	var logs captured
	g := newRig(t, Options{Priority: 100, Interval: 100, Logger: logs.logger(t)})
	g.transition(Backup)
	other := netip.MustParseAddr("10.19.0.3")
	setA := []netip.Addr{netip.MustParseAddr("10.19.0.200")}
	setB := []netip.Addr{netip.MustParseAddr("10.19.0.201"), vip4}
	const n = 100
	for i := range n {
		// Two masters with other addresses, and one of them
		// alternating between them and the configured ones.
		g.deliver(peer4, Group4, 255, Packet{VRID: 19, Priority: 200, Addrs: setA})
		addrs := setB
		if i%2 == 1 {
			addrs = []netip.Addr{vip4}
		}
		g.deliver(other, Group4, 255, Packet{VRID: 19, Priority: 200, Addrs: addrs})
	}
	g.waitReceived(2 * n)
	const msg = "vrrp advertisement with other addresses"
	if got := logs.count(msg); got != 2 {
		t.Fatalf("%d warnings for %d advertisements, want one per source", got, 2*n)
	}
	// A minute later the next one is logged, with how many were not.
	g.clock.set(time.Minute)
	g.deliver(other, Group4, 255, Packet{VRID: 19, Priority: 200, Addrs: setB})
	g.waitReceived(2*n + 1)
	w := logs.find(msg)
	if len(w) != 3 || w[2].attrs["source"] != other.String() || w[2].attrs["suppressed"] != "49" {
		t.Errorf("warnings %+v", w)
	}
}

// waitStatus waits until the router's status satisfies ok.
func (g *routerRig) waitStatus(ok func(Status) bool) {
	g.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok(g.r.Status()) {
		if time.Now().After(deadline) {
			g.t.Fatalf("status %+v", g.r.Status())
		}
		time.Sleep(time.Millisecond)
	}
}

// waitReceived waits until the router has received n advertisements.
func (g *routerRig) waitReceived(n uint64) {
	g.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for g.r.Status().Received < n {
		if time.Now().After(deadline) {
			g.t.Fatalf("status %+v, want %d received", g.r.Status(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestOptionsRejects(t *testing.T) {
	ok := Options{Interface: "eth0", VRID: 1, Priority: 100, Interval: 100, Addrs: []netip.Addr{vip4}}
	for name, mod := range map[string]func(*Options){
		"no interface":    func(o *Options) { o.Interface = "" },
		"vrid 0":          func(o *Options) { o.VRID = 0 },
		"no addresses":    func(o *Options) { o.Addrs = nil },
		"mixed addresses": func(o *Options) { o.Addrs = append(o.Addrs, netip.MustParseAddr("fd19::1")) },
		"peer family":     func(o *Options) { o.Peers = []netip.Addr{netip.MustParseAddr("fd19::1")} },
		"source family":   func(o *Options) { o.Source = netip.MustParseAddr("fd19::1") },
	} {
		o := ok
		mod(&o)
		if _, err := checkOptions(&o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	o := ok
	o.Source = self4
	for name, mod := range map[string]func(*Options){
		"priority 0": func(o *Options) { o.Priority = 0 },
		"interval 0": func(o *Options) { o.Interval = 0 },
	} {
		o := o
		mod(&o)
		if _, err := newRouter(o, newFakeConn()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(Options{Interface: "no-such-interface0", VRID: 1, Priority: 100, Interval: 100, Addrs: []netip.Addr{vip4}}); err == nil {
		t.Error("missing interface accepted")
	}
}

// fakeLink is an interface that is always there and up; open hands out
// the conns in next; changed, when set, stands for its link messages.
type fakeLink struct {
	next    chan *fakeConn
	changed chan struct{}
	// down, when set and true, says the interface is down.
	down *atomic.Bool
}

func (fakeLink) resolve(netip.Addr, []netip.Addr) error { return nil }

func (l fakeLink) watch(stop <-chan struct{}, _ *slog.Logger) (changed, done <-chan struct{}) {
	return l.changed, stop
}

func (l fakeLink) state() (int, bool, bool, error) {
	up := l.down == nil || !l.down.Load()
	return 1, up, up, nil
}

func (l fakeLink) open() (conn, int, netip.Addr, error) {
	select {
	case c := <-l.next:
		return c, 1, netip.Addr{}, nil
	default:
		return nil, 0, netip.Addr{}, errors.New("no conn to open")
	}
}

func (fakeLink) Close() {}

// TestRouterReceiveFails: a router whose socket fails to receive (it is
// deaf, and would take over from a master it cannot hear) stands back,
// opens its socket again at the next check of the interface, and takes
// part again; Run goes on.
func TestRouterReceiveFails(t *testing.T) {
	link := fakeLink{next: make(chan *fakeConn, 1)}
	g := newRigWith(t, Options{Priority: 100, Interval: 100}, func(r *Router) { r.link, r.index = link, 1 })
	g.transition(Backup)
	old := g.conn
	g.conn = newFakeConn()
	link.next <- g.conn
	old.Close()
	if tr := g.transition(Init); tr.Cause != CauseFault || tr.Reason != "receive failed" {
		t.Errorf("stood back: %+v", tr)
	}
	g.clock.set(linkCheckEvery)
	if tr := g.transition(Backup); tr.Reason != "started" {
		t.Errorf("back: %+v", tr)
	}
	// The new socket is the one it reads: a master of higher priority
	// is heard on it.
	g.deliver(peer4, Group4, 255, Packet{VRID: 19, Priority: 200})
	g.waitStatus(func(st Status) bool { return st.Role == Backup && st.Master == peer4 && st.Fault == "" })
}

// TestRouterStandsBackWhenSendsFail: a master whose advertisements go
// nowhere, its interface looking fine, stands back after maxSendFailures
// of them (its backup, hearing nothing, takes over), and takes part again
// at the next check of the interface, unless resigned meanwhile.
func TestRouterStandsBackWhenSendsFail(t *testing.T) {
	g := newRigWith(t, Options{Priority: 100, Interval: 100, StartAsMaster: true}, func(r *Router) { r.link, r.index = fakeLink{}, 1 })
	at := g.reclaim(100, 100)
	g.sent(Group4, 100)
	g.transition(Master)
	g.conn.fail.Store(true)
	for i := range maxSendFailures - 1 {
		g.clock.set(at + time.Duration(i+1)*time.Second)
		g.waitStatus(func(st Status) bool { return st.SendErrors == uint64(i+1) })
		if st := g.r.Status(); st.Role != Master || st.Fault != "" {
			t.Fatalf("after %d failed advertisements: %+v", i+1, st)
		}
	}
	g.clock.set(at + maxSendFailures*time.Second)
	if tr := g.transition(Init); tr.Cause != CauseFault || tr.Reason != "advertisements cannot be sent" {
		t.Errorf("stood back: %+v", tr)
	}
	if st := g.r.Status(); st.Fault != "advertisements cannot be sent" {
		t.Errorf("status %+v", st)
	}
	// Resigned meanwhile, it stays out when it could come back.
	if err := g.r.Resign(context.Background(), "drain"); err != nil {
		t.Fatal(err)
	}
	g.conn.fail.Store(false)
	g.clock.set(at + (maxSendFailures+1)*time.Second)
	g.waitStatus(func(st Status) bool { return st.Fault == "" })
	select {
	case tr := <-g.trs:
		t.Fatalf("transition %+v while resigned", tr)
	case <-time.After(50 * time.Millisecond):
	}
	g.r.Resume()
	g.transition(Backup)
	g.clock.set(at + (maxSendFailures+1)*time.Second + MasterDownInterval(100, 100))
	g.sent(Group4, 100)
	g.transition(Master)
}

// TestRouterLinkMessages: a link message makes the router look at its
// interface at once, without waiting for its periodic check: a master
// whose interface went down stands back, and when it is up again takes
// part at once, and preempts the master of lower priority that took
// over at the first advertisement it hears.
func TestRouterLinkMessages(t *testing.T) {
	link := fakeLink{changed: make(chan struct{}, 1), down: new(atomic.Bool)}
	g := newRigWith(t, Options{Priority: 200, Interval: 100, Preempt: true}, func(r *Router) { r.link, r.index = link, 1 })
	g.transition(Backup)
	g.clock.set(MasterDownInterval(200, 100))
	g.sent(Group4, 200)
	g.transition(Master)
	// The clock stands still from here: no periodic check comes.
	link.down.Store(true)
	link.changed <- struct{}{}
	g.sent(Group4, 0)
	if tr := g.transition(Init); tr.Cause != CauseFault || tr.Reason != "interface eth0 down" {
		t.Errorf("stood back: %+v", tr)
	}
	link.down.Store(false)
	link.changed <- struct{}{}
	if tr := g.transition(Backup); tr.Reason != "started" {
		t.Errorf("back: %+v", tr)
	}
	g.deliver(peer4, Group4, 255, Packet{VRID: 19, Priority: 100})
	g.sent(Group4, 200)
	if tr := g.transition(Master); tr.Cause != CausePreempt || tr.Reason != "preempting master 10.19.0.2 of priority 100" {
		t.Errorf("preempted: %+v", tr)
	}
}

// TestRouterReportsBeforeAdvertising: a router that becomes master hands
// the transition to OnTransition (whose announcements move the clients)
// before it sends the advertisement, and says when it handled the event;
// one that leaves the master role advertises first.
func TestRouterReportsBeforeAdvertising(t *testing.T) {
	type seen struct {
		to   Role
		sent uint64
	}
	seenc := make(chan seen, 4)
	g := newRigWith(t, Options{Priority: 100, Interval: 100, StartAsMaster: true}, func(r *Router) {
		inner := r.opts.OnTransition
		r.opts.OnTransition = func(tr Transition) {
			seenc <- seen{tr.To, r.Status().Sent}
			inner(tr)
		}
	})
	if s := <-seenc; s.to != Backup || s.sent != 0 {
		t.Fatalf("start: %+v, want a backup that sent nothing", s)
	}
	at := g.reclaim(100, 100)
	if s := <-seenc; s.to != Master || s.sent != 0 {
		t.Fatalf("becoming master: %+v, want reported with 0 advertisements sent", s)
	}
	tr := g.transition(Master)
	if want := t0.Add(at); !tr.At.Equal(want) {
		t.Fatalf("transition at %v, want %v (the clock when the timer was handled)", tr.At, want)
	}
	g.sent(Group4, 100)
	resigned := make(chan error, 1)
	go func() { resigned <- g.r.Resign(context.Background(), "test") }()
	g.sent(Group4, 0)
	if s := <-seenc; s.to != Init || s.sent != 2 {
		t.Fatalf("resigning: %+v, want reported after its advertisement of priority 0 (2 sent)", s)
	}
	g.transition(Init)
	if err := <-resigned; err != nil {
		t.Fatal(err)
	}
}

// TestRouterCarrier: a router with CarrierFault whose interface loses its
// carrier (up, not running) stands back by its own link messages, and
// takes part again when the carrier is back, with no Resume.
func TestRouterCarrier(t *testing.T) {
	var carrier atomic.Bool
	carrier.Store(true)
	link := carrierLink{fakeLink: fakeLink{next: make(chan *fakeConn, 1), changed: make(chan struct{}, 1)}, carrier: &carrier}
	g := newRigWith(t, Options{Priority: 100, Interval: 100, StartAsMaster: true, CarrierFault: true}, func(r *Router) { r.link, r.index = link, 1 })
	if !g.r.WatchesCarrier() {
		t.Fatal("a router with a link does not say it watches its carrier")
	}
	g.reclaim(100, 100)
	g.transition(Master)
	g.sent(Group4, 100)
	carrier.Store(false)
	link.changed <- struct{}{}
	tr := g.transition(Init)
	if !strings.Contains(tr.Reason, "no carrier") {
		t.Fatalf("stood back for %q", tr.Reason)
	}
	g.sent(Group4, 0)
	if st := g.r.Status(); !strings.Contains(st.Fault, "no carrier") {
		t.Fatalf("fault %q", st.Fault)
	}
	carrier.Store(true)
	link.changed <- struct{}{}
	g.transition(Backup)
	if st := g.r.Status(); st.Fault != "" {
		t.Fatalf("fault %q after the carrier came back", st.Fault)
	}
}

// carrierLink is a fakeLink whose carrier comes and goes.
type carrierLink struct {
	fakeLink
	carrier *atomic.Bool
}

func (l carrierLink) state() (int, bool, bool, error) { return 1, true, l.carrier.Load(), nil }

// TestRouterLateTimerHandlesPacketsFirst: a backup whose loop was held up
// (a busy CPU) past its master down deadline, with the master's
// advertisement waiting, handles the advertisement first and stays a
// backup, instead of taking over from a live master.
func TestRouterLateTimerHandlesPacketsFirst(t *testing.T) {
	hold := make(chan struct{})
	var held atomic.Bool
	g := newRigWith(t, Options{Priority: 100, Interval: 100}, func(r *Router) {
		inner := r.opts.OnTransition
		r.opts.OnTransition = func(tr Transition) {
			inner(tr)
			if held.CompareAndSwap(false, true) {
				<-hold // the first transition (to backup) holds the loop
			}
		}
	})
	g.transition(Backup)
	g.deliver(peer4, Group4, 255, Packet{VRID: 19, Priority: 200})
	// The advertisement waits in the router's queue while the deadline
	// passes.
	deadline := MasterDownInterval(100, 100)
	for len(g.r.pkts) == 0 {
		time.Sleep(time.Millisecond)
	}
	g.clock.set(deadline + 50*time.Millisecond)
	close(hold)
	g.waitStatus(func(st Status) bool { return st.Received == 1 })
	if st := g.r.Status(); st.Role != Backup || st.Master != peer4 {
		t.Fatalf("status %+v: took over from a master whose advertisement was waiting", st)
	}
	select {
	case tr := <-g.trs:
		t.Fatalf("transition %+v", tr)
	default:
	}
}

// TestRouterCountsFromArrival: a backup counts its master down timer
// from when the kernel received the master's last advertisement, not
// from when its loop got to it, so that a busy backup takes over no
// later than an idle one; a time of arrival further back than
// maxArrivalAge (a wall clock that stepped) is not believed.
func TestRouterCountsFromArrival(t *testing.T) {
	deliverAt := func(g *routerRig, at time.Time) {
		t.Helper()
		b, err := Packet{VRID: 19, Priority: 200, Interval: 100, Addrs: []netip.Addr{vip4}}.Marshal(peer4, Group4)
		if err != nil {
			t.Fatal(err)
		}
		g.conn.in <- received{b: b, src: peer4, dst: Group4, ttl: 255, at: at}
		g.waitStatus(func(st Status) bool { return st.Received == 1 })
	}
	down := MasterDownInterval(100, 100) // 360.9 ms

	t.Run("late", func(t *testing.T) {
		g := newRig(t, Options{Priority: 100, Interval: 100})
		g.transition(Backup)
		g.clock.set(300 * time.Millisecond)
		// Received 250 ms before the loop got to it: at t0+50ms at the
		// latest on the router's clock, so down by t0+411ms.
		deliverAt(g, time.Now().Add(-250*time.Millisecond))
		if st := g.r.Status(); st.Role != Backup || st.Master != peer4 {
			t.Fatalf("status %+v after the advertisement", st)
		}
		g.clock.set(50*time.Millisecond + down + 40*time.Millisecond)
		tr := g.transition(Master)
		if tr.Reason == "" {
			t.Errorf("transition %+v without a reason", tr)
		}
	})

	t.Run("stepped clock", func(t *testing.T) {
		g := newRig(t, Options{Priority: 100, Interval: 100})
		g.transition(Backup)
		g.clock.set(300 * time.Millisecond)
		deliverAt(g, time.Now().Add(-maxArrivalAge-time.Second))
		// Counted from its handling (t0+300ms): not down at t0+450ms...
		g.clock.set(450 * time.Millisecond)
		select {
		case tr := <-g.trs:
			t.Fatalf("transition %+v: an arrival time from a stepped clock was believed", tr)
		case <-time.After(100 * time.Millisecond):
		}
		// ...and down after t0+300ms+360.9ms.
		g.clock.set(300*time.Millisecond + down + time.Millisecond)
		g.transition(Master)
	})
}
