package metrics

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/monitor/status"
)

// statusCollector exports the services and backends of a status snapshot
// taken at each scrape.
type statusCollector struct {
	snapshot func() (*status.Snapshot, error)
	log      *slog.Logger
	errors   prometheus.Counter

	serviceState, serviceConns, servicePackets, serviceBytes         *prometheus.Desc
	backendConns, backendPackets, backendBytes                       *prometheus.Desc
	backendActive, backendInactive, backendWeight, backendConfWeight *prometheus.Desc
	backendUp, foreign, taken                                        *prometheus.Desc
}

// statusHelp is the help of each family of the status metrics, which
// the collector and the text writer (statustext.go) share.
var statusHelp = map[string]string{
	"vipd_backend_active_connections":   "Active (established) connections to a backend.",
	"vipd_backend_bytes_total":          "Bytes of a backend, by direction: in from clients, out to them.",
	"vipd_backend_configured_weight":    "A backend's configured weight; absent when only the kernel has it (draining after removal, say).",
	"vipd_backend_connections_total":    "Connections the kernel scheduled to a backend.",
	"vipd_backend_inactive_connections": "Inactive connections to a backend: closing, or UDP flows.",
	"vipd_backend_packets_total":        "Packets of a backend, by direction: in from clients, out to them.",
	"vipd_backend_up":                   "1 when a configured backend passes its health checks or has none, 0 when it fails them.",
	"vipd_backend_weight":               "A backend's weight in the kernel; absent when the kernel lacks it.",
	"vipd_foreign_services":             "IPVS services vipd does not own.",
	"vipd_service_bytes_total":          "Bytes of a service, by direction: in from clients, out to them.",
	"vipd_service_connections_total":    "Connections the kernel scheduled for a service.",
	"vipd_service_packets_total":        "Packets of a service, by direction: in from clients, out to them.",
	"vipd_service_state":                "State of a service: 1 for its current state (ok, degraded, down, missing in the kernel), 0 for the others.",
	"vipd_status_errors_total":          "Scrapes that could not read the status of vipd's services, and so lack their metrics.",
	"vipd_status_timestamp_seconds":     "When the status behind the service and backend metrics was taken, as a Unix time; vipd takes it again at most once per stats_interval.",
}

var serviceStates = []status.State{status.OK, status.Degraded, status.Down, status.Missing}

