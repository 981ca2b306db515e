// Package status is the data behind "vipd status": it joins what the
// operator configured (an lb.Spec), what the kernel runs (an observed
// lb.State), the health of the backends and the operator's drains into
// one Snapshot, and renders it as a table for people or as JSON for
// scripts.
//
// The package is pure: Build reads nothing but its Options, so the daemon
// builds a Snapshot wherever it holds those (between passes, say) and the
// command line renders one it received as JSON.
package status

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
)

// HealthSource reports the health of a service's backend, and false when
// no check covers it. *health.Manager is one.
type HealthSource interface {
	Status(service string, backend netip.AddrPort) (health.Status, bool)
}

// HealthMap is a HealthSource held in a map: by service name, then by
// backend address.
type HealthMap map[string]map[netip.AddrPort]health.Status

// Status returns the status m holds for a service's backend.
func (m HealthMap) Status(service string, backend netip.AddrPort) (health.Status, bool) {
	st, ok := m[service][backend]
	return st, ok
}

// Ref names one backend of one service. An empty Service stands for every
// service: a drained Ref without one drains the backend everywhere.
type Ref struct {
	Service string
	Backend netip.AddrPort
}

// Options are what Build joins into a Snapshot.
type Options struct {
	// Spec is the running configuration; nil means no services.
	Spec *lb.Spec
	// Observed is the kernel as Reconciler.Observe reports it, with
	// Stats and connection counts. Owned and VIPs tell vipd's services
	// from foreign ones and find the instances of NodePort services, so
	// they must be filled in too. Nil means an empty kernel.
	Observed *lb.State
	// Health reports backend health; nil means health checks are off.
	Health HealthSource
	// Drained holds the backends an operator drained.
	Drained map[Ref]struct{}
	// Sorry maps a service's name to its sorry backend, for the
	// services that have one: a backend at that address is the sorry
	// server in use, not drift.
	Sorry map[string]netip.AddrPort
	// Now is the time of the snapshot; zero means time.Now().
	Now time.Time
}

// Snapshot is the state of vipd's services at one time.
type Snapshot struct {
	// Time is when the snapshot was taken.
	Time time.Time `json:"time"`
	// HealthChecks reports whether health checks are on.
	HealthChecks bool `json:"health_checks"`
	// Draining counts the backends at weight 0 that wait for their
	// connections to end after their removal from the configuration, or
	// their service's; they are listed under their services too.
	Draining int `json:"draining_backends"`
	// Foreign counts the IPVS services vipd does not own.
	Foreign int `json:"foreign_services"`
	// Services are the configured services in configuration order, one
	// entry per kernel service: a NodePort service has one per host
	// address it listens on (one, missing, when it has none).
	Services []Service `json:"services"`
	// Removed are the services vipd owns that the configuration no
	// longer lists, in key order: draining (drain_services) or left for
	// the next pass to delete. Their Name is empty and their settings
	// are the kernel's.
	Removed []Service `json:"removed_services"`
	// HA is the node's high availability, when it has an [ha] section.
	HA *HA `json:"ha,omitempty"`
	// BGP is the node's announcements, when it has a [bgp] section.
	BGP *BGP `json:"bgp,omitempty"`
	// Sources are the origins of services besides the file.
	Sources []Source `json:"sources,omitempty"`
	// Reload is the last reload of the configuration since the daemon
	// started; nil before the first.
	Reload *Reload `json:"last_reload,omitempty"`
}

// Reload is what one reload of the configuration did.
type Reload struct {
	// Time is when it ended; Why what asked for it ("file changed",
	// "sighup", "control socket"); File the file read, "all" for every
	// file.
	Time time.Time `json:"time"`
	Why  string    `json:"why"`
	File string    `json:"file,omitempty"`
	// Result is "applied" (the configuration took effect, maybe with no
	// change to the kernel) or "failed" (rejected, refused by the guard,
	// rolled back, or kept with failed operations: Error says which).
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
	// Applied and Failed count the kernel operations; Changes counts
	// the applied ones by kind, in application order, such as
	// "add-backend 3".
	Applied int      `json:"applied"`
	Failed  int      `json:"failed"`
	Changes []string `json:"changes,omitempty"`
}

