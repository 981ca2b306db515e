package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/arp"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/monitor/metrics"
	"github.com/vipd/vipd/monitor/status"
	"github.com/vipd/vipd/systemd"
)

func newRunCmd() *cobra.Command {
	var (
		path      string
		logLevel  string
		logFormat string
	)
	cmd := &cobra.Command{
		Use:   "run -c FILE",
		Short: "Run the daemon: program the kernel and keep it in step with FILE",
		Long: `Run validates FILE, adopts what is already programmed, applies the
difference, and stays up. It re-reads FILE when it changes and on SIGHUP (a
file with errors is rejected and the running configuration keeps serving; a
reload that would delete more than reload_guard of the services or backends
is refused unless forced with "vipd reload --force"), re-reads the kernel
every resync_interval to repair drift, and on SIGTERM or SIGINT stops,
leaving the data plane running (on_stop = "keep") or removing everything
vipd owns (on_stop = "clean"). Under systemd it reports readiness, reloads
and status, and sends watchdog keep-alives from its main loop.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := newLogger(cmd.ErrOrStderr(), logLevel, logFormat)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return runDaemon(ctx, daemonOptions{Path: path, Logger: log, Notifier: systemd.FromEnv()})
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "/etc/vipd/vipd.toml", "configuration file")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cmd.Flags().StringVar(&logFormat, "log-format", "text", "log format: text or json")
	return cmd
}

func newLogger(w interface{ Write([]byte) (int, error) }, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

type daemonOptions struct {
	Path     string
	Logger   *slog.Logger
	Notifier *systemd.Notifier
	// OpenKernel opens the kernel adapters; nil means the real kernel.
	// Tests pass a fake.
	OpenKernel func(*config.Config, *slog.Logger) (lb.Kernel, func(), error)
	// KernelRelease overrides the running kernel's release, for tests.
	KernelRelease string
	// KernelLock is the lock file that admits one vipd per kernel (see
	// lockDaemon). "" means, for the real kernel, the lock of this
	// network namespace, and for a fake kernel, none.
	KernelLock string
	// StartRetry is the wait before the first pass is tried again when
	// it cannot read the kernel; it doubles each time. Zero means one
	// second.
	StartRetry time.Duration
	// ControlLimits and MetricsLimits bound the control socket's and
	// the metrics endpoint's servers; zero values mean controlLimits
	// and metricsLimits. Tests shorten them.
	ControlLimits, MetricsLimits serverLimits
}

// daemon is the running vipd: the current good configuration and the
// reconciler that keeps the kernel in step with it. Its state is owned by
// the main loop; the control socket reaches it through requests.
type daemon struct {
	opts daemonOptions
	log  *slog.Logger
	n    *systemd.Notifier
	r    *lb.Reconciler
	cfg  *config.Config
	// failing holds the operations that failed in the last pass of the
	// running configuration: a reload is not blamed for them.
	failing map[string]bool
	reqs    chan request

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
}

// healthView is the health the daemon acts on: the Manager's, except that
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

// effective returns the spec to program for cfg: its configured spec with
// the health policy applied.
func (d *daemon) effective(cfg *config.Config) *lb.Spec {
	if len(cfg.Health) == 0 {
		return applyDrains(&cfg.Spec, d.drained)
	}
	spec, decisions := health.ApplySpec(&cfg.Spec, cfg.Policies(), d.health, d.decisions)
	d.decisions = decisions
	return applyDrains(spec, d.drained)
}

// check points the health checker at cfg's targets. A check keeps its
// state unless its target changed (see health.Manager), and a check that
// cfg drops is remembered for a while, so pointing the checker back at
// the running configuration after trying cfg changes no backend's health.
func (d *daemon) check(cfg *config.Config) {
	if err := d.hm.Update(cfg.Targets()); err != nil {
		d.log.Error("health checks", "err", err)
	}
}

// try points health checking at cfg, which a reload is about to apply,
// and returns what undoes that if cfg is not kept: it points the checker
// back at the running configuration and restores the services' health
// decisions, which effective(cfg) replaced with cfg's, since a quorum's
// hysteresis depends on the last decision the running configuration made.
func (d *daemon) try(cfg *config.Config) (undo func()) {
	saved := d.decisions
	d.check(cfg)
	return func() {
		d.check(d.cfg)
		d.decisions = saved
	}
}

// request asks the main loop to do something and answer.
type request struct {
	kind             string // "reload", "plan", "snapshot", "drain" or "undrain"
	force            bool
	service, backend string
	// observed is the kernel a snapshot shows.
	observed *lb.State
	reply    chan reply
}

// reply is the main loop's answer to a request.
type reply struct {
	Applied []string         `json:"applied,omitempty"`
	Failed  []string         `json:"failed,omitempty"`
	Planned []string         `json:"planned,omitempty"`
	Status  *status.Snapshot `json:"status,omitempty"`
	Error   string           `json:"error,omitempty"`
}

// defaultMemoryLimit is the Go runtime's soft memory limit for the daemon
// when GOMEMLIMIT does not set one. The runtime collects garbage sooner as
// the heap nears it, which keeps a cold start of 10,000 services x 10
// backends (a plan of 110,000 operations) under 150 MiB resident; it is
// not a cap: a larger configuration's live heap may exceed it, at the cost
// of more frequent collection.
const defaultMemoryLimit = 112 << 20

func runDaemon(ctx context.Context, opts daemonOptions) error {
	log := opts.Logger
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	cfg, err := config.Load(opts.Path)
	if err != nil {
		return err
	}
	if err := canRunChecks(cfg); err != nil {
		return err
	}
	// Nothing is touched before this vipd holds its locks and has read
	// its state: a second vipd, or a corrupt state file, ends the start
	// with the kernel and the files as they were.
	unlock, err := lockDaemon(cfg, &opts)
	if err != nil {
		return err
	}
	defer unlock()
	drained, err := loadState(cfg)
	if err != nil {
		return err
	}
	if opts.OpenKernel == nil {
		opts.OpenKernel = func(cfg *config.Config, log *slog.Logger) (lb.Kernel, func(), error) {
			return openKernel(cfg, log, kernelOptions{})
		}
	}
	if opts.Notifier == nil {
		opts.Notifier = &systemd.Notifier{}
	}
	if opts.ControlLimits == (serverLimits{}) {
		opts.ControlLimits = controlLimits
	}
	if opts.MetricsLimits == (serverLimits{}) {
		opts.MetricsLimits = metricsLimits
	}
	k, closeKernel, err := opts.OpenKernel(cfg, log)
	if err != nil {
		return err
	}
	defer closeKernel()
	ropts := reconcilerOptions(cfg, k, log)
	if opts.KernelRelease != "" {
		ropts.KernelRelease = opts.KernelRelease
	}
	d := &daemon{
		opts: opts, log: log, n: opts.Notifier, cfg: cfg,
		r:             lb.NewReconciler(ropts),
		reqs:          make(chan request),
		healthChanged: make(chan struct{}, 1),
		drained:       drained,
	}
	d.stats = status.NewCache(status.CacheOptions{Interval: cfg.Daemon.StatsInterval, Take: func() (*status.Snapshot, error) {
		return d.takeStatus(ctx)
	}})
	var announcerStats func() arp.Stats
	if a, ok := k.Announcer.(interface{ Stats() arp.Stats }); ok {
		announcerStats = a.Stats
	}
	d.m = metrics.New(metrics.Options{
		Version:   versionString(),
		Logger:    log,
		Announcer: announcerStats,
		// Scrapes wait for d.stats (see serveMetrics) and export what
		// it holds.
		Status: d.stats.Last,
		Health: func() health.Stats { return d.hm.Stats() },
	})
	d.hm = health.NewManager(health.Options{
		Logger: log,
		OnTransition: func(t health.Transition) {
			d.m.HealthTransition(t)
			d.stats.Invalidate()
			select {
			case d.healthChanged <- struct{}{}:
			default:
			}
		},
	})
	d.health = healthView{m: d.hm}
	if len(cfg.Health) > 0 {
		// Reading the whole table costs seconds at 10,000 services; only
		// health checking needs it here.
		d.health.adopted = adopted(cfg, k)
	}
	if err := d.refuseHostVIPs(cfg, cfg.Spec.Services); err != nil {
		return err
	}
	d.check(cfg)
	hctx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	go d.hm.Run(hctx)
	log.Info("starting", "version", versionString(), "config", opts.Path, "services", len(cfg.Spec.Services), "pid", os.Getpid())
	res, err := d.firstPass(ctx, d.effective(cfg))
	if err != nil {
		return err
	}
	d.remember(res)
	d.gen++
	d.m.ConfigLoaded(d.gen, &cfg.Spec)
	stopMetrics, err := d.serveMetrics(cfg.Daemon.MetricsListen)
	if err != nil {
		return err
	}
	defer stopMetrics()

	var (
		changes   <-chan config.Change
		watched   []string // the include patterns being watched
		stopWatch = func() {}
	)
	defer func() { stopWatch() }()
	// watch (re)starts the watcher for the running configuration's files;
	// a reload that changes the include patterns starts it again.
	// A watch that fails, then or later, is retried until it works
	// (see config.Watcher).
	watch := func() {
		stopWatch()
		w := config.NewWatcher(config.WatchOptions{Path: opts.Path, Include: d.cfg.Include, Logger: log,
			OnWatch: func(err error) { d.m.Watch(err == nil) }}, d.cfg.Texts())
		wctx, cancel := context.WithCancel(ctx)
		go w.Run(wctx)
		changes, watched, stopWatch = w.Changes(), d.cfg.Include, cancel
	}
	rewatch := func() {
		if changes != nil && !slices.Equal(watched, d.cfg.Include) {
			watch()
		}
	}
	if cfg.Daemon.Watch {
		watch()
	}
	stopControl, err := d.serveControl(ctx)
	if err != nil {
		return err
	}
	defer stopControl()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	resync := time.NewTicker(cfg.Daemon.ResyncInterval)
	defer resync.Stop()
	var watchdog <-chan time.Time
	if iv := d.n.WatchdogInterval(); iv > 0 {
		t := time.NewTicker(iv / 2)
		defer t.Stop()
		watchdog = t.C
	}
	// While backends drain, passes come every second so that each is
	// deleted soon after its last connection ends.
	drainCheck := time.NewTicker(time.Second)
	defer drainCheck.Stop()
	log.Info("ready", "watch", cfg.Daemon.Watch, "control_socket", cfg.Daemon.ControlSocket)
	d.notify(d.n.Ready(d.status("serving")))
	for {
		select {
		case <-drainCheck.C:
			if d.r.Draining() > 0 {
				d.drainPass(ctx)
			}
		case <-d.healthChanged:
			d.remember(d.reconcile(ctx, "health", d.effective(d.cfg)))
		case <-ctx.Done():
			d.notify(d.n.Stopping())
			return d.stop()
		case <-watchdog:
			// Sent from the loop itself: a wedged loop stops sending and
			// systemd restarts vipd (the data plane keeps running).
			d.notify(d.n.Watchdog())
		case <-hup:
			d.reload(ctx, readAll("sighup"), false)
			rewatch()
		case ch, ok := <-changes:
			if !ok {
				changes = nil
				continue
			}
			d.reload(ctx, fileRead{why: "file changed", file: ch.File, data: ch.Data, removed: ch.Removed, err: ch.Err, seen: ch.Seen, read: ch.Read}, false)
			rewatch()
		case req := <-d.reqs:
			req.reply <- d.handle(ctx, req)
			rewatch()
		case <-resync.C:
			// Sysctls and rules are re-read only here: other passes
			// trust what vipd last wrote, which keeps reloads cheap.
			d.r.Refresh()
			d.remember(d.reconcile(ctx, "resync", d.effective(d.cfg)))
		}
	}
}

func (d *daemon) notify(err error) {
	if err != nil {
		d.log.Warn("systemd notification failed", "err", err)
	}
}

// status is the one-line status systemd shows.
func (d *daemon) status(state string) string {
	return fmt.Sprintf("%s %d services, %d backends; %d operations failing", state, len(d.cfg.Spec.Services), d.cfg.Backends(), len(d.failing))
}

// reconcile runs one pass for spec and logs its outcome. A nil result
// means the kernel could not be read.
func (d *daemon) reconcile(ctx context.Context, why string, spec *lb.Spec) *lb.Result {
	start := time.Now()
	res, err := d.r.Reconcile(ctx, spec)
	d.m.Pass(why, res, time.Since(start))
	d.changed(res)
	if err != nil {
		d.log.Error("reconcile failed", "why", why, "err", err)
		return nil
	}
	logResult(d.log, why, res, time.Since(start))
	return res
}

// remember records which operations fail under the running configuration.
func (d *daemon) remember(res *lb.Result) {
	if res == nil {
		return
	}
	d.failing = map[string]bool{}
	for _, f := range res.Failed {
		d.failing[f.Op.String()] = true
	}
	if res.Ledger != nil {
		d.failing[ledgerFailure] = true
	}
}

// ledgerFailure stands for a failure to store the ownership ledger among
// the failing operations.
const ledgerFailure = "store the ownership ledger"

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
	if len(res.Applied)+len(res.Failed) > 0 || why != "resync" && why != "drain" {
		level = slog.LevelInfo
	}
	log.Log(context.Background(), level, "reconciled", "why", why, "applied", len(res.Applied),
		"failed", len(res.Failed), "skipped", len(res.Skipped), "took", took.Round(time.Microsecond))
}

// canRunChecks reports whether vipd can run cfg's exec checks as their
// user: it never runs them as itself instead.
func canRunChecks(cfg *config.Config) error {
	if u, ok := cfg.ExecUser(); ok {
		if err := health.CanRunAs(u); err != nil {
			return fmt.Errorf("%s: exec checks: %w", cfg.File, err)
		}
	}
	return nil
}

// errReloadRejected marks a reload refused before touching the kernel.
var errReloadRejected = errors.New("reload rejected")

// reload applies a new version of the configuration file: data as read
// (readErr holds a read error), parsed against the running configuration
// so that only the services whose text changed are parsed again, guarded
// against mass deletion, applied, and on failure rolled back to the last
// good configuration when so configured. The returned reply says what
// happened.
func (d *daemon) reload(ctx context.Context, in fileRead, force bool) reply {
	why := in.why
	if in.err != nil {
		return d.rejectInvalid(why, fmt.Errorf("read config: %w", in.err))
	}
	picked := time.Now()
	var (
		cfg   *config.Config
		delta config.Delta
		err   error
	)
	switch {
	case in.all:
		cfg, delta, err = config.Reload(d.cfg)
	case in.removed:
		cfg, delta, err = config.ParseRemoved(d.cfg, in.file)
	default:
		cfg, delta, err = config.ParseFrom(d.cfg, in.file, in.data)
	}
	parsed := time.Now()
	if err == nil {
		err = canRunChecks(cfg)
	}
	if err != nil {
		return d.rejectInvalid(why, err)
	}
	if !delta.Full && delta.From == delta.OldTo && delta.From == delta.NewTo && !force {
		// Only comments or blank lines changed (or the bytes are those
		// of the running configuration again): nothing to do. The new
		// configuration is the same one; keeping it keeps the parser's
		// index with the configuration the next reload starts from.
		d.replace(cfg)
		d.log.Info("configuration unchanged", "why", why, "file", in.name())
		return reply{}
	}
	defer func() {
		// Where a reload's time went, from the moment the file was read.
		d.log.Info("reload timing", "why", why, "file", in.name(), "read", in.read.Round(time.Microsecond),
			"wait", picked.Sub(in.seen.Add(in.read)).Round(time.Microsecond),
			"parse", parsed.Sub(picked).Round(time.Microsecond), "apply", time.Since(parsed).Round(time.Microsecond),
			"total", time.Since(in.seen).Round(time.Microsecond), "services_parsed", delta.NewTo-delta.From, "full", delta.Full)
	}()
	if err := d.refuseHostVIPs(cfg, cfg.Spec.Services[delta.From:delta.NewTo]); err != nil {
		return d.rejectInvalid(why, err)
	}
	d.notify(d.n.Reloading())
	defer func() { d.notify(d.n.Ready(d.status("serving"))) }()
	if err := d.guard(cfg, delta); err != nil && !force {
		d.m.ReloadFailed(metrics.ReloadGuard)
		d.log.Error("reload refused by the guard; the running configuration keeps serving", "why", why, "err", err)
		return reply{Error: err.Error()}
	}
	if delta.Full && restartNeeded(d.cfg, cfg) {
		d.log.Warn("daemon settings changed (interface, uplinks, announcement, iptables, state_dir, resync, watch, control socket or metrics); they take effect on restart",
			"config", d.opts.Path)
	}
	undo := d.try(cfg)
	var res *lb.Result
	if !force {
		// A forced reload runs a full pass, which also repairs drift.
		res = d.reconcileDelta(ctx, why, cfg, delta)
	}
	if res == nil {
		res = d.reconcile(ctx, why, d.effective(cfg))
	}
	if res == nil {
		undo()
		return reply{Error: "cannot read the kernel; nothing applied"}
	}
	return d.settle(ctx, why, cfg, res, undo)
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
// configuration stays.
func (d *daemon) rejectInvalid(why string, err error) reply {
	d.m.ReloadFailed(metrics.ReloadInvalid)
	d.log.Error("reload rejected; the running configuration keeps serving", "why", why, "err", err)
	d.notify(d.n.Status(d.status("serving (last reload rejected: invalid file)")))
	return reply{Error: fmt.Sprintf("%v: %v", errReloadRejected, err)}
}

// reconcileDelta applies a change confined to some services with a pass
// over those services alone (see lb.Reconciler.ReconcileDelta). It returns
// nil, having done nothing, when the change needs a full pass: the
// [daemon] section changed, operations of the running configuration are
// failing (a full pass retries them), a changed service is health
// checked (its backends depend on the health of all), or the change
// reaches what services share.
func (d *daemon) reconcileDelta(ctx context.Context, why string, cfg *config.Config, delta config.Delta) *lb.Result {
	if delta.Full || len(d.failing) > 0 {
		return nil
	}
	old := d.cfg.Spec.Services[delta.From:delta.OldTo]
	cur := cfg.Spec.Services[delta.From:delta.NewTo]
	for _, svcs := range [][]lb.VirtualService{old, cur} {
		for i := range svcs {
			if _, ok := d.cfg.Health[svcs[i].Name]; ok {
				return nil
			}
			if _, ok := cfg.Health[svcs[i].Name]; ok {
				return nil
			}
		}
	}
	return d.passOver(ctx, why, &cfg.Spec, old, cur)
}

// passOver runs a pass over the services old became (cur) alone, with the
// admin drains applied, and logs it. It returns nil when the reconciler
// declines it or cannot read the services: the caller runs a full pass.
func (d *daemon) passOver(ctx context.Context, why string, spec *lb.Spec, old, cur []lb.VirtualService) *lb.Result {
	change := lb.Delta{
		Old: applyDrains(&lb.Spec{Services: old}, d.drained).Services,
		New: applyDrains(&lb.Spec{Services: cur}, d.drained).Services,
	}
	start := time.Now()
	res, ok, err := d.r.ReconcileDelta(ctx, spec, change)
	if !ok {
		return nil
	}
	d.m.Pass(why, res, time.Since(start))
	d.changed(res)
	if err != nil {
		// The services could not be read: a full pass tries again and
		// reports.
		d.log.Warn("reading the services failed; running a full pass", "why", why, "err", err)
		return nil
	}
	logResult(d.log, why, res, time.Since(start))
	return res
}

// drainPass lets draining backends go once their connections end. When
// every draining backend belongs to a service of the running
// configuration without health checks, it reads and plans only those
// services (a second-by-second full pass would read the whole table, which
// takes seconds at 10,000 services); otherwise, or if that pass is
// declined, it runs a full pass.
func (d *daemon) drainPass(ctx context.Context) {
	if len(d.cfg.Health) == 0 && len(d.failing) == 0 {
		keys := map[lb.ServiceKey]bool{}
		for _, k := range d.r.DrainingServices() {
			keys[k] = true
		}
		var svcs []lb.VirtualService
		for i := range d.cfg.Spec.Services {
			vs := &d.cfg.Spec.Services[i]
			if !vs.NodePort && keys[vs.Service.Key] {
				svcs = append(svcs, *vs)
				delete(keys, vs.Service.Key)
			}
		}
		// Draining services that the configuration no longer has
		// (drain_services) leave keys behind: they need a full pass.
		if len(keys) == 0 && len(svcs) > 0 {
			if res := d.passOver(ctx, "drain", &d.cfg.Spec, svcs, svcs); res != nil {
				for _, f := range res.Failed {
					if d.failing == nil {
						d.failing = map[string]bool{}
					}
					d.failing[f.Op.String()] = true
				}
				return
			}
		}
	}
	d.remember(d.reconcile(ctx, "drain", d.effective(d.cfg)))
}

// replace makes cfg the running configuration and retires the one it
// replaces, whose memory the next reload may then reuse: nothing holds on
// to a configuration but d.cfg.
func (d *daemon) replace(cfg *config.Config) {
	if cfg != d.cfg {
		d.cfg.Retire()
		d.cfg = cfg
		d.r.SetRemoval(removalOptions(cfg))
		d.stats.SetInterval(cfg.Daemon.StatsInterval)
		d.stats.Invalidate()
	}
}

// settle finishes a reload whose pass ran: it keeps cfg, or rolls back,
// calling undo (see try) first.
func (d *daemon) settle(ctx context.Context, why string, cfg *config.Config, res *lb.Result, undo func()) reply {
	rep := reply{}
	for _, op := range res.Applied {
		rep.Applied = append(rep.Applied, op.String())
	}
	var fresh []error
	for _, f := range res.Failed {
		rep.Failed = append(rep.Failed, f.Error())
		if !d.failing[f.Op.String()] {
			fresh = append(fresh, f)
		}
	}
	if res.Ledger != nil {
		rep.Failed = append(rep.Failed, res.Ledger.Error())
		if !d.failing[ledgerFailure] {
			fresh = append(fresh, res.Ledger)
		}
	}
	if len(fresh) > 0 && d.cfg.Daemon.OnApplyError == config.ApplyRollback {
		d.m.ReloadFailed(metrics.ReloadApply)
		d.log.Error("reload failed; rolling back to the last good configuration", "why", why, "failed", len(fresh), "first", fresh[0])
		undo()
		back := d.reconcile(ctx, "rollback", d.effective(d.cfg))
		d.remember(back)
		rep.Error = fmt.Sprintf("reload failed (%d operations, first: %v); rolled back to the last good configuration", len(fresh), fresh[0])
		if back == nil || len(back.Failed) > len(d.failing) {
			rep.Error += "; the rollback did not complete, see the log"
		}
		return rep
	}
	d.replace(cfg)
	d.remember(res)
	d.gen++
	d.m.ConfigLoaded(d.gen, &cfg.Spec)
	if len(fresh) > 0 {
		rep.Error = fmt.Sprintf("%d operations failed; kept the new configuration (on_apply_error = \"continue\")", len(fresh))
	}
	return rep
}

// handle answers a control-socket request in the main loop.
func (d *daemon) handle(ctx context.Context, req request) reply {
	switch req.kind {
	case "reload":
		return d.reload(ctx, readAll("control socket"), req.force)
	case "plan":
		cfg, err := config.Load(d.opts.Path)
		if err != nil {
			return reply{Error: err.Error()}
		}
		// Planning must not advance the services' hysteresis.
		saved := d.decisions
		spec := d.effective(cfg)
		d.decisions = saved
		ops, err := d.r.Plan(ctx, spec)
		if err != nil {
			return reply{Error: err.Error()}
		}
		rep := reply{Planned: []string{}}
		for _, op := range ops {
			rep.Planned = append(rep.Planned, op.String())
		}
		return rep
	case "snapshot":
		return reply{Status: d.snapshot(req.observed)}
	case "drain", "undrain":
		if err := d.drain(req.service, req.backend, req.kind == "drain"); err != nil {
			return reply{Error: err.Error()}
		}
		d.log.Info("admin "+req.kind, "service", req.service, "backend", req.backend)
		res := d.reconcile(ctx, req.kind, d.effective(d.cfg))
		d.remember(res)
		rep := reply{}
		if res != nil {
			for _, op := range res.Applied {
				rep.Applied = append(rep.Applied, op.String())
			}
			for _, f := range res.Failed {
				rep.Failed = append(rep.Failed, f.Error())
			}
		}
		return rep
	}
	return reply{Error: fmt.Sprintf("unknown request %q", req.kind)}
}

// ask hands a request to the main loop and waits for the answer. A
// request whose ctx has ended is not handed over.
func (d *daemon) ask(ctx context.Context, req request) (reply, error) {
	if err := ctx.Err(); err != nil {
		return reply{}, err
	}
	req.reply = make(chan reply, 1)
	select {
	case d.reqs <- req:
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
	select {
	case rep := <-req.reply:
		return rep, nil
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
}

// serveMetrics serves /metrics on addr; "" serves nothing. A scrape waits
// for d.stats, which reads the kernel at most once per stats_interval,
// and exports what it holds; the server is bound by d.opts.MetricsLimits.
func (d *daemon) serveMetrics(addr string) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	lim := d.opts.MetricsLimits
	busy := func(w http.ResponseWriter, _ *http.Request) {
		d.m.Rejected(metrics.ServerMetrics)
		http.Error(w, "busy: too many scrapes in progress", http.StatusServiceUnavailable)
	}
	h := d.m.Handler()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", limiter(lim.MaxRequests, busy)(func(w http.ResponseWriter, r *http.Request) {
		// An error is the collector's to report; a client that is gone
		// gets nothing.
		d.stats.Get(r.Context())
		if r.Context().Err() != nil {
			return
		}
		h.ServeHTTP(w, r)
	}))
	srv := lim.server(mux, d.log)
	go srv.Serve(lim.listener(l))
	d.log.Info("serving metrics", "addr", l.Addr().String())
	return func() { srv.Close() }, nil
}

// restartNeeded reports whether the daemon settings that shape the open
// adapters and the main loop differ between two configurations.
func restartNeeded(old, cur *config.Config) bool {
	a, b := old.Daemon, cur.Daemon
	return a.Interface != b.Interface || !slices.Equal(a.Uplinks, b.Uplinks) || a.GARP != b.GARP ||
		a.ManageIPTables != b.ManageIPTables || a.StateDir != b.StateDir || a.ResyncInterval != b.ResyncInterval ||
		a.Watch != b.Watch || a.ControlSocket != b.ControlSocket || a.MetricsListen != b.MetricsListen
}

// stop ends the daemon according to on_stop.
func (d *daemon) stop() error {
	if d.cfg.Daemon.OnStop != config.StopClean {
		d.log.Info("stopping; the data plane keeps running (on_stop = \"keep\")")
		return nil
	}
	d.log.Info("stopping; removing everything vipd owns (on_stop = \"clean\")")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := d.reconcile(ctx, "stop", &lb.Spec{})
	if res == nil {
		return errors.New("clean up on stop: cannot read the kernel")
	}
	return res.Err()
}
