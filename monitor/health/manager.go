package health

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for the zero fields of Options.
const (
	DefaultMaxInFlight = 1024
	DefaultStartSpread = time.Second
	DefaultRetain      = time.Minute
	DefaultSlack       = 10 * time.Millisecond
	// MaxSlack bounds the slack that a zero Options.Slack adapts to.
	MaxSlack = 50 * time.Millisecond
)

// slackShare is the share of the shortest interval in use that a zero
// Options.Slack lets a probe start late: 1/slackShare of it.
const slackShare = 20

// Transition reports that a backend of a service changed state.
type Transition struct {
	Service string
	Backend netip.AddrPort
	State   State
	At      time.Time
	// Err is the failure that took the backend down; nil when it came up.
	Err error
}

// Options configure a Manager.
type Options struct {
	// Logger receives a line per backend transition; nil discards.
	Logger *slog.Logger
	// Clock is the time source; nil means SystemClock.
	Clock Clock
	// MaxInFlight bounds the probes running at once; zero means
	// DefaultMaxInFlight. When it is reached, due checks wait in order of
	// their due time. It should be at least the number of checks times
	// timeout/interval, what every backend timing out at once needs, or
	// a mass failure delays the checks of healthy backends.
	MaxInFlight int
	// StartSpread spreads the first probes of new checks uniformly over
	// this time (at most each check's interval), so that a cold start or
	// a large reload does not fire thousands of probes at once. Zero
	// means DefaultStartSpread; a negative value probes new checks at
	// once.
	StartSpread time.Duration
	// OnTransition, if set, is called once for every transition of a
	// backend, from one goroutine and in order. It should not block for
	// long (hand the event to a channel, say): later events wait for it,
	// although probes do not.
	OnTransition func(Transition)
	// NewProber builds a check's prober; nil means NewProber. Tests and
	// custom check types replace it.
	NewProber func(spec Spec, target netip.AddrPort) (Prober, error)
	// Seed seeds the jitter; zero means a random seed.
	Seed uint64
	// Slack is how late the scheduler may start a probe so that it
	// wakes once for the probes due within it rather than once for each:
	// it wakes at most once per Slack, and a probe starts at most Slack
	// after its due time (plus the time to hand it out). A wake-up of
	// the scheduler costs the runtime more than a probe to a nearby
	// backend costs the kernel, so at a few hundred probes a second
	// batching them saves a good part of the checker's CPU
	// (test/bench/results); a check's interval is seconds, and tens of
	// milliseconds late is nothing to it. The poller of tcp checks
	// times its probes out with the same slack: a timeout is seen at
	// most Slack after it passed. Zero means 1/20 of the shortest
	// interval of the checks in use, at least DefaultSlack and at most
	// MaxSlack (50 ms for checks every second); a negative value wakes
	// for every due time and deadline.
	Slack time.Duration
	// Retain is how long the state of a check that an Update removed is
	// kept for a later Update that asks for its target again, as the
	// Update that undoes a failed reload does; zero means DefaultRetain,
	// a negative value keeps nothing.
	Retain time.Duration
}

// Manager runs health checks: Update says which, Run runs them, and
// Status, Health and OnTransition report the results. Its methods are safe
// for concurrent use.
//
// Checks are shared: targets with the same probed address and the same
// Spec (after defaults) are one check, probed once per interval whatever
// number of services and backends use it.
//
// Health is a property of what is probed, so it survives Updates that do
// not change a check's target: its kind, probed address and dial options
// (mark, device, source). A check whose Spec is unchanged keeps its state
// and schedule. A check whose other settings change, its timing or what
// it asks (an http path, an expected status, a command), takes over the
// state and schedule of the check it replaces, and its next probe uses
// the new settings; the consecutive counts toward rise and fall carry
// over too, unless what it asks changed. A new check takes over from a
// check of the same target that asks the same question under other
// timing, or else from one that its backend used before the Update; only
// a check with neither, a new target, starts from its initial state. The
// checks an Update removes are remembered for Options.Retain, so an
// Update that brings them back (undoing a reload whose pass failed)
// finds their state too.
//
// One goroutine schedules all checks from a heap ordered by due time. It
// starts the probes of checks that can run on a poller (tcp checks, and
// plain http ones, on Linux) itself: a non-blocking connect that one
// epoll instance and its goroutine see to the end, timing it out from a
// heap of deadlines, with no goroutine, timer or context per probe (a
// half-open tcp check's probe is a SYN from a shared raw socket, whose
// reply the scheduler's next round reads, and which a round times out:
// the replies of a round's probes cost no wake-up of their own, and wait
// at most a slack). It
// hands the other checks to a pool of workers, which grows with demand
// and shrinks when idle: a waiting check costs a heap entry and no
// goroutine. At most MaxInFlight probes of either kind run at once.
//
// An http check with keep-alive holds one connection between its
// probes; the Manager closes it when an Update drops the check, and
// when Run returns.
type Manager struct {
	opts  Options
	log   *slog.Logger
	clock Clock
	jobs  chan *check // due checks, handed to idle workers
	// slots holds a token for each probe running, MaxInFlight at most.
	slots chan struct{}
	// sleeper is where Run's scheduler waits between rounds; nil when
	// Run is not running.
	sleeper atomic.Pointer[sleeperRef]
	evs     chan struct{}

	updateMu sync.Mutex // serializes Update

	mu     sync.Mutex
	rng    *rand.Rand
	checks map[checkKey]*check
	// removed holds the checks Updates removed in the last Retain, by
	// target, oldest first.
	removed   map[targetKey][]removedCheck
	queue     checkHeap
	backends  map[ref]*backend
	byService map[string][]netip.AddrPort
	pending   []Transition
	running   bool
	workers   int // worker goroutines alive
	// slack is the scheduler's (Options.Slack, or what its zero value
	// adapts to for the checks in use).
	slack time.Duration
	stats Stats
}

