package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipd/vipd/agent/ledger"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/conntrack"
	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/metrics"
	"github.com/vipd/vipd/monitor/status"
)

// Elector elects the node of a group of peers that serves the VIPs
// (VRRP: package ha/vrrp). The agent programs every service on every
// node, and announces the VIPs, and answers ARP and neighbour
// solicitations for them, only on the elected one: a takeover is one
// announcement, not a reprogramming.
type Elector interface {
	// Run runs the election until ctx ends.
	Run(ctx context.Context) error
	// SetPriority changes the node's priority (tracking).
	SetPriority(p uint8) error
	// Resign hands the VIPs over to a peer at once and stays out of the
	// election until Resume.
	Resign(ctx context.Context, reason string) error
	Resume()
}

// ElectorOptions are what the agent gives OpenElector.
type ElectorOptions struct {
	// HA is the configuration's [ha] section.
	HA config.HA
	// Addrs are the addresses to advertise: the configuration's VIPs of
	// one family, IPv4 when it has any, sorted, at most maxAdvertised.
	Addrs []netip.Addr
	// StartAsMaster says the node was master when it stopped and its
	// VIPs are still programmed: the elector takes them back after a
	// short listen unless a master of higher priority speaks.
	StartAsMaster bool
	// Report is called on every change of role.
	Report func(RoleChange)
	// Reassert is called when the master must announce its VIPs again
	// (it heard another master of lower priority), with why.
	Reassert func(reason string)
	// Suspect, when the elector can, is called on a backup whose master
	// has missed advertisements, with why: a takeover may follow.
	Suspect func(reason string)
}

// RoleChange is a change of the node's role that the elector reports.
type RoleChange struct {
	// Master says the node serves the VIPs.
	Master bool
	// Reason says why in words; Cause in one word of a small set, for
	// the transitions metric's label.
	Reason, Cause string
	// MasterAddr is the master's address when known: the peer's on
	// becoming a backup, the node's own on becoming master.
	MasterAddr netip.Addr
	// At is when the elector handled the event that caused the change
	// (its timer or a peer's packet), when it says; Late how long after
	// its deadline a timer that caused it was handled.
	At   time.Time
	Late time.Duration
	// MasterDown says the master down timer made the node master: its
	// master fell silent.
	MasterDown bool
}

// ha is the agent's side of high availability.
type ha struct {
	el  Elector
	cfg config.HA
	// master says the node serves: the loop's copy, which passes use.
	master bool
	// priority is the priority last given the elector.
	priority uint8

	// drained says an operator took the node out (DrainNode), fault
	// that its [ha] interface is down.
	drained, fault bool
	// gate passes announcements to the kernel's announcer only while
	// the node is master (nil without an announcer).
	gate *roleGate
	// retryErr is the last error of reannounce, logged once.
	retryErr string
	// last is the last change of role the loop took, at since.
	last  RoleChange
	since time.Time
	// tracker, when not nil, tracks the SNAT connections a peer
	// synchronized as the node becomes master, before it announces:
	// snat holds the services of the last pass that need it.
	tracker ConnTracker
	snat    atomic.Pointer[snatServices]
	// synced says a backup sync daemon brings a peer's connections to
	// this node (vipd's own, or one it found running): only then has a
	// takeover SNAT connections to track.
	synced atomic.Bool
	// term counts the changes of role, so that the late tracking of a
	// term as master stops when it ends.
	term atomic.Uint64
	// preread holds the SNAT connections read while the master was
	// suspect (suspect), reading says such a read runs, and suspected
	// is when the last suspicion came (Unix nanoseconds).
	preread   atomic.Pointer[preread]
	reading   atomic.Bool
	suspected atomic.Int64
	// readDone is closed when the read that reading says runs ends.
	readDone atomic.Pointer[chan struct{}]

	mu      sync.Mutex
	reports []roleReport
	changed chan struct{}
}

type roleReport struct {
	RoleChange
	// reassert says the master announced its VIPs again; late that
	// it tracked SNAT connections after it became master.
	reassert, late bool
	// changed counts the addresses announced or withdrawn, in took,
	// with err.
	changed int
	took    time.Duration
	err     error
	// adopting is how long tracking the SNAT connections took before
	// the announcements, and announced the time from the elector's event
	// (RoleChange.At) to the announcements sent: a takeover's path.
	adopting, announced time.Duration
	// adopted is what becoming master did to the tracking of the SNAT
	// connections a peer synchronized (nil when there was none to do).
	adopted *adoption
}

