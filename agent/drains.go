package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/agent/ledger"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/status"
)

// applyDrains sets the weight of admin-drained backends to 0 in spec,
// copying what it changes.
func applyDrains(spec *lb.Spec, drained map[status.Ref]struct{}) *lb.Spec {
	if len(drained) == 0 {
		return spec
	}
	out := *spec
	out.Services = slices.Clone(spec.Services)
	for i := range out.Services {
		vs := &out.Services[i]
		var backends []lb.Destination
		for j, b := range vs.Backends {
			_, one := drained[status.Ref{Service: vs.Name, Backend: b.Addr}]
			_, all := drained[status.Ref{Backend: b.Addr}]
			if !one && !all || b.Weight == 0 {
				continue
			}
			if backends == nil {
				backends = slices.Clone(vs.Backends)
			}
			backends[j].Weight = 0
		}
		if backends != nil {
			vs.Backends = backends
		}
	}
	return &out
}

func drainsPath(cfg *config.Config) string { return ledger.DrainsPath(cfg.Daemon.StateDir) }

// loadDrains reads the admin drains, which survive reloads and restarts
// until undone.
func loadDrains(path string) (map[status.Ref]struct{}, error) {
	drains, err := ledger.LoadDrains(path)
	if err != nil {
		return nil, err
	}
	out := make(map[status.Ref]struct{}, len(drains))
	for _, d := range drains {
		out[status.Ref{Service: d.Service, Backend: d.Backend}] = struct{}{}
	}
	return out, nil
}

func storeDrains(path string, drained map[status.Ref]struct{}) error {
	drains := make([]ledger.Drain, 0, len(drained))
	for r := range drained {
		drains = append(drains, ledger.Drain{Service: r.Service, Backend: r.Backend})
	}
	return ledger.StoreDrains(path, drains)
}

// DrainOptions name what to drain or undrain.
type DrainOptions struct {
	// Service is a service's name, or "" for every service that has
	// Backend.
	Service string
	// Backend is the backend's address and port as configured.
	Backend netip.AddrPort
}

// Drain takes a backend out of rotation (weight 0) until Undrain, across
// reloads and restarts, and runs a pass.
func (a *Agent) Drain(ctx context.Context, opts DrainOptions) (Outcome, error) {
	return a.setDrain(ctx, opts, true)
}

// Undrain puts a backend that Drain took out back into rotation, and runs
// a pass.
func (a *Agent) Undrain(ctx context.Context, opts DrainOptions) (Outcome, error) {
	return a.setDrain(ctx, opts, false)
}

func (a *Agent) setDrain(ctx context.Context, opts DrainOptions, on bool) (out Outcome, err error) {
	derr := a.do(ctx, func(ctx context.Context) {
		if err = a.drain(opts.Service, opts.Backend, on); err != nil {
			return
		}
		why := "undrain"
		if on {
			why = "drain"
		}
		a.log.Info("admin "+why, "service", opts.Service, "backend", opts.Backend)
		res := a.reconcile(ctx, why, a.effective(a.cfg))
		a.remember(res)
		out = outcome(res)
	})
	return out, cmpErr(err, derr)
}

// drain drains (on) or undrains a backend of a service ("" for every
// service) and stores the drains.
func (a *Agent) drain(service string, addr netip.AddrPort, on bool) error {
	svcs := a.spec(a.cfg).Services
	if service != "" && !slices.ContainsFunc(svcs, func(vs lb.VirtualService) bool { return vs.Name == service }) {
		return fmt.Errorf("no service %q", service)
	}
	found := false
	for _, vs := range svcs {
		if service != "" && vs.Name != service {
			continue
		}
		for _, b := range vs.Backends {
			found = found || b.Addr == addr
		}
	}
	ref := status.Ref{Service: service, Backend: addr}
	if !found && on {
		return fmt.Errorf("no backend %s in %s", addr, describeService(service))
	}
	next := maps.Clone(a.drained)
	if next == nil {
		next = map[status.Ref]struct{}{}
	}
	if on {
		next[ref] = struct{}{}
	} else {
		if _, ok := next[ref]; !ok {
			return fmt.Errorf("backend %s of %s is not drained", addr, describeService(service))
		}
		delete(next, ref)
	}
	if err := storeDrains(drainsPath(a.cfg), next); err != nil {
		return err
	}
	a.drained = next
	a.stats.Invalidate()
	return nil
}

func describeService(s string) string {
	if s == "" {
		return "any service"
	}
	return fmt.Sprintf("service %q", s)
}
