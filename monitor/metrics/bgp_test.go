package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBGP: the BGP metrics appear with the first report, and count
// announcements and withdrawals by reason.
func TestBGP(t *testing.T) {
	m := newTest()
	if n, err := testutil.GatherAndCount(m.Registry(), "vipd_bgp_session_up", "vipd_bgp_routes_announced"); err != nil || n != 0 {
		t.Fatalf("bgp metrics before any report: %d series, %v; want none", n, err)
	}
	m.BGPPeer("10.0.0.254", false)
	m.BGPPeer("10.0.0.254", true)
	m.BGPPeer("fd00::fe", false)
	m.BGPRoutes(3, 3, nil)
	m.BGPRoutes(2, 1, map[string]int{WithdrawNoBackend: 2})
	m.BGPRoutes(0, 0, map[string]int{WithdrawDrained: 2})
	m.BGPDrained(true)
	want := `
# HELP vipd_bgp_announcements_total Routes to VIPs announced over BGP, new ones and changes of attributes.
# TYPE vipd_bgp_announcements_total counter
vipd_bgp_announcements_total 4
# HELP vipd_bgp_drained 1 while an operator has drained the node (vipd drain --node): it announces no VIP.
# TYPE vipd_bgp_drained gauge
vipd_bgp_drained 1
# HELP vipd_bgp_routes_announced VIPs this node announces over BGP: those with a service that has a backend serving, none while drained.
# TYPE vipd_bgp_routes_announced gauge
vipd_bgp_routes_announced 0
# HELP vipd_bgp_session_up 1 while the BGP session with a peer is established, 0 while it is not, by peer address.
# TYPE vipd_bgp_session_up gauge
vipd_bgp_session_up{peer="10.0.0.254"} 1
vipd_bgp_session_up{peer="fd00::fe"} 0
# HELP vipd_bgp_withdrawals_total Routes to VIPs withdrawn over BGP, by reason: no_backend (no backend serves), drained (vipd drain --node), removed (the VIP left the configuration), stopping (vipd stops), interface_down (an interface of track_interfaces is down).
# TYPE vipd_bgp_withdrawals_total counter
vipd_bgp_withdrawals_total{reason="drained"} 2
vipd_bgp_withdrawals_total{reason="no_backend"} 2
vipd_bgp_withdrawals_total{reason="removed"} 0
vipd_bgp_withdrawals_total{reason="stopping"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "vipd_bgp_session_up", "vipd_bgp_routes_announced",
		"vipd_bgp_announcements_total", "vipd_bgp_withdrawals_total", "vipd_bgp_drained"); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(m.Registry(), "vipd_bgp_session_up", "vipd_bgp_routes_announced",
		"vipd_bgp_announcements_total", "vipd_bgp_withdrawals_total", "vipd_bgp_drained")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}
