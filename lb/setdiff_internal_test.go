package lb

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// TestSetDiff: setDiff returns what want adds and what it removes, each
// key once, with nil maps as empty sets and the values ignored.
func TestSetDiff(t *testing.T) {
	a, b, c, d := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("2001:db8::1")
	set := func(addrs ...netip.Addr) map[netip.Addr]struct{} {
		m := map[netip.Addr]struct{}{}
		for _, x := range addrs {
			m[x] = struct{}{}
		}
		return m
	}
	tests := []struct {
		name       string
		want, have map[netip.Addr]struct{}
		add, del   []netip.Addr
	}{
		{"both nil", nil, nil, nil, nil},
		{"equal", set(a, b), set(b, a), nil, nil},
		{"from nothing", set(a, d), nil, []netip.Addr{a, d}, nil},
		{"to nothing", nil, set(b, c), nil, []netip.Addr{b, c}},
		{"overlap", set(a, b, d), set(b, c), []netip.Addr{a, d}, []netip.Addr{c}},
		{"disjoint", set(a), set(c), []netip.Addr{a}, []netip.Addr{c}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			add, del := setDiff(tt.want, tt.have)
			slices.SortFunc(add, netip.Addr.Compare)
			slices.SortFunc(del, netip.Addr.Compare)
			if !slices.Equal(add, tt.add) || !slices.Equal(del, tt.del) {
				t.Errorf("setDiff = add %v del %v; want add %v del %v", add, del, tt.add, tt.del)
			}
		})
	}
	// Values do not count: only membership.
	add, del := setDiff(map[string]int{"x": 1, "y": 2}, map[string]bool{"y": false, "z": true})
	if fmt.Sprint(add, del) != "[x] [z]" {
		t.Errorf("setDiff over differing values = add %v del %v; want add [x] del [z]", add, del)
	}
}

// TestOpsFor: opsFor maps keys to operations in order, and no keys to nil
// (Plan's buckets stay empty).
func TestOpsFor(t *testing.T) {
	if got := opsFor([]netip.Addr(nil), func(netip.Addr) Op { return Op{} }); got != nil {
		t.Errorf("opsFor(nil) = %v; want nil", got)
	}
	keys := []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.1")}
	got := opsFor(keys, func(a netip.Addr) Op { return Op{Kind: OpBindVIP, Addr: a} })
	if len(got) != 2 || got[0].Addr != keys[0] || got[1].Addr != keys[1] || got[1].Kind != OpBindVIP {
		t.Errorf("opsFor = %v; want bind-vip 192.0.2.2, 192.0.2.1", got)
	}
}
