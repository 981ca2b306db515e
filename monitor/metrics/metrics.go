// Package metrics exports vipd's Prometheus metrics: what the daemon does
// (reconcile passes, reloads, health transitions, sysctl drift), counted
// as it happens, and what the kernel, the health checker and the announcer
// report, read at scrape time. Everything lives on a registry of its own,
// served by Handler, with the Go runtime and process metrics beside it.
//
// Names follow the Prometheus conventions: a vipd_ prefix, _total on
// counters, base units (seconds, bytes). Services are labelled by their
// configured name (service) and kernel key (vip: "192.0.2.10:80/tcp",
// "[2001:db8::10]:443/tcp" or "fwmark 7/ipv4"), backends by address
// (backend: "10.0.0.1:8080").
package metrics

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/monitor/status"
)

// Options configure Metrics.
type Options struct {
	// Version is vipd's version, exported as vipd_build_info.
	Version string
	// Status returns the status of vipd's services for the per-service
	// and per-backend metrics; nil exports none. It is called on every
	// scrape, from the scraping goroutine, so it must be safe for
	// concurrent use, and cheap: it returns a snapshot at hand (see
	// status.Cache), never reads the kernel. A nil snapshot exports
	// nothing; an error counts in vipd_status_errors_total and leaves the
	// scrape without those metrics.
	Status func() (*status.Snapshot, error)
	// Announcer returns the announcer's packet counts on every scrape;
	// nil exports none.
	Announcer func() AnnouncerStats
	// Health returns the health checker's counters (health.Manager's
	// Stats) on every scrape; nil exports none.
	Health func() health.Stats
	// Logger receives scrape errors; nil discards them.
	Logger *slog.Logger
	// Now is the clock of the timestamps; nil means time.Now.
	Now func() time.Time
	// NoRuntime leaves out the Go runtime and process collectors.
	NoRuntime bool
}

// ReloadFailure is why a reload did not take effect.
type ReloadFailure string

// The reasons a reload fails.
const (
	// ReloadInvalid: the file does not parse or validate.
	ReloadInvalid ReloadFailure = "invalid"
	// ReloadGuard: the reload guard refused a mass deletion.
	ReloadGuard ReloadFailure = "guard"
	// ReloadApply: operations failed and the daemon rolled back.
	ReloadApply ReloadFailure = "apply"
)

// Server names one of vipd's servers.
type Server string

// The servers.
const (
	ServerControl Server = "control"
	ServerMetrics Server = "metrics"
)

// Metrics are vipd's metrics. Its methods are safe for concurrent use.
type Metrics struct {
	// reg holds every metric; base every one but the status metrics,
	// which the handler writes itself in the text format (see serve).
	reg, base *prometheus.Registry
	status    *statusCollector
	log       *slog.Logger
	handler   http.Handler
	// full serves the whole registry through client_golang.
	full http.Handler
	now  func() time.Time

	passes      *prometheus.CounterVec
	ops         *prometheus.CounterVec
	passErrors  prometheus.Counter
	duration    prometheus.Histogram
	lastSuccess prometheus.Gauge

	generation     prometheus.Gauge
	lastReload     prometheus.Gauge
	reloadFailures *prometheus.CounterVec
	stale          prometheus.Gauge

	transitions *prometheus.CounterVec
	drift       *prometheus.CounterVec
	rejected    *prometheus.CounterVec

	// watchUp and watchFailures are registered when Watch is first
	// called: a daemon that does not watch its files exports neither.
	watchOnce     sync.Once
	watchUp       prometheus.Gauge
	watchFailures prometheus.Counter
	// haMaster, haPriority and haTransitions are registered when HA is
	// first called: a node without [ha] exports none of them.
	haOnce        sync.Once
	haMaster      prometheus.Gauge
	haPriority    prometheus.Gauge
	haTransitions *prometheus.CounterVec
	// haSNAT counts the connection-tracking entries of SNAT connections
	// a new master made, found or failed to make (registered with HA).
	haSNAT *prometheus.CounterVec
	// bgp is registered when a BGP method is first called (see bgpm).
	bgpOnce sync.Once
	bgp     *bgpMetrics
	// sourceUp is registered when Source is first called.
	sourceOnce sync.Once
	sourceUp   *prometheus.GaugeVec
	// pools is registered when Pools is first called.
	poolsOnce sync.Once
	pools     poolCollector

	mu sync.Mutex
	// set holds the value vipd last set each sysctl to.
	set map[string]string
	// checked holds the backends with transition series.
	checked map[backendRef]struct{}
}

