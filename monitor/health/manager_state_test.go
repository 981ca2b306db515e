package health

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// httpSpec is the check the state tests start from.
func httpSpec() Spec {
	return Spec{Kind: KindHTTP, Interval: time.Second, Rise: 2, Fall: 3, Jitter: -1, HTTP: HTTPOptions{Path: "/health"}}
}

// settingEdits change a check's settings but not its target. question
// says the edit changes what the check asks.
var settingEdits = []struct {
	name     string
	edit     func(*Spec)
	question bool
}{
	{"timeout", func(s *Spec) { s.Timeout = 500 * time.Millisecond }, false},
	{"interval", func(s *Spec) { s.Interval = 2 * time.Second }, false},
	{"rise and fall", func(s *Spec) { s.Rise, s.Fall = 4, 5 }, false},
	{"jitter", func(s *Spec) { s.Jitter = 0.2 }, false},
	{"initial", func(s *Spec) { s.Initial = Up }, false},
	{"http path", func(s *Spec) { s.HTTP.Path = "/ready" }, true},
	{"expected status", func(s *Spec) { s.HTTP.Status = []StatusRange{{Lo: 200, Hi: 204}} }, true},
	{"http host", func(s *Spec) { s.HTTP.Host = "www.example.com" }, true},
}

// TestManagerSettingsEditKeepsState edits one setting of an up check and
// of a down one: each keeps its state, since and probe count, and its
// consecutive counts unless the edit changed what it asks; no transition
// is reported, and the next probe is the new settings' prober's.
func TestManagerSettingsEditKeepsState(t *testing.T) {
	for _, e := range settingEdits {
		t.Run(e.name+"/up", func(t *testing.T) {
			r := newRig(t)
			r.run()
			if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: httpSpec()}}); err != nil {
				t.Fatal(err)
			}
			r.probes(1) // up at once
			old := r.prober(0)
			old.set(errDown)
			r.step(time.Second, 2) // one failure of fall 3
			before := r.status("web", be1)
			if before.State != Up || before.Failures != 1 {
				t.Fatalf("before the edit: %+v", before)
			}

			spec := httpSpec()
			e.edit(&spec)
			if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
				t.Fatal(err)
			}
			if n := r.built(); n != 2 {
				t.Fatalf("built %d probers, want a new one for the new settings", n)
			}
			wantFailures := 1
			if e.question {
				wantFailures = 0
			}
			after := r.status("web", be1)
			if after.State != Up || !after.Since.Equal(before.Since) || after.Failures != wantFailures || after.Checks[0].Probes != 2 {
				t.Fatalf("after the edit: %+v; want up since %v with %d failures and 2 probes", after, before.Since, wantFailures)
			}
			// The old schedule holds: the next probe is due one second
			// after the last, and it is the new prober's.
			r.step(time.Second, 3)
			if n := old.count(); n != 2 {
				t.Errorf("the old prober probed %d times, want 2", n)
			}
			if n := r.prober(1).count(); n != 1 {
				t.Errorf("the new prober probed %d times, want 1", n)
			}
			if st := r.status("web", be1); st.State != Up || st.Successes != 1 {
				t.Errorf("after a passing probe: %+v", st)
			}
			if evs := r.eventsNow(1); evs[0].State != Up {
				t.Errorf("events %v, want the first up alone", evs)
			}
		})
		t.Run(e.name+"/down", func(t *testing.T) {
			r := newRig(t)
			r.run()
			r.failNew(errDown)
			if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: httpSpec()}}); err != nil {
				t.Fatal(err)
			}
			r.probes(1)
			r.prober(0).set(nil)
			r.step(time.Second, 2) // one success of rise 2
			before := r.status("web", be1)
			if before.State != Down || before.Successes != 1 {
				t.Fatalf("before the edit: %+v", before)
			}

			spec := httpSpec()
			e.edit(&spec)
			r.failNew(nil)
			if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
				t.Fatal(err)
			}
			kept := 1
			if e.question {
				kept = 0
			}
			after := r.status("web", be1)
			if after.State != Down || !after.Since.Equal(before.Since) || after.Successes != kept {
				t.Fatalf("after the edit: %+v; want down since %v with %d successes", after, before.Since, kept)
			}
			// The next success counts on from the kept count against the
			// new rise.
			r.step(time.Second, 3)
			want := Down
			if kept+1 >= spec.Rise {
				want = Up
			}
			if st := r.status("web", be1); st.State != want || st.Successes != kept+1 {
				t.Fatalf("after a passing probe: %+v; want %s with %d successes", st, want, kept+1)
			}
		})
	}
}

