package bfd

import (
	"net/netip"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// pair is two sessions wired back to back with a shared clock.
type pair struct {
	t    *testing.T
	now  time.Time
	a, b *Session
	// changes are the changes of each side.
	changes map[*Session][]Change
	// drop says packets from a side are lost.
	drop map[*Session]bool
	sent map[*Session][]*Packet
}

func newPair(t *testing.T, ca, cb Config) *pair {
	half := func() float64 { return 0.5 }
	return &pair{t: t, now: t0, a: NewSession(ca, 1, half, t0), b: NewSession(cb, 2, half, t0),
		changes: map[*Session][]Change{}, drop: map[*Session]bool{}, sent: map[*Session][]*Packet{}}
}

// run advances the clock to until, ticking each session at its
// deadlines and delivering what it sends at once (through the wire
// form).
func (p *pair) run(until time.Time) {
	for {
		next := until
		for _, s := range []*Session{p.a, p.b} {
			if at, ok := s.Deadline(); ok && at.Before(next) {
				next = at
			}
		}
		if next.After(p.now) {
			p.now = next
		}
		if !p.now.Before(until) && !p.due() {
			return
		}
		for _, s := range []*Session{p.a, p.b} {
			out, ch, changed := s.Tick(p.now)
			if changed {
				p.changes[s] = append(p.changes[s], ch)
			}
			if out == nil {
				continue
			}
			p.sent[s] = append(p.sent[s], out)
			if p.drop[s] {
				continue
			}
			peer := p.b
			if s == p.b {
				peer = p.a
			}
			pkt, err := Unmarshal(out.Marshal())
			if err != nil {
				p.t.Fatalf("a session sent a packet Unmarshal refuses: %v (%+v)", err, out)
			}
			if taken, ch, changed := peer.Receive(&pkt, p.now); !taken {
				p.t.Fatalf("packet %+v not taken", pkt)
			} else if changed {
				p.changes[peer] = append(p.changes[peer], ch)
			}
		}
	}
}

// due reports whether a session has a packet to send at now.
func (p *pair) due() bool {
	for _, s := range []*Session{p.a, p.b} {
		if at, ok := s.Deadline(); ok && !at.After(p.now) {
			return true
		}
	}
	return false
}

func TestSessionComesUp(t *testing.T) {
	cfg := Config{Interval: 100 * time.Millisecond, DetectMult: 3}
	p := newPair(t, cfg, cfg)
	p.run(t0.Add(3 * time.Second))
	if p.a.State() != Up || p.b.State() != Up {
		t.Fatalf("states %v %v, want up up", p.a.State(), p.b.State())
	}
	want := []State{Init, Up}
	for _, s := range []*Session{p.a, p.b} {
		var got []State
		for _, c := range p.changes[s] {
			got = append(got, c.To)
		}
		if len(got) < 1 || got[len(got)-1] != Up || len(got) > len(want) {
			t.Errorf("changes %v, want at most %v ending up", p.changes[s], want)
		}
	}
	// Once up, both advertise their interval and send at it: the poll
	// sequence ended.
	if p.a.polling || p.b.polling {
		t.Error("a poll sequence is still running")
	}
	if got := p.a.TxInterval(); got != cfg.Interval {
		t.Errorf("transmit interval %v, want %v", got, cfg.Interval)
	}
	if got := p.a.DetectionTime(); got != 300*time.Millisecond {
		t.Errorf("detection time %v, want 300ms", got)
	}
	// While not up, nothing was sent more often than once a second
	// (§6.8.3) less jitter: count a's packets in the first 900 ms.
	n := 0
	p2 := newPair(t, cfg, cfg)
	p2.drop[p2.b] = true // b stays silent: a never comes up
	p2.run(t0.Add(10 * time.Second))
	n = len(p2.sent[p2.a])
	if n < 10 || n > 14 {
		t.Errorf("a session that is down sent %d packets in 10 s, want 10..14 (one a second less jitter)", n)
	}
	for _, pk := range p2.sent[p2.a] {
		if pk.DesiredMinTx < SlowInterval {
			t.Fatalf("a session that is down advertised DesiredMinTx %v < 1s", pk.DesiredMinTx)
		}
	}
}

func TestSessionDetectsSilence(t *testing.T) {
	cfg := Config{Interval: 100 * time.Millisecond, DetectMult: 3}
	p := newPair(t, cfg, cfg)
	p.run(t0.Add(3 * time.Second))
	if p.a.State() != Up {
		t.Fatal("not up")
	}
	cut := p.now
	p.drop[p.b] = true
	p.changes[p.a] = nil
	p.run(cut.Add(2 * time.Second))
	if len(p.changes[p.a]) == 0 {
		t.Fatal("a did not notice b's silence")
	}
	if p.changes[p.a][0].To == Down && p.a.DetectionTime() != 0 {
		t.Errorf("a still has a detection time %v for a peer it forgot", p.a.DetectionTime())
	}
	ch := p.changes[p.a][0]
	if ch.From != Up || ch.To != Down || ch.Diag != DiagTimeExpired || !ch.Failed() {
		t.Errorf("change %+v, want up → down, time expired", ch)
	}
	// b went down too: a's packets told it, diag neighbor down, or... b
	// hears a's down and goes down.
	if p.b.State() == Up {
		t.Errorf("b still up after a went down")
	}
}

// TestSessionDetectionTime checks when exactly silence is detected: the
// detection time after the last packet, not before.
func TestSessionDetectionTime(t *testing.T) {
	cfg := Config{Interval: 100 * time.Millisecond, DetectMult: 3}
	p := newPair(t, cfg, cfg)
	p.run(t0.Add(3 * time.Second))
	p.drop[p.b] = true
	// The last packet from b arrived at or before now.
	last := p.now
	for p.a.State() == Up {
		at, _ := p.a.Deadline()
		p.now = at
		if _, _, changed := p.a.Tick(at); changed {
			break
		}
		if p.now.Sub(last) > time.Second {
			t.Fatal("no detection within a second")
		}
	}
	if d := p.now.Sub(last); d > 300*time.Millisecond {
		t.Errorf("detected after %v, want at most 300ms (3 × 100ms)", d)
	}
}

func TestSessionNeighborDown(t *testing.T) {
	cfg := Config{Interval: 100 * time.Millisecond, DetectMult: 3}
	s := NewSession(cfg, 7, func() float64 { return 0 }, t0)
	recv := func(st State, your uint32) (Change, bool) {
		_, ch, ok := s.Receive(&Packet{State: st, DetectMult: 3, MyDisc: 9, YourDisc: your, DesiredMinTx: time.Second, RequiredMinRx: 100 * time.Millisecond}, t0)
		return ch, ok
	}
	if ch, _ := recv(Down, 0); ch.To != Init {
		t.Fatalf("down + peer down: %+v, want init", ch)
	}
	if ch, _ := recv(Up, 7); ch.To != Up {
		t.Fatalf("init + peer up: %+v, want up", ch)
	}
	if ch, _ := recv(Down, 7); ch.To != Down || ch.Diag != DiagNeighborDown || !ch.Failed() {
		t.Fatalf("up + peer down: %+v, want down, neighbor signaled, a failure", ch)
	}
	recv(Init, 7)
	if s.State() != Up {
		t.Fatalf("down + peer init: %v, want up", s.State())
	}
	if ch, _ := recv(AdminDown, 7); ch.To != Down || ch.Diag != DiagNeighborDown || ch.Failed() {
		t.Fatalf("up + peer admin down: %+v, want down, not a failure", ch)
	}
	// From down, a peer that says up does not bring the session up
	// (§6.8.6: only down → init, init → up).
	if _, ok := recv(Up, 7); ok || s.State() != Down {
		t.Fatalf("down + peer up: %v, want down", s.State())
	}
	// A packet for another discriminator is not taken.
	if taken, _, _ := s.Receive(&Packet{State: Init, DetectMult: 3, MyDisc: 9, YourDisc: 8}, t0); taken {
		t.Fatal("a packet for discriminator 8 was taken by session 7")
	}
}

func TestSessionPollFinal(t *testing.T) {
	cfg := Config{Interval: 100 * time.Millisecond, DetectMult: 3}
	s := NewSession(cfg, 7, func() float64 { return 0 }, t0)
	s.Receive(&Packet{State: Init, DetectMult: 3, MyDisc: 9, DesiredMinTx: time.Second, RequiredMinRx: 50 * time.Millisecond}, t0)
	if s.State() != Up {
		t.Fatal("not up")
	}
	// Up: a poll to move from the slow interval to 100 ms, sent at once.
	if at, ok := s.Deadline(); !ok || !at.IsZero() {
		t.Fatalf("deadline %v %v, want now", at, ok)
	}
	out, _, _ := s.Tick(t0)
	if out == nil || !out.Poll || out.Final || out.DesiredMinTx != 100*time.Millisecond {
		t.Fatalf("first packet up %+v, want P, DesiredMinTx 100ms", out)
	}
	// A decrease takes effect at once.
	if s.TxInterval() != 100*time.Millisecond {
		t.Errorf("tx interval %v during the poll, want 100ms", s.TxInterval())
	}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	out, _, _ = s.Tick(ms(100))
	if out == nil || !out.Poll {
		t.Fatalf("periodic packet during the poll %+v, want P", out)
	}
	// The peer's Final ends it.
	s.Receive(&Packet{State: Up, Final: true, DetectMult: 3, MyDisc: 9, YourDisc: 7, DesiredMinTx: 100 * time.Millisecond, RequiredMinRx: 50 * time.Millisecond}, ms(150))
	out, _, _ = s.Tick(ms(200))
	if out == nil || out.Poll || out.Final {
		t.Fatalf("packet after the poll %+v, want neither P nor F", out)
	}
	// A poll from the peer is answered at once with F, not P.
	s.Receive(&Packet{State: Up, Poll: true, DetectMult: 3, MyDisc: 9, YourDisc: 7, DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 200 * time.Millisecond}, ms(250))
	if at, ok := s.Deadline(); !ok || !at.IsZero() {
		t.Fatalf("deadline %v after a poll, want now", at)
	}
	out, _, _ = s.Tick(ms(250))
	if out == nil || !out.Final || out.Poll {
		t.Fatalf("answer to a poll %+v, want F", out)
	}
	// The peer's new values apply: tx at its 200 ms floor, detection 3 × 300 ms.
	if s.TxInterval() != 200*time.Millisecond || s.DetectionTime() != 900*time.Millisecond {
		t.Errorf("tx %v detection %v, want 200ms and 900ms", s.TxInterval(), s.DetectionTime())
	}
}

func TestSessionJitter(t *testing.T) {
	for _, tt := range []struct {
		mult   uint8
		r      float64
		lo, hi time.Duration
	}{
		{3, 0, 75 * time.Millisecond, 75 * time.Millisecond},
		{3, 0.999999, 99 * time.Millisecond, 100 * time.Millisecond},
		{1, 0, 75 * time.Millisecond, 75 * time.Millisecond},
		{1, 0.999999, 89 * time.Millisecond, 90 * time.Millisecond},
	} {
		s := NewSession(Config{Interval: 100 * time.Millisecond, DetectMult: tt.mult}, 1, func() float64 { return tt.r }, t0)
		if got := s.jitter(100 * time.Millisecond); got < tt.lo || got > tt.hi {
			t.Errorf("mult %d r %v: %v, want %v..%v", tt.mult, tt.r, got, tt.lo, tt.hi)
		}
	}
}

func TestSessionPeerWantsNoPackets(t *testing.T) {
	s := NewSession(Config{Interval: 100 * time.Millisecond, DetectMult: 3}, 7, func() float64 { return 0 }, t0)
	s.Tick(t0)
	s.Receive(&Packet{State: Down, DetectMult: 3, MyDisc: 9, DesiredMinTx: time.Second}, t0)
	s.Tick(t0.Add(2 * time.Second))
	if s.TxInterval() != 0 {
		t.Fatalf("tx interval %v for a peer with RequiredMinRx 0", s.TxInterval())
	}
	if out, _, _ := s.Tick(t0.Add(5 * time.Second)); out != nil {
		t.Fatalf("sent %+v to a peer that asked for none", out)
	}
}

func TestSessionAdminDown(t *testing.T) {
	s := NewSession(Config{Interval: 100 * time.Millisecond, DetectMult: 3}, 7, func() float64 { return 0 }, t0)
	s.Receive(&Packet{State: Init, DetectMult: 3, MyDisc: 9, DesiredMinTx: time.Second, RequiredMinRx: time.Millisecond}, t0)
	p := s.AdminDown()
	if p.State != AdminDown || p.Diag != DiagAdminDown || p.YourDisc != 9 {
		t.Fatalf("admin down packet %+v", p)
	}
	if _, ok := s.Deadline(); ok {
		t.Fatal("an admin down session still has a timer")
	}
	if _, ch, changed := s.Receive(&Packet{State: Up, DetectMult: 3, MyDisc: 9, YourDisc: 7}, t0); changed {
		t.Fatalf("an admin down session changed: %+v", ch)
	}
}

// TestStartRefuses: a speaker refuses a peer listed twice, an invalid
// address, and timers that are not positive.
func TestStartRefuses(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.1")
	ok := Config{Interval: 100 * time.Millisecond, DetectMult: 3}
	for _, tt := range []struct {
		name  string
		peers []PeerOptions
		want  string
	}{
		{"twice", []PeerOptions{{Address: a, Config: ok}, {Address: a, Config: ok}}, "bfd: peer 192.0.2.1 is invalid or listed twice"},
		{"invalid", []PeerOptions{{Config: ok}}, "bfd: peer invalid IP is invalid or listed twice"},
		{"interval", []PeerOptions{{Address: a, Config: Config{DetectMult: 3}}}, "bfd: peer 192.0.2.1: interval 0s and multiplier 3 must be positive"},
		{"multiplier", []PeerOptions{{Address: a, Config: Config{Interval: time.Second}}}, "bfd: peer 192.0.2.1: interval 1s and multiplier 0 must be positive"},
	} {
		sp, err := Start(Options{Peers: tt.peers, Port: 1})
		if err == nil {
			sp.Stop()
			t.Errorf("%s: started", tt.name)
		} else if err.Error() != tt.want {
			t.Errorf("%s: %v, want %s", tt.name, err, tt.want)
		}
	}
	// A peer without a route (its link is not up yet) is no reason to
	// refuse to start: the sends fail until it has one.
	sp, err := Start(Options{Peers: []PeerOptions{{Address: a, Config: ok}}, Port: 47841})
	if err != nil {
		t.Fatalf("a peer without a route: %v", err)
	}
	if st, known := sp.State(a); !known || st != Down {
		t.Errorf("state %v %v, want down", st, known)
	}
	sp.Stop()
}

// TestSessionPeerSpeedsUp: when the peer lowers its DesiredMinTx (its
// poll once up), the packet that says so is waited for by the old
// interval once: the peer's next packet may be due at the old one. The
// packet after it uses the new.
func TestSessionPeerSpeedsUp(t *testing.T) {
	s := NewSession(Config{Interval: 100 * time.Millisecond, DetectMult: 3}, 7, func() float64 { return 0 }, t0)
	recv := func(at time.Time, minTx time.Duration) {
		s.Receive(&Packet{State: Up, DetectMult: 3, MyDisc: 9, YourDisc: 7, DesiredMinTx: minTx, RequiredMinRx: 100 * time.Millisecond}, at)
	}
	s.Receive(&Packet{State: Init, DetectMult: 3, MyDisc: 9, YourDisc: 7, DesiredMinTx: time.Second, RequiredMinRx: 100 * time.Millisecond}, t0)
	recv(t0.Add(100*time.Millisecond), 100*time.Millisecond)
	// 900 ms later the old interval's packet is not overdue.
	if _, _, changed := s.Tick(t0.Add(1000 * time.Millisecond)); changed || s.State() != Up {
		t.Fatalf("down %v after the peer sped up: %v", 900*time.Millisecond, s.State())
	}
	recv(t0.Add(1050*time.Millisecond), 100*time.Millisecond)
	if _, _, changed := s.Tick(t0.Add(1300 * time.Millisecond)); changed {
		t.Fatal("down before the new detection time")
	}
	if _, ch, changed := s.Tick(t0.Add(1350 * time.Millisecond)); !changed || ch.Diag != DiagTimeExpired {
		t.Fatalf("not down 300 ms after the last packet at the new interval: %+v", ch)
	}
}
