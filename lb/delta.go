package lb

import (
	"context"
	"maps"
	"slices"
)

// Delta is a change of a Spec confined to some of its services: Old are
// the services the change replaces or removes, New the services that
// replace them. Every other service, and every Spec-wide setting, is
// unchanged.
type Delta struct {
	Old, New []VirtualService
}

// ReconcileDelta applies a change confined to a few services in time
// proportional to the change rather than to the whole table: it reads
// only the IPVS services the change touches (with IPVS.Service), plans
// them alone and applies the result, trusting the last full pass for
// everything else.
//
// A service whose change keeps its settings and its set of backends (a
// backend's weight, say) and that has no backend leaving is not read
// either: the kernel holds what the passes so far left there, which is
// the old desired state of the service, and the plan against that is
// the change's updates alone. Should an update fail (the kernel lost
// the backend behind vipd's back), the services are read and planned
// again, and what that plan applies replaces the failures.
//
// That is only sound while the change leaves everything shared between
// services alone, so ok is false, and nothing is done, unless the old and
// the new services map to the same IPVS service keys, bind and announce
// the same VIPs, ask for the same set entries and sysctls, and are not
// NodePort services (whose keys depend on the host's addresses). The
// caller then runs Reconcile, which handles any change. Drift elsewhere in
// the kernel is left to the next full pass.
func (r *Reconciler) ReconcileDelta(ctx context.Context, spec *Spec, d Delta) (res *Result, ok bool, err error) {
	if r.opts.Kernel.IPVS == nil {
		return nil, false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	oldD, okOld := r.deltaDesired(spec, d.Old)
	newD, okNew := r.deltaDesired(spec, d.New)
	if !okOld || !okNew || !sameShared(oldD, newD) {
		return nil, false, nil
	}
	// The services are vipd's: the last full pass planned them from the
	// same keys. The shared parts are as the full pass left them, so the
	// observation copies them from the desired state and plans nothing
	// for them.
	observed := &State{
		Services: make(map[ServiceKey]*ServiceState, len(newD.Services)),
		VIPs:     newD.VIPs,
		Owned:    newD.Owned,
		Sysctls:  newD.Sysctls,
		Rules:    newD.Rules,
		Announce: newD.Announce,
	}
	trusted := 0
	for key, want := range newD.Services {
		if was := oldD.Services[key]; r.settled(key, was, want) {
			observed.Services[key] = &ServiceState{Service: was.Service, Dests: maps.Clone(was.Dests)}
			trusted++
			continue
		}
		st, err := r.opts.Kernel.IPVS.Service(key)
		if err != nil {
			return nil, true, err
		}
		if st != nil {
			observed.Services[key] = st
		}
	}
	ops := Plan(newD, observed, r.planOptions())
	res = r.apply(ctx, ops, nil, nil)
	if trusted == 0 || len(res.Failed)+len(res.Skipped) == 0 {
		return res, true, nil
	}
	// The kernel did not hold what the last passes left: read the
	// services and plan them again from what they hold now.
	for key := range newD.Services {
		st, err := r.opts.Kernel.IPVS.Service(key)
		if err != nil {
			return res, true, err
		}
		delete(observed.Services, key)
		if st != nil {
			observed.Services[key] = st
		}
	}
	again := r.apply(ctx, Plan(newD, observed, r.planOptions()), nil, nil)
	again.Applied = append(slices.Clip(res.Applied), again.Applied...)
	again.Existed = append(res.Existed, again.Existed...)
	return again, true, nil
}

// settled reports whether the kernel's state of service key can be taken
// to be was, the old desired state of a service changed to want, without
// reading it: both exist, with the same settings and the same backends'
// addresses (the plan then only updates backends, which needs none of
// the kernel's counters), and none of its backends is leaving (the
// kernel holds those besides was's). The caller holds r.mu.
func (r *Reconciler) settled(key ServiceKey, was, want *ServiceState) bool {
	if was == nil || want == nil || was.Service != want.Service || len(was.Dests) != len(want.Dests) {
		return false
	}
	for addr := range want.Dests {
		if _, ok := was.Dests[addr]; !ok {
			return false
		}
	}
	for k := range r.draining {
		if k.svc == key {
			return false
		}
	}
	return true
}

// deltaDesired is the desired state of some services of spec: their IPVS
// services and their share of what services share. ok is false for
// NodePort services.
func (r *Reconciler) deltaDesired(spec *Spec, svcs []VirtualService) (*State, bool) {
	for i := range svcs {
		if svcs[i].NodePort {
			return nil, false
		}
	}
	sub := *spec
	sub.Services = svcs
	d := desired(&sub, Host{Kernel: r.opts.KernelRelease, Dummy: r.opts.Dummy}, len(spec.Services) > 0)
	r.strip(d)
	return d, true
}

// sameShared reports whether two desired states have the same service
// keys and the same shared parts: VIPs, announcements, set entries and
// sysctls. Rule policies come from the Spec, which a Delta leaves alone.
func sameShared(a, b *State) bool {
	if len(a.Services) != len(b.Services) {
		return false
	}
	for k := range a.Services {
		if _, ok := b.Services[k]; !ok {
			return false
		}
	}
	return maps.Equal(a.VIPs, b.VIPs) && maps.Equal(a.Announce, b.Announce) &&
		maps.Equal(a.Rules.Entries, b.Rules.Entries) && maps.Equal(a.Sysctls, b.Sysctls) &&
		maps.Equal(a.Owned, b.Owned)
}
