// Package agent is the vipd daemon as a library: it keeps the kernel in
// step with the desired state, the configuration file's services merged
// with those of the other sources (see package source), and serves the
// typed requests of the control API (reload, plan, status, drain).
//
// An Agent's state is owned by its main loop (Run): every request and
// every source's update is handed to the loop and handled between passes,
// never during one.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/arp"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/monitor/metrics"
	"github.com/vipd/vipd/monitor/status"
	"github.com/vipd/vipd/source"
)

// Options configure an Agent.
type Options struct {
	// Path is the configuration file.
	Path string
	// Logger receives the agent's log; nil discards it.
	Logger *slog.Logger
	// Notifier reports to the service manager; nil reports nothing.
	Notifier Notifier
	// OpenKernel opens the kernel adapters for a configuration; close
	// releases them. Required: the command passes the real kernel,
	// tests a fake.
	OpenKernel func(*config.Config, *slog.Logger) (k lb.Kernel, close func(), err error)
	// KernelRelease is the running kernel's release (see
	// lb.Options.KernelRelease).
	KernelRelease string
	// KernelLock is the lock file that admits one vipd per kernel (see
	// lockDaemon); "" takes none.
	KernelLock string
	// StartRetry is the wait before the first pass is tried again when
	// it cannot read the kernel; it doubles each time. Zero means one
	// second.
	StartRetry time.Duration
	// Serve starts the agent's servers (the control socket, the metrics
	// endpoint) once the first pass is done, before the agent reports
	// ready; stop stops them when Run ends. nil serves nothing.
	Serve func(ctx context.Context, a *Agent, d config.Daemon) (stop func(), err error)
	// Sources are the origins of desired services besides the
	// configuration file (see package source).
	Sources []source.Source
	// OpenSources opens the sources a configuration asks for (its
	// [kubernetes] section), which join Sources; nil opens none.
	OpenSources func(cfg *config.Config, log *slog.Logger) ([]source.Source, error)
	// Version is the version the log and the metrics show.
	Version string
	// OpenElector opens the election of the configuration's [ha]
	// section (VRRP); nil refuses a configuration with one.
	OpenElector func(ElectorOptions) (Elector, error)
	// ConnTracker tracks the SNAT connections a peer synchronized when
	// the node becomes master ([ha] snat_addresses); nil tracks none,
	// and those connections break at a takeover.
	ConnTracker ConnTracker
	// LinkUp reports whether an interface is up with a carrier, for
	// [ha] interface and track_interfaces and [bgp] track_interfaces;
	// nil tracks none.
	LinkUp func(name string) (bool, error)
	// WatchLinks, when set, returns a channel that receives whenever an
	// interface may have changed (a netlink link message), until ctx
	// ends: the agent then looks at the interfaces it tracks, and
	// announces on the uplinks that missed announcements, at once
	// rather than at its next check (once a second, which remains the
	// backstop).
	WatchLinks func(ctx context.Context) <-chan struct{}
	// OpenAnnouncer starts the BGP speaker of the configuration's [bgp]
	// section (see bgp.go); nil refuses a configuration with one.
	OpenAnnouncer func(context.Context, AnnouncerOptions) (Announcer, error)
	// OnStatus is called, outside the main loop, with every status
	// snapshot taken (the status page's history); nil calls nothing.
	OnStatus func(*status.Snapshot)
}

// Notifier reports the agent's state to the service manager (systemd's
// sd_notify; see package systemd).
type Notifier interface {
	Ready(status string) error
	Reloading() error
	Stopping() error
	Status(status string) error
	Watchdog() error
	// WatchdogInterval is the service manager's watchdog timeout, or 0.
	WatchdogInterval() time.Duration
}

// quiet is the Notifier of an agent without a service manager.
type quiet struct{}

func (quiet) Ready(string) error              { return nil }
func (quiet) Reloading() error                { return nil }
func (quiet) Stopping() error                 { return nil }
func (quiet) Status(string) error             { return nil }
func (quiet) Watchdog() error                 { return nil }
func (quiet) WatchdogInterval() time.Duration { return 0 }

