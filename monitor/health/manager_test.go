package health

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeProber is a Prober whose result the test sets.
type fakeProber struct {
	mu     sync.Mutex
	err    error
	calls  int
	target netip.AddrPort
}

func (p *fakeProber) Probe(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	return p.err
}

func (p *fakeProber) set(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}

func (p *fakeProber) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// rig is a Manager on a fake clock with fake probers, recording the
// probers it builds and the transitions it reports.
type rig struct {
	t     *testing.T
	clock *fakeClock
	m     *Manager

	mu      sync.Mutex
	probers []*fakeProber
	events  []Transition
	nextErr error // the result of newly built probers
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{t: t, clock: newFakeClock()}
	r.m = NewManager(Options{
		Clock:       r.clock,
		StartSpread: -1,
		Seed:        1,
		NewProber: func(spec Spec, target netip.AddrPort) (Prober, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			p := &fakeProber{target: target, err: r.nextErr}
			r.probers = append(r.probers, p)
			return p, nil
		},
		OnTransition: func(ev Transition) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, ev)
		},
	})
	return r
}

// run starts the Manager, until the test ends.
func (r *rig) run() {
	t := r.t
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("run did not return after cancel")
		}
	})
}

func (r *rig) failNew(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextErr = err
}

func (r *rig) prober(i int) *fakeProber {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i >= len(r.probers) {
		r.t.Fatalf("only %d probers built, want prober %d", len(r.probers), i)
	}
	return r.probers[i]
}

func (r *rig) built() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.probers)
}

// probes waits until the Manager has recorded n probes in all.
func (r *rig) probes(n uint64) {
	r.t.Helper()
	waitFor(r.t, "probes", func() bool { return r.m.Stats().Probes >= n })
	if got := r.m.Stats().Probes; got != n {
		r.t.Fatalf("recorded %d probes, want %d", got, n)
	}
}

// step advances the clock by d and waits for the probe count to reach n.
func (r *rig) step(d time.Duration, n uint64) {
	r.t.Helper()
	r.clock.Advance(d)
	r.probes(n)
}

// eventsNow waits until n transitions were delivered and returns them.
func (r *rig) eventsNow(n int) []Transition {
	r.t.Helper()
	waitFor(r.t, "transitions", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.events) >= n
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) != n {
		r.t.Fatalf("got %d transitions, want %d: %v", len(r.events), n, r.events)
	}
	return append([]Transition(nil), r.events...)
}

func (r *rig) status(service string, backend netip.AddrPort) Status {
	r.t.Helper()
	st, ok := r.m.Status(service, backend)
	if !ok {
		r.t.Fatalf("no status for %s %s", service, backend)
	}
	return st
}

var (
	be1 = netip.MustParseAddrPort("127.0.0.1:8080")
	be2 = netip.MustParseAddrPort("127.0.0.1:8081")
)

func tcpSpec() Spec {
	return Spec{Kind: KindTCP, Interval: time.Second, Rise: 2, Fall: 3, Jitter: -1}
}

var errDown = errors.New("connection refused")

