package vrrp

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// link is a veth pair between the test's namespace (interface vl<i>,
// addresses 10.19.<i>.1/24 and fd19:0:0:<i>::1/64) and a peer namespace
// (interface vp, .2 and ::2). Links of different i can be used at once.
type link struct {
	peer *nstest.Peer
	name string
	i    int
}

func newLink(t *testing.T, i int) *link {
	t.Helper()
	nstest.Need(t)
	l := &link{name: fmt.Sprintf("vl%d", i), i: i}
	l.peer = nstest.NewPeer(t, l.name, "vp")
	for _, v6 := range []bool{false, true} {
		if err := nstest.AddAddr(l.name, l.prefix(l.localAddr(v6))); err != nil {
			t.Fatal(err)
		}
	}
	l.peer.Do(t, func() error {
		for _, v6 := range []bool{false, true} {
			if err := nstest.AddAddr("vp", l.prefix(l.farAddr(v6))); err != nil {
				return err
			}
		}
		return nil
	})
	return l
}

// localAddr and farAddr are the routable addresses of either end.
func (l *link) localAddr(v6 bool) netip.Addr { return l.addr(v6, 1) }
func (l *link) farAddr(v6 bool) netip.Addr   { return l.addr(v6, 2) }

func (l *link) addr(v6 bool, host int) netip.Addr {
	if v6 {
		return netip.MustParseAddr(fmt.Sprintf("fd19:0:0:%d::%d", l.i, host))
	}
	return netip.MustParseAddr(fmt.Sprintf("10.19.%d.%d", l.i, host))
}

func (l *link) prefix(a netip.Addr) string {
	if a.Is6() {
		return a.String() + "/64"
	}
	return a.String() + "/24"
}

// event is a transition seen at a time.
type event struct {
	at time.Time
	tr Transition
}