// report puts a change of role on the wire at once, through the role
// gate, and queues it for the main loop.
func (h *ha) report(c RoleChange) {
	term := h.term.Add(1)
	r := roleReport{RoleChange: c}
	s := h.snat.Load()
	partial := false
	start := time.Now()
	if !h.synced.Load() {
		// No peer's connections come to this node: the connection
		// table holds only its own, tracked already, and reading it
		// would hold the announcements back for nothing.
		s = nil
	}
	if c.Master && s != nil && c.MasterDown && h.reading.Load() {
		// The suspicion's read and tracking began before this
		// takeover: waiting for them costs less than starting over.
		if d := h.readDone.Load(); d != nil {
			t := time.NewTimer(adoptBudget)
			select {
			case <-*d:
			case <-t.C:
			}
			t.Stop()
		}
	}
	pre := h.preread.Swap(nil)
	if c.Master && s != nil {
		// Before the first packet: the clients and the backends reach
		// the node once it announces.
		var a adoption
		if h.fresh(pre, s, c) {
			// Read and tracked while the master was suspect: what it
			// synchronized before it fell silent. A pass right after
			// the announcements reads the table for anything since.
			a = pre.tracked
			a.listed, a.preread = pre.listed, true
			partial = true
		} else {
			// Within the budget, counting any wait for the
			// suspicion's read.
			a = adoptSNAT(h.tracker, s, start.Add(adoptBudget), conntrack.Replace)
			partial = a.partial
		}
		r.adopted = &a
		r.adopting = time.Since(start)
		start = time.Now()
	}
	if h.gate != nil {
		r.changed, r.err = h.gate.setRole(c.Master)
	}
	end := time.Now()
	r.took = end.Sub(start)
	if !c.At.IsZero() {
		r.announced = end.Sub(c.At)
	}
	h.queue(r)
	if c.Master && s != nil {
		go h.adoptLate(term, partial)
	}
}

// suspect reads and tracks, on a backup whose master has missed
// advertisements (the elector's suspicion), the synchronized SNAT
// connections of the connection table, in the background, replacing the
// entries the node holds for them: a takeover that follows announces
// without reading the table or tracking first, which a table of many
// connections would hold back. A master that fell silent synchronizes
// nothing more, so the read holds what a read at the takeover would;
// while the node is backup no packet of those connections reaches it,
// so its entries wait unused until it takes over, and a master that
// speaks again leaves them as a takeover's leftovers are left (the next
// takeover replaces them).
func (h *ha) suspect(string) {
	s := h.snat.Load()
	if s == nil || !h.synced.Load() || h.tracker == nil {
		return
	}
	start := time.Now()
	h.suspected.Store(start.UnixNano())
	if !h.reading.CompareAndSwap(false, true) {
		return
	}
	done := make(chan struct{})
	h.readDone.Store(&done)
	go func() {
		// reading is false before done closes: a takeover that waited
		// finds the read fresh.
		defer close(done)
		defer h.reading.Store(false)
		flows, listed, _, err := readSNAT(h.tracker, s, time.Time{})
		p := &preread{s: s, at: start, listed: listed, err: err}
		if err == nil {
			p.tracked = trackSNAT(h.tracker, flows, conntrack.Replace)
			p.err = p.tracked.err
		}
		h.preread.Store(p)
	}()
}

// preread is what suspect read and tracked.
type preread struct {
	tracked adoption
	// s are the services it was read for, at when the read began.
	s      *snatServices
	at     time.Time
	listed int
	err    error
}

// fresh says whether a takeover c may take p's tracking for its own
// instead of reading the table: p was read and tracked, whole and
// without error, for the services of now,
// since the last suspicion, which the master down timer that made c
// followed (a master that spoke again in between, and fell silent once
// more, made a new suspicion and a new read).
func (h *ha) fresh(p *preread, s *snatServices, c RoleChange) bool {
	return p != nil && p.err == nil && p.s == s && c.MasterDown && !h.reading.Load() &&
		p.at.UnixNano() >= h.suspected.Load()
}

