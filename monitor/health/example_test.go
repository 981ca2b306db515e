package health_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
)

// Example shows how a daemon wires health checks between its
// configuration and the reconciler: the Manager checks the backends, and
// every pass reconciles the spec that ApplySpec derives from the
// configured one, so the lb package itself never sees health.
func Example() {
	ctx := context.Background()
	spec := &lb.Spec{} // from config.Load
	check := health.Spec{Kind: health.KindHTTP, Interval: 2 * time.Second, HTTP: health.HTTPOptions{Path: "/healthz"}}
	policies := map[string]health.Policy{} // by service name, from the configuration
	for _, vs := range spec.Services {
		policies[vs.Name] = health.Policy{Action: health.Quiesce, Quorum: 1}
	}

	// A transition asks for a pass; passes coalesce.
	changed := make(chan struct{}, 1)
	m := health.NewManager(health.Options{
		Logger: slog.Default(),
		OnTransition: func(health.Transition) {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	})
	// On start and on every reload: one target per checked backend.
	var targets []health.Target
	for _, vs := range spec.Services {
		for _, b := range vs.Backends {
			targets = append(targets, health.Target{Service: vs.Name, Backend: b.Addr, Spec: check})
		}
	}
	if err := m.Update(targets); err != nil {
		slog.Error("health checks", "err", err)
	}
	go func() { _ = m.Run(ctx) }()

	r := lb.NewReconciler(lb.Options{})
	var prev map[string]health.Decision
	pass := func() {
		var effective *lb.Spec
		effective, prev = health.ApplySpec(spec, policies, m, prev)
		if _, err := r.Reconcile(ctx, effective); err != nil {
			slog.Error("reconcile", "err", err)
		}
	}
	resync := time.NewTicker(30 * time.Second)
	defer resync.Stop()
	for range 1 { // a daemon loops until it stops
		select {
		case <-changed:
		case <-resync.C:
		}
		pass()
	}
}
