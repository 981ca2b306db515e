package lb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"
)

// apply applies ops, a plan from desired and observed (both nil for an
// arbitrary list of operations, see Apply), and returns what it reached.
// It records ownership in the ledger before it creates anything and after
// it deleted, runs the operations in order, continuing past failures, and
// skips those that depend on a failed one.
func (r *Reconciler) apply(ctx context.Context, ops []Op, desired, observed *State) *Result {
	res := &Result{}
	if len(ops) == 0 {
		return res
	}
	// Record ownership before creating anything, so a crash mid-pass
	// never leaves a service vipd created but no longer knows it owns.
	if err := r.storeOwned(r.ownedBefore(desired, observed), observed); err != nil {
		res.Ledger = err
		res.Skipped = ops
		return res
	}
	p := newPass(ctx, r, desired, res, len(ops))
	p.run(ops)
	res.Ledger = r.storeOwned(r.ownedAfter(desired, observed, res), observed)
	return res
}

// ownedBefore is what the ledger lists while a pass runs: what desired
// wants and what observed owns that is still there. What the ledger lists
// and observed lacks is gone: observe read it again (confirmOwned). It
// is nil, for no change of the ledger, without a desired state.
func (r *Reconciler) ownedBefore(desired, observed *State) map[ServiceKey]struct{} {
	if desired == nil {
		return nil
	}
	owned := cloneMap(desired.Owned)
	for key := range observed.Owned {
		if _, live := observed.Services[key]; live {
			owned[key] = struct{}{}
		}
	}
	return owned
}

// ownedAfter is what the ledger lists after a pass: what desired wants,
// and what vipd owned that is still there (deletions that failed, services
// left draining).
func (r *Reconciler) ownedAfter(desired, observed *State, res *Result) map[ServiceKey]struct{} {
	if desired == nil {
		return nil
	}
	owned := cloneMap(desired.Owned)
	deleted := map[ServiceKey]bool{}
	for i := range res.Applied {
		if op := &res.Applied[i]; op.Kind == OpDeleteService {
			deleted[op.Service.Key] = true
		}
	}
	for key := range observed.Services {
		if observed.Owns(key) && !deleted[key] {
			owned[key] = struct{}{}
		}
	}
	return owned
}

// storeOwned stores owned in the ledger when it differs from what
// observed says the ledger holds, and then records it there. A nil owned
// changes nothing.
func (r *Reconciler) storeOwned(owned map[ServiceKey]struct{}, observed *State) error {
	if r.opts.Kernel.Ledger == nil || owned == nil || maps.Equal(owned, observed.Owned) {
		return nil
	}
	if err := r.opts.Kernel.Ledger.Store(owned); err != nil {
		return fmt.Errorf("store ownership ledger: %w", err)
	}
	observed.Owned = owned
	return nil
}

// pass is one run of apply over a plan's operations.
type pass struct {
	ctx     context.Context
	r       *Reconciler
	desired *State
	res     *Result
	// failedSvc and failedBind hold the services and VIPs whose addition
	// failed: their backends and announcements are skipped.
	failedSvc  map[ServiceKey]bool
	failedBind map[netip.Addr]bool
	// failedAllow holds the restrictions (SetRestricted entries) one of
	// whose admitted sources failed to be added, and failedUnrestrict
	// those that failed to be deleted: the restriction is not added,
	// and its sources are not deleted, which would drop admitted
	// sources.
	failedAllow      map[SetEntry]bool
	failedUnrestrict map[SetEntry]bool
	found            found
	log              opLog
	// binds are VIP binds running in the background, or nil.
	binds *binds
}

func newPass(ctx context.Context, r *Reconciler, desired *State, res *Result, n int) *pass {
	// A large pass (a cold start) logs one line per kind of operation at
	// info and one per operation only at debug: at a hundred thousand
	// operations the lines cost more than the operations.
	each := n <= LogEachMax
	return &pass{
		ctx: ctx, r: r, desired: desired, res: res,
		failedSvc:        map[ServiceKey]bool{},
		failedBind:       map[netip.Addr]bool{},
		failedAllow:      map[SetEntry]bool{},
		failedUnrestrict: map[SetEntry]bool{},
		found:            found{adds: map[ServiceKey][]*OpError{}, read: map[ServiceKey]bool{}, replanned: map[ServiceKey]bool{}},
		log:              opLog{log: r.log, each: each, debug: !each && r.log.Enabled(ctx, slog.LevelDebug)},
	}
}

