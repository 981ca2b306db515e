package lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// IPVS is the kernel's IPVS table, as vipd uses it. Every change goes
// through Apply, in batches; a single operation is a batch of one.
type IPVS interface {
	// Services returns every IPVS service with its destinations. It
	// need not be a snapshot: the kernel's dump can miss a service when
	// the table changes during it (in any network namespace), so a
	// service it lacks is not known to be gone. The Reconciler reads
	// such services again with Service before acting on their absence.
	Services() (map[ServiceKey]*ServiceState, error)
	// Service returns one service with its destinations and counters,
	// or nil when the kernel has no service with that key.
	Service(ServiceKey) (*ServiceState, error)
	// Apply applies ops, all of IPVS kinds (see isIPVSKind), in order,
	// continuing past failures, and returns one error (nil for success)
	// per operation. The reconciler hands it runs of one kind.
	Apply(ops []Op) []error
}

// batchSize bounds the operations handed to one IPVS.Apply call.
const batchSize = 1024

// isIPVSKind reports whether operations of kind k change IPVS.
func isIPVSKind(k OpKind) bool {
	switch k {
	case OpAddService, OpUpdateService, OpDeleteService, OpAddDest, OpUpdateDest, OpDrainDest, OpDeleteDest:
		return true
	}
	return false
}

// VIPs are the addresses on vipd's dummy interface.
type VIPs interface {
	// VIPs returns the addresses bound to the dummy interface.
	VIPs() ([]netip.Addr, error)
	// Bind adds addr to the dummy interface; binding twice is no error.
	Bind(addr netip.Addr) error
	// Unbind removes addr; removing a missing address is no error.
	Unbind(addr netip.Addr) error
	// HostAddrs returns the host's addresses by interface name.
	HostAddrs() (map[string][]netip.Addr, error)
}

// Sysctls reads and writes values below /proc/sys.
type Sysctls interface {
	Get(path string) (string, error)
	Set(path, value string) error
}

// RuleTables are vipd's own packet-filter chains and sets.
type RuleTables interface {
	// Observe returns the policy the chains implement (zero when they are
	// missing or altered) and the members of vipd's sets.
	Observe() (Rules, error)
	SyncChains(RulePolicy) error
	RemoveChains() error
	AddEntry(SetEntry) error
	DelEntry(SetEntry) error
}

// Announcer answers ARP and neighbour solicitations for VIPs on the
// uplinks and sends gratuitous announcements.
type Announcer interface {
	Announced() []netip.Addr
	Announce(netip.Addr) error
	Withdraw(netip.Addr) error
}

// Ledger persists which services vipd owns that no VIP of the dummy
// interface marks as its own.
type Ledger interface {
	Load() (map[ServiceKey]struct{}, error)
	Store(map[ServiceKey]struct{}) error
}

// Kernel groups the adapters a Reconciler drives. A nil member is a part of
// the kernel vipd leaves alone: its state is neither observed nor changed.
type Kernel struct {
	IPVS      IPVS
	VIPs      VIPs
	Sysctls   Sysctls
	Rules     RuleTables
	Announcer Announcer
	Ledger    Ledger
}

// Options configure a Reconciler.
type Options struct {
	Kernel Kernel
	Logger *slog.Logger
	// KernelRelease and Dummy describe the host (see Host).
	KernelRelease string
	Dummy         string
	// Removal says how backends and services leave (see RemovalPolicy).
	Removal RemovalPolicy
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Reconciler makes the kernel match a Spec: observe, plan, apply. It is
// level-triggered: every pass starts from what the kernel reports, so it
// repairs drift as well as applying changes. Its methods are safe for
// concurrent use; passes run one at a time.
type Reconciler struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	draining map[drainKey]time.Time

	// Sysctls and rules are read from the kernel on the first pass and
	// after Refresh; in between, passes use what the last full read and
	// the operations since then say. Reading rules means running
	// iptables-save, which costs far more than the rest of a pass, and
	// neither changes behind vipd's back in normal operation: the
	// periodic resync (which calls Refresh) repairs drift.
	sysctls map[string]string
	rules   *Rules
	// hostWrites counts the operations on sysctls and rules, done or
	// failed (see UseFresh).
	hostWrites atomic.Uint64
}