// live is a Router running until the test ends or kill.
type live struct {
	t      *testing.T
	r      *Router
	events chan event
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startLive makes a Router with opts in the test's namespace, or in the
// peer's when p is set, and runs it.
func startLive(t *testing.T, p *nstest.Peer, opts Options) *live {
	t.Helper()
	n := &live{t: t, events: make(chan event, 64)}
	opts.OnTransition = func(tr Transition) { n.events <- event{time.Now(), tr} }
	opts.Logger = newTestLogger(t, opts.Interface)
	mk := func() (err error) {
		n.r, err = New(opts)
		return err
	}
	if p != nil {
		p.Do(t, mk)
	} else if err := mk(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.r.Run(ctx); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	t.Cleanup(n.kill)
	return n
}

// kill stops the router without resigning: it goes silent, as when its
// process is killed.
func (n *live) kill() {
	n.cancel()
	n.wg.Wait()
}

// await waits for a transition to role, failing the test after within.
func (n *live) await(role Role, within time.Duration) event {
	n.t.Helper()
	return n.awaitSince(time.Time{}, role, within)
}

// awaitSince waits for a transition to role at since or later: earlier
// ones, which a stall of the host can cause, are skipped.
func (n *live) awaitSince(since time.Time, role Role, within time.Duration) event {
	n.t.Helper()
	deadline := time.After(within)
	for {
		select {
		case e := <-n.events:
			if e.tr.To == role && !e.at.Before(since) {
				return e
			}
		case <-deadline:
			// A host that stalled past the deadline may have both
			// ready: the transitions that came first count.
			for {
				select {
				case e := <-n.events:
					if e.tr.To == role && !e.at.Before(since) {
						return e
					}
					continue
				default:
				}
				break
			}
			n.t.Fatalf("no transition to %v within %v; status %+v", role, within, n.r.Status())
		}
	}
}

// awaitMaster waits until the router, a backup, sees master with prio.
func (n *live) awaitMaster(master netip.Addr, prio uint8) {
	n.t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		st := n.r.Status()
		if st.Role == Backup && st.Master == master && st.MasterPriority == prio {
			return
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("status %+v, want backup of %v priority %d", st, master, prio)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// family is an address family's virtual addresses.
type family struct {
	name string
	v6   bool
	vips []netip.Addr
}

var families = []family{
	{"ipv4", false, []netip.Addr{netip.MustParseAddr("10.19.0.100")}},
	{"ipv6", true, []netip.Addr{netip.MustParseAddr("fe80::19:100"), netip.MustParseAddr("fd19::100")}},
}

// eachMode runs f in parallel subtests for each family, multicast and
// unicast, each on its own link.
func eachMode(t *testing.T, f func(t *testing.T, l *link, fam family, unicast bool)) {
	i := 0
	for _, fam := range families {
		for _, unicast := range []bool{false, true} {
			i++
			n := i
			t.Run(fmt.Sprintf("%s/unicast=%v", fam.name, unicast), func(t *testing.T) {
				t.Parallel()
				f(t, newLink(t, n), fam, unicast)
			})
		}
	}
}

// TestNetnsVipdPair runs two Routers on either end of a veth pair at
// iv's adverts: election by priority, takeover when the master goes
// silent, preemption, and resigning; in both families, with multicast
// and with unicast peers.
func TestNetnsVipdPair(t *testing.T) {
	nstest.Need(t)
	eachMode(t, func(t *testing.T, l *link, f family, unicast bool) {
		base := Options{VRID: 19, Interval: iv, Preempt: true, Addrs: f.vips}
		a, b := base, base
		a.Interface, a.Priority = l.name, 100
		b.Interface, b.Priority = "vp", 200
		if unicast {
			// Unicast sources are the routable addresses.
			a.Source, a.Peers = l.localAddr(f.v6), []netip.Addr{l.farAddr(f.v6)}
			b.Source, b.Peers = l.farAddr(f.v6), []netip.Addr{l.localAddr(f.v6)}
		}
		// b first, so that the election does not hang on which of
		// two timers a loaded host fires first.
		nb := startLive(t, l.peer, b)
		nb.await(Backup, time.Second)
		nb.await(Master, 3*time.Second)
		na := startLive(t, nil, a)
		na.await(Backup, time.Second)
		na.awaitMaster(nb.r.Source(), 200)

		// b goes silent: a takes over within its master down
		// interval after b's last advertisement.
		killed := time.Now()
		nb.kill()
		e := na.awaitSince(killed, Master, 3*time.Second)
		if e.tr.Reason != "master down timer expired" {
			t.Errorf("a took over for %q", e.tr.Reason)
		}
		if took := e.at.Sub(killed); took > MasterDownInterval(100, iv)+slack {
			t.Errorf("a took over %v after b went silent, want at most %v", took, MasterDownInterval(100, iv))
		}

		// b comes back and preempts.
		restarted := time.Now()
		nb = startLive(t, l.peer, b)
		nb.await(Backup, time.Second)
		nb.await(Master, 3*time.Second)
		e = na.awaitSince(restarted, Backup, time.Second)
		if want := fmt.Sprintf("advertisement from %v with priority 200", nb.r.Source()); e.tr.Master != nb.r.Source() || e.tr.Reason != want {
			t.Errorf("a's master %v for %q, want %v for %q", e.tr.Master, e.tr.Reason, nb.r.Source(), want)
		}

		// b resigns: a takes over in its skew time.
		resigned := time.Now()
		if err := nb.r.Resign(context.Background(), "test"); err != nil {
			t.Fatal(err)
		}
		nb.await(Init, time.Second)
		e = na.awaitSince(resigned, Master, 3*time.Second)
		if want := fmt.Sprintf("master %v resigned (priority 0)", nb.r.Source()); e.tr.Reason != want {
			t.Errorf("a took over for %q, want %q", e.tr.Reason, want)
		}
		if took := e.at.Sub(resigned); took > SkewTime(100, iv)+slack {
			t.Errorf("a took over %v after b resigned, want about %v", took, SkewTime(100, iv))
		}
		// Resumed, b preempts again.
		resumed := time.Now()
		nb.r.Resume()
		nb.awaitSince(resumed, Backup, time.Second)
		nb.awaitSince(resumed, Master, 3*time.Second)
		na.awaitSince(resumed, Backup, time.Second)
		for _, n := range []*live{na, nb} {
			if st := n.r.Status(); st.Dropped != 0 || st.SendErrors != 0 {
				t.Errorf("%v: status %+v", n.r.Source(), st)
			}
		}
	})
}