// HA is a node's place in its VRRP virtual router.
type HA struct {
	// Role is "master" (it serves the VIPs) or "backup".
	Role string `json:"role"`
	VRID uint8  `json:"vrid"`
	// Priority is the priority it advertises, Configured the one it is
	// configured with (tracking takes some off).
	Priority   uint8 `json:"priority"`
	Configured uint8 `json:"configured_priority"`
	// Drained says an operator took the node out (vipd drain --node).
	Drained bool `json:"drained,omitempty"`
	// Master is the master's address as of the last change of role,
	// which happened at Since because of Reason.
	Master string    `json:"master,omitempty"`
	Since  time.Time `json:"since,omitzero"`
	Reason string    `json:"reason,omitempty"`
}

// BGP is what a node announces to its routers.
type BGP struct {
	ASN      uint32 `json:"asn"`
	RouterID string `json:"router_id"`
	// Drained says an operator took the node out (vipd drain --node): it
	// announces nothing.
	Drained bool      `json:"drained,omitempty"`
	Peers   []BGPPeer `json:"peers"`
	// Announced are the VIPs announced, as host routes, in order.
	Announced []string `json:"announced"`
	// Withheld are the VIPs not announced, with why, in order.
	Withheld []BGPWithheld `json:"withheld,omitempty"`
}

// BGPPeer is one BGP session.
type BGPPeer struct {
	Address string `json:"address"`
	ASN     uint32 `json:"asn"`
	// State is the session's state (RFC 4271): "established" when up.
	State string `json:"state"`
	// Since is when the session entered State; zero before any change.
	Since time.Time `json:"since,omitzero"`
	// Routes is the number of routes announced to the peer.
	Routes int `json:"routes"`
	// Limited is when the peer last sent more routes than its
	// max_prefixes allows, and vipd cut the session; zero if never.
	Limited time.Time `json:"max_prefixes_exceeded,omitzero"`
	// BFD is the peer's BFD session, nil without one (bfd = false).
	BFD *BFD `json:"bfd,omitempty"`
}

// BFD is the BFD session (RFC 5880) with a BGP peer.
type BFD struct {
	// State is the session's state: "admindown", "down", "init" or
	// "up"; RemoteState the peer's as last heard ("down" while it is
	// not heard).
	State       string `json:"state"`
	RemoteState string `json:"remote_state"`
	// Since is when the session entered State: vipd's start or its last
	// change.
	Since time.Time `json:"since,omitzero"`
	// Downs counts the session's changes from up to down; LastDown is
	// why the last one happened (RFC 5880's diagnostic, such as "control
	// detection time expired"), empty if none did.
	Downs    uint64 `json:"downs"`
	LastDown string `json:"last_down,omitempty"`
	// TxInterval is how often vipd sends, RxInterval how often the peer
	// does, as the two negotiated them, in milliseconds (RxInterval 0
	// while the peer is not heard); DetectMult is vipd's multiplier,
	// RemoteDetectMult the peer's, and DetectionTime the silence after
	// which vipd takes the session down (RemoteDetectMult × RxInterval).
	TxInterval       float64 `json:"tx_interval_ms"`
	RxInterval       float64 `json:"rx_interval_ms"`
	DetectMult       uint8   `json:"detect_multiplier"`
	RemoteDetectMult uint8   `json:"remote_detect_multiplier"`
	DetectionTime    float64 `json:"detection_time_ms"`
	// Received counts the packets from the peer's address, Dropped
	// those of them that failed a check; Sent counts the packets sent.
	Received uint64     `json:"packets_received"`
	Sent     uint64     `json:"packets_sent"`
	Dropped  BFDDropped `json:"packets_dropped"`
}