// adoptBudget bounds the tracking of SNAT connections before a takeover's
// announcement; a later pass tracks what it leaves.
const adoptBudget = 100 * time.Millisecond

// lateAdoptions are the times after becoming master at which the node
// tracks again the SNAT connections its peer synchronized: those whose
// synchronization was on its way at the takeover (the kernel sends it
// up to some 20 ms late; a master that comes back takes over from a peer
// that is serving). A backend's packet that came first was dropped, and
// is sent again after its retransmission timeout, 200 ms at the least:
// the first pass comes before that.
var lateAdoptions = []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, time.Second, 3 * time.Second}

// adoptLate tracks the synchronized SNAT connections again at each of
// lateAdoptions, while the node stays master in term: at once, too, when
// the pass before the announcement was partial.
func (h *ha) adoptLate(term uint64, partial bool) {
	start := time.Now()
	times := lateAdoptions
	if partial {
		times = append([]time.Duration{0}, times...)
	}
	for _, at := range times {
		time.Sleep(time.Until(start.Add(at)))
		s := h.snat.Load()
		if h.term.Load() != term || s == nil {
			return
		}
		if a := adoptSNAT(h.tracker, s, time.Time{}, conntrack.Keep); a.Created > 0 || a.Failed > 0 || a.err != nil {
			h.queue(roleReport{RoleChange: RoleChange{Master: true}, late: true, adopted: &a})
		}
	}
}

// reassert announces the master's VIPs again (it heard another master
// of lower priority), and queues that for the main loop.
func (h *ha) reassert(reason string) {
	r := roleReport{RoleChange: RoleChange{Master: true, Reason: reason}, reassert: true}
	if h.gate != nil {
		r.changed, r.err = h.gate.reassert()
	}
	h.queue(r)
}

