// Package lbtest provides a fake kernel for testing vipd's core: it
// implements every lb adapter interface in memory, behaves like the kernel
// where vipd depends on it (EEXIST, ENOENT, unsupported schedulers), counts
// calls, injects failures, and dumps its state as sorted text. IPVS
// changes reach it as they reach the kernel, in batches (Apply); its
// single-operation methods (AddService, AddDest, ...) are for tests that
// change the table behind vipd's back.
package lbtest

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	"github.com/vipd/vipd/lb"
)

// Kernel is an in-memory kernel. The zero value is not usable; call New.
type Kernel struct {
	mu sync.Mutex
	st *lb.State
	// hostAddrs are the addresses HostAddrs reports.
	hostAddrs map[string][]netip.Addr
	// unsupported schedulers make AddService and UpdateService fail.
	unsupported map[string]bool
	// fail, if set, is asked before each mutating call; an error it
	// returns fails the call without changing state.
	fail func(call string) error
	// calls records every mutating call, in order.
	calls []string
	// reads records every read of IPVS, in order.
	reads []string
	// batches records every Apply, in order.
	batches []string
	// miss are services the next Services leaves out.
	miss map[lb.ServiceKey]bool
}

// New returns an empty fake kernel.
func New() *Kernel {
	return &Kernel{st: lb.NewState(), unsupported: map[string]bool{}, hostAddrs: map[string][]netip.Addr{}}
}

// Interface returns the fake as the full set of lb adapters.
func (k *Kernel) Interface() lb.Kernel {
	return lb.Kernel{IPVS: k, VIPs: k, Sysctls: k, Rules: k, Announcer: k, Ledger: k}
}

// SetHostAddrs sets the addresses of a host interface.
func (k *Kernel) SetHostAddrs(ifname string, addrs ...netip.Addr) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.hostAddrs[ifname] = addrs
}

// Unsupport makes the named scheduler unknown to the fake kernel, as twos
// is to Linux 6.1.
func (k *Kernel) Unsupport(sched string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.unsupported[sched] = true
}

// FailWith sets a function that may fail mutating calls. Calls are named
// as Calls reports them.
func (k *Kernel) FailWith(f func(call string) error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fail = f
}

// Calls returns the mutating calls made so far and forgets them.
func (k *Kernel) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.calls
	k.calls = nil
	return c
}

// Reads returns the reads of IPVS made so far ("services" for a whole
// table, "service KEY" for one service) and forgets them.
func (k *Kernel) Reads() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	r := k.reads
	k.reads = nil
	return r
}

// Dump returns the kernel state as sorted text.
func (k *Kernel) Dump() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.st.Dump()
}

// Edit runs f on the fake's state, to simulate changes made behind vipd's
// back (a foreign service, an operator deleting a VIP, traffic).
func (k *Kernel) Edit(f func(*lb.State)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f(k.st)
}

// call records a mutating call and returns the injected failure, if any.
// The caller holds k.mu.
func (k *Kernel) call(format string, args ...any) error {
	c := fmt.Sprintf(format, args...)
	if k.fail != nil {
		if err := k.fail(c); err != nil {
			return err
		}
	}
	k.calls = append(k.calls, c)
	return nil
}

// Errors the fake returns: the kernel's.
var (
	ErrExist    error = syscall.EEXIST
	ErrNotExist error = syscall.ENOENT
)

// MissNext makes the next Services leave out the services of keys, as a
// dump of the kernel's table does when a namespace changes the table
// (shared by all namespaces) during the dump. Single reads see them.
func (k *Kernel) MissNext(keys ...lb.ServiceKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.miss = map[lb.ServiceKey]bool{}
	for _, key := range keys {
		k.miss[key] = true
	}
}

// Services implements lb.IPVS.
func (k *Kernel) Services() (map[lb.ServiceKey]*lb.ServiceState, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reads = append(k.reads, "services")
	out := make(map[lb.ServiceKey]*lb.ServiceState, len(k.st.Services))
	for key, s := range k.st.Services {
		if !k.miss[key] {
			out[key] = &lb.ServiceState{Service: s.Service, Dests: maps.Clone(s.Dests), Stats: s.Stats}
		}
	}
	k.miss = nil
	return out, nil
}