// Worker pool sizing: workers beyond the first minWorkers exit after
// workerIdle without work, so a burst of slow probes (a mass failure
// with long timeouts) does not leave a thousand goroutines behind.
const (
	minWorkers = 8
	workerIdle = 30 * time.Second
)

// check is one running check, shared by the backends whose targets it
// serves.
type check struct {
	timing
	id     checkID
	target netip.AddrPort
	prober Prober
	refs   []ref

	m    machine
	next time.Time // due time of the next (or running) probe
	// due is next as a number, set when c is queued, which orders the
	// queue faster than comparing times.
	due     time.Duration
	index   int // position in the queue, -1 when not queued
	stopped bool
}

// removedCheck is a check an Update removed at a time.
type removedCheck struct {
	*check
	at time.Time
}

// targetKey returns c's target.
func (c *check) targetKey() targetKey { return targetKey{addr: c.target, path: c.id.path} }

// timing is what the scheduler and the state machine need of a Spec,
// kept instead of the whole Spec to keep checks small.
type timing struct {
	kind              Kind
	interval, timeout time.Duration
	rise, fall        int
	jitter            float64
}

// timingOf returns the timing of s (with defaults), made safe to
// schedule even if s is invalid: an invalid check still runs, failing.
func timingOf(s Spec) timing {
	t := timing{kind: s.Kind, interval: s.Interval, timeout: s.Timeout, rise: s.Rise, fall: s.Fall, jitter: s.Jitter}
	t.interval = max(t.interval, MinInterval)
	if t.timeout <= 0 {
		t.timeout = DefaultTimeout
	}
	t.rise, t.fall = max(t.rise, 1), max(t.fall, 1)
	t.jitter = min(t.jitter, MaxJitter)
	return t
}

type ref struct {
	service string
	backend netip.AddrPort
}

// backend is the combined state of a service's backend's checks.
type backend struct {
	checks []*check
	state  State
	since  time.Time
}