func (h *ha) queue(r roleReport) {
	h.mu.Lock()
	h.reports = append(h.reports, r)
	h.mu.Unlock()
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// take returns the changes of role reported since the last call.
func (h *ha) take() []roleReport {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.reports
	h.reports = nil
	return r
}

// openHA starts the election when cfg asks for one.
func (a *Agent) openHA(cfg *config.Config) error {
	if !cfg.HA.Enabled() {
		return nil
	}
	if a.opts.OpenElector == nil {
		return fmt.Errorf("%s: [ha] mode = %q: this vipd has no elector", cfg.File, cfg.HA.Mode)
	}
	h := &ha{cfg: cfg.HA, priority: cfg.HA.Priority, changed: make(chan struct{}, 1), tracker: a.opts.ConnTracker}
	addrs := advertised(cfg)
	if len(addrs) == 0 {
		return fmt.Errorf("%s: [ha]: no VIP to advertise: high availability needs a service with a vip", cfg.File)
	}
	drained := a.nodeDrained(cfg)
	master := a.wasMaster(cfg) && !drained
	el, err := a.opts.OpenElector(ElectorOptions{HA: cfg.HA, Addrs: addrs, StartAsMaster: master, Report: h.report, Reassert: h.reassert, Suspect: h.suspect})
	if err != nil {
		return fmt.Errorf("[ha]: %w", err)
	}
	if master {
		// The elector listens before it takes the VIPs back: until it
		// reports, the node announces nothing, so that a restart never
		// takes the VIPs from a peer of higher priority. The kernel
		// keeps forwarding for the clients meanwhile.
		a.log.Info("high availability: master when it stopped; taking the VIPs back unless a master of higher priority speaks")
	}
	h.drained = drained
	h.el = el
	a.ha = h
	return nil
}

// maxAdvertised bounds the addresses an advertisement lists, so that it
// fits in one packet: the peers need not list the same ones (keepalived
// logs a difference and goes on).
const maxAdvertised = 64

// advertised returns the addresses the elector advertises for cfg.
func advertised(cfg *config.Config) []netip.Addr {
	set := map[netip.Addr]bool{}
	v4 := false
	for _, vs := range cfg.Spec.Services {
		if vs.VIP.IsValid() {
			set[vs.VIP] = true
			v4 = v4 || vs.VIP.Is4()
		}
	}
	var out []netip.Addr
	for _, a := range slices.SortedFunc(maps.Keys(set), netip.Addr.Compare) {
		if a.Is4() == v4 && len(out) < maxAdvertised {
			out = append(out, a)
		}
	}
	return out
}

// roleFile is the file in state_dir that records the node's role, so
// that a restarted node that was master starts as master.
const roleFile = "ha-role"

// wasMaster reports whether the node was master when it stopped, with
// on_stop = "keep" (its VIPs are still programmed).
func (a *Agent) wasMaster(cfg *config.Config) bool {
	if cfg.Daemon.OnStop != config.StopKeep {
		return false
	}
	b, err := os.ReadFile(filepath.Join(cfg.Daemon.StateDir, roleFile))
	return err == nil && strings.TrimSpace(string(b)) == "master"
}

// drainedFile is the file in state_dir whose presence says an operator
// drained the node (vipd drain --node).
const drainedFile = "ha-drained"

// nodeDrained reports whether the node was drained when it stopped.
func (a *Agent) nodeDrained(cfg *config.Config) bool {
	_, err := os.Stat(filepath.Join(cfg.Daemon.StateDir, drainedFile))
	return err == nil
}

// DrainNode takes the node out of service for its peers (on), or puts
// it back: with [ha] it leaves its virtual router, handing its VIPs to a
// peer at once, and stays a backup that never takes over; with [bgp] it
// withdraws its routes. A drained node stays out across restarts, until
// undrained.
func (a *Agent) DrainNode(ctx context.Context, on bool) error {
	var err error
	derr := a.do(ctx, func(ctx context.Context) { err = a.drainNode(ctx, on) })
	return cmpErr(err, derr)
}

func (a *Agent) drainNode(ctx context.Context, on bool) error {
	if a.bgp != nil {
		return a.drainBGP(ctx, on)
	}
	if a.ha == nil {
		return errors.New("this node has no [ha] section: no peer to hand its VIPs to")
	}
	if on == a.ha.drained {
		if on {
			return errors.New("the node is drained already")
		}
		return errors.New("the node is not drained")
	}
	path := filepath.Join(a.cfg.Daemon.StateDir, drainedFile)
	if on {
		if err := ledger.WriteFile(path, []byte("drained by vipd drain --node\n"), 0o640); err != nil {
			return fmt.Errorf("drain the node: %w", err)
		}
		if err := a.ha.el.Resign(ctx, "drained by the operator"); err != nil {
			os.Remove(path)
			return fmt.Errorf("drain the node: %w", err)
		}
		a.log.Info("high availability: node drained; a peer serves the VIPs")
	} else {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("undrain the node: %w", err)
		}
		if w, ok := a.ha.el.(carrierWatcher); !a.ha.fault || ok && w.WatchesCarrier() {
			// An elector that watches its interface takes part again
			// only once the interface is back.
			a.ha.el.Resume()
		}
		a.log.Info("high availability: node undrained; it takes part in the election again")
	}
	a.ha.drained = on
	a.m.HA(a.ha.master, a.priority(), "")
	a.stats.Invalidate()
	return nil
}

// priority is the priority the node advertises: 0 while drained.
func (a *Agent) priority() uint8 {
	if a.ha.drained {
		return 0
	}
	return a.ha.priority
}

// haStatus is the node's high availability for vipd status.
func (a *Agent) haStatus() *status.HA {
	if a.ha == nil {
		return nil
	}
	role := "backup"
	if a.ha.master {
		role = "master"
	}
	st := &status.HA{Role: role, VRID: a.ha.cfg.VRID, Priority: a.priority(), Configured: a.ha.cfg.Priority, Drained: a.ha.drained,
		Reason: a.ha.last.Reason, Since: a.ha.since}
	if a.ha.last.MasterAddr.IsValid() {
		st.Master = a.ha.last.MasterAddr.String()
	}
	return st
}

// recordRole records the node's role for the next start.
func (a *Agent) recordRole(master bool) {
	role := "backup"
	if master {
		role = "master"
	}
	if err := ledger.WriteFile(filepath.Join(a.cfg.Daemon.StateDir, roleFile), []byte(role+"\n"), 0o640); err != nil {
		a.log.Warn("high availability: cannot record the role", "err", err)
	}
}

