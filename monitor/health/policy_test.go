package health

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	checkdesc "github.com/vipd/vipd/monitor/check"

	"github.com/vipd/vipd/lb"
)

func dest(addr string, weight int) lb.Destination {
	return lb.Destination{Addr: netip.MustParseAddrPort(addr), Weight: weight, Forward: lb.Masq}
}

// weights formats backends as "addr=weight ..." for comparison.
func weights(ds []lb.Destination) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.Addr.String()+"="+strconv.Itoa(d.Weight))
	}
	return strings.Join(s, " ")
}

func TestApply(t *testing.T) {
	a, b, c := "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
	sorry := dest("127.0.0.1:9", 0)
	backends := []lb.Destination{dest(a, 1), dest(b, 2), dest(c, 3)}
	h := func(states ...State) map[netip.AddrPort]State {
		m := map[netip.AddrPort]State{}
		for i, s := range states {
			m[backends[i].Addr] = s
		}
		return m
	}
	tests := []struct {
		name     string
		backends []lb.Destination
		health   map[netip.AddrPort]State
		policy   Policy
		prev     Decision
		want     string
		healthy  int
		lost     bool
		sorry    bool
	}{
		{name: "all up", health: h(Up, Up, Up), want: "127.0.0.1:1=1 127.0.0.1:2=2 127.0.0.1:3=3", healthy: 3},
		{name: "unchecked is up", health: nil, want: "127.0.0.1:1=1 127.0.0.1:2=2 127.0.0.1:3=3", healthy: 3},
		{name: "quiesce", health: h(Up, Down, Up), want: "127.0.0.1:1=1 127.0.0.1:2=0 127.0.0.1:3=3", healthy: 2},
		{name: "remove", health: h(Up, Down, Up), policy: Policy{Action: Remove}, want: "127.0.0.1:1=1 127.0.0.1:3=3", healthy: 2},
		{name: "all down, no quorum, no sorry", health: h(Down, Down, Down), want: "127.0.0.1:1=0 127.0.0.1:2=0 127.0.0.1:3=0"},
		{name: "all down, removed", health: h(Down, Down, Down), policy: Policy{Action: Remove}, want: ""},
		{name: "quorum met", health: h(Up, Up, Down), policy: Policy{Quorum: 2}, want: "127.0.0.1:1=1 127.0.0.1:2=2 127.0.0.1:3=0", healthy: 2},
		{name: "quorum lost fails open", health: h(Up, Down, Down), policy: Policy{Quorum: 2, Action: Remove}, want: "127.0.0.1:1=1 127.0.0.1:2=2 127.0.0.1:3=3", healthy: 1, lost: true},
		{name: "quorum 1 fails open when all down", health: h(Down, Down, Down), policy: Policy{Quorum: 1}, want: "127.0.0.1:1=1 127.0.0.1:2=2 127.0.0.1:3=3", lost: true},
		{name: "hysteresis holds quorum lost", health: h(Up, Up, Down), policy: Policy{Quorum: 2, Hysteresis: 1}, prev: Decision{QuorumLost: true}, want: "127.0.0.1:1=1 127.0.0.1:2=2 127.0.0.1:3=3", healthy: 2, lost: true},
		{name: "hysteresis released", health: h(Up, Up, Up), policy: Policy{Quorum: 2, Hysteresis: 1}, prev: Decision{QuorumLost: true}, want: "127.0.0.1:1=1 127.0.0.1:2=2 127.0.0.1:3=3", healthy: 3},
		{name: "hysteresis not applied before loss", health: h(Up, Up, Down), policy: Policy{Quorum: 2, Hysteresis: 1}, want: "127.0.0.1:1=1 127.0.0.1:2=2 127.0.0.1:3=0", healthy: 2},
		{name: "sorry when all down", health: h(Down, Down, Down), policy: Policy{Sorry: sorry}, want: "127.0.0.1:1=0 127.0.0.1:2=0 127.0.0.1:3=0 127.0.0.1:9=1", sorry: true},
		{name: "sorry with remove", health: h(Down, Down, Down), policy: Policy{Sorry: sorry, Action: Remove}, want: "127.0.0.1:9=1", sorry: true},
		{name: "sorry beats failing open", health: h(Down, Down, Down), policy: Policy{Sorry: sorry, Quorum: 2, Action: Remove}, want: "127.0.0.1:9=1", sorry: true, lost: true},
		{name: "sorry unused while one is up", health: h(Down, Up, Down), policy: Policy{Sorry: sorry, Action: Remove}, want: "127.0.0.1:2=2", healthy: 1},
		{name: "sorry replaces a backend of its address", backends: []lb.Destination{dest(a, 1), dest("127.0.0.1:9", 1)}, health: map[netip.AddrPort]State{netip.MustParseAddrPort(a): Down, netip.MustParseAddrPort("127.0.0.1:9"): Down}, policy: Policy{Sorry: sorry}, want: "127.0.0.1:1=0 127.0.0.1:9=1", sorry: true},
		{name: "operator weight 0 stays and is not healthy", backends: []lb.Destination{dest(a, 0), dest(b, 2)}, health: h(Up, Down), policy: Policy{Sorry: sorry}, want: "127.0.0.1:1=0 127.0.0.1:2=0 127.0.0.1:9=1", sorry: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.backends
			if in == nil {
				in = backends
			}
			orig := slices.Clone(in)
			d := Apply(in, tt.health, tt.policy, tt.prev)
			if got := weights(d.Backends); got != tt.want {
				t.Errorf("backends %q, want %q", got, tt.want)
			}
			if d.Healthy != tt.healthy || d.QuorumLost != tt.lost || d.Sorry != tt.sorry {
				t.Errorf("decision healthy=%d lost=%v sorry=%v, want %d %v %v", d.Healthy, d.QuorumLost, d.Sorry, tt.healthy, tt.lost, tt.sorry)
			}
			if !slices.Equal(in, orig) {
				t.Errorf("Apply changed its input")
			}
		})
	}
}