func TestManagerRiseFall(t *testing.T) {
	r := newRig(t)
	if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: tcpSpec()}}); err != nil {
		t.Fatal(err)
	}
	if st := r.status("web", be1); st.State != Down {
		t.Fatalf("initial state %s, want down", st.State)
	}
	r.run()
	// The first probe runs at once (no start spread) and, passing,
	// brings the initially down check up without waiting for rise.
	r.probes(1)
	if st := r.status("web", be1); st.State != Up || st.Successes != 1 {
		t.Fatalf("after first success: %+v", st)
	}
	p := r.prober(0)
	p.set(errDown)
	r.step(time.Second, 2)
	r.step(time.Second, 3)
	if st := r.status("web", be1); st.State != Up || st.Failures != 2 {
		t.Fatalf("after 2 failures with fall 3: %+v", st)
	}
	r.step(time.Second, 4)
	st := r.status("web", be1)
	if st.State != Down || !errors.Is(st.Err, errDown) || st.Failures != 3 {
		t.Fatalf("after 3 failures: %+v", st)
	}
	downAt := st.Since
	r.step(time.Second, 5)
	if st := r.status("web", be1); st.State != Down || !st.Since.Equal(downAt) {
		t.Fatalf("still failing: %+v (down since %v)", st, downAt)
	}
	p.set(nil)
	r.step(time.Second, 6)
	if st := r.status("web", be1); st.State != Down || st.Successes != 1 {
		t.Fatalf("after 1 success with rise 2: %+v", st)
	}
	r.step(time.Second, 7)
	st = r.status("web", be1)
	if st.State != Up || !st.Since.Equal(r.clock.Now()) || st.Checks[0].LastError == nil {
		t.Fatalf("after 2 successes: %+v", st)
	}
	if c := st.Checks[0]; c.Probes != 7 || c.Transitions != 3 || c.Err != nil {
		t.Fatalf("check status: %+v", c)
	}

	evs := r.eventsNow(3)
	want := []State{Up, Down, Up}
	for i, ev := range evs {
		if ev.State != want[i] || ev.Service != "web" || ev.Backend != be1 {
			t.Errorf("event %d: %+v, want %s", i, ev, want[i])
		}
	}
	if !errors.Is(evs[1].Err, errDown) || evs[0].Err != nil {
		t.Errorf("event errors: %v, %v", evs[0].Err, evs[1].Err)
	}
	if n := r.m.Stats().Transitions; n != 3 {
		t.Errorf("counted %d transitions, want 3", n)
	}
}

func TestManagerInitialUp(t *testing.T) {
	r := newRig(t)
	spec := tcpSpec()
	spec.Initial = Up
	if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	if st := r.status("web", be1); st.State != Up {
		t.Fatalf("initial state %s, want up", st.State)
	}
	r.run()
	r.probes(1)
	if evs := r.eventsNow(0); len(evs) != 0 {
		t.Fatalf("passing first probe of an up check reported %v", evs)
	}
	// From here on a failure needs fall results.
	r.prober(0).set(errDown)
	r.step(time.Second, 2)
	if st := r.status("web", be1); st.State != Up {
		t.Fatalf("one failure after a success took an up check down")
	}
}

func TestManagerInitialUpFirstFailure(t *testing.T) {
	r := newRig(t)
	spec := tcpSpec()
	spec.Initial = Up
	r.failNew(errDown)
	r.run()
	if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	r.probes(1)
	if st := r.status("web", be1); st.State != Down {
		t.Fatalf("failing first probe left an initially up check %s", st.State)
	}
	if evs := r.eventsNow(1); evs[0].State != Down {
		t.Fatalf("events %v", evs)
	}
}

func TestManagerDedupe(t *testing.T) {
	r := newRig(t)
	spec := tcpSpec()
	spec.Port = 9000 // both backends' checks probe 127.0.0.1:9000
	targets := []Target{
		{Service: "web", Backend: be1, Spec: spec},
		{Service: "api", Backend: be1, Spec: spec},
		{Service: "api", Backend: be2, Spec: spec},
	}
	if err := r.m.Update(targets); err != nil {
		t.Fatal(err)
	}
	if n := r.built(); n != 1 {
		t.Fatalf("built %d probers for one distinct check, want 1", n)
	}
	r.run()
	if got, want := r.prober(0).target, netip.MustParseAddrPort("127.0.0.1:9000"); got != want {
		t.Fatalf("probed %s, want %s", got, want)
	}
	r.probes(1)
	r.step(time.Second, 2)
	r.step(time.Second, 3)
	if n := r.prober(0).count(); n != 3 {
		t.Fatalf("one check probed %d times in 3 intervals, want 3", n)
	}
	st := r.m.Stats()
	if st.Checks != 1 || st.Backends != 3 {
		t.Fatalf("stats %+v, want 1 check for 3 backends", st)
	}
	for _, tg := range targets {
		if s := r.status(tg.Service, tg.Backend); s.State != Up {
			t.Errorf("%s %s is %s", tg.Service, tg.Backend, s.State)
		}
	}
	if h := r.m.Health("api"); len(h) != 2 || h[be1] != Up || h[be2] != Up {
		t.Errorf("health of api: %v", h)
	}
	// One check's transition is each backend's transition.
	if evs := r.eventsNow(3); evs[0].State != Up {
		t.Errorf("events %v", evs)
	}
}