// NewManager returns a Manager for opts. It probes nothing until Run.
func NewManager(opts Options) *Manager {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.StartSpread == 0 {
		opts.StartSpread = DefaultStartSpread
	}
	if opts.NewProber == nil {
		opts.NewProber = NewProber
	}
	if opts.Retain == 0 {
		opts.Retain = DefaultRetain
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Manager{
		opts:      opts,
		log:       opts.Logger,
		clock:     opts.Clock,
		jobs:      make(chan *check),
		slots:     make(chan struct{}, opts.MaxInFlight),
		evs:       make(chan struct{}, 1),
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		checks:    map[checkKey]*check{},
		removed:   map[targetKey][]removedCheck{},
		backends:  map[ref]*backend{},
		byService: map[string][]netip.AddrPort{},
		slack:     slackFor(opts.Slack, 0),
	}
}

// slackFor returns the scheduler's slack for the Options.Slack of opt,
// with minInterval the shortest interval of the checks (zero if none):
// opt itself if not zero, else minInterval/slackShare between
// DefaultSlack and MaxSlack.
func slackFor(opt, minInterval time.Duration) time.Duration {
	if opt != 0 {
		return opt
	}
	return min(max(minInterval/slackShare, DefaultSlack), MaxSlack)
}

// wanted is one check an Update asks for.
type wanted struct {
	spec   Spec
	target netip.AddrPort
	refs   []ref
	prober Prober
	id     checkID
	// broken says that prober fails with the error of an invalid spec
	// or of a prober that could not be built.
	broken bool
	// pred is the check whose state a new check takes over.
	pred *check
}

// Update replaces the set of targets. Unchanged checks carry on; checks
// no target asks for any more stop. A new check takes over the state and
// schedule of its predecessor, a check of the same target it replaces
// (see predecessor); without one it starts in its initial state with its
// first probe spread over Options.StartSpread. A backend whose combined
// state changes because of the update (a new, still down check, or a
// removed failing one) is reported as a transition.
//
// A target whose Spec is invalid, or whose prober cannot be built (an
// unreadable CA file, say), becomes a check that always fails with that
// error and starts from its initial state whatever it replaces, so a
// broken check never passes a backend that was not already up; Update
// returns all such errors joined. Validate specs when loading the
// configuration to reject them before they get here.
func (m *Manager) Update(targets []Target) error {
	m.updateMu.Lock()
	defer m.updateMu.Unlock()

	want := map[checkKey]*wanted{}
	var order []checkKey
	refKeys := map[ref][]checkKey{}
	var refOrder []ref
	var errs []error
	for _, t := range targets {
		spec := t.Spec.WithDefaults()
		target := spec.Target(t.Backend)
		key, id := keyOf(spec, target)
		r := ref{t.Service, t.Backend}
		w, ok := want[key]
		if !ok {
			w = &wanted{spec: spec, target: target, id: id}
			want[key] = w
			order = append(order, key)
			if err := t.Spec.Validate(); err != nil {
				err = fmt.Errorf("service %s backend %s: %s check of %s: %w", t.Service, t.Backend, spec.Kind, target, err)
				errs = append(errs, err)
				w.prober, w.broken = failing(err), true
			}
		}
		if !slices.Contains(w.refs, r) {
			w.refs = append(w.refs, r)
		}
		if _, ok := refKeys[r]; !ok {
			refOrder = append(refOrder, r)
		}
		if !slices.Contains(refKeys[r], key) {
			refKeys[r] = append(refKeys[r], key)
		}
	}

	// Build the probers of new checks outside the lock: it may read
	// files. Only Update changes the set of checks, and Updates are
	// serialized, so the set read here is still the set below.
	m.mu.Lock()
	var fresh []checkKey
	for _, key := range order {
		if _, ok := m.checks[key]; !ok {
			fresh = append(fresh, key)
		}
	}
	m.mu.Unlock()
	for _, key := range fresh {
		w := want[key]
		if w.prober != nil {
			continue // invalid spec
		}
		p, err := m.opts.NewProber(w.spec, w.target)
		if err != nil {
			r := w.refs[0]
			err = fmt.Errorf("service %s backend %s: %s check of %s: %w", r.service, r.backend, w.spec.Kind, w.target, err)
			errs = append(errs, err)
			p = failing(err)
			w.broken = true
		}
		w.prober = p
	}

	m.mu.Lock()
	now := m.clock.Now()
	m.prune(now)
	// Find the predecessors while the checks they may be are all there.
	// A removed check whose state a new one takes over has no more use;
	// the others are remembered.
	live := m.byAddr(fresh)
	taken := map[*check]bool{}
	for _, key := range fresh {
		w := want[key]
		if w.broken {
			continue
		}
		t := targetKey{addr: key.target, path: w.id.path}
		if w.pred = m.predecessor(t, w.id, w.refs, refKeys, live[key.target]); w.pred != nil {
			taken[w.pred] = true
		}
	}
	for c := range taken {
		m.forget(c)
	}
	var dropped []*check
	for key, c := range m.checks {
		if _, ok := want[key]; !ok {
			m.stop(c)
			dropped = append(dropped, c)
			if !taken[c] {
				m.retain(c, now)
			}
			delete(m.checks, key)
		}
	}
	for _, key := range order {
		w := want[key]
		c, ok := m.checks[key]
		if !ok {
			c = &check{timing: timingOf(w.spec), id: w.id, target: w.target, prober: w.prober, index: -1}
			if w.pred != nil {
				m.inherit(c, w.pred, now)
			} else {
				c.m = newMachine(w.spec.Initial, now)
				c.next = now.Add(m.startDelay(c.interval))
			}
			m.checks[key] = c
			heap.Push(&m.queue, c)
		}
		c.refs = w.refs
	}
	backends := make(map[ref]*backend, len(refKeys))
	byService := map[string][]netip.AddrPort{}
	for _, r := range refOrder {
		b := &backend{}
		for _, key := range refKeys[r] {
			b.checks = append(b.checks, m.checks[key])
		}
		state, since := combine(b.checks)
		if old, ok := m.backends[r]; ok {
			b.state, b.since = old.state, old.since
			if state != old.state {
				b.state, b.since = state, now
				m.transition(r, b, now)
			}
		} else {
			b.state, b.since = state, since
		}
		backends[r] = b
		byService[r.service] = append(byService[r.service], r.backend)
	}
	m.backends, m.byService = backends, byService
	var shortest time.Duration
	for _, c := range m.checks {
		if shortest == 0 || c.interval < shortest {
			shortest = c.interval
		}
	}
	m.slack = slackFor(m.opts.Slack, shortest)
	m.mu.Unlock()
	for _, c := range dropped {
		closeIdle(c)
	}
	m.poke()
	return errors.Join(errs...)
}

// stop takes c, which an Update removed, off the schedule; a probe of it
// that is running is not recorded. Called with mu held.
func (m *Manager) stop(c *check) {
	c.stopped = true
	if c.index >= 0 {
		heap.Remove(&m.queue, c.index)
	}
}

// closeIdle closes the connection c's prober keeps between probes, if
// it keeps one: when c is stopped (a probe in flight when it stopped
// gives its connection back after, so its end closes it again), and
// when Run returns.
func closeIdle(c *check) {
	if ic, ok := c.prober.(idleCloser); ok {
		ic.closeIdle()
	}
}

// retain remembers c, which an Update removed at now, for
// Options.Retain. Called with mu held.
func (m *Manager) retain(c *check, now time.Time) {
	if m.opts.Retain > 0 {
		t := c.targetKey()
		m.removed[t] = append(m.removed[t], removedCheck{c, now})
	}
}

// forget drops c from the removed checks remembered, if it is one. Called
// with mu held.
func (m *Manager) forget(c *check) {
	t := c.targetKey()
	cs, ok := m.removed[t]
	if !ok {
		return
	}
	cs = slices.DeleteFunc(cs, func(r removedCheck) bool { return r.check == c })
	if len(cs) == 0 {
		delete(m.removed, t)
	} else {
		m.removed[t] = cs
	}
}

// prune forgets the removed checks older than Options.Retain. Called with
// mu held.
func (m *Manager) prune(now time.Time) {
	for t, cs := range m.removed {
		cs = slices.DeleteFunc(cs, func(r removedCheck) bool { return now.Sub(r.at) > m.opts.Retain })
		if len(cs) == 0 {
			delete(m.removed, t)
		} else {
			m.removed[t] = cs
		}
	}
}

// byAddr returns the live checks that probe the addresses of fresh keys,
// by address, in the order of their keys: the candidates to be their
// predecessors. Called with mu held.
func (m *Manager) byAddr(fresh []checkKey) map[netip.AddrPort][]*check {
	if len(fresh) == 0 {
		return nil
	}
	keys := make(map[netip.AddrPort][]checkKey, len(fresh))
	for _, key := range fresh {
		keys[key.target] = nil
	}
	for key := range m.checks {
		if ks, ok := keys[key.target]; ok {
			keys[key.target] = append(ks, key)
		}
	}
	out := make(map[netip.AddrPort][]*check, len(keys))
	for addr, ks := range keys {
		slices.SortFunc(ks, func(a, b checkKey) int { return bytes.Compare(a.spec[:], b.spec[:]) })
		cs := make([]*check, len(ks))
		for i, k := range ks {
			cs[i] = m.checks[k]
		}
		out[addr] = cs
	}
	return out
}

// predecessor returns the check whose state a new check with id, asked
// for by refs, takes over, or nil if it has none and starts from its
// initial state. Called with mu held, before the Update removes any
// check; live are the live checks of the new check's address, in a fixed
// order, and refKeys the keys each backend asks for in the Update.
//
// A predecessor probes the same target, and either asks the same question
// (it differs in timing alone, and its result answers the new check's
// question: a shared check that one service re-timed, or a rollback to
// the settings of a check still running), or served one of refs, which no
// longer asks for it (the check of that backend was edited). The first
// kind comes first, being the better answer; live checks come before
// removed ones, whose state is older; among removed ones the last removed
// comes first. A check a backend keeps is no predecessor of another it
// gains: a second check of a backend is a new question, not an edit.
func (m *Manager) predecessor(t targetKey, id checkID, refs []ref, refKeys map[ref][]checkKey, live []*check) *check {
	var edited *check
	for _, c := range live {
		if c.id.path != t.path {
			continue
		}
		if c.id.question == id.question {
			return c
		}
		if edited == nil && m.served(c, refs, refKeys) {
			edited = c
		}
	}
	if edited != nil {
		return edited
	}
	for _, r := range slices.Backward(m.removed[t]) {
		if r.id.question == id.question {
			return r.check
		}
		if edited == nil && m.served(r.check, refs, refKeys) {
			edited = r.check
		}
	}
	return edited
}

// served reports whether c served one of refs and no longer does: whether
// that backend's check was edited away from c. Called with mu held.
func (m *Manager) served(c *check, refs []ref, refKeys map[ref][]checkKey) bool {
	for _, r := range refs {
		if !slices.Contains(c.refs, r) {
			continue
		}
		keeps := false
		for _, k := range refKeys[r] {
			if m.checks[k] == c {
				keeps = true
				break
			}
		}
		if !keeps {
			return true
		}
	}
	return false
}

// inherit gives c, a new check, the state of its predecessor p: its state
// and counts (the consecutive ones only if c asks the same question) and
// its schedule. A probe that p's schedule would have run already, or
// only after c's interval, is rescheduled within Options.StartSpread, as
// a new check's first is. Called with mu held.
func (m *Manager) inherit(c, p *check, now time.Time) {
	c.m = p.m
	if c.id.question != p.id.question {
		c.m.successes, c.m.failures = 0, 0
	}
	c.next = p.next
	if c.next.Before(now) || c.next.After(now.Add(c.interval)) {
		c.next = now.Add(m.startDelay(c.interval))
	}
}

// failing returns a prober that always fails with err.
func failing(err error) Prober {
	return ProberFunc(func(context.Context) error { return err })
}

// startDelay picks the delay of a new check's first probe. Called with mu
// held.
func (m *Manager) startDelay(interval time.Duration) time.Duration {
	spread := min(m.opts.StartSpread, interval)
	if spread <= 0 {
		return 0
	}
	return time.Duration(m.rng.Int64N(int64(spread)))
}

// interval picks the time to a check's next probe: its interval, with
// jitter. Called with mu held.
func (m *Manager) interval(t *timing) time.Duration {
	if t.jitter <= 0 {
		return t.interval
	}
	f := 1 + t.jitter*(2*m.rng.Float64()-1)
	return time.Duration(float64(t.interval) * f)
}

// combine returns the state of a backend with checks cs: up when every
// check is up, since the last one came up, or down since the first of its
// failing checks went down.
func combine(cs []*check) (State, time.Time) {
	state := Up
	var upSince, downSince time.Time
	for _, c := range cs {
		switch {
		case c.m.state == Up:
			if c.m.since.After(upSince) {
				upSince = c.m.since
			}
		case state == Up || c.m.since.Before(downSince):
			state, downSince = Down, c.m.since
		}
	}
	if state == Down {
		return Down, downSince
	}
	return Up, upSince
}

// failure returns the last error of a backend's first failing check.
func failure(cs []*check) error {
	for _, c := range cs {
		if c.m.state == Down {
			return c.m.lastError
		}
	}
	return nil
}

// transition logs and queues the event of b's change to its current
// state. Called with mu held.
func (m *Manager) transition(r ref, b *backend, now time.Time) {
	m.stats.Transitions++
	ev := Transition{Service: r.service, Backend: r.backend, State: b.state, At: now}
	if b.state == Down {
		ev.Err = failure(b.checks)
		if ev.Err != nil {
			m.log.Warn("backend down", "service", r.service, "backend", r.backend.String(), "err", ev.Err)
		} else {
			m.log.Warn("backend down", "service", r.service, "backend", r.backend.String(), "reason", "new check not yet passed")
		}
	} else {
		m.log.Info("backend up", "service", r.service, "backend", r.backend.String())
	}
	if m.opts.OnTransition == nil {
		return
	}
	m.pending = append(m.pending, ev)
	select {
	case m.evs <- struct{}{}:
	default:
	}
}

// poke wakes the scheduler to look at the queue again.
func (m *Manager) poke() {
	if s := m.sleeper.Load(); s != nil {
		s.wake()
	}
}

// sleeperRef holds a sleeper for an atomic.Pointer.
type sleeperRef struct{ sleeper }

// Run probes the checks until ctx ends, then waits for the probes in
// flight and returns nil. It may be called again after it returns.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.running {
		m.mu.Unlock()
		return errors.New("health manager is already running")
	}
	m.running = true
	m.mu.Unlock()

	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		m.mu.Lock()
		m.running = false
		checks := slices.Collect(maps.Values(m.checks))
		m.mu.Unlock()
		// No probe runs: the connections kept for the next are closed
		// (a Run after this one opens new ones).
		for _, c := range checks {
			closeIdle(c)
		}
	}()
	wg.Go(func() { m.dispatch(ctx) })

	p, err := newPoller()
	if err != nil {
		m.log.Warn("health checks run on goroutines, without a poller", "err", err)
	} else {
		// Before wg.Wait: closing ends the probes in flight.
		defer p.close()
		// The rounds below collect the replies of half-open probes
		// and time them out: no wake-up of the poller's own for them.
		p.drive()
	}

	sl := newSleeper(m.clock)
	m.sleeper.Store(&sleeperRef{sl})
	defer func() {
		m.sleeper.Store(nil)
		sl.close()
	}()
	// The sleeper wakes when ctx ends.
	defer context.AfterFunc(ctx, m.poke)()
	for {
		p.tend()
		due, next, now, slack := m.popDue()
		p.setSlack(slack)
		for i, c := range due {
			if !m.hand(ctx, &wg, p, c) {
				m.requeue(due[i:])
				p.flush()
				return nil
			}
		}
		if len(due) > 0 && p.usable() {
			// What the probes started together send together.
			p.flush()
		}
		if len(due) > 0 {
			// Handing them out may have taken a while: look again.
			continue
		}
		if p.pending() {
			// Half-open probes in flight: their replies wait for
			// the next round, at most a slack away.
			if at := now.Add(collectWait(slack)); next.IsZero() || at.Before(next) {
				next = at
			}
		}
		if slack > 0 && !next.IsZero() && next.Before(now.Add(slack)) {
			// Not again within the slack: the probes due by then
			// start together.
			next = now.Add(slack)
		}
		sl.sleep(ctx, next)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// hand waits for one of the MaxInFlight slots, then starts a due check's
// probe on p if it can run there, or else gives the check to an idle
// worker, or to a new one while there are fewer than MaxInFlight, or
// waits for a worker to be free. It returns false if ctx ended first.
func (m *Manager) hand(ctx context.Context, wg *sync.WaitGroup, p *poller, c *check) bool {
	if ctx.Err() != nil {
		// Probes that end at once requeue their checks at once: without
		// this the loop would start them again for ever.
		return false
	}
	select {
	case m.slots <- struct{}{}:
	default:
		// Every slot is taken: what the probes started already queued
		// must be sent, or their slots would free only at their
		// deadlines.
		p.flush()
		if !m.waitSlot(ctx, p) {
			return false
		}
	}
	if pp, ok := c.prober.(pollProber); ok && p.usable() && m.start(ctx, wg, p, c, pp) {
		return true
	}
	select {
	case m.jobs <- c:
		return true
	default:
	}
	m.mu.Lock()
	if m.workers < m.opts.MaxInFlight {
		m.workers++
		m.mu.Unlock()
		wg.Go(func() { m.work(ctx, c) })
		return true
	}
	m.mu.Unlock()
	select {
	case m.jobs <- c:
		return true
	case <-ctx.Done():
		<-m.slots
		return false
	}
}

// waitSlot waits for a free slot and takes it, tending p's half-open
// probes meanwhile (whose ends free slots, and which nothing else tends
// while the scheduler waits here), and returns false if ctx ended first.
func (m *Manager) waitSlot(ctx context.Context, p *poller) bool {
	var tick <-chan time.Time
	if p.pending() {
		m.mu.Lock()
		slack := m.slack
		m.mu.Unlock()
		t := time.NewTicker(collectWait(slack))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case m.slots <- struct{}{}:
			return true
		case <-ctx.Done():
			return false
		case <-tick:
			p.tend()
		}
	}
}

