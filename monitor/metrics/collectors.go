package metrics

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/monitor/status"
)

// statusCollector exports the services and backends of a status snapshot
// taken at each scrape, as statusMetrics describes them.
type statusCollector struct {
	snapshot func() (*status.Snapshot, error)
	log      *slog.Logger
	errors   prometheus.Counter
	// descs holds the Desc of each of statusMetrics, by index; nil for
	// the error counter.
	descs []*prometheus.Desc
	// up, state, foreign and taken are the descs of the families that
	// are one of a kind.
	up, state, foreign, taken *prometheus.Desc
}

var serviceStates = []status.State{status.OK, status.Degraded, status.Down, status.Missing}

func newStatusCollector(snapshot func() (*status.Snapshot, error), log *slog.Logger) *statusCollector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &statusCollector{
		snapshot: snapshot,
		log:      log,
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: statusErrors,
			Help: statusHelp[statusErrors],
		}),
		descs: make([]*prometheus.Desc, len(statusMetrics)),
	}
	for i := range statusMetrics {
		m := &statusMetrics[i]
		if m.name == statusErrors {
			continue
		}
		d := prometheus.NewDesc(m.name, m.help, m.labels(), nil)
		c.descs[i] = d
		switch {
		case m.scope == backendUp:
			c.up = d
		case m.scope == serviceState:
			c.state = d
		case m.name == "vipd_foreign_services":
			c.foreign = d
		case m.name == "vipd_status_timestamp_seconds":
			c.taken = d
		}
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	c.errors.Describe(ch)
	for _, d := range c.descs {
		if d != nil {
			ch <- d
		}
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
	sample := func(i int, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[i], statusMetrics[i].typ, v, labels...)
	}
	ch <- prometheus.MustNewConstMetric(c.foreign, prometheus.GaugeValue, float64(snap.Foreign))
	for _, p := range bfdPeers(snap) {
		for k := range statusMetrics {
			m := &statusMetrics[k]
			switch {
			case m.scope != perBFD:
			case m.bfdByReason != nil:
				for i, v := range m.bfdByReason(p.BFD) {
					sample(k, float64(v), p.Address, bfdReasons[i])
				}
			default:
				sample(k, m.bfdValue(p.BFD), p.Address)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(c.taken, prometheus.GaugeValue, unix(snap.Time))
	// A NodePort service has an entry per host address, with the same
	// backends; their health is the service's.
	up := map[[2]string]bool{}
	for i := range snap.Services {
		s := &snap.Services[i]
		for _, st := range serviceStates {
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, b2f(s.State == st), s.Name, s.Key, string(st))
		}
		for k := range statusMetrics {
			m := &statusMetrics[k]
			if m.scope != perService || !m.service(s) {
				continue
			}
			if m.serviceIn != nil {
				sample(k, float64(m.serviceIn(s)), s.Name, s.Key, "in")
				sample(k, float64(m.serviceOut(s)), s.Name, s.Key, "out")
			} else {
				sample(k, m.serviceValue(s), s.Name, s.Key)
			}
		}
		for j := range s.Backends {
			b := &s.Backends[j]
			addr := b.Address.String()
			if b.Configured {
				if k := [2]string{s.Name, addr}; !up[k] {
					up[k] = true
					ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, b2f(b.Health == nil || b.Health.State != "down"), s.Name, addr)
				}
			}
			for k := range statusMetrics {
				m := &statusMetrics[k]
				if m.scope != perBackend || !m.backend(b) {
					continue
				}
				if m.backendIn != nil {
					sample(k, float64(m.backendIn(b)), s.Name, s.Key, addr, "in")
					sample(k, float64(m.backendOut(b)), s.Name, s.Key, addr, "out")
				} else {
					sample(k, m.backendValue(b), s.Name, s.Key, addr)
				}
			}
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
