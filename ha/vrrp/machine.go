package vrrp

import (
	"fmt"
	"net/netip"
	"time"
)

// Role is a virtual router's state in RFC 5798 section 6.4.
type Role int

const (
	// Init is the Initialize state: not started, resigned or stopped; the
	// router neither answers for the addresses nor takes over.
	Init Role = iota
	// Backup monitors the master and takes over when it goes silent.
	Backup
	// Master owns the virtual addresses and advertises.
	Master
)

func (r Role) String() string {
	switch r {
	case Init:
		return "init"
	case Backup:
		return "backup"
	case Master:
		return "master"
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// Transition is a change of role and why it happened.
type Transition struct {
	From, To Role
	// Reason says why, in words fit for a log line, and Cause says it
	// in one word of a small set (the Cause constants), fit for a
	// metric's label.
	Reason string
	Cause  Cause
	// Master is the master's primary address when known: the sender of
	// the advertisement that made this router a backup, or the router's
	// own address when it became master.
	Master netip.Addr
	// Priority is the router's own priority at the transition.
	Priority uint8
	// Late is how long after its deadline the master down timer that
	// caused the transition was handled (zero for other causes): a busy
	// node's takeover is late by that much.
	Late time.Duration
	// At is when the router handled the event that caused the
	// transition (a timer, Late after its deadline, or a packet), by its
	// clock; the Machine leaves it unset.
	At time.Time
}

// Cause is why a transition happened, in one word.
type Cause string

// The causes of transitions.
const (
	CauseStart          Cause = "start"           // the router started (as a backup)
	CauseOwner          Cause = "owner"           // the address owner (priority 255) started
	CauseRestart        Cause = "restart"         // master when it stopped, it took the addresses back
	CauseMasterDown     Cause = "master_down"     // the master fell silent
	CausePeerResigned   Cause = "peer_resigned"   // the master advertised priority 0
	CausePreempt        Cause = "preempt"         // this router preempted a master of lower priority
	CauseHigherPriority Cause = "higher_priority" // a master of higher priority (or address) spoke
	CauseResign         Cause = "resign"          // this router resigned (Resign)
	CauseFault          Cause = "fault"           // its interface is missing or down, or advertisements cannot be sent
)

// Step is what the machine asks its runner to do after an event: send an
// advertisement (first), then report a transition.
type Step struct {
	// Send asks for an advertisement with SendPriority.
	Send         bool
	SendPriority uint8
	// Transition is set when the role changed.
	Transition *Transition
	// Reassert, set on a master that heard another master of lower
	// priority (the two could not hear each other, and now can), says
	// why the master announces its addresses again: the clients that
	// followed the other master's announcements come back.
	Reassert string
	// Suspect, set on a backup that has heard nothing from its master
	// for SuspectIntervals advertisement intervals, says so: the master
	// may be gone, and the backup may take over when the master down
	// timer fires. The caller can ready what a takeover needs.
	Suspect string
}

// SuspectIntervals is how many of the master's advertisement intervals
// a backup waits without one before it reports the master suspect (Step
// Suspect): two, so that one advertisement late or lost does not, and
// well before the master down timer (three intervals and the skew time).
const SuspectIntervals = 2

// MachineConfig is a virtual router's configuration as the state machine
// sees it.
type MachineConfig struct {
	// Self is the router's primary address, which breaks ties between
	// masters of equal priority.
	Self netip.Addr
	// Priority is 1 to 255; 255 is the address owner's and makes the
	// router master at once on start.
	Priority uint8
	// Interval is the advertisement interval in centiseconds, 1 to 4095.
	Interval uint16
	// Preempt lets a backup of higher priority take over from a master
	// of lower priority.
	Preempt bool
	// PreemptDelay is how long a backup keeps accepting a master of lower
	// priority, counted from the first such advertisement, before it
	// stops accepting it and takes over when the master down timer fires.
	PreemptDelay time.Duration
	// StartAsMaster starts a router that was master when it stopped and
	// still holds the addresses: it listens for one advertisement
	// interval and its skew, then takes the addresses back, without the
	// three intervals of a master down timer, unless a master of higher
	// priority speaks (it then stays backup: a restart never takes the
	// addresses from a better peer). A master of lower priority that
	// took over meanwhile is preempted at once when Preempt is set,
	// without PreemptDelay: the node was serving a moment ago.
	StartAsMaster bool
	// RejoinDelay is how long a router that starts again (after a Resign
	// or a Fault) keeps accepting a master of lower priority before it
	// preempts it, at the first advertisement after the delay: a node
	// whose connections are synchronized lets its peer's catch up. Zero
	// preempts at the first advertisement (see Start).
	RejoinDelay time.Duration
	// Suspect makes a backup report its master suspect (Step.Suspect)
	// after SuspectIntervals without an advertisement.
	Suspect bool
}

// Machine is the VRRPv3 state machine of RFC 5798 section 6.4, without
// sockets or clocks: the runner passes the time of every event and arms
// one timer for Deadline.
type Machine struct {
	cfg  MachineConfig
	role Role

	// masterInterval is Master_Adver_Interval in centiseconds.
	masterInterval uint16
	master         netip.Addr
	masterPriority uint8

	// downAt is the Master_Down_Timer's deadline (backup), advertAt the
	// Adver_Timer's (master).
	downAt, advertAt time.Time
	// suspectAt is when a backup that heard its master reports it
	// suspect; zero once it did, until the next advertisement.
	suspectAt time.Time
	// downReason and downCause are why the master down timer will have
	// fired.
	downReason string
	downCause  Cause
	// preemptAt is when a backup stops accepting a master of lower
	// priority; zero while it has seen none since the last acceptable
	// one.
	preemptAt time.Time
	// reclaiming says the router started as master (StartAsMaster) and
	// has heard no master yet.
	reclaiming bool
	// started says Start was called before; rejoining that the router
	// started again (after a Resign or a Fault) and has heard no master
	// yet.
	started, rejoining bool
	// rejoinAt is when a rejoining router stops accepting a master of
	// lower priority (RejoinDelay after Start).
	rejoinAt time.Time
}

// NewMachine returns a machine in the Initialize state.
func NewMachine(cfg MachineConfig) (*Machine, error) {
	if !cfg.Self.IsValid() {
		return nil, fmt.Errorf("vrrp machine: no primary address")
	}
	if cfg.Priority == 0 {
		return nil, fmt.Errorf("vrrp machine: priority 0 is reserved for resigning")
	}
	if cfg.Interval == 0 || cfg.Interval > MaxInterval {
		return nil, fmt.Errorf("vrrp machine: interval %d cs out of 1..%d", cfg.Interval, MaxInterval)
	}
	if cfg.PreemptDelay < 0 {
		return nil, fmt.Errorf("vrrp machine: negative preempt delay %v", cfg.PreemptDelay)
	}
	return &Machine{cfg: cfg, role: Init, masterInterval: cfg.Interval}, nil
}

// centis converts centiseconds to a duration.
func centis(cs uint16) time.Duration { return time.Duration(cs) * 10 * time.Millisecond }

// SkewTime is ((256 - priority) * Master_Adver_Interval) / 256.
func SkewTime(priority uint8, masterInterval uint16) time.Duration {
	return time.Duration(256-int(priority)) * centis(masterInterval) / 256
}

// MasterDownInterval is 3 * Master_Adver_Interval + Skew_Time.
func MasterDownInterval(priority uint8, masterInterval uint16) time.Duration {
	return 3*centis(masterInterval) + SkewTime(priority, masterInterval)
}

// Role is the current role.
func (m *Machine) Role() Role { return m.role }

// Priority is the router's own current priority.
func (m *Machine) Priority() uint8 { return m.cfg.Priority }

// MasterAddr is the master's primary address as last learned, and its
// priority; the zero address when unknown.
func (m *Machine) MasterAddr() (netip.Addr, uint8) { return m.master, m.masterPriority }

// Deadline is when Expire must next be called; zero in Initialize.
func (m *Machine) Deadline() time.Time {
	switch m.role {
	case Backup:
		if !m.suspectAt.IsZero() && m.suspectAt.Before(m.downAt) {
			return m.suspectAt
		}
		return m.downAt
	case Master:
		return m.advertAt
	}
	return time.Time{}
}

func (m *Machine) transition(to Role, cause Cause, reason string) *Transition {
	t := &Transition{From: m.role, To: to, Reason: reason, Cause: cause, Priority: m.cfg.Priority}
	m.role = to
	switch to {
	case Master:
		m.master, m.masterPriority = m.cfg.Self, m.cfg.Priority
		m.downAt, m.suspectAt = time.Time{}, time.Time{}
	case Backup:
		m.advertAt = time.Time{}
	case Init:
		m.reclaiming, m.rejoining = false, false
		m.master, m.masterPriority = netip.Addr{}, 0
		m.downAt, m.advertAt, m.preemptAt, m.suspectAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	}
	t.Master = m.master
	return t
}

func (m *Machine) becomeMaster(now time.Time, cause Cause, reason string) Step {
	m.reclaiming, m.rejoining = false, false
	m.advertAt = now.Add(centis(m.cfg.Interval))
	return Step{Send: true, SendPriority: m.cfg.Priority, Transition: m.transition(Master, cause, reason)}
}

// MaxIntervalFactor bounds the Master_Adver_Interval a backup adopts
// from an advertisement to this many times its own interval. RFC 5798
// (section 6.4.2) has the backup adopt the master's interval whatever it
// is: one advertisement of interval 4095 (40.95 s) would put its master
// down timer about two and a half minutes out, during which nothing takes
// over from a master that fell silent. Bounded, a master that advertises
// up to 3 * MaxIntervalFactor times slower than the backup's own interval
// still keeps it a backup (its timer runs three bounded intervals); a
// shorter interval is adopted as advertised: it only makes the backup
// take over sooner, which a peer on the link can cause anyway by
// resigning.
const MaxIntervalFactor = 2

// AdoptedInterval is the Master_Adver_Interval a backup of own interval
// adopts from an advertisement of interval advertised, in centiseconds.
func AdoptedInterval(own, advertised uint16) uint16 {
	return uint16(min(int(advertised), MaxIntervalFactor*int(own)))
}

func (m *Machine) armDown(now time.Time) {
	m.downAt = now.Add(MasterDownInterval(m.cfg.Priority, m.masterInterval))
	m.downReason, m.downCause = "master down timer expired", CauseMasterDown
}

// armSuspect sets when a backup that heard its master at now reports it
// suspect.
func (m *Machine) armSuspect(now time.Time) {
	if m.cfg.Suspect {
		m.suspectAt = now.Add(SuspectIntervals * centis(m.masterInterval))
	}
}

// Start handles the Startup event in Initialize; elsewhere it does
// nothing.
//
// A router that starts again, after a Resign or a Fault (its interface
// back, the node undrained), and hears first a master of lower priority
// preempts it at once when Preempt is set without PreemptDelay: RFC 5798
// would discard that advertisement and take over when the master down
// timer fires, three intervals later, while the master is alive and
// yields to the first advertisement of higher priority. The router of
// higher priority that lost its link thus takes the addresses back
// within about one advertisement interval of its return. The first Start
// keeps RFC 5798's wait (see StartAsMaster for a restart).
func (m *Machine) Start(now time.Time) Step {
	if m.role != Init {
		return Step{}
	}
	m.rejoining = m.started
	m.started = true
	m.rejoinAt = now.Add(m.cfg.RejoinDelay)
	switch {
	case m.cfg.Priority == 255:
		return m.becomeMaster(now, CauseOwner, "address owner (priority 255)")
	}
	m.masterInterval = m.cfg.Interval
	m.preemptAt = time.Time{}
	if m.cfg.StartAsMaster {
		// Once: a Start after a Resign is a start as a backup.
		m.cfg.StartAsMaster = false
		m.reclaiming = true
		t := m.transition(Backup, CauseStart, "started; master when it stopped, it takes the addresses back unless a master of higher priority speaks")
		m.downAt = now.Add(centis(m.cfg.Interval) + SkewTime(m.cfg.Priority, m.cfg.Interval))
		m.downReason, m.downCause = "master when it stopped, and no master of higher priority spoke", CauseRestart
		return Step{Transition: t}
	}
	t := m.transition(Backup, CauseStart, "started")
	m.armDown(now)
	return Step{Transition: t}
}

// Expire handles the timer that Deadline named, when now has reached it.
func (m *Machine) Expire(now time.Time) Step {
	switch {
	case m.role == Backup && !now.Before(m.downAt):
		late := now.Sub(m.downAt)
		st := m.becomeMaster(now, m.downCause, m.downReason)
		st.Transition.Late = late
		return st
	case m.role == Master && !now.Before(m.advertAt):
		m.advertAt = now.Add(centis(m.cfg.Interval))
		return Step{Send: true, SendPriority: m.cfg.Priority}
	case m.role == Backup && !m.suspectAt.IsZero() && !now.Before(m.suspectAt):
		m.suspectAt = time.Time{}
		return Step{Suspect: fmt.Sprintf("no advertisement from master %v for %d intervals", m.master, SuspectIntervals)}
	}
	return Step{}
}

// Receive handles an advertisement for this virtual router from src,
// which the runner has checked as RFC 5798 section 7.1 asks (TTL,
// version, checksum, VRID). An advertisement with interval 0 is ignored:
// it would make the master down interval zero; one with an interval
// beyond MaxIntervalFactor times the router's own counts as that.
func (m *Machine) Receive(now time.Time, src netip.Addr, p Packet) Step {
	if p.Interval == 0 {
		return Step{}
	}
	switch m.role {
	case Backup:
		if m.reclaiming && p.Priority != 0 {
			m.reclaiming = false
			if m.cfg.Preempt && (p.Priority < m.cfg.Priority || p.Priority == m.cfg.Priority && src.Compare(m.cfg.Self) < 0) {
				return m.becomeMaster(now, CauseRestart, fmt.Sprintf("master when it stopped; preempting master %v of priority %d", src, p.Priority))
			}
		}
		catchingUp := false
		if m.rejoining && p.Priority != 0 {
			switch {
			case !m.cfg.Preempt || m.cfg.PreemptDelay != 0 || p.Priority >= m.cfg.Priority:
				m.rejoining = false
			case now.Before(m.rejoinAt):
				// Accepted as master until rejoinAt (RejoinDelay).
				catchingUp = true
			default:
				m.rejoining = false
				return m.becomeMaster(now, CausePreempt, fmt.Sprintf("preempting master %v of priority %d", src, p.Priority))
			}
		}
		if p.Priority == 0 {
			m.downAt = now.Add(SkewTime(m.cfg.Priority, m.masterInterval))
			m.downReason, m.downCause = fmt.Sprintf("master %v resigned (priority 0)", src), CausePeerResigned
			return Step{}
		}
		if m.cfg.Preempt && p.Priority < m.cfg.Priority && !catchingUp {
			if m.preemptAt.IsZero() {
				m.preemptAt = now.Add(m.cfg.PreemptDelay)
			}
			if !now.Before(m.preemptAt) {
				// Discard: the master down timer will fire and this
				// router take over.
				m.downReason, m.downCause = fmt.Sprintf("preempting master %v of priority %d", src, p.Priority), CausePreempt
				return Step{}
			}
		} else {
			m.preemptAt = time.Time{}
		}
		m.masterInterval = AdoptedInterval(m.cfg.Interval, p.Interval)
		m.master, m.masterPriority = src, p.Priority
		m.armDown(now)
		m.armSuspect(now)
	case Master:
		if p.Priority == 0 {
			m.advertAt = now.Add(centis(m.cfg.Interval))
			return Step{Send: true, SendPriority: m.cfg.Priority}
		}
		if p.Priority > m.cfg.Priority || p.Priority == m.cfg.Priority && src.Compare(m.cfg.Self) > 0 {
			reason := fmt.Sprintf("advertisement from %v with priority %d", src, p.Priority)
			if p.Priority == m.cfg.Priority {
				reason += " and a higher address"
			}
			m.masterInterval = AdoptedInterval(m.cfg.Interval, p.Interval)
			t := m.transition(Backup, CauseHigherPriority, reason)
			m.master, m.masterPriority = src, p.Priority
			t.Master = src
			m.preemptAt = time.Time{}
			m.armDown(now)
			m.armSuspect(now)
			return Step{Transition: t}
		}
		// Another master of lower priority: RFC 5798 discards its
		// advertisement; this master also advertises at once, so that
		// the other yields now, and announces its addresses again.
		m.advertAt = now.Add(centis(m.cfg.Interval))
		return Step{Send: true, SendPriority: m.cfg.Priority,
			Reassert: fmt.Sprintf("master %v of priority %d advertises too", src, p.Priority)}
	}
	return Step{}
}

// SetPriority changes the router's priority (1 to 255), as tracking does.
// A master advertises the new priority at once, so that a backup of
// higher priority can preempt it without waiting for the next interval.
func (m *Machine) SetPriority(now time.Time, p uint8) (Step, error) {
	if p == 0 {
		return Step{}, fmt.Errorf("vrrp machine: priority 0 is reserved for resigning")
	}
	if p == m.cfg.Priority {
		return Step{}, nil
	}
	m.cfg.Priority = p
	if m.role == Master {
		m.masterPriority = p
		m.advertAt = now.Add(centis(m.cfg.Interval))
		return Step{Send: true, SendPriority: p}, nil
	}
	return Step{}, nil
}

// Resign handles the Shutdown event: a master advertises priority 0, so
// that a backup takes over after its skew time, and every role returns to
// Initialize until the next Start.
func (m *Machine) Resign(now time.Time, reason string) Step {
	return m.stop(CauseResign, reason)
}

// Fault is Resign for a router that stands back because its interface
// is missing or down, or advertisements cannot be sent.
func (m *Machine) Fault(now time.Time, reason string) Step {
	return m.stop(CauseFault, reason)
}

func (m *Machine) stop(cause Cause, reason string) Step {
	switch m.role {
	case Master:
		return Step{Send: true, SendPriority: 0, Transition: m.transition(Init, cause, reason)}
	case Backup:
		return Step{Transition: m.transition(Init, cause, reason)}
	}
	return Step{}
}

// SetSelf changes the router's primary address, in Initialize only (its
// interface was created again with another one); elsewhere it does
// nothing.
func (m *Machine) SetSelf(a netip.Addr) {
	if m.role == Init && a.IsValid() {
		m.cfg.Self = a
	}
}
