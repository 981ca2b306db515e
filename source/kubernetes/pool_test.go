package kubernetes

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func newAlloc(t *testing.T, pools ...Pool) *Allocator {
	t.Helper()
	a, err := NewAllocator(pools)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

var v4 = []lb.Family{lb.IPv4}

func tcp(ports ...uint16) []PortKey {
	var out []PortKey
	for _, p := range ports {
		out = append(out, PortKey{lb.TCP, p})
	}
	return out
}

// assign calls Assign and formats its answer: "ADDR[,ADDR]" or
// "REASON: message".
func assign(a *Allocator, svc string, w Want) string {
	addrs, err := a.Assign(svc, w)
	if err != nil {
		var ae *AllocError
		if !errors.As(err, &ae) {
			return "untyped: " + err.Error()
		}
		return ae.Reason + ": " + ae.Msg
	}
	return joinAddrs(addrs)
}

func no() *bool { f := false; return &f }

func TestNewAllocatorErrors(t *testing.T) {
	for _, tc := range []struct {
		pools []Pool
		want  string
	}{
		{[]Pool{{Addresses: []string{"192.0.2.0/30"}}}, "pool without a name"},
		{[]Pool{{Name: "a"}}, `pool "a" has no addresses`},
		{[]Pool{{Name: "a", Addresses: []string{"192.0.2.1/30"}}}, `pool "a": CIDR "192.0.2.1/30" has host bits set (did you mean 192.0.2.0/30?)`},
		{[]Pool{{Name: "a", Addresses: []string{"192.0.2.9-192.0.2.1"}}}, `pool "a": range "192.0.2.9-192.0.2.1" ends before it starts`},
		{[]Pool{{Name: "a", Addresses: []string{"192.0.2.1-2001:db8::1"}}}, `pool "a": range "192.0.2.1-2001:db8::1" mixes IPv4 and IPv6`},
		{[]Pool{{Name: "a", Addresses: []string{"192.0.2.1-x"}}}, `pool "a": range "192.0.2.1-x" is not ADDRESS-ADDRESS`},
		{[]Pool{{Name: "a", Addresses: []string{"vip"}}}, `pool "a": "vip" is not a CIDR, a range or an address`},
		{[]Pool{{Name: "a", Addresses: []string{"127.0.0.0/8"}}}, `pool "a": "127.0.0.0/8" holds 127.0.0.0, which is not a unicast address vipd can bind`},
		{[]Pool{{Name: "a", Addresses: []string{"192.0.2.0/28", "192.0.2.8-192.0.2.20"}}}, `pool "a": 192.0.2.0-192.0.2.15 overlaps 192.0.2.8-192.0.2.20`},
		{[]Pool{{Name: "a", Addresses: []string{"192.0.2.0/28"}}, {Name: "b", Addresses: []string{"192.0.2.15"}}}, `pool "b": 192.0.2.15 overlaps pool "a"'s 192.0.2.0-192.0.2.15`},
		{[]Pool{{Name: "a", Addresses: []string{"192.0.2.0/28"}}, {Name: "a", Addresses: []string{"198.51.100.1"}}}, `pool "a" is defined twice`},
	} {
		_, err := NewAllocator(tc.pools)
		if err == nil || err.Error() != tc.want {
			t.Errorf("NewAllocator(%v) = %v, want %q", tc.pools, err, tc.want)
		}
	}
}

func TestAllocateAndExhaust(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"192.0.2.0/30"}})
	w := Want{Families: v4, Ports: tcp(80)}
	var got []string
	for i := range 5 {
		got = append(got, assign(a, fmt.Sprintf("ns/s%d", i), w))
	}
	want := []string{"192.0.2.0", "192.0.2.1", "192.0.2.2", "192.0.2.3",
		`PoolExhausted: no pool with auto_assign has a free ipv4 address`}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	// Assign again keeps what a Service holds.
	if got := assign(a, "ns/s2", w); got != "192.0.2.2" {
		t.Fatalf("s2 again: %s", got)
	}
	// A released address goes back to the pool.
	a.Release("ns/s1")
	if got := assign(a, "ns/s4", w); got != "192.0.2.1" {
		t.Fatalf("after release: %s", got)
	}
	if got := a.Users(netip.MustParseAddr("192.0.2.1")); !slices.Equal(got, []string{"ns/s4"}) {
		t.Fatalf("users of 192.0.2.1: %v", got)
	}
}

