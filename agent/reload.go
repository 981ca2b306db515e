package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/metrics"
)

// ErrReloadRejected marks a reload refused before touching the kernel: an
// invalid file, or one the reload guard refuses.
var ErrReloadRejected = errors.New("reload rejected")

// ErrNothingApplied marks a request that could not read the kernel and
// applied nothing.
var ErrNothingApplied = errors.New("cannot read the kernel; nothing applied")

// Outcome is what a request did to the kernel.
type Outcome struct {
	// Applied are the operations applied, in order.
	Applied []lb.Op
	// Failed are the operations that failed, and the failure to store
	// the ownership ledger.
	Failed []error
}

func outcome(res *lb.Result) Outcome {
	var out Outcome
	if res == nil {
		return out
	}
	out.Applied = res.Applied
	for _, f := range res.Failed {
		out.Failed = append(out.Failed, f)
	}
	if res.Ledger != nil {
		out.Failed = append(out.Failed, res.Ledger)
	}
	return out
}

// ReloadOptions say how to reload.
type ReloadOptions struct {
	// Why names what asked, for the log ("sighup", "control socket").
	Why string
	// Force applies a change the reload guard refuses, with a full pass
	// (which also repairs drift).
	Force bool
}

// Reload reads every file of the configuration again and applies what
// changed: a file with errors, or a change the reload guard refuses, is
// rejected (ErrReloadRejected) and the running configuration keeps
// serving; a change whose operations fail is rolled back when on_apply_error
// says so, and the error says it was.
func (a *Agent) Reload(ctx context.Context, opts ReloadOptions) (out Outcome, err error) {
	if opts.Why == "" {
		opts.Why = "reload"
	}
	derr := a.do(ctx, func(ctx context.Context) { out, err = a.noteReload(ctx, readAll(opts.Why), opts.Force) })
	return out, cmpErr(err, derr)
}

// cmpErr returns the request's error, or the error of handing it over.
func cmpErr(err, handover error) error {
	if handover != nil {
		return handover
	}
	return err
}

// reload applies a new version of the configuration: in as read, parsed
// against the running configuration so that only the services whose text
// changed are parsed again, guarded against mass deletion, applied, and
// on failure rolled back to the last good configuration when so
// configured.
func (a *Agent) reload(ctx context.Context, in fileRead, force bool) (Outcome, error) {
	why := in.why
	if in.err != nil {
		return Outcome{}, a.rejectInvalid(why, fmt.Errorf("read config: %w", in.err))
	}
	picked := time.Now()
	var (
		cfg   *config.Config
		delta config.Delta
		err   error
	)
	switch {
	case in.all && a.spare.Config != nil:
		cfg, delta, err = config.ReloadReusing(a.cfg, a.spare)
	case in.all:
		cfg, delta, err = config.Reload(a.cfg)
	case in.removed:
		cfg, delta, err = config.ParseRemoved(a.cfg, in.file)
	case a.spare.Config != nil:
		cfg, delta, err = config.ParseFromReusing(a.cfg, in.file, in.data, a.spare)
	default:
		cfg, delta, err = config.ParseFrom(a.cfg, in.file, in.data)
	}
	// The spare is handed over whatever the outcome. The configuration
	// that is not kept, the new one or the running one it replaces,
	// differs from the kept one by delta: it is the next spare.
	a.spare = config.Spare{}
	running := a.cfg
	defer func() {
		if err == nil && cfg != nil && cfg != running && !delta.Full {
			if a.cfg == cfg {
				a.spare = config.Spare{Config: running, Delta: delta}
			} else {
				a.spare = config.Spare{Config: cfg, Delta: delta}
			}
		}
	}()
	parsed := time.Now()
	if err == nil {
		err = canRunChecks(cfg)
	}
	if err == nil {
		err = a.sources.claimedByOthers(cfg.Spec.Services[delta.From:delta.NewTo])
	}
	if err != nil {
		return Outcome{}, a.rejectInvalid(why, err)
	}
	if !delta.Full && delta.From == delta.OldTo && delta.From == delta.NewTo && !force {
		// Only comments or blank lines changed (or the bytes are those
		// of the running configuration again): nothing to do. The new
		// configuration is the same one; keeping it keeps its files'
		// texts for the next reload.
		a.replace(cfg)
		a.log.Info("configuration unchanged", "why", why, "file", in.name())
		return Outcome{}, nil
	}
	defer func() {
		// Where a reload's time went, from the moment the file was read.
		a.log.Info("reload timing", "why", why, "file", in.name(), "read", in.read.Round(time.Microsecond),
			"wait", picked.Sub(in.seen.Add(in.read)).Round(time.Microsecond),
			"parse", parsed.Sub(picked).Round(time.Microsecond), "apply", time.Since(parsed).Round(time.Microsecond),
			"total", time.Since(in.seen).Round(time.Microsecond), "services_parsed", delta.NewTo-delta.From, "full", delta.Full)
	}()
	if err := a.refuseHostVIPs(cfg, reloadedVIPs(a.cfg, cfg, delta)); err != nil {
		return Outcome{}, a.rejectInvalid(why, err)
	}
	a.notify(a.n.Reloading())
	defer func() { a.notify(a.n.Ready(a.status("serving"))) }()
	if err := a.guard(cfg, delta); err != nil && !force {
		a.m.ReloadFailed(metrics.ReloadGuard)
		a.log.Error("reload refused by the guard; the running configuration keeps serving", "why", why, "err", err)
		return Outcome{}, err
	}
	pools := poolsChanged(a.cfg, cfg)
	if pools {
		if err := a.poolGuard(cfg); err != nil {
			if !force {
				a.m.ReloadFailed(metrics.ReloadGuard)
				a.log.Error("reload refused by the guard; the running configuration keeps serving", "why", why, "err", err)
				return Outcome{}, err
			}
			a.log.Warn("forced reload: Services whose addresses leave their pools are allocated again", "why", why, "err", err)
		}
	}
	if delta.Full && restartNeeded(a.cfg, cfg) {
		a.log.Warn("daemon settings changed (interface, uplinks, announcement, iptables, state_dir, resync, watch, control socket, metrics, [ha], [bgp] sessions or [kubernetes] besides its pools); they take effect on restart",
			"config", a.opts.Path)
	}
	undo := a.try(cfg)
	var res *lb.Result
	if !force {
		// A forced reload runs a full pass, which also repairs drift.
		res = a.reconcileDelta(ctx, why, cfg, delta)
	}
	if res == nil {
		res = a.reconcile(ctx, why, a.effective(cfg))
	}
	if res == nil {
		undo()
		return Outcome{}, ErrNothingApplied
	}
	out, serr := a.settle(ctx, why, cfg, res, undo)
	if pools && a.cfg == cfg {
		// The [[kubernetes.pool]] tables apply to the running source, at
		// once: no restart.
		a.applyPools(running, cfg)
	}
	return out, serr
}