type staticHealth map[string]map[netip.AddrPort]State

func (s staticHealth) Health(service string) map[netip.AddrPort]State { return s[service] }

func TestApplySpec(t *testing.T) {
	spec := &lb.Spec{Services: []lb.VirtualService{
		{Name: "web", Backends: []lb.Destination{dest("127.0.0.1:1", 1), dest("127.0.0.1:2", 1)}},
		{Name: "dns", Backends: []lb.Destination{dest("127.0.0.1:3", 1)}},
	}}
	src := staticHealth{"web": {netip.MustParseAddrPort("127.0.0.1:2"): Down}, "dns": {netip.MustParseAddrPort("127.0.0.1:3"): Down}}
	out, ds := ApplySpec(spec, map[string]Policy{"web": {Action: Remove}, "dns": {Quorum: 1}}, src, nil)
	if got := weights(out.Services[0].Backends); got != "127.0.0.1:1=1" {
		t.Errorf("web: %s", got)
	}
	if got := weights(out.Services[1].Backends); got != "127.0.0.1:3=1" || !ds["dns"].QuorumLost {
		t.Errorf("dns: %s %+v", got, ds["dns"])
	}
	if len(spec.Services[0].Backends) != 2 {
		t.Errorf("ApplySpec changed its input")
	}
}

func TestPolicyValidate(t *testing.T) {
	for _, p := range []Policy{{Quorum: -1}, {Hysteresis: 1}, {Action: 7}} {
		if p.Validate() == nil {
			t.Errorf("%+v is valid", p)
		}
	}
	if err := (Policy{Quorum: 2, Hysteresis: 1, Action: Remove}).Validate(); err != nil {
		t.Error(err)
	}
	if a, err := checkdesc.ParseAction("Remove"); err != nil || a != Remove {
		t.Errorf("ParseAction: %v %v", a, err)
	}
}
