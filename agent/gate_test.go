package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// wireAnnouncer records what reaches the wire.
type wireAnnouncer struct {
	on    map[netip.Addr]bool
	calls []string
}

func (w *wireAnnouncer) Announced() []netip.Addr {
	return slices.SortedFunc(maps.Keys(w.on), netip.Addr.Compare)
}

func (w *wireAnnouncer) Announce(a netip.Addr) error {
	w.on[a] = true
	w.calls = append(w.calls, "announce "+a.String())
	return nil
}

func (w *wireAnnouncer) Withdraw(a netip.Addr) error {
	delete(w.on, a)
	w.calls = append(w.calls, "withdraw "+a.String())
	return nil
}

func (w *wireAnnouncer) Ready(a netip.Addr) error {
	w.calls = append(w.calls, "ready "+a.String())
	return nil
}

func (w *wireAnnouncer) take() string {
	s := strings.Join(w.calls, ", ")
	w.calls = nil
	return s
}

func TestRoleGate(t *testing.T) {
	w := &wireAnnouncer{on: map[netip.Addr]bool{}}
	g := newRoleGate(w)
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	check := func(what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %q, want %q", what, got, want)
		}
	}
	// A backup passes nothing on, and tells the reconciler what it asked.
	g.Announce(a)
	g.Announce(b)
	check("backup announces", w.take(), "ready 192.0.2.1, ready 192.0.2.2")
	check("announced", fmt.Sprint(g.Announced()), "[192.0.2.1 192.0.2.2]")
	if n, err := g.reassert(); n != 0 || err != nil || w.take() != "" {
		t.Errorf("a backup reasserted: %d %v", n, err)
	}
	// Master: everything at once, then what the reconciler asks.
	n, err := g.setRole(true)
	check("takeover", fmt.Sprint(n, err, " ", w.take()), "2 <nil> announce 192.0.2.1, announce 192.0.2.2")
	g.Withdraw(b)
	g.Announce(b)
	check("master", w.take(), "withdraw 192.0.2.2, announce 192.0.2.2")
	n, err = g.reassert()
	check("reassert", fmt.Sprint(n, err, " ", w.take()), "2 <nil> withdraw 192.0.2.1, announce 192.0.2.1, withdraw 192.0.2.2, announce 192.0.2.2")
	// Backup again: everything off the wire; a late announcement of a
	// pass planned while master stays off it (it only stands ready).
	n, err = g.setRole(false)
	check("handover", fmt.Sprint(n, err, " ", w.take()), "2 <nil> withdraw 192.0.2.1, withdraw 192.0.2.2")
	g.Announce(netip.MustParseAddr("192.0.2.3"))
	check("late announcement", w.take(), "ready 192.0.2.3")
	check("announced", fmt.Sprint(g.Announced(), len(w.on)), "[192.0.2.1 192.0.2.2 192.0.2.3] 0")
}

// TestRoleGateRetry checks that a master announces again what is not
// announced on every uplink, and that a backup does not.
func TestRoleGateRetry(t *testing.T) {
	w := &wireAnnouncer{on: map[netip.Addr]bool{}}
	g := newRoleGate(w)
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	g.Announce(a)
	g.Announce(b)
	w.take()
	if n, err := g.retry(); n != 0 || err != nil || w.take() != "" {
		t.Errorf("a backup retried: %d %v", n, err)
	}
	g.setRole(true)
	w.take()
	if n, err := g.retry(); n != 0 || err != nil || w.take() != "" {
		t.Errorf("nothing missing, retried %d: %v", n, err)
	}
	// b lost an uplink: the announcer no longer lists it.
	delete(w.on, b)
	if n, err := g.retry(); n != 1 || err != nil {
		t.Errorf("retry: %d %v", n, err)
	}
	if got := w.take(); got != "announce 192.0.2.2" {
		t.Errorf("retry sent %q", got)
	}
}

// TestRoleGateWithdrawsPartial checks that a node that stops being master
// withdraws an address the announcer no longer lists as announced on
// every uplink (one uplink down): left announced on the others, its
// refresh would announce it again from the backup.
func TestRoleGateWithdrawsPartial(t *testing.T) {
	w := &wireAnnouncer{on: map[netip.Addr]bool{}}
	g := newRoleGate(w)
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	g.Announce(a)
	g.Announce(b)
	g.setRole(true)
	w.take()
	// b lost an uplink: the announcer no longer lists it.
	delete(w.on, b)
	n, err := g.setRole(false)
	if got := fmt.Sprint(n, err, " ", w.take()); got != "2 <nil> withdraw 192.0.2.1, withdraw 192.0.2.2" {
		t.Errorf("handover: %q, want both withdrawn", got)
	}
}

// batchWire is a wireAnnouncer that also announces several addresses at
// once, as arp.Announcer does.
type batchWire struct{ *wireAnnouncer }

func (w batchWire) AnnounceAll(addrs []netip.Addr) error {
	for _, a := range addrs {
		w.on[a] = true
	}
	w.calls = append(w.calls, fmt.Sprint("announce all ", addrs))
	return nil
}

// TestRoleGateBatch: a takeover hands every address to an announcer that
// takes several at once in one call, in order, so that they reach the
// wire back to back; a single address goes alone.
func TestRoleGateBatch(t *testing.T) {
	w := batchWire{&wireAnnouncer{on: map[netip.Addr]bool{}}}
	g := newRoleGate(w)
	g.Announce(netip.MustParseAddr("10.0.3.100"))
	g.Announce(netip.MustParseAddr("10.0.2.254"))
	w.take()
	if n, err := g.setRole(true); n != 2 || err != nil {
		t.Fatalf("takeover: %d, %v", n, err)
	}
	if got, want := w.take(), "announce all [10.0.2.254 10.0.3.100]"; got != want {
		t.Errorf("takeover: %q, want %q", got, want)
	}
	delete(w.on, netip.MustParseAddr("10.0.3.100"))
	if n, err := g.retry(); n != 1 || err != nil {
		t.Fatalf("retry: %d, %v", n, err)
	}
	if got, want := w.take(), "announce 10.0.3.100"; got != want {
		t.Errorf("retry: %q, want %q", got, want)
	}
}