// BFDDropped counts the packets from a BFD peer's address that were
// dropped, by why.
type BFDDropped struct {
	// TTL: a TTL or hop limit below 255 (RFC 5881 §5: not from the link).
	TTL uint64 `json:"ttl"`
	// Malformed: a check of RFC 5880 §6.8.6 failed (length, version,
	// authentication, multiplier, discriminators...).
	Malformed uint64 `json:"malformed"`
	// Discriminator: the packet's Your Discriminator is not the
	// session's.
	Discriminator uint64 `json:"discriminator"`
}

// Total is the number of packets dropped.
func (d BFDDropped) Total() uint64 { return d.TTL + d.Malformed + d.Discriminator }

// BGPWithheld is a VIP the node does not announce.
type BGPWithheld struct {
	Route  string `json:"route"`
	Reason string `json:"reason"`
}

// Source is one origin of services besides the file.
type Source struct {
	Name     string `json:"name"`
	Services int    `json:"services"`
	// Error says why the source is not in step with its origin.
	Error string `json:"error,omitempty"`
}

// State is the condition of a service.
type State string

// The states of a service.
const (
	// OK: every configured backend that should take traffic does, and
	// the kernel matches the configuration.
	OK State = "ok"
	// Degraded: some backends take traffic, but not every one that
	// should, or the kernel has drifted from the configuration.
	Degraded State = "degraded"
	// Down: the service is in the kernel but no backend takes new
	// connections.
	Down State = "down"
	// Missing: the service is not in the kernel.
	Missing State = "missing"
	// Removed: the configuration no longer lists the service; it drains
	// or the next pass deletes it.
	Removed State = "removed"
)

// Service is one configured service as the kernel runs it.
type Service struct {
	// Name is the service's configured name.
	Name string `json:"name"`
	// Source is the source the service comes from ("kubernetes"), empty
	// for the configuration file.
	Source string `json:"source,omitempty"`
	// Key names the kernel service: "192.0.2.10:80/tcp",
	// "[2001:db8::10]:443/tcp" or "fwmark 7/ipv4"; for a NodePort
	// service missing in the kernel, "nodeport 30080/tcp".
	Key      string     `json:"key"`
	Family   string     `json:"family"`
	Protocol string     `json:"protocol,omitempty"`
	Address  netip.Addr `json:"address,omitzero"`
	Port     uint16     `json:"port,omitempty"`
	FWMark   uint32     `json:"fwmark,omitempty"`
	NodePort bool       `json:"nodeport,omitempty"`
	// Scheduler, Flags, OnePacket and Persistence are the configured
	// settings; Drift says where the kernel's differ.
	Scheduler   string       `json:"scheduler"`
	Flags       []string     `json:"flags,omitempty"`
	OnePacket   bool         `json:"one_packet,omitempty"`
	Persistence *Persistence `json:"persistence,omitempty"`
	// Forwarding is the backends' forwarding method, or "mixed".
	Forwarding string `json:"forwarding,omitempty"`
	State      State  `json:"state"`
	// Drift describes each kernel setting that differs from the
	// configuration, such as "scheduler rr (configured wrr)".
	Drift []string `json:"drift,omitempty"`
	// ActiveConns and InactiveConns sum the backends' counts.
	ActiveConns   uint64 `json:"active_conns"`
	InactiveConns uint64 `json:"inactive_conns"`
	// Stats are the kernel's counters and rates of the service.
	Stats    Stats     `json:"stats"`
	Backends []Backend `json:"backends"`
}

// Persistence is a service's client affinity.
type Persistence struct {
	// Timeout is the persistence timeout in seconds.
	Timeout uint32 `json:"timeout_seconds"`
	// Netmask is the prefix length that groups clients.
	Netmask int `json:"netmask"`
}

// Reason says why a backend's weight in the kernel differs from its
// configured weight.
type Reason string

