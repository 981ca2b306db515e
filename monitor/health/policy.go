package health

import (
	"net/netip"

	"github.com/vipd/vipd/lb"
)

// Decision is what Apply chose for a service.
type Decision struct {
	// Backends are the destinations to program, with effective weights.
	Backends []lb.Destination
	// Healthy counts the configured backends that are up with a weight
	// above zero: the ones that take new connections on their merit.
	Healthy int
	// QuorumLost reports that the service failed open (or would have,
	// had the sorry backend not taken over). Pass the Decision to the
	// next Apply for the service, which needs it for hysteresis.
	QuorumLost bool
	// Sorry reports that the sorry backend is in use.
	Sorry bool
}

// Apply chooses the backends to program for a service with the configured
// backends, their health and policy p; prev is the Decision of the
// previous call for the service (zero on the first). A backend absent from
// health has no check and is up. Backends keep their order, the sorry
// backend last.
//
// Healthy backends keep their configured weight (an operator's weight 0
// stays 0). Failed backends get weight 0 or are left out, by p.Action.
// With no healthy backend and a sorry backend, the sorry backend is added
// (replacing a configured backend of the same address). Otherwise, below
// the quorum, every configured backend is kept as configured.
func Apply(backends []lb.Destination, health map[netip.AddrPort]State, p Policy, prev Decision) Decision {
	d := Decision{}
	for _, b := range backends {
		if b.Weight > 0 && up(health, b.Addr) {
			d.Healthy++
		}
	}
	if p.Quorum > 0 {
		need := p.Quorum
		if prev.QuorumLost {
			need += p.Hysteresis
		}
		d.QuorumLost = d.Healthy < need
	}
	sorry := p.Sorry.Addr.IsValid() && d.Healthy == 0
	if d.QuorumLost && !sorry {
		d.Backends = append([]lb.Destination(nil), backends...)
		return d
	}
	d.Backends = make([]lb.Destination, 0, len(backends)+1)
	for _, b := range backends {
		switch {
		case sorry && b.Addr == p.Sorry.Addr:
			continue
		case up(health, b.Addr):
		case p.Action == Remove:
			continue
		default:
			b.Weight = 0
		}
		d.Backends = append(d.Backends, b)
	}
	if sorry {
		s := p.Sorry
		if s.Weight == 0 {
			s.Weight = 1
		}
		d.Backends = append(d.Backends, s)
		d.Sorry = true
	}
	return d
}

func up(health map[netip.AddrPort]State, addr netip.AddrPort) bool {
	s, ok := health[addr]
	return !ok || s == Up
}

// HealthSource reports the health of a service's checked backends;
// *Manager is one.
type HealthSource interface {
	Health(service string) map[netip.AddrPort]State
}

// ApplySpec returns a copy of spec whose services' backends are what Apply
// chooses, with each service's policy from policies (the zero Policy if
// absent) and health from src, and the decisions by service name to pass
// as prev next time. spec itself is not changed.
//
// It is how health reaches the kernel without the lb package knowing
// about health checks: the daemon reconciles ApplySpec's result instead of
// the configured spec, on every pass and whenever the Manager reports a
// transition.
func ApplySpec(spec *lb.Spec, policies map[string]Policy, src HealthSource, prev map[string]Decision) (*lb.Spec, map[string]Decision) {
	out := *spec
	out.Services = make([]lb.VirtualService, len(spec.Services))
	decisions := make(map[string]Decision, len(spec.Services))
	for i, vs := range spec.Services {
		d := Apply(vs.Backends, src.Health(vs.Name), policies[vs.Name], prev[vs.Name])
		vs.Backends = d.Backends
		out.Services[i] = vs
		decisions[vs.Name] = d
	}
	return &out, decisions
}
