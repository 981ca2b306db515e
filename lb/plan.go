package lb

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"
)

// OpKind is the kind of one planned operation. Kinds are declared in the
// order a plan applies them: prerequisites (sysctls, chains, set entries
// that let new traffic in, VIPs) first, then additions, then removals, and
// announcements last, once everything behind a VIP is in place.
type OpKind uint8

// The operation kinds, in application order.
const (
	OpSetSysctl OpKind = iota + 1
	OpSyncChains
	OpAddEntry
	OpBindVIP
	OpAddService
	OpUpdateService
	OpAddDest
	OpUpdateDest
	OpDrainDest
	OpDeleteDest
	OpDeleteService
	OpUnbindVIP
	OpDelEntry
	OpRemoveChains
	OpWithdraw
	OpAnnounce
	numOpKinds
)

var opKindNames = [...]string{
	OpSetSysctl:     "set-sysctl",
	OpSyncChains:    "sync-chains",
	OpAddEntry:      "add-entry",
	OpBindVIP:       "bind-vip",
	OpAddService:    "add-service",
	OpUpdateService: "update-service",
	OpAddDest:       "add-backend",
	OpUpdateDest:    "update-backend",
	OpDrainDest:     "drain-backend",
	OpDeleteDest:    "delete-backend",
	OpDeleteService: "delete-service",
	OpUnbindVIP:     "unbind-vip",
	OpDelEntry:      "delete-entry",
	OpRemoveChains:  "remove-chains",
	OpWithdraw:      "withdraw",
	OpAnnounce:      "announce",
}