// roleChanged takes the changes of role the elector reported, which the
// role gate has already put on the wire: it records the role, and
// counts and logs the change.
func (a *Agent) roleChanged() {
	for _, r := range a.ha.take() {
		if r.late {
			a.logAdoption(r.adopted, "high availability: SNAT connections synchronized late taken over")
			continue
		}
		if r.reassert {
			if r.err != nil {
				a.log.Error("high availability: announcing the VIPs again", "reason", r.Reason, "err", r.err)
			} else if r.changed > 0 {
				a.log.Info("high availability: VIPs announced again", "reason", r.Reason, "announced", r.changed)
			}
			continue
		}
		if r.Master == a.ha.master {
			continue
		}
		a.ha.master = r.Master
		a.ha.last, a.ha.since = r.RoleChange, time.Now()
		a.recordRole(r.Master)
		a.m.HA(r.Master, a.priority(), r.Cause)
		a.stats.Invalidate()
		role := "backup"
		if r.Master {
			role = "master"
		}
		args := []any{"role", role, "reason", r.Reason, "changed", r.changed, "took", r.took.Round(time.Microsecond)}
		if r.Master && r.announced > 0 {
			// The takeover's path: the elector's timer late by
			// timer_late, the SNAT connections tracked in
			// adopt_took, the announcements sent announced_in after
			// the elector's event.
			args = append(args, "timer_late", r.Late.Round(time.Microsecond), "adopt_took", r.adopting.Round(time.Microsecond),
				"announced_in", r.announced.Round(time.Microsecond))
		}
		a.log.Info("high availability: role changed", args...)
		if r.adopted != nil {
			a.logAdoption(r.adopted, "high availability: SNAT connections taken over")
		}
		if r.err != nil {
			// The next pass announces (or withdraws) what failed: the
			// reconciler sees it missing from the announcer.
			a.log.Error("high availability: announcements failed", "role", role, "err", r.err)
		}
	}
}

// reannounce retries, on a master, at every link message and every
// second, the announcements that failed on an uplink (one that was down
// or missing when the node took over): the neighbours on that uplink,
// such as NAT backends whose gateway is a floating address, follow the
// node as the uplink comes back rather than at the next resync. It logs
// an outcome once, not every second while an uplink stays down.
func (a *Agent) reannounce() {
	if a.ha.gate == nil {
		return
	}
	n, err := a.ha.gate.retry()
	switch {
	case n == 0:
		a.ha.retryErr = ""
	case err == nil:
		a.log.Info("high availability: VIPs announced on the uplinks that missed them", "announced", n)
		a.ha.retryErr = ""
	case err.Error() != a.ha.retryErr:
		a.log.Warn("high availability: announcing VIPs on every uplink", "addresses", n, "err", err)
		a.ha.retryErr = err.Error()
	}
}

// logAdoption logs what tracking the synchronized SNAT connections did.
func (a *Agent) logAdoption(ad *adoption, msg string) {
	a.m.HASNAT(metrics.SNATTakeover{Tracked: ad.Created, Existing: ad.Existing, Replaced: ad.Replaced, Failed: ad.Failed})
	a.log.Info(msg, "tracked", ad.Created, "tracked_already", ad.Existing, "replaced", ad.Replaced, "failed", ad.Failed, "took", ad.took.Round(time.Microsecond),
		"connections_read", ad.listed, "read_took", ad.read.Round(time.Microsecond), "tracked_on_suspicion", ad.preread)
	if ad.err != nil {
		a.log.Error("high availability: tracking SNAT connections", "err", ad.err)
	}
}

// linksChanged looks at the interfaces the node tracks, after a link
// message or at the periodic check: the [ha] interface and
// track_interfaces, the uplinks that missed announcements, and [bgp]
// track_interfaces.
func (a *Agent) linksChanged() {
	if a.ha != nil {
		if a.last != nil {
			a.track(a.last)
		}
		a.reannounce()
	}
	a.trackBGPLinks()
}