// fileRead is what a reload reads: one file of the configuration as the
// watcher read it, or (all) every file, read by the reload itself.
type fileRead struct {
	why string
	// file is the file read, data its bytes, err the read's error;
	// removed says that file, an included file, is gone.
	file    string
	data    []byte
	err     error
	removed bool
	all     bool
	// seen is when the read started, read how long it took.
	seen time.Time
	read time.Duration
}

// readAll asks a reload, for why, to read every file of the configuration.
func readAll(why string) fileRead {
	return fileRead{why: why, all: true, seen: time.Now()}
}

// name names what was read, for the log.
func (in fileRead) name() string {
	if in.all {
		return "all"
	}
	return in.file
}

// rejectInvalid reports a file that cannot be read or parsed; the running
// configuration stays. It returns the reload's error.
func (a *Agent) rejectInvalid(why string, err error) error {
	a.m.ReloadFailed(metrics.ReloadInvalid)
	a.log.Error("reload rejected; the running configuration keeps serving", "why", why, "err", err)
	a.notify(a.n.Status(a.status("serving (last reload rejected: invalid file)")))
	return fmt.Errorf("%w: %w", ErrReloadRejected, err)
}

// reconcileDelta applies a change confined to some services with a pass
// over those services alone (see lb.Reconciler.ReconcileDelta). It returns
// nil, having done nothing, when the change needs a full pass: the
// [daemon] section changed, operations of the running configuration are
// failing (a full pass retries them), a changed service is health
// checked (its backends depend on the health of all), or the change
// reaches what services share.
func (a *Agent) reconcileDelta(ctx context.Context, why string, cfg *config.Config, delta config.Delta) *lb.Result {
	if delta.Full || len(a.failing) > 0 || a.ledgerFailing {
		return nil
	}
	old := a.cfg.Spec.Services[delta.From:delta.OldTo]
	cur := cfg.Spec.Services[delta.From:delta.NewTo]
	for _, svcs := range [][]lb.VirtualService{old, cur} {
		for i := range svcs {
			if _, ok := a.cfg.Health[svcs[i].Name]; ok {
				return nil
			}
			if _, ok := cfg.Health[svcs[i].Name]; ok {
				return nil
			}
		}
	}
	return a.passOver(ctx, why, a.spec(cfg), old, cur)
}

