package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/status"
	"github.com/vipd/vipd/source"
)

// fileSource names the configuration file among the sources.
const fileSource = "file"

// ErrStopped is the error of a request to an agent that is not running.
var ErrStopped = errors.New("vipd is not running")

// sources holds what the sources other than the file publish, and which
// of their services the agent took: a service whose name or key another
// source (the file included) owns is refused, and the owner keeps it.
// It is owned by the main loop, except reported, which Report sets from
// the sources' goroutines.
type sources struct {
	by map[string]*sourceState
	// extra and checks are the taken services of every source, in the
	// order of the sources' names, and their health checking.
	extra  []lb.VirtualService
	checks map[string]config.ServiceHealth
	// at holds the position of each service of extra, by name.
	at map[string]int

	mu       sync.Mutex
	reported map[string]error
}

// sourceState is one source's last snapshot and what of it was taken.
type sourceState struct {
	snap  source.Snapshot
	taken map[string]bool
}

func (s *sources) merged() []lb.VirtualService             { return s.extra }
func (s *sources) health() map[string]config.ServiceHealth { return s.checks }
func (s *sources) services() int                           { return len(s.extra) }

func (s *sources) backends() int {
	n := 0
	for i := range s.extra {
		n += len(s.extra[i].Backends)
	}
	return n
}

// owners indexes who owns each name and key: the configuration file's
// services, then those the sources took.
type owners struct {
	names map[string]string // service name -> source
	keys  map[lb.ServiceKey]string
	// svc names the service that owns a key.
	svc map[lb.ServiceKey]string
}

func newOwners() owners {
	return owners{names: map[string]string{}, keys: map[lb.ServiceKey]string{}, svc: map[lb.ServiceKey]string{}}
}

// claim gives vs to src unless its name or key is taken; it returns the
// conflict otherwise.
func (o owners) claim(src string, vs *lb.VirtualService) (source.Conflict, bool) {
	if owner, ok := o.names[vs.Name]; ok {
		return source.Conflict{Service: vs.Name, Owner: owner, OwnerService: vs.Name}, false
	}
	k := vs.Service.Key
	if owner, ok := o.keys[k]; ok {
		return source.Conflict{Service: vs.Name, Key: k, Owner: owner, OwnerService: o.svc[k]}, false
	}
	o.names[vs.Name], o.keys[k], o.svc[k] = src, src, vs.Name
	return source.Conflict{}, true
}

// rebuild takes the sources' services with cfg as the configuration
// file: what each source was given before keeps it, then the rest is
// taken in the order of the sources' names where nobody owns it. It
// returns the conflicts of each source's snapshot, and the host VIPs are
// refused by hostVIPs (see Agent.refuseHostVIPs).
func (s *sources) rebuild(cfg *config.Config, refuse func([]lb.VirtualService) map[string]source.Conflict) map[string][]source.Conflict {
	o := newOwners()
	for i := range cfg.Spec.Services {
		o.claim(fileSource, &cfg.Spec.Services[i])
	}
	names := slices.Sorted(maps.Keys(s.by))
	taken := map[string]map[string]bool{}
	conflicts := map[string][]source.Conflict{}
	for _, name := range names {
		st := s.by[name]
		taken[name] = map[string]bool{}
		for i := range st.snap.Services {
			vs := &st.snap.Services[i]
			if st.taken[vs.Name] && config.CheckSourceService(vs) == nil {
				if _, ok := o.claim(name, vs); ok {
					taken[name][vs.Name] = true
				}
			}
		}
	}
	for _, name := range names {
		st := s.by[name]
		for i := range st.snap.Services {
			vs := &st.snap.Services[i]
			if taken[name][vs.Name] {
				continue
			}
			if err := config.CheckSourceService(vs); err != nil {
				conflicts[name] = append(conflicts[name], source.Conflict{Service: vs.Name, Reason: "invalid service: " + err.Error()})
				continue
			}
			if c, ok := o.claim(name, vs); ok {
				taken[name][vs.Name] = true
			} else {
				conflicts[name] = append(conflicts[name], c)
			}
		}
	}
	s.extra, s.checks = nil, nil
	defer func() {
		s.at = make(map[string]int, len(s.extra))
		for i := range s.extra {
			s.at[s.extra[i].Name] = i
		}
	}()
	for _, name := range names {
		st := s.by[name]
		var mine []lb.VirtualService
		for _, vs := range st.snap.Services {
			if taken[name][vs.Name] {
				mine = append(mine, vs)
			}
		}
		for vsName, c := range refuse(mine) {
			delete(taken[name], vsName)
			conflicts[name] = append(conflicts[name], c)
		}
		st.taken = taken[name]
		for _, vs := range st.snap.Services {
			if !st.taken[vs.Name] {
				continue
			}
			s.extra = append(s.extra, vs)
			if h, ok := st.snap.Health[vs.Name]; ok {
				if s.checks == nil {
					s.checks = map[string]config.ServiceHealth{}
				}
				s.checks[vs.Name] = h
			}
		}
	}
	return conflicts
}