type backendRef struct {
	service string
	backend netip.AddrPort
}

// DurationBuckets are the buckets of vipd_reconcile_duration_seconds: a
// pass takes from about 100µs (nothing to do) to a minute (a cold start
// programming a hundred thousand backends).
var DurationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
}

// New returns vipd's metrics on a new registry.
func New(opts Options) *Metrics {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Metrics{
		reg:  prometheus.NewRegistry(),
		base: prometheus.NewRegistry(),
		log:  opts.Logger,
		now:  opts.Now,
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_reconcile_passes_total",
			Help: "Reconcile passes run, by what triggered them.",
		}, []string{"why"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_reconcile_operations_total",
			Help: "Planned kernel operations, by kind and by result: applied, failed, or skipped because one they depend on failed.",
		}, []string{"op", "result"}),
		passErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipd_reconcile_errors_total",
			Help: "Reconcile passes that could not read the kernel or had an operation fail.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "vipd_reconcile_duration_seconds",
			Help:    "Time a reconcile pass took: observe, plan and apply.",
			Buckets: DurationBuckets,
		}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_reconcile_last_success_timestamp_seconds",
			Help: "When the last reconcile pass with no failed operation ended, as a Unix time.",
		}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_config_generation",
			Help: "Generation of the running configuration: 1 at start, one more with each configuration that takes effect.",
		}),
		lastReload: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_config_last_reload_success_timestamp_seconds",
			Help: "When the running configuration took effect, as a Unix time.",
		}),
		reloadFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_config_reload_failures_total",
			Help: "Reloads that did not take effect, by reason: invalid file, refused by the reload guard, or failed to apply and rolled back.",
		}, []string{"reason"}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_config_stale",
			Help: "1 while the configuration file differs from the running configuration because its last reload failed, 0 once a configuration takes effect.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_health_transitions_total",
			Help: "Health transitions of backends, by the state they went to.",
		}, []string{"service", "backend", "to"}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_sysctl_drift_total",
			Help: "Times a pass had to set a sysctl again to the value vipd had already set it to.",
		}, []string{"sysctl"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_http_requests_rejected_total",
			Help: "Requests the control socket or the metrics endpoint refused at once (503) because as many as it serves at a time were in progress, by server.",
		}, []string{"server"}),
		watchUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_config_watch_up",
			Help: "1 while vipd watches its configuration files for changes, 0 while watching has failed and is being retried (SIGHUP and vipd reload still reload).",
		}),
		watchFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipd_config_watch_failures_total",
			Help: "Times watching the configuration files failed: a watched directory removed or renamed, or inotify out of resources.",
		}),
		haMaster: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_ha_master",
			Help: "1 while this node is the master of its VRRP virtual router and serves the VIPs, 0 while it stands by.",
		}),
		haPriority: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vipd_ha_priority",
			Help: "This node's VRRP priority: the configured one less what tracking takes off; 0 while drained (vipd drain --node).",
		}),
		haTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_ha_transitions_total",
			Help: "Changes of this node's VRRP role, by the role taken and its cause (start, owner, restart, master_down, peer_resigned, preempt, higher_priority, resign).",
		}, []string{"role", "cause"}),
		haSNAT: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vipd_ha_snat_connections_total",
			Help: "Synchronized connections of snat services whose connection tracking this node took over on becoming master, by result: tracked (entry made), existing (the kernel had one, kept), replaced (the kernel had one, a leftover of the node's last turn as master, made again from the peer's connection), failed.",
		}, []string{"result"}),
		sourceUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vipd_source_up",
			Help: "1 while a source of services besides the file is in step with its origin, 0 while it is not (its last services keep serving).",
		}, []string{"source"}),
		set:     map[string]string{},
		checked: map[backendRef]struct{}{},
	}
	for k := lb.OpKind(1); !strings.HasPrefix(k.String(), "op("); k++ {
		for _, r := range []string{"applied", "failed", "skipped"} {
			m.ops.WithLabelValues(k.String(), r)
		}
	}
	for _, r := range []ReloadFailure{ReloadInvalid, ReloadGuard, ReloadApply} {
		m.reloadFailures.WithLabelValues(string(r))
	}
	for _, s := range []Server{ServerControl, ServerMetrics} {
		m.rejected.WithLabelValues(string(s))
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vipd_build_info",
		Help: "Always 1, labelled with vipd's version.",
	}, []string{"version"})
	buildInfo.WithLabelValues(opts.Version).Set(1)

	m.register(buildInfo, m.passes, m.ops, m.passErrors, m.duration, m.lastSuccess,
		m.generation, m.lastReload, m.reloadFailures, m.stale, m.transitions, m.drift, m.rejected)
	if opts.Status != nil {
		m.status = newStatusCollector(opts.Status, opts.Logger)
		m.reg.MustRegister(m.status)
	}
	if opts.Announcer != nil {
		m.register(announcerCollector(opts.Announcer))
	}
	if opts.Health != nil {
		m.register(healthCollector(opts.Health))
	}
	if !opts.NoRuntime {
		m.register(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m.full = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:      errorLog{opts.Logger},
		ErrorHandling: promhttp.ContinueOnError,
	})
	m.handler = promhttp.InstrumentMetricHandler(registries{m.reg, m.base}, http.HandlerFunc(m.serve))
	return m
}

