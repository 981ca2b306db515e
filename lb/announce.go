package lb

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
)

// ReconcileAnnouncements announces and withdraws VIPs as spec asks, and
// changes nothing else: it reads no IPVS service, binds no VIP and
// writes no rule. A change of high-availability role, which turns the
// announcement of every VIP on or off and leaves the rest programmed,
// takes this pass instead of a full one, so that a takeover costs one
// announcement, not a reading of the table. A VIP spec announces must
// already be bound (a full pass did that).
func (r *Reconciler) ReconcileAnnouncements(ctx context.Context, spec *Spec) (*Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	an := r.opts.Kernel.Announcer
	if an == nil {
		return &Result{}, nil
	}
	desired, err := r.Desired(spec)
	if err != nil {
		return nil, err
	}
	observed := make(map[netip.Addr]struct{})
	for _, a := range an.Announced() {
		observed[a] = struct{}{}
	}
	var ops []Op
	for _, a := range slices.SortedFunc(maps.Keys(desired.Announce), netip.Addr.Compare) {
		if _, ok := observed[a]; !ok {
			ops = append(ops, Op{Kind: OpAnnounce, Addr: a})
		}
	}
	for _, a := range slices.SortedFunc(maps.Keys(observed), netip.Addr.Compare) {
		if _, ok := desired.Announce[a]; !ok {
			ops = append(ops, Op{Kind: OpWithdraw, Addr: a})
		}
	}
	res := &Result{}
	for _, op := range ops {
		if err := ctx.Err(); err != nil {
			res.Skipped = append(res.Skipped, op)
			continue
		}
		if err := r.do(op); err != nil {
			res.Failed = append(res.Failed, &OpError{Op: op, Err: err})
			continue
		}
		res.Applied = append(res.Applied, op)
	}
	return res, nil
}

// Reannounce announces every announced VIP again, as after a split
// brain: a new gratuitous ARP / unsolicited NA burst, so that the
// clients that followed another node come back.
func (r *Reconciler) Reannounce() error {
	an := r.opts.Kernel.Announcer
	if an == nil {
		return nil
	}
	var errs []error
	for _, a := range an.Announced() {
		// Withdraw and announce again: the announcer sends a burst for
		// an address it starts answering for.
		if err := an.Withdraw(a); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := an.Announce(a); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
