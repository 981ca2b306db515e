package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
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

// drainEntry is the stored form of an admin drain.
type drainEntry struct {
	Service string         `json:"service,omitempty"`
	Backend netip.AddrPort `json:"backend"`
}

func drainsPath(cfg *config.Config) string { return filepath.Join(cfg.Daemon.StateDir, "drained.json") }

// loadDrains reads the admin drains, which survive reloads and restarts
// until undone.
func loadDrains(path string) (map[status.Ref]struct{}, error) {
	out := map[status.Ref]struct{}{}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read drains: %w", err)
	}
	// The file is the JSON array storeDrains writes, or corrupt.
	corrupt := func(err error) error { return &ledger.CorruptError{Path: path, Err: err} }
	text := bytes.TrimSpace(data)
	if len(text) == 0 {
		return nil, corrupt(errors.New("the file is empty"))
	}
	var entries []drainEntry
	if err := json.Unmarshal(text, &entries); err != nil {
		return nil, corrupt(err)
	}
	if text[0] != '[' {
		return nil, corrupt(errors.New("not a list of drains"))
	}
	for i, e := range entries {
		if !e.Backend.IsValid() {
			return nil, corrupt(fmt.Errorf("drain %d has no backend", i+1))
		}
		out[status.Ref{Service: e.Service, Backend: e.Backend}] = struct{}{}
	}
	return out, nil
}

func storeDrains(path string, drained map[status.Ref]struct{}) error {
	entries := make([]drainEntry, 0, len(drained))
	for r := range drained {
		entries = append(entries, drainEntry{Service: r.Service, Backend: r.Backend})
	}
	slices.SortFunc(entries, func(x, y drainEntry) int {
		return cmp.Or(cmp.Compare(x.Service, y.Service), x.Backend.Compare(y.Backend))
	})
	data, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		return err
	}
	if err := ledger.WriteFile(path, data, 0o640); err != nil {
		return fmt.Errorf("store drains: %w", err)
	}
	return nil
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