// track lowers the node's priority while a tracked failure lasts: a
// service with backends none of which serves (spec is the effective
// spec of the last pass), or a tracked interface that is down.
func (a *Agent) track(spec *lb.Spec) {
	if a.ha == nil {
		return
	}
	if a.ha.tracker != nil {
		a.ha.snat.Store(snatServicesOf(spec))
	}
	a.watchInterface()
	h := a.ha.cfg
	failures := 0
	if h.TrackBackends {
		for _, vs := range spec.Services {
			if len(vs.Backends) > 0 && !slices.ContainsFunc(vs.Backends, func(d lb.Destination) bool { return d.Weight > 0 }) {
				failures++
				break
			}
		}
	}
	if a.opts.LinkUp != nil {
		for _, name := range h.TrackInterfaces {
			if up, err := a.opts.LinkUp(name); err != nil || !up {
				failures++
			}
		}
	}
	p := int(h.Priority) - failures*int(h.TrackPriority)
	p = max(p, 1)
	if uint8(p) == a.ha.priority {
		return
	}
	a.log.Warn("high availability: priority changed", "priority", p, "configured", h.Priority, "tracked_failures", failures)
	a.ha.priority = uint8(p)
	a.m.HA(a.ha.master, a.priority(), "")
	a.stats.Invalidate()
	if err := a.ha.el.SetPriority(uint8(p)); err != nil {
		a.log.Error("high availability: set priority", "err", err)
	}
}