// register registers cs on both registries.
func (m *Metrics) register(cs ...prometheus.Collector) {
	m.reg.MustRegister(cs...)
	m.base.MustRegister(cs...)
}

// registries registers on both of its registries.
type registries [2]*prometheus.Registry

func (r registries) Register(c prometheus.Collector) error {
	if err := r[0].Register(c); err != nil {
		return err
	}
	return r[1].Register(c)
}

func (r registries) MustRegister(cs ...prometheus.Collector) {
	r[0].MustRegister(cs...)
	r[1].MustRegister(cs...)
}

func (r registries) Unregister(c prometheus.Collector) bool {
	a, b := r[0].Unregister(c), r[1].Unregister(c)
	return a || b
}

// serve serves a scrape. In the text format, the one Prometheus asks for,
// it gathers the registry without the status metrics and writes those
// itself, merged in by name, byte for byte what the registry would write
// (statusFamilies); other formats (protobuf) get the registry's whole
// output.
func (m *Metrics) serve(w http.ResponseWriter, r *http.Request) {
	format := expfmt.Negotiate(r.Header)
	if m.status == nil || format.FormatType() != expfmt.TypeTextPlain {
		m.full.ServeHTTP(w, r)
		return
	}
	mfs, err := m.base.Gather()
	if err != nil {
		// As the registry's handler does with ContinueOnError: serve
		// what was gathered.
		errorLog{m.log}.Println("error gathering metrics:", err)
	}
	snap, err := m.status.snapshot()
	if err != nil {
		m.status.errors.Inc()
		m.status.log.Warn("metrics scrape: cannot read the status of services", "err", err)
		snap = nil
	}
	var errs dto.Metric
	if err := m.status.errors.Write(&errs); err != nil {
		errorLog{m.log}.Println("error reading vipd_status_errors_total:", err)
	}
	fams := statusFamilies(snap, errs.GetCounter().GetValue())

	w.Header().Set("Content-Type", string(format))
	var out io.Writer = w
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out = gz
	}
	bw := bufio.NewWriterSize(out, 64<<10)
	enc := expfmt.NewEncoder(bw, format)
	tw := &textWriter{w: bw}
	for i, j := 0, 0; i < len(mfs) || j < len(fams); {
		if j == len(fams) || (i < len(mfs) && mfs[i].GetName() < fams[j].name) {
			if err := enc.Encode(mfs[i]); err != nil {
				errorLog{m.log}.Println("error encoding and sending metric family:", err)
				return
			}
			i++
			continue
		}
		fams[j].write(tw)
		j++
	}
	if err := bw.Flush(); err != nil {
		errorLog{m.log}.Println("error sending metrics:", err)
	}
}

