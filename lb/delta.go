package lb

import (
	"context"
	"maps"
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
	for key := range newD.Services {
		st, err := r.opts.Kernel.IPVS.Service(key)
		if err != nil {
			return nil, true, err
		}
		if st != nil {
			observed.Services[key] = st
		}
	}
	ops := Plan(newD, observed, r.planOptions())
	return r.apply(ctx, ops, nil, nil), true, nil
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