func TestManagerUpdateKeepsState(t *testing.T) {
	r := newRig(t)
	r.run()
	web := Target{Service: "web", Backend: be1, Spec: tcpSpec()}
	if err := r.m.Update([]Target{web}); err != nil {
		t.Fatal(err)
	}
	r.probes(1)
	since := r.status("web", be1).Since

	// A reload with the same check (in a fresh Spec value, and with a
	// new service using it) keeps the check, its state and its schedule.
	api := Target{Service: "api", Backend: be1, Spec: tcpSpec()}
	if err := r.m.Update([]Target{api, web}); err != nil {
		t.Fatal(err)
	}
	if n := r.built(); n != 1 {
		t.Fatalf("unchanged check rebuilt: %d probers", n)
	}
	for _, svc := range []string{"web", "api"} {
		if st := r.status(svc, be1); st.State != Up || !st.Since.Equal(since) {
			t.Fatalf("%s after reload: %+v", svc, st)
		}
	}
	r.step(time.Second, 2)
	if n := r.prober(0).count(); n != 2 {
		t.Fatalf("probed %d times, want 2", n)
	}

	// Changing the target (here the probed port) makes a new check,
	// which starts down again (and stays down: its prober fails).
	r.failNew(errDown)
	changed := web
	changed.Spec.Port = 9000
	if err := r.m.Update([]Target{changed}); err != nil {
		t.Fatal(err)
	}
	if n := r.built(); n != 2 {
		t.Fatalf("check of a new target not built: %d probers", n)
	}
	if st := r.status("web", be1); st.State != Down || st.Checks[0].Successes != 0 {
		t.Fatalf("changed check: %+v", st)
	}
	if _, ok := r.m.Status("api", be1); ok {
		t.Fatal("removed service still has a status")
	}
	r.probes(3)           // the new check probes at once
	evs := r.eventsNow(2) // web up; web down by the reload
	if evs[1].State != Down || evs[1].Service != "web" || evs[1].Err != nil {
		t.Fatalf("events %v", evs)
	}
	if old := r.prober(0).count(); old != 2 {
		t.Fatalf("stopped check still probed: %d", old)
	}

	// Removing every target stops every check.
	if err := r.m.Update(nil); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(10 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if st := r.m.Stats(); st.Checks != 0 || st.Probes != 3 {
		t.Fatalf("after removing all: %+v", st)
	}
}

func TestManagerSeveralChecksPerBackend(t *testing.T) {
	r := newRig(t)
	r.run()
	httpSpec := Spec{Kind: KindHTTP, Interval: time.Second, Rise: 1, Fall: 1, Jitter: -1}
	if err := r.m.Update([]Target{
		{Service: "web", Backend: be1, Spec: tcpSpec()},
		{Service: "web", Backend: be1, Spec: httpSpec},
	}); err != nil {
		t.Fatal(err)
	}
	r.probes(2)
	if st := r.status("web", be1); st.State != Up || len(st.Checks) != 2 {
		t.Fatalf("both passing: %+v", st)
	}
	http := r.prober(1)
	http.set(errors.New("status 503 not in 200-399"))
	r.step(time.Second, 4)
	st := r.status("web", be1)
	if st.State != Down || st.Err == nil || !strings.Contains(st.Err.Error(), "503") {
		t.Fatalf("one check failing: %+v", st)
	}
	if evs := r.eventsNow(2); evs[1].State != Down {
		t.Fatalf("events %v", evs)
	}
}

func TestManagerInvalidSpecFailsClosed(t *testing.T) {
	r := newRig(t)
	r.run()
	// Even its nonsense timing is made safe to schedule.
	bad := Spec{Kind: KindHTTP, Initial: Up, Interval: -1, Rise: -1, HTTP: HTTPOptions{Path: "no-slash"}}
	err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: bad}})
	if err == nil || !strings.Contains(err.Error(), "service web backend 127.0.0.1:8080") {
		t.Fatalf("error %v", err)
	}
	if n := r.built(); n != 0 {
		t.Fatalf("built a prober for an invalid spec")
	}
	r.probes(1)
	if st := r.status("web", be1); st.State != Down {
		t.Fatalf("invalid check left the backend %s", st.State)
	}
	time.Sleep(20 * time.Millisecond)
	r.probes(1) // no busy loop on the negative interval
	r.step(2*MinInterval, 2)
}