func TestReleasedAddressComesLast(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"192.0.2.10-192.0.2.13"}})
	w := Want{Families: v4}
	assign(a, "a", w)
	assign(a, "b", w)
	a.Release("a")
	// 192.0.2.10 was just released: the next Service gets a fresh one.
	if got := assign(a, "c", w); got != "192.0.2.12" {
		t.Fatalf("c: %s", got)
	}
	if got := assign(a, "d", w); got != "192.0.2.13" {
		t.Fatalf("d: %s", got)
	}
	if got := assign(a, "e", w); got != "192.0.2.10" {
		t.Fatalf("e: %s", got)
	}
}

func TestAvoidNetworkBroadcast(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "v4", Addresses: []string{"192.0.2.0/30", "198.51.100.0/31", "203.0.113.7-203.0.113.8"}, AvoidNetworkBroadcast: true},
		Pool{Name: "v6", Addresses: []string{"2001:db8::/127", "2001:db8:1::/126"}, AvoidNetworkBroadcast: true})
	var got []string
	for i := range 7 {
		got = append(got, assign(a, fmt.Sprint(i), Want{Pool: "v4", Families: v4}))
	}
	want := []string{"192.0.2.1", "192.0.2.2", "198.51.100.0", "198.51.100.1", "203.0.113.7", "203.0.113.8",
		`PoolExhausted: pool "v4" has no free ipv4 address`}
	if !slices.Equal(got, want) {
		t.Fatalf("v4: got %q\nwant %q", got, want)
	}
	got = nil
	for i := range 6 {
		got = append(got, assign(a, fmt.Sprint("6-", i), Want{Pool: "v6", Families: []lb.Family{lb.IPv6}}))
	}
	want = []string{"2001:db8::", "2001:db8::1", "2001:db8:1::1", "2001:db8:1::2", "2001:db8:1::3",
		`PoolExhausted: pool "v6" has no free ipv6 address`}
	if !slices.Equal(got, want) {
		t.Fatalf("v6: got %q\nwant %q", got, want)
	}
	// A specific request may still name an avoided address.
	a.Release("0")
	if got := assign(a, "x", Want{Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.0")}, Families: v4}); got != "192.0.2.0" {
		t.Fatalf("specific network address: %s", got)
	}
}

func TestAutoAssignAndPools(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "manual", Addresses: []string{"192.0.2.1"}, AutoAssign: no()},
		Pool{Name: "auto", Addresses: []string{"198.51.100.1"}},
		Pool{Name: "dual", Addresses: []string{"203.0.113.1", "2001:db8::10-2001:db8::11"}, AutoAssign: no()})
	if got := assign(a, "a", Want{Families: v4}); got != "198.51.100.1" {
		t.Fatalf("auto: %s", got)
	}
	if got := assign(a, "b", Want{Families: v4}); got != "PoolExhausted: no pool with auto_assign has a free ipv4 address" {
		t.Fatalf("auto exhausted: %s", got)
	}
	if got := assign(a, "b", Want{Pool: "manual", Families: v4}); got != "192.0.2.1" {
		t.Fatalf("by pool: %s", got)
	}
	if got := assign(a, "c", Want{Pool: "nope", Families: v4}); got != `BadAnnotation: vipd.io/pool: no pool is named "nope"` {
		t.Fatalf("unknown pool: %s", got)
	}
	if got := assign(a, "c", Want{Families: []lb.Family{lb.IPv6}}); got != "PoolExhausted: no pool with auto_assign has a free ipv6 address" {
		t.Fatalf("no v6 auto pool: %s", got)
	}
	if got := assign(a, "d", Want{Pool: "dual", Families: []lb.Family{lb.IPv6, lb.IPv4}}); got != "2001:db8::10,203.0.113.1" {
		t.Fatalf("dual stack: %s", got)
	}
	// Moving a Service to another pool moves its address.
	if got := assign(a, "d", Want{Pool: "auto", Families: v4}); got != "PoolExhausted: pool \"auto\" has no free ipv4 address" {
		t.Fatalf("move to a full pool: %s", got)
	}
	if got := a.Held("d"); joinAddrs(got) != "2001:db8::10,203.0.113.1" {
		t.Fatalf("a failed Assign changed what d holds: %v", got)
	}
	a.Release("a")
	if got := assign(a, "d", Want{Pool: "auto", Families: v4}); got != "198.51.100.1" {
		t.Fatalf("move: %s", got)
	}
	if got := assign(a, "e", Want{Pool: "dual", Families: v4}); got != "203.0.113.1" {
		t.Fatalf("after move, the old address is free: %s", got)
	}
}