// acceptsGzip reports whether an Accept-Encoding header accepts gzip.
func acceptsGzip(header string) bool {
	for part := range strings.SplitSeq(header, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			continue
		}
		q, ok := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q=")
		return !ok || (q != "0" && q != "0.0" && q != "0.00" && q != "0.000")
	}
	return false
}

// errorLog hands promhttp's errors to a Logger.
type errorLog struct{ log *slog.Logger }

func (l errorLog) Println(v ...any) {
	l.log.Log(context.Background(), slog.LevelWarn, "metrics scrape", "err", strings.TrimSpace(fmt.Sprintln(v...)))
}

// Handler returns the handler that serves the metrics, for /metrics.
func (m *Metrics) Handler() http.Handler { return m.handler }

// Registry returns the registry the metrics live on, for tests and for
// adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Pass records a reconcile pass: what triggered it (the daemon's why:
// "start", "resync", "reload", ...; a small fixed set), its result (nil
// when the kernel could not be read) and how long it took. It also counts
// sysctl drift: an applied set-sysctl operation that sets a sysctl to the
// value vipd last set it to means something changed it in between. A
// sysctl that becomes wanted on a reload, or whose wanted value changes,
// is not drift; one vipd found already set when it started is tracked
// from the first time vipd has to set it.
func (m *Metrics) Pass(why string, res *lb.Result, took time.Duration) {
	m.passes.WithLabelValues(why).Inc()
	m.duration.Observe(took.Seconds())
	if res == nil {
		m.passErrors.Inc()
		return
	}
	// Sum by kind first: a cold start applies an operation per object.
	type count struct{ applied, failed, skipped int }
	counts := map[lb.OpKind]*count{}
	get := func(k lb.OpKind) *count {
		c := counts[k]
		if c == nil {
			c = &count{}
			counts[k] = c
		}
		return c
	}
	for i := range res.Applied {
		get(res.Applied[i].Kind).applied++
	}
	for _, f := range res.Failed {
		get(f.Op.Kind).failed++
	}
	for _, op := range res.Skipped {
		get(op.Kind).skipped++
	}
	for k, c := range counts {
		m.ops.WithLabelValues(k.String(), "applied").Add(float64(c.applied))
		m.ops.WithLabelValues(k.String(), "failed").Add(float64(c.failed))
		m.ops.WithLabelValues(k.String(), "skipped").Add(float64(c.skipped))
	}
	if len(res.Failed) > 0 {
		m.passErrors.Inc()
	} else {
		m.lastSuccess.Set(unix(m.now()))
	}
	if counts[lb.OpSetSysctl] == nil || counts[lb.OpSetSysctl].applied == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range res.Applied {
		h := res.Applied[i].Host
		if res.Applied[i].Kind != lb.OpSetSysctl || h == nil {
			continue
		}
		c := m.drift.WithLabelValues(sysctlName(h.Sysctl))
		if last, ok := m.set[h.Sysctl]; ok && last == h.Value {
			c.Inc()
		}
		m.set[h.Sysctl] = h.Value
	}
}

// sysctlName turns a path below /proc/sys into the name sysctl(8) uses:
// net/ipv4/vs/conntrack becomes net.ipv4.vs.conntrack.
func sysctlName(path string) string {
	return strings.ReplaceAll(path, "/", ".")
}