// SetRemoval makes the passes that follow remove backends and services as
// rm says (a reload that changes it).
func (r *Reconciler) SetRemoval(rm RemovalPolicy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.opts.Removal = rm
}

// Refresh makes the next pass read sysctls and rules from the kernel
// again instead of trusting what vipd last wrote.
func (r *Reconciler) Refresh() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sysctls, r.rules = nil, nil
}

type drainKey struct {
	svc  ServiceKey
	addr netip.AddrPort
}

// NewReconciler returns a Reconciler for opts.
func NewReconciler(opts Options) *Reconciler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Reconciler{opts: opts, log: opts.Logger, draining: map[drainKey]time.Time{}}
}

// Result reports what one pass did.
type Result struct {
	// Applied lists the operations that succeeded, in order.
	Applied []Op
	// Failed lists the operations that failed, each with its error.
	Failed []*OpError
	// Skipped lists operations not attempted because an operation they
	// depend on failed (a backend of a service that could not be added).
	Skipped []Op
	// Ledger is the error of storing the ownership ledger, or nil. Before
	// the operations it stops the pass: every operation is skipped.
	// After them, they stand, and the ledger lags until the next pass.
	Ledger error
	// Existed lists the additions of services and backends that found
	// them already in the kernel: a read of the table had missed them
	// (see IPVS.Services). They neither applied nor failed: each service
	// concerned was read again and planned anew, its other operations of
	// the pass were dropped, and the new plan's operations are among
	// Applied, Failed and Skipped.
	Existed []Op
}

// Err returns the failures and the ledger's error joined, or nil.
func (r *Result) Err() error {
	errs := make([]error, 0, len(r.Failed)+1)
	for _, f := range r.Failed {
		errs = append(errs, f)
	}
	return errors.Join(append(errs, r.Ledger)...)
}

// OpError is the failure of one operation.
type OpError struct {
	Op  Op
	Err error
}

func (e *OpError) Error() string { return fmt.Sprintf("%s: %v", e.Op, e.Err) }
func (e *OpError) Unwrap() error { return e.Err }

// observe reads the kernel state that desired concerns: all IPVS
// services (to find what vipd owns), the dummy interface's addresses,
// the sysctls desired names, and vipd's rules. Sysctls and rules come
// from the reconciler's caches when it has them (see Refresh); the
// caller holds r.mu.
func (r *Reconciler) observe(desired *State) (*State, error) {
	k := r.opts.Kernel
	s, err := r.observeServices()
	if err != nil {
		return nil, err
	}
	if err := r.confirmOwned(desired, s); err != nil {
		return nil, err
	}
	if k.Sysctls != nil {
		if r.sysctls == nil {
			r.sysctls = map[string]string{}
		}
		for path := range desired.Sysctls {
			if v, ok := r.sysctls[path]; ok {
				s.Sysctls[path] = v
				continue
			}
			// A missing sysctl (ip_vs not loaded yet) reads as unset;
			// the plan then tries to set it and reports why it can't.
			if v, err := k.Sysctls.Get(path); err == nil {
				s.Sysctls[path] = v
				r.sysctls[path] = v
			}
		}
	}
	if k.Rules != nil {
		if r.rules == nil {
			rules, err := k.Rules.Observe()
			if err != nil {
				return nil, fmt.Errorf("observe rules: %w", err)
			}
			if rules.Entries == nil {
				rules.Entries = map[SetEntry]struct{}{}
			}
			r.rules = &rules
		}
		s.Rules = Rules{Policy: r.rules.Policy, Entries: cloneMap(r.rules.Entries)}
	}
	if k.Announcer != nil {
		for _, a := range k.Announcer.Announced() {
			s.Announce[a] = struct{}{}
		}
	}
	return s, nil
}

// ObserveServices reads only what status reports need: the IPVS services
// with their counters, the dummy interface's VIPs and the ledger. It is
// much cheaper than a pass's observation, which also reads sysctls and rules.
func (r *Reconciler) ObserveServices() (*State, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.observeServices()
}