func TestManagerMaxInFlight(t *testing.T) {
	clock := newFakeClock()
	var mu sync.Mutex
	running, peak := 0, 0
	release := make(chan struct{})
	m := NewManager(Options{
		Clock:       clock,
		StartSpread: -1,
		MaxInFlight: 2,
		NewProber: func(Spec, netip.AddrPort) (Prober, error) {
			return ProberFunc(func(ctx context.Context) error {
				mu.Lock()
				running++
				peak = max(peak, running)
				mu.Unlock()
				<-release
				mu.Lock()
				running--
				mu.Unlock()
				return nil
			}), nil
		},
	})
	var targets []Target
	for i := range 5 {
		targets = append(targets, Target{Service: "s", Backend: netip.AddrPortFrom(be1.Addr(), uint16(9000+i)), Spec: tcpSpec()})
	}
	if err := m.Update(targets); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	waitFor(t, "two probes running", func() bool { mu.Lock(); defer mu.Unlock(); return running == 2 })
	time.Sleep(20 * time.Millisecond)
	if st := m.Stats(); st.InFlight != 5 {
		t.Errorf("in flight %d, want 5 (2 running, 3 waiting)", st.InFlight)
	}
	close(release)
	waitFor(t, "all probes", func() bool { return m.Stats().Probes == 5 })
	cancel()
	<-done
	if peak != 2 {
		t.Fatalf("peak concurrency %d, want 2", peak)
	}
}

func TestManagerJitterAndSpread(t *testing.T) {
	m := NewManager(Options{Clock: newFakeClock(), Seed: 7})
	spec := Spec{Kind: KindTCP, Interval: 10 * time.Second}.WithDefaults()
	tm := timingOf(spec)
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 10000 {
		iv := m.interval(&tm)
		lo, hi = min(lo, iv), max(hi, iv)
	}
	if lo < 9*time.Second || hi > 11*time.Second || hi-lo < 1900*time.Millisecond {
		t.Errorf("jittered 10s intervals span [%s, %s], want about [9s, 11s]", lo, hi)
	}
	noJitter := timingOf(Spec{Kind: KindTCP, Interval: 10 * time.Second, Jitter: -1}.WithDefaults())
	if iv := m.interval(&noJitter); iv != 10*time.Second {
		t.Errorf("interval without jitter %s", iv)
	}

	// New checks' first probes spread over the start spread (1s).
	var targets []Target
	for i := range 1000 {
		targets = append(targets, Target{Service: "s", Backend: netip.AddrPortFrom(be1.Addr(), uint16(10000+i)), Spec: spec})
	}
	m.opts.NewProber = func(Spec, netip.AddrPort) (Prober, error) {
		return ProberFunc(func(context.Context) error { return nil }), nil
	}
	if err := m.Update(targets); err != nil {
		t.Fatal(err)
	}
	start := m.clock.Now()
	var buckets [10]int
	for _, c := range m.checks {
		d := c.next.Sub(start)
		if d < 0 || d >= time.Second {
			t.Fatalf("first probe after %s, want within [0, 1s)", d)
		}
		buckets[d/(100*time.Millisecond)]++
	}
	for i, n := range buckets {
		if n < 50 || n > 150 {
			t.Errorf("%d of 1000 first probes in 100ms slot %d, want about 100", n, i)
		}
	}
}

