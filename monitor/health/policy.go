package health

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/vipd/vipd/lb"
)

// Action is what happens to a failed backend.
type Action uint8

// The failure actions.
const (
	// Quiesce keeps a failed backend with weight 0: IPVS sends it no new
	// connections but keeps the existing ones, which may still work.
	Quiesce Action = iota
	// Remove drops a failed backend from the service. What happens to its
	// connections is the reconciler's business, as for any removed
	// backend: with drain on, it is drained (weight 0 until idle or the
	// drain timeout); with drain off it is deleted at once and, with
	// expire_nodest_conn set, its connections are dropped.
	Remove
)

// String returns the action's configuration name.
func (a Action) String() string {
	switch a {
	case Quiesce:
		return "quiesce"
	case Remove:
		return "remove"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ParseAction parses "quiesce" or "remove".
func ParseAction(s string) (Action, error) {
	switch strings.ToLower(s) {
	case "quiesce":
		return Quiesce, nil
	case "remove":
		return Remove, nil
	}
	return 0, fmt.Errorf("unknown failure action %q (want quiesce or remove)", s)
}

// Policy is what a service does with its backends' health.
type Policy struct {
	// Action is what happens to a failed backend.
	Action Action
	// Quorum is the fewest healthy backends the service trusts its checks
	// with; zero turns quorum off. Below it the service fails open: every
	// configured backend is programmed at its configured weight, health
	// ignored. A mass failure is more often the checks' fault (or the
	// network's) than the backends', and if it is real, spreading the
	// load over every backend is no worse than piling it on the few that
	// pass. Quorum 1 fails open only when every backend is down.
	Quorum int
	// Hysteresis delays the return to normal: once quorum is lost, it is
	// regained only with Quorum+Hysteresis healthy backends, so a count
	// hovering at the quorum does not flap the whole service.
	Hysteresis int
	// Sorry is a fallback backend (its Addr set) used alone when no
	// backend is healthy; it takes precedence over failing open. A zero
	// weight counts as 1. It is a backend like the others, forwarded by
	// its own Forward method.
	Sorry lb.Destination
}

// Validate reports a policy's problems.
func (p Policy) Validate() error {
	switch {
	case p.Action != Quiesce && p.Action != Remove:
		return fmt.Errorf("failure action %s is unknown", p.Action)
	case p.Quorum < 0:
		return fmt.Errorf("quorum %d is negative", p.Quorum)
	case p.Hysteresis < 0:
		return fmt.Errorf("quorum hysteresis %d is negative", p.Hysteresis)
	case p.Hysteresis > 0 && p.Quorum == 0:
		return fmt.Errorf("quorum hysteresis %d without a quorum", p.Hysteresis)
	}
	return nil
}

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