// The reasons.
const (
	// HealthDown: its checks fail, so it is quiesced or removed.
	HealthDown Reason = "health-down"
	// AdminDrain: an operator drained it.
	AdminDrain Reason = "admin-drain"
	// Draining: it (or its service) was removed from the configuration
	// and it waits at weight 0 for its connections to end.
	Draining Reason = "draining"
	// Sorry: it is the service's sorry backend, in use because no other
	// backend is healthy.
	Sorry Reason = "sorry"
	// Drift: nothing vipd knows explains it; the kernel was changed
	// behind vipd's back or an operation failed, and the next pass
	// repairs it.
	Drift Reason = "drift"
)

// Backend is one backend of a service: configured, in the kernel, or both.
type Backend struct {
	Address netip.AddrPort `json:"address"`
	Forward string         `json:"forward"`
	// Configured is false for a backend only the kernel has.
	Configured       bool `json:"configured"`
	ConfiguredWeight int  `json:"configured_weight"`
	// InKernel is false for a configured backend the kernel lacks.
	InKernel bool `json:"in_kernel"`
	// Weight is the kernel's current weight.
	Weight int `json:"weight"`
	// Reason says why Weight differs from ConfiguredWeight, or why a
	// backend is in only one of the two; empty when they agree.
	Reason Reason `json:"reason,omitempty"`
	// Drift describes each kernel setting that differs unexplained from
	// the configuration, such as "weight 5 (configured 10)".
	Drift []string `json:"drift,omitempty"`
	// AdminDrained reports an operator's drain, whether or not the
	// kernel has caught up with it.
	AdminDrained bool `json:"admin_drained,omitempty"`
	// Health is the backend's health; nil when no check covers it.
	Health        *Health `json:"health,omitempty"`
	ActiveConns   uint32  `json:"active_conns"`
	InactiveConns uint32  `json:"inactive_conns"`
	Stats         Stats   `json:"stats"`
}

// Serving reports whether the backend takes new connections: it is in
// the kernel with a weight above zero and not known to be down.
func (b *Backend) Serving() bool {
	return b.InKernel && b.Weight > 0 && (b.Health == nil || b.Health.State != "down")
}

// Health is the health of a checked backend.
type Health struct {
	// State is "up" or "down".
	State string `json:"state"`
	// Since is when the backend entered State.
	Since time.Time `json:"since"`
	// Error is the last failure of a down backend.
	Error string `json:"error,omitempty"`
}

// Stats are the kernel's counters and rate estimates of a service or
// backend. Rates are per second.
type Stats struct {
	Conns      uint64 `json:"conns"`
	InPackets  uint64 `json:"in_packets"`
	OutPackets uint64 `json:"out_packets"`
	InBytes    uint64 `json:"in_bytes"`
	OutBytes   uint64 `json:"out_bytes"`

	ConnRate      uint64 `json:"conns_per_second"`
	InPacketRate  uint64 `json:"in_packets_per_second"`
	OutPacketRate uint64 `json:"out_packets_per_second"`
	InByteRate    uint64 `json:"in_bytes_per_second"`
	OutByteRate   uint64 `json:"out_bytes_per_second"`
}

func statsOf(s lb.Stats) Stats {
	return Stats{
		Conns: s.Conns, InPackets: s.InPkts, OutPackets: s.OutPkts, InBytes: s.InBytes, OutBytes: s.OutBytes,
		ConnRate: s.CPS, InPacketRate: s.InPPS, OutPacketRate: s.OutPPS, InByteRate: s.InBPS, OutByteRate: s.OutBPS,
	}
}

// destStats converts a backend's counters, zero when the kernel gave none.
func destStats(s *lb.Stats) Stats {
	if s == nil {
		return Stats{}
	}
	return statsOf(*s)
}