func TestManagerRunTwice(t *testing.T) {
	m := NewManager(Options{Clock: newFakeClock()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	waitFor(t, "running", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return m.running })
	if err := m.Run(ctx); err == nil {
		t.Error("second concurrent Run succeeded")
	}
	cancel()
	<-done
}

// TestManagerRealChecks runs real TCP checks on the real clock: a backend
// whose listener closes goes down, and comes back when it reopens.
func TestManagerRealChecks(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	serve := func(ln net.Listener) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}
	go serve(ln)

	var mu sync.Mutex
	var events []Transition
	changed := make(chan struct{}, 16)
	m := NewManager(Options{
		StartSpread: 10 * time.Millisecond,
		OnTransition: func(ev Transition) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
			changed <- struct{}{}
		},
	})
	spec := Spec{Kind: KindTCP, Interval: 20 * time.Millisecond, Timeout: 500 * time.Millisecond, Rise: 2, Fall: 2}
	if err := m.Update([]Target{{Service: "web", Backend: addr, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	wait := func(want State) {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(5 * time.Second):
			t.Fatalf("no transition to %s", want)
		}
		if st, _ := m.Status("web", addr); st.State != want {
			t.Fatalf("state %s, want %s", st.State, want)
		}
	}
	wait(Up)
	ln.Close()
	wait(Down)
	ln, err = net.Listen("tcp4", addr.String())
	if err != nil {
		t.Fatalf("cannot listen on %s again: %v", addr, err)
	}
	defer ln.Close()
	go serve(ln)
	wait(Up)
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 3 || events[1].Err == nil || !strings.Contains(events[1].Err.Error(), "refused") {
		t.Errorf("events %v", events)
	}
}

func TestHistogramBuckets(t *testing.T) {
	var h Histogram
	for _, d := range []time.Duration{-time.Millisecond, 0, 100 * time.Microsecond, 101 * time.Microsecond, time.Second, 3 * time.Second} {
		h.observe(d)
	}
	var want [len(LatenessBuckets) + 1]uint64
	want[0] = 3                    // -1ms (as 0), 0 and 100µs: at most 0.0001 s
	want[1] = 1                    // 101µs
	want[12] = 1                   // 1 s is at most the 1 s bound
	want[len(LatenessBuckets)] = 1 // 3 s is above every bound
	if h.Counts != want {
		t.Errorf("counts %v, want %v", h.Counts, want)
	}
	if got := h.Sum; got < 4.000200 || got > 4.000202 {
		t.Errorf("sum %v, want 4.000201", got)
	}
}

// TestManagerLateness checks that a probe that waits for a free slot
// counts as late by the time it waited, and one that starts when due as
// on time.
func TestManagerLateness(t *testing.T) {
	clock := newFakeClock()
	started := make(chan struct{}, 2)
	release := make(chan struct{})
	m := NewManager(Options{
		Clock:       clock,
		StartSpread: -1,
		MaxInFlight: 1,
		NewProber: func(Spec, netip.AddrPort) (Prober, error) {
			return ProberFunc(func(ctx context.Context) error {
				started <- struct{}{}
				<-release
				return nil
			}), nil
		},
	})
	// With one slot the second check, due with the first, waits for the
	// first probe to end.
	targets := []Target{
		{Service: "s", Backend: be1, Spec: tcpSpec()},
		{Service: "s", Backend: be2, Spec: tcpSpec()},
	}
	if err := m.Update(targets); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	<-started
	clock.Advance(30 * time.Millisecond)
	release <- struct{}{}
	<-started
	release <- struct{}{}
	waitFor(t, "two probes", func() bool { return m.Stats().Probes == 2 })
	h := m.Stats().Lateness
	var want [len(LatenessBuckets) + 1]uint64
	want[0] = 1 // the first, on time
	want[8] = 1 // the second, 30ms late: at most 0.05 s
	if h.Counts != want {
		t.Errorf("lateness counts %v, want %v", h.Counts, want)
	}
	if h.Sum < 0.029 || h.Sum > 0.031 {
		t.Errorf("lateness sum %v, want 0.03", h.Sum)
	}
}

// TestManagerSlack checks that the scheduler does not wake again within
// Options.Slack: with a slack of 1ms, a probe due 0.3ms after another
// starts with the probes due by the end of the slack, 1ms after the
// first, and so counts as 0.7ms late; with no slack it starts when due.
func TestManagerSlack(t *testing.T) {
	for _, slack := range []time.Duration{time.Millisecond, -1} {
		clock := newFakeClock()
		m := NewManager(Options{
			Clock:       clock,
			StartSpread: -1,
			Slack:       slack,
			NewProber: func(Spec, netip.AddrPort) (Prober, error) {
				return ProberFunc(func(context.Context) error { return nil }), nil
			},
		})
		a, b := tcpSpec(), tcpSpec()
		b.Interval += 300 * time.Microsecond
		if err := m.Update([]Target{{Service: "s", Backend: be1, Spec: a}, {Service: "s", Backend: be2, Spec: b}}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = m.Run(ctx); close(done) }()
		t0 := clock.Now()
		// armedAt waits until the scheduler sleeps until at.
		armedAt := func(what string, at time.Time) {
			t.Helper()
			waitFor(t, what, func() bool {
				ts := clock.armed()
				return len(ts) == 1 && ts[0].Equal(at)
			})
		}
		waitFor(t, "first probes", func() bool { return m.Stats().Probes == 2 })
		armedAt("the wake for a's second probe", t0.Add(time.Second))
		clock.Advance(time.Second)
		waitFor(t, "a's second probe", func() bool { return m.Stats().Probes >= 3 })
		if slack < 0 {
			armedAt("the wake for b's second probe", t0.Add(b.Interval))
		} else {
			armedAt("the wake at the end of the slack", t0.Add(time.Second+slack))
		}
		clock.Advance(300 * time.Microsecond)
		if slack < 0 {
			waitFor(t, "b's second probe, when due", func() bool { return m.Stats().Probes == 4 })
		} else {
			time.Sleep(50 * time.Millisecond)
			if n := m.Stats().Probes; n != 3 {
				t.Fatalf("slack %v: %d probes 0.3ms after the first, want 3 (b waits for the slack)", slack, n)
			}
			clock.Advance(700 * time.Microsecond)
			waitFor(t, "b's second probe, after the slack", func() bool { return m.Stats().Probes == 4 })
			h := m.Stats().Lateness
			if h.Counts[3] != 1 || h.Counts[0] != 3 {
				t.Errorf("lateness counts %v, want three on time and one at most 1ms late", h.Counts)
			}
		}
		cancel()
		<-done
	}
}

// TestManagerSlackAdapts checks that a zero Options.Slack adapts to the
// shortest interval of the checks in use, between DefaultSlack and
// MaxSlack, and that a set one does not.
func TestManagerSlackAdapts(t *testing.T) {
	spec := func(iv time.Duration) Spec {
		s := tcpSpec()
		s.Interval, s.Timeout = iv, min(iv, time.Second)
		return s
	}
	for _, tc := range []struct {
		opt       time.Duration
		intervals []time.Duration
		want      time.Duration
	}{
		{0, nil, DefaultSlack},
		{0, []time.Duration{time.Second}, 50 * time.Millisecond},
		{0, []time.Duration{5 * time.Second, 400 * time.Millisecond}, 20 * time.Millisecond},
		{0, []time.Duration{100 * time.Millisecond}, DefaultSlack},
		{0, []time.Duration{30 * time.Second}, MaxSlack},
		{time.Millisecond, []time.Duration{time.Second}, time.Millisecond},
		{-1, []time.Duration{time.Second}, -1},
	} {
		m := NewManager(Options{Clock: newFakeClock(), Slack: tc.opt})
		var targets []Target
		for i, iv := range tc.intervals {
			targets = append(targets, Target{Service: "s", Backend: netip.AddrPortFrom(be1.Addr(), uint16(80+i)), Spec: spec(iv)})
		}
		if err := m.Update(targets); err != nil {
			t.Fatal(err)
		}
		if _, _, _, got := m.popDue(); got != tc.want {
			t.Errorf("slack %v, intervals %v: the scheduler's slack is %v, want %v", tc.opt, tc.intervals, got, tc.want)
		}
	}
	// An Update that drops the short interval widens it again.
	m := NewManager(Options{Clock: newFakeClock()})
	if err := m.Update([]Target{{Service: "s", Backend: be1, Spec: spec(200 * time.Millisecond)}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Update([]Target{{Service: "s", Backend: be1, Spec: spec(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, got := m.popDue(); got != 50*time.Millisecond {
		t.Errorf("after dropping the 200ms check: slack %v, want 50ms", got)
	}
}