// claimedByOthers returns an error when a service of the configuration
// file, one of svcs, has a name or key that a source owns: the file
// cannot take it from the source.
func (s *sources) claimedByOthers(svcs []lb.VirtualService) error {
	if len(s.extra) == 0 {
		return nil
	}
	o := newOwners()
	for i := range s.extra {
		vs := &s.extra[i]
		for name, st := range s.by {
			if st.taken[vs.Name] {
				o.claim(name, vs)
			}
		}
	}
	var errs []error
	for i := range svcs {
		if c, ok := o.claim(fileSource, &svcs[i]); !ok {
			errs = append(errs, c)
		}
	}
	return errors.Join(errs...)
}

// runSources runs every source until ctx ends; the returned function
// stops them and waits for them to end. A source that fails sends its
// error to errs.
func (a *Agent) runSources(ctx context.Context, errs chan<- error) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, src := range a.opts.Sources {
		if pc, ok := src.(poolCounter); ok {
			a.m.Pools(pc.EachPool)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := src.Run(ctx, sink{a: a, name: src.Name()}); err != nil && ctx.Err() == nil {
				select {
				case errs <- fmt.Errorf("source %s: %w", src.Name(), err):
				case <-ctx.Done():
				}
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// sink is a source's handle on the agent.
type sink struct {
	a    *Agent
	name string
}

// Publish implements source.Sink.
func (s sink) Publish(ctx context.Context, snap source.Snapshot) (conflicts []source.Conflict, err error) {
	derr := s.a.do(ctx, func(ctx context.Context) { conflicts = s.a.publish(ctx, s.name, snap) })
	return conflicts, derr
}

// Report implements source.Sink.
func (s sink) Report(err error) {
	ss := &s.a.sources
	ss.mu.Lock()
	defer ss.mu.Unlock()
	was, known := ss.reported[s.name]
	if known && (was == nil) == (err == nil) {
		ss.reported[s.name] = err
		return
	}
	defer s.a.stats.Invalidate()
	if ss.reported == nil {
		ss.reported = map[string]error{}
	}
	ss.reported[s.name] = err
	s.a.m.Source(s.name, err == nil)
	if err != nil {
		s.a.log.Warn("source out of step; its last services keep serving", "source", s.name, "err", err)
	} else if known {
		s.a.log.Info("source in step again", "source", s.name)
	}
}

// publish takes a source's snapshot in the main loop and runs a pass.
func (a *Agent) publish(ctx context.Context, name string, snap source.Snapshot) []source.Conflict {
	if a.sources.by == nil {
		a.sources.by = map[string]*sourceState{}
	}
	st := a.sources.by[name]
	if st == nil {
		st = &sourceState{}
		a.sources.by[name] = st
	}
	if snap.Changed != nil && a.publishChanged(ctx, name, st, snap) {
		return nil
	}
	st.snap = snap
	conflicts := a.sources.rebuild(a.cfg, a.hostVIPConflicts)
	for _, c := range conflicts[name] {
		a.log.Warn("service refused", "source", name, "err", c)
	}
	a.check(a.cfg)
	a.remember(a.reconcile(ctx, "source "+name, a.effective(a.cfg)))
	a.stats.Invalidate()
	return conflicts[name]
}

// publishChanged takes a source's snapshot that differs from its last
// one only in the services it names as changed (source.Snapshot.Changed)
// with a pass over those services alone (see passOver), in time that
// does not grow with the number of services. It returns false, having
// changed nothing, when it cannot: the hint does not hold (a service is
// not one the agent took, or its key or VIP changed), a changed service
// is health checked, or operations are failing; the caller then takes
// the snapshot whole, with a full pass.
func (a *Agent) publishChanged(ctx context.Context, name string, st *sourceState, snap source.Snapshot) bool {
	ss := &a.sources
	if len(a.failing) > 0 || a.ledgerFailing || len(snap.Services) != len(st.snap.Services) {
		return false
	}
	byName := func(vs lb.VirtualService, n string) int { return strings.Compare(vs.Name, n) }
	old := make([]lb.VirtualService, 0, len(snap.Changed))
	cur := make([]lb.VirtualService, 0, len(snap.Changed))
	at := make([]int, 0, len(snap.Changed))
	for _, n := range snap.Changed {
		i, ok := slices.BinarySearchFunc(snap.Services, n, byName)
		p, taken := ss.at[n]
		if !ok || !taken || !st.taken[n] {
			return false
		}
		nv, ov := snap.Services[i], ss.extra[p]
		if nv.Service.Key != ov.Service.Key || nv.VIP != ov.VIP || config.CheckSourceService(&nv) != nil {
			return false
		}
		if _, ok := snap.Health[n]; ok {
			return false
		}
		if _, ok := st.snap.Health[n]; ok {
			return false
		}
		old, cur, at = append(old, ov), append(cur, nv), append(at, p)
	}
	st.snap = snap
	for k, p := range at {
		ss.extra[p] = cur[k]
	}
	defer a.stats.Invalidate()
	why := "source " + name
	// The pass reads the Spec's settings, not its services: the spec
	// holds the changed ones alone, not a copy of every service.
	spec := a.cfg.Spec
	spec.HoldOwned = a.holding()
	spec.Services = cur
	res := a.passOver(ctx, why, &spec, old, cur)
	if res == nil {
		// Declined (the change reaches what services share) or the
		// services could not be read: a full pass over the same state.
		a.remember(a.reconcile(ctx, why, a.effective(a.cfg)))
		return true
	}
	for _, f := range res.Failed {
		if a.failing == nil {
			a.failing = map[lb.OpKey]bool{}
		}
		a.failing[f.Op.Key()] = true
	}
	return true
}

// retake takes the sources' services again after the configuration
// file changed, and runs a pass if that changed what the sources have:
// the file may have let go of a name or key a source asked for.
func (a *Agent) retake(ctx context.Context) {
	if len(a.sources.by) == 0 {
		return
	}
	before := names(a.sources.extra)
	a.sources.rebuild(a.cfg, a.hostVIPConflicts)
	if !slices.Equal(before, names(a.sources.extra)) {
		a.check(a.cfg)
		a.remember(a.reconcile(ctx, "sources", a.effective(a.cfg)))
	}
}

func names(svcs []lb.VirtualService) []string {
	out := make([]string, len(svcs))
	for i := range svcs {
		out[i] = svcs[i].Name
	}
	return out
}

// hostVIPConflicts returns, by name, the services of svcs whose VIP is an
// address of another interface of the host.
func (a *Agent) hostVIPConflicts(svcs []lb.VirtualService) map[string]source.Conflict {
	found, err := a.r.HostVIPs(svcs)
	if err != nil {
		a.log.Warn("cannot check the sources' VIPs against the host's addresses", "err", err)
		return nil
	}
	out := map[string]source.Conflict{}
	for _, h := range found {
		out[h.Service] = source.Conflict{Service: h.Service,
			Reason: fmt.Sprintf("vip %s is an address of interface %s, not of vipd's interface %s", h.VIP, h.Interface, a.cfg.Daemon.Interface)}
	}
	return out
}

// sourceStatus is the sources' state for vipd status.
func (a *Agent) sourceStatus() []status.Source {
	var out []status.Source
	for _, src := range a.opts.Sources {
		name := src.Name()
		st := status.Source{Name: name}
		if s := a.sources.by[name]; s != nil {
			st.Services = len(s.taken)
		}
		a.sources.mu.Lock()
		if err := a.sources.reported[name]; err != nil {
			st.Error = err.Error()
		}
		a.sources.mu.Unlock()
		out = append(out, st)
	}
	return out
}