// Build joins opts into a Snapshot.
func Build(opts Options) *Snapshot {
	spec := opts.Spec
	if spec == nil {
		spec = &lb.Spec{}
	}
	obs := opts.Observed
	if obs == nil {
		obs = lb.NewState()
	}
	snap := &Snapshot{Time: opts.Now, HealthChecks: opts.Health != nil, Services: make([]Service, 0, len(spec.Services)), Removed: []Service{}}
	if snap.Time.IsZero() {
		snap.Time = time.Now()
	}

	// Claim the kernel services of each configured service: its own key,
	// or for a NodePort service every owned key on its port.
	claimed := map[lb.ServiceKey]bool{}
	for i := range spec.Services {
		if vs := &spec.Services[i]; !vs.NodePort {
			claimed[vs.Service.Key] = true
		}
	}
	for i := range spec.Services {
		vs := &spec.Services[i]
		var keys []lb.ServiceKey
		if vs.NodePort {
			keys = nodePortKeys(vs, obs, claimed)
		} else if _, ok := obs.Services[vs.Service.Key]; ok {
			keys = []lb.ServiceKey{vs.Service.Key}
		}
		if len(keys) == 0 {
			snap.Services = append(snap.Services, service(vs, vs.Service.Key, nil, &opts))
			continue
		}
		for _, k := range keys {
			snap.Services = append(snap.Services, service(vs, k, obs.Services[k], &opts))
		}
	}
	var removed []lb.ServiceKey
	for k := range obs.Services {
		switch {
		case claimed[k]:
		case obs.Owns(k):
			removed = append(removed, k)
		default:
			snap.Foreign++
		}
	}
	slices.SortFunc(removed, lb.ServiceKey.Compare)
	for _, k := range removed {
		snap.Removed = append(snap.Removed, removedService(obs.Services[k]))
	}
	for _, list := range [][]Service{snap.Services, snap.Removed} {
		for _, s := range list {
			for _, b := range s.Backends {
				if b.Reason == Draining {
					snap.Draining++
				}
			}
		}
	}
	return snap
}

// removedService describes an owned kernel service the configuration no
// longer lists.
func removedService(kern *lb.ServiceState) Service {
	vs := &lb.VirtualService{Service: kern.Service}
	s := service(vs, kern.Key, kern, &Options{})
	s.State = Removed
	for i := range s.Backends {
		b := &s.Backends[i]
		b.Reason, b.Drift = "", nil
		if b.Weight == 0 {
			b.Reason = Draining
		}
	}
	return s
}

// nodePortKeys returns the owned kernel keys of a NodePort service, in
// order, and marks them claimed.
func nodePortKeys(vs *lb.VirtualService, obs *lb.State, claimed map[lb.ServiceKey]bool) []lb.ServiceKey {
	want := vs.Service.Key
	var keys []lb.ServiceKey
	for k := range obs.Services {
		if k.FWMark == 0 && k.Family == want.Family && k.Proto == want.Proto && k.Port == want.Port &&
			!claimed[k] && obs.Owns(k) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, lb.ServiceKey.Compare)
	for _, k := range keys {
		claimed[k] = true
	}
	return keys
}

// service joins a configured service with one kernel service of it (nil
// when missing).
func service(vs *lb.VirtualService, key lb.ServiceKey, kern *lb.ServiceState, opts *Options) Service {
	cfg := vs.Service
	s := Service{
		Name:      vs.Name,
		Key:       KeyString(key),
		Family:    key.Family.String(),
		FWMark:    key.FWMark,
		NodePort:  vs.NodePort,
		Scheduler: cfg.Scheduler,
		OnePacket: cfg.OnePacket,
		Backends:  make([]Backend, 0, len(vs.Backends)),
	}
	if key.FWMark == 0 {
		s.Protocol, s.Address, s.Port = key.Proto.String(), key.Addr, key.Port
	}
	if vs.NodePort && kern == nil {
		s.Key = fmt.Sprintf("nodeport %d/%s", key.Port, key.Proto)
	}
	if cfg.Flags != 0 {
		s.Flags = strings.Split(cfg.Flags.String(), ",")
	}
	if cfg.Persistent != 0 {
		s.Persistence = &Persistence{Timeout: cfg.Persistent, Netmask: cfg.Netmask}
	}
	s.Forwarding = forwarding(vs.Backends, kern)
	if kern == nil {
		// The service's state says it all: its backends have no reasons
		// of their own to be missing.
		s.State = Missing
		for _, d := range vs.Backends {
			b := configured(vs.Name, d, nil, opts)
			b.Reason, b.Drift = "", nil
			s.Backends = append(s.Backends, b)
		}
		return s
	}
	s.Drift = serviceDrift(kern.Service, cfg)
	s.Stats = statsOf(kern.Stats)
	seen := make(map[netip.AddrPort]bool, len(vs.Backends))
	for _, d := range vs.Backends {
		seen[d.Addr] = true
		var kd *lb.Destination
		if have, ok := kern.Dests[d.Addr]; ok {
			kd = &have
		}
		s.Backends = append(s.Backends, configured(vs.Name, d, kd, opts))
	}
	var extra []lb.Destination
	for a, d := range kern.Dests {
		if !seen[a] {
			extra = append(extra, d)
		}
	}
	slices.SortFunc(extra, func(a, b lb.Destination) int { return a.Addr.Compare(b.Addr) })
	for _, d := range extra {
		s.Backends = append(s.Backends, kernelOnly(vs.Name, d, opts))
	}
	for i := range s.Backends {
		s.ActiveConns += uint64(s.Backends[i].ActiveConns)
		s.InactiveConns += uint64(s.Backends[i].InactiveConns)
	}
	s.State = serviceState(&s)
	return s
}