// Agent is the running vipd: the current good configuration, the
// sources' services, and the reconciler that keeps the kernel in step
// with them.
type Agent struct {
	opts Options
	log  *slog.Logger
	n    Notifier
	r    *lb.Reconciler
	cfg  *config.Config
	// failing holds the operations that failed in the last pass of the
	// running configuration: a reload is not blamed for them.
	failing map[lb.OpKey]bool
	// ledgerFailing says that the last pass could not store the
	// ownership ledger.
	ledgerFailing bool
	reqs          chan func(context.Context)
	// done is closed when Run ends.
	done chan struct{}

	// sources holds what each source other than the file publishes.
	sources sources

	// hm checks the backends; health is its view with adoption (see
	// healthView), and decisions the last health decision per service.
	hm        *health.Manager
	health    healthView
	decisions map[string]health.Decision
	// healthChanged is signalled on every backend transition.
	healthChanged chan struct{}

	// drained holds the backends an operator drained (vipd drain).
	drained map[status.Ref]struct{}
	// m exports metrics; gen counts the configurations that took effect.
	m   *metrics.Metrics
	gen uint64
	// stats holds the status that vipd status and the metrics show.
	stats *status.Cache
	// ha is the high availability of the [ha] section, or nil.
	ha *ha
	// bgp is the announcements of the [bgp] section, or nil; changes
	// counts the passes that changed the kernel, for announce.
	bgp     *bgpState
	changes uint64
	// last is the spec of the last full pass.
	last *lb.Spec
	// spare is a configuration no one uses, which the next reload may
	// build the new one in (see config.Spare).
	spare config.Spare
	// lastReload is the last reload, for the status page.
	lastReload *status.Reload
}

// New returns an agent for opts; Run runs it.
func New(opts Options) *Agent {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Notifier == nil {
		opts.Notifier = quiet{}
	}
	return &Agent{opts: opts, log: opts.Logger, n: opts.Notifier, reqs: make(chan func(context.Context)),
		done: make(chan struct{}), healthChanged: make(chan struct{}, 1)}
}

// defaultMemoryLimit is the Go runtime's soft memory limit for the daemon
// when GOMEMLIMIT does not set one. The runtime collects garbage sooner as
// the heap nears it, which keeps a cold start of 10,000 services x 10
// backends (a plan of 110,000 operations) within the resident memory the
// benchmark holds it to; it is not a cap: a larger configuration's live
// heap may exceed it, at the cost of more frequent collection.
const defaultMemoryLimit = 112 << 20

// defaultGCPercent is the Go runtime's GOGC for the daemon when the
// environment does not set one. A daemon that checks and programs a few
// hundred backends keeps a live heap of a few MiB, and the runtime's
// default of 100 lets the heap grow to twice that (and at least 4 MiB)
// between collections, which is most of what the daemon's resident set
// holds beyond the runtime's own; 50 keeps it to one and a half times
// the live heap for twice as many collections. The collections cost the
// most in a cold start of a large configuration, where the memory limit
// above already makes the runtime collect near the limit; the cost
// measured both ways is in test/bench/results/2026-12-07-gogc.txt.
const defaultGCPercent = 50

// tuneRuntime sets the Go runtime's collector to the daemon's defaults,
// each unless the environment sets its own (GOGC, GOMEMLIMIT).
func tuneRuntime() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}

// Run loads the configuration, adopts what the kernel already has,
// applies the difference, and keeps the kernel in step until ctx ends:
// on every change of the configuration's files (with watch), every
// request, every source's update, every backend transition and every
// resync_interval. It then stops as on_stop says.
func (a *Agent) Run(ctx context.Context) error {
	defer close(a.done)
	l, cleanup, err := a.start(ctx)
	defer cleanup()
	if err != nil {
		return err
	}
	return a.loop(ctx, l)
}

// started is what the start hands the main loop: the channels it
// selects on besides its own tickers.
type started struct {
	// w watches the configuration's files.
	w *watch
	// sourceErrs receives the error that ends a source.
	sourceErrs <-chan error
	// roles is signalled on every change of role ([ha]), or nil.
	roles <-chan struct{}
}

