package agent

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeLinks are the node's interfaces as Options.LinkUp and
// Options.WatchLinks see them: set changes one and sends a link message.
type fakeLinks struct {
	mu      sync.Mutex
	up      map[string]bool
	changed chan struct{}
}

func newFakeLinks(names ...string) *fakeLinks {
	l := &fakeLinks{up: map[string]bool{}, changed: make(chan struct{}, 1)}
	for _, n := range names {
		l.up[n] = true
	}
	return l
}

func (l *fakeLinks) options(o *Options) {
	o.LinkUp = l.linkUp
	o.WatchLinks = func(context.Context) <-chan struct{} { return l.changed }
}

func (l *fakeLinks) linkUp(name string) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	up, ok := l.up[name]
	if !ok {
		return false, fmt.Errorf("no interface %s", name)
	}
	return up, nil
}

// set sets an interface up or down and sends a link message; it returns
// when.
func (l *fakeLinks) set(name string, up bool) time.Time {
	l.mu.Lock()
	l.up[name] = up
	l.mu.Unlock()
	at := time.Now()
	select {
	case l.changed <- struct{}{}:
	default:
	}
	return at
}

// linkBound is how soon the agent must react to a link message: well
// below the one-second check that backs the messages up, so that a
// test of several changes cannot pass on that check alone, with room
// for a loaded host.
const linkBound = 500 * time.Millisecond

// within waits until cond holds, failing t after 5 s; it returns how long
// it took since since.
func within(t *testing.T, what string, since time.Time, cond func() bool) time.Duration {
	t.Helper()
	for !cond() {
		if time.Since(since) > 5*time.Second {
			t.Fatalf("%s: not after 5 s", what)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(since)
}

// quick checks that link messages, not the one-second check, brought
// the reactions ds: each within 2 s, and all but at most maxLate within
// bound (a host that stalls may delay some). The check alone, at a
// random phase, would bring each within bound with the chance bound/1 s.
func quick(t *testing.T, what string, ds []time.Duration, bound time.Duration, maxLate int) {
	t.Helper()
	late := 0
	for _, d := range ds {
		if d > 2*time.Second {
			t.Errorf("%s: one after %v, want each within 2 s", what, d)
		}
		if d > bound {
			late++
		}
	}
	if late > maxLate {
		t.Errorf("%s: %d of %d after more than %v (%v), want at most %d: a link message, not the periodic check", what, late, len(ds), bound, ds, maxLate)
	}
}

// TestHALinkMessages: a link message makes the agent look at its [ha]
// interface and track_interfaces at once: the node stands back as its
// interface goes down and takes part again as it comes back, and its
// priority follows a tracked interface, each well within the periodic
// check's second.
func TestHALinkMessages(t *testing.T) {
	links := newFakeLinks("eth0", "eth1")
	e := &fakeElector{}
	newRigWith(t, haSection("track_interfaces = [\"eth1\"]\ntrack_priority = 50")+services(1, 1), func(o *Options) {
		o.OpenElector = func(opts ElectorOptions) (Elector, error) { e.opts = opts; return e, nil }
		links.options(o)
	})
	locked := func(f func() bool) func() bool {
		return func() bool { e.mu.Lock(); defer e.mu.Unlock(); return f() }
	}
	var ds []time.Duration
	for i := range 3 {
		at := links.set("eth0", false)
		down := within(t, "stood back", at, locked(func() bool { return len(e.resigned) == i+1 }))
		at = links.set("eth0", true)
		up := within(t, "took part again", at, locked(func() bool { return e.resumed == i+1 }))
		at = links.set("eth1", false)
		lowered := within(t, "priority lowered", at, func() bool { return e.lastPriority() == 100 })
		at = links.set("eth1", true)
		raised := within(t, "priority raised", at, func() bool { return e.lastPriority() == 150 })
		t.Logf("interface down %v, up %v; tracked interface down %v, up %v", down, up, lowered, raised)
		ds = append(ds, down, up, lowered, raised)
	}
	quick(t, "reactions to link messages", ds, linkBound, 1)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.resigned[0] != "interface eth0 down" {
		t.Errorf("resigned for %q", e.resigned[0])
	}
}

// TestBGPTrackInterfaces: with [bgp] track_interfaces, a node withdraws
// every route as soon as a tracked interface goes down (a link message),
// says why in its status, and announces them again as soon as it is up.
func TestBGPTrackInterfaces(t *testing.T) {
	links := newFakeLinks("eth1", "eth2")
	f := &fakeAnnouncer{}
	section := strings.Replace(bgpSection, "med = 5\n", "med = 5\ntrack_interfaces = [\"eth1\", \"eth2\"]\n", 1)
	r := newRigWith(t, section+services(2, 1), func(o *Options) {
		o.OpenAnnouncer = func(_ context.Context, opts AnnouncerOptions) (Announcer, error) {
			f.opts = opts
			return f, nil
		}
		links.options(o)
	})
	all := []string{"192.0.2.10/32 med=5", "192.0.2.11/32 communities=[4259840001] med=5"}
	f.waitRoutes(t, all...)
	is := func(want ...string) func() bool {
		return func() bool { return strings.Join(f.announced(), "|") == strings.Join(want, "|") }
	}
	ctx := context.Background()
	var ds []time.Duration
	for i := range 5 {
		at := links.set("eth2", false)
		down := within(t, "withdrawn", at, is())
		st, err := r.a.Status(ctx)
		if err != nil || len(st.BGP.Withheld) != 2 || st.BGP.Withheld[0].Reason != "interface down: eth2" {
			t.Errorf("status %+v %v", st.BGP, err)
		}
		at = links.set("eth2", true)
		up := within(t, "announced again", at, is(all...))
		t.Logf("cut %d: withdrawn %v after the interface went down, announced again %v after it came up", i, down, up)
		ds = append(ds, down, up)
	}
	quick(t, "withdrawals and announcements", ds, linkBound, 1)
	if f.retired != 0 {
		t.Errorf("retired %d times: a lost link withdraws at once, without GRACEFUL_SHUTDOWN", f.retired)
	}
	// A reload that stops tracking the interface that is down announces
	// the routes again.
	links.set("eth2", false)
	f.waitRoutes(t)
	r.write(strings.Replace(section, `track_interfaces = ["eth1", "eth2"]`, `track_interfaces = ["eth1"]`, 1) + services(2, 1))
	if _, err := r.a.Reload(ctx, ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitRoutes(t, all...)
	if got := r.log.String(); !strings.Contains(got, `reason=interface_down`) {
		t.Errorf("no withdrawal for interface_down in the log:\n%s", got)
	}
}