// serviceState rates a service that is in the kernel.
func serviceState(s *Service) State {
	serving, short := 0, false
	for i := range s.Backends {
		b := &s.Backends[i]
		if b.Serving() {
			serving++
		}
		if b.Reason == Drift || b.Reason == Sorry ||
			b.Configured && b.ConfiguredWeight > 0 && !b.AdminDrained && !b.Serving() {
			short = true
		}
	}
	switch {
	case serving == 0:
		return Down
	case short || len(s.Drift) > 0:
		return Degraded
	}
	return OK
}

// configured joins a configured backend with the kernel's (nil when
// missing).
func configured(service string, d lb.Destination, kd *lb.Destination, opts *Options) Backend {
	b := Backend{
		Address:          d.Addr,
		Forward:          d.Forward.String(),
		Configured:       true,
		ConfiguredWeight: d.Weight,
		AdminDrained:     drained(opts.Drained, service, d.Addr),
		Health:           healthOf(opts.Health, service, d.Addr),
	}
	if kd != nil {
		b.InKernel = true
		b.Weight = kd.Weight
		b.ActiveConns, b.InactiveConns = kd.ActiveConns, kd.InactiveConns
		b.Stats = destStats(kd.Stats)
		b.Drift = destDrift(*kd, d)
	}
	if b.InKernel && b.Weight == d.Weight {
		if len(b.Drift) > 0 {
			b.Reason = Drift
		}
		return b
	}
	// The kernel's weight differs (or the kernel lacks the backend).
	zero := !b.InKernel || b.Weight == 0
	switch {
	case b.AdminDrained && zero:
		b.Reason = AdminDrain
	case b.Health != nil && b.Health.State == "down" && zero:
		b.Reason = HealthDown
	case b.InKernel && opts.Sorry[service] == d.Addr:
		b.Reason = Sorry
	default:
		b.Reason = Drift
		if b.InKernel {
			b.Drift = append([]string{fmt.Sprintf("weight %d (configured %d)", b.Weight, d.Weight)}, b.Drift...)
		} else {
			b.Drift = []string{"not in the kernel"}
		}
	}
	return b
}

// kernelOnly describes a backend the kernel has and the configuration
// does not.
func kernelOnly(service string, d lb.Destination, opts *Options) Backend {
	b := Backend{
		Address:       d.Addr,
		Forward:       d.Forward.String(),
		InKernel:      true,
		Weight:        d.Weight,
		AdminDrained:  drained(opts.Drained, service, d.Addr),
		ActiveConns:   d.ActiveConns,
		InactiveConns: d.InactiveConns,
		Stats:         destStats(d.Stats),
	}
	switch {
	case opts.Sorry[service] == d.Addr:
		b.Reason = Sorry
	case d.Weight == 0:
		b.Reason = Draining
	default:
		b.Reason = Drift
		b.Drift = []string{"not in the configuration"}
	}
	return b
}