// run applies ops, run by run of one kind. Many VIP binds (a cold start)
// go in the background while the IPVS operations that follow them run:
// binds use another netlink socket and IPVS does not need a service's
// address to be local. Any other operation waits for them.
func (p *pass) run(ops []Op) {
	defer p.log.flush()
	// Applied shares ops' array: the operations that succeeded are moved
	// down over those that did not, so that a cold start's hundred
	// thousand operations are not copied again. It never passes the
	// operation being applied; background binds work on a copy.
	p.res.Applied = ops[:0]
	for i := 0; i < len(ops); {
		j := i + 1
		for j < len(ops) && ops[j].Kind == ops[i].Kind {
			j++
		}
		run := ops[i:j]
		switch kind := ops[i].Kind; {
		case p.ctx.Err() != nil:
			p.join()
			p.res.Skipped = append(p.res.Skipped, ops[i:]...)
			return
		case kind == OpBindVIP && len(run) >= parallelBinds:
			p.join()
			p.binds = p.r.bindAsync(slices.Clone(run))
		case isIPVSKind(kind):
			p.ipvs(run, ops[j:])
		default:
			p.join()
			for x := range run {
				p.one(&run[x])
			}
		}
		i = j
	}
	p.join()
}

// one applies an operation that is not of IPVS alone.
func (p *pass) one(op *Op) {
	if p.skip(*op) {
		p.res.Skipped = append(p.res.Skipped, *op)
		return
	}
	p.finish(op, p.r.do(*op))
}

// ipvs applies a run of IPVS operations of one kind in batches; rest are
// the pass's operations after the run. Kinds stay apart so that the
// backends of a service that failed to be added are skipped.
func (p *pass) ipvs(run, rest []Op) {
	todo := run
	if slices.ContainsFunc(run, func(op Op) bool { return p.skip(op) || p.superseded(op) }) {
		todo = nil
		for _, op := range run {
			switch {
			case p.superseded(op):
			case p.skip(op):
				p.res.Skipped = append(p.res.Skipped, op)
			default:
				todo = append(todo, op)
			}
		}
	}
	for len(todo) > 0 {
		n := min(len(todo), batchSize)
		p.batch(todo[:n])
		todo = todo[n:]
		if p.replan(todo, rest) {
			todo = slices.DeleteFunc(slices.Clone(todo), p.superseded)
		}
	}
}

// batch applies a batch of IPVS operations of one kind.
func (p *pass) batch(todo []Op) {
	errs := p.r.opts.Kernel.IPVS.Apply(todo)
	for x := range todo {
		err := errNoResult
		if x < len(errs) {
			err = errs[x]
		}
		p.finish(&todo[x], err)
	}
}

// errNoResult fails the operations an IPVS adapter returned no result for.
var errNoResult = errors.New("the ipvs adapter returned no result")

// skip reports whether op depends on an addition that failed.
func (p *pass) skip(op Op) bool {
	e := op.host().Entry
	return (op.Kind == OpAddDest || op.Kind == OpUpdateDest) && p.failedSvc[op.Service.Key] ||
		op.Kind == OpAnnounce && p.failedBind[op.Addr] ||
		op.Kind == OpAddEntry && e.Set == SetRestricted && p.failedAllow[e] ||
		op.Kind == OpDelEntry && e.Set == SetAllowed && p.failedUnrestrict[e.restriction()]
}

// superseded reports whether op belongs to a service planned anew.
func (p *pass) superseded(op Op) bool {
	return isIPVSKind(op.Kind) && p.found.replanned[op.Service.Key]
}

// finish records the outcome of op. An add that finds its object already
// in the kernel (a dump missed it) is no failure: it waits in found until
// replan reads its service again.
func (p *pass) finish(op *Op, err error) {
	p.r.remember(*op, err)
	switch {
	case isExists(*op, err) && !p.found.read[op.Service.Key]:
		p.found.add(*op, err)
	case err != nil:
		p.res.Failed = append(p.res.Failed, &OpError{Op: *op, Err: err})
		switch op.Kind {
		case OpAddService:
			p.failedSvc[op.Service.Key] = true
		case OpBindVIP:
			p.failedBind[op.Addr] = true
		case OpAddEntry:
			if e := op.host().Entry; e.Set == SetAllowed {
				p.failedAllow[e.restriction()] = true
			}
		case OpDelEntry:
			if e := op.host().Entry; e.Set == SetRestricted {
				p.failedUnrestrict[e] = true
			}
		}
	default:
		p.r.track(*op)
		p.log.applied(*op)
		p.res.Applied = append(p.res.Applied, *op)
	}
}