func TestSpecificAddresses(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "p", Addresses: []string{"192.0.2.0/29", "2001:db8::/125"}, AutoAssign: no()},
		Pool{Name: "q", Addresses: []string{"198.51.100.0/29"}})
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		svc  string
		w    Want
		want string
	}{
		{"a", Want{Addrs: []netip.Addr{ip("192.0.2.5")}, Families: v4}, "192.0.2.5"},
		{"b", Want{Addrs: []netip.Addr{ip("192.0.2.5")}, Families: v4}, "AddressTaken: 192.0.2.5 is used by Service a (sharing needs the same vipd.io/sharing-key on both)"},
		{"b", Want{Addrs: []netip.Addr{ip("10.1.1.1")}, Families: v4}, "AddressNotInPool: 10.1.1.1 is not in any pool"},
		{"b", Want{Pool: "q", Addrs: []netip.Addr{ip("192.0.2.6")}, Families: v4}, `AddressNotInPool: 192.0.2.6 is not in pool "q"`},
		{"b", Want{Addrs: []netip.Addr{ip("192.0.2.6"), ip("2001:db8::3")}, Families: []lb.Family{lb.IPv6, lb.IPv4}}, "2001:db8::3,192.0.2.6"},
		// A Service that changes its request gets the new address.
		{"a", Want{Addrs: []netip.Addr{ip("192.0.2.7")}, Families: v4}, "192.0.2.7"},
		{"c", Want{Addrs: []netip.Addr{ip("192.0.2.5")}, Families: v4}, "192.0.2.5"},
	} {
		if got := assign(a, tc.svc, tc.w); got != tc.want {
			t.Errorf("%s %+v: got %q, want %q", tc.svc, tc.w, got, tc.want)
		}
	}
}

func TestSharing(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"192.0.2.1-192.0.2.3"}})
	web := Want{Families: v4, SharingKey: "k", Ports: tcp(80, 443)}
	dns := Want{Families: v4, SharingKey: "k", Ports: []PortKey{{lb.UDP, 53}, {lb.TCP, 53}}}
	if got := assign(a, "web", web); got != "192.0.2.1" {
		t.Fatalf("web: %s", got)
	}
	if got := assign(a, "dns", dns); got != "192.0.2.1" {
		t.Fatalf("dns joins web: %s", got)
	}
	// Same key but an overlapping port: a new address.
	if got := assign(a, "web2", Want{Families: v4, SharingKey: "k", Ports: tcp(443)}); got != "192.0.2.2" {
		t.Fatalf("web2: %s", got)
	}
	// Another key, or none: never the shared address.
	if got := assign(a, "other", Want{Families: v4, SharingKey: "other", Ports: tcp(8080)}); got != "192.0.2.3" {
		t.Fatalf("other key: %s", got)
	}
	ip := netip.MustParseAddr("192.0.2.1")
	if got := assign(a, "x", Want{Addrs: []netip.Addr{ip}, Families: v4, Ports: tcp(8080)}); got != "AddressTaken: 192.0.2.1 is used by Service dns (sharing needs the same vipd.io/sharing-key on both)" {
		t.Fatalf("no key: %s", got)
	}
	if got := assign(a, "x", Want{Addrs: []netip.Addr{ip}, Families: v4, SharingKey: "k", Ports: tcp(443)}); got != "AddressTaken: 192.0.2.1 is shared with Service web, which also uses tcp/443" {
		t.Fatalf("overlap: %s", got)
	}
	if got := assign(a, "x", Want{Addrs: []netip.Addr{ip}, Families: v4, SharingKey: "k", Ports: tcp(8443)}); got != "192.0.2.1" {
		t.Fatalf("specific and shared: %s", got)
	}
	if got := a.Users(ip); !slices.Equal(got, []string{"dns", "web", "x"}) {
		t.Fatalf("users: %v", got)
	}
	// The address goes back to the pool when its last user lets go.
	a.Release("web")
	a.Release("dns")
	if got := assign(a, "y", Want{Families: v4}); got != "PoolExhausted: no pool with auto_assign has a free ipv4 address" {
		t.Fatalf("still held by x: %s", got)
	}
	a.Release("x")
	if got := assign(a, "y", Want{Families: v4}); got != "192.0.2.1" {
		t.Fatalf("released: %s", got)
	}
}