// watchInterface takes the node out of the election while the [ha]
// interface is down (or has no carrier), as keepalived's fault state
// does, and puts it back when the interface is up: it then starts as a
// backup, and preempts a peer of lower priority that took over, with a
// new announcement. Without this, a master whose link came back would
// go on believing it served, and the clients would stay with the peer
// that yielded to it. It runs at every link message (Options.WatchLinks)
// and every second. The elector watches the interface too (the VRRP
// router by its own link messages, every second, and on every
// advertisement that fails): it stands back on its own while the
// interface is missing or cannot send, and opens its socket again when
// the interface is created again with a new index, which a check that
// misses a quick ifdown/ifup cannot see; the two stand-backs compose
// (the router takes part again only when neither holds).
//
// An elector that watches its interface's carrier itself (the VRRP
// router: carrierWatcher) is neither resigned nor resumed for it: it
// stands back and comes back by its own link messages, at once, where
// this check waits for the main loop (a pass in progress, or the next
// second) and held a returning master back by up to a second.
func (a *Agent) watchInterface() {
	if a.opts.LinkUp == nil {
		return
	}
	name := a.ha.cfg.Interface
	up, err := a.opts.LinkUp(name)
	fault := err != nil || !up
	if fault == a.ha.fault {
		return
	}
	a.ha.fault = fault
	w, ok := a.ha.el.(carrierWatcher)
	itself := ok && w.WatchesCarrier()
	if !fault {
		a.log.Info("high availability: interface up; the node takes part in the election again", "interface", name)
		if !a.ha.drained && !itself {
			a.ha.el.Resume()
		}
		return
	}
	a.log.Warn("high availability: interface down; the node stands back until it is up", "interface", name, "err", err)
	if a.ha.drained || itself {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.ha.el.Resign(ctx, "interface "+name+" down"); err != nil {
		a.log.Error("high availability: stand back", "err", err)
	}
}

// carrierWatcher is an elector that may watch its interface itself
// (vrrp.Router).
type carrierWatcher interface {
	WatchesCarrier() bool
}

// syncMaxLen is the master daemon's largest message: so small that each
// message holds one connection. The kernel sends a message once the next
// connection does not fit in it, or after two seconds: in messages of
// the interface's MTU (about forty connections), the connections of the
// last moments before a failure reach the backup up to two seconds late,
// or never; one per message, they leave with the next one (the next
// connection the master opens or updates). The cost is a datagram per
// synchronized connection instead of one per forty.
const syncMaxLen = 1

// syncer is the kernel's connection synchronization (kernel/ipvs).
type syncer interface {
	StartSync(ipvs.SyncDaemon) error
	SyncDaemons() ([]ipvs.SyncDaemon, error)
}

// startSync runs the kernel's connection-synchronization daemons, a
// master and a backup, on the [ha] sync interface, unless they run
// already with those settings (a restart). Both run on every node: the
// master's daemon sends only the connections the node handles, so the
// backup sends nothing until it takes over, and no daemon is switched at
// a takeover.
func (a *Agent) startSync(k lb.Kernel) error {
	h := a.ha.cfg
	s, ok := k.IPVS.(syncer)
	if h.SyncInterface == "" {
		// A backup daemon vipd did not start (ipvsadm --start-daemon,
		// another tool's) brings a peer's connections too: their SNAT
		// tracking is taken over as with vipd's own.
		if ok {
			running, err := s.SyncDaemons()
			if err != nil {
				// Without synchronization of its own vipd needs
				// none: it runs on, as a node no peer syncs to.
				a.log.Warn("high availability: cannot read the IPVS sync daemons; SNAT connections are not taken over", "err", err)
				return nil
			}
			if slices.ContainsFunc(running, func(d ipvs.SyncDaemon) bool { return d.State == ipvs.SyncBackup }) {
				a.ha.synced.Store(true)
				a.log.Info("high availability: an IPVS backup sync daemon runs that vipd did not start; a takeover tracks the SNAT connections it synchronizes")
			}
		}
		return nil
	}
	if !ok {
		return fmt.Errorf("[ha] sync_interface = %q: the kernel adapter cannot run IPVS connection synchronization", h.SyncInterface)
	}
	running, err := s.SyncDaemons()
	if err != nil {
		return err
	}
	id := h.SyncID
	if id == 0 {
		id = h.VRID
	}
	for _, state := range []ipvs.SyncState{ipvs.SyncMaster, ipvs.SyncBackup} {
		want := ipvs.SyncDaemon{State: state, Interface: h.SyncInterface, SyncID: id}
		if state == ipvs.SyncMaster {
			want.MaxLen = syncMaxLen
		}
		i := slices.IndexFunc(running, func(d ipvs.SyncDaemon) bool { return d.State == state })
		if i >= 0 {
			if got := running[i]; got.Interface != want.Interface || got.SyncID != want.SyncID {
				return fmt.Errorf("an IPVS %s sync daemon runs on %s with sync id %d, not on %s with %d: stop it (ipvsadm --stop-daemon %s)",
					state, got.Interface, got.SyncID, want.Interface, want.SyncID, state)
			}
			continue
		}
		if err := s.StartSync(want); err != nil {
			return err
		}
		a.log.Info("high availability: connection synchronization started", "role", state.String(), "interface", want.Interface, "sync_id", id)
	}
	a.ha.synced.Store(true)
	return nil
}

// gateHA puts the role gate in front of the kernel's announcer when the
// [ha] section is on (a.ha, see openHA): the node starts as a backup,
// with nothing on the wire until the elector says otherwise.
func (a *Agent) gateHA(k *lb.Kernel) error {
	if a.ha == nil || k.Announcer == nil {
		return nil
	}
	a.ha.gate = newRoleGate(k.Announcer)
	if _, err := a.ha.gate.setRole(false); err != nil {
		return fmt.Errorf("high availability: withdraw announcements: %w", err)
	}
	k.Announcer = a.ha.gate
	return nil
}

// startHA starts high availability once health checking runs: the
// kernel's connection synchronization, then the election, and resigns at
// once if an operator drained the node. roles is signalled on every
// change of role; stop ends the election and waits for it, and is not
// nil once the election runs, even with an error. Without [ha] it does
// nothing.
func (a *Agent) startHA(ctx context.Context, k lb.Kernel) (roles <-chan struct{}, stop func(), err error) {
	if a.ha == nil {
		return nil, nil, nil
	}
	if err := a.startSync(k); err != nil {
		return nil, nil, err
	}
	// The election outlives ctx: a stopping node resigns through it
	// (see resign) before it ends.
	ectx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
	electorDone := make(chan struct{})
	go func() {
		defer close(electorDone)
		if err := a.ha.el.Run(ectx); err != nil {
			a.log.Error("high availability: the election stopped; this node serves no VIP", "err", err)
		}
	}()
	stop = func() { stopElector(); <-electorDone }
	a.m.HA(a.ha.master, a.priority(), "")
	if a.ha.drained {
		a.log.Info("high availability: the node is drained (vipd undrain --node puts it back)")
		if err := a.ha.el.Resign(ctx, "drained by the operator"); err != nil {
			return a.ha.changed, stop, err
		}
	}
	return a.ha.changed, stop, nil
}