// TestManagerNewTargetStartsFromInitial changes where an up check probes:
// a new target knows nothing, so its check starts from its initial state.
func TestManagerNewTargetStartsFromInitial(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*Spec)
	}{
		{"port", func(s *Spec) { s.Port = 9000 }},
		{"address", func(s *Spec) { s.Addr = netip.MustParseAddr("127.0.0.2") }},
		{"kind", func(s *Spec) { s.Kind = KindHTTPS }},
		{"mark", func(s *Spec) { s.Dial.Mark = 0x100 }},
		{"device", func(s *Spec) { s.Dial.Device = "lo" }},
		{"source", func(s *Spec) { s.Dial.Source = netip.MustParseAddr("127.0.0.3") }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: httpSpec()}}); err != nil {
				t.Fatal(err)
			}
			r.run()
			r.probes(1)
			if st := r.status("web", be1); st.State != Up {
				t.Fatalf("before the edit: %+v", st)
			}
			spec := httpSpec()
			tt.edit(&spec)
			r.failNew(errDown)
			if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
				t.Fatal(err)
			}
			// The new check probes at once (the rig does not spread
			// first probes), failing.
			r.probes(2)
			st := r.status("web", be1)
			if c := st.Checks[0]; st.State != Down || c.Probes != 1 || c.Successes != 0 || c.Transitions != 0 {
				t.Fatalf("after the edit: %+v; want a new check, down from the start", st)
			}
			if evs := r.eventsNow(2); evs[1].State != Down || evs[1].Err != nil {
				t.Fatalf("events %v, want up, then down by the update", evs)
			}
		})
	}
}

// TestManagerUpdateThenRevert undoes Updates, as a reload whose pass fails
// does: the state comes back, with what the checks learned meanwhile.
func TestManagerUpdateThenRevert(t *testing.T) {
	web := Target{Service: "web", Backend: be1, Spec: httpSpec()}
	other := Target{Service: "web", Backend: be2, Spec: httpSpec()}

	t.Run("settings edited and back", func(t *testing.T) {
		r := newRig(t)
		r.run()
		if err := r.m.Update([]Target{web}); err != nil {
			t.Fatal(err)
		}
		r.probes(1)
		since := r.status("web", be1).Since
		edited := web
		edited.Spec.Timeout = 3 * time.Second
		edited.Spec.HTTP.Path = "/ready"
		r.failNew(errDown)
		if err := r.m.Update([]Target{edited}); err != nil {
			t.Fatal(err)
		}
		r.step(time.Second, 2) // the edited check fails once
		if err := r.m.Update([]Target{web}); err != nil {
			t.Fatal(err)
		}
		st := r.status("web", be1)
		if st.State != Up || !st.Since.Equal(since) || st.Checks[0].Probes != 2 {
			t.Fatalf("after the revert: %+v; want up since %v after 2 probes", st, since)
		}
		r.step(time.Second, 3)
		if st := r.status("web", be1); st.State != Up || st.Failures != 1 {
			t.Fatalf("after the first probe since the revert: %+v; want up (fall 3)", st)
		}
		if evs := r.eventsNow(1); len(evs) != 1 {
			t.Fatalf("events %v", evs)
		}
	})

	t.Run("backend removed and back", func(t *testing.T) {
		r := newRig(t)
		r.run()
		if err := r.m.Update([]Target{web, other}); err != nil {
			t.Fatal(err)
		}
		r.probes(2)
		since := r.status("web", be2).Since
		if err := r.m.Update([]Target{web}); err != nil {
			t.Fatal(err)
		}
		if _, ok := r.m.Status("web", be2); ok {
			t.Fatal("a removed backend has a status")
		}
		r.step(time.Second, 3) // the removed check is not probed
		if err := r.m.Update([]Target{web, other}); err != nil {
			t.Fatal(err)
		}
		// Its probe was due while it was gone: it runs at once (the rig
		// does not spread first probes).
		r.probes(4)
		if st := r.status("web", be2); st.State != Up || !st.Since.Equal(since) || st.Checks[0].Probes != 2 {
			t.Fatalf("restored backend: %+v; want up since %v after 2 probes", st, since)
		}
		if n := r.prober(2).count(); n != 1 {
			t.Fatalf("the restored check probed %d times, want 1", n)
		}
		if evs := r.eventsNow(2); len(evs) != 2 {
			t.Fatalf("events %v, want the first two ups alone", evs)
		}
	})

	t.Run("backend back after Retain", func(t *testing.T) {
		r := newRig(t)
		if err := r.m.Update([]Target{web}); err != nil {
			t.Fatal(err)
		}
		r.run()
		r.probes(1)
		if err := r.m.Update(nil); err != nil {
			t.Fatal(err)
		}
		r.clock.Advance(DefaultRetain + time.Second)
		r.failNew(errDown)
		if err := r.m.Update([]Target{web}); err != nil {
			t.Fatal(err)
		}
		r.probes(2)
		if st := r.status("web", be1); st.State != Down || st.Checks[0].Probes != 1 || st.Checks[0].Transitions != 0 {
			t.Fatalf("a check removed longer than Retain ago: %+v; want a new check", st)
		}
	})

	t.Run("Retain negative", func(t *testing.T) {
		r := newRig(t)
		r.m.opts.Retain = -1
		if err := r.m.Update([]Target{web}); err != nil {
			t.Fatal(err)
		}
		r.run()
		r.probes(1)
		if err := r.m.Update(nil); err != nil {
			t.Fatal(err)
		}
		r.failNew(errDown)
		if err := r.m.Update([]Target{web}); err != nil {
			t.Fatal(err)
		}
		r.probes(2)
		if st := r.status("web", be1); st.State != Down || st.Checks[0].Probes != 1 || st.Checks[0].Transitions != 0 {
			t.Fatalf("with Retain negative: %+v; want a new check", st)
		}
	})
}

