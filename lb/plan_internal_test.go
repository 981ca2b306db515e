package lb

import (
	"net/netip"
	"reflect"
	"testing"
)

// TestPlanBigSameAsSmall: a plan built in the add-backend array (a cold
// start's) is the plan built the ordinary way, with every kind present:
// new services and backends, updated services and backends, deleted
// backends and services, VIPs and entries both ways.
func TestPlanBigSameAsSmall(t *testing.T) {
	desired, observed := NewState(), NewState()
	addr := func(a, b, c byte) netip.Addr { return netip.AddrFrom4([4]byte{10, a, b, c}) }
	for i := range 300 {
		vip := addr(1, byte(i>>8), byte(i))
		key := ServiceKey{Family: IPv4, Proto: TCP, Addr: vip, Port: 80}
		st := &ServiceState{Service: Service{Key: key, Scheduler: "wrr"}, Dests: map[netip.AddrPort]Destination{}}
		for j := range 10 {
			d := Destination{Addr: netip.AddrPortFrom(addr(2, byte(i), byte(j)), 8080), Weight: 1, Forward: Masq}
			st.Dests[d.Addr] = d
		}
		desired.Services[key] = st
		desired.VIPs[vip] = struct{}{}
		desired.Rules.Entries[SetEntry{Set: SetVIPs, Addr: vip}] = struct{}{}
		if i%3 == 0 {
			// Existing: another scheduler, one weight off, one extra backend.
			have := &ServiceState{Service: Service{Key: key, Scheduler: "rr"}, Dests: map[netip.AddrPort]Destination{}}
			for a, d := range st.Dests {
				have.Dests[a] = d
			}
			for a, d := range have.Dests {
				d.Weight = 5
				have.Dests[a] = d
				break
			}
			// Half the extra backends are already at weight 0: they are deleted;
			// the others are drained first.
			extra := Destination{Addr: netip.AddrPortFrom(addr(3, byte(i), 1), 8080), Weight: i % 2}
			have.Dests[extra.Addr] = extra
			observed.Services[key] = have
			observed.VIPs[vip] = struct{}{}
		}
	}
	for i := range 20 {
		key := ServiceKey{Family: IPv4, Proto: UDP, Addr: addr(9, 0, byte(i)), Port: 53}
		observed.Services[key] = &ServiceState{Service: Service{Key: key, Scheduler: "rr"}}
		observed.VIPs[key.Addr] = struct{}{}
		observed.Rules.Entries[SetEntry{Set: SetVIPs, Addr: key.Addr}] = struct{}{}
	}
	defer func(v int) { bigPlan = v }(bigPlan)
	bigPlan = 1 << 30
	small := Plan(desired, observed, PlanOptions{})
	bigPlan = 1
	big := Plan(desired, observed, PlanOptions{})
	if len(small) < 2000 {
		t.Fatalf("only %d operations", len(small))
	}
	if !reflect.DeepEqual(small, big) {
		for i := range min(len(small), len(big)) {
			if !reflect.DeepEqual(small[i], big[i]) {
				t.Fatalf("plans differ at %d of %d/%d: %v vs %v", i, len(small), len(big), small[i], big[i])
			}
		}
		t.Fatalf("plans differ in length: %d vs %d", len(small), len(big))
	}
	kinds := map[OpKind]int{}
	for _, op := range big {
		kinds[op.Kind]++
	}
	for _, k := range []OpKind{OpAddEntry, OpBindVIP, OpAddService, OpUpdateService, OpAddDest, OpUpdateDest, OpDeleteDest, OpDeleteService, OpUnbindVIP, OpDelEntry} {
		if kinds[k] == 0 {
			t.Errorf("no %s in the plan: %v", k, kinds)
		}
	}
}