// start starts a probe of c on p, which records its result when it ends,
// and reports whether c's probes can run on p.
func (m *Manager) start(ctx context.Context, wg *sync.WaitGroup, p *poller, c *check, pp pollProber) bool {
	// c.next changes only under mu while c is queued, never in flight.
	late := m.clock.Now().Sub(c.next)
	wg.Add(1)
	ok := pp.start(p, time.Now().Add(c.timeout), func(err error) {
		defer wg.Done()
		<-m.slots
		if ctx.Err() != nil || errors.Is(err, errPollerClosed) {
			// Shutting down, or the poller failed (and the check
			// runs on a worker now): the result says nothing about
			// the backend.
			m.requeue([]*check{c})
			return
		}
		if err != nil && (errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)) {
			err = fmt.Errorf("timed out after %s: %w", c.timeout, err)
		}
		m.record(c, err, late)
	})
	if !ok {
		wg.Done()
	}
	return ok
}

// work probes c, then every check handed to it, until ctx ends or it has
// been idle too long.
func (m *Manager) work(ctx context.Context, c *check) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for c != nil {
		m.probe(ctx, c)
		<-m.slots
		c = nil
		for c == nil {
			idle.Reset(workerIdle)
			select {
			case c = <-m.jobs:
			case <-ctx.Done():
				m.retire(true)
				return
			case <-idle.C:
				if m.retire(false) {
					return
				}
			}
		}
	}
}

