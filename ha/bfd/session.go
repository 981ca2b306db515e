package bfd

import (
	"net/netip"
	"time"
)

// SlowInterval is the least transmit interval a session advertises while
// it is not Up (RFC 5880 §6.8.3).
const SlowInterval = time.Second

// Config are a session's timers.
type Config struct {
	// Interval is how often the session sends once Up and how often it
	// asks the peer to send (DesiredMinTx and RequiredMinRx).
	Interval time.Duration
	// DetectMult is the number of intervals without a packet after which
	// the peer declares the session down.
	DetectMult uint8
}

// Change is a change of a session's state.
type Change struct {
	From, To State
	// Diag is why the session went down.
	Diag Diag
	// Remote is the peer's state as last heard: AdminDown when the peer
	// took the session down on purpose, which its clients must not take
	// for a failure of the path (RFC 5882 §3.2).
	Remote State
}

// Failed reports whether the change is a failure of the path: the
// session was up and went down, by silence or because the peer saw it
// down, not because the peer took it administratively down.
func (c Change) Failed() bool {
	return c.From == Up && c.To == Down && c.Remote != AdminDown
}

// Session is one BFD session's state machine (RFC 5880 §6.8), with no
// sockets nor clock: its caller gives it every packet received with the
// time, calls Tick at Deadline, and sends what Tick returns.
type Session struct {
	cfg Config
	// rnd returns a number in [0, 1), for the jitter of the transmit
	// interval.
	rnd func() float64

	state      State
	diag       Diag
	localDisc  uint32
	remoteDisc uint32
	// remoteState, remoteMinRx, remoteMinTx and remoteMult are from the
	// last packet received.
	remoteState State
	remoteMinRx time.Duration
	remoteMinTx time.Duration
	remoteMult  uint8

	// desiredMinTx is the value advertised; txInterval the one the
	// transmit timer uses (an increase waits for the poll's end,
	// §6.8.3).
	desiredMinTx time.Duration
	txInterval   time.Duration
	// polling says a Poll Sequence is running (P set until an F comes).
	polling bool
	// final says a Final is owed to a Poll received; sendNow that a
	// packet is to go out at once (a Final, or the first Poll).
	final, sendNow bool

	nextTx   time.Time
	detectAt time.Time

	// since is when the session entered its state; downs counts its
	// changes from Up to Down, lastDown the diagnostic of its last
	// change to Down (diag clears when it comes up again).
	since    time.Time
	downs    uint64
	lastDown Diag
}

// NewSession returns a session in state Down with discriminator disc
// (non-zero, unique among the speaker's sessions) that sends its first
// packet at now. rnd returns numbers in [0, 1) for the jitter.
func NewSession(cfg Config, disc uint32, rnd func() float64, now time.Time) *Session {
	s := &Session{cfg: cfg, rnd: rnd, state: Down, localDisc: disc, remoteState: Down, remoteMinRx: time.Microsecond}
	s.desiredMinTx = max(cfg.Interval, SlowInterval)
	s.txInterval = s.desiredMinTx
	s.nextTx = now
	s.since = now
	return s
}

// State returns the session's state.
func (s *Session) State() State { return s.state }

// Diag returns the diagnostic of the session's last change to Down.
func (s *Session) Diag() Diag { return s.diag }

// LocalDisc returns the session's discriminator.
func (s *Session) LocalDisc() uint32 { return s.localDisc }

// DetectionTime is how long the session waits for a packet before it
// goes down: the peer's multiplier times the larger of the interval the
// session asks for and the one the peer sends at (§6.8.4). It is zero
// before a packet arrived.
func (s *Session) DetectionTime() time.Duration {
	if s.remoteMult == 0 {
		return 0
	}
	return time.Duration(s.remoteMult) * max(s.cfg.Interval, s.remoteMinTx)
}

// TxInterval is the interval between periodic packets, before jitter:
// the larger of the session's and what the peer asks for; 0 when the
// peer asks for none.
func (s *Session) TxInterval() time.Duration {
	if s.remoteMinRx == 0 {
		return 0
	}
	return max(s.txInterval, s.remoteMinRx)
}

