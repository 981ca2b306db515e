package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vipd/vipd/monitor/status"
)

// statusScope says what a status metric has a sample for, and so its
// labels.
type statusScope uint8

const (
	// perService: a sample per service (labels service, vip), or two with
	// a direction.
	perService statusScope = iota
	// perBackend: a sample per backend of a service (labels service, vip,
	// backend), or two with a direction.
	perBackend
	// The families that are one of a kind, written by name.
	backendUp    // per configured backend name and address: service, backend
	serviceState // per service and state: service, vip, state
	oneSample    // one sample, no labels
)

// statusMetric is one family of the status metrics. statusMetrics is the
// one table that both the collector (collectors.go, for the registry and
// its protobuf scrapes) and the text writer (statustext.go, for the text
// scrapes) come from: the names, the help, the types, the labels and, for
// the per-service and per-backend families, which objects have samples
// and their values.
type statusMetric struct {
	name  string
	help  string
	typ   prometheus.ValueType
	scope statusScope
	// For perService families: which services have samples, and the
	// value (value), or the values in and out (in, out: a direction
	// label).
	service               func(*status.Service) bool
	serviceValue          func(*status.Service) float64
	serviceIn, serviceOut func(*status.Service) uint64
	// For perBackend families: likewise for backends.
	backend               func(*status.Backend) bool
	backendValue          func(*status.Backend) float64
	backendIn, backendOut func(*status.Backend) uint64
}

// labels returns the family's label names, in the collector's order.
func (m *statusMetric) labels() []string {
	switch m.scope {
	case perService:
		if m.serviceIn != nil {
			return []string{"service", "vip", "direction"}
		}
		return []string{"service", "vip"}
	case perBackend:
		if m.backendIn != nil {
			return []string{"service", "vip", "backend", "direction"}
		}
		return []string{"service", "vip", "backend"}
	case backendUp:
		return []string{"service", "backend"}
	case serviceState:
		return []string{"service", "vip", "state"}
	}
	return nil
}

// typeName is the family's type as the text format writes it.
func (m *statusMetric) typeName() string {
	if m.typ == prometheus.CounterValue {
		return "counter"
	}
	return "gauge"
}

// The filters of the per-object families.
var (
	inKernel   = func(b *status.Backend) bool { return b.InKernel }
	configured = func(b *status.Backend) bool { return b.Configured }
	present    = func(s *status.Service) bool { return s.State != status.Missing }
)

// statusErrors is the name of the status metrics' error counter, which
// the collector keeps (a prometheus.Counter) rather than a snapshot.
const statusErrors = "vipd_status_errors_total"

// statusMetrics are the status metrics, sorted by name.
var statusMetrics = []statusMetric{
	{name: "vipd_backend_active_connections", help: "Active (established) connections to a backend.",
		typ: prometheus.GaugeValue, scope: perBackend, backend: inKernel,
		backendValue: func(b *status.Backend) float64 { return float64(b.ActiveConns) }},
	{name: "vipd_backend_bytes_total", help: "Bytes of a backend, by direction: in from clients, out to them.",
		typ: prometheus.CounterValue, scope: perBackend, backend: inKernel,
		backendIn: func(b *status.Backend) uint64 { return b.Stats.InBytes }, backendOut: func(b *status.Backend) uint64 { return b.Stats.OutBytes }},
	{name: "vipd_backend_configured_weight", help: "A backend's configured weight; absent when only the kernel has it (draining after removal, say).",
		typ: prometheus.GaugeValue, scope: perBackend, backend: configured,
		backendValue: func(b *status.Backend) float64 { return float64(b.ConfiguredWeight) }},
	{name: "vipd_backend_connections_total", help: "Connections the kernel scheduled to a backend.",
		typ: prometheus.CounterValue, scope: perBackend, backend: inKernel,
		backendValue: func(b *status.Backend) float64 { return float64(b.Stats.Conns) }},
	{name: "vipd_backend_inactive_connections", help: "Inactive connections to a backend: closing, or UDP flows.",
		typ: prometheus.GaugeValue, scope: perBackend, backend: inKernel,
		backendValue: func(b *status.Backend) float64 { return float64(b.InactiveConns) }},
	{name: "vipd_backend_packets_total", help: "Packets of a backend, by direction: in from clients, out to them.",
		typ: prometheus.CounterValue, scope: perBackend, backend: inKernel,
		backendIn: func(b *status.Backend) uint64 { return b.Stats.InPackets }, backendOut: func(b *status.Backend) uint64 { return b.Stats.OutPackets }},
	{name: "vipd_backend_up", help: "1 when a configured backend passes its health checks or has none, 0 when it fails them.",
		typ: prometheus.GaugeValue, scope: backendUp},
	{name: "vipd_backend_weight", help: "A backend's weight in the kernel; absent when the kernel lacks it.",
		typ: prometheus.GaugeValue, scope: perBackend, backend: inKernel,
		backendValue: func(b *status.Backend) float64 { return float64(b.Weight) }},
	{name: "vipd_foreign_services", help: "IPVS services vipd does not own.",
		typ: prometheus.GaugeValue, scope: oneSample},
	{name: "vipd_service_bytes_total", help: "Bytes of a service, by direction: in from clients, out to them.",
		typ: prometheus.CounterValue, scope: perService, service: present,
		serviceIn: func(s *status.Service) uint64 { return s.Stats.InBytes }, serviceOut: func(s *status.Service) uint64 { return s.Stats.OutBytes }},
	{name: "vipd_service_connections_total", help: "Connections the kernel scheduled for a service.",
		typ: prometheus.CounterValue, scope: perService, service: present,
		serviceValue: func(s *status.Service) float64 { return float64(s.Stats.Conns) }},
	{name: "vipd_service_packets_total", help: "Packets of a service, by direction: in from clients, out to them.",
		typ: prometheus.CounterValue, scope: perService, service: present,
		serviceIn: func(s *status.Service) uint64 { return s.Stats.InPackets }, serviceOut: func(s *status.Service) uint64 { return s.Stats.OutPackets }},
	{name: "vipd_service_state", help: "State of a service: 1 for its current state (ok, degraded, down, missing in the kernel), 0 for the others.",
		typ: prometheus.GaugeValue, scope: serviceState},
	{name: statusErrors, help: "Scrapes that could not read the status of vipd's services, and so lack their metrics.",
		typ: prometheus.CounterValue, scope: oneSample},
	{name: "vipd_status_timestamp_seconds", help: "When the status behind the service and backend metrics was taken, as a Unix time; vipd takes it again at most once per stats_interval.",
		typ: prometheus.GaugeValue, scope: oneSample},
}

// statusHelp is the help of each status metric, by name.
var statusHelp = func() map[string]string {
	out := make(map[string]string, len(statusMetrics))
	for _, m := range statusMetrics {
		out[m.name] = m.help
	}
	return out
}()
