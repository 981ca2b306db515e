package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vipd/vipd/control"

	"github.com/spf13/cobra"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/conntrack"
	"github.com/vipd/vipd/kernel/link"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/metrics"
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
			if err := smallPages(); err != nil {
				log.Warn("memory may be backed by huge pages", "err", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return runDaemon(ctx, daemonOptions{Path: path, Logger: log, LogFormat: logFormat, Notifier: systemd.FromEnv()})
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

// daemonOptions wire the daemon: what runDaemon gives the agent, and the
// limits of the servers it starts for it.
type daemonOptions struct {
	Path   string
	Logger *slog.Logger
	// LogFormat is the log's format ("text" or "json"; "" is text),
	// which the programs vipd runs log in too.
	LogFormat string
	Notifier  *systemd.Notifier
	// OpenKernel opens the kernel adapters; nil means the real kernel.
	// Tests pass a fake.
	OpenKernel func(*config.Config, *slog.Logger) (lb.Kernel, func(), error)
	// KernelRelease overrides the running kernel's release, for tests.
	KernelRelease string
	// KernelLock is the lock file that admits one vipd per kernel (see
	// agent.Options.KernelLock). "" means, for the real kernel, the lock
	// of this network namespace, and for a fake kernel, none.
	KernelLock string
	// StartRetry is agent.Options.StartRetry.
	StartRetry time.Duration
	// OpenElector overrides the VRRP election, for tests.
	OpenElector func(agent.ElectorOptions) (agent.Elector, error)
	// ControlLimits and MetricsLimits bound the control socket's and
	// the metrics endpoint's servers; zero values mean controlLimits
	// and metricsLimits. Tests shorten them.
	ControlLimits, MetricsLimits control.Limits
}

// runDaemon runs the agent until ctx ends, with the real kernel unless
// opts say otherwise, its control socket and metrics endpoint, systemd's
// notifications, and a reload on SIGHUP.
func runDaemon(ctx context.Context, opts daemonOptions) error {
	log := opts.Logger
	aopts := agent.Options{Path: opts.Path, Logger: log, OpenKernel: opts.OpenKernel, KernelRelease: opts.KernelRelease,
		KernelLock: opts.KernelLock, StartRetry: opts.StartRetry, Version: versionString(),
		OpenElector: openElector(log), LinkUp: link.Up, OpenSources: openSources, ConnTracker: conntrack.Tracker{},
		WatchLinks:    func(ctx context.Context) <-chan struct{} { return link.Watch(ctx, log) },
		OpenAnnouncer: openAnnouncer(log, cmp.Or(opts.LogFormat, "text"))}
	if opts.Notifier != nil {
		aopts.Notifier = opts.Notifier
	}
	if opts.OpenElector != nil {
		aopts.OpenElector = opts.OpenElector
	}
	history := pageHistory(&aopts)
	if aopts.OpenKernel == nil {
		aopts.OpenKernel = func(cfg *config.Config, log *slog.Logger) (lb.Kernel, func(), error) {
			return openKernel(cfg, log, kernelOptions{})
		}
		if aopts.KernelLock == "" {
			lock, err := agent.NetnsLock()
			if err != nil {
				return err
			}
			aopts.KernelLock = lock
		}
	}
	if aopts.KernelRelease == "" {
		release, err := link.KernelRelease()
		if err != nil {
			log.Warn("cannot read the kernel release; conn_reuse_mode will be 0", "err", err)
		}
		aopts.KernelRelease = release
	}
	if opts.ControlLimits == (control.Limits{}) {
		opts.ControlLimits = controlLimits
	}
	if opts.MetricsLimits == (control.Limits{}) {
		opts.MetricsLimits = metricsLimits
	}
	aopts.Serve = func(ctx context.Context, a *agent.Agent, d config.Daemon) (func(), error) {
		stopMetrics, err := serveMetrics(a, d.MetricsListen, statusPage(a, d, history), opts.MetricsLimits, log)
		if err != nil {
			return nil, err
		}
		stopControl, err := control.Serve(a, d.ControlSocket, opts.ControlLimits, log)
		if err != nil {
			stopMetrics()
			return nil, err
		}
		return func() { stopControl(); stopMetrics() }, nil
	}
	a := agent.New(aopts)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	hctx, stopHup := context.WithCancel(ctx)
	defer stopHup()
	go func() {
		for {
			select {
			case <-hup:
				// The agent logs what the reload did, and why it failed.
				a.Reload(hctx, agent.ReloadOptions{Why: "sighup"})
			case <-hctx.Done():
				return
			}
		}
	}()
	return a.Run(ctx)
}

// serveMetrics serves a's metrics on addr, and the status page's routes
// (page, nil for none); "" serves nothing. The server is bound by lim,
// its connections by connSlots.
func serveMetrics(a *agent.Agent, addr string, page map[string]http.Handler, lim control.Limits, log *slog.Logger) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	busy := func(w http.ResponseWriter, _ *http.Request) {
		a.Rejected(metrics.ServerMetrics)
		http.Error(w, "busy: too many scrapes in progress", http.StatusServiceUnavailable)
	}
	h := a.Metrics()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", control.Limiter(lim.MaxRequests, lim.RequestWait, busy)(h.ServeHTTP))
	// The status page has limits of its own: pages cannot starve scrapes.
	pageLimit := control.Limiter(lim.MaxRequests, lim.RequestWait, busy)
	for pattern, h := range page {
		mux.Handle(pattern, pageLimit(h.ServeHTTP))
	}
	slots := newConnSlots(lim.MaxConns, lim.MaxConnsPerClient, slowHeaders)
	srv := lim.Server(slots.serving(mux), log)
	srv.ConnState, srv.ConnContext = slots.state, slots.context
	go srv.Serve(slots.listener(l))
	log.Info("serving metrics", "addr", l.Addr().String())
	return func() { srv.Close() }, nil
}