// TestManagerSharedChecksAcrossEdits edits checks that services share:
// the services that keep a check keep it running, and the one that
// changes it takes its state along.
func TestManagerSharedChecksAcrossEdits(t *testing.T) {
	t.Run("one of two sharing services edited and back", func(t *testing.T) {
		r := newRig(t)
		r.run()
		web := Target{Service: "web", Backend: be1, Spec: httpSpec()}
		api := Target{Service: "api", Backend: be1, Spec: httpSpec()}
		if err := r.m.Update([]Target{web, api}); err != nil {
			t.Fatal(err)
		}
		r.probes(1)
		since := r.status("web", be1).Since
		edited := web
		edited.Spec.Timeout = 3 * time.Second
		if err := r.m.Update([]Target{edited, api}); err != nil {
			t.Fatal(err)
		}
		if st := r.m.Stats(); st.Checks != 2 || r.built() != 2 {
			t.Fatalf("stats %+v, %d probers; want the shared check and web's own", st, r.built())
		}
		for _, svc := range []string{"web", "api"} {
			if st := r.status(svc, be1); st.State != Up || !st.Since.Equal(since) {
				t.Fatalf("%s after the edit: %+v", svc, st)
			}
		}
		r.step(time.Second, 3)
		if a, b := r.prober(0).count(), r.prober(1).count(); a != 2 || b != 1 {
			t.Fatalf("the shared check probed %d times and web's own %d, want 2 and 1", a, b)
		}
		// Back: web shares api's check again, which ran all along.
		if err := r.m.Update([]Target{web, api}); err != nil {
			t.Fatal(err)
		}
		if st := r.m.Stats(); st.Checks != 1 || r.built() != 2 {
			t.Fatalf("stats %+v, %d probers; want the shared check alone", st, r.built())
		}
		if st := r.status("web", be1); st.State != Up || !st.Since.Equal(since) || st.Checks[0].Probes != 2 {
			t.Fatalf("web after the revert: %+v", st)
		}
		if evs := r.eventsNow(2); len(evs) != 2 {
			t.Fatalf("events %v, want the first ups alone", evs)
		}
	})

	t.Run("one target, two questions", func(t *testing.T) {
		r := newRig(t)
		r.run()
		a := httpSpec()
		a.HTTP.Path = "/a"
		b := httpSpec()
		b.HTTP.Path = "/b"
		r.failNew(errDown)
		if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: a}}); err != nil {
			t.Fatal(err)
		}
		r.probes(1) // web's /a fails: down
		r.failNew(nil)
		if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: a}, {Service: "api", Backend: be1, Spec: b}}); err != nil {
			t.Fatal(err)
		}
		r.probes(2) // api's /b passes: up
		if w, p := r.status("web", be1).State, r.status("api", be1).State; w != Down || p != Up {
			t.Fatalf("web %s, api %s; want down and up", w, p)
		}

		// web re-timed keeps its own check's state, not api's.
		a.Timeout = 3 * time.Second
		if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: a}, {Service: "api", Backend: be1, Spec: b}}); err != nil {
			t.Fatal(err)
		}
		if st := r.status("web", be1); st.State != Down || st.Checks[0].Probes != 1 {
			t.Fatalf("web re-timed: %+v; want its own check's state", st)
		}

		// web asking api's question under other timing takes the state
		// of api's check, which answers it; its own /a check's is the
		// answer to another question.
		a.HTTP.Path = "/b"
		if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: a}, {Service: "api", Backend: be1, Spec: b}}); err != nil {
			t.Fatal(err)
		}
		if st := r.status("web", be1); st.State != Up || st.Checks[0].Probes != 1 || st.Checks[0].LastError != nil {
			t.Fatalf("web asking /b: %+v; want api's check's state", st)
		}

		// A new service asking a known question of a known target under
		// its own timing learns the answer; one asking a new question
		// starts from its initial state.
		c := b
		c.Interval = 3 * time.Second
		d := b
		d.HTTP.Path = "/d"
		r.failNew(errDown)
		if err := r.m.Update([]Target{
			{Service: "web", Backend: be1, Spec: a}, {Service: "api", Backend: be1, Spec: b},
			{Service: "c", Backend: be1, Spec: c}, {Service: "d", Backend: be1, Spec: d},
		}); err != nil {
			t.Fatal(err)
		}
		if st := r.status("c", be1); st.State != Up {
			t.Errorf("a new service asking a known question: %+v", st)
		}
		if st := r.status("d", be1); st.State != Down || st.Checks[0].Successes != 0 || st.Checks[0].Transitions != 0 {
			t.Errorf("a new service asking a new question: %+v", st)
		}
	})

	t.Run("a backend gaining a second check of one target", func(t *testing.T) {
		r := newRig(t)
		r.run()
		if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: httpSpec()}}); err != nil {
			t.Fatal(err)
		}
		r.probes(1)
		second := httpSpec()
		second.HTTP.Path = "/db"
		r.failNew(errDown)
		if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: httpSpec()}, {Service: "web", Backend: be1, Spec: second}}); err != nil {
			t.Fatal(err)
		}
		st := r.status("web", be1)
		if st.State != Down || len(st.Checks) != 2 || st.Checks[0].State != Up || st.Checks[1].Successes != 0 || st.Checks[1].Transitions != 0 {
			t.Fatalf("a second check: %+v; want the first up and the second new", st)
		}
	})
}