// Service implements lb.IPVS.
func (k *Kernel) Service(key lb.ServiceKey) (*lb.ServiceState, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reads = append(k.reads, "service "+key.String())
	s, ok := k.st.Services[key]
	if !ok {
		return nil, nil
	}
	return &lb.ServiceState{Service: s.Service, Dests: maps.Clone(s.Dests), Stats: s.Stats}, nil
}

func (k *Kernel) checkSched(s lb.Service) error {
	if k.unsupported[s.Scheduler] {
		return fmt.Errorf("scheduler %q: no such file or directory (kernel module ip_vs_%s missing)", s.Scheduler, s.Scheduler)
	}
	return nil
}

// AddService adds a service, as ipvsadm -A does.
func (k *Kernel) AddService(s lb.Service) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.st.Services[s.Key]; ok {
		return ErrExist
	}
	if err := k.checkSched(s); err != nil {
		return err
	}
	if err := k.call("add-service %s", s.Key); err != nil {
		return err
	}
	k.st.Services[s.Key] = &lb.ServiceState{Service: s, Dests: map[netip.AddrPort]lb.Destination{}}
	return nil
}

// UpdateService changes a service, as ipvsadm -E does.
func (k *Kernel) UpdateService(s lb.Service) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	cur, ok := k.st.Services[s.Key]
	if !ok {
		return ErrNotExist
	}
	if err := k.checkSched(s); err != nil {
		return err
	}
	if err := k.call("update-service %s", s.Key); err != nil {
		return err
	}
	cur.Service = s
	return nil
}

// DeleteService deletes a service, as ipvsadm -D does.
func (k *Kernel) DeleteService(key lb.ServiceKey) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.st.Services[key]; !ok {
		return ErrNotExist
	}
	if err := k.call("delete-service %s", key); err != nil {
		return err
	}
	delete(k.st.Services, key)
	return nil
}

// AddDest adds a destination, as ipvsadm -a does.
func (k *Kernel) AddDest(key lb.ServiceKey, d lb.Destination) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, ok := k.st.Services[key]
	if !ok {
		return ErrNotExist
	}
	if _, ok := s.Dests[d.Addr]; ok {
		return ErrExist
	}
	if err := k.call("add-dest %s %s", key, d.Addr); err != nil {
		return err
	}
	s.Dests[d.Addr] = d.Settings()
	return nil
}

// UpdateDest changes a destination, as ipvsadm -e does. Connection counts survive an update, as
// in the kernel.
func (k *Kernel) UpdateDest(key lb.ServiceKey, d lb.Destination) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, ok := k.st.Services[key]
	if !ok {
		return ErrNotExist
	}
	cur, ok := s.Dests[d.Addr]
	if !ok {
		return ErrNotExist
	}
	if err := k.call("update-dest %s %s weight=%d", key, d.Addr, d.Weight); err != nil {
		return err
	}
	n := d.Settings()
	n.ActiveConns, n.InactiveConns = cur.ActiveConns, cur.InactiveConns
	s.Dests[d.Addr] = n
	return nil
}

// DeleteDest deletes a destination, as ipvsadm -d does.
func (k *Kernel) DeleteDest(key lb.ServiceKey, addr netip.AddrPort) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, ok := k.st.Services[key]
	if !ok {
		return ErrNotExist
	}
	if _, ok := s.Dests[addr]; !ok {
		return ErrNotExist
	}
	if err := k.call("delete-dest %s %s", key, addr); err != nil {
		return err
	}
	delete(s.Dests, addr)
	return nil
}

// VIPs implements lb.VIPs.
func (k *Kernel) VIPs() ([]netip.Addr, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return sortedAddrs(k.st.VIPs), nil
}

// Bind implements lb.VIPs.
func (k *Kernel) Bind(a netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("bind %s", a); err != nil {
		return err
	}
	k.st.VIPs[a] = struct{}{}
	return nil
}

// Unbind implements lb.VIPs.
func (k *Kernel) Unbind(a netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("unbind %s", a); err != nil {
		return err
	}
	delete(k.st.VIPs, a)
	return nil
}

// HostAddrs implements lb.VIPs.
func (k *Kernel) HostAddrs() (map[string][]netip.Addr, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := maps.Clone(k.hostAddrs)
	if len(k.st.VIPs) > 0 {
		out["vipd0"] = sortedAddrs(k.st.VIPs)
	}
	return out, nil
}