// retire counts a worker out unless it is one of the minWorkers that stay
// (and so keep hand's wait for a free worker from waiting forever).
func (m *Manager) retire(force bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !force && m.workers <= minWorkers {
		return false
	}
	m.workers--
	return true
}

// popDue takes the checks due now off the queue, and returns them with the
// due time of the next check still queued (zero if none), the time it
// took them at, and the slack.
func (m *Manager) popDue() ([]*check, time.Time, time.Time, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	var due []*check
	for len(m.queue) > 0 && !m.queue[0].next.After(now) {
		due = append(due, heap.Pop(&m.queue).(*check))
	}
	m.stats.InFlight += len(due)
	if len(m.queue) == 0 {
		return due, time.Time{}, now, m.slack
	}
	return due, m.queue[0].next, now, m.slack
}

// requeue puts checks taken off the queue but not probed back on it.
func (m *Manager) requeue(cs []*check) {
	var stopped []*check
	m.mu.Lock()
	for _, c := range cs {
		m.stats.InFlight--
		if !c.stopped {
			heap.Push(&m.queue, c)
		} else {
			stopped = append(stopped, c)
		}
	}
	m.mu.Unlock()
	for _, c := range stopped {
		closeIdle(c)
	}
}

// probe runs one probe of c and records its result.
func (m *Manager) probe(ctx context.Context, c *check) {
	// c.next changes only under mu while c is queued, never in flight.
	late := m.clock.Now().Sub(c.next)
	pctx, cancel := context.WithTimeout(ctx, c.timeout)
	err := c.prober.Probe(pctx)
	if err != nil && errors.Is(pctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("timed out after %s: %w", c.timeout, err)
	}
	cancel()
	if ctx.Err() != nil {
		// Shutting down: the result says nothing about the backend.
		m.requeue([]*check{c})
		return
	}
	m.record(c, err, late)
}