// cleanups is a stack of the start's cleanups, which run last first.
type cleanups []func()

func (c *cleanups) push(f func()) { *c = append(*c, f) }

func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// start loads the configuration, takes the locks, opens the kernel, the
// sources, health checking, high availability and BGP, runs the first
// pass and starts the servers, the watch and the sources. cleanup, never
// nil, undoes whatever the start did, last first, whether it failed or
// not; the caller runs it when the agent ends.
func (a *Agent) start(ctx context.Context) (l started, cleanup func(), err error) {
	var c cleanups
	cleanup = c.run
	if a.opts.OpenKernel == nil {
		return l, cleanup, errors.New("agent: no kernel (Options.OpenKernel)")
	}
	log := a.log
	tuneRuntime()
	cfg, err := config.Load(a.opts.Path)
	if err != nil {
		return l, cleanup, err
	}
	if err := canRunChecks(cfg); err != nil {
		return l, cleanup, err
	}
	// Nothing is touched before this vipd holds its locks and has read
	// its state: a second vipd, or a corrupt state file, ends the start
	// with the kernel and the files as they were.
	unlock, err := lockDaemon(cfg, a.opts.KernelLock)
	if err != nil {
		return l, cleanup, err
	}
	c.push(unlock)
	drained, err := loadState(cfg)
	if err != nil {
		return l, cleanup, err
	}
	if a.opts.OpenSources != nil {
		srcs, err := a.opts.OpenSources(cfg, log)
		if err != nil {
			return l, cleanup, fmt.Errorf("%s: %w", cfg.File, err)
		}
		a.opts.Sources = append(slices.Clone(a.opts.Sources), srcs...)
	}
	k, closeKernel, err := a.opts.OpenKernel(cfg, log)
	if err != nil {
		return l, cleanup, err
	}
	c.push(closeKernel)
	if err := a.openHA(cfg); err != nil {
		return l, cleanup, err
	}
	if err := a.gateHA(&k); err != nil {
		return l, cleanup, err
	}
	a.setup(ctx, cfg, drained, k)
	if err := a.refuseHostVIPs(cfg, cfg.Spec.Services); err != nil {
		return l, cleanup, err
	}
	a.check(cfg)
	hctx, stopHealth := context.WithCancel(ctx)
	c.push(stopHealth)
	go a.hm.Run(hctx)
	roles, stopHA, err := a.startHA(ctx, k)
	if stopHA != nil {
		c.push(stopHA)
	}
	if err != nil {
		return l, cleanup, err
	}
	l.roles = roles
	if err := a.openBGP(ctx, cfg); err != nil {
		return l, cleanup, err
	}
	c.push(a.stopBGP)
	log.Info("starting", "version", a.opts.Version, "config", a.opts.Path, "services", len(cfg.Spec.Services), "pid", os.Getpid())
	first := a.effective(cfg)
	res, err := a.firstPass(ctx, first)
	if err != nil {
		return l, cleanup, err
	}
	a.last = first
	a.track(first)
	a.trackBGPLinks()
	a.remember(res)
	a.gen++
	a.m.ConfigLoaded(a.gen, &cfg.Spec)
	if a.opts.Serve != nil {
		stop, err := a.opts.Serve(ctx, a, cfg.Daemon)
		if err != nil {
			return l, cleanup, err
		}
		c.push(stop)
	}
	l.w = &watch{a: a}
	c.push(l.w.close)
	if cfg.Daemon.Watch {
		l.w.start(ctx)
	}
	sourceErrs := make(chan error, 1)
	c.push(a.runSources(ctx, sourceErrs))
	l.sourceErrs = sourceErrs
	return l, cleanup, nil
}