// TestManagerBrokenCheckDoesNotInherit: an edit that breaks an up check
// starts it from its initial state, so a check that cannot pass takes the
// backend down at once.
func TestManagerBrokenCheckDoesNotInherit(t *testing.T) {
	r := newRig(t)
	r.run()
	if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: httpSpec()}}); err != nil {
		t.Fatal(err)
	}
	r.probes(1)
	bad := httpSpec()
	bad.HTTP.Path = "no-slash"
	if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: bad}}); err == nil || !strings.Contains(err.Error(), "no-slash") {
		t.Fatalf("error %v", err)
	}
	if st := r.status("web", be1); st.State != Down || st.Checks[0].Transitions != 0 {
		t.Fatalf("a broken check: %+v; want a new check, down", st)
	}
}

// TestManagerEditDuringProbe edits a check while its probe runs: the
// running probe's result, an answer under the old settings that came
// after the edit, is dropped, and the new check probes at once.
func TestManagerEditDuringProbe(t *testing.T) {
	clock := newFakeClock()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	built := 0
	m := NewManager(Options{
		Clock:       clock,
		StartSpread: -1,
		NewProber: func(Spec, netip.AddrPort) (Prober, error) {
			built++
			if built == 1 {
				return ProberFunc(func(context.Context) error { return nil }), nil
			}
			if built == 2 {
				// The second prober hangs, then fails.
				return ProberFunc(func(context.Context) error {
					started <- struct{}{}
					<-release
					return errDown
				}), nil
			}
			return ProberFunc(func(context.Context) error { return nil }), nil
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	spec := Spec{Kind: KindTCP, Interval: time.Second, Rise: 1, Fall: 1, Jitter: -1}
	if err := m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first probe", func() bool { return m.Stats().Probes == 1 })
	spec.Timeout = 500 * time.Millisecond
	if err := m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	<-started
	spec.Timeout = 700 * time.Millisecond
	if err := m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new check's probe", func() bool { return m.Stats().Probes == 2 })
	close(release)
	waitFor(t, "the hung probe to end", func() bool { return m.Stats().InFlight == 0 })
	st, _ := m.Status("web", be1)
	if st.State != Up || st.Checks[0].Probes != 2 || st.Checks[0].LastError != nil {
		t.Fatalf("after the edit during a probe: %+v; want up, the hung probe's failure dropped", st)
	}
	if n := m.Stats().Probes; n != 2 {
		t.Fatalf("recorded %d probes, want 2", n)
	}
}

// TestManagerShorterIntervalTakesEffect: a check whose interval shrinks
// below the time to its next probe does not wait out the old interval.
func TestManagerShorterIntervalTakesEffect(t *testing.T) {
	r := newRig(t)
	spec := httpSpec()
	spec.Interval = 10 * time.Second
	if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	r.run()
	r.probes(1) // the next is due in 10s
	spec.Interval = time.Second
	if err := r.m.Update([]Target{{Service: "web", Backend: be1, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	r.probes(2) // at once: the rig does not spread first probes
	r.step(time.Second, 3)
	if st := r.status("web", be1); st.State != Up || st.Checks[0].Probes != 3 || st.Checks[0].Transitions != 1 {
		t.Fatalf("after the interval shrank: %+v", st)
	}
}
