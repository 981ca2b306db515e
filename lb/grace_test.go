package lb_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// TestPlanGrace: a TCP or SCTP backend that leaves (removed from the
// configuration, removed by a health check, or with its removed service)
// is never deleted in the pass that takes it out of rotation, and is
// deleted later only once the kernel lists no connection to it, or once it
// has been at weight 0 for the grace with no established connection.
// UDP backends go at once.
func TestPlanGrace(t *testing.T) {
	const grace = 2 * time.Second
	vip := netip.MustParseAddr("192.0.2.10")
	kept := netip.MustParseAddrPort("10.0.0.1:80")
	gone := netip.MustParseAddrPort("10.0.0.2:80")
	type conns struct {
		weight        int
		active, inact uint32
	}
	tests := []struct {
		name    string
		proto   lb.Proto
		fwmark  uint32
		leaving conns
		age     time.Duration // how long the backend has been leaving
		opts    lb.PlanOptions
		want    string // the plan's backend operations, "" for none
	}{
		{"idle: out of rotation first", lb.TCP, 0, conns{1, 0, 0}, 0, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, "drain-backend"},
		{"handshakes in flight: out of rotation first", lb.TCP, 0, conns{1, 0, 3}, 0, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, "drain-backend"},
		{"established: out of rotation first", lb.TCP, 0, conns{1, 4, 0}, 0, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, "drain-backend"},
		{"without drain: out of rotation first", lb.TCP, 0, conns{1, 4, 0}, 0, lb.PlanOptions{}, "drain-backend"},
		{"sctp: out of rotation first", lb.SCTP, 0, conns{1, 0, 0}, 0, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, "drain-backend"},
		{"fwmark: out of rotation first", 0, 7, conns{1, 0, 0}, 0, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, "drain-backend"},
		{"at weight 0, no connection at all: goes", lb.TCP, 0, conns{0, 0, 0}, 0, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, "delete-backend"},
		{"at weight 0, a handshake in flight: waits", lb.TCP, 0, conns{0, 0, 1}, 0, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, ""},
		{"at weight 0, not established, within the grace: waits", lb.TCP, 0, conns{0, 0, 1}, grace - time.Millisecond, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, ""},
		{"at weight 0, not established, grace over: goes", lb.TCP, 0, conns{0, 0, 1}, grace, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, "delete-backend"},
		{"established, grace over: waits for them", lb.TCP, 0, conns{0, 2, 1}, time.Hour, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, ""},
		{"established, drain timeout over: goes", lb.TCP, 0, conns{0, 2, 1}, time.Minute, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true, DrainTimeout: time.Minute}}, "delete-backend"},
		{"without drain, established, within the grace: waits", lb.TCP, 0, conns{0, 2, 0}, time.Second, lb.PlanOptions{}, ""},
		{"without drain, established, grace over: goes", lb.TCP, 0, conns{0, 2, 0}, grace, lb.PlanOptions{}, "delete-backend"},
		{"sctp at weight 0, grace over: goes", lb.SCTP, 0, conns{0, 0, 5}, grace, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, "delete-backend"},
		{"udp: goes at once", lb.UDP, 0, conns{1, 0, 9}, 0, lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true}}, "delete-backend"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := lb.ServiceKey{Family: lb.IPv4, Proto: tt.proto, Addr: vip, Port: 80, FWMark: tt.fwmark}
			if tt.fwmark != 0 {
				key.Addr, key.Port = netip.Addr{}, 0
			}
			svc := lb.Service{Key: key, Scheduler: "rr"}
			k := lb.Destination{Addr: kept, Weight: 1, Forward: lb.Masq}
			g := lb.Destination{Addr: gone, Weight: tt.leaving.weight, Forward: lb.Masq, ActiveConns: tt.leaving.active, InactiveConns: tt.leaving.inact}
			desired, observed := lb.NewState(), lb.NewState()
			desired.Services[key] = &lb.ServiceState{Service: svc, Dests: map[netip.AddrPort]lb.Destination{kept: k}}
			observed.Services[key] = &lb.ServiceState{Service: svc, Dests: map[netip.AddrPort]lb.Destination{kept: k, gone: g}}
			opts := tt.opts
			opts.Removal.Grace = grace
			var asked []string
			opts.Leaving = func(s lb.ServiceKey, a netip.AddrPort) time.Duration {
				asked = append(asked, fmt.Sprintf("%s %s", s, a))
				return tt.age
			}
			if got := kinds(lb.Plan(desired, observed, opts)); got != tt.want {
				t.Errorf("plan %q; want %q", got, tt.want)
			}
			for _, a := range asked {
				if a != fmt.Sprintf("%s %s", key, gone) {
					t.Errorf("asked how long %s has been leaving", a)
				}
			}
		})
	}
}