// record feeds a probe's result to c's state machine, reports the
// transitions of the backends it serves, and schedules its next probe;
// late is how long after its due time the probe started.
func (m *Manager) record(c *check, err error, late time.Duration) {
	m.mu.Lock()
	now := m.clock.Now()
	m.stats.InFlight--
	if c.stopped {
		m.mu.Unlock()
		closeIdle(c)
		return
	}
	m.stats.Probes++
	m.stats.Lateness.observe(late)
	if err != nil {
		m.stats.Failures++
	}
	if c.m.observe(err, now, c.rise, c.fall) {
		for _, r := range c.refs {
			b := m.backends[r]
			if b == nil {
				continue
			}
			if state, _ := combine(b.checks); state != b.state {
				b.state, b.since = state, now
				m.transition(r, b, now)
			}
		}
	}
	iv := m.interval(&c.timing)
	c.next = c.next.Add(iv)
	if c.next.Before(now) {
		// The probe overran its interval (or the check waited for a
		// free slot): wait a whole interval from now.
		c.next = now.Add(iv)
	}
	heap.Push(&m.queue, c)
	first := c.index == 0
	m.mu.Unlock()
	if first {
		m.poke()
	}
}

// dispatch delivers queued transitions to OnTransition until ctx ends.
func (m *Manager) dispatch(ctx context.Context) {
	if m.opts.OnTransition == nil {
		return
	}
	for {
		m.mu.Lock()
		evs := m.pending
		m.pending = nil
		m.mu.Unlock()
		for _, ev := range evs {
			m.opts.OnTransition(ev)
		}
		select {
		case <-ctx.Done():
			return
		case <-m.evs:
		}
	}
}

