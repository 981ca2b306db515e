package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipd/vipd/monitor/status"
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

// bfdFamilies are the BFD metrics.
var bfdFamilies = []string{"vipd_bfd_session_up", "vipd_bfd_session_down_total", "vipd_bfd_packets_received_total",
	"vipd_bfd_packets_sent_total", "vipd_bfd_packets_dropped_total"}

// TestBFD: the BFD metrics have a series per BGP peer with a BFD session
// in the status, and only those: a peer without BFD has none, a node
// without BGP none at all, and the reasons of a drop are a fixed set
// (the peer label is a configured peer's address: nothing a packet says
// makes a series).
func TestBFD(t *testing.T) {
	snap := fakeStatus()
	m := New(Options{Status: fixed(snap), NoRuntime: true})
	want := `
# HELP vipd_bfd_packets_dropped_total BFD packets from a BGP peer's address that were dropped, by reason: ttl (a TTL or hop limit below 255: not from the link), malformed (a check of RFC 5880 failed), discriminator (for another session).
# TYPE vipd_bfd_packets_dropped_total counter
vipd_bfd_packets_dropped_total{peer="10.0.0.254",reason="discriminator"} 4
vipd_bfd_packets_dropped_total{peer="10.0.0.254",reason="malformed"} 1
vipd_bfd_packets_dropped_total{peer="10.0.0.254",reason="ttl"} 0
vipd_bfd_packets_dropped_total{peer="fd00::fe",reason="discriminator"} 0
vipd_bfd_packets_dropped_total{peer="fd00::fe",reason="malformed"} 0
vipd_bfd_packets_dropped_total{peer="fd00::fe",reason="ttl"} 2
# HELP vipd_bfd_packets_received_total BFD packets received from a BGP peer's address, those dropped included.
# TYPE vipd_bfd_packets_received_total counter
vipd_bfd_packets_received_total{peer="10.0.0.254"} 12345
vipd_bfd_packets_received_total{peer="fd00::fe"} 900
# HELP vipd_bfd_packets_sent_total BFD packets sent to a BGP peer.
# TYPE vipd_bfd_packets_sent_total counter
vipd_bfd_packets_sent_total{peer="10.0.0.254"} 12000
vipd_bfd_packets_sent_total{peer="fd00::fe"} 1000
# HELP vipd_bfd_session_down_total Times the BFD session with a BGP peer went from up to down.
# TYPE vipd_bfd_session_down_total counter
vipd_bfd_session_down_total{peer="10.0.0.254"} 1
vipd_bfd_session_down_total{peer="fd00::fe"} 3
# HELP vipd_bfd_session_up 1 while the BFD session with a BGP peer is up, 0 while it is not, by peer address; only peers with bfd = true.
# TYPE vipd_bfd_session_up gauge
vipd_bfd_session_up{peer="10.0.0.254"} 1
vipd_bfd_session_up{peer="fd00::fe"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), bfdFamilies...); err != nil {
		t.Error(err)
	}
	// The handler's own text has the same lines.
	body, _ := scrapeWith(t, m.Handler(), "", "")
	for line := range strings.Lines(strings.TrimPrefix(want, "\n")) {
		if !strings.Contains(body, "\n"+line) {
			t.Errorf("the handler's scrape lacks %q", line)
		}
	}
	problems, err := testutil.GatherAndLint(m.Registry(), bfdFamilies...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}

	// A session goes down: its series change, no series comes or goes.
	snap.BGP.Peers[1].BFD.State, snap.BGP.Peers[1].BFD.Downs = "down", 2
	if n, err := testutil.GatherAndCount(m.Registry(), bfdFamilies...); err != nil || n != 2*4+2*3 {
		t.Errorf("%d series, %v; want 14: 4 families of one per BFD peer, 3 reasons per peer", n, err)
	}
	if body, _ := scrapeWith(t, m.Handler(), "", ""); !strings.Contains(body, "\nvipd_bfd_session_up{peer=\"10.0.0.254\"} 0\n") ||
		!strings.Contains(body, "\nvipd_bfd_session_down_total{peer=\"10.0.0.254\"} 2\n") {
		t.Errorf("the session that went down is not down in the scrape:\n%s", body)
	}

	// Without BFD on any peer, or without BGP: no BFD series.
	for name, b := range map[string]*status.BGP{"no bfd": {Peers: []status.BGPPeer{{Address: "10.0.0.254", State: "established"}}}, "no bgp": nil} {
		snap.BGP = b
		if n, err := testutil.GatherAndCount(m.Registry(), bfdFamilies...); err != nil || n != 0 {
			t.Errorf("%s: %d series, %v; want none", name, n, err)
		}
		if body, _ := scrapeWith(t, m.Handler(), "", ""); strings.Contains(body, "vipd_bfd_") {
			t.Errorf("%s: the handler writes BFD metrics", name)
		}
	}
}