func TestRestore(t *testing.T) {
	pools := []Pool{{Name: "p", Addresses: []string{"192.0.2.1-192.0.2.4", "2001:db8::1-2001:db8::2"}}, {Name: "m", Addresses: []string{"198.51.100.1"}, AutoAssign: no()}}
	a := newAlloc(t, pools...)
	ip := netip.MustParseAddr
	w := Want{Families: v4}
	// Statuses as a previous run left them: b holds .3, c holds .1, d
	// claims .3 too (a hand-edited status), e's address is outside the
	// pools now, f holds a manual pool's address without asking for it.
	kept := map[string][]netip.Addr{
		"b": a.Restore("b", w, []netip.Addr{ip("192.0.2.3")}),
		"c": a.Restore("c", w, []netip.Addr{ip("192.0.2.1")}),
		"d": a.Restore("d", w, []netip.Addr{ip("192.0.2.3")}),
		"e": a.Restore("e", w, []netip.Addr{ip("10.0.0.1")}),
		"f": a.Restore("f", w, []netip.Addr{ip("198.51.100.1")}),
		"g": a.Restore("g", Want{Families: []lb.Family{lb.IPv4, lb.IPv6}}, []netip.Addr{ip("2001:db8::2")}),
	}
	var got []string
	for _, svc := range []string{"b", "c", "d", "e", "f", "g"} {
		got = append(got, fmt.Sprintf("%s kept %s", svc, joinAddrs(kept[svc])))
	}
	want := []string{"b kept 192.0.2.3", "c kept 192.0.2.1", "d kept ", "e kept ", "f kept ", "g kept 2001:db8::2"}
	if !slices.Equal(got, want) {
		t.Fatalf("restore: got %q\nwant %q", got, want)
	}
	got = nil
	for _, svc := range []string{"a", "b", "c", "d", "e"} {
		got = append(got, svc+" "+assign(a, svc, w))
	}
	got = append(got, "g "+assign(a, "g", Want{Families: []lb.Family{lb.IPv4, lb.IPv6}}))
	want = []string{"a 192.0.2.2", "b 192.0.2.3", "c 192.0.2.1", "d 192.0.2.4",
		"e PoolExhausted: no pool with auto_assign has a free ipv4 address",
		"g PoolExhausted: no pool with auto_assign has a free ipv4 address"}
	if !slices.Equal(got, want) {
		t.Fatalf("assign after restore: got %q\nwant %q", got, want)
	}
	// g keeps its restored IPv6 address while it waits for an IPv4 one.
	if got := joinAddrs(a.Held("g")); got != "2001:db8::2" {
		t.Fatalf("g holds %s", got)
	}
}

func svcWith(annotations map[string]string, lbIP string, families ...corev1.IPFamily) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", Annotations: annotations},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeLoadBalancer,
			LoadBalancerIP: lbIP,
			IPFamilies:     families,
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
			},
		},
	}
}