// Receive applies a packet received at now (RFC 5880 §6.8.6), one that
// Unmarshal accepted and that came from the session's peer. It reports
// whether the packet was taken (not discarded: a Your Discriminator
// that is not the session's) and the change of state it caused.
func (s *Session) Receive(p *Packet, now time.Time) (taken bool, ch Change, changed bool) {
	if p.YourDisc != 0 && p.YourDisc != s.localDisc {
		return false, ch, false
	}
	prevMinTx, prevMult := s.remoteMinTx, s.remoteMult
	s.remoteDisc = p.MyDisc
	s.remoteState = p.State
	s.remoteMinRx = p.RequiredMinRx
	s.remoteMinTx = p.DesiredMinTx
	s.remoteMult = p.DetectMult
	if p.Final && s.polling {
		s.polling = false
		s.txInterval = s.desiredMinTx
	}
	detect := s.DetectionTime()
	if prevMult != 0 && p.DesiredMinTx < prevMinTx {
		// The peer sends faster from now on (the poll of a session
		// that came up), but its next packet may still be due at the
		// old interval, armed before: wait for it by the old one once.
		detect = max(detect, time.Duration(prevMult)*max(s.cfg.Interval, prevMinTx))
	}
	s.detectAt = now.Add(detect)
	if iv := s.TxInterval(); iv > 0 && s.state != AdminDown && (s.nextTx.IsZero() || s.nextTx.After(now.Add(iv))) {
		// The peer asked for no packets before, or asks for them more
		// often now.
		s.nextTx = now.Add(s.jitter(iv))
	}
	if p.Poll {
		s.final, s.sendNow = true, true
	}
	if s.state == AdminDown {
		return true, ch, false
	}
	from := s.state
	switch {
	case p.State == AdminDown:
		if s.state != Down {
			s.down(DiagNeighborDown, now)
		}
	case s.state == Down:
		if p.State == Down {
			s.state = Init
		} else if p.State == Init {
			s.up(now)
		}
	case s.state == Init:
		if p.State == Init || p.State == Up {
			s.up(now)
		}
	default: // Up
		if p.State == Down {
			s.down(DiagNeighborDown, now)
		}
	}
	if s.state != from {
		s.since = now
		return true, Change{From: from, To: s.state, Diag: s.diag, Remote: p.State}, true
	}
	return true, ch, false
}

// up brings the session up: its diagnostic clears and it moves from
// the slow interval to its own, by a Poll Sequence (§6.8.3): a decrease
// takes effect at once.
func (s *Session) up(now time.Time) {
	s.state, s.diag = Up, DiagNone
	s.setDesiredMinTx(s.cfg.Interval, now)
}

// down takes the session down with diag and back to the slow interval.
func (s *Session) down(diag Diag, now time.Time) {
	if s.state == Up {
		s.downs++
	}
	s.state, s.diag, s.lastDown, s.since = Down, diag, diag, now
	s.setDesiredMinTx(max(s.cfg.Interval, SlowInterval), now)
}

// setDesiredMinTx changes the interval advertised. While Up a change
// starts a Poll Sequence, and an increase waits for its end (§6.8.3);
// otherwise it takes effect at once.
func (s *Session) setDesiredMinTx(d time.Duration, now time.Time) {
	if d == s.desiredMinTx {
		return
	}
	old := s.desiredMinTx
	s.desiredMinTx = d
	if s.state == Up {
		s.polling, s.sendNow = true, true
		if d < old {
			s.txInterval = d
		}
		return
	}
	s.polling = false
	s.txInterval = d
	if s.nextTx.After(now.Add(d)) {
		s.nextTx = now.Add(d)
	}
}

// Deadline is when Tick is next to be called; ok is false when no
// timer runs. A packet owed at once gives the zero time, which is past.
func (s *Session) Deadline() (at time.Time, ok bool) {
	if s.sendNow {
		return time.Time{}, true
	}
	d := s.nextTx
	if d.IsZero() || !s.detectAt.IsZero() && s.detectAt.Before(d) {
		d = s.detectAt
	}
	return d, !d.IsZero()
}

// Tick runs the session's timers at now: the detection time's expiry
// takes it down (§6.8.4), and a packet due is returned, to be sent.
func (s *Session) Tick(now time.Time) (out *Packet, ch Change, changed bool) {
	if !s.detectAt.IsZero() && !now.Before(s.detectAt) {
		s.detectAt = time.Time{}
		from := s.state
		if s.state == Init || s.state == Up {
			s.down(DiagTimeExpired, now)
			ch, changed = Change{From: from, To: Down, Diag: DiagTimeExpired, Remote: s.remoteState}, true
		}
		// The peer is gone: forget it (§6.8.1).
		s.remoteDisc, s.remoteState, s.remoteMinRx, s.remoteMinTx, s.remoteMult = 0, Down, time.Microsecond, 0, 0
		s.polling, s.final = false, false
		s.txInterval = s.desiredMinTx
	}
	periodic := !s.nextTx.IsZero() && !now.Before(s.nextTx)
	if !s.sendNow && !periodic {
		return nil, ch, changed
	}
	// Any packet sent restarts the periodic timer: the peer's
	// detection timer restarts with it.
	s.nextTx = time.Time{}
	if iv := s.TxInterval(); iv > 0 {
		s.nextTx = now.Add(s.jitter(iv))
	}
	p := s.packet()
	s.sendNow, s.final = false, false
	return p, ch, changed
}

