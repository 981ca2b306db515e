package main

import (
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// fakeConn is a connection from addr that records its closing.
type fakeConn struct {
	net.Conn
	addr   net.Addr
	closed bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.addr }
func (c *fakeConn) Close() error         { c.closed = true; return nil }

func from(addr string) *fakeConn {
	return &fakeConn{addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(addr))}
}

func TestClientOf(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.1:1234":            "192.0.2.1/32",
		"[::ffff:192.0.2.1]:1234":   "192.0.2.1/32",
		"127.0.0.2:1":               "127.0.0.2/32",
		"[2001:db8:1:2:3::4]:80":    "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:80": "2001:db8:1:2::/64",
		"[fe80::1%eth0]:80":         "fe80::/64",
	} {
		if got := clientOf(net.TCPAddrFromAddrPort(netip.MustParseAddrPort(addr))); got.String() != want {
			t.Errorf("clientOf(%s) = %s, want %s", addr, got, want)
		}
	}
}

// TestConnSlots: which connection loses its slot to a new one, and when
// the new one is refused or waits.
func TestConnSlots(t *testing.T) {
	const slow = 50 * time.Millisecond
	type conn struct {
		c  *fakeConn
		sc *slotConn
	}
	var s *connSlots
	admit := func(addr string) conn {
		t.Helper()
		c := from(addr)
		sc, ok, full := s.admit(c)
		if !ok {
			t.Fatalf("%s refused (full %v)", addr, full)
		}
		return conn{c, sc}
	}
	refused := func(addr string, wantFull bool) {
		t.Helper()
		sc, ok, full := s.admit(from(addr))
		if ok {
			sc.Close()
			t.Fatalf("%s admitted", addr)
		}
		if full != wantFull {
			t.Errorf("%s refused with full %v, want %v", addr, full, wantFull)
		}
	}
	idle := func(c conn) {
		s.state(c.sc, http.StateIdle)
		c.sc.since = c.sc.since.Add(-idleSettle)
	}
	serving := func(c conn) {
		s.mu.Lock()
		c.sc.serving = true
		s.mu.Unlock()
	}

	// A client at its limit: its next connection takes its own idle
	// one's slot, or its own one not being served, or is refused.
	s = newConnSlots(8, 2, slow)
	a1, a2 := admit("192.0.2.1:1"), admit("192.0.2.1:2")
	b1 := admit("192.0.2.2:1")
	idle(b1)
	idle(a2)
	a3 := admit("192.0.2.1:3")
	if !a2.c.closed || a1.c.closed || b1.c.closed {
		t.Errorf("the client's third connection did not take its idle one's slot: closed a1 %v a2 %v b1 %v", a1.c.closed, a2.c.closed, b1.c.closed)
	}
	serving(a3)
	admit("192.0.2.1:4")
	if !a1.c.closed {
		t.Errorf("the client's fourth connection did not take the slot of its one not served")
	}
	s = newConnSlots(8, 2, slow)
	serving(admit("192.0.2.1:1"))
	serving(admit("192.0.2.1:2"))
	refused("192.0.2.1:3", false)
	admit("192.0.2.2:1")

	// Every slot taken: an idle connection's goes first, then one of the
	// client holding most, if it holds two more than the newcomer's.
	s = newConnSlots(4, 0, slow)
	x1, x2, x3 := admit("192.0.2.1:1"), admit("192.0.2.1:2"), admit("192.0.2.1:3")
	y1 := admit("192.0.2.2:1")
	idle(y1)
	admit("192.0.2.3:1")
	if !y1.c.closed || x1.c.closed || x2.c.closed || x3.c.closed {
		t.Errorf("the idle connection did not lose its slot first")
	}
	admit("192.0.2.4:1") // 192.0.2.1 holds 3, the newcomer none
	if !x1.c.closed {
		t.Errorf("the oldest connection of the client holding most did not lose its slot")
	}
	// Now 192.0.2.1 holds 2, the others 1 each: a newcomer from one of
	// them waits, until a connection has sent nothing for slow.
	refused("192.0.2.3:2", true)
	time.Sleep(slow)
	admit("192.0.2.3:2")
	if !x2.c.closed {
		t.Errorf("the slow connection did not lose its slot")
	}

	// Connections being served, or idle for less than idleSettle, keep
	// theirs whatever their age.
	s = newConnSlots(2, 0, 0)
	z1, z2 := admit("192.0.2.1:1"), admit("192.0.2.2:1")
	serving(z1)
	s.state(z2.sc, http.StateIdle)
	refused("192.0.2.3:1", true)
	if z1.c.closed || z2.c.closed {
		t.Errorf("a served or a just idle connection lost its slot")
	}

	// A closed connection frees its slot, once.
	z1.sc.Close()
	z1.sc.Close()
	s.state(z1.sc, http.StateClosed)
	admit("192.0.2.3:1")
	if len(s.conns) != 2 || s.clients[netip.MustParsePrefix("192.0.2.1/32")] != 0 {
		t.Errorf("after a close: %d connections, clients %v", len(s.conns), s.clients)
	}
}