// observeServices reads IPVS, the VIPs and the ledger.
func (r *Reconciler) observeServices() (*State, error) {
	k := r.opts.Kernel
	s := NewState()
	if k.IPVS != nil {
		svcs, err := k.IPVS.Services()
		if err != nil {
			return nil, fmt.Errorf("observe ipvs: %w", err)
		}
		s.Services = svcs
	}
	if k.VIPs != nil {
		vips, err := k.VIPs.VIPs()
		if err != nil {
			return nil, fmt.Errorf("observe vips: %w", err)
		}
		for _, a := range vips {
			s.VIPs[a] = struct{}{}
		}
	}
	if k.Ledger != nil {
		owned, err := k.Ledger.Load()
		if err != nil {
			return nil, fmt.Errorf("observe ledger: %w", err)
		}
		s.Owned = owned
	}
	return s, nil
}

// confirmOwned reads, one at a time, the services that the ledger lists,
// desired does not want, and the dump of the table did not return, and
// puts those still there into s. A dump is no snapshot (see
// IPVS.Services): it can miss a service. A pass that took a service of
// the ledger as gone would drop it from the ledger, and the service,
// foreign from then on, would never be removed. Read again, it is planned
// (removed, or drained) as if the dump had had it. Wanted services need
// no such read: a missing one is planned as an add, and the add finds it
// (see Result.Existed). In a steady state there is nothing to read.
func (r *Reconciler) confirmOwned(desired, s *State) error {
	ipvs := r.opts.Kernel.IPVS
	for key := range s.Owned {
		if _, want := desired.Services[key]; want {
			continue
		}
		if _, seen := s.Services[key]; seen {
			continue
		}
		st, err := ipvs.Service(key)
		if err != nil {
			return fmt.Errorf("observe ipvs: read service %s, which the ledger lists and the table's dump had not: %w", key, err)
		}
		if st != nil {
			r.log.Info("the table's dump missed a service vipd owns; read it alone", "service", key.String())
			s.Services[key] = st
		}
	}
	return nil
}

// Desired computes the desired state of spec on this host.
func (r *Reconciler) Desired(spec *Spec) (*State, error) {
	host := Host{Kernel: r.opts.KernelRelease, Dummy: r.opts.Dummy}
	if r.opts.Kernel.VIPs != nil && (hasNodePort(spec) || spec.Rules.Enabled && spec.Rules.FilterVIPs && len(spec.Services) > 0) {
		addrs, err := r.opts.Kernel.VIPs.HostAddrs()
		if err != nil {
			return nil, fmt.Errorf("list host addresses: %w", err)
		}
		host.Addrs = addrs
	}
	d := Desired(spec, host)
	r.strip(d)
	return d, nil
}

// HostVIPs returns the VIPs of services that are addresses of another
// interface of the host (see HostVIPs), or none when the kernel adapters
// cannot list the host's addresses.
func (r *Reconciler) HostVIPs(services []VirtualService) ([]HostVIP, error) {
	if r.opts.Kernel.VIPs == nil {
		return nil, nil
	}
	addrs, err := r.opts.Kernel.VIPs.HostAddrs()
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	return HostVIPs(services, Host{Addrs: addrs, Dummy: r.opts.Dummy}), nil
}

// strip removes from d what the kernel adapters in use cannot observe, so
// that a missing adapter never plans operations it cannot apply.
func (r *Reconciler) strip(d *State) {
	k := r.opts.Kernel
	if k.IPVS == nil {
		clear(d.Services)
		clear(d.Owned)
	}
	if k.Sysctls == nil {
		clear(d.Sysctls)
	}
	if k.Rules == nil {
		d.Rules = Rules{Entries: map[SetEntry]struct{}{}}
	}
	if k.Announcer == nil {
		clear(d.Announce)
	}
	if k.VIPs == nil {
		clear(d.VIPs)
	}
}

func hasNodePort(spec *Spec) bool {
	for i := range spec.Services {
		if spec.Services[i].NodePort {
			return true
		}
	}
	return false
}

// Plan observes the kernel and returns what a pass would do for spec,
// without changing anything.
func (r *Reconciler) Plan(ctx context.Context, spec *Spec) ([]Op, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	desired, err := r.Desired(spec)
	if err != nil {
		return nil, err
	}
	observed, err := r.observe(desired)
	if err != nil {
		return nil, err
	}
	return Plan(desired, observed, r.planOptions()), nil
}

func (r *Reconciler) planOptions() PlanOptions {
	return PlanOptions{Removal: r.opts.Removal, Leaving: r.leaving}
}