func newStatusCollector(snapshot func() (*status.Snapshot, error), log *slog.Logger) *statusCollector {
	svc := []string{"service", "vip"}
	be := []string{"service", "vip", "backend"}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	with := func(l []string, extra string) []string { return append(append([]string(nil), l...), extra) }
	return &statusCollector{
		snapshot: snapshot,
		log:      log,
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vipd_status_errors_total",
			Help: statusHelp["vipd_status_errors_total"],
		}),
		serviceState:      prometheus.NewDesc("vipd_service_state", statusHelp["vipd_service_state"], with(svc, "state"), nil),
		serviceConns:      prometheus.NewDesc("vipd_service_connections_total", statusHelp["vipd_service_connections_total"], svc, nil),
		servicePackets:    prometheus.NewDesc("vipd_service_packets_total", statusHelp["vipd_service_packets_total"], with(svc, "direction"), nil),
		serviceBytes:      prometheus.NewDesc("vipd_service_bytes_total", statusHelp["vipd_service_bytes_total"], with(svc, "direction"), nil),
		backendConns:      prometheus.NewDesc("vipd_backend_connections_total", statusHelp["vipd_backend_connections_total"], be, nil),
		backendPackets:    prometheus.NewDesc("vipd_backend_packets_total", statusHelp["vipd_backend_packets_total"], with(be, "direction"), nil),
		backendBytes:      prometheus.NewDesc("vipd_backend_bytes_total", statusHelp["vipd_backend_bytes_total"], with(be, "direction"), nil),
		backendActive:     prometheus.NewDesc("vipd_backend_active_connections", statusHelp["vipd_backend_active_connections"], be, nil),
		backendInactive:   prometheus.NewDesc("vipd_backend_inactive_connections", statusHelp["vipd_backend_inactive_connections"], be, nil),
		backendWeight:     prometheus.NewDesc("vipd_backend_weight", statusHelp["vipd_backend_weight"], be, nil),
		backendConfWeight: prometheus.NewDesc("vipd_backend_configured_weight", statusHelp["vipd_backend_configured_weight"], be, nil),
		backendUp:         prometheus.NewDesc("vipd_backend_up", statusHelp["vipd_backend_up"], []string{"service", "backend"}, nil),
		foreign:           prometheus.NewDesc("vipd_foreign_services", statusHelp["vipd_foreign_services"], nil, nil),
		taken:             prometheus.NewDesc("vipd_status_timestamp_seconds", statusHelp["vipd_status_timestamp_seconds"], nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	c.errors.Describe(ch)
	for _, d := range []*prometheus.Desc{
		c.serviceState, c.serviceConns, c.servicePackets, c.serviceBytes,
		c.backendConns, c.backendPackets, c.backendBytes,
		c.backendActive, c.backendInactive, c.backendWeight, c.backendConfWeight,
		c.backendUp, c.foreign, c.taken,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	defer c.errors.Collect(ch)
	snap, err := c.snapshot()
	if err != nil {
		c.errors.Inc()
		c.log.Warn("metrics scrape: cannot read the status of services", "err", err)
		return
	}
	if snap == nil {
		return
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ch <- prometheus.MustNewConstMetric(c.foreign, prometheus.GaugeValue, float64(snap.Foreign))
	ch <- prometheus.MustNewConstMetric(c.taken, prometheus.GaugeValue, unix(snap.Time))
	// A NodePort service has an entry per host address, with the same
	// backends; their health is the service's.
	up := map[[2]string]bool{}
	for i := range snap.Services {
		s := &snap.Services[i]
		for _, st := range serviceStates {
			gauge(c.serviceState, b2f(s.State == st), s.Name, s.Key, string(st))
		}
		if s.State != status.Missing {
			counter(c.serviceConns, s.Stats.Conns, s.Name, s.Key)
			counter(c.servicePackets, s.Stats.InPackets, s.Name, s.Key, "in")
			counter(c.servicePackets, s.Stats.OutPackets, s.Name, s.Key, "out")
			counter(c.serviceBytes, s.Stats.InBytes, s.Name, s.Key, "in")
			counter(c.serviceBytes, s.Stats.OutBytes, s.Name, s.Key, "out")
		}
		for j := range s.Backends {
			b := &s.Backends[j]
			addr := b.Address.String()
			if b.Configured {
				gauge(c.backendConfWeight, float64(b.ConfiguredWeight), s.Name, s.Key, addr)
				if k := [2]string{s.Name, addr}; !up[k] {
					up[k] = true
					gauge(c.backendUp, b2f(b.Health == nil || b.Health.State != "down"), s.Name, addr)
				}
			}
			if !b.InKernel {
				continue
			}
			gauge(c.backendWeight, float64(b.Weight), s.Name, s.Key, addr)
			gauge(c.backendActive, float64(b.ActiveConns), s.Name, s.Key, addr)
			gauge(c.backendInactive, float64(b.InactiveConns), s.Name, s.Key, addr)
			counter(c.backendConns, b.Stats.Conns, s.Name, s.Key, addr)
			counter(c.backendPackets, b.Stats.InPackets, s.Name, s.Key, addr, "in")
			counter(c.backendPackets, b.Stats.OutPackets, s.Name, s.Key, addr, "out")
			counter(c.backendBytes, b.Stats.InBytes, s.Name, s.Key, addr, "in")
			counter(c.backendBytes, b.Stats.OutBytes, s.Name, s.Key, addr, "out")
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var (
	garpDesc = prometheus.NewDesc("vipd_garp_sent_total",
		"Gratuitous ARP packets and unsolicited IPv6 neighbour advertisements sent for VIPs.", nil, nil)
	arpRepliesDesc = prometheus.NewDesc("vipd_arp_replies_sent_total",
		"ARP replies and solicited IPv6 neighbour advertisements sent for VIPs.", nil, nil)
	arpErrorsDesc = prometheus.NewDesc("vipd_arp_send_errors_total",
		"ARP and neighbour discovery packets for VIPs that could not be sent.", nil, nil)
)

// AnnouncerStats are the announcer's packet counts, as plain numbers: the
// agent copies them from the announcer (kernel/arp's Stats), so that
// metrics needs no kernel adapter.
type AnnouncerStats struct {
	// Announcements counts gratuitous ARP packets and unsolicited
	// neighbour advertisements.
	Announcements uint64
	// Replies counts ARP replies and solicited neighbour advertisements.
	Replies uint64
	// Errors counts packets that could not be sent.
	Errors uint64
}

// announcerCollector exports the announcer's counts, read at each scrape.
type announcerCollector func() AnnouncerStats

// Describe implements prometheus.Collector.
func (c announcerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- garpDesc
	ch <- arpRepliesDesc
	ch <- arpErrorsDesc
}

// Collect implements prometheus.Collector.
func (c announcerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c()
	ch <- prometheus.MustNewConstMetric(garpDesc, prometheus.CounterValue, float64(s.Announcements))
	ch <- prometheus.MustNewConstMetric(arpRepliesDesc, prometheus.CounterValue, float64(s.Replies))
	ch <- prometheus.MustNewConstMetric(arpErrorsDesc, prometheus.CounterValue, float64(s.Errors))
}

var (
	checksDesc = prometheus.NewDesc("vipd_health_checks",
		"Distinct health checks running; backends with the same check share one.", nil, nil)
	checkedDesc = prometheus.NewDesc("vipd_health_checked_backends",
		"Backends of services with at least one health check.", nil, nil)
	probesDesc = prometheus.NewDesc("vipd_health_probes_total",
		"Health probes completed.", nil, nil)
	probeFailuresDesc = prometheus.NewDesc("vipd_health_probe_failures_total",
		"Health probes that failed.", nil, nil)
	inFlightDesc = prometheus.NewDesc("vipd_health_probes_in_flight",
		"Health probes running or waiting for a free slot.", nil, nil)
	latenessDesc = prometheus.NewDesc("vipd_health_check_lateness_seconds",
		"How late health probes started: the time from a probe's due time to its start.", nil, nil)
)

// healthCollector exports the health checker's counters, read at each
// scrape.
type healthCollector func() health.Stats

// Describe implements prometheus.Collector.
func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{checksDesc, checkedDesc, probesDesc, probeFailuresDesc, inFlightDesc, latenessDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	s := c()
	ch <- prometheus.MustNewConstMetric(checksDesc, prometheus.GaugeValue, float64(s.Checks))
	ch <- prometheus.MustNewConstMetric(checkedDesc, prometheus.GaugeValue, float64(s.Backends))
	ch <- prometheus.MustNewConstMetric(probesDesc, prometheus.CounterValue, float64(s.Probes))
	ch <- prometheus.MustNewConstMetric(probeFailuresDesc, prometheus.CounterValue, float64(s.Failures))
	ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(s.InFlight))
	buckets := make(map[float64]uint64, len(health.LatenessBuckets))
	var n uint64
	for i, le := range health.LatenessBuckets {
		n += s.Lateness.Counts[i]
		buckets[le] = n
	}
	n += s.Lateness.Counts[len(health.LatenessBuckets)]
	ch <- prometheus.MustNewConstHistogram(latenessDesc, n, s.Lateness.Sum, buckets)
}