// passOver runs a pass over the services old became (cur) alone, with the
// admin drains applied, and logs it. It returns nil when the reconciler
// declines it or cannot read the services: the caller runs a full pass.
func (a *Agent) passOver(ctx context.Context, why string, spec *lb.Spec, old, cur []lb.VirtualService) *lb.Result {
	change := lb.Delta{
		Old: applyDrains(&lb.Spec{Services: old}, a.drained).Services,
		New: applyDrains(&lb.Spec{Services: cur}, a.drained).Services,
	}
	start := time.Now()
	res, ok, err := a.r.ReconcileDelta(ctx, spec, change)
	if !ok {
		return nil
	}
	a.m.Pass(why, res, time.Since(start))
	a.changed(res)
	if err != nil {
		// The services could not be read: a full pass tries again and
		// reports.
		a.log.Warn("reading the services failed; running a full pass", "why", why, "err", err)
		return nil
	}
	logResult(a.log, why, res, time.Since(start))
	return res
}

// drainPass lets draining backends go once their connections end. When
// every draining backend belongs to a service of the desired state
// without health checks, it reads and plans only those services (a
// second-by-second full pass would read the whole table, which is slow at
// 10,000 services); otherwise, or if that pass is declined, it runs a full
// pass.
func (a *Agent) drainPass(ctx context.Context) {
	spec := a.spec(a.cfg)
	if len(a.healthOf(a.cfg)) == 0 && len(a.failing) == 0 && !a.ledgerFailing {
		keys := map[lb.ServiceKey]bool{}
		for _, k := range a.r.DrainingServices() {
			keys[k] = true
		}
		var svcs []lb.VirtualService
		for i := range spec.Services {
			vs := &spec.Services[i]
			if !vs.NodePort && keys[vs.Service.Key] {
				svcs = append(svcs, *vs)
				delete(keys, vs.Service.Key)
			}
		}
		// Draining services that the desired state no longer has
		// (drain_services) leave keys behind: they need a full pass.
		if len(keys) == 0 && len(svcs) > 0 {
			if res := a.passOver(ctx, "drain", spec, svcs, svcs); res != nil {
				for _, f := range res.Failed {
					if a.failing == nil {
						a.failing = map[lb.OpKey]bool{}
					}
					a.failing[f.Op.Key()] = true
				}
				return
			}
		}
	}
	a.remember(a.reconcile(ctx, "drain", a.effective(a.cfg)))
}

// replace makes cfg the running configuration.
func (a *Agent) replace(cfg *config.Config) {
	if cfg != a.cfg {
		a.cfg = cfg
		a.r.SetRemoval(cfg.Daemon.Removal)
		a.stats.SetInterval(cfg.Daemon.StatsInterval)
		a.stats.Invalidate()
	}
}

// settle finishes a reload whose pass ran: it keeps cfg, or rolls back,
// calling undo (see try) first.
func (a *Agent) settle(ctx context.Context, why string, cfg *config.Config, res *lb.Result, undo func()) (Outcome, error) {
	out := outcome(res)
	var fresh []error
	for _, f := range res.Failed {
		if !a.failing[f.Op.Key()] {
			fresh = append(fresh, f)
		}
	}
	if res.Ledger != nil && !a.ledgerFailing {
		fresh = append(fresh, res.Ledger)
	}
	if len(fresh) > 0 && a.cfg.Daemon.OnApplyError == config.ApplyRollback {
		a.m.ReloadFailed(metrics.ReloadApply)
		a.log.Error("reload failed; rolling back to the last good configuration", "why", why, "failed", len(fresh), "first", fresh[0])
		undo()
		back := a.reconcile(ctx, "rollback", a.effective(a.cfg))
		a.remember(back)
		err := fmt.Errorf("reload failed (%d operations, first: %v); rolled back to the last good configuration", len(fresh), fresh[0])
		if back == nil || len(back.Failed) > len(a.failing) {
			err = fmt.Errorf("%w; the rollback did not complete, see the log", err)
		}
		return out, err
	}
	a.replace(cfg)
	a.remember(res)
	a.gen++
	a.m.ConfigLoaded(a.gen, &cfg.Spec)
	a.retake(ctx)
	if len(fresh) > 0 {
		return out, fmt.Errorf("%d operations failed; kept the new configuration (on_apply_error = \"continue\")", len(fresh))
	}
	return out, nil
}

// Plan returns what a reload of the configuration file would change in
// the kernel now, health checks and admin drains included. It changes
// nothing.
func (a *Agent) Plan(ctx context.Context) (ops []lb.Op, err error) {
	derr := a.do(ctx, func(ctx context.Context) {
		var cfg *config.Config
		if cfg, err = config.Load(a.opts.Path); err != nil {
			return
		}
		ops, err = a.r.Plan(ctx, a.planned(cfg))
	})
	return ops, cmpErr(err, derr)
}