// leaving returns how long a backend has been leaving, starting its clock
// the first time it is asked (after a restart, say); a backend's clock
// also starts when vipd sets its weight to 0 (see track).
func (r *Reconciler) leaving(svc ServiceKey, addr netip.AddrPort) time.Duration {
	k := drainKey{svc, addr}
	now := r.opts.Now()
	start, ok := r.draining[k]
	if !ok {
		r.draining[k] = now
		return 0
	}
	return now.Sub(start)
}

// DrainingServices returns the keys of the services that have draining
// backends, sorted.
func (r *Reconciler) DrainingServices() []ServiceKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	var keys []ServiceKey
	for k := range r.draining {
		keys = append(keys, k.svc)
	}
	slices.SortFunc(keys, ServiceKey.Compare)
	return slices.Compact(keys)
}

// Draining returns how many backends are draining: at weight 0 after
// removal, waiting for their connections to end.
func (r *Reconciler) Draining() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.draining)
}

// Reconcile runs one pass for spec: observe, plan, apply. It applies every
// operation it can, continuing past failures, and reports each one. An
// error return means the kernel could not be observed and nothing was
// done.
func (r *Reconciler) Reconcile(ctx context.Context, spec *Spec) (*Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	desired, err := r.Desired(spec)
	if err != nil {
		return nil, err
	}
	observed, err := r.observe(desired)
	if err != nil {
		return nil, err
	}
	if spec.HoldOwned {
		hold(desired, observed)
	}
	r.forget(desired, observed)
	ops := Plan(desired, observed, r.planOptions())
	return r.apply(ctx, ops, desired, observed), nil
}

// hold puts into desired, as observed has them, the services the ledger
// lists that desired does not want, with their VIPs, announcements and
// set entries (see Spec.HoldOwned).
func hold(desired, observed *State) {
	held := map[netip.Addr]bool{}
	for key := range observed.Owned {
		st, ok := observed.Services[key]
		if _, want := desired.Services[key]; want || !ok {
			continue
		}
		desired.Services[key] = &ServiceState{Service: st.Service, Dests: cloneMap(st.Dests)}
		desired.Owned[key] = struct{}{}
		if key.Addr.IsValid() {
			held[key.Addr] = true
		}
		for e := range observed.Rules.Entries {
			// The restriction and its admitted sources stay too: a
			// held service never opens to every source.
			switch e.Set {
			case SetServed, SetRestricted, SetAllowed:
				if e.Addr == key.Addr && e.Proto == key.Proto && e.Port == key.Port {
					desired.Rules.Entries[e] = struct{}{}
				}
			}
		}
	}
	for a := range held {
		if _, ok := observed.VIPs[a]; ok {
			desired.VIPs[a] = struct{}{}
		}
		if _, ok := observed.Announce[a]; ok {
			desired.Announce[a] = struct{}{}
		}
		for e := range observed.Rules.Entries {
			if e.Set == SetVIPs && e.Addr == a {
				desired.Rules.Entries[e] = struct{}{}
			}
		}
	}
}

// forget stops the clocks of backends that are no longer leaving: gone
// from the kernel (deleted by hand, say) or wanted again as they are.
func (r *Reconciler) forget(desired, observed *State) {
	for k := range r.draining {
		have, ok := observed.Services[k.svc]
		if ok {
			_, ok = have.Dests[k.addr]
		}
		if want, wanted := desired.Services[k.svc]; wanted {
			if _, kept := want.Dests[k.addr]; kept {
				ok = false
			}
		}
		if !ok {
			delete(r.draining, k)
		}
	}
}

// Apply applies ops in order, continuing past failures. It is exported for
// callers that undo a failed pass by applying the inverse operations.
func (r *Reconciler) Apply(ctx context.Context, ops []Op) *Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.apply(ctx, slices.Clone(ops), nil, nil)
}

// replanService plans service key anew from st, the kernel's copy of it
// (nil when it has none): against desired, the pass's desired state, when
// that wants the service; otherwise (a pass over some operations only)
// against st changed by the operations of intent, in order.
func (r *Reconciler) replanService(key ServiceKey, st *ServiceState, desired *State, intent [][]Op) []Op {
	var want *ServiceState
	if desired != nil {
		want = desired.Services[key]
	}
	if want == nil {
		want = intended(key, st, intent)
	}
	d, o := NewState(), NewState()
	if want != nil {
		d.Services[key] = want
		d.Owned[key] = struct{}{}
	}
	if st != nil {
		o.Services[key] = st
	}
	o.Owned[key] = struct{}{}
	return Plan(d, o, r.planOptions())
}