// String returns the kind's name, such as "add-backend".
func (k OpKind) String() string {
	if int(k) < len(opKindNames) && opKindNames[k] != "" {
		return opKindNames[k]
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Op is one planned change to the kernel. Which fields matter depends on
// Kind. Ops are kept small: a cold start plans one per object.
type Op struct {
	Kind OpKind

	// Service is the service of service and backend operations.
	Service Service
	// Dest is the backend of backend operations.
	Dest Destination

	// Addr is the VIP of bind, unbind, announce and withdraw.
	Addr netip.Addr

	// Host is what a sysctl, set-entry or chain operation changes; nil
	// for the others. It is a pointer so that the operations on services
	// and backends, which a cold start plans by the hundred thousand, do
	// not each carry its room.
	Host *HostChange

	// Was holds the observed values an update, drain, sysctl or chain
	// operation replaces, so that a plan can be printed and undone. It is
	// nil for additions and deletions.
	Was *Was
}

// HostChange is the host setting a sysctl, set-entry or chain operation
// changes.
type HostChange struct {
	// Sysctl and Value describe a sysctl change.
	Sysctl, Value string
	// Entry is the set member of entry operations.
	Entry SetEntry
	// Policy is the chain policy of chain operations.
	Policy RulePolicy
}

// host returns op.Host or an empty one.
func (op *Op) host() HostChange {
	if op.Host == nil {
		return HostChange{}
	}
	return *op.Host
}

// Was is what an operation replaces.
type Was struct {
	Service Service
	Dest    Destination
	Value   string
	Policy  RulePolicy
}

// was returns op.Was or an empty one.
func (op Op) was() Was {
	if op.Was == nil {
		return Was{}
	}
	return *op.Was
}

// String formats the operation as one readable line.
// OpKey identifies an operation across passes: what it does and to
// what, without what it replaces (Op.Was) or the kernel's counters.
type OpKey struct {
	Kind          OpKind
	Service       Service
	Dest          Destination
	Addr          netip.Addr
	Sysctl, Value string
	Entry         SetEntry
	Policy        RulePolicy
}

// Key returns the operation's key.
func (op Op) Key() OpKey {
	d := op.Dest
	d.ActiveConns, d.InactiveConns, d.Stats = 0, 0, nil
	h := op.host()
	return OpKey{Kind: op.Kind, Service: op.Service, Dest: d, Addr: op.Addr, Sysctl: h.Sysctl, Value: h.Value,
		Entry: h.Entry, Policy: h.Policy}
}

func (op Op) String() string {
	k := op.Service.Key
	switch op.Kind {
	case OpSetSysctl:
		old := op.was().Value
		if old == "" {
			old = "unset"
		}
		return fmt.Sprintf("set sysctl %s=%s (was %s)", op.host().Sysctl, op.host().Value, old)
	case OpSyncChains:
		return fmt.Sprintf("sync chains %s (was %s)", op.host().Policy, op.was().Policy)
	case OpRemoveChains:
		return "remove chains"
	case OpAddEntry:
		return fmt.Sprintf("add set entry %s", op.host().Entry)
	case OpDelEntry:
		return fmt.Sprintf("delete set entry %s", op.host().Entry)
	case OpBindVIP:
		return fmt.Sprintf("bind vip %s", op.Addr)
	case OpUnbindVIP:
		return fmt.Sprintf("unbind vip %s", op.Addr)
	case OpAnnounce:
		return fmt.Sprintf("announce vip %s", op.Addr)
	case OpWithdraw:
		return fmt.Sprintf("withdraw vip %s", op.Addr)
	case OpAddService:
		return fmt.Sprintf("add service %s", op.Service)
	case OpUpdateService:
		return fmt.Sprintf("update service %s (was %s)", op.Service, op.was().Service)
	case OpDeleteService:
		return fmt.Sprintf("delete service %s", k)
	case OpAddDest:
		return fmt.Sprintf("add backend %s -> %s", k, op.Dest)
	case OpUpdateDest:
		return fmt.Sprintf("update backend %s -> %s (was %s)", k, op.Dest, op.was().Dest)
	case OpDrainDest:
		return fmt.Sprintf("drain backend %s -> %s (weight %d -> 0, %d active, %d inactive)", k, op.Dest.Addr, op.was().Dest.Weight, op.was().Dest.ActiveConns, op.was().Dest.InactiveConns)
	case OpDeleteDest:
		return fmt.Sprintf("delete backend %s -> %s", k, op.Dest.Addr)
	}
	return op.Kind.String()
}

// RemovalPolicy says how backends and services leave the kernel. It is one
// value from the configuration (config.Daemon.Removal) to the planner: the
// daemon, a reload and "vipd plan" all hand the same value on.
//
// A TCP or SCTP backend never leaves in the pass that takes it out of
// rotation: IPVS counts a connection whose handshake is still in flight as
// inactive, and once its destination is deleted the connection's next
// packet reaches the local stack, which resets it. So a leaving backend
// first goes to weight 0 (no new connection is scheduled to it; a
// retransmitted SYN is scheduled elsewhere), and a later pass deletes it
// once the kernel lists no connection to it at all, or once it has been at
// weight 0 for Grace with no active connection (connections still closing
// are counted as inactive for minutes, and a reset after a close costs the
// client nothing). UDP backends have no handshake and go at once: the next
// datagram of a flow to a deleted backend is scheduled again.
type RemovalPolicy struct {
	// Drain makes a leaving backend wait for its active (established)
	// connections to end, up to DrainTimeout. Without Drain, a leaving
	// backend is deleted after the grace whatever its connections.
	Drain bool
	// DrainTimeout bounds the wait for active connections; zero waits for
	// the last one.
	DrainTimeout time.Duration
	// Grace is how long a leaving TCP or SCTP backend stays at weight 0
	// before it is deleted while the kernel still counts connections to
	// it that are not established.
	Grace time.Duration
	// DrainServices makes a removed TCP or SCTP service leave like its
	// backends: at weight 0 first, with its VIP, until its backends may
	// go. Without it a removed service is deleted at once.
	DrainServices bool
}

// PlanOptions tune how Plan removes backends.
type PlanOptions struct {
	// Removal says how backends and services leave.
	Removal RemovalPolicy
	// Leaving reports how long a backend has been leaving, at weight 0;
	// the first call for a backend starts its clock and returns zero.
	// Nil means every leaving backend has just started.
	Leaving func(ServiceKey, netip.AddrPort) time.Duration
}

// leaving returns how long (svc, addr) has been leaving.
func (opts PlanOptions) leaving(svc ServiceKey, addr netip.AddrPort) time.Duration {
	if opts.Leaving == nil {
		return 0
	}
	return opts.Leaving(svc, addr)
}

// mayGo reports whether a backend at weight 0 that has been leaving for age
// may be deleted.
func (opts PlanOptions) mayGo(d Destination, age time.Duration) bool {
	rm := opts.Removal
	if rm.Drain && rm.DrainTimeout > 0 && age >= rm.DrainTimeout {
		return true
	}
	if rm.Drain && d.ActiveConns > 0 {
		return false
	}
	return d.InactiveConns == 0 && d.ActiveConns == 0 || age >= rm.Grace
}

// waits reports whether backends of services of protocol p leave by
// weight 0 first.
func waits(p Proto) bool { return p != UDP }

// drainOp takes d of svc out of rotation: weight 0.
func drainOp(svc Service, d Destination) Op {
	drained := d.Settings()
	drained.Weight = 0
	return Op{Kind: OpDrainDest, Service: svc, Dest: drained, Was: &Was{Dest: d}}
}

// serviceMayGo reports whether a removed service that drains may be
// deleted: all its backends are at weight 0 and may go (see mayGo), the
// service's age being that of its youngest leaving backend.
func serviceMayGo(key ServiceKey, s *ServiceState, opts PlanOptions) bool {
	for _, d := range s.Dests {
		if d.Weight != 0 {
			return false
		}
	}
	age := time.Duration(math.MaxInt64)
	for addr := range s.Dests {
		age = min(age, opts.leaving(key, addr))
	}
	for _, d := range s.Dests {
		if !opts.mayGo(d, age) {
			return false
		}
	}
	return true
}

// setDiff returns the keys of want that have lacks (add) and the keys of
// have that want lacks (del), in no particular order. Either map may be
// nil.
func setDiff[K comparable, V, W any](want map[K]V, have map[K]W) (add, del []K) {
	for k := range want {
		if _, ok := have[k]; !ok {
			add = append(add, k)
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			del = append(del, k)
		}
	}
	return add, del
}

// opsFor returns op(k) for each of keys, or nil for none.
func opsFor[K any](keys []K, op func(K) Op) []Op {
	if len(keys) == 0 {
		return nil
	}
	out := make([]Op, len(keys))
	for i, k := range keys {
		out[i] = op(k)
	}
	return out
}

// Plan returns the operations that take the kernel from observed to
// desired, in application order. It only ever removes what observed says
// vipd owns (see State.Owns), so foreign services survive. Equal states
// plan no operations.
func Plan(desired, observed *State, opts PlanOptions) []Op {
	var b [numOpKinds][]Op

	for _, key := range sortedKeys(desired.Sysctls, cmp.Compare[string]) {
		want := desired.Sysctls[key]
		if have := observed.Sysctls[key]; have != want {
			b[OpSetSysctl] = append(b[OpSetSysctl], Op{Kind: OpSetSysctl, Host: &HostChange{Sysctl: key, Value: want}, Was: &Was{Value: have}})
		}
	}

	switch dp, op := desired.Rules.Policy, observed.Rules.Policy; {
	case dp.Enabled && dp != op:
		b[OpSyncChains] = append(b[OpSyncChains], Op{Kind: OpSyncChains, Host: &HostChange{Policy: dp}, Was: &Was{Policy: op}})
	case !dp.Enabled && op.Enabled:
		b[OpRemoveChains] = append(b[OpRemoveChains], Op{Kind: OpRemoveChains, Was: &Was{Policy: op}})
	}
	add, del := setDiff(desired.Rules.Entries, observed.Rules.Entries)
	b[OpAddEntry] = opsFor(add, func(e SetEntry) Op { return Op{Kind: OpAddEntry, Host: &HostChange{Entry: e}} })
	b[OpDelEntry] = opsFor(del, func(e SetEntry) Op { return Op{Kind: OpDelEntry, Host: &HostChange{Entry: e}} })
	bind, unbind := setDiff(desired.VIPs, observed.VIPs)
	b[OpBindVIP] = opsFor(bind, func(a netip.Addr) Op { return Op{Kind: OpBindVIP, Addr: a} })
	b[OpUnbindVIP] = opsFor(unbind, func(a netip.Addr) Op { return Op{Kind: OpUnbindVIP, Addr: a} })
	announce, withdraw := setDiff(desired.Announce, observed.Announce)
	b[OpAnnounce] = opsFor(announce, func(a netip.Addr) Op { return Op{Kind: OpAnnounce, Addr: a} })
	b[OpWithdraw] = opsFor(withdraw, func(a netip.Addr) Op { return Op{Kind: OpWithdraw, Addr: a} })

	// Services are walked in key order and each one's backends in address
	// order, which is the order a plan applies them in: a cold start's
	// hundred thousand operations then need no sorting, and their slices
	// are allocated once at their final size.
	var newSvcs, newDests int
	for key, want := range desired.Services {
		if _, ok := observed.Services[key]; !ok {
			newSvcs++
			newDests += len(want.Dests)
		}
	}
	b[OpAddService] = make([]Op, 0, newSvcs)
	// Many new backends (a cold start) are planned straight into the
	// array the plan is returned in, behind room for the kinds that come
	// before them, so that the largest part of the plan, tens of
	// megabytes at a cold start of the benchmark's largest table, is not
	// copied again.
	var big []Op
	front := 0
	if newDests >= bigPlan {
		front = len(desired.Services) // add-service and update-service
		for k := range OpAddService {
			front += len(b[k])
		}
		back := bigPlanSlack
		for k := OpUnbindVIP; k < numOpKinds; k++ {
			back += len(b[k])
		}
		big = make([]Op, front, front+newDests+back)
		b[OpAddDest] = big[front:front]
	} else {
		b[OpAddDest] = make([]Op, 0, newDests)
	}
	var addrs []netip.AddrPort
	for _, key := range sortedKeys(desired.Services, ServiceKey.Compare) {
		want := desired.Services[key]
		have, ok := observed.Services[key]
		if !ok {
			b[OpAddService] = append(b[OpAddService], Op{Kind: OpAddService, Service: want.Service})
			addrs = sortedAddrs(addrs[:0], want.Dests)
			for _, a := range addrs {
				b[OpAddDest] = append(b[OpAddDest], Op{Kind: OpAddDest, Service: want.Service, Dest: want.Dests[a]})
			}
			continue
		}
		if have.Service != want.Service {
			b[OpUpdateService] = append(b[OpUpdateService], Op{Kind: OpUpdateService, Service: want.Service, Was: &Was{Service: have.Service}})
		}
		for addr, d := range want.Dests {
			hd, ok := have.Dests[addr]
			switch {
			case !ok:
				b[OpAddDest] = append(b[OpAddDest], Op{Kind: OpAddDest, Service: want.Service, Dest: d})
			case hd.Settings() != d:
				b[OpUpdateDest] = append(b[OpUpdateDest], Op{Kind: OpUpdateDest, Service: want.Service, Dest: d, Was: &Was{Dest: hd}})
			}
		}
		for addr, hd := range have.Dests {
			if _, ok := want.Dests[addr]; ok {
				continue
			}
			switch {
			case !waits(key.Proto):
				b[OpDeleteDest] = append(b[OpDeleteDest], Op{Kind: OpDeleteDest, Service: want.Service, Dest: hd})
			case hd.Weight != 0:
				b[OpDrainDest] = append(b[OpDrainDest], drainOp(want.Service, hd))
			case opts.mayGo(hd, opts.leaving(key, addr)):
				b[OpDeleteDest] = append(b[OpDeleteDest], Op{Kind: OpDeleteDest, Service: want.Service, Dest: hd})
			}
		}
	}
	// Removed services go at once, or with DrainServices leave like
	// removed backends; their VIPs (and announcements) stay until then.
	keepVIP := map[netip.Addr]bool{}
	for key, have := range observed.Services {
		if _, ok := desired.Services[key]; ok || !observed.Owns(key) {
			continue
		}
		if opts.Removal.DrainServices && waits(key.Proto) && !serviceMayGo(key, have, opts) {
			for _, hd := range have.Dests {
				if hd.Weight != 0 {
					b[OpDrainDest] = append(b[OpDrainDest], drainOp(have.Service, hd))
				}
			}
			if key.FWMark == 0 {
				keepVIP[key.Addr] = true
			}
			continue
		}
		b[OpDeleteService] = append(b[OpDeleteService], Op{Kind: OpDeleteService, Service: have.Service})
	}
	if len(keepVIP) > 0 {
		b[OpUnbindVIP] = slices.DeleteFunc(b[OpUnbindVIP], func(op Op) bool { return keepVIP[op.Addr] })
		b[OpWithdraw] = slices.DeleteFunc(b[OpWithdraw], func(op Op) bool { return keepVIP[op.Addr] })
	}

	if ops, ok := assembleBig(&b, big, front); ok {
		return ops
	}
	var n int
	for i := range b {
		n += len(b[i])
	}
	// Sort indices rather than the operations themselves, so that a cold
	// start's hundred thousand operations are each moved once.
	ops := make([]Op, 0, n)
	var idx []int32
	for i := range b {
		ops = appendSorted(ops, b[i], &idx)
		b[i] = nil
	}
	return ops
}

// bigPlan is the number of new backends from which Plan builds the plan
// in the add-backend array (see assembleBig); bigPlanSlack is the room it
// leaves behind them for the kinds that follow.
var bigPlan = 4096 // a variable for tests

const bigPlanSlack = 1024

// assembleBig returns the plan in big, where b's add-backend operations
// already are (from big[front:]): the kinds before them go into the room
// before front, the kinds after them behind. ok is false, and nothing is
// changed, when big is nil, the add-backend operations outgrew it, or the
// room before them is too small.
func assembleBig(b *[numOpKinds][]Op, big []Op, front int) ([]Op, bool) {
	adds := b[OpAddDest]
	if big == nil || cap(adds) == 0 || &adds[:1][0] != &big[:front+1][front] {
		return nil, false
	}
	need := 0
	for k := range OpAddDest {
		need += len(b[k])
	}
	if need > front {
		return nil, false
	}
	if !opsSorted(adds) {
		slices.SortFunc(adds, func(a, b Op) int { return compareOps(&a, &b) })
	}
	start := front - need
	ops := big[start:start]
	var idx []int32
	for k := range OpAddDest {
		ops = appendSorted(ops, b[k], &idx)
	}
	ops = big[start : front+len(adds)]
	for k := OpAddDest + 1; k < numOpKinds; k++ {
		ops = appendSorted(ops, b[k], &idx)
	}
	*b = [numOpKinds][]Op{}
	return ops, true
}

func appendSorted(dst, ops []Op, idx *[]int32) []Op {
	if opsSorted(ops) {
		return append(dst, ops...)
	}
	ix := (*idx)[:0]
	for i := range ops {
		ix = append(ix, int32(i))
	}
	slices.SortFunc(ix, func(a, b int32) int { return compareOps(&ops[a], &ops[b]) })
	for _, i := range ix {
		dst = append(dst, ops[i])
	}
	*idx = ix
	return dst
}

// opsSorted reports whether ops, of one kind, are in order. It compares
// them in place: slices.IsSortedFunc would copy two operations a step.
func opsSorted(ops []Op) bool {
	for i := 1; i < len(ops); i++ {
		if compareOps(&ops[i-1], &ops[i]) > 0 {
			return false
		}
	}
	return true
}

// sortedAddrs appends the keys of dests to dst in order.
func sortedAddrs(dst []netip.AddrPort, dests map[netip.AddrPort]Destination) []netip.AddrPort {
	for a := range dests {
		dst = append(dst, a)
	}
	slices.SortFunc(dst, netip.AddrPort.Compare)
	return dst
}

// compareOps orders operations of one kind by what they act on.
func compareOps(a, b *Op) int {
	switch a.Kind {
	case OpSetSysctl:
		return cmp.Compare(a.host().Sysctl, b.host().Sysctl)
	case OpAddEntry:
		return a.host().Entry.compare(b.host().Entry)
	case OpDelEntry:
		// A restriction goes before the sources it admits (see
		// SetRestricted): additions put them in the other order.
		ea, eb := a.host().Entry, b.host().Entry
		if ra, rb := ea.Set == SetRestricted, eb.Set == SetRestricted; ra != rb {
			if ra {
				return -1
			}
			return 1
		}
		return ea.compare(eb)
	case OpBindVIP, OpUnbindVIP, OpAnnounce, OpWithdraw:
		return a.Addr.Compare(b.Addr)
	}
	if c := a.Service.Key.Compare(b.Service.Key); c != 0 {
		return c
	}
	return a.Dest.Addr.Compare(b.Dest.Addr)
}