func TestWantOf(t *testing.T) {
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
		want string
	}{
		{"plain", svcWith(nil, "", v4), "pool= addrs= families=[ipv4] key= ports=[tcp/80 udp/53]"},
		{"no families", svcWith(nil, ""), "pool= addrs= families=[ipv4] key= ports=[tcp/80 udp/53]"},
		{"dual", svcWith(map[string]string{AnnotationPool: "p", AnnotationSharingKey: "k"}, "", v6, v4), "pool=p addrs= families=[ipv6 ipv4] key=k ports=[tcp/80 udp/53]"},
		{"addresses", svcWith(map[string]string{AnnotationAddresses: "192.0.2.1, 2001:db8::1"}, "", v6, v4), "pool= addrs=192.0.2.1,2001:db8::1 families=[ipv6 ipv4] key= ports=[tcp/80 udp/53]"},
		{"one of two families", svcWith(map[string]string{AnnotationAddresses: "2001:db8::1"}, "", v4, v6), "pool= addrs=2001:db8::1 families=[ipv6] key= ports=[tcp/80 udp/53]"},
		{"loadBalancerIP", svcWith(nil, "192.0.2.7", v4), "pool= addrs=192.0.2.7 families=[ipv4] key= ports=[tcp/80 udp/53]"},
		{"both agree", svcWith(map[string]string{AnnotationAddresses: "192.0.2.7"}, "192.0.2.7", v4), "pool= addrs=192.0.2.7 families=[ipv4] key= ports=[tcp/80 udp/53]"},
		{"both differ", svcWith(map[string]string{AnnotationAddresses: "192.0.2.7"}, "192.0.2.8", v4), "BadAnnotation: spec.loadBalancerIP 192.0.2.8 is not among vipd.io/addresses 192.0.2.7"},
		{"bad address", svcWith(map[string]string{AnnotationAddresses: "192.0.2.1,vip"}, "", v4), `BadAnnotation: vipd.io/addresses: "vip" is not an IP address`},
		{"bad loadBalancerIP", svcWith(nil, "192.0.2", v4), `BadAnnotation: spec.loadBalancerIP "192.0.2" is not an IP address`},
		{"two of a family", svcWith(map[string]string{AnnotationAddresses: "192.0.2.1,192.0.2.2"}, "", v4), "BadAnnotation: vipd.io/addresses asks for two ipv4 addresses"},
		{"wrong family", svcWith(map[string]string{AnnotationAddresses: "2001:db8::1"}, "", v4), "BadAnnotation: 2001:db8::1 is ipv6, which is not among the Service's ipFamilies"},
		{"empty pool", svcWith(map[string]string{AnnotationPool: ""}, "", v4), "BadAnnotation: vipd.io/pool is empty"},
		{"empty key", svcWith(map[string]string{AnnotationSharingKey: ""}, "", v4), "BadAnnotation: vipd.io/sharing-key is empty"},
	} {
		w, err := wantOf(tc.svc)
		var got string
		if err != nil {
			var ae *AllocError
			if !errors.As(err, &ae) {
				t.Fatalf("%s: untyped error %v", tc.name, err)
			}
			got = ae.Reason + ": " + ae.Msg
		} else {
			var ports []string
			for _, p := range w.Ports {
				ports = append(ports, fmt.Sprintf("%s/%d", p.Proto, p.Port))
			}
			got = fmt.Sprintf("pool=%s addrs=%s families=%v key=%s ports=[%s]", w.Pool, joinAddrs(w.Addrs), w.Families, w.SharingKey, strings.Join(ports, " "))
		}
		if got != tc.want {
			t.Errorf("%s: got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

func TestForeign(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"192.0.2.1-192.0.2.3"}})
	ip := netip.MustParseAddr
	w := Want{Families: v4}
	if got := assign(a, "mine", w); got != "192.0.2.1" {
		t.Fatalf("mine: %s", got)
	}
	// Another load balancer's Services show .1 and .2.
	a.SetForeign(map[netip.Addr]string{ip("192.0.2.1"): "ns/theirs", ip("192.0.2.2"): "ns/theirs2"})
	if got := assign(a, "mine", w); got != "192.0.2.1" {
		t.Fatalf("mine keeps what it holds: %s", got)
	}
	if got := assign(a, "new", w); got != "192.0.2.3" {
		t.Fatalf("new: %s", got)
	}
	if got := assign(a, "asks", Want{Addrs: []netip.Addr{ip("192.0.2.2")}, Families: v4}); got != "AddressTaken: 192.0.2.2 is in the status of Service ns/theirs2, which vipd does not serve" {
		t.Fatalf("asks: %s", got)
	}
	a.SetForeign(nil)
	if got := assign(a, "asks", Want{Addrs: []netip.Addr{ip("192.0.2.2")}, Families: v4}); got != "192.0.2.2" {
		t.Fatalf("asks after: %s", got)
	}
}