// replan reads again each service an add found, plans it anew and applies
// that plan in place of the pass's other operations for it; rest are the
// operations not yet applied. It reports whether it planned a service
// anew.
func (p *pass) replan(rest ...[]Op) bool {
	if len(p.found.keys) == 0 {
		return false
	}
	planned := false
	for _, key := range p.found.keys {
		adds := p.found.adds[key]
		p.found.read[key] = true
		st, err := p.r.opts.Kernel.IPVS.Service(key)
		if err != nil {
			for _, a := range adds {
				p.finish(&a.Op, fmt.Errorf("%w; reading the service again failed: %w", a.Err, err))
			}
			continue
		}
		if !p.found.detached {
			// Applied shares ops' array and is about to grow by more
			// than the operations applied: it gets its own.
			p.res.Applied = slices.Clone(p.res.Applied)
			p.found.detached = true
		}
		planned = true
		p.found.replanned[key] = true
		intent := make([][]Op, 0, len(rest)+1)
		for _, a := range adds {
			p.res.Existed = append(p.res.Existed, a.Op)
			intent = append(intent, []Op{a.Op})
		}
		sub := p.r.replanService(key, st, p.desired, append(intent, rest...))
		p.r.log.Info("an add found its object already in the kernel; planned the service again", "service", key.String(), "found", len(adds), "ops", len(sub))
		// Those that failed already in this pass are not tried again.
		sub = slices.DeleteFunc(sub, func(op Op) bool {
			return slices.ContainsFunc(p.res.Failed, func(e *OpError) bool {
				return e.Op.Kind == op.Kind && e.Op.Service.Key == op.Service.Key && e.Op.Dest.Addr == op.Dest.Addr
			})
		})
		// The plan's operations are all of IPVS, in kinds: each run of
		// one kind goes in batches, as in the pass.
		for x := 0; x < len(sub); {
			if p.skip(sub[x]) {
				p.res.Skipped = append(p.res.Skipped, sub[x])
				x++
				continue
			}
			j := x + 1
			for j < len(sub) && j-x < batchSize && sub[j].Kind == sub[x].Kind && !p.skip(sub[j]) {
				j++
			}
			p.batch(sub[x:j])
			x = j
		}
	}
	p.found.keys = p.found.keys[:0]
	clear(p.found.adds)
	return planned
}

// join waits for the background binds, if any, and finishes them.
func (p *pass) join() {
	if p.binds == nil {
		return
	}
	<-p.binds.done
	for x := range p.binds.ops {
		p.finish(&p.binds.ops[x], p.binds.errs[x])
	}
	p.binds = nil
}

// isExists reports whether err says that op, an addition of a service or
// a backend, found it already in the kernel (EEXIST, which matches
// fs.ErrExist).
func isExists(op Op, err error) bool {
	return (op.Kind == OpAddService || op.Kind == OpAddDest) && errors.Is(err, fs.ErrExist)
}

// found keeps, during one apply, the additions that found their object
// already in the kernel, until their services are read again.
type found struct {
	// keys are the services of adds, in the order found.
	keys []ServiceKey
	adds map[ServiceKey][]*OpError
	// read holds the services read again: their adds that find their
	// object now fail. replanned holds those planned anew: the pass's
	// other operations of theirs are dropped.
	read, replanned map[ServiceKey]bool
	// detached says Result.Applied no longer shares the pass's array.
	detached bool
}

func (f *found) add(op Op, err error) {
	if _, ok := f.adds[op.Service.Key]; !ok {
		f.keys = append(f.keys, op.Service.Key)
	}
	f.adds[op.Service.Key] = append(f.adds[op.Service.Key], &OpError{Op: op, Err: err})
}

// parallelBinds is the smallest run of VIP binds that apply runs in the
// background.
const parallelBinds = 16

// binds are VIP binds running in the background.
type binds struct {
	ops  []Op
	errs []error
	done chan struct{}
}

// bindAsync binds the VIPs of ops in the background.
func (r *Reconciler) bindAsync(ops []Op) *binds {
	b := &binds{ops: ops, errs: make([]error, len(ops)), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		for x := range ops {
			b.errs[x] = r.do(ops[x])
		}
	}()
	return b
}

// LogEachMax is the largest pass whose operations are each logged at info.
const LogEachMax = 64

// opLog logs the applied operations of a pass: each one at info in a small
// pass; in a large one, one line per run of a kind at info and each one
// at debug.
type opLog struct {
	log         *slog.Logger
	each, debug bool
	kind        OpKind
	n           int
	start       time.Time
}

func (l *opLog) applied(op Op) {
	switch {
	case l.each:
		l.log.Info("applied", "op", op.Kind.String(), "detail", op.String())
		return
	case l.debug:
		l.log.Debug("applied", "op", op.Kind.String(), "detail", op.String())
	}
	if op.Kind != l.kind {
		l.flush()
		l.kind, l.start = op.Kind, time.Now()
	}
	l.n++
}

func (l *opLog) flush() {
	if l.n > 0 {
		l.log.Info("applied", "op", l.kind.String(), "count", l.n, "took", time.Since(l.start).Round(time.Microsecond))
	}
	l.n = 0
}