// intended returns service key as the operations of ops make it from st:
// a copy of st with each operation on key applied in order, or nil when
// it is deleted (or never was).
func intended(key ServiceKey, st *ServiceState, ops [][]Op) *ServiceState {
	var want *ServiceState
	if st != nil {
		want = &ServiceState{Service: st.Service, Dests: make(map[netip.AddrPort]Destination, len(st.Dests))}
		for a, d := range st.Dests {
			want.Dests[a] = d.Settings()
		}
	}
	for _, list := range ops {
		for _, op := range list {
			if op.Service.Key != key || !isIPVSKind(op.Kind) {
				continue
			}
			switch op.Kind {
			case OpAddService, OpUpdateService:
				if want == nil {
					want = &ServiceState{Dests: map[netip.AddrPort]Destination{}}
				}
				want.Service = op.Service
			case OpDeleteService:
				want = nil
			case OpAddDest, OpUpdateDest, OpDrainDest:
				if want != nil {
					want.Dests[op.Dest.Addr] = op.Dest.Settings()
				}
			case OpDeleteDest:
				if want != nil {
					delete(want.Dests, op.Dest.Addr)
				}
			}
		}
	}
	return want
}

// remember keeps the cached sysctls and rules in step with an operation;
// after a failure it forgets them, so the next pass reads the kernel.
func (r *Reconciler) remember(op Op, err error) {
	switch op.Kind {
	case OpSetSysctl, OpSyncChains, OpRemoveChains, OpAddEntry, OpDelEntry:
		r.hostWrites.Add(1)
	}
	switch op.Kind {
	case OpSetSysctl:
		if err != nil || r.sysctls == nil {
			r.sysctls = nil
			return
		}
		r.sysctls[op.host().Sysctl] = op.host().Value
	case OpSyncChains, OpRemoveChains, OpAddEntry, OpDelEntry:
		if err != nil || r.rules == nil {
			r.rules = nil
			return
		}
		switch op.Kind {
		case OpSyncChains:
			r.rules.Policy = op.host().Policy
		case OpRemoveChains:
			r.rules.Policy = RulePolicy{}
			clear(r.rules.Entries)
		case OpAddEntry:
			r.rules.Entries[op.host().Entry] = struct{}{}
		case OpDelEntry:
			delete(r.rules.Entries, op.host().Entry)
		}
	}
}

// track keeps the drain clocks in step with applied operations.
func (r *Reconciler) track(op Op) {
	switch op.Kind {
	case OpDrainDest:
		r.draining[drainKey{op.Service.Key, op.Dest.Addr}] = r.opts.Now()
	case OpDeleteDest, OpAddDest, OpUpdateDest:
		delete(r.draining, drainKey{op.Service.Key, op.Dest.Addr})
	case OpDeleteService:
		for k := range r.draining {
			if k.svc == op.Service.Key {
				delete(r.draining, k)
			}
		}
	}
}

func (r *Reconciler) do(op Op) error {
	k := r.opts.Kernel
	switch op.Kind {
	case OpSetSysctl:
		return k.Sysctls.Set(op.host().Sysctl, op.host().Value)
	case OpSyncChains:
		return k.Rules.SyncChains(op.host().Policy)
	case OpRemoveChains:
		return k.Rules.RemoveChains()
	case OpAddEntry:
		return k.Rules.AddEntry(op.host().Entry)
	case OpDelEntry:
		return k.Rules.DelEntry(op.host().Entry)
	case OpBindVIP:
		return k.VIPs.Bind(op.Addr)
	case OpUnbindVIP:
		return k.VIPs.Unbind(op.Addr)
	case OpAnnounce:
		return k.Announcer.Announce(op.Addr)
	case OpWithdraw:
		return k.Announcer.Withdraw(op.Addr)
	}
	return fmt.Errorf("%s is not a single operation (ipvs operations go in batches)", op.Kind)
}

func sameKeys[K comparable](a, b map[K]struct{}) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}