// TestPoolTenants: a pool with namespaces or a service_selector serves
// only the Services that match them (both when both are set), whether
// they name the pool, ask for one of its addresses or take whatever
// auto-assignment gives; a refusal names the pool and why.
func TestPoolTenants(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "gold", Addresses: []string{"192.0.2.0/30"}, AutoAssign: no(), Namespaces: []string{"pay"}},
		Pool{Name: "tier", Addresses: []string{"192.0.2.8/30"}, ServiceSelector: "tier=front"},
		Pool{Name: "both", Addresses: []string{"192.0.2.16/30"}, AutoAssign: no(), Namespaces: []string{"pay", "shop"}, ServiceSelector: "tier=front"},
		Pool{Name: "open", Addresses: []string{"192.0.2.24/30"}, AutoAssign: no()})
	front := map[string]string{"tier": "front"}
	ip := func(s string) []netip.Addr { return []netip.Addr{netip.MustParseAddr(s)} }
	for _, tc := range []struct {
		svc  string
		w    Want
		want string
	}{
		// An explicit pool request.
		{"dev/a", Want{Pool: "gold", Families: v4}, `PoolNotAllowed: pool "gold" is not for namespace "dev" (its namespaces: pay)`},
		{"pay/a", Want{Pool: "gold", Families: v4}, "192.0.2.0"},
		{"pay/b", Want{Pool: "tier", Families: v4}, `PoolNotAllowed: pool "tier" is not for Service pay/b: its labels do not match the pool's service_selector "tier=front"`},
		{"pay/c", Want{Pool: "tier", Families: v4, Labels: front}, "192.0.2.8"},
		{"dev/d", Want{Pool: "both", Families: v4, Labels: front}, `PoolNotAllowed: pool "both" is not for namespace "dev" (its namespaces: pay, shop)`},
		{"shop/d", Want{Pool: "both", Families: v4}, `PoolNotAllowed: pool "both" is not for Service shop/d: its labels do not match the pool's service_selector "tier=front"`},
		{"shop/e", Want{Pool: "both", Families: v4, Labels: front}, "192.0.2.16"},
		{"dev/f", Want{Pool: "open", Families: v4}, "192.0.2.24"},
		// A requested address, with or without its pool.
		{"dev/g", Want{Addrs: ip("192.0.2.2"), Families: v4}, `PoolNotAllowed: 192.0.2.2 is in pool "gold", which is not for namespace "dev" (its namespaces: pay)`},
		{"dev/h", Want{Pool: "gold", Addrs: ip("192.0.2.2"), Families: v4}, `PoolNotAllowed: pool "gold" is not for namespace "dev" (its namespaces: pay)`},
		{"dev/i", Want{Addrs: ip("192.0.2.10"), Families: v4}, `PoolNotAllowed: 192.0.2.10 is in pool "tier", which is not for Service dev/i: its labels do not match the pool's service_selector "tier=front"`},
		{"pay/g", Want{Addrs: ip("192.0.2.2"), Families: v4}, "192.0.2.2"},
		{"dev/j", Want{Addrs: ip("192.0.2.10"), Families: v4, Labels: front}, "192.0.2.10"},
		// Auto-assignment: only "tier" auto-assigns, and only to its
		// Services.
		{"dev/k", Want{Families: v4}, `PoolNotAllowed: no pool with auto_assign is for Service dev/k (see the pools' namespaces and service_selector)`},
		{"dev/l", Want{Families: v4, Labels: front}, "192.0.2.9"},
	} {
		if got := assign(a, tc.svc, tc.w); got != tc.want {
			t.Errorf("%s %+v:\n got %s\nwant %s", tc.svc, tc.w, got, tc.want)
		}
	}
	// A refused Service gets nothing, and keeps nothing it held from a
	// pool that is not for it: its labels changed.
	if got := a.Held("dev/a"); len(got) != 0 {
		t.Errorf("dev/a holds %v", got)
	}
	if got := assign(a, "dev/l", Want{Families: v4}); got != `PoolNotAllowed: no pool with auto_assign is for Service dev/l (see the pools' namespaces and service_selector)` {
		t.Errorf("dev/l without its label: %s", got)
	}
	if got := a.Held("dev/l"); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("192.0.2.9")}) {
		t.Errorf("dev/l holds %v, want what it held (Assign keeps it on error)", got)
	}
	// Restore keeps an address only for a Service the pool is for;
	// Unchecked (a follower's) keeps it whatever.
	b := newAlloc(t, Pool{Name: "gold", Addresses: []string{"192.0.2.0/30"}, Namespaces: []string{"pay"}})
	if kept := b.Restore("dev/x", Want{Families: v4}, ip("192.0.2.1")); len(kept) != 0 {
		t.Errorf("restored %v for dev/x", kept)
	}
	if kept := b.Restore("dev/y", Want{Families: v4, Addrs: ip("192.0.2.2"), Unchecked: true}, ip("192.0.2.2")); len(kept) != 1 {
		t.Errorf("unchecked restore kept %v", kept)
	}
}

