package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vipd/vipd/agent/ledger"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/status"
)

// snapshot joins the running configuration, the kernel as observed,
// health and admin drains into the status `vipd status` and the metrics
// show. It runs in the main loop, which owns what it joins.
func (d *daemon) snapshot(observed *lb.State) *status.Snapshot {
	opts := status.Options{Spec: &d.cfg.Spec, Observed: observed, Drained: d.drained, Now: time.Now()}
	if len(d.cfg.Health) > 0 {
		opts.Health = d.hm
		opts.Sorry = map[string]netip.AddrPort{}
		for name, h := range d.cfg.Health {
			if h.Policy.Sorry.Addr.IsValid() {
				opts.Sorry[name] = h.Policy.Sorry.Addr
			}
		}
	}
	return status.Build(opts)
}

// takeStatus takes the snapshot d.stats serves: it reads the services
// outside the main loop (the reconciler's lock keeps the read from
// overlapping a pass), then has the main loop join them with its state.
// d.stats runs one take at a time, at most once per stats_interval
// unless what a snapshot shows changed.
func (d *daemon) takeStatus(ctx context.Context) (*status.Snapshot, error) {
	observed, err := d.r.ObserveServices()
	if err != nil {
		return nil, err
	}
	rep, err := d.ask(ctx, request{kind: "snapshot", observed: observed})
	if err != nil {
		return nil, err
	}
	return rep.Status, nil
}

// changed tells d.stats that a pass with result res changed the kernel,
// if it did.
func (d *daemon) changed(res *lb.Result) {
	if res != nil && len(res.Applied) > 0 {
		d.stats.Invalidate()
	}
}

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
	slices.SortFunc(entries, func(a, b drainEntry) int {
		if a.Service != b.Service {
			if a.Service < b.Service {
				return -1
			}
			return 1
		}
		return a.Backend.Compare(b.Backend)
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

// drain drains (on) or undrains a backend of a service ("" or "*" for
// every service) and stores the drains.
func (d *daemon) drain(service, backend string, on bool) error {
	if service == "*" {
		service = ""
	}
	addr, err := netip.ParseAddrPort(backend)
	if err != nil {
		return fmt.Errorf("backend %q is not address:port", backend)
	}
	if service != "" && !slices.ContainsFunc(d.cfg.Spec.Services, func(vs lb.VirtualService) bool { return vs.Name == service }) {
		return fmt.Errorf("no service %q", service)
	}
	found := false
	for _, vs := range d.cfg.Spec.Services {
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
	next := make(map[status.Ref]struct{}, len(d.drained)+1)
	for r := range d.drained {
		next[r] = struct{}{}
	}
	if on {
		next[ref] = struct{}{}
	} else {
		if _, ok := next[ref]; !ok {
			return fmt.Errorf("backend %s of %s is not drained", addr, describeService(service))
		}
		delete(next, ref)
	}
	if err := storeDrains(drainsPath(d.cfg), next); err != nil {
		return err
	}
	d.drained = next
	d.stats.Invalidate()
	return nil
}

func describeService(s string) string {
	if s == "" {
		return "any service"
	}
	return fmt.Sprintf("service %q", s)
}