// loop reports the agent ready and runs its main loop until ctx ends or a
// source fails; it then stops as on_stop says.
func (a *Agent) loop(ctx context.Context, l started) error {
	log, w := a.log, l.w
	resync := time.NewTicker(a.cfg.Daemon.ResyncInterval)
	defer resync.Stop()
	var watchdog <-chan time.Time
	if iv := a.n.WatchdogInterval(); iv > 0 {
		t := time.NewTicker(iv / 2)
		defer t.Stop()
		watchdog = t.C
	}
	// While backends drain, passes come every second so that each is
	// deleted soon after its last connection ends.
	drainCheck := time.NewTicker(time.Second)
	defer drainCheck.Stop()
	var links <-chan struct{}
	if a.opts.WatchLinks != nil && (a.ha != nil || a.bgp != nil) {
		links = a.opts.WatchLinks(ctx)
	}
	// A resync reads the sysctls and rules (iptables-save, its slowest
	// part) beside the loop, which meanwhile goes on with health
	// verdicts and requests; the pass that follows trusts the read.
	fresh := make(chan freshRead, 1)
	reading := false
	var readers sync.WaitGroup
	defer readers.Wait()
	log.Info("ready", "watch", a.cfg.Daemon.Watch, "control_socket", a.cfg.Daemon.ControlSocket)
	a.notify(a.n.Ready(a.status("serving")))
	for {
		a.announce()
		select {
		case <-drainCheck.C:
			if a.r.Draining() > 0 {
				a.drainPass(ctx)
			}
			a.linksChanged()
		case <-links:
			a.linksChanged()
		case <-a.healthChanged:
			a.remember(a.reconcile(ctx, "health", a.effective(a.cfg)))
		case <-l.roles:
			a.roleChanged()
		case <-ctx.Done():
			a.notify(a.n.Stopping())
			a.resign()
			a.stopBGP()
			return a.stop()
		case err := <-l.sourceErrs:
			a.notify(a.n.Stopping())
			return errors.Join(err, a.stop())
		case <-watchdog:
			// Sent from the loop itself: a wedged loop stops sending and
			// systemd restarts vipd (the data plane keeps running).
			a.notify(a.n.Watchdog())
		case ch, ok := <-w.changes:
			if !ok {
				w.changes = nil
				continue
			}
			a.noteReload(ctx, fileRead{why: "file changed", file: ch.File, data: ch.Data, removed: ch.Removed, err: ch.Err, seen: ch.Seen, read: ch.Read}, false)
			w.follow(ctx)
		case req := <-a.reqs:
			req(ctx)
			w.follow(ctx)
		case <-resync.C:
			// Sysctls and rules are re-read only here: other passes
			// trust what vipd last wrote, which keeps reloads cheap.
			if !reading {
				reading = true
				readers.Go(func() {
					f, err := a.r.ReadFresh()
					fresh <- freshRead{f: f, err: err}
				})
			}
		case fr := <-fresh:
			reading = false
			if fr.err != nil || !a.r.UseFresh(fr.f) {
				// The read failed, or a pass wrote sysctls or rules
				// meanwhile: the pass reads them itself, and reports
				// what fails.
				a.r.Refresh()
			}
			a.remember(a.reconcile(ctx, "resync", a.effective(a.cfg)))
		}
	}
}

// freshRead is the outcome of a resync's read of sysctls and rules (see
// lb.Reconciler.ReadFresh).
type freshRead struct {
	f   *lb.Fresh
	err error
}

// setup makes the agent's parts for the configuration cfg, the admin
// drains drained and the kernel k.
func (a *Agent) setup(ctx context.Context, cfg *config.Config, drained map[status.Ref]struct{}, k lb.Kernel) {
	log := a.log
	a.r = lb.NewReconciler(lb.Options{Kernel: k, Logger: log, KernelRelease: a.opts.KernelRelease, Dummy: cfg.Daemon.Interface, Removal: cfg.Daemon.Removal})
	a.cfg, a.drained = cfg, drained
	a.stats = status.NewCache(status.CacheOptions{Interval: cfg.Daemon.StatsInterval, Take: func() (*status.Snapshot, error) {
		return a.takeStatus(ctx)
	}})
	var announcerStats func() metrics.AnnouncerStats
	if an, ok := k.Announcer.(interface{ Stats() arp.Stats }); ok {
		announcerStats = func() metrics.AnnouncerStats { return metrics.AnnouncerStats(an.Stats()) }
	}
	a.m = metrics.New(metrics.Options{
		Version:   a.opts.Version,
		Logger:    log,
		Announcer: announcerStats,
		// Scrapes wait for a.stats (see Metrics) and export what it
		// holds.
		Status: a.stats.Last,
		Health: func() health.Stats { return a.hm.Stats() },
	})
	a.hm = health.NewManager(health.Options{
		Logger: log,
		OnTransition: func(t health.Transition) {
			a.m.HealthTransition(t)
			a.stats.Invalidate()
			select {
			case a.healthChanged <- struct{}{}:
			default:
			}
		},
	})
	a.health = healthView{m: a.hm}
	if len(cfg.Health) > 0 {
		// Reading the whole table is slow at 10,000 services; only
		// health checking needs it here.
		a.health.adopted = adopted(cfg, k)
	}
}