// CheckStatus is the state of one check.
type CheckStatus struct {
	Kind Kind
	// Target is the probed address.
	Target netip.AddrPort
	State  State
	// Since is when the check entered State (or was created).
	Since time.Time
	// Successes and Failures count the consecutive results so far.
	Successes, Failures int
	// Probes and Transitions count all probes and state changes.
	Probes, Transitions uint64
	// LastProbe is when the last probe ended, and Err its error (nil if
	// it passed); zero before the first probe.
	LastProbe time.Time
	Err       error
	// LastError is the error of the last failed probe, and LastErrorAt
	// when it ended; they outlive later successes, for diagnosis.
	LastError   error
	LastErrorAt time.Time
}

// Status is the health of one backend of one service.
type Status struct {
	// State is Up when every check of the backend is up.
	State State
	// Since is when the backend entered State.
	Since time.Time
	// Err is the last error of a failing check while the backend is
	// down, nil while it is up.
	Err error
	// Successes is the fewest and Failures the most consecutive results
	// among the backend's checks; with one check, simply its counts.
	Successes, Failures int
	// Checks are the backend's checks.
	Checks []CheckStatus
}

// Status returns the health of a service's backend, and false if no
// target checks it.
func (m *Manager) Status(service string, addr netip.AddrPort) (Status, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.backends[ref{service, addr}]
	if !ok {
		return Status{}, false
	}
	st := Status{State: b.state, Since: b.since, Successes: -1}
	if b.state == Down {
		st.Err = failure(b.checks)
	}
	for _, c := range b.checks {
		cs := CheckStatus{
			Kind:        c.kind,
			Target:      c.target,
			State:       c.m.state,
			Since:       c.m.since,
			Successes:   c.m.successes,
			Failures:    c.m.failures,
			Probes:      c.m.probes,
			Transitions: c.m.transitions,
			LastProbe:   c.m.lastProbe,
			Err:         c.m.lastResult,
			LastError:   c.m.lastError,
			LastErrorAt: c.m.lastErrorAt,
		}
		if st.Successes < 0 || cs.Successes < st.Successes {
			st.Successes = cs.Successes
		}
		st.Failures = max(st.Failures, cs.Failures)
		st.Checks = append(st.Checks, cs)
	}
	return st, true
}

