package vrrp

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// cutIv is the advertisement interval of TestNetnsLinkCut, in
// centiseconds: the 100 ms of vipd's default and of the HA benchmark.
const cutIv = 10

// cutSlack is what the bounds of TestNetnsLinkCut allow beyond the
// protocol, for a loaded host.
const cutSlack = 300 * time.Millisecond

// TestNetnsLinkCut cuts the master's link (its interface set down over
// netlink, as `ip link set down` does) and brings it back, a few times:
// the master stands back at once (it sees the link go in a netlink
// event, not at its next poll), its backup takes over, and once the link
// is up the master, of higher priority, takes the addresses back within
// about one advertisement interval: it preempts at the backup's first
// advertisement it hears (with unicast peers, the backup's neighbour
// entry for the master, which failed during the cut, is refreshed as the
// master comes back, so that the next advertisement reaches it at once).
// The times from the cut to standing back and from the link's return to
// being master again are logged. With the poll every second the master
// stood back 1–113 ms after the cut (at its next advertisement, which
// failed) and was master again 522–648 ms after the link came up.
//
// Each return must be within the master down interval and cutSlack (a
// stalled host may miss the first advertisements and take over at the
// master down timer), and the median of a mode's cuts within one
// advertisement interval and cutSlack: a 1-second poll followed by the
// master down timer (322–1,322 ms) meets that about once in 200 modes.
func TestNetnsLinkCut(t *testing.T) {
	nstest.Need(t)
	const cuts = 5
	eachMode(t, func(t *testing.T, l *link, f family, unicast bool) {
		// IPv6 addresses stay on the link while it is down, as the
		// sources of the advertisements must.
		if err := nstest.Sysctl("net/ipv6/conf/"+l.name+"/keep_addr_on_down", "1"); err != nil {
			t.Fatal(err)
		}
		base := Options{VRID: 19, Interval: cutIv, Preempt: true, Addrs: f.vips}
		a, b := base, base
		a.Interface, a.Priority = l.name, 200
		b.Interface, b.Priority = "vp", 100
		if unicast {
			a.Source, a.Peers = l.localAddr(f.v6), []netip.Addr{l.farAddr(f.v6)}
			b.Source, b.Peers = l.farAddr(f.v6), []netip.Addr{l.localAddr(f.v6)}
		}
		na := startLive(t, nil, a)
		na.await(Backup, time.Second)
		na.await(Master, 3*time.Second)
		nb := startLive(t, l.peer, b)
		nb.await(Backup, time.Second)
		nb.awaitMaster(na.r.Source(), 200)

		var downs, ups []time.Duration
		for i := range cuts {
			cut := time.Now()
			setLink(t, l.name, false)
			e := na.awaitSince(cut, Init, 2*time.Second)
			down := e.at.Sub(cut)
			downs = append(downs, down)
			if e.tr.Cause != CauseFault {
				t.Errorf("cut %d: a stood back for %q (%s)", i, e.tr.Reason, e.tr.Cause)
			}
			nb.awaitSince(cut, Master, 3*time.Second)

			back := time.Now()
			setLink(t, l.name, true)
			e = na.awaitSince(back, Master, 3*time.Second)
			up := e.at.Sub(back)
			ups = append(ups, up)
			nb.awaitSince(back, Backup, 3*time.Second)
			t.Logf("cut %d: stood back %v after the cut; master again %v after the link came up (%s)",
				i, down.Round(time.Millisecond), up.Round(time.Millisecond), e.tr.Reason)
			preempt := fmt.Sprintf("preempting master %v of priority 100", nb.r.Source())
			if e.tr.Reason != preempt && e.tr.Reason != "master down timer expired" {
				t.Errorf("cut %d: a master again for %q, want %q", i, e.tr.Reason, preempt)
			}
			if down > cutSlack {
				t.Errorf("cut %d: a stood back %v after the cut, want at most %v", i, down, cutSlack)
			}
			if bound := MasterDownInterval(200, cutIv) + cutSlack; up > bound {
				t.Errorf("cut %d: a master again %v after its link came up, want at most %v (the master down interval and %v)", i, up, bound, cutSlack)
			}
		}
		slices.Sort(downs)
		slices.Sort(ups)
		t.Logf("%s unicast=%v: stood back after the cut: %v; master again after the link came up: %v", f.name, unicast, downs, ups)
		if median, bound := ups[len(ups)/2], centis(cutIv)+cutSlack; median > bound {
			t.Errorf("a master again after its link came up: median %v, want at most %v (one advertisement interval and %v)", median, bound, cutSlack)
		}
	})
}

// setLink sets the test's interface name up or down, as `ip link set`
// does.
func setLink(t *testing.T, name string, up bool) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err == nil {
		if up {
			err = netlink.LinkSetUp(l)
		} else {
			err = netlink.LinkSetDown(l)
		}
	}
	if err != nil {
		t.Fatalf("set %s up=%v: %v", name, up, err)
	}
}