// watch watches the running configuration's files.
type watch struct {
	a       *Agent
	changes <-chan config.Change
	// patterns are the include patterns being watched.
	patterns []string
	cancel   func()
}

// start (re)starts the watcher for the running configuration's files. A
// watch that fails, then or later, is retried until it works (see
// config.Watcher).
func (w *watch) start(ctx context.Context) {
	w.close()
	a := w.a
	cw := config.NewWatcher(config.WatchOptions{Path: a.opts.Path, Include: a.cfg.Include, Logger: a.log,
		OnWatch: func(err error) { a.m.Watch(err == nil) }}, a.cfg.Texts())
	wctx, cancel := context.WithCancel(ctx)
	go cw.Run(wctx)
	w.changes, w.patterns, w.cancel = cw.Changes(), a.cfg.Include, cancel
}

// close stops the watcher, if one runs.
func (w *watch) close() {
	if w.cancel != nil {
		w.cancel()
	}
}

// follow starts the watch again when a reload changed the include
// patterns.
func (w *watch) follow(ctx context.Context) {
	if w.changes != nil && !slices.Equal(w.patterns, w.a.cfg.Include) {
		w.start(ctx)
	}
}

func (a *Agent) notify(err error) {
	if err != nil {
		a.log.Warn("systemd notification failed", "err", err)
	}
}

// status is the one-line status systemd shows.
func (a *Agent) status(state string) string {
	n := len(a.failing)
	if a.ledgerFailing {
		n++
	}
	return fmt.Sprintf("%s %d services, %d backends; %d operations failing", state, len(a.cfg.Spec.Services)+a.sources.services(), a.cfg.Backends()+a.sources.backends(), n)
}

// reconcile runs one pass for spec and logs its outcome. A nil result
// means the kernel could not be read.
func (a *Agent) reconcile(ctx context.Context, why string, spec *lb.Spec) *lb.Result {
	start := time.Now()
	res, err := a.r.Reconcile(ctx, spec)
	a.m.Pass(why, res, time.Since(start))
	a.changed(res)
	if err != nil {
		a.log.Error("reconcile failed", "why", why, "err", err)
		return nil
	}
	a.last = spec
	a.track(spec)
	logResult(a.log, why, res, time.Since(start))
	return res
}

// remember records which operations fail under the running configuration.
func (a *Agent) remember(res *lb.Result) {
	if res == nil {
		return
	}
	a.failing = map[lb.OpKey]bool{}
	for _, f := range res.Failed {
		a.failing[f.Op.Key()] = true
	}
	a.ledgerFailing = res.Ledger != nil
}

func logResult(log *slog.Logger, why string, res *lb.Result, took time.Duration) {
	for _, f := range res.Failed {
		log.Error("operation failed", "op", f.Op.Kind.String(), "detail", f.Op.String(), "err", f.Err)
	}
	if res.Ledger != nil {
		log.Error("the ownership ledger is not stored", "err", res.Ledger)
	}
	for _, op := range res.Skipped {
		log.Warn("operation skipped", "op", op.Kind.String(), "detail", op.String())
	}
	level := slog.LevelDebug
	if len(res.Applied)+len(res.Failed) > 0 || why != "resync" && why != "drain" || took >= slowPass {
		level = slog.LevelInfo
	}
	log.Log(context.Background(), level, "reconciled", "why", why, "applied", len(res.Applied),
		"failed", len(res.Failed), "skipped", len(res.Skipped), "took", took.Round(time.Microsecond))
}