func drained(set map[Ref]struct{}, service string, addr netip.AddrPort) bool {
	if _, ok := set[Ref{Service: service, Backend: addr}]; ok {
		return true
	}
	_, ok := set[Ref{Backend: addr}]
	return ok
}

func healthOf(src HealthSource, service string, addr netip.AddrPort) *Health {
	if src == nil {
		return nil
	}
	st, ok := src.Status(service, addr)
	if !ok {
		return nil
	}
	h := &Health{State: st.State.String(), Since: st.Since}
	if st.State == health.Down && st.Err != nil {
		h.Error = st.Err.Error()
	}
	return h
}

// forwarding names the forwarding method of a service's backends: the
// configured ones, or the kernel's when none is configured.
func forwarding(backends []lb.Destination, kern *lb.ServiceState) string {
	var methods []lb.Forward
	for _, d := range backends {
		methods = append(methods, d.Forward)
	}
	if len(methods) == 0 && kern != nil {
		for _, d := range kern.Dests {
			methods = append(methods, d.Forward)
		}
	}
	if len(methods) == 0 {
		return ""
	}
	for _, m := range methods[1:] {
		if m != methods[0] {
			return "mixed"
		}
	}
	return methods[0].String()
}

// serviceDrift describes how the kernel's settings of a service differ
// from the configured ones.
func serviceDrift(have, want lb.Service) []string {
	var d []string
	if have.Scheduler != want.Scheduler {
		d = append(d, fmt.Sprintf("scheduler %s (configured %s)", have.Scheduler, want.Scheduler))
	}
	if have.Flags != want.Flags {
		d = append(d, fmt.Sprintf("flags %s (configured %s)", orNone(have.Flags.String()), orNone(want.Flags.String())))
	}
	if have.OnePacket != want.OnePacket {
		d = append(d, fmt.Sprintf("one-packet %t (configured %t)", have.OnePacket, want.OnePacket))
	}
	if have.Persistent != want.Persistent || have.Netmask != want.Netmask {
		d = append(d, fmt.Sprintf("persistence %s (configured %s)", persistence(have), persistence(want)))
	}
	return d
}

// destDrift describes how the kernel's settings of a backend, other than
// its weight, differ from the configured ones.
func destDrift(have, want lb.Destination) []string {
	h, w := have.Settings(), want.Settings()
	h.Weight = w.Weight
	if h == w {
		return nil
	}
	var d []string
	if h.Forward != w.Forward || h.Tunnel != w.Tunnel || h.TunnelPort != w.TunnelPort || h.TunnelCsum != w.TunnelCsum {
		d = append(d, fmt.Sprintf("forward %s (configured %s)", forward(h), forward(w)))
	}
	if h.Upper != w.Upper {
		d = append(d, fmt.Sprintf("upper threshold %d (configured %d)", h.Upper, w.Upper))
	}
	if h.Lower != w.Lower {
		d = append(d, fmt.Sprintf("lower threshold %d (configured %d)", h.Lower, w.Lower))
	}
	return d
}

func forward(d lb.Destination) string {
	if d.Forward != lb.Tunnel {
		return d.Forward.String()
	}
	return fmt.Sprintf("tunnel %s port %d csum %s", d.Tunnel, d.TunnelPort, d.TunnelCsum)
}

func persistence(s lb.Service) string {
	if s.Persistent == 0 {
		return "off"
	}
	return fmt.Sprintf("%ds/%d", s.Persistent, s.Netmask)
}

func orNone(s string) string {
	return cmp.Or(s, "none")
}

// KeyString names a kernel service as metrics and status show it:
// "192.0.2.10:80/tcp", "[2001:db8::10]:443/tcp", or "fwmark 7/ipv4".
func KeyString(k lb.ServiceKey) string {
	if k.FWMark != 0 {
		return fmt.Sprintf("fwmark %d/%s", k.FWMark, k.Family)
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Proto)
}