// TestSharingKeyNamespaced: a sharing key is the namespace's: a Service
// of another namespace with the same key does not join its address (it
// gets one of its own, or, asking for that address, a refusal), unless
// the pool has share_across_namespaces.
func TestSharingKeyNamespaced(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "p", Addresses: []string{"192.0.2.0/30"}},
		Pool{Name: "shared", Addresses: []string{"192.0.2.8/30"}, AutoAssign: no(), ShareAcrossNamespaces: true})
	ip := netip.MustParseAddr("192.0.2.0")
	for _, tc := range []struct {
		svc  string
		w    Want
		want string
	}{
		{"a/web", Want{Families: v4, SharingKey: "k", Ports: tcp(80)}, "192.0.2.0"},
		{"a/dns", Want{Families: v4, SharingKey: "k", Ports: tcp(53)}, "192.0.2.0"},
		{"b/evil", Want{Families: v4, SharingKey: "k", Ports: tcp(22)}, "192.0.2.1"},
		{"b/evil2", Want{Addrs: []netip.Addr{ip}, Families: v4, SharingKey: "k", Ports: tcp(23)},
			`AddressTaken: 192.0.2.0 is shared under vipd.io/sharing-key "k" by Service a/dns of another namespace, and pool "p" does not let namespaces share (share_across_namespaces)`},
		{"a/x", Want{Pool: "shared", Families: v4, SharingKey: "s", Ports: tcp(80)}, "192.0.2.8"},
		{"b/y", Want{Pool: "shared", Families: v4, SharingKey: "s", Ports: tcp(443)}, "192.0.2.8"},
	} {
		if got := assign(a, tc.svc, tc.w); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.svc, got, tc.want)
		}
	}
}

func TestPoolSelectorError(t *testing.T) {
	_, err := NewAllocator([]Pool{{Name: "a", Addresses: []string{"192.0.2.0/30"}, ServiceSelector: "tier in (front"}})
	if err == nil || !strings.HasPrefix(err.Error(), `pool "a": service_selector "tier in (front": `) {
		t.Errorf("got %v", err)
	}
	_, err = NewAllocator([]Pool{{Name: "a", Addresses: []string{"192.0.2.0/30"}, Namespaces: []string{"ok", ""}}})
	if err == nil || err.Error() != `pool "a": namespaces: "" is not a namespace name` {
		t.Errorf("got %v", err)
	}
}

// TestAnyFamily: PreferDualStack (Want.AnyFamily) takes the families it
// can get, in order; without it, every family or none.
func TestAnyFamily(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"192.0.2.0/31", "2001:db8::1"}})
	dual := []lb.Family{lb.IPv6, lb.IPv4}
	for _, tc := range []struct {
		svc  string
		w    Want
		want string
	}{
		{"a", Want{Families: dual, AnyFamily: true}, "2001:db8::1,192.0.2.0 <nil>"},
		// IPv6 exhausted: IPv4 alone, and why.
		{"b", Want{Families: dual, AnyFamily: true}, "192.0.2.1 PoolExhausted: no pool with auto_assign has a free ipv6 address (ipFamilyPolicy PreferDualStack: served by ipv4 alone)"},
		// Every family or none: nothing, and b keeps what it holds.
		{"c", Want{Families: dual}, " PoolExhausted: no pool with auto_assign has a free ipv6 address"},
		{"b", Want{Families: dual}, " PoolExhausted: no pool with auto_assign has a free ipv6 address"},
		// Neither family: nothing at all.
		{"c", Want{Families: dual, AnyFamily: true}, " PoolExhausted: no pool with auto_assign has a free ipv6 address"},
		// a goes single-stack IPv4: its IPv6 address goes to c, whose
		// IPv4 one comes first as its families ask.
		{"a", Want{Families: v4}, "192.0.2.0 <nil>"},
		{"c", Want{Families: []lb.Family{lb.IPv4, lb.IPv6}, AnyFamily: true}, "2001:db8::1 PoolExhausted: no pool with auto_assign has a free ipv4 address (ipFamilyPolicy PreferDualStack: served by ipv6 alone)"},
	} {
		addrs, err := a.Assign(tc.svc, tc.w)
		got := joinAddrs(addrs) + " <nil>"
		if err != nil {
			var ae *AllocError
			if !errors.As(err, &ae) {
				t.Fatalf("%s: untyped error %v", tc.svc, err)
			}
			got = joinAddrs(addrs) + " " + ae.Reason + ": " + ae.Msg
		}
		if got != tc.want {
			t.Errorf("%s %+v: got %q, want %q", tc.svc, tc.w, got, tc.want)
		}
	}
	if got := joinAddrs(a.Held("b")); got != "192.0.2.1" {
		t.Errorf("b holds %s, want 192.0.2.1", got)
	}
	if got := joinAddrs(a.Held("c")); got != "2001:db8::1" {
		t.Errorf("c holds %s, want 2001:db8::1", got)
	}
}

