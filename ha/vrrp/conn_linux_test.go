package vrrp

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestConnArrival sends an advertisement from the peer's namespace and
// reads it: Recv gives its addresses, TTL and the kernel's time of
// arrival, between the send and the read, for both families.
func TestConnArrival(t *testing.T) {
	l := newLink(t, 3)
	for _, v6 := range []bool{false, true} {
		ifi, err := net.InterfaceByName(l.name)
		if err != nil {
			t.Fatal(err)
		}
		c, err := listen(ifi, v6)
		if err != nil {
			t.Fatal(err)
		}
		src, dst := l.farPrimary(t, v6), Group4
		if v6 {
			dst = Group6
		}
		b, err := Packet{VRID: 7, Priority: 100, Interval: 100, Addrs: []netip.Addr{src}}.Marshal(src, dst)
		if err != nil {
			t.Fatal(err)
		}
		var sent time.Time
		l.peer.Do(t, func() error {
			pifi, err := net.InterfaceByName("vp")
			if err != nil {
				return err
			}
			pc, err := listen(pifi, v6)
			if err != nil {
				return err
			}
			defer pc.Close()
			sent = time.Now()
			return pc.Send(b, src, dst)
		})
		got := make(chan received, 1)
		go func() {
			p, err := c.Recv(make([]byte, 1500))
			if err != nil {
				t.Error(err)
			}
			got <- p
		}()
		var p received
		select {
		case p = <-got:
		case <-time.After(5 * time.Second):
			t.Fatalf("v6 %v: nothing received", v6)
		}
		read := time.Now()
		c.Close()
		if p.src != src || p.dst != dst || p.ttl != ttl || string(p.b) != string(b) {
			t.Errorf("v6 %v: received %v -> %v ttl %d % x, want %v -> %v ttl %d % x", v6, p.src, p.dst, p.ttl, p.b, src, dst, ttl, b)
		}
		if p.at.IsZero() || p.at.Before(sent.Add(-time.Millisecond)) || p.at.After(read) {
			t.Errorf("v6 %v: arrival %v, want between the send %v and the read %v", v6, p.at, sent, read)
		}
	}
}
