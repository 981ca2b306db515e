package bfd

import (
	"net/netip"
	"testing"
	"time"
)

// TestSessionStatus: a session's status, on a fake clock, through its
// start, coming up, a failure by silence, coming back and a failure the
// peer signals: the states, since when, the negotiated intervals, the
// downs and the diagnostic of the last one, which stays once up again.
func TestSessionStatus(t *testing.T) {
	fast := Config{Interval: 100 * time.Millisecond, DetectMult: 3}
	p := newPair(t, fast, Config{Interval: 50 * time.Millisecond, DetectMult: 5})
	st := p.a.Status()
	want := Status{State: Down, RemoteState: Down, Since: t0, LocalDisc: 1, TxInterval: time.Second, DetectMult: 3}
	if st != want {
		t.Fatalf("status at start\n got  %+v\n want %+v", st, want)
	}

	// Up: a sends at 100 ms (b asks for 50), b at a's 100 ms floor, and
	// a waits for b's multiplier 5 of them. b is not heard for the first
	// 1.5 s, so that a comes up after its start.
	p.drop[p.b] = true
	p.run(t0.Add(1500 * time.Millisecond))
	p.drop[p.b] = false
	p.run(t0.Add(5 * time.Second))
	st = p.a.Status()
	upAt := st.Since
	want = Status{State: Up, RemoteState: Up, Since: upAt, LocalDisc: 1, RemoteDisc: 2, TxInterval: 100 * time.Millisecond,
		RxInterval: 100 * time.Millisecond, DetectMult: 3, RemoteDetectMult: 5, DetectionTime: 500 * time.Millisecond}
	if st != want {
		t.Fatalf("status up\n got  %+v\n want %+v", st, want)
	}
	if upAt.Before(t0.Add(1500*time.Millisecond)) || upAt.After(t0.Add(3*time.Second)) {
		t.Errorf("up since %v, want within 1.5 s after b was first heard at %v", upAt, t0.Add(1500*time.Millisecond))
	}
	// b sends at the larger of its 50 ms and a's 100 ms floor.
	if st := p.b.Status(); st.TxInterval != 100*time.Millisecond || st.RxInterval != 100*time.Millisecond || st.DetectionTime != 300*time.Millisecond {
		t.Errorf("b's intervals %v %v %v, want 100ms 100ms 300ms", st.TxInterval, st.RxInterval, st.DetectionTime)
	}

	// b goes silent: a goes down by its detection time, forgets b and
	// says why.
	cut := p.now
	p.drop[p.b] = true
	p.run(cut.Add(2 * time.Second))
	st = p.a.Status()
	if st.State != Down || st.Downs != 1 || st.LastDown != DiagTimeExpired || st.RemoteDisc != 0 || st.RxInterval != 0 || st.RemoteDetectMult != 0 {
		t.Fatalf("status after silence: %+v, want down once, time expired, peer forgotten", st)
	}
	if d := st.Since.Sub(cut); d <= 0 || d > 500*time.Millisecond {
		t.Errorf("down %v after the cut, want within the detection time 500ms", d)
	}
	if st.TxInterval != time.Second {
		t.Errorf("tx interval down %v, want the slow 1s", st.TxInterval)
	}

	// b is heard again: up, the last down's diagnostic kept.
	p.drop[p.b] = false
	p.run(p.now.Add(5 * time.Second))
	st = p.a.Status()
	if st.State != Up || st.Downs != 1 || st.LastDown != DiagTimeExpired || !st.Since.After(cut) {
		t.Fatalf("status up again: %+v, want up, 1 down, time expired, since after %v", st, cut)
	}

	// b signals down: a second down, neighbor signaled.
	at := p.now.Add(time.Millisecond)
	p.a.Receive(&Packet{State: Down, DetectMult: 5, MyDisc: 2, YourDisc: 1, DesiredMinTx: time.Second, RequiredMinRx: time.Second}, at)
	st = p.a.Status()
	if st.State != Down || st.Downs != 2 || st.LastDown != DiagNeighborDown || !st.Since.Equal(at) || st.RemoteState != Down {
		t.Fatalf("status after the peer's down: %+v, want down at %v, 2 downs, neighbor signaled", st, at)
	}
}

// TestSessionStatusInitNotADown: a session that goes from Init to Down
// (the peer went silent before the session came up) counts no down, but
// its diagnostic says why.
func TestSessionStatusInitNotADown(t *testing.T) {
	s := NewSession(Config{Interval: 100 * time.Millisecond, DetectMult: 3}, 7, func() float64 { return 0 }, t0)
	s.Receive(&Packet{State: Down, DetectMult: 3, MyDisc: 9, DesiredMinTx: time.Second, RequiredMinRx: time.Second}, t0)
	if st := s.Status(); st.State != Init || !st.Since.Equal(t0) {
		t.Fatalf("status %+v, want init since %v", st, t0)
	}
	s.Tick(t0.Add(4 * time.Second))
	if st := s.Status(); st.State != Down || st.Downs != 0 || st.LastDown != DiagTimeExpired || !st.Since.Equal(t0.Add(4*time.Second)) {
		t.Fatalf("status %+v, want down, no down counted, time expired", st)
	}
}

