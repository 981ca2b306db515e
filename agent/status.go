package agent

import (
	"context"
	"net/netip"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/status"
)

// Status returns every service and backend as the agent sees them: the
// desired state joined with the kernel as observed, health and admin
// drains. It reads the kernel at most once per stats_interval (and again
// after a change the agent made), however many ask.
func (a *Agent) Status(ctx context.Context) (*status.Snapshot, error) {
	return a.stats.Get(ctx)
}

// snapshot joins the desired state, the kernel as observed, health and
// admin drains into the status `vipd status` and the metrics show. It
// runs in the main loop, which owns what it joins.
func (a *Agent) snapshot(observed *lb.State) *status.Snapshot {
	opts := status.Options{Spec: a.spec(a.cfg), Observed: observed, Drained: a.drained, Now: time.Now()}
	if hs := a.healthOf(a.cfg); len(hs) > 0 {
		opts.Health = a.hm
		opts.Sorry = map[string]netip.AddrPort{}
		for name, h := range hs {
			if h.Policy.Sorry.Addr.IsValid() {
				opts.Sorry[name] = h.Policy.Sorry.Addr
			}
		}
	}
	snap := status.Build(opts)
	snap.HA = a.haStatus()
	snap.BGP = a.bgpStatus()
	snap.Sources = a.sourceStatus()
	a.annotate(snap)
	return snap
}

// takeStatus takes the snapshot a.stats serves: it reads the services
// outside the main loop (the reconciler's lock keeps the read from
// overlapping a pass), then has the main loop join them with its state.
// a.stats runs one take at a time, at most once per stats_interval
// unless what a snapshot shows changed.
func (a *Agent) takeStatus(ctx context.Context) (snap *status.Snapshot, err error) {
	observed, err := a.r.ObserveServices()
	if err != nil {
		return nil, err
	}
	if err := a.do(ctx, func(context.Context) { snap = a.snapshot(observed) }); err != nil {
		return nil, err
	}
	if a.opts.OnStatus != nil {
		a.opts.OnStatus(snap)
	}
	return snap, nil
}

// changed tells a.stats that a pass with result res changed the kernel,
// if it did.
func (a *Agent) changed(res *lb.Result) {
	if res != nil && len(res.Applied)+len(res.Failed) > 0 {
		a.changes++
	}
	if res != nil && len(res.Applied) > 0 {
		a.stats.Invalidate()
	}
}
