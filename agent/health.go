package agent

import (
	"maps"
	"net/netip"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
)

// healthView is the health the agent acts on: the Manager's, except that
// a backend found serving in the kernel at start counts as up until its
// check has probed once. A restart therefore keeps serving, while a cold
// start still waits for the first successful probe.
type healthView struct {
	m       *health.Manager
	adopted map[string]map[netip.AddrPort]bool
}

// Health implements health.HealthSource.
func (h healthView) Health(service string) map[netip.AddrPort]health.State {
	st := h.m.Health(service)
	for addr := range h.adopted[service] {
		if s, ok := h.m.Status(service, addr); ok && unprobed(s) {
			st[addr] = health.Up
		}
	}
	return st
}

func unprobed(s health.Status) bool {
	for _, c := range s.Checks {
		if c.Probes > 0 {
			return false
		}
	}
	return true
}

// adopted lists the backends of cfg's VIP services that the kernel already
// serves with a weight above zero.
func adopted(cfg *config.Config, k lb.Kernel) map[string]map[netip.AddrPort]bool {
	out := map[string]map[netip.AddrPort]bool{}
	if k.IPVS == nil {
		return out
	}
	svcs, err := k.IPVS.Services()
	if err != nil {
		return out
	}
	for _, vs := range cfg.Spec.Services {
		st, ok := svcs[vs.Service.Key]
		if !ok || vs.NodePort {
			continue
		}
		for addr, d := range st.Dests {
			if d.Weight > 0 {
				if out[vs.Name] == nil {
					out[vs.Name] = map[netip.AddrPort]bool{}
				}
				out[vs.Name][addr] = true
			}
		}
	}
	return out
}

// spec returns the configured desired state with cfg as the configuration
// file: cfg's services, then the sources' (see sources.merge).
func (a *Agent) spec(cfg *config.Config) *lb.Spec {
	extra := a.sources.merged()
	holding := a.holding()
	if len(extra) == 0 && !holding {
		return &cfg.Spec
	}
	out := cfg.Spec
	out.HoldOwned = holding
	if len(extra) > 0 {
		out.Services = make([]lb.VirtualService, 0, len(cfg.Spec.Services)+len(extra))
		out.Services = append(append(out.Services, cfg.Spec.Services...), extra...)
	}
	return &out
}

// holding reports whether a source of services has not published yet.
// Until each has, the services vipd owns that nobody names stay as they
// are (lb.Spec.HoldOwned): after a restart they are the sources' until
// the sources say otherwise, and a source whose origin cannot be reached
// keeps them serving.
func (a *Agent) holding() bool {
	for _, src := range a.opts.Sources {
		if _, ok := a.sources.by[src.Name()]; !ok {
			return true
		}
	}
	return false
}

// healthOf returns the health checking of the desired state's services
// with cfg as the configuration file.
func (a *Agent) healthOf(cfg *config.Config) map[string]config.ServiceHealth {
	extra := a.sources.health()
	if len(extra) == 0 {
		return cfg.Health
	}
	out := maps.Clone(cfg.Health)
	if out == nil {
		out = map[string]config.ServiceHealth{}
	}
	maps.Copy(out, extra)
	return out
}

// targets returns the health-check targets of the desired state with cfg
// as the configuration file.
func (a *Agent) targets(cfg *config.Config) []health.Target {
	out := cfg.Targets()
	for _, vs := range a.sources.merged() {
		h, ok := a.sources.health()[vs.Name]
		if !ok {
			continue
		}
		for _, b := range vs.Backends {
			if spec, ok := h.Checks[b.Addr]; ok {
				out = append(out, health.Target{Service: vs.Name, Backend: b.Addr, Spec: *spec})
			}
		}
	}
	return out
}

// desired returns the spec to program with cfg as the configuration file:
// the configured spec with the health policy and the admin drains
// applied, and the health decisions taken. It changes nothing.
func (a *Agent) desired(cfg *config.Config) (*lb.Spec, map[string]health.Decision) {
	spec := a.spec(cfg)
	hs := a.healthOf(cfg)
	if len(hs) == 0 {
		return applyDrains(spec, a.drained), nil
	}
	policies := make(map[string]health.Policy, len(hs))
	for name, h := range hs {
		policies[name] = h.Policy
	}
	spec, decisions := health.ApplySpec(spec, policies, a.health, a.decisions)
	return applyDrains(spec, a.drained), decisions
}

// effective returns the spec a pass programs with cfg as the configuration
// file, and keeps the health decisions it took: a quorum's hysteresis
// depends on the last decision.
func (a *Agent) effective(cfg *config.Config) *lb.Spec {
	spec, decisions := a.desired(cfg)
	if decisions != nil {
		a.decisions = decisions
	}
	return spec
}

// planned returns the spec a pass would program with cfg as the
// configuration file, without taking its decisions: planning does not
// advance the hysteresis.
func (a *Agent) planned(cfg *config.Config) *lb.Spec {
	spec, _ := a.desired(cfg)
	return spec
}

// check points the health checker at the targets of the desired state
// with cfg as the configuration file. A check keeps its state unless its
// target changed (see health.Manager), and a check that cfg drops is
// remembered for a while, so pointing the checker back at the running
// configuration after trying cfg changes no backend's health.
func (a *Agent) check(cfg *config.Config) {
	if err := a.hm.Update(a.targets(cfg)); err != nil {
		a.log.Error("health checks", "err", err)
	}
}

// try points health checking at cfg, which a reload is about to apply,
// and returns what undoes that if cfg is not kept: it points the checker
// back at the running configuration and restores the services' health
// decisions, which effective(cfg) replaced with cfg's, since a quorum's
// hysteresis depends on the last decision the running configuration made.
func (a *Agent) try(cfg *config.Config) (undo func()) {
	saved := a.decisions
	a.check(cfg)
	return func() {
		a.check(a.cfg)
		a.decisions = saved
	}
}