// inject hands the speaker's loop a packet as its listener would.
func inject(sp *Speaker, src netip.Addr, ttl int, b []byte) {
	sp.in <- received{src: src, ttl: ttl, b: b, at: time.Now()}
}

// TestSpeakerStatus: a speaker's sessions' status, fed packets through
// its loop as its listener feeds them: the states and the counts of
// packets received, dropped by reason and sent, per session. Packets
// from an address that is no peer (the speaker's own, which come back to
// it over lo, and injected ones) count in no session and make none.
func TestSpeakerStatus(t *testing.T) {
	peerA, peerB := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	stranger := netip.MustParseAddr("127.0.0.9")
	lo := netip.MustParseAddr("127.0.0.1")
	cfg := Config{Interval: 100 * time.Millisecond, DetectMult: 3}
	sp, err := Start(Options{Peers: []PeerOptions{{Address: peerB, Source: lo, Config: cfg}, {Address: peerA, Source: lo, Config: cfg}},
		Port: 47843, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Stop()
	status := func(a netip.Addr) Status {
		st, ok := sp.Session(a)
		if !ok {
			t.Fatalf("no session with %s", a)
		}
		return st
	}
	// The peer sends slowly (10 s): its silence takes the session down
	// only long after the test.
	pkt := func(st State, your uint32) []byte {
		return (&Packet{State: st, DetectMult: 3, MyDisc: 9, YourDisc: your, DesiredMinTx: 10 * time.Second, RequiredMinRx: 100 * time.Millisecond}).Marshal()
	}
	inject(sp, peerA, 255, pkt(Down, 0))
	eventually(t, 2*time.Second, func() bool { return status(peerA).State == Init }, "not init: %+v", status(peerA))
	local := status(peerA).LocalDisc
	inject(sp, peerA, 255, pkt(Up, local))
	eventually(t, 2*time.Second, func() bool { return status(peerA).State == Up }, "not up: %+v", status(peerA))

	inject(sp, peerA, 254, pkt(Up, local))
	inject(sp, peerA, 255, pkt(Up, local)[:20])
	inject(sp, peerA, 255, pkt(Up, local+1))
	for range 5 {
		inject(sp, stranger, 255, pkt(Down, 0))
	}
	want := Counts{Received: 5, LowTTL: 1, Malformed: 1, WrongDisc: 1}
	eventually(t, 2*time.Second, func() bool {
		c := status(peerA).Packets
		c.Sent = 0
		return c == want
	}, "counts %+v, want %+v", status(peerA).Packets, want)
	// The speaker sends to both peers; its packets come back to it over
	// lo from 127.0.0.1, no peer.
	eventually(t, 3*time.Second, func() bool {
		return status(peerA).Packets.Sent > 0 && status(peerB).Packets.Sent > 0 && sp.Stats().Unknown >= 7
	},
		"sent %d and %d, unknown %d: want packets sent to each peer and counted back as unknown", status(peerA).Packets.Sent, status(peerB).Packets.Sent, sp.Stats().Unknown)

	st := status(peerA)
	if st.State != Up || st.RemoteDisc != 9 || st.RemoteDetectMult != 3 || st.RxInterval != 10*time.Second || st.Packets.Dropped() != 3 {
		t.Errorf("status of %s: %+v", peerA, st)
	}
	if b := status(peerB); b.State != Down || b.Packets.Received != 0 || b.Packets.Dropped() != 0 || b.Downs != 0 {
		t.Errorf("status of %s, which sent nothing: %+v", peerB, b)
	}
	all := sp.Sessions()
	if len(all) != 2 || all[0].Peer != peerA || all[1].Peer != peerB {
		t.Fatalf("sessions %+v, want %s and %s, in order, only", all, peerA, peerB)
	}
	for _, a := range []netip.Addr{stranger, lo} {
		if _, ok := sp.Session(a); ok {
			t.Errorf("a session with %s, no peer", a)
		}
	}

	inject(sp, peerA, 255, pkt(Down, local))
	eventually(t, 2*time.Second, func() bool { return status(peerA).State == Down }, "not down: %+v", status(peerA))
	if st := status(peerA); st.Downs != 1 || st.LastDown != DiagNeighborDown || st.Packets.Received != 6 {
		t.Errorf("status after the peer's down: %+v, want 1 down, neighbor signaled, 6 received", st)
	}
}