// jitter returns iv less 0 to 25%, or 10 to 25% when the multiplier is
// 1 (§6.8.7).
func (s *Session) jitter(iv time.Duration) time.Duration {
	lo, span := 0.75, 0.25
	if s.cfg.DetectMult == 1 {
		span = 0.15
	}
	return time.Duration(float64(iv) * (lo + span*s.rnd()))
}

// packet returns the Control packet the session sends now.
func (s *Session) packet() *Packet {
	p := &Packet{
		Diag: s.diag, State: s.state, DetectMult: s.cfg.DetectMult, MyDisc: s.localDisc, YourDisc: s.remoteDisc,
		DesiredMinTx: s.desiredMinTx, RequiredMinRx: s.cfg.Interval,
	}
	if s.final {
		p.Final = true
	} else if s.polling {
		p.Poll = true
	}
	return p
}

// AdminDown takes the session administratively down (on a stop): it
// returns the packet that tells the peer, and sends nothing after.
func (s *Session) AdminDown() *Packet {
	s.state, s.diag = AdminDown, DiagAdminDown
	s.polling, s.final, s.sendNow = false, false, false
	p := s.packet()
	s.nextTx, s.detectAt = time.Time{}, time.Time{}
	return p
}

// Status is what a session shows an operator (vipd status, metrics).
type Status struct {
	// Peer is the peer's address (set by the Speaker).
	Peer netip.Addr
	// State is the session's state, RemoteState the peer's as last
	// heard (Down before any packet and once the peer went silent).
	State, RemoteState State
	// Since is when the session entered State: its start, or its last
	// change of state.
	Since time.Time
	// LastDown is the diagnostic of the session's last change to Down,
	// DiagNone if it never went down; it stays after the session came
	// up again.
	LastDown Diag
	// Downs counts the session's changes from Up to Down.
	Downs uint64
	// LocalDisc and RemoteDisc are the discriminators; RemoteDisc is 0
	// while no peer is heard.
	LocalDisc, RemoteDisc uint32
	// TxInterval is the interval between the packets the session sends,
	// before jitter; RxInterval the one the peer sends at, as the two
	// negotiated it (0 while no peer is heard).
	TxInterval, RxInterval time.Duration
	// DetectMult is the session's detect multiplier, RemoteDetectMult
	// the peer's (0 while no peer is heard), and DetectionTime the
	// silence after which the session goes down (RemoteDetectMult ×
	// RxInterval).
	DetectMult, RemoteDetectMult uint8
	DetectionTime                time.Duration
	// Packets are the session's packet counts (set by the Speaker).
	Packets Counts
}

// Counts are the packets of one session. Received counts every packet
// that came from the peer's address, the dropped ones included: LowTTL
// counts those with a TTL or hop limit below 255, Malformed those
// Unmarshal refused, WrongDisc those with a Your Discriminator that is
// not the session's. Sent counts the packets sent.
type Counts struct {
	Received, Sent               uint64
	LowTTL, Malformed, WrongDisc uint64
}

// Dropped is the number of packets from the peer that were dropped.
func (c Counts) Dropped() uint64 { return c.LowTTL + c.Malformed + c.WrongDisc }

// Status returns the session's state for an operator, without Peer and
// Packets, which the session does not know.
func (s *Session) Status() Status {
	st := Status{
		State: s.state, RemoteState: s.remoteState, Since: s.since, LastDown: s.lastDown, Downs: s.downs,
		LocalDisc: s.localDisc, RemoteDisc: s.remoteDisc, TxInterval: s.TxInterval(),
		DetectMult: s.cfg.DetectMult, RemoteDetectMult: s.remoteMult, DetectionTime: s.DetectionTime(),
	}
	if s.remoteMult != 0 {
		st.RxInterval = max(s.cfg.Interval, s.remoteMinTx)
	}
	return st
}