// Get implements lb.Sysctls.
func (k *Kernel) Get(path string) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	v, ok := k.st.Sysctls[path]
	if !ok {
		return "", ErrNotExist
	}
	return v, nil
}

// Set implements lb.Sysctls.
func (k *Kernel) Set(path, value string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("sysctl %s=%s", path, value); err != nil {
		return err
	}
	k.st.Sysctls[path] = value
	return nil
}

// Observe implements lb.RuleTables.
func (k *Kernel) Observe() (lb.Rules, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return lb.Rules{Policy: k.st.Rules.Policy, Entries: maps.Clone(k.st.Rules.Entries)}, nil
}

// SyncChains implements lb.RuleTables.
func (k *Kernel) SyncChains(p lb.RulePolicy) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("sync-chains %s", p); err != nil {
		return err
	}
	k.st.Rules.Policy = p
	return nil
}

// RemoveChains implements lb.RuleTables.
func (k *Kernel) RemoveChains() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("remove-chains"); err != nil {
		return err
	}
	k.st.Rules.Policy = lb.RulePolicy{}
	return nil
}

// AddEntry implements lb.RuleTables.
func (k *Kernel) AddEntry(e lb.SetEntry) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("add-entry %s", e); err != nil {
		return err
	}
	k.st.Rules.Entries[e] = struct{}{}
	return nil
}

// DelEntry implements lb.RuleTables.
func (k *Kernel) DelEntry(e lb.SetEntry) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("del-entry %s", e); err != nil {
		return err
	}
	delete(k.st.Rules.Entries, e)
	return nil
}

// Announced implements lb.Announcer.
func (k *Kernel) Announced() []netip.Addr {
	k.mu.Lock()
	defer k.mu.Unlock()
	return sortedAddrs(k.st.Announce)
}

// Announce implements lb.Announcer.
func (k *Kernel) Announce(a netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("announce %s", a); err != nil {
		return err
	}
	k.st.Announce[a] = struct{}{}
	return nil
}

// Withdraw implements lb.Announcer.
func (k *Kernel) Withdraw(a netip.Addr) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.call("withdraw %s", a); err != nil {
		return err
	}
	delete(k.st.Announce, a)
	return nil
}

// Load implements lb.Ledger.
func (k *Kernel) Load() (map[lb.ServiceKey]struct{}, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.st.Owned), nil
}

// Store implements lb.Ledger. Ledger writes are not kernel calls and are
// not recorded.
func (k *Kernel) Store(owned map[lb.ServiceKey]struct{}) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.st.Owned = maps.Clone(owned)
	return nil
}

func sortedAddrs(m map[netip.Addr]struct{}) []netip.Addr {
	return slices.SortedFunc(maps.Keys(m), netip.Addr.Compare)
}

// Apply implements lb.IPVS: the operations in order, each as the single
// call of its kind (AddService, AddDest, ...) records it, continuing past
// failures. The batch is recorded too (see Batches).
func (k *Kernel) Apply(ops []lb.Op) []error {
	errs := make([]error, len(ops))
	for i, op := range ops {
		key := op.Service.Key
		switch op.Kind {
		case lb.OpAddService:
			errs[i] = k.AddService(op.Service)
		case lb.OpUpdateService:
			errs[i] = k.UpdateService(op.Service)
		case lb.OpDeleteService:
			errs[i] = k.DeleteService(key)
		case lb.OpAddDest:
			errs[i] = k.AddDest(key, op.Dest)
		case lb.OpUpdateDest, lb.OpDrainDest:
			errs[i] = k.UpdateDest(key, op.Dest)
		case lb.OpDeleteDest:
			errs[i] = k.DeleteDest(key, op.Dest.Addr)
		default:
			errs[i] = fmt.Errorf("%s is not an ipvs operation", op.Kind)
		}
	}
	if len(ops) > 0 {
		k.mu.Lock()
		k.batches = append(k.batches, fmt.Sprintf("%s %d", ops[0].Kind, len(ops)))
		k.mu.Unlock()
	}
	return errs
}

// Batches returns the batches Apply was given so far, each as "KIND N"
// (the kind of its first operation and its length), and forgets them.
func (k *Kernel) Batches() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.batches
	k.batches = nil
	return b
}