// TestWantOfFamilyPolicy: ipFamilyPolicy picks the families, and the
// addresses asked for must agree with it.
func TestWantOfFamilyPolicy(t *testing.T) {
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	with := func(policy corev1.IPFamilyPolicy, annotations map[string]string, lbIP string, families ...corev1.IPFamily) *corev1.Service {
		svc := svcWith(annotations, lbIP, families...)
		svc.Spec.IPFamilyPolicy = &policy
		return svc
	}
	addrs := func(v string) map[string]string { return map[string]string{AnnotationAddresses: v} }
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
		want string
	}{
		{"none", svcWith(nil, "", v6, v4), "families=[ipv6 ipv4] any=false addrs="},
		{"single", with(corev1.IPFamilyPolicySingleStack, nil, "", v6, v4), "families=[ipv6] any=false addrs="},
		{"single, no families", with(corev1.IPFamilyPolicySingleStack, nil, ""), "families=[ipv4] any=false addrs="},
		{"prefer", with(corev1.IPFamilyPolicyPreferDualStack, nil, "", v6, v4), "families=[ipv6 ipv4] any=true addrs="},
		{"prefer, single-stack cluster", with(corev1.IPFamilyPolicyPreferDualStack, nil, "", v4), "families=[ipv4] any=true addrs="},
		{"require", with(corev1.IPFamilyPolicyRequireDualStack, nil, "", v6, v4), "families=[ipv6 ipv4] any=false addrs="},
		{"require, one family given", with(corev1.IPFamilyPolicyRequireDualStack, nil, "", v6), "families=[ipv6 ipv4] any=false addrs="},
		{"prefer, one asked", with(corev1.IPFamilyPolicyPreferDualStack, addrs("192.0.2.1"), "", v6, v4), "families=[ipv4] any=false addrs=192.0.2.1"},
		{"prefer, both asked", with(corev1.IPFamilyPolicyPreferDualStack, addrs("192.0.2.1,2001:db8::1"), "", v6, v4), "families=[ipv6 ipv4] any=false addrs=192.0.2.1,2001:db8::1"},
		{"require, both asked", with(corev1.IPFamilyPolicyRequireDualStack, addrs("2001:db8::1,192.0.2.1"), "", v4, v6), "families=[ipv4 ipv6] any=false addrs=2001:db8::1,192.0.2.1"},
		{"require, one asked", with(corev1.IPFamilyPolicyRequireDualStack, addrs("2001:db8::1"), "", v4, v6),
			"BadAnnotation: ipFamilyPolicy RequireDualStack needs an address of each family, and vipd.io/addresses asks for 2001:db8::1 alone"},
		{"require, loadBalancerIP", with(corev1.IPFamilyPolicyRequireDualStack, nil, "192.0.2.1", v4, v6),
			"BadAnnotation: ipFamilyPolicy RequireDualStack needs an address of each family, and spec.loadBalancerIP asks for 192.0.2.1 alone"},
		{"single, other family asked", with(corev1.IPFamilyPolicySingleStack, addrs("2001:db8::1"), "", v4, v6),
			"BadAnnotation: 2001:db8::1 is ipv6, which is not among the Service's ipFamilies"},
		{"single, two asked", with(corev1.IPFamilyPolicySingleStack, addrs("192.0.2.1,2001:db8::1"), "", v4),
			"BadAnnotation: 2001:db8::1 is ipv6, which is not among the Service's ipFamilies"},
		{"unknown policy", with("TripleStack", nil, "", v4),
			`BadAnnotation: spec.ipFamilyPolicy "TripleStack" is not SingleStack, PreferDualStack or RequireDualStack`},
	} {
		w, err := wantOf(tc.svc)
		got := fmt.Sprintf("families=%v any=%t addrs=%s", w.Families, w.AnyFamily, joinAddrs(w.Addrs))
		if err != nil {
			var ae *AllocError
			if !errors.As(err, &ae) {
				t.Fatalf("%s: untyped error %v", tc.name, err)
			}
			got = ae.Reason + ": " + ae.Msg
		}
		if got != tc.want {
			t.Errorf("%s: got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}