// TestPlanGraceServices: with drain_services a removed TCP service leaves
// like its backends: out of rotation (its VIP kept) in one pass, deleted in
// a later one once its backends may go. UDP services, and any service
// without drain_services, are deleted at once.
func TestPlanGraceServices(t *testing.T) {
	const grace = 2 * time.Second
	vip := netip.MustParseAddr("192.0.2.10")
	a := netip.MustParseAddrPort("10.0.0.1:80")
	b := netip.MustParseAddrPort("10.0.0.2:80")
	tests := []struct {
		name          string
		proto         lb.Proto
		drainServices bool
		weights       [2]int
		inact         [2]uint32
		ages          [2]time.Duration
		want          string
	}{
		{"in rotation: out of rotation first", lb.TCP, true, [2]int{1, 1}, [2]uint32{0, 0}, [2]time.Duration{}, "drain-backend drain-backend"},
		{"one still in rotation", lb.TCP, true, [2]int{0, 1}, [2]uint32{0, 0}, [2]time.Duration{time.Hour, 0}, "drain-backend"},
		{"no connection at all: goes", lb.TCP, true, [2]int{0, 0}, [2]uint32{0, 0}, [2]time.Duration{}, "delete-service unbind-vip"},
		{"a handshake in flight, within the grace: waits", lb.TCP, true, [2]int{0, 0}, [2]uint32{0, 1}, [2]time.Duration{time.Hour, grace - 1}, ""},
		{"grace over for the youngest: goes", lb.TCP, true, [2]int{0, 0}, [2]uint32{1, 1}, [2]time.Duration{time.Hour, grace}, "delete-service unbind-vip"},
		{"udp: goes at once", lb.UDP, true, [2]int{1, 1}, [2]uint32{3, 3}, [2]time.Duration{}, "delete-service unbind-vip"},
		{"without drain_services: goes at once", lb.TCP, false, [2]int{1, 1}, [2]uint32{3, 3}, [2]time.Duration{}, "delete-service unbind-vip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := lb.ServiceKey{Family: lb.IPv4, Proto: tt.proto, Addr: vip, Port: 80}
			observed := lb.NewState()
			observed.VIPs[vip] = struct{}{}
			observed.Services[key] = &lb.ServiceState{Service: lb.Service{Key: key, Scheduler: "rr"}, Dests: map[netip.AddrPort]lb.Destination{
				a: {Addr: a, Weight: tt.weights[0], Forward: lb.Masq, InactiveConns: tt.inact[0]},
				b: {Addr: b, Weight: tt.weights[1], Forward: lb.Masq, InactiveConns: tt.inact[1]},
			}}
			opts := lb.PlanOptions{Removal: lb.RemovalPolicy{Drain: true, Grace: grace, DrainServices: tt.drainServices}}
			opts.Leaving = func(_ lb.ServiceKey, addr netip.AddrPort) time.Duration {
				if addr == a {
					return tt.ages[0]
				}
				return tt.ages[1]
			}
			if got := kinds(lb.Plan(lb.NewState(), observed, opts)); got != tt.want {
				t.Errorf("plan %q; want %q", got, tt.want)
			}
		})
	}
}

// kinds names the kinds of ops, in order, separated by spaces.
func kinds(ops []lb.Op) string {
	var names []string
	for _, op := range ops {
		names = append(names, op.Kind.String())
	}
	return strings.Join(names, " ")
}

// TestReconcilerForgetsLeaving: a leaving backend's clock stops when it is
// no longer leaving: deleted by hand, or wanted again as it is, so that
// the daemon's once-a-second drain passes stop.
func TestReconcilerForgetsLeaving(t *testing.T) {
	k := lbtest.New()
	r := lb.NewReconciler(lb.Options{Kernel: k.Interface(), Dummy: "vipd0", Removal: lb.RemovalPolicy{Drain: true, Grace: time.Second}})
	pass := func(src string) {
		t.Helper()
		if res, err := r.Reconcile(context.Background(), &mustParse(t, src).Spec); err != nil || len(res.Failed) > 0 {
			t.Fatalf("pass: %v %v", err, res.Failed)
		}
	}
	removed := strings.Replace(base, `, { address = "10.0.0.2" }]`, `]`, 1)
	pass(base)
	setPort80Conns(k, "10.0.0.2:80", 4, 0)
	pass(removed)
	if n := r.Draining(); n != 1 {
		t.Fatalf("%d backends leaving, want 1", n)
	}
	k.Edit(func(s *lb.State) {
		for key, svc := range s.Services {
			if key.Port == 80 {
				delete(svc.Dests, netip.MustParseAddrPort("10.0.0.2:80"))
			}
		}
	})
	pass(removed)
	if n := r.Draining(); n != 0 {
		t.Errorf("%d backends leaving after it was deleted by hand, want 0", n)
	}

	// Wanted again at weight 0, as the kernel has it: no operation, and
	// it is not leaving.
	weight0 := strings.Replace(base, `{ address = "10.0.0.2" }]`, `{ address = "10.0.0.2", weight = 0 }]`, 1)
	pass(weight0)
	setPort80Conns(k, "10.0.0.2:80", 4, 0)
	pass(removed)
	if n := r.Draining(); n != 1 {
		t.Fatalf("%d backends leaving, want 1", n)
	}
	pass(weight0)
	if n := r.Draining(); n != 0 {
		t.Errorf("%d backends leaving after it was wanted again, want 0", n)
	}
}
