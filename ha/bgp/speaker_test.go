package bgp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"

	"github.com/vipd/vipd/ha/bfd"
	"github.com/vipd/vipd/ha/bgpproc"
)

// TestPolicies: a speaker rejects, on import and on export, every route
// but the host routes it originates, whatever its peers: GoBGP's global
// policy assignments say so. (TestBirdTwoRouters proves it on the wire.)
func TestPolicies(t *testing.T) {
	sp, err := Start(context.Background(), Options{Options: bgpproc.Options{ASN: 65001, RouterID: netip.MustParseAddr("192.0.2.1")}})
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Stop(context.Background())
	for _, dir := range []api.PolicyDirection{api.PolicyDirection_IMPORT, api.PolicyDirection_EXPORT} {
		var got []*api.PolicyAssignment
		if err := sp.s.ListPolicyAssignment(context.Background(), &api.ListPolicyAssignmentRequest{Name: "global", Direction: dir},
			func(a *api.PolicyAssignment) { got = append(got, a) }); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].DefaultAction != api.RouteAction_REJECT || len(got[0].Policies) != 1 || got[0].Policies[0].Name != ownPolicy {
			t.Fatalf("%v assignment: %v", dir, got)
		}
		if n := len(got[0].Policies[0].Statements); n != 2 {
			t.Errorf("%v: %d statements, want 2 (IPv4 and IPv6 host routes)", dir, n)
		}
		for _, st := range got[0].Policies[0].Statements {
			if st.Conditions.GetRouteType() != api.Conditions_ROUTE_TYPE_LOCAL || st.Actions.GetRouteAction() != api.RouteAction_ACCEPT {
				t.Errorf("%v: statement %v accepts more than vipd's own routes", dir, st)
			}
		}
	}
}

// TestAPIPeerLimit: every peer has a prefix limit, the configured one or
// the default, never GoBGP's 0 (no limit).
func TestAPIPeerLimit(t *testing.T) {
	for _, tt := range []struct {
		peer PeerOptions
		want uint32
	}{
		{PeerOptions{Address: netip.MustParseAddr("192.0.2.254"), ASN: 65000}, DefaultMaxPrefixes},
		{PeerOptions{Address: netip.MustParseAddr("2001:db8::fe"), ASN: 65000, MaxPrefixes: 5}, 5},
	} {
		p := apiPeer(tt.peer, time.Second)
		if len(p.AfiSafis) != 1 {
			t.Fatalf("%s: afi-safis %v", tt.peer.Address, p.AfiSafis)
		}
		l := p.AfiSafis[0].PrefixLimits
		if l.GetMaxPrefixes() != tt.want || l.GetShutdownThresholdPct() != limitWarnPct || l.GetFamily().GetAfi() != p.AfiSafis[0].Config.Family.Afi {
			t.Errorf("%s: prefix limit %v, want %d", tt.peer.Address, l, tt.want)
		}
	}
}

// TestResetOnBFD: a failed BFD session resets an established BGP
// session; not one that is not established, and not for the peer's
// AdminDown.
func TestResetOnBFD(t *testing.T) {
	est := Peer{State: "established"}
	failed := bfd.Change{From: bfd.Up, To: bfd.Down, Diag: bfd.DiagTimeExpired, Remote: bfd.Up}
	for _, tt := range []struct {
		name string
		p    Peer
		ch   bfd.Change
		want bool
	}{
		{"silence", est, failed, true},
		{"peer saw it down", est, bfd.Change{From: bfd.Up, To: bfd.Down, Diag: bfd.DiagNeighborDown, Remote: bfd.Down}, true},
		{"peer's admin down", est, bfd.Change{From: bfd.Up, To: bfd.Down, Diag: bfd.DiagNeighborDown, Remote: bfd.AdminDown}, false},
		{"BGP not established", Peer{State: "active"}, failed, false},
		{"BGP opensent", Peer{State: "opensent"}, failed, false},
		{"init to down", est, bfd.Change{From: bfd.Init, To: bfd.Down, Diag: bfd.DiagTimeExpired}, false},
		{"up", est, bfd.Change{From: bfd.Init, To: bfd.Up}, false},
	} {
		if got := resetOnBFD(tt.p, tt.ch); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
