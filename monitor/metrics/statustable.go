package metrics

import (
	"slices"
	"strings"

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
	// perBFD: a sample per BGP peer with a BFD session (label peer), or
	// one per reason a packet is dropped (peer, reason). Only configured
	// peers have a session: nothing a packet says makes a series.
	perBFD
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
	// For perBFD families: the value (bfdValue), or the values by
	// reason, in the order of bfdReasons (bfdByReason).
	bfdValue    func(*status.BFD) float64
	bfdByReason func(*status.BFD) [len(bfdReasons)]uint64
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
	case perBFD:
		if m.bfdByReason != nil {
			return []string{"peer", "reason"}
		}
		return []string{"peer"}
	}
	return nil
}

// bfdReasons are the reason label's values of
// vipd_bfd_packets_dropped_total, sorted.
var bfdReasons = [...]string{"discriminator", "malformed", "ttl"}

// bfdPeers returns the BGP peers of snap that have a BFD session, by
// address as a string (the order of the registry's samples).
func bfdPeers(snap *status.Snapshot) []*status.BGPPeer {
	if snap.BGP == nil {
		return nil
	}
	var out []*status.BGPPeer
	for i := range snap.BGP.Peers {
		if snap.BGP.Peers[i].BFD != nil {
			out = append(out, &snap.BGP.Peers[i])
		}
	}
	slices.SortFunc(out, func(x, y *status.BGPPeer) int { return strings.Compare(x.Address, y.Address) })
	return out
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
	{name: "vipd_bfd_packets_dropped_total", help: "BFD packets from a BGP peer's address that were dropped, by reason: ttl (a TTL or hop limit below 255: not from the link), malformed (a check of RFC 5880 failed), discriminator (for another session).",
		typ: prometheus.CounterValue, scope: perBFD,
		bfdByReason: func(b *status.BFD) [len(bfdReasons)]uint64 {
			return [...]uint64{b.Dropped.Discriminator, b.Dropped.Malformed, b.Dropped.TTL}
		}},
	{name: "vipd_bfd_packets_received_total", help: "BFD packets received from a BGP peer's address, those dropped included.",
		typ: prometheus.CounterValue, scope: perBFD, bfdValue: func(b *status.BFD) float64 { return float64(b.Received) }},
	{name: "vipd_bfd_packets_sent_total", help: "BFD packets sent to a BGP peer.",
		typ: prometheus.CounterValue, scope: perBFD, bfdValue: func(b *status.BFD) float64 { return float64(b.Sent) }},
	{name: "vipd_bfd_session_down_total", help: "Times the BFD session with a BGP peer went from up to down.",
		typ: prometheus.CounterValue, scope: perBFD, bfdValue: func(b *status.BFD) float64 { return float64(b.Downs) }},
	{name: "vipd_bfd_session_up", help: "1 while the BFD session with a BGP peer is up, 0 while it is not, by peer address; only peers with bfd = true.",
		typ: prometheus.GaugeValue, scope: perBFD, bfdValue: func(b *status.BFD) float64 { return b2f(b.State == "up") }},
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
