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

// link is a veth pair between the test's namespace (interface "vl",
// address .1 / ::1) and a peer namespace ("vp", .2 / ::2).
type link struct {
	peer       *nstest.Peer
	local, far netip.Addr // the routable addresses
}

func newLink(t *testing.T) *link {
	t.Helper()
	nstest.Need(t)
	p := nstest.NewPeer(t, "vl", "vp")
	for _, a := range []string{"10.19.0.1/24", "fd19::1/64"} {
		if err := nstest.AddAddr("vl", a); err != nil {
			t.Fatal(err)
		}
	}
	p.Do(t, func() error {
		for _, a := range []string{"10.19.0.2/24", "fd19::2/64"} {
			if err := nstest.AddAddr("vp", a); err != nil {
				return err
			}
		}
		return nil
	})
	return &link{peer: p, local: netip.MustParseAddr("10.19.0.1"), far: netip.MustParseAddr("10.19.0.2")}
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
	deadline := time.After(within)
	for {
		select {
		case e := <-n.events:
			if e.tr.To == role {
				return e
			}
		case <-deadline:
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

// quiet fails the test if the router changes role within d.
func (n *live) quiet(d time.Duration) {
	n.t.Helper()
	select {
	case e := <-n.events:
		n.t.Fatalf("unexpected transition %+v", e.tr)
	case <-time.After(d):
	}
}

// family is one address family's setup on the link.
type family struct {
	name        string
	vips        []netip.Addr
	local, peer netip.Addr // unicast peer addresses, in that order
}

var families = []family{
	{"ipv4", []netip.Addr{netip.MustParseAddr("10.19.0.100")}, netip.MustParseAddr("10.19.0.1"), netip.MustParseAddr("10.19.0.2")},
	{"ipv6", []netip.Addr{netip.MustParseAddr("fe80::19:100"), netip.MustParseAddr("fd19::100")}, netip.MustParseAddr("fd19::1"), netip.MustParseAddr("fd19::2")},
}

// TestNetnsVipdPair runs two Routers on either end of a veth pair, at
// 100 ms adverts: election by priority, takeover when the master goes
// silent, preemption, and resigning; in both families, with multicast
// and with unicast peers.
func TestNetnsVipdPair(t *testing.T) {
	for _, f := range families {
		for _, unicast := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/unicast=%v", f.name, unicast), func(t *testing.T) {
				l := newLink(t)
				base := Options{VRID: 19, Interval: 10, Preempt: true, Addrs: f.vips}
				a, b := base, base
				a.Interface, a.Priority = "vl", 100
				b.Interface, b.Priority = "vp", 200
				if unicast {
					// Unicast sources are the routable addresses.
					a.Source, a.Peers = f.local, []netip.Addr{f.peer}
					b.Source, b.Peers = f.peer, []netip.Addr{f.local}
				}
				// b first: its master down interval is 300 + 22 ms. Started
				// together, a host that stalls the two for longer than the
				// 39 ms between theirs makes both masters for a moment.
				nb := startLive(t, l.peer, b)
				nb.await(Backup, time.Second)
				nb.await(Master, time.Second)
				na := startLive(t, nil, a)
				na.await(Backup, time.Second)
				na.awaitMaster(nb.r.Source(), 200)
				na.quiet(300 * time.Millisecond)

				// b goes silent: a takes over within its master down
				// interval, 300 + 61 ms, after b's last advertisement.
				killed := time.Now()
				nb.kill()
				e := na.await(Master, time.Second)
				if took := e.at.Sub(killed); took > MasterDownInterval(100, 10)+slack {
					t.Errorf("a took over %v after b went silent", took)
				}

				// b comes back and preempts.
				nb = startLive(t, l.peer, b)
				nb.await(Backup, time.Second)
				nb.await(Master, time.Second)
				if e := na.await(Backup, time.Second); e.tr.Master != nb.r.Source() {
					t.Errorf("a's master %v, want %v", e.tr.Master, nb.r.Source())
				}

				// b resigns: a takes over in its skew time, 61 ms.
				resigned := time.Now()
				if err := nb.r.Resign(context.Background(), "test"); err != nil {
					t.Fatal(err)
				}
				nb.await(Init, time.Second)
				e = na.await(Master, time.Second)
				if want := fmt.Sprintf("master %v resigned (priority 0)", nb.r.Source()); e.tr.Reason != want {
					t.Errorf("a took over for %q, want %q", e.tr.Reason, want)
				}
				if took := e.at.Sub(resigned); took > SkewTime(100, 10)+slack {
					t.Errorf("a took over %v after b resigned", took)
				}
				// Resumed, b preempts again.
				nb.r.Resume()
				nb.await(Backup, time.Second)
				nb.await(Master, time.Second)
				na.await(Backup, time.Second)
				for _, n := range []*live{na, nb} {
					if st := n.r.Status(); st.Dropped != 0 || st.SendErrors != 0 {
						t.Errorf("%v: status %+v", n.r.Source(), st)
					}
				}
			})
		}
	}
}
