package vrrp

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestTimers(t *testing.T) {
	for _, c := range []struct {
		prio     uint8
		interval uint16
		skew     time.Duration
		down     time.Duration
	}{
		{100, 100, 609375 * time.Microsecond, 3609375 * time.Microsecond},
		{100, 10, 60937500, 360937500},
		{254, 10, 781250, 300781250},
		{1, 10, 99609375, 399609375},
		{255, 1, 39062, 30039062},
		{200, MaxInterval, 89578125 * 100 * time.Nanosecond, 3*40950*time.Millisecond + 89578125*100*time.Nanosecond},
	} {
		if got := SkewTime(c.prio, c.interval); got != c.skew {
			t.Errorf("SkewTime(%d, %d) = %v, want %v", c.prio, c.interval, got, c.skew)
		}
		if got := MasterDownInterval(c.prio, c.interval); got != c.down {
			t.Errorf("MasterDownInterval(%d, %d) = %v, want %v", c.prio, c.interval, got, c.down)
		}
	}
}

func TestNewMachineRejects(t *testing.T) {
	ok := MachineConfig{Self: netip.MustParseAddr("10.0.0.1"), Priority: 100, Interval: 100}
	for name, mod := range map[string]func(*MachineConfig){
		"no address":     func(c *MachineConfig) { c.Self = netip.Addr{} },
		"priority 0":     func(c *MachineConfig) { c.Priority = 0 },
		"interval 0":     func(c *MachineConfig) { c.Interval = 0 },
		"interval 4096":  func(c *MachineConfig) { c.Interval = 4096 },
		"negative delay": func(c *MachineConfig) { c.PreemptDelay = -time.Second },
	} {
		c := ok
		mod(&c)
		if _, err := NewMachine(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewMachine(ok); err != nil {
		t.Fatal(err)
	}
}

// sim is a segment of virtual routers that deliver their advertisements
// to each other at once, in virtual time.
type sim struct {
	t     *testing.T
	now   time.Time
	nodes []*node
	log   []string
}

type node struct {
	name string
	m    *Machine
	up   bool
}

func newSim(t *testing.T) *sim { return &sim{t: t, now: t0} }

func (s *sim) add(name, addr string, prio uint8, mod func(*MachineConfig)) *node {
	c := MachineConfig{Self: netip.MustParseAddr(addr), Priority: prio, Interval: 100, Preempt: true}
	if mod != nil {
		mod(&c)
	}
	m, err := NewMachine(c)
	if err != nil {
		s.t.Fatal(err)
	}
	n := &node{name: name, m: m}
	s.nodes = append(s.nodes, n)
	return n
}

func (s *sim) logf(format string, args ...any) {
	s.log = append(s.log, fmt.Sprintf("%v ", s.now.Sub(t0))+fmt.Sprintf(format, args...))
}

func (s *sim) apply(n *node, st Step) {
	if st.Send {
		s.logf("%s sends priority %d", n.name, st.SendPriority)
	}
	if tr := st.Transition; tr != nil {
		s.logf("%s %v -> %v: %s", n.name, tr.From, tr.To, tr.Reason)
		if tr.To == Master && tr.Master != n.m.cfg.Self {
			s.t.Errorf("%s became master with master address %v", n.name, tr.Master)
		}
	}
	if !st.Send {
		return
	}
	p := Packet{VRID: 1, Priority: st.SendPriority, Interval: n.m.cfg.Interval}
	for _, o := range s.nodes {
		if o != n && o.up {
			s.apply(o, o.m.Receive(s.now, n.m.cfg.Self, p))
		}
	}
}

func (s *sim) start(n *node) {
	n.up = true
	s.apply(n, n.m.Start(s.now))
}

// run fires timers in deadline order until d after t0.
func (s *sim) run(d time.Duration) {
	end := t0.Add(d)
	for {
		var next *node
		for _, n := range s.nodes {
			dl := n.m.Deadline()
			if n.up && !dl.IsZero() && (next == nil || dl.Before(next.m.Deadline())) {
				next = n
			}
		}
		if next == nil || next.m.Deadline().After(end) {
			s.now = end
			return
		}
		s.now = next.m.Deadline()
		s.apply(next, next.m.Expire(s.now))
	}
}

// transitions are the log lines that are transitions, not sends.
func (s *sim) transitions() string {
	var out []string
	for _, l := range s.log {
		if !strings.Contains(l, " sends ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func (s *sim) check(want string) {
	s.t.Helper()
	got := s.transitions()
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(want), "\n") {
		lines = append(lines, strings.TrimSpace(l))
	}
	want = strings.Join(lines, "\n")
	if got != want {
		s.t.Errorf("transitions:\n%s\nwant:\n%s\nfull log:\n%s", got, want, strings.Join(s.log, "\n"))
	}
}

func (s *sim) roles() string {
	var out []string
	for _, n := range s.nodes {
		out = append(out, n.name+"="+n.m.Role().String())
	}
	return strings.Join(out, " ")
}

func TestElectionByPriority(t *testing.T) {
	s := newSim(t)
	a := s.add("a", "10.0.0.1", 100, nil)
	b := s.add("b", "10.0.0.2", 200, nil)
	s.start(a)
	s.start(b)
	s.run(10 * time.Second)
	// b's master down interval, 3s + 56/256 s, is shorter than a's.
	s.check(`
		0s a init -> backup: started
		0s b init -> backup: started
		3.21875s b backup -> master: master down timer expired
	`)
	if got := s.roles(); got != "a=backup b=master" {
		t.Errorf("roles %s", got)
	}
	if addr, prio := a.m.MasterAddr(); addr != b.m.cfg.Self || prio != 200 {
		t.Errorf("a sees master %v priority %d", addr, prio)
	}
}

func TestMasterFailsBackupTakesOver(t *testing.T) {
	s := newSim(t)
	a := s.add("a", "10.0.0.1", 100, func(c *MachineConfig) { c.Interval = 10 })
	b := s.add("b", "10.0.0.2", 200, func(c *MachineConfig) { c.Interval = 10 })
	s.start(a)
	s.start(b)
	s.run(time.Second)
	// b became master at 321.875 ms and advertised every 100 ms; the
	// last advertisement before the failure was at 921.875 ms.
	b.up = false
	s.run(2 * time.Second)
	s.check(`
		0s a init -> backup: started
		0s b init -> backup: started
		321.875ms b backup -> master: master down timer expired
		1.2828125s a backup -> master: master down timer expired
	`)
	// 921.875 ms + 300 ms + 156/256 * 100 ms.
	if want := 921875*time.Microsecond + MasterDownInterval(100, 10); want != 1282812500 {
		t.Errorf("expected takeover %v", want)
	}
}

func TestEqualPriorityHigherAddressWins(t *testing.T) {
	for _, c := range []struct {
		self, peer string
		want       Role
	}{
		{"10.0.0.1", "10.0.0.2", Backup},
		{"10.0.0.2", "10.0.0.1", Master},
		{"fe80::1", "fe80::2", Backup},
		{"fe80::2", "fe80::1", Master},
		{"10.0.0.9", "10.0.0.10", Backup},
	} {
		m, err := NewMachine(MachineConfig{Self: netip.MustParseAddr(c.self), Priority: 100, Interval: 100})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(t0)
		m.Expire(m.Deadline())
		st := m.Receive(t0.Add(time.Millisecond), netip.MustParseAddr(c.peer), Packet{Priority: 100, Interval: 100})
		if m.Role() != c.want {
			t.Errorf("%s seeing %s of equal priority: %v, want %v", c.self, c.peer, m.Role(), c.want)
		}
		// The winner advertises at once and announces again.
		if (st.Transition != nil) != (c.want == Backup) || st.Send != (c.want == Master) || (st.Reassert != "") != (c.want == Master) {
			t.Errorf("%s seeing %s: step %+v", c.self, c.peer, st)
		}
	}
}

func TestMasterIgnoresLowerPriority(t *testing.T) {
	m, _ := NewMachine(MachineConfig{Self: netip.MustParseAddr("10.0.0.1"), Priority: 100, Interval: 100, StartAsMaster: true})
	m.Start(t0)
	m.Expire(m.Deadline())
	t0 := m.Deadline().Add(-time.Second)
	// Another master of lower priority: this one stays master,
	// advertises at once and announces its addresses again.
	st := m.Receive(t0, netip.MustParseAddr("10.0.0.2"), Packet{Priority: 99, Interval: 100})
	if st != (Step{Send: true, SendPriority: 100, Reassert: "master 10.0.0.2 of priority 99 advertises too"}) || m.Role() != Master {
		t.Errorf("lower priority: step %+v role %v", st, m.Role())
	}
	// A resigning peer makes the master advertise at once, so that the
	// backups' skew timers give way to it.
	st = m.Receive(t0.Add(50*time.Millisecond), netip.MustParseAddr("10.0.0.2"), Packet{Priority: 0, Interval: 100})
	if !st.Send || st.SendPriority != 100 || st.Reassert != "" || m.Deadline() != t0.Add(1050*time.Millisecond) {
		t.Errorf("priority 0: step %+v deadline %v", st, m.Deadline().Sub(t0))
	}
}

func TestPreemption(t *testing.T) {
	for _, preempt := range []bool{true, false} {
		t.Run(fmt.Sprint("preempt=", preempt), func(t *testing.T) {
			s := newSim(t)
			a := s.add("a", "10.0.0.1", 100, nil)
			b := s.add("b", "10.0.0.2", 200, func(c *MachineConfig) { c.Preempt = preempt })
			s.start(a)
			s.run(5 * time.Second)
			s.start(b)
			s.run(20 * time.Second)
			if preempt {
				// a is master from 3.609375 s and advertises each second;
				// b starts at 5 s, discards a's advertisements and takes
				// over after its master down interval.
				s.check(`
					0s a init -> backup: started
					3.609375s a backup -> master: master down timer expired
					5s b init -> backup: started
					8.21875s b backup -> master: preempting master 10.0.0.1 of priority 100
					8.21875s a master -> backup: advertisement from 10.0.0.2 with priority 200
				`)
			} else {
				s.check(`
					0s a init -> backup: started
					3.609375s a backup -> master: master down timer expired
					5s b init -> backup: started
				`)
			}
		})
	}
}

func TestPreemptDelay(t *testing.T) {
	s := newSim(t)
	a := s.add("a", "10.0.0.1", 100, nil)
	b := s.add("b", "10.0.0.2", 200, func(c *MachineConfig) { c.PreemptDelay = 5 * time.Second })
	s.start(a)
	s.run(4 * time.Second)
	s.start(b)
	s.run(20 * time.Second)
	// a advertises at 4.609375 s and each second after; b accepts those
	// until 9.609375 s (5 s after the first), discards the one then, and
	// its timer, armed at 8.609375 s, fires 3.21875 s later.
	s.check(`
		0s a init -> backup: started
		3.609375s a backup -> master: master down timer expired
		4s b init -> backup: started
		11.828125s b backup -> master: preempting master 10.0.0.1 of priority 100
		11.828125s a master -> backup: advertisement from 10.0.0.2 with priority 200
	`)
}

func TestPreemptDelayResetsOnHigherMaster(t *testing.T) {
	m, _ := NewMachine(MachineConfig{Self: netip.MustParseAddr("10.0.0.1"), Priority: 100, Interval: 100, Preempt: true, PreemptDelay: 2 * time.Second})
	m.Start(t0)
	low, high := Packet{Priority: 50, Interval: 100}, Packet{Priority: 150, Interval: 100}
	peer := netip.MustParseAddr("10.0.0.2")
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	m.Receive(at(1), peer, low)  // the delay starts: until 3 s
	m.Receive(at(2), peer, high) // a master of higher priority resets it
	m.Receive(at(3), peer, low)  // starts again: until 5 s
	m.Receive(at(4), peer, low)
	if m.Deadline() != at(4).Add(MasterDownInterval(100, 100)) {
		t.Errorf("advertisement at 4 s discarded: deadline %v", m.Deadline().Sub(t0))
	}
	m.Receive(at(5), peer, low)
	if m.Deadline() != at(4).Add(MasterDownInterval(100, 100)) {
		t.Errorf("advertisement at 5 s accepted: deadline %v", m.Deadline().Sub(t0))
	}
	if st := m.Expire(m.Deadline()); st.Transition == nil || st.Transition.To != Master {
		t.Errorf("no takeover: %+v", st)
	}
}

func TestPriorityChange(t *testing.T) {
	s := newSim(t)
	a := s.add("a", "10.0.0.1", 100, nil)
	b := s.add("b", "10.0.0.2", 200, nil)
	s.start(a)
	s.start(b)
	s.run(5 * time.Second)
	// Tracking lowers b below a: b advertises 50 at once, a discards it
	// and every later one, and takes over a master down interval after
	// the last advertisement it accepted (4.21875 s + 3.609375 s).
	st, err := b.m.SetPriority(s.now, 50)
	if err != nil || !st.Send || st.SendPriority != 50 {
		t.Fatalf("SetPriority: %+v, %v", st, err)
	}
	s.apply(b, st)
	s.run(12 * time.Second)
	// b's priority comes back: as a preempting backup it discards a's
	// advertisements from then on, and its timer, armed at 11.828125 s
	// with priority 50's master down interval (3.8046875 s), fires.
	st, _ = b.m.SetPriority(s.now, 200)
	s.apply(b, st)
	s.run(20 * time.Second)
	s.check(`
		0s a init -> backup: started
		0s b init -> backup: started
		3.21875s b backup -> master: master down timer expired
		7.828125s a backup -> master: preempting master 10.0.0.2 of priority 50
		7.828125s b master -> backup: advertisement from 10.0.0.1 with priority 100
		15.6328125s b backup -> master: preempting master 10.0.0.1 of priority 100
		15.6328125s a master -> backup: advertisement from 10.0.0.2 with priority 200
	`)
	if _, err := b.m.SetPriority(s.now, 0); err == nil {
		t.Error("SetPriority(0) accepted")
	}
	if st, _ := b.m.SetPriority(s.now, 200); st != (Step{}) {
		t.Errorf("SetPriority to the same priority: %+v", st)
	}
}

func TestResign(t *testing.T) {
	s := newSim(t)
	a := s.add("a", "10.0.0.1", 100, func(c *MachineConfig) { c.Interval = 10 })
	b := s.add("b", "10.0.0.2", 200, func(c *MachineConfig) { c.Interval = 10 })
	s.start(a)
	s.start(b)
	s.run(time.Second)
	st := b.m.Resign(s.now, "draining")
	if !st.Send || st.SendPriority != 0 {
		t.Fatalf("resign: %+v", st)
	}
	s.apply(b, st)
	s.run(2 * time.Second)
	// a takes over after its skew time, 156/256 of 100 ms. Then b comes
	// back and, started again, preempts a at its first advertisement
	// rather than at its master down timer: the roles are as before.
	s.start(b)
	s.run(3 * time.Second)
	s.check(`
		0s a init -> backup: started
		0s b init -> backup: started
		321.875ms b backup -> master: master down timer expired
		1s b master -> init: draining
		1.0609375s a backup -> master: master 10.0.0.2 resigned (priority 0)
		2s b init -> backup: started
		2.0609375s b backup -> master: preempting master 10.0.0.1 of priority 100
		2.0609375s a master -> backup: advertisement from 10.0.0.2 with priority 200
	`)
	if st := a.m.Resign(s.now, "stop"); st.Send || st.Transition == nil || st.Transition.To != Init {
		t.Errorf("backup resigns: %+v", st)
	}
	if st := a.m.Resign(s.now, "stop"); st != (Step{}) {
		t.Errorf("resign in init: %+v", st)
	}
}

func TestAddressOwnerAndStartAsMaster(t *testing.T) {
	s := newSim(t)
	a := s.add("a", "10.0.0.1", 255, func(c *MachineConfig) { c.Preempt = false })
	b := s.add("b", "10.0.0.2", 100, func(c *MachineConfig) { c.StartAsMaster = true; c.PreemptDelay = time.Minute })
	c := s.add("c", "10.0.0.3", 50, func(c *MachineConfig) { c.StartAsMaster = true })
	d := s.add("d", "10.0.0.4", 150, func(c *MachineConfig) { c.StartAsMaster = true })
	s.start(c)
	s.run(3 * time.Second)
	s.start(b)
	s.run(5 * time.Second)
	s.start(a)
	s.run(6 * time.Second)
	s.start(d)
	s.run(9 * time.Second)
	// c, alone, takes the addresses back after one interval and its skew
	// (not a master down interval); b, started as master while c of
	// lower priority serves, preempts it at its first advertisement,
	// without the preempt delay; the owner takes over at once; and d,
	// started as master while the owner serves, stays a backup.
	s.check(`
		0s c init -> backup: started; master when it stopped, it takes the addresses back unless a master of higher priority speaks
		1.8046875s c backup -> master: master when it stopped, and no master of higher priority spoke
		3s b init -> backup: started; master when it stopped, it takes the addresses back unless a master of higher priority speaks
		3.8046875s b backup -> master: master when it stopped; preempting master 10.0.0.3 of priority 50
		3.8046875s c master -> backup: advertisement from 10.0.0.2 with priority 100
		5s a init -> master: address owner (priority 255)
		5s b master -> backup: advertisement from 10.0.0.1 with priority 255
		6s d init -> backup: started; master when it stopped, it takes the addresses back unless a master of higher priority speaks
	`)
	if got := s.roles(); got != "a=master b=backup c=backup d=backup" {
		t.Errorf("roles %s", got)
	}
}

func TestBackupLearnsMasterInterval(t *testing.T) {
	m, _ := NewMachine(MachineConfig{Self: netip.MustParseAddr("10.0.0.1"), Priority: 100, Interval: 100})
	m.Start(t0)
	peer := netip.MustParseAddr("10.0.0.2")
	m.Receive(t0, peer, Packet{Priority: 200, Interval: 10})
	if got, want := m.Deadline(), t0.Add(MasterDownInterval(100, 10)); got != want {
		t.Errorf("deadline %v, want %v", got.Sub(t0), want.Sub(t0))
	}
	// Interval 0 would make the master down interval zero: ignored.
	if st := m.Receive(t0.Add(time.Millisecond), peer, Packet{Priority: 200, Interval: 0}); st != (Step{}) || m.Deadline() != t0.Add(MasterDownInterval(100, 10)) {
		t.Errorf("interval 0 changed the timer: %v", m.Deadline().Sub(t0))
	}
	if st := m.Expire(t0.Add(MasterDownInterval(100, 10) - 1)); st != (Step{}) {
		t.Errorf("fired early: %+v", st)
	}
	if st := m.Expire(t0.Add(MasterDownInterval(100, 10))); st.Transition == nil || !st.Send {
		t.Errorf("did not fire: %+v", st)
	}
	// A master advertises at its own interval, not the one it learned.
	if got, want := m.Deadline(), t0.Add(MasterDownInterval(100, 10)+time.Second); got != want {
		t.Errorf("advert deadline %v, want %v", got.Sub(t0), want.Sub(t0))
	}
	if slices.Contains([]Role{Init, Backup}, m.Role()) {
		t.Errorf("role %v", m.Role())
	}
}

// TestBackupBoundsMasterInterval: a backup adopts the master's interval
// up to MaxIntervalFactor times its own, so that one advertisement of
// interval 4095 cannot push its master down timer minutes out.
func TestBackupBoundsMasterInterval(t *testing.T) {
	self, peer := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	m, _ := NewMachine(MachineConfig{Self: self, Priority: 100, Interval: 100})
	m.Start(t0)
	for _, c := range []struct{ advertised, counted uint16 }{
		{MaxInterval, 200}, {201, 200}, {200, 200}, {150, 150}, {100, 100}, {10, 10},
	} {
		m.Receive(t0, peer, Packet{Priority: 255, Interval: c.advertised})
		if got, want := m.Deadline(), t0.Add(MasterDownInterval(100, c.counted)); got != want {
			t.Errorf("advertised %d cs: master down in %v, want %v", c.advertised, got.Sub(t0), want.Sub(t0))
		}
	}
	// A master that yields to one of higher priority, too.
	m, _ = NewMachine(MachineConfig{Self: self, Priority: 100, Interval: 100})
	m.Start(t0)
	at := t0.Add(MasterDownInterval(100, 100))
	if st := m.Expire(at); st.Transition == nil || st.Transition.To != Master {
		t.Fatalf("no takeover: %+v", st)
	}
	if st := m.Receive(at, peer, Packet{Priority: 255, Interval: MaxInterval}); st.Transition == nil || st.Transition.To != Backup {
		t.Fatalf("master stayed: %+v", st)
	}
	if got, want := m.Deadline(), at.Add(MasterDownInterval(100, 200)); got != want {
		t.Errorf("master down in %v, want %v", got.Sub(at), want.Sub(at))
	}
	if got := MasterDownInterval(100, AdoptedInterval(100, MaxInterval)); got > 10*time.Second {
		t.Errorf("bounded master down interval %v", got)
	}
}

// TestCauses checks the one-word cause of each kind of transition.
func TestCauses(t *testing.T) {
	peer := netip.MustParseAddr("10.0.0.2")
	m, _ := NewMachine(MachineConfig{Self: netip.MustParseAddr("10.0.0.1"), Priority: 100, Interval: 100, Preempt: true})
	var got []Cause
	note := func(st Step) {
		if st.Transition != nil {
			got = append(got, st.Transition.Cause)
		}
	}
	note(m.Start(t0))
	note(m.Expire(m.Deadline()))
	now := m.Deadline()
	note(m.Receive(now, peer, Packet{Priority: 200, Interval: 100}))
	note(m.Receive(now, peer, Packet{Priority: 0, Interval: 100}))
	note(m.Expire(m.Deadline()))
	now = m.Deadline()
	note(m.Receive(now, peer, Packet{Priority: 200, Interval: 100}))
	for i := 0; i < 3; i++ {
		// A master of lower priority: discarded, the timer fires.
		note(m.Receive(now, peer, Packet{Priority: 50, Interval: 100}))
	}
	note(m.Expire(m.Deadline()))
	note(m.Resign(m.Deadline(), "stop"))
	want := []Cause{CauseStart, CauseMasterDown, CauseHigherPriority, CausePeerResigned, CauseHigherPriority, CausePreempt, CauseResign}
	if !slices.Equal(got, want) {
		t.Errorf("causes %v, want %v", got, want)
	}
}

// TestLateTimer checks that a takeover says how late its master down
// timer was handled, and that other transitions say nothing.
func TestLateTimer(t *testing.T) {
	m, _ := NewMachine(MachineConfig{Self: netip.MustParseAddr("10.0.0.1"), Priority: 100, Interval: 10})
	if st := m.Start(t0); st.Transition == nil || st.Transition.Late != 0 {
		t.Fatalf("start: %+v", st.Transition)
	}
	due := m.Deadline()
	st := m.Expire(due.Add(42 * time.Millisecond))
	if st.Transition == nil || st.Transition.To != Master {
		t.Fatalf("no takeover: %+v", st)
	}
	if st.Transition.Late != 42*time.Millisecond {
		t.Errorf("late %v, want 42ms", st.Transition.Late)
	}
	m2, _ := NewMachine(MachineConfig{Self: netip.MustParseAddr("10.0.0.1"), Priority: 100, Interval: 10})
	m2.Start(t0)
	if st := m2.Expire(m2.Deadline()); st.Transition == nil || st.Transition.Late != 0 {
		t.Errorf("on time: %+v", st.Transition)
	}
}

// TestRejoinPreemptsAtOnce: a router that starts again after a fault
// (its link back) preempts a master of lower priority at the first
// advertisement it hears, not at its master down timer; not with a
// preempt delay, nor without preempt, nor at the first start, nor when
// the first master it hears is of higher priority.
func TestRejoinPreemptsAtOnce(t *testing.T) {
	self, low, high := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	adv := func(p uint8) Packet { return Packet{Priority: p, Interval: 10} }
	for _, c := range []struct {
		name   string
		cfg    func(*MachineConfig)
		faulty bool
		first  netip.Addr
		prio   uint8
		want   string
	}{
		{"rejoin", nil, true, low, 100, "preempting master 10.0.0.2 of priority 100"},
		{"first start", nil, false, low, 100, ""},
		{"preempt delay", func(c *MachineConfig) { c.PreemptDelay = time.Second }, true, low, 100, ""},
		{"no preempt", func(c *MachineConfig) { c.Preempt = false }, true, low, 100, ""},
		{"equal priority", nil, true, low, 200, ""},
		{"higher first", nil, true, high, 250, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := MachineConfig{Self: self, Priority: 200, Interval: 10, Preempt: true}
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			m, err := NewMachine(cfg)
			if err != nil {
				t.Fatal(err)
			}
			m.Start(at(0))
			if c.faulty {
				m.Expire(at(400))
				m.Fault(at(500), "interface down")
				m.Start(at(1000))
			}
			st := m.Receive(at(1050), c.first, adv(c.prio))
			got := ""
			if st.Transition != nil {
				got = st.Transition.Reason
				if st.Transition.To != Master || st.Transition.Cause != CausePreempt || !st.Send || st.SendPriority != 200 {
					t.Errorf("step %+v", st)
				}
			}
			if got != c.want {
				t.Fatalf("transition %q, want %q", got, c.want)
			}
			if got == "" && m.Role() != Backup {
				t.Errorf("role %v", m.Role())
			}
		})
	}
}

// TestRejoinCatchUp: with RejoinDelay, a router that starts again accepts
// a master of lower priority until the delay has passed (its master down
// timer re-armed by each advertisement), then preempts it at the first
// advertisement after it; a master that falls silent meanwhile is taken
// over from at the master down timer, as ever. The first start keeps
// RFC 5798's rules.
func TestRejoinCatchUp(t *testing.T) {
	self, low := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	adv := Packet{Priority: 100, Interval: 10}
	rejoined := func(t *testing.T) *Machine {
		t.Helper()
		m, err := NewMachine(MachineConfig{Self: self, Priority: 200, Interval: 10, Preempt: true, RejoinDelay: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(at(0))
		m.Expire(at(400))
		m.Fault(at(500), "interface down")
		m.Start(at(1000))
		return m
	}
	t.Run("preempts after the delay", func(t *testing.T) {
		m := rejoined(t)
		for ms := 1050; ms < 2000; ms += 100 {
			if st := m.Receive(at(ms), low, adv); st.Transition != nil || m.Role() != Backup {
				t.Fatalf("at %d ms: %+v, role %v: preempted during the catch-up", ms, st.Transition, m.Role())
			}
			if a, p := m.MasterAddr(); a != low || p != 100 {
				t.Fatalf("at %d ms: master %v %d, want the peer accepted", ms, a, p)
			}
			if dl := m.Deadline(); !dl.After(at(ms + 300)) {
				t.Fatalf("at %d ms: master down timer %v not re-armed", ms, dl)
			}
		}
		st := m.Receive(at(2050), low, adv)
		if st.Transition == nil || st.Transition.To != Master || st.Transition.Cause != CausePreempt {
			t.Fatalf("after the delay: %+v, want a preemption", st.Transition)
		}
	})
	t.Run("silent master", func(t *testing.T) {
		m := rejoined(t)
		m.Receive(at(1050), low, adv)
		dl := m.Deadline()
		if !dl.Before(at(2000)) {
			t.Fatalf("master down timer at %v, beyond the catch-up", dl)
		}
		if st := m.Expire(dl); st.Transition == nil || st.Transition.To != Master || st.Transition.Cause != CauseMasterDown {
			t.Fatalf("silent master: %+v", st.Transition)
		}
	})
	t.Run("first start", func(t *testing.T) {
		m, err := NewMachine(MachineConfig{Self: self, Priority: 200, Interval: 10, Preempt: true, RejoinDelay: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(at(0))
		m.Receive(at(50), low, adv)
		if st := m.Expire(m.Deadline()); st.Transition == nil || st.Transition.To != Master {
			t.Fatalf("first start: %+v, want RFC 5798's takeover at the master down timer", st.Transition)
		}
	})
}

// TestSuspect: a backup asked to (MachineConfig.Suspect) reports its
// master suspect once after SuspectIntervals without an advertisement,
// again only after the next one, and takes over when the master down
// timer fires all the same; before it hears a master, as master, and
// without Suspect, it reports nothing.
func TestSuspect(t *testing.T) {
	master := netip.MustParseAddr("10.0.0.2")
	adv := Packet{Priority: 200, Interval: 10}
	newM := func(suspect bool) *Machine {
		m, err := NewMachine(MachineConfig{Self: netip.MustParseAddr("10.0.0.1"), Priority: 100, Interval: 10, Preempt: true, Suspect: suspect})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(t0)
		return m
	}
	down := MasterDownInterval(100, 10)
	m := newM(true)
	if got := m.Deadline(); !got.Equal(t0.Add(down)) {
		t.Errorf("before a master: deadline %v, want the master down timer", got.Sub(t0))
	}
	at := t0.Add(50 * time.Millisecond)
	m.Receive(at, master, adv)
	if got, want := m.Deadline(), at.Add(200*time.Millisecond); !got.Equal(want) {
		t.Fatalf("deadline %v after the advertisement, want %v", got.Sub(at), want.Sub(at))
	}
	st := m.Expire(m.Deadline())
	if !strings.Contains(st.Suspect, "10.0.0.2") || st.Transition != nil || st.Send {
		t.Fatalf("at 2 intervals: %+v", st)
	}
	if got := m.Deadline(); !got.Equal(at.Add(down)) {
		t.Errorf("after the suspicion: deadline %v, want the master down timer", got.Sub(at))
	}
	if st := m.Expire(at.Add(250 * time.Millisecond)); st.Suspect != "" {
		t.Errorf("suspect twice without an advertisement: %+v", st)
	}
	at = at.Add(300 * time.Millisecond)
	m.Receive(at, master, adv)
	if st := m.Expire(at.Add(200 * time.Millisecond)); st.Suspect == "" {
		t.Errorf("no suspicion after the next advertisement's 2 intervals: %+v", st)
	}
	if st := m.Expire(at.Add(down)); st.Transition == nil || st.Transition.To != Master || st.Suspect != "" {
		t.Fatalf("master down: %+v", st)
	}
	if got := m.Deadline(); !got.Equal(at.Add(down).Add(100 * time.Millisecond)) {
		t.Errorf("master: deadline %v, want the next advertisement", got.Sub(at))
	}
	m = newM(false)
	m.Receive(t0, master, adv)
	if got := m.Deadline(); !got.Equal(t0.Add(down)) {
		t.Errorf("without Suspect: deadline %v, want the master down timer", got.Sub(t0))
	}
}