// ConfigLoaded records that a configuration took effect, at start or on a
// reload: its generation and spec. It clears vipd_config_stale and drops
// the health transition series of backends spec no longer has.
func (m *Metrics) ConfigLoaded(generation uint64, spec *lb.Spec) {
	m.generation.Set(float64(generation))
	m.lastReload.Set(unix(m.now()))
	m.stale.Set(0)

	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.checked) == 0 {
		// Nothing to forget: skip the walk over every backend, which a
		// reload of a large table would otherwise pay.
		return
	}
	keep := map[backendRef]bool{}
	for _, vs := range spec.Services {
		for _, b := range vs.Backends {
			keep[backendRef{vs.Name, b.Addr}] = true
		}
	}
	for r := range m.checked {
		if !keep[r] {
			m.transitions.DeletePartialMatch(prometheus.Labels{"service": r.service, "backend": r.backend.String()})
			delete(m.checked, r)
		}
	}
}

// ReloadFailed records a reload that did not take effect, and sets
// vipd_config_stale: the file no longer says what runs.
func (m *Metrics) ReloadFailed(reason ReloadFailure) {
	m.reloadFailures.WithLabelValues(string(reason)).Inc()
	m.stale.Set(1)
}

// HealthTransition records a backend's health transition, as a
// health.Manager reports it to Options.OnTransition.
func (m *Metrics) HealthTransition(t health.Transition) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.transitions.WithLabelValues(t.Service, t.Backend.String(), t.State.String()).Inc()
	m.checked[backendRef{t.Service, t.Backend}] = struct{}{}
}

func unix(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}

// Rejected records a request a server refused because it was serving as
// many as it serves at a time.
func (m *Metrics) Rejected(s Server) {
	m.rejected.WithLabelValues(string(s)).Inc()
}

// Watch records the state of the watch on the configuration files, as the
// config.Watcher reports it (WatchOptions.OnWatch): up, or failed and
// being retried. Each report of a failure counts in
// vipd_config_watch_failures_total. The first call registers both
// metrics.
// HA records the node's VRRP role and priority; transition says the role
// just changed.
func (m *Metrics) HA(master bool, priority uint8, cause string) {
	m.haOnce.Do(m.registerHA)
	role := "backup"
	if master {
		role = "master"
		m.haMaster.Set(1)
	} else {
		m.haMaster.Set(0)
	}
	m.haPriority.Set(float64(priority))
	if cause != "" {
		m.haTransitions.WithLabelValues(role, cause).Inc()
	}
}

func (m *Metrics) registerHA() {
	m.register(m.haMaster, m.haPriority, m.haTransitions, m.haSNAT)
	for _, r := range []string{"tracked", "existing", "replaced", "failed"} {
		m.haSNAT.WithLabelValues(r)
	}
}

// SNATTakeover is what a new master did to the connection tracking of
// the SNAT connections it took over: entries made, found and kept,
// found and made again, refused.
type SNATTakeover struct {
	Tracked, Existing, Replaced, Failed int
}

// HASNAT counts what a new master did to the connection tracking of the
// SNAT connections it took over.
func (m *Metrics) HASNAT(t SNATTakeover) {
	m.haOnce.Do(m.registerHA)
	m.haSNAT.WithLabelValues("tracked").Add(float64(t.Tracked))
	m.haSNAT.WithLabelValues("existing").Add(float64(t.Existing))
	m.haSNAT.WithLabelValues("replaced").Add(float64(t.Replaced))
	m.haSNAT.WithLabelValues("failed").Add(float64(t.Failed))
}

// Source records whether a source is in step with its origin.
func (m *Metrics) Source(name string, up bool) {
	m.sourceOnce.Do(func() { m.register(m.sourceUp) })
	v := 0.0
	if up {
		v = 1
	}
	m.sourceUp.WithLabelValues(name).Set(v)
}

func (m *Metrics) Watch(up bool) {
	m.watchOnce.Do(func() { m.register(m.watchUp, m.watchFailures) })
	if up {
		m.watchUp.Set(1)
		return
	}
	m.watchUp.Set(0)
	m.watchFailures.Inc()
}