// slowPass is how long a resync or drain pass that changed nothing may
// take before it is logged at info level rather than debug: the loop
// applies nothing else meanwhile, so an operator should see it.
const slowPass = time.Second

// canRunChecks reports whether vipd can run cfg's exec checks as their
// user (it never runs them as itself instead), and its half-open tcp
// checks, whose raw sockets it opens (they need CAP_NET_RAW).
func canRunChecks(cfg *config.Config) error {
	if u, ok := cfg.ExecUser(); ok {
		if err := health.CanRunAs(u); err != nil {
			return fmt.Errorf("%s: exec checks: %w", cfg.File, err)
		}
	}
	if v4, v6 := cfg.HalfOpen(); v4 || v6 {
		if err := health.OpenHalfOpen(v4, v6); err != nil {
			return fmt.Errorf("%s: half_open tcp checks: %w", cfg.File, err)
		}
	}
	return nil
}

// do hands f to the main loop and waits until it has run. A request
// whose ctx has ended is not handed over.
func (a *Agent) do(ctx context.Context, f func(context.Context)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan struct{})
	select {
	case a.reqs <- func(lctx context.Context) { f(lctx); close(done) }:
	case <-ctx.Done():
		return ctx.Err()
	case <-a.done:
		return ErrStopped
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Metrics returns the handler of the metrics endpoint. A scrape waits for
// the status cache, which reads the kernel at most once per
// stats_interval, and exports what it holds.
func (a *Agent) Metrics() http.Handler {
	h := a.m.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// An error is the collector's to report; a client that is gone
		// gets nothing.
		a.stats.Get(r.Context())
		if r.Context().Err() != nil {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Rejected counts a request that server refused because it was busy.
func (a *Agent) Rejected(server metrics.Server) { a.m.Rejected(server) }

// restartNeeded reports whether the daemon settings that shape the open
// adapters and the main loop differ between two configurations.
func restartNeeded(old, cur *config.Config) bool {
	x, y := old.Daemon, cur.Daemon
	return x.Interface != y.Interface || !slices.Equal(x.Uplinks, y.Uplinks) || x.GARP != y.GARP ||
		x.ManageIPTables != y.ManageIPTables || x.StateDir != y.StateDir || x.ResyncInterval != y.ResyncInterval ||
		x.Watch != y.Watch || x.ControlSocket != y.ControlSocket || x.MetricsListen != y.MetricsListen || x.StatusPage != y.StatusPage ||
		!old.HA.Equal(cur.HA) && !equalBesidesFloating(old.HA, cur.HA) || !old.BGP.SessionsEqual(cur.BGP) ||
		!old.Kubernetes.EqualBesidesPools(cur.Kubernetes)
}

// equalBesidesFloating reports whether two [ha] sections differ at most
// in their floating addresses, which a reload applies (they are part of
// the spec).
func equalBesidesFloating(x, y config.HA) bool {
	x.Addresses, x.SNATAddresses, y.Addresses, y.SNATAddresses = nil, nil, nil, nil
	return x.Equal(y)
}

// resign hands the VIPs over to a peer at once, before the node stops.
func (a *Agent) resign() {
	if a.ha == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.ha.el.Resign(ctx, "vipd stops"); err != nil {
		a.log.Warn("high availability: resign", "err", err)
	}
}

// stop ends the agent according to on_stop.
func (a *Agent) stop() error {
	if a.cfg.Daemon.OnStop != config.StopClean {
		a.log.Info("stopping; the data plane keeps running (on_stop = \"keep\")")
		return nil
	}
	a.log.Info("stopping; removing everything vipd owns (on_stop = \"clean\")")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := a.reconcile(ctx, "stop", &lb.Spec{})
	if res == nil {
		return errors.New("clean up on stop: cannot read the kernel")
	}
	return res.Err()
}
