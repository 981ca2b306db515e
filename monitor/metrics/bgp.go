package metrics

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// bgpMetrics are the metrics of a node with a [bgp] section, registered
// when one of the BGP methods is first called.
type bgpMetrics struct {
	peerUp        *prometheus.GaugeVec
	routes        prometheus.Gauge
	announcements prometheus.Counter
	withdrawals   *prometheus.CounterVec
	drained       prometheus.Gauge
}

// The reasons a route is withdrawn, the reason label of
// vipd_bgp_withdrawals_total.
const (
	// WithdrawNoBackend: no service on the VIP has a backend that serves.
	WithdrawNoBackend = "no_backend"
	// WithdrawDrained: an operator drained the node (vipd drain --node).
	WithdrawDrained = "drained"
	// WithdrawRemoved: the VIP is no longer configured.
	WithdrawRemoved = "removed"
	// WithdrawStopping: vipd stops.
	WithdrawStopping = "stopping"
	// WithdrawInterfaceDown: an interface of [bgp] track_interfaces is
	// down or missing.
	WithdrawInterfaceDown = "interface_down"
)

func (m *Metrics) bgpm() *bgpMetrics {
	m.bgpOnce.Do(func() {
		b := &bgpMetrics{
			peerUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: "vipd_bgp_session_up",
				Help: "1 while the BGP session with a peer is established, 0 while it is not, by peer address.",
			}, []string{"peer"}),
			routes: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "vipd_bgp_routes_announced",
				Help: "VIPs this node announces over BGP: those with a service that has a backend serving, none while drained.",
			}),
			announcements: prometheus.NewCounter(prometheus.CounterOpts{
				Name: "vipd_bgp_announcements_total",
				Help: "Routes to VIPs announced over BGP, new ones and changes of attributes.",
			}),
			withdrawals: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "vipd_bgp_withdrawals_total",
				Help: "Routes to VIPs withdrawn over BGP, by reason: no_backend (no backend serves), drained (vipd drain --node), removed (the VIP left the configuration), stopping (vipd stops), interface_down (an interface of track_interfaces is down).",
			}, []string{"reason"}),
			drained: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "vipd_bgp_drained",
				Help: "1 while an operator has drained the node (vipd drain --node): it announces no VIP.",
			}),
		}
		for _, r := range []string{WithdrawNoBackend, WithdrawDrained, WithdrawRemoved, WithdrawStopping} {
			b.withdrawals.WithLabelValues(r)
		}
		m.register(b.peerUp, b.routes, b.announcements, b.withdrawals, b.drained)
		m.bgp = b
	})
	return m.bgp
}

// BGPPeer records whether the session with peer is established.
func (m *Metrics) BGPPeer(peer string, up bool) {
	v := 0.0
	if up {
		v = 1
	}
	m.bgpm().peerUp.WithLabelValues(peer).Set(v)
}

// BGPRoutes records the routes announced now, the announcements just
// made and the withdrawals just made, by reason.
func (m *Metrics) BGPRoutes(announced, announcements int, withdrawals map[string]int) {
	b := m.bgpm()
	b.routes.Set(float64(announced))
	b.announcements.Add(float64(announcements))
	for _, r := range slices.Sorted(maps.Keys(withdrawals)) {
		b.withdrawals.WithLabelValues(r).Add(float64(withdrawals[r]))
	}
}

// BGPDrained records whether the node is drained.
func (m *Metrics) BGPDrained(drained bool) {
	v := 0.0
	if drained {
		v = 1
	}
	m.bgpm().drained.Set(v)
}