// Health returns the state of every checked backend of a service, for
// Apply. Backends without a check are absent, which Apply takes as up.
func (m *Manager) Health(service string) map[netip.AddrPort]State {
	m.mu.Lock()
	defer m.mu.Unlock()
	addrs := m.byService[service]
	out := make(map[netip.AddrPort]State, len(addrs))
	for _, a := range addrs {
		out[a] = m.backends[ref{service, a}].state
	}
	return out
}

// Stats are a Manager's counters.
type Stats struct {
	// Checks is the number of distinct checks and Backends the number of
	// checked service backends.
	Checks, Backends int
	// Probes and Failures count the probes recorded and those that
	// failed.
	Probes, Failures uint64
	// Transitions counts the backend transitions reported.
	Transitions uint64
	// InFlight is the number of probes running or waiting for a slot.
	InFlight int
	// Lateness counts the recorded probes by how late they started: the
	// time from a probe's due time to its start, which grows when the
	// scheduler, the workers or the CPU cannot keep up.
	Lateness Histogram
}

// LatenessBuckets are the upper bounds of Histogram's buckets, in
// seconds; a last bucket without a bound counts the later probes.
var LatenessBuckets = [...]float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// Histogram counts durations in the buckets of LatenessBuckets: Counts[i]
// those at most LatenessBuckets[i] seconds and above the bound before,
// the last count those above every bound. Sum is their total in seconds.
type Histogram struct {
	Counts [len(LatenessBuckets) + 1]uint64
	Sum    float64
}

// observe counts d, which a negative value (a probe handed out before
// its due time by a clock that stepped back) counts as zero.
func (h *Histogram) observe(d time.Duration) {
	s := max(d.Seconds(), 0)
	i, _ := slices.BinarySearch(LatenessBuckets[:], s)
	h.Counts[i]++
	h.Sum += s
}

// Stats returns the Manager's counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Checks, s.Backends = len(m.checks), len(m.backends)
	return s
}

// checkHeap orders checks by due time.
type checkHeap []*check

// epoch is the origin of check.due.
var epoch = time.Now()

func (h checkHeap) Len() int           { return len(h) }
func (h checkHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h checkHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *checkHeap) Push(x any) {
	c := x.(*check)
	c.due = c.next.Sub(epoch)
	c.index = len(*h)
	*h = append(*h, c)
}

func (h *checkHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	c.index = -1
	*h = old[:len(old)-1]
	return c
}
